"""Write a dataset as OpenMetrics text (seconds) for promtool, or Prometheus text (ms) for VictoriaMetrics.

promtool re-parses a whole file once per block window, so the writer emits one file per epoch-aligned
window of the block duration (2h x 3^k) and the loader passes the same `--max-block-duration`.
Text is produced series by series, window by window: memory stays flat however long the scenario.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol


class ScenarioSpan(Protocol):
    """What the writers read from a scenario (Scenario and K8sScenario both fit)."""

    @property
    def name(self) -> str: ...
    @property
    def start_s(self) -> int: ...
    @property
    def end_s(self) -> int: ...
    @property
    def scrape_interval_s(self) -> int: ...


class ExposedSeries(Protocol):
    """A series as the text formats write it: its name and its labels in exposition order."""

    @property
    def name(self) -> str: ...
    @property
    def labels(self) -> tuple[tuple[str, str], ...]: ...


def exposition(series: ExposedSeries) -> str:
    """`name{a="b",...}` as written in the text formats (the generators' label values need no escaping)."""
    inner = ",".join(f'{k}="{v}"' for k, v in series.labels)
    return f"{series.name}{{{inner}}}"


class ExposedFamily(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def metric_type(self) -> str: ...
    @property
    def series(self) -> Sequence[ExposedSeries]: ...


class Exposable(Protocol):
    """A generated dataset the writers and loaders accept (history.Dataset, k8s_generate.K8sDataset).

    `values` returns the samples k0 <= k < k1; None marks a sample the series does not have.
    """

    @property
    def scenario(self) -> ScenarioSpan: ...
    @property
    def sample_count(self) -> int: ...
    @property
    def families(self) -> Sequence[ExposedFamily]: ...
    def values(self, series: Any, k0: int = 0, k1: int | None = None) -> Sequence[float | None]: ...


BLOCK_LADDER_S: tuple[int, ...] = tuple(7200 * 3**i for i in range(6))  # 2h, 6h, 18h, 54h, 162h, 486h
_COUNTER_SUFFIX = "_total"


MAX_AUTO_BLOCK_S = 54 * 3600  # longer windows only make each file (and each promtool run) bigger


def choose_block_seconds(span_s: int, max_files: int = 4) -> int:
    """The smallest ladder duration that covers `span_s` in at most `max_files` windows, at most 54 h."""
    for block in BLOCK_LADDER_S:
        if span_s // block + 2 <= max_files or block >= MAX_AUTO_BLOCK_S:
            return block
    return MAX_AUTO_BLOCK_S  # pragma: no cover - the ladder reaches it


def format_block_duration(block_s: int) -> str:
    """`6h`-style duration for promtool/Prometheus flags."""
    if block_s % 3600:
        raise ValueError("block durations are whole hours")
    return f"{block_s // 3600}h"


def block_windows(dataset: Exposable, block_s: int) -> list[tuple[int, int]]:
    """Epoch-aligned [w0, w1) windows (seconds) that hold at least one sample, oldest first."""
    sc = dataset.scenario
    out = []
    w0 = sc.start_s - sc.start_s % block_s
    while w0 <= sc.end_s:
        out.append((w0, w0 + block_s))
        w0 += block_s
    return out


def sample_range(dataset: Exposable, w0: int, w1: int) -> tuple[int, int]:
    """Sample indices [k0, k1) whose timestamps lie in [w0, w1)."""
    sc = dataset.scenario
    interval = sc.scrape_interval_s
    k0 = max(0, -((sc.start_s - w0) // interval))
    k1 = min(dataset.sample_count, -((sc.start_s - w1) // interval))
    return k0, max(k0, k1)


def family_type_line(name: str, metric_type: str, openmetrics: bool) -> str:
    """`# TYPE` line; OpenMetrics names a counter family without its `_total` suffix."""
    if openmetrics and metric_type == "counter" and name.endswith(_COUNTER_SUFFIX):
        name = name[: -len(_COUNTER_SUFFIX)]
    return f"# TYPE {name} {metric_type}\n"


def iter_text(
    dataset: Exposable, k0: int, k1: int, *, millis: bool = False, openmetrics: bool = True
) -> Iterator[str]:
    """Text chunks (one per series) of samples k0 <= k < k1: families in order, each series time-ordered.

    Timestamps are seconds (OpenMetrics, promtool) or milliseconds (`millis`, Prometheus text for
    VictoriaMetrics). The OpenMetrics form ends with `# EOF`.
    """
    start, interval = dataset.scenario.start_s, dataset.scenario.scrape_interval_s
    scale = 1000 if millis else 1
    if k1 > k0:
        for family in dataset.families:
            yield family_type_line(family.name, family.metric_type, openmetrics)
            for series in family.series:
                prefix = exposition(series) + " "
                values = dataset.values(series, k0, k1)
                t0 = (start + k0 * interval) * scale
                step = interval * scale
                yield "".join(
                    f"{prefix}{v!r} {t0 + i * step}\n" for i, v in enumerate(values) if v is not None
                )
    if openmetrics:
        yield "# EOF\n"


def block_seconds(dataset: Exposable, block_s: int | None = None) -> int:
    """`block_s`, or by default the one `choose_block_seconds` picks for the scenario's span."""
    sc = dataset.scenario
    return block_s or choose_block_seconds(sc.end_s - sc.start_s)


def iter_blocks(dataset: Exposable, block_s: int | None = None) -> Iterator[tuple[int, int, int]]:
    """(w0, k0, k1) of each block window that holds samples, oldest first: the window's start (s) and
    its sample indices [k0, k1). `block_s` defaults to `block_seconds(dataset)`."""
    for w0, w1 in block_windows(dataset, block_seconds(dataset, block_s)):
        k0, k1 = sample_range(dataset, w0, w1)
        if k1 > k0:
            yield w0, k0, k1


def write_block(dataset: Exposable, out_dir: Path, w0: int, k0: int, k1: int) -> Path:
    """Samples k0 <= k < k1 as the OpenMetrics file `<scenario>-<w0>.om` in `out_dir`, streamed; its path."""
    path = out_dir / f"{dataset.scenario.name}-{w0}.om"
    with path.open("w", encoding="utf-8", newline="\n") as fh:
        fh.writelines(iter_text(dataset, k0, k1))
    return path


def write_openmetrics(dataset: Exposable, out_dir: Path, block_s: int | None = None) -> list[Path]:
    """One OpenMetrics file per block window (`<scenario>-<w0>.om`), streamed to disk; the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    return [write_block(dataset, out_dir, *block) for block in iter_blocks(dataset, block_s)]


def iter_prometheus_ms_blocks(dataset: Exposable, block_s: int | None = None) -> Iterator[Iterator[bytes]]:
    """Per block window, the Prometheus text (ms timestamps) as byte chunks: one import request each."""
    for _, k0, k1 in iter_blocks(dataset, block_s):
        yield (chunk.encode() for chunk in iter_text(dataset, k0, k1, millis=True, openmetrics=False))
