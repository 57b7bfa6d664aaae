"""An offline install bundle: `python scripts/offline_bundle.py [--out .whl] [--python 3.12] [--platform TAG ...]
[--provided FILE]` saves the wheels medseg needs for a machine without network (see docs/offline-install.md)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the clone's root: tools/

from tools.offline_bundle import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
