"""The GPU check: ``python scripts/gpu_check.py --out outputs/gpu_check [--budget 480] [--dry-run]`` runs medseg's
CUDA tests, benchmarks, a demo training and evaluations on a CUDA machine (``tools/gpu_check.py``; ``--help``).
``python scripts/benchmark.py gpu`` runs the same."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the clone's root: benchmarks/ and tools/

from benchmarks.cli import run_command  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_command("tools.gpu_check", "gpu_check.py", sys.argv[1:]))
