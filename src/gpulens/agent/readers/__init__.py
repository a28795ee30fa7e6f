"""Readers: each turns one source (NVML, psutil, a script) into the samples of one pass."""

from __future__ import annotations

import logging
from typing import Protocol

from gpulens.agent.samples import Sample
from gpulens.domain import catalog as c

log = logging.getLogger("gpulens.agent")


class Reader(Protocol):
    """One source of samples. `read` is called once per pass; `close` once at the end."""

    @property
    def name(self) -> str:
        """For log lines: "nvml", "system", "fake"."""
        ...

    def read(self, now_ms: int) -> list[Sample]:
        """This pass's samples, all stamped `now_ms`. A value that cannot be read is left out, never 0."""
        ...

    def close(self) -> None: ...


def default_readers(
    hostname: str, fake_gpus: int = 0, max_process_series: int = c.MAX_PROCESS_SERIES
) -> list[Reader]:
    """GPU reader (NVML, or `fake_gpus` scripted GPUs) when there is one, then the host reader.
    `max_process_series`: how many per-process series the NVML reader creates (the rest: `other`)."""
    from gpulens.agent.readers.fake import FakeGpuReader
    from gpulens.agent.readers.nvml import open_nvml_reader
    from gpulens.agent.readers.system import SystemReader

    readers: list[Reader] = []
    if fake_gpus > 0:
        log.info("fake GPUs: %d scripted GPU(s), no NVML", fake_gpus)
        readers.append(FakeGpuReader(hostname, fake_gpus))
    else:
        nvml = open_nvml_reader(hostname, max_process_series=max_process_series)
        if nvml is not None:
            readers.append(nvml)
    readers.append(SystemReader(hostname))
    return readers


__all__ = ["Reader", "default_readers"]
