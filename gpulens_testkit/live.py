"""Data arriving live: a thread that writes one host's dcgm-exporter series every second, at the wall
clock's time, following a script of phases (busy, then idle with memory held, then busy again), into
VictoriaMetrics (its import API) or into gpulens' embedded sample store (the file `gpulens serve`
reads without a Prometheus). What a running execution looks like to the live alerts."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from gpulens.agent.samples import Sample
from gpulens.storage.samples import SampleStore
from gpulens_testkit.promload import vm_force_flush, vm_import


@dataclass(frozen=True, slots=True)
class Phase:
    """From `at_s` seconds after the writer started: each GPU's utilization and FB used (% of FB)."""

    at_s: float
    util_percent: float
    fb_used_percent: float


FB_TOTAL_MIB = 81_559
Row = tuple[str, tuple[tuple[str, str], ...], float]  # name, labels, value


@dataclass
class LiveWriter:
    sink: Sink  # writes one pass (Unix ms, rows): VmSink or StoreSink
    hostname: str
    gpus: tuple[str, ...] = ("0",)
    phases: tuple[Phase, ...] = (Phase(0, 95, 80),)
    every_s: float = 1.0
    started: float = 0.0
    written: int = 0
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def phase(self, elapsed_s: float) -> Phase:
        return [p for p in self.phases if p.at_s <= elapsed_s][-1]

    def rows(self, phase: Phase) -> list[Row]:
        out: list[Row] = []
        for gpu in self.gpus:
            labels = (
                ("gpu", gpu),
                ("UUID", f"GPU-{self.hostname}-{gpu}"),
                ("Hostname", self.hostname),
                ("modelName", "H100"),
            )
            used = round(FB_TOTAL_MIB * phase.fb_used_percent / 100)
            busy = phase.util_percent > 0
            out += [
                ("DCGM_FI_DEV_GPU_UTIL", labels, phase.util_percent),
                ("DCGM_FI_DEV_FB_USED", labels, used),
                ("DCGM_FI_DEV_FB_FREE", labels, FB_TOTAL_MIB - used),
                ("DCGM_FI_DEV_POWER_USAGE", labels, 400 if busy else 80),
                ("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", labels, 700),
                ("DCGM_FI_DEV_GPU_TEMP", labels, 70 if busy else 40),
                ("DCGM_FI_DEV_SM_CLOCK", labels, 1980),
                ("DCGM_FI_DEV_MEM_CLOCK", labels, 2619),
            ]
        return out

    def start(self) -> LiveWriter:
        self.started = time.time()
        self._thread = threading.Thread(target=self._run, name="live-writer", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            now = time.time()
            try:
                self.sink(int(now * 1000), self.rows(self.phase(now - self.started)))
                self.written += 1
            except Exception as exc:  # a test reads these: the writer itself never stops on one
                self.errors.append(repr(exc))
            self._stop.wait(max(0.0, self.every_s - (time.time() - now)))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.sink.close()


class Sink(Protocol):
    def __call__(self, ms: int, rows: list[Row]) -> None: ...

    def close(self) -> None: ...


class VmSink:
    """Into VictoriaMetrics: one import of the pass' lines, flushed (readable at once)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def __call__(self, ms: int, rows: list[Row]) -> None:
        lines = [
            name + "{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}" + f" {value:g} {ms}"
            for name, labels, value in rows
        ]
        vm_import(self.url, [("\n".join(lines) + "\n").encode()], timeout_s=10)
        vm_force_flush(self.url)

    def close(self) -> None:
        pass


class StoreSink:
    """Into the embedded sample store at `path` (the file serve reads; one transaction a pass, beside
    serve's own collector)."""

    def __init__(self, path: Path) -> None:
        self.store = SampleStore.from_path(path)

    def __call__(self, ms: int, rows: list[Row]) -> None:
        self.store.write([Sample(name, labels, float(value), ms) for name, labels, value in rows])

    def close(self) -> None:
        self.store.close()
