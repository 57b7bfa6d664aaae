"""medseg's benchmarks, beside the package and not in its wheel: one module per subcommand of
``scripts/benchmark.py`` (:mod:`benchmarks.cli`), the helpers they share in :mod:`benchmarks.common`.

They run from a clone (some run ``scripts/`` and ``tests/``); the ``medseg`` package imports none of them.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
"""The clone's root: ``benchmarks/`` beside ``medseg/``, ``scripts/``, ``tests/`` and ``tools/``."""
