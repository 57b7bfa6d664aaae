"""The names the benchmarks (``medseg/benchmark/``: ``prediction``, ``scan_prediction``, ``peers``) import from here,
now measured in :mod:`medseg.runtime.host_memory`; delete this module once they import from there."""

from medseg.runtime.host_memory import PeakRam, child_pids

__all__ = ["PeakRam", "child_pids"]
