"""SampleStore: writes in one transaction, selects by name, matchers and time, survives reopening."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from gpulens.agent.samples import Sample
from gpulens.backends.embedded import SampleSource
from gpulens.storage.samples import BLOCK_MS, SampleStore


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SampleStore]:
    st = SampleStore.from_path(tmp_path / "s.db")
    yield st
    st.close()


def _fill(store: SampleStore) -> None:
    store.write(
        [
            Sample("m", (("gpu", "0"), ("Hostname", "h")), 1.0, 1000),
            Sample("m", (("gpu", "1"), ("Hostname", "h")), 2.0, 1000),
            Sample("m", (("gpu", "0"), ("Hostname", "h")), 3.5, 2000),
            Sample("n", (("instance", "h:9100"),), 7.0, 1000),
        ]
    )


def test_select_by_name_matchers_and_time(store: SampleStore) -> None:
    _fill(store)
    got = store.select("m", [("gpu", "=", "0")], 0, 5000)
    assert got == [({"__name__": "m", "Hostname": "h", "gpu": "0"}, [(1000, 1.0), (2000, 3.5)])]
    assert [s for s, _ in store.select("m", [("gpu", "=~", "0|1")], 1500, 5000)] == [
        {"__name__": "m", "Hostname": "h", "gpu": "0"}
    ]
    assert store.select("m", [("gpu", "=~", "1.")], 0, 5000) == []  # anchored
    assert len(store.select("m", [("missing", "=", "")], 0, 5000)) == 2  # missing label reads as ""
    assert len(store.select("m", [("gpu", "!~", "0")], 0, 5000)) == 1
    assert len(store.select("m", [("gpu", "!=", "0")], 0, 5000)) == 1
    assert len(store.select("", [("__name__", "=~", "m|n")], 0, 5000)) == 3
    assert store.series_names() == ["m", "n"]


def test_same_instant_replaces_and_dict_labels(store: SampleStore) -> None:
    class Dictish:
        name = "m"
        labels: ClassVar[dict[str, str]] = {"gpu": "0", "Hostname": "h", "empty": ""}
        value = 9.0
        timestamp_ms = 1000

    _fill(store)
    store.write([Dictish()])
    assert store.select("m", [("gpu", "=", "0")], 0, 1000)[0][1] == [(1000, 9.0)]


def test_reopen_keeps_data_and_ids(tmp_path: Path) -> None:
    st = SampleStore.from_path(tmp_path / "s.db")
    _fill(st)
    st.close()
    st = SampleStore.from_path(tmp_path / "s.db")
    st.write([Sample("m", (("gpu", "0"), ("Hostname", "h")), 4.0, 3000)])
    assert st.select("m", [("gpu", "=", "0")], 0, 5000)[0][1] == [(1000, 1.0), (2000, 3.5), (3000, 4.0)]
    assert st.series_names() == ["m", "n"]
    st.close()


def test_failed_batch_writes_nothing(store: SampleStore) -> None:
    def bad() -> Iterator[Sample]:
        yield Sample("new", (), 1.0, 1000)
        raise RuntimeError("collector died")

    with pytest.raises(RuntimeError):
        store.write(bad())
    assert store.series_names() == []
    store.write([Sample("new", (), 1.0, 1000)])
    assert store.select("new", [], 0, 1000) == [({"__name__": "new"}, [(1000, 1.0)])]


def test_wal_mode(tmp_path: Path) -> None:
    st = SampleStore.from_path(tmp_path / "s.db")
    st.close()
    conn = sqlite3.connect(tmp_path / "s.db")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


def test_is_a_sample_source(store: SampleStore) -> None:
    source: SampleSource = store  # structural: backends never import storage
    assert source.in_memory is False
    assert source.select_arrays("m", [], 0, 5000) == [] and source.select_labels("m", [], 0, 5000) == []
    _fill(store)
    assert source.select_labels("m", [("gpu", "=", "1")], 0, 5000) == [
        {"__name__": "m", "Hostname": "h", "gpu": "1"}
    ]
    assert source.select_labels("m", [("gpu", "=", "1")], 1500, 5000) == []  # no sample in the range


def test_select_labels_names_what_select_arrays_returns_sealed_or_not(store: SampleStore) -> None:
    """A series look-up reads chunks only at the range's edges: it must still name exactly the series
    with a sample in the range, whether the sample is sealed, in the head, at an edge or inside."""
    hour = BLOCK_MS
    times = {  # series -> sample times (ms): sparse ones leave whole chunks without the range's edges
        "0": [5 * 60_000, 50 * 60_000],
        "1": [hour + 30 * 60_000],
        "2": [2 * hour + 59 * 60_000, 3 * hour],
        "3": [t * 15_000 for t in range(4 * hour // 15_000)],
        "4": [4 * hour + 5 * 60_000],  # written last: stays in the head
    }
    for gpu, ts in times.items():
        store.write([Sample("m", (("gpu", gpu),), 1.0, t) for t in ts])
    stats = store.stats()
    assert stats.chunks > 0 and stats.head_samples > 0
    sparse = [t for gpu, ts in times.items() if gpu != "3" for t in ts]
    edges = sorted(
        {t + d for t in sparse for d in (-1, 0, 1)} | {k * hour + d for k in range(6) for d in (-1, 0)}
    )
    for lo in edges:
        for hi in edges:
            want = [labels for labels, _, _ in store.select_arrays("m", [], lo, hi)]
            assert store.select_labels("m", [], lo, hi) == want, (lo, hi)


def test_two_processes_share_one_store(tmp_path: Path) -> None:
    """`gpulens serve` and `gpulens run` write the same file: each sees the other's series."""
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class S:
        name: str
        labels: tuple[tuple[str, str], ...]
        value: float
        timestamp_ms: int

    a = SampleStore.from_path(tmp_path / "s.db")
    b = SampleStore.from_path(tmp_path / "s.db")
    b.write([S("m", (("host", "x"),), 1.0, 1000)])
    a.write([S("m", (("host", "x"),), 2.0, 2000), S("n", (), 3.0, 2000)])  # adopts b's series
    assert [samples for _, samples in b.select("m", [], 0, 5000)] == [[(1000, 1.0), (2000, 2.0)]]
    assert "n" in b.series_names()
    a.close()
    b.close()
