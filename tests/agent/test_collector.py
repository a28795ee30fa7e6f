"""The collector: one timestamp per pass, every sink gets the pass, a broken reader or sink is isolated."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

import pytest

from gpulens.agent.collector import Collector, MemorySink
from gpulens.agent.readers import default_readers
from gpulens.agent.readers.fake import FakeGpuReader
from gpulens.agent.readers.system import SystemReader
from gpulens.agent.samples import Sample
from gpulens.domain import catalog as c


class Broken:
    name = "broken"

    def __init__(self) -> None:
        self.fail = True

    def read(self, now_ms: int) -> list[Sample]:
        if self.fail:
            raise RuntimeError("boom")
        return [Sample("ok", (), 1.0, now_ms)]

    def close(self) -> None:
        pass


class BrokenSink:
    def write(self, samples: Sequence[Sample]) -> None:
        raise OSError("disk full")


def test_a_pass_goes_to_every_sink_with_one_timestamp() -> None:
    a, b = MemorySink(), MemorySink(keep=1)
    collector = Collector([FakeGpuReader("h", 2), SystemReader("h")], [a, b], clock=lambda: 1_767_225_600.25)
    samples = collector.collect()
    collector.collect()
    assert len(a.passes) == 2 and len(b.passes) == 1 and a.passes[0] == samples and a.latest == b.latest
    assert {s.timestamp_ms for s in samples} == {1_767_225_600_250}
    assert {c.DCGM_GPU_UTIL, c.NODE_CPU_SECONDS, c.NODE_MEM_TOTAL} <= {s.name for s in samples}


def test_broken_reader_and_sink_are_logged_once_and_isolated(caplog: pytest.LogCaptureFixture) -> None:
    broken = Broken()
    sink = MemorySink()
    collector = Collector([broken, FakeGpuReader("h", 1)], [BrokenSink(), sink])
    for _ in range(3):
        collector.collect()
    assert len(sink.passes) == 3 and all(p for p in sink.passes)
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert sum("reader broken failed" in m for m in errors) == 1
    assert sum("BrokenSink" in m for m in errors) == 1
    broken.fail = False
    caplog.set_level(logging.INFO, logger="gpulens.agent")
    collector.collect()
    assert any("reader broken works again" in r.getMessage() for r in caplog.records)


def test_run_until_stopped() -> None:
    sink = MemorySink()
    collector = Collector([FakeGpuReader("h", 1)], [sink], interval_s=0.01)
    stop = threading.Event()
    thread = collector.start(stop)
    while collector.passes < 3:
        stop.wait(0.01)
    stop.set()
    thread.join(5)
    assert not thread.is_alive() and len(sink.passes) >= 3


def test_interval_must_be_positive() -> None:
    with pytest.raises(ValueError):
        Collector([], interval_s=0)


def test_default_readers_fake_or_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    assert [r.name for r in default_readers("h", 2)] == ["fake", "system"]
    import gpulens.agent.readers.nvml as nvml_module

    asked: list[int] = []

    def no_gpu(hostname: str, *, max_process_series: int) -> None:
        asked.append(max_process_series)

    monkeypatch.setattr(nvml_module, "open_nvml_reader", no_gpu)  # no GPU here
    assert [r.name for r in default_readers("h", 0)] == ["system"]
    assert [r.name for r in default_readers("h", 0, 7)] == ["system"]
    assert asked == [1024, 7]  # GPULENS_MAX_PROCESS_SERIES reaches the NVML reader
