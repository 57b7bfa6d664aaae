"""Host memory measured and given back (:mod:`medseg.runtime.host_memory`): the RAM available, the peak of a process
and its workers, and the freed pages of whole volumes returned to the system."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from medseg.runtime import host_memory
from medseg.runtime.host_memory import PeakRam, available_ram_bytes

MIB = 2**20
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the workers are read from Linux /proc")

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


@pytest.mark.parametrize(("trimmed", "expected"), [(1, True), (0, False)])
def test_releasing_asks_the_c_library_to_trim_everything_and_says_whether_it_did(
        monkeypatch: pytest.MonkeyPatch, trimmed: int, expected: bool) -> None:
    calls: list[int] = []
    monkeypatch.setattr(host_memory, "_trim", lambda: lambda pad: calls.append(pad) or trimmed)
    assert host_memory.release_freed_memory() is expected
    assert calls == [0], "malloc_trim(0): every free page, no pad kept"


def test_releasing_without_glibc_releases_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host_memory, "_trim", lambda: None)  # musl, macOS, Windows
    assert host_memory.release_freed_memory() is False


def test_glibc_trim_is_found_only_on_linux(monkeypatch: pytest.MonkeyPatch) -> None:
    host_memory._trim.cache_clear()
    monkeypatch.setattr(sys, "platform", "darwin")
    try:
        assert host_memory._trim() is None
    finally:
        host_memory._trim.cache_clear()


def test_available_ram_is_positive_and_at_most_the_physical_ram() -> None:
    assert 0 < available_ram_bytes() <= os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _grow(size: int, go: multiprocessing.Event, grown: multiprocessing.Event, done: multiprocessing.Event) -> None:
    go.wait(10)
    block = np.ones(size // 8)  # touched: resident
    grown.set()
    done.wait(10)
    del block


@linux_only
def test_peak_ram_counts_what_a_worker_adds_not_the_parent_pages_it_maps() -> None:
    held = np.ones(300 * MIB // 8)  # the parent's, resident: a forked child maps all of it too
    context = multiprocessing.get_context("fork")
    go, grown, done = context.Event(), context.Event(), context.Event()
    with PeakRam(interval=0.02) as ram:
        before = ram.peak_bytes
        child = context.Process(target=_grow, args=(100 * MIB, go, grown, done))
        child.start()
        at_start = ram.peak_bytes  # sampled at its start, when it maps the parent's pages and nothing of its own
        go.set()
        assert grown.wait(10)
        ram.peak_bytes  # noqa: B018 (reading samples: one while the child holds its own 100 MiB)
        done.set()
        child.join(10)
    assert at_start - before < 30 * MIB, "the parent's pages the child maps are not its own"
    added = ram.peak_bytes - before
    assert 90 * MIB < added < 160 * MIB, f"{added / MIB:.0f} MiB; the child's own 100 MiB, not the parent's 300"
    del held
