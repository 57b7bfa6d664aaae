"""Host memory the process gives back: glibc's allocator policy for the large arrays of whole volumes.

glibc serves an allocation above its mmap threshold (128 KiB) with its own mapping, unmapped when it is freed. Its
default policy raises that threshold to the size of each such block freed (up to 32 MiB), so that later volumes,
their resampled copies and their probability maps come from the heap, whose freed pages stay resident: after
caching a dataset a training run held about 150 MiB more than it used, and its peak RAM varied by as much between
identical runs. :func:`return_large_blocks_to_the_system` fixes the threshold at its default, which turns the raising
off (glibc's ``mallopt(3)``), so a freed volume leaves the resident set at once.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys

M_MMAP_THRESHOLD = -3
"""``mallopt``'s parameter number for the mmap threshold (glibc ``malloc.h``)."""
MMAP_THRESHOLD_BYTES = 128 * 1024
"""glibc's default mmap threshold; setting it explicitly turns its dynamic raising off."""


@functools.cache
def return_large_blocks_to_the_system() -> bool:
    """Serve every allocation of at least :data:`MMAP_THRESHOLD_BYTES` from its own mapping, for the rest of this
    process and the processes it forks (the DataLoader workers). True where glibc accepted it; False elsewhere (not
    Linux, musl, macOS), where nothing changes. Once per process."""
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
    except (OSError, AttributeError):  # no C library of that name, or one without mallopt
        return False
