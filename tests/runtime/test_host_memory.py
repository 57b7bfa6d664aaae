"""glibc's allocator policy: a freed volume-sized array leaves the resident set (:mod:`medseg.runtime.host_memory`)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from medseg.runtime.host_memory import return_large_blocks_to_the_system

# a 16 MiB array allocated, freed and allocated again: glibc's default policy raises its mmap threshold to 16 MiB at
# the first free (it caps at 32 MiB), so the second comes from the heap and its pages stay resident once it is freed
FREED_TWICE = textwrap.dedent("""
    import sys
    import numpy as np
    from medseg.runtime.host_memory import return_large_blocks_to_the_system

    def rss_mib():
        return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20

    if sys.argv[1] == "fixed":
        assert return_large_blocks_to_the_system()
    block = np.ones(2**21)
    del block
    block = np.ones(2**21)
    held = rss_mib()
    del block
    print(held - rss_mib())
""")


def released_mib(mode: str) -> float:
    """What the resident set shrank by when the second 16 MiB array was freed, in a fresh process."""
    result = subprocess.run([sys.executable, "-c", FREED_TWICE, mode], capture_output=True, text=True, check=True)
    return float(result.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_freed_volume_leaves_the_resident_set_only_with_the_policy_set() -> None:
    assert released_mib("default") < 2, "glibc's default keeps the freed heap pages (the test's premise)"
    assert released_mib("fixed") > 15, "the 16 MiB array is unmapped when freed"


def test_the_policy_is_set_once_and_reports_whether_it_took() -> None:
    first = return_large_blocks_to_the_system()
    assert return_large_blocks_to_the_system() is first
    if not sys.platform.startswith("linux"):
        assert first is False
