"""The cyclic GC tuned for a server that decodes large JSON answers: called once by entry points.

A 24 h Lyceum read decodes ~70,000 small lists from the backend and builds as many strings. With
CPython's default thresholds (700 allocations) that triggers about a hundred young collections and
regular full ones per request, each walking the objects that answer still holds: 15-30 % of the
server's CPU. Switching the collector off around decoding (what gpulens did before) is process-wide
and races between threads. Instead the young generation is made large, so a request costs one or two
young collections, and the objects alive at start-up are frozen out of full collections.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 100_000
OLDER_THRESHOLDS = (50, 1_000)


def tune_gc() -> None:
    gc.set_threshold(YOUNG_THRESHOLD, *OLDER_THRESHOLDS)
    gc.freeze()
