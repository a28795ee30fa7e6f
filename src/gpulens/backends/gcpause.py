"""Pause the cyclic GC while large JSON bodies are decoded (4x faster, prometheus-notes.md)."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class _Pauser:
    """Nestable across threads: the GC comes back when the last decoder leaves."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.depth = 0
        self.was_enabled = True

    @contextmanager
    def paused(self) -> Iterator[None]:
        with self.lock:
            if self.depth == 0:
                self.was_enabled = gc.isenabled()
                gc.disable()
            self.depth += 1
        try:
            yield
        finally:
            with self.lock:
                self.depth -= 1
                if self.depth == 0 and self.was_enabled:
                    gc.enable()


gc_paused = _Pauser().paused
