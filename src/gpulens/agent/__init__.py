"""Local collector: samples this host (NVML GPUs, psutil host) and hands each pass to sinks.

Pieces: `Sample` (one catalog-named series value, samples.py), readers (`Reader` protocol,
readers/: nvml.py, system.py, fake.py), `Collector` + `Sink` (collector.py), the Prometheus text
exposition (exposition.py) and its HTTP endpoint (server.py). Only `gpulens.domain` is imported here;
the CLI (`gpulens agent`) wires it together.
"""

from __future__ import annotations

from gpulens.agent.collector import Collector, MemorySink, Sink
from gpulens.agent.exposition import ExpositionSink, render
from gpulens.agent.samples import SERIES, Sample, SeriesInfo, SeriesType

__all__ = [
    "SERIES",
    "Collector",
    "ExpositionSink",
    "MemorySink",
    "Sample",
    "SeriesInfo",
    "SeriesType",
    "Sink",
    "render",
]
