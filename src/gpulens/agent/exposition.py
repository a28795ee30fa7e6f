"""Prometheus text format 0.0.4 of one pass, as dcgm-exporter and node-exporter write it."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Sequence

from gpulens.agent.samples import SERIES, Sample

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def escape_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: float) -> str:
    value = float(value)  # an int is a float to the type checker, not to `is_integer`
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def render(samples: Iterable[Sample]) -> str:
    """HELP/TYPE once per series name, in first-seen order; no timestamps (Prometheus stamps the scrape)."""
    groups: dict[str, list[Sample]] = {}
    for s in samples:
        groups.setdefault(s.name, []).append(s)
    lines: list[str] = []
    for name, group in groups.items():
        info = SERIES.get(name)
        if info is not None:
            lines.append(f"# HELP {name} {escape_help(info.help)}")
            lines.append(f"# TYPE {name} {info.type.value}")
        else:
            lines.append(f"# TYPE {name} untyped")
        for s in group:
            if s.labels:
                inner = ",".join(f'{k}="{escape_label_value(v)}"' for k, v in s.labels)
                lines.append(f"{name}{{{inner}}} {format_value(s.value)}")
            else:
                lines.append(f"{name} {format_value(s.value)}")
    lines.append("")
    return "\n".join(lines)


class ExpositionSink:
    """Renders each pass once; `body()` hands the latest rendering to any number of scrapers."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._body: bytes | None = None
        self.timestamp_ms: int | None = None

    def write(self, samples: Sequence[Sample]) -> None:
        body = render(samples).encode()
        with self._lock:
            self._body = body
            self.timestamp_ms = samples[0].timestamp_ms if samples else None

    def body(self) -> bytes | None:
        """The latest pass as exposition text; None before the first pass."""
        with self._lock:
            return self._body
