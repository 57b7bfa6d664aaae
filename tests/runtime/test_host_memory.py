"""The freed pages of whole volumes go back to the system (:mod:`medseg.runtime.host_memory`)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from medseg.runtime.host_memory import release_freed_memory

# a 16 MiB array allocated, freed and allocated again: glibc raises its mmap threshold to 16 MiB at the first free
# (it caps at 32 MiB), so the second comes from the heap, and its pages stay resident once it is freed in turn
FREED_FROM_THE_HEAP = textwrap.dedent("""
    import sys
    import numpy as np
    from medseg.runtime.host_memory import release_freed_memory

    def rss_mib():
        return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20

    block = np.ones(2**21)
    del block
    block = np.ones(2**21)
    held = rss_mib()
    del block
    kept = held - rss_mib()
    released = release_freed_memory()
    print(kept, held - rss_mib(), released)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_a_freed_volume_leaves_the_resident_set_when_released() -> None:
    result = subprocess.run([sys.executable, "-c", FREED_FROM_THE_HEAP], capture_output=True, text=True, check=True)
    freed, released, reported = result.stdout.split()
    assert float(freed) < 2, "glibc keeps the freed heap pages (the test's premise)"
    assert float(released) > 15 and reported == "True", "released: the 16 MiB array leaves the resident set"


def test_releasing_says_whether_anything_was_released() -> None:
    released = release_freed_memory()
    assert isinstance(released, bool)
    if not sys.platform.startswith("linux"):
        assert released is False
