"""The cyclic GC tuned for a server that decodes large JSON answers: called once by entry points.

A 24 h Lyceum read decodes ~70,000 small lists from the backend and builds as many strings. With
CPython's default thresholds (700 allocations) that triggers about a hundred young collections and
regular full ones per request, each walking the objects that answer still holds: 15-30 % of the
server's CPU. Switching the collector off around decoding (what gpulens did before) is process-wide
and races between threads. Instead the young generation is made large, so a request costs one or two
young collections, and the objects alive at start-up are frozen out of full collections.

`tune_allocator` does the same for glibc's malloc: answers and response chunks are buffers of
hundreds of kilobytes, which glibc serves by mmap and, once freed, hands back to the kernel (or trims
off the heap), so that every request faults the same pages in again (measured on a 30-day read: a
tenth of the server's CPU, most of its system time). Buffers up to MMAP_THRESHOLD come from the heap
instead, and up to TRIM_THRESHOLD of freed heap stays for the next request.
"""

from __future__ import annotations

import ctypes
import gc
import sys

YOUNG_THRESHOLD = 100_000
OLDER_THRESHOLDS = (50, 1_000)


def tune_gc() -> None:
    gc.set_threshold(YOUNG_THRESHOLD, *OLDER_THRESHOLDS)
    gc.freeze()


MMAP_THRESHOLD = 16 << 20
TRIM_THRESHOLD = 64 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters


def tune_allocator() -> bool:
    """On glibc: serve buffers under MMAP_THRESHOLD from the heap and keep TRIM_THRESHOLD of freed
    heap (False, and nothing changed, on another C library)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    mmap_set = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    return bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)) and mmap_set
