"""The demo's generator (`gpulens.demo.history`) with what only tests and the text writers read.

`generate(scenario)` returns this module's `Dataset`, a subclass of the demo's: the series grouped in
families (one `# TYPE` block each, for `openmetrics`), single samples, lookups by host and field, and
the phase or host CPU load behind a sample. Values are the demo's, computed by the same code.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from gpulens.demo import history
from gpulens.demo.history import Field, SeriesDef
from gpulens.demo.scenario import ExecutionSpec, PhaseSpan, Scenario
from gpulens.domain import catalog as c
from gpulens_testkit.openmetrics import ExposedSeries


def sort_key(series: ExposedSeries) -> tuple[tuple[str, str], ...]:
    """Prometheus' label-set order (sorted by label name, compared pair by pair): the order its
    aggregations see series in."""
    return tuple(sorted(((c.LABEL_METRIC_NAME, series.name), *series.labels)))


@dataclass(frozen=True, slots=True)
class Family:
    """All series with one name (one `# TYPE` block)."""

    name: str
    metric_type: str
    series: tuple[SeriesDef, ...]


class Dataset(history.Dataset):
    """The demo's dataset of a scenario, with families, single samples and lookups for tests."""

    def __init__(self, scenario: Scenario) -> None:
        super().__init__(scenario)
        by_name: dict[str, list[SeriesDef]] = {}
        self._by_key: dict[tuple[str, Field], list[SeriesDef]] = {}
        for s in self.series:
            by_name.setdefault(s.name, []).append(s)
            self._by_key.setdefault((s.hostname, s.field), []).append(s)
        self.families = tuple(Family(name, ss[0].metric_type, tuple(ss)) for name, ss in by_name.items())

    def value_at(self, series: SeriesDef, k: int) -> float:
        """The value of sample k (IndexError outside 0 <= k < sample_count)."""
        if not 0 <= k < self.sample_count:
            raise IndexError(k)
        i = bisect.bisect_right(self._starts(series), k) - 1
        return self._kernel(series, i)(k)

    def series_of(self, hostname: str, field: Field) -> tuple[SeriesDef, ...]:
        """A host's series of one field (GPU-index order; for CPU counters cpu then mode order)."""
        return tuple(self._by_key.get((hostname, field), ()))

    def gpu_series(
        self, hostname: str, field: Field, gpus: tuple[int, ...] | None = None
    ) -> tuple[SeriesDef, ...]:
        """`series_of` for the GPUs `gpus` only (None: every GPU)."""
        return tuple(s for s in self.series_of(hostname, field) if gpus is None or s.gpu in gpus)

    def cpu_percent_at(self, hostname: str, k: int) -> int:
        """Host CPU busy % over the interval that ends at sample k (the rate all its CPUs show)."""
        pieces = self._host_pieces[hostname]
        state = pieces[bisect.bisect_right(self._host_piece_starts[hostname], k) - 1].host
        assert state is not None
        return state.cpu_percent

    def gpu_phase_at(self, hostname: str, gpu: int, k: int) -> tuple[ExecutionSpec, PhaseSpan] | None:
        """The execution and phase that own a GPU at sample k, None while nobody does."""
        pieces = self._gpu_pieces[(hostname, gpu)]
        piece = pieces[bisect.bisect_right(self._piece_starts[(hostname, gpu)], k) - 1]
        return None if piece.gpu is None else (piece.gpu.execution, piece.gpu.span)


def generate(scenario: Scenario) -> Dataset:
    """The dataset of a scenario: every series, sampled at the scrape interval from start to end."""
    return Dataset(scenario)
