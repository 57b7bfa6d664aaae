"""An offline install bundle: `python scripts/offline_bundle.py [--out .whl] [--python 3.12] [--platform TAG ...]
[--provided FILE]` saves the wheels medseg needs for a machine without network (see docs/offline-install.md)."""

import sys

from medseg.benchmark.offline_bundle import main

if __name__ == "__main__":
    sys.exit(main())
