"""The collector: every `interval_s` one pass over the readers, handed as one batch to each sink."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol

from gpulens.agent.readers import Reader
from gpulens.agent.samples import Sample

log = logging.getLogger("gpulens.agent")


class Sink(Protocol):
    """Receives each pass: every sample of it, sharing one timestamp. Called from the collector's thread."""

    def write(self, samples: Sequence[Sample]) -> None: ...


class MemorySink:
    """Keeps the last `keep` passes (tests, `--once`)."""

    def __init__(self, keep: int = 16) -> None:
        self.passes: deque[list[Sample]] = deque(maxlen=keep)

    def write(self, samples: Sequence[Sample]) -> None:
        self.passes.append(list(samples))

    @property
    def latest(self) -> list[Sample]:
        return self.passes[-1] if self.passes else []


class Collector:
    """Runs the readers once per pass and writes the pass to every sink.

    A reader or sink that raises is logged (once until it recovers) and the pass goes on without it:
    one broken source must not stop the others. `clock` returns Unix seconds (tests pass their own).
    """

    def __init__(
        self,
        readers: Sequence[Reader],
        sinks: Sequence[Sink] = (),
        *,
        interval_s: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be > 0")
        self.readers = list(readers)
        self.sinks = list(sinks)
        self.interval_s = interval_s
        self.clock = clock
        self.passes = 0
        self._failing: set[str] = set()

    def _note(self, who: str, exc: BaseException | None) -> None:
        if exc is None:
            if who in self._failing:
                self._failing.discard(who)
                log.info("%s works again", who)
        elif who not in self._failing:
            self._failing.add(who)
            log.error("%s failed: %r (logged once until it recovers)", who, exc, exc_info=exc)

    def collect(self) -> list[Sample]:
        """One pass: read every reader, write every sink, return the samples."""
        now_ms = round(self.clock() * 1000)
        samples: list[Sample] = []
        for reader in self.readers:
            try:
                samples.extend(reader.read(now_ms))
            except Exception as exc:
                self._note(f"reader {reader.name}", exc)
            else:
                self._note(f"reader {reader.name}", None)
        for i, sink in enumerate(self.sinks):
            who = f"sink {i} ({type(sink).__name__})"
            try:
                sink.write(samples)
            except Exception as exc:
                self._note(who, exc)
            else:
                self._note(who, None)
        self.passes += 1
        return samples

    def run(self, stop: threading.Event) -> None:
        """Pass after pass every `interval_s` (monotonic schedule; late passes are skipped) until `stop`."""
        due = time.monotonic()
        while not stop.is_set():
            self.collect()
            due += self.interval_s
            now = time.monotonic()
            if due < now:  # a pass took longer than the interval: skip, do not burst
                due = now + self.interval_s - (now - due) % self.interval_s
            stop.wait(due - now)

    def start(self, stop: threading.Event) -> threading.Thread:
        thread = threading.Thread(target=self.run, args=(stop,), name="gpulens-collector", daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        for reader in self.readers:
            try:
                reader.close()
            except Exception as exc:
                log.warning("closing reader %s: %r", reader.name, exc)
