"""Data arriving live: a thread that writes one host's dcgm-exporter series into VictoriaMetrics (its
import API) every second, at the wall clock's time, following a script of phases (busy, then idle with
memory held, then busy again). What a running execution looks like to the live alerts."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from gpulens_testkit.promload import vm_force_flush, vm_import


@dataclass(frozen=True, slots=True)
class Phase:
    """From `at_s` seconds after the writer started: each GPU's utilization and FB used (% of FB)."""

    at_s: float
    util_percent: float
    fb_used_percent: float


FB_TOTAL_MIB = 81_559


@dataclass
class LiveWriter:
    url: str  # VictoriaMetrics
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

    def lines(self, ms: int, phase: Phase) -> bytes:
        out = []
        for gpu in self.gpus:
            labels = (
                f'gpu="{gpu}",UUID="GPU-{self.hostname}-{gpu}",Hostname="{self.hostname}",modelName="H100"'
            )
            used = FB_TOTAL_MIB * phase.fb_used_percent / 100
            busy = phase.util_percent > 0
            out += [
                f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {phase.util_percent:g} {ms}",
                f"DCGM_FI_DEV_FB_USED{{{labels}}} {used:.0f} {ms}",
                f"DCGM_FI_DEV_FB_FREE{{{labels}}} {FB_TOTAL_MIB - used:.0f} {ms}",
                f"DCGM_FI_DEV_POWER_USAGE{{{labels}}} {400 if busy else 80} {ms}",
                f"DCGM_FI_DEV_ENFORCED_POWER_LIMIT{{{labels}}} 700 {ms}",
                f"DCGM_FI_DEV_GPU_TEMP{{{labels}}} {70 if busy else 40} {ms}",
                f"DCGM_FI_DEV_SM_CLOCK{{{labels}}} 1980 {ms}",
                f"DCGM_FI_DEV_MEM_CLOCK{{{labels}}} 2619 {ms}",
            ]
        return ("\n".join(out) + "\n").encode()

    def start(self) -> LiveWriter:
        self.started = time.time()
        self._thread = threading.Thread(target=self._run, name="live-writer", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            now = time.time()
            try:
                vm_import(
                    self.url, [self.lines(int(now * 1000), self.phase(now - self.started))], timeout_s=10
                )
                vm_force_flush(self.url)
                self.written += 1
            except Exception as exc:  # a test reads these: the writer itself never stops on one
                self.errors.append(repr(exc))
            self._stop.wait(max(0.0, self.every_s - (time.time() - now)))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
