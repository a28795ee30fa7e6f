"""Prometheus text format 0.0.4 of one pass, as dcgm-exporter and node-exporter write it, from a
prometheus_client custom collector of the pass."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Iterator, Sequence

from prometheus_client.metrics_core import Metric

from gpulens.agent.samples import SERIES, Sample

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def escape_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def exposition_value(value: float) -> str:
    """A sample value as the exporters write it in the text format: whole numbers as integers, else
    Python's shortest repr (`1e+20` allowed). Not the JSON API's text (backends/embedded
    `format_value`, which never writes an exponent)."""
    value = float(value)  # an int is a float to the type checker, not to `is_integer`
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


class PassCollector:
    """One pass as a prometheus_client custom collector: a `Metric` family per series name, in
    first-seen order, samples keeping the exporter's label order. `collect()` serves any
    prometheus_client registry; `render()` writes the families as the exporters do.

    A counter family is named without `_total` (prometheus_client's convention, so its own writer
    would type `node_cpu_seconds_total` right); its samples keep the exposed name. dcgm-exporter's
    counters have no `_total`: prometheus_client's writer would type them under `<name>_total`, so
    the agent writes the text itself (`write_text`), typed under each sample's own name.
    """

    def __init__(self, samples: Iterable[Sample]) -> None:
        groups: dict[str, list[Sample]] = {}
        for s in samples:
            groups.setdefault(s.name, []).append(s)
        self.families: list[Metric] = []
        for name, group in groups.items():
            info = SERIES.get(name)
            kind = info.type.value if info is not None else "unknown"
            family = name.removesuffix("_total") if kind == "counter" else name
            metric = Metric(family, info.help if info is not None else "", kind)
            for s in group:
                metric.add_sample(name, dict(s.labels), float(s.value))
            self.families.append(metric)

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)

    def describe(self) -> list[Metric]:
        return []  # the names change with the hardware: nothing to check at registration


def write_text(families: Iterable[Metric]) -> str:
    """Text format 0.0.4: HELP/TYPE once per family under its samples' exposed name (an unknown
    family: `untyped`, no HELP); no timestamps (Prometheus stamps the scrape)."""
    lines: list[str] = []
    for family in families:
        if not family.samples:
            continue
        name = family.samples[0].name
        if family.type == "unknown":
            lines.append(f"# TYPE {name} untyped")
        else:
            lines.append(f"# HELP {name} {escape_help(family.documentation)}")
            lines.append(f"# TYPE {name} {family.type}")
        for s in family.samples:
            if s.labels:
                inner = ",".join(f'{k}="{escape_label_value(v)}"' for k, v in s.labels.items())
                lines.append(f"{s.name}{{{inner}}} {exposition_value(s.value)}")
            else:
                lines.append(f"{s.name} {exposition_value(s.value)}")
    lines.append("")
    return "\n".join(lines)


def render(samples: Iterable[Sample]) -> str:
    """One pass as exposition text (through its `PassCollector`)."""
    return write_text(PassCollector(samples).collect())


class ExpositionSink:
    """Renders each pass once; `body()` hands the latest rendering to any number of scrapers, and
    `collect()` the latest pass to a prometheus_client registry (`registry.register(sink)`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._body: bytes | None = None
        self._latest: PassCollector | None = None
        self.timestamp_ms: int | None = None

    def write(self, samples: Sequence[Sample]) -> None:
        latest = PassCollector(samples)
        body = write_text(latest.collect()).encode()
        with self._lock:
            self._body = body
            self._latest = latest
            self.timestamp_ms = samples[0].timestamp_ms if samples else None

    def body(self) -> bytes | None:
        """The latest pass as exposition text; None before the first pass."""
        with self._lock:
            return self._body

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            latest = self._latest
        return latest.collect() if latest is not None else iter(())

    def describe(self) -> list[Metric]:
        return []
