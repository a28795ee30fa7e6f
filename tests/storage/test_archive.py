"""The archive tables and their sample source: codec, atomic replacement, pending objects (both dialects)."""

from __future__ import annotations

import json
import math
import struct
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from sqlalchemy import delete, func, select

from gpulens.domain.models import Execution, ExecutionStatus
from gpulens.domain.workloads import Pod, PodPhase, Workload
from gpulens.storage.archive import (
    DAY_MS,
    EXECUTION,
    POD,
    ArchiveInfo,
    ArchiveSource,
    ArchiveStore,
    EncodedSeries,
    decode_series,
    encode_series,
    merge_samples,
)
from gpulens.storage.chunks import CorruptChunk
from gpulens.storage.registry import Registry
from gpulens.storage.samples import canonical_labels
from gpulens.storage.tables import ArchiveRow, ArchiveSeriesRow

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
NOW = datetime(2026, 3, 1, tzinfo=UTC)


def arrays(times: list[int], values: list[float]) -> tuple[np.ndarray, np.ndarray]:  # type: ignore[type-arg]
    return np.array(times, dtype=np.int64), np.array(values, dtype=np.float64)


# -- codec -------------------------------------------------------------------------------------------


def test_series_round_trip_bit_for_bit_over_several_days() -> None:
    t = np.arange(T0 - 3_600_000, T0 + 2 * DAY_MS + 7, 15_000, dtype=np.int64)
    t[5] += 3  # jitter
    v = np.sin(np.arange(len(t)) / 50.0) * 100
    v[7], v[8], v[9] = math.nan, -0.0, math.inf
    blob = encode_series(t, v)
    frames = 0
    at = 0
    while at < len(blob):  # one frame per UTC day touched: the hour before T0's day, then 2 days and 7 ms
        (size,) = struct.unpack_from("<I", blob, at)
        at += 4 + size
        frames += 1
    assert frames == 4
    t2, v2 = decode_series(blob)
    assert np.array_equal(t, t2)
    assert np.array_equal(v.view(np.uint64), v2.view(np.uint64))  # NaN payloads and -0.0 included
    empty_t, empty_v = decode_series(encode_series(t[:0], v[:0]))
    assert len(empty_t) == 0 and len(empty_v) == 0


def test_a_damaged_series_is_refused() -> None:
    blob = encode_series(*arrays([T0, T0 + 15_000], [1.0, 2.0]))
    with pytest.raises(CorruptChunk):
        decode_series(blob[:-3])
    with pytest.raises(CorruptChunk):
        decode_series(blob + b"\x01")


def test_merge_keeps_each_timestamp_once_in_order() -> None:
    t, v = merge_samples([arrays([3, 5, 9], [3.0, 5.0, 9.0]), arrays([1, 5, 7], [1.0, 5.0, 7.0])])
    assert t.tolist() == [1, 3, 5, 7, 9] and v.tolist() == [1.0, 3.0, 5.0, 7.0, 9.0]


# -- the source ----------------------------------------------------------------------------------------


def sample_source() -> ArchiveSource:
    return ArchiveSource(
        [
            (
                {"__name__": "m", "gpu": "0", "Hostname": "h"},
                *arrays([T0, T0 + 15_000, T0 + 30_000], [1, 2, 3]),
            ),
            ({"__name__": "m", "gpu": "1", "Hostname": "h"}, *arrays([T0 + 15_000], [4])),
            ({"__name__": "n", "instance": "h:9100"}, *arrays([T0], [5])),
            # the same series from a second selection: merged, each timestamp once
            ({"__name__": "m", "gpu": "0", "Hostname": "h"}, *arrays([T0 + 30_000, T0 + 45_000], [3, 6])),
            ({"__name__": "empty"}, *arrays([], [])),
        ]
    )


def test_source_selects_like_the_sample_store() -> None:
    src = sample_source()
    assert len(src) == 3 and src.sample_count == 6
    assert src.series_names() == ["m", "n"]
    got = src.select("m", [("gpu", "=", "0")], T0 + 1, T0 + 45_000)
    assert got == [
        (
            {"__name__": "m", "gpu": "0", "Hostname": "h"},
            [(T0 + 15_000, 2.0), (T0 + 30_000, 3.0), (T0 + 45_000, 6.0)],
        )
    ]
    assert [lb["gpu"] for lb, _ in src.select("m", [("gpu", "=~", "0|1")], T0, T0 + 15_000)] == ["0", "1"]
    assert [lb["gpu"] for lb, _ in src.select("m", [("gpu", "!=", "0")], T0, T0 + 60_000)] == ["1"]
    assert src.select("m", [("missing", "!~", ".+")], T0, T0)[0][0]["gpu"] == "0"  # a missing label reads ""
    assert src.select("m", [("gpu", "=", "1")], T0, T0 + 1) == []  # no samples in range: left out
    anyname = src.select_arrays("", [("__name__", "=~", "m|n")], T0, T0)
    assert sorted(lb["__name__"] for lb, _, _ in anyname) == ["m", "n"]
    labels, t, v = src.select_arrays("n", [], T0, T0)[0]
    labels["__name__"] = "changed"  # callers get copies
    assert src.series_names() == ["m", "n"] and t.dtype == np.int64 and v.dtype == np.float64


def test_series_look_ups_read_labels_only_with_the_same_answer() -> None:
    """`select_labels` (what a series API look-up needs) names the series `select_arrays` returns."""
    src = sample_source()
    cases = [
        ("m", [], T0, T0 + 60_000),
        ("m", [("gpu", "=", "1")], T0, T0 + 1),  # no sample in range: left out
        ("m", [("gpu", "=~", "0|1")], T0 + 15_000, T0 + 15_000),  # closed at both ends
        ("", [("__name__", "=~", "m|n")], T0, T0),
        ("n", [("Hostname", "!=", "h")], 0, T0 + 60_000),
        ("missing", [], 0, T0 + 60_000),
        ("m", [], T0 + 60_001, T0 + 120_000),  # after every sample
    ]
    for metric, matchers, lo, hi in cases:
        want = [labels for labels, _, _ in src.select_arrays(metric, matchers, lo, hi)]
        assert src.select_labels(metric, matchers, lo, hi) == want, (metric, matchers, lo, hi)
    src.select_labels("m", [], T0, T0 + 60_000)[0]["__name__"] = "changed"  # callers get copies
    assert src.series_names() == ["m", "n"]


def test_union_merges_equal_label_sets() -> None:
    a = ArchiveSource([({"__name__": "m", "pod": "p"}, *arrays([1, 2], [1, 2]))])
    b = ArchiveSource(
        [({"__name__": "m", "pod": "p"}, *arrays([2, 3], [2, 3])), ({"__name__": "x"}, *arrays([1], [9]))]
    )
    u = ArchiveSource.union([a, b])
    assert len(u) == 2
    assert u.select("m", [], 0, 10) == [({"__name__": "m", "pod": "p"}, [(1, 1.0), (2, 2.0), (3, 3.0)])]
    assert ArchiveSource.union([a]) is a


# -- the store (SQLite and PostgreSQL) -------------------------------------------------------------------


@pytest.fixture
def store(registry: Registry) -> Iterator[ArchiveStore]:
    with registry.engine.begin() as conn:  # the shared PostgreSQL database keeps rows between tests
        conn.execute(delete(ArchiveSeriesRow))
        conn.execute(delete(ArchiveRow))
    yield ArchiveStore(registry)


def info(object_id: str, kind: str = EXECUTION, **changes: object) -> ArchiveInfo:
    base: dict[str, object] = {
        "id": str(uuid.uuid4()),
        "kind": kind,
        "object_id": object_id,
        "org": "acme",
        "spec_digest": "s" * 64,
        "options_digest": "o" * 64,
        "hostname": "gpu-node-1",
        "namespace": None,
        "name": None,
        "gpus": ("0", "3"),
        "start_time": NOW - timedelta(hours=2),
        "end_time": NOW - timedelta(hours=1),
        "from_ms": T0,
        "to_ms": T0 + 3_600_000,
        "source_updated_at": NOW - timedelta(hours=1),
        "series_count": 2,
        "sample_count": 3,
        "raw_count": 3,
        "byte_count": 100,
        "created_at": NOW,
        "checked_at": NOW,
    }
    base.update(changes)
    return ArchiveInfo(**base)  # type: ignore[arg-type]


def encoded(labels: dict[str, str], times: list[int]) -> EncodedSeries:
    t, v = arrays(times, [float(i) for i in range(len(times))])
    return EncodedSeries(canonical_labels(labels), len(times), encode_series(t, v))


def test_replace_is_whole_and_the_old_archive_goes(store: ArchiveStore) -> None:
    first = info("e1")
    store.replace(
        first, [encoded({"__name__": "m", "gpu": "0"}, [T0, T0 + 15_000]), encoded({"__name__": "n"}, [T0])]
    )
    got = store.get(EXECUTION, "e1")
    assert got == first
    src = store.load(first.id)
    assert src.series_names() == ["m", "n"] and src.sample_count == 3
    second = info("e1", sample_count=1, series_count=1)
    store.replace(second, [encoded({"__name__": "m", "gpu": "1"}, [T0])])
    assert store.get(EXECUTION, "e1") == second
    assert store.series(first.id) == []  # the old generation's rows are gone
    assert [json.loads(s.labels) for s in store.series(second.id)] == [{"__name__": "m", "gpu": "1"}]
    with store.registry.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(ArchiveRow)).scalar() == 1
        assert conn.execute(select(func.count()).select_from(ArchiveSeriesRow)).scalar() == 1


def test_a_failed_replace_leaves_the_old_archive(store: ArchiveStore) -> None:
    first = info("e1")
    store.replace(first, [encoded({"__name__": "m"}, [T0])])
    broken = info("e1", org=None)  # NOT NULL: the insert fails after the delete, in the same transaction
    with pytest.raises(Exception):
        store.replace(broken, [encoded({"__name__": "m"}, [T0, T0 + 1])])
    assert store.get(EXECUTION, "e1") == first
    assert len(store.series(first.id)) == 1


def test_kinds_are_separate_and_totals_add_up(store: ArchiveStore) -> None:
    store.replace(
        info("x", sample_count=10, byte_count=25, series_count=1), [encoded({"__name__": "m"}, [T0])]
    )
    store.replace(info("x", POD, sample_count=30, byte_count=35, series_count=2), [])
    store.replace(info("y", POD, sample_count=1, byte_count=1, series_count=1), [])
    assert set(store.get_many(POD, ["x", "y", "z"])) == {"x", "y"}
    assert store.get(EXECUTION, "y") is None
    totals = store.totals()
    assert (totals.executions, totals.pods, totals.series, totals.samples, totals.bytes) == (1, 2, 4, 41, 61)
    assert store.delete(POD, "x") and not store.delete(POD, "x")
    assert store.get(POD, "x") is None and store.get(EXECUTION, "x") is not None


def execution(
    execution_id: str, status: ExecutionStatus = ExecutionStatus.COMPLETED, **changes: object
) -> Execution:
    base: dict[str, object] = {
        "execution_id": execution_id,
        "org": "acme",
        "hostname": "gpu-node-1",
        "gpus": ("0",),
        "status": status,
        "created_at": NOW - timedelta(hours=3),
        "start_time": NOW - timedelta(hours=2),
        "end_time": NOW - timedelta(hours=1),
    }
    base.update(changes)
    return Execution(**base)  # type: ignore[arg-type]


def test_pending_executions_are_finished_unarchived_or_changed(
    store: ArchiveStore, registry: Registry
) -> None:
    r = registry
    r.upsert_execution(execution("done"), now=NOW - timedelta(minutes=50))
    r.upsert_execution(execution("running", ExecutionStatus.RUNNING, end_time=None), now=NOW)
    r.upsert_execution(execution("recent", end_time=NOW - timedelta(minutes=1)), now=NOW)
    r.upsert_execution(execution("no-host", hostname=None), now=NOW)
    r.upsert_execution(execution("archived"), now=NOW - timedelta(minutes=50))
    ready = NOW - timedelta(minutes=10)
    updated = store.updated_at(EXECUTION, "archived")
    assert updated is not None and store.updated_at(EXECUTION, "nope") is None
    store.replace(info("archived", source_updated_at=updated), [])
    assert [p.object_id for p in store.pending_executions(ready, "o" * 64)] == ["done"]
    assert store.pending_executions(ready, "o" * 64, exclude=["done"]) == []
    # a PATCH (any field) brings it back, with its archive, for the caller to compare
    r.update_execution("archived", {"return_code": 0}, now=NOW - timedelta(minutes=40))
    found = {p.object_id: p for p in store.pending_executions(ready, "o" * 64)}
    assert set(found) == {"done", "archived"}
    assert found["archived"].archive is not None and found["done"].archive is None
    store.mark(found["archived"].archive.id, source_updated_at=found["archived"].updated_at)
    assert [p.object_id for p in store.pending_executions(ready, "o" * 64)] == ["done"]
    # other settings: every archive is pending again
    assert {p.object_id for p in store.pending_executions(ready, "n" * 64)} == {"done", "archived"}
    assert len(store.pending_executions(ready, "n" * 64, limit=1)) == 1


def test_pending_pods_are_finished_unarchived_or_changed(store: ArchiveStore, registry: Registry) -> None:
    wid = str(uuid.uuid4())
    workload = Workload(wid, "train", "acme", None, NOW - timedelta(hours=3))
    pods = [
        Pod(
            str(uuid.uuid4()),
            wid,
            "done-0",
            "team-a",
            "n1",
            ("0",),
            PodPhase.SUCCEEDED,
            NOW - timedelta(hours=2),
            NOW - timedelta(hours=1),
        ),
        Pod(
            str(uuid.uuid4()),
            wid,
            "run-0",
            "team-a",
            "n1",
            (),
            PodPhase.RUNNING,
            NOW - timedelta(hours=2),
            None,
        ),
        Pod(
            str(uuid.uuid4()),
            wid,
            "late-0",
            "team-a",
            "n1",
            (),
            PodPhase.FAILED,
            NOW - timedelta(hours=2),
            NOW,
        ),
    ]
    registry.upsert_workload(workload, pods, now=NOW - timedelta(hours=1))
    found = store.pending_pods(NOW - timedelta(minutes=10), "o" * 64)
    assert [p.object_id for p in found] == [pods[0].pod_id]
    assert store.pod_org(pods[0].pod_id) == "acme" and store.pod_org(str(uuid.uuid4())) is None


def test_young_archives_are_due_for_a_check(store: ArchiveStore) -> None:
    store.replace(info("young", created_at=NOW, checked_at=NOW - timedelta(hours=2)), [])
    store.replace(info("checked", created_at=NOW, checked_at=NOW), [])
    store.replace(info("old", created_at=NOW - timedelta(days=2), checked_at=NOW - timedelta(days=2)), [])
    due = store.due_for_check(NOW - timedelta(days=1), NOW - timedelta(hours=1))
    assert [i.object_id for i in due] == ["young"]
    store.mark(due[0].id, checked_at=NOW)
    assert store.due_for_check(NOW - timedelta(days=1), NOW - timedelta(hours=1)) == []


def test_series_with_equal_timestamps_share_one_array() -> None:
    t = np.arange(0, 600_000, 15_000, dtype=np.int64)
    src = ArchiveSource(
        [
            ({"__name__": "m", "gpu": "0"}, t.copy(), np.ones(len(t))),
            ({"__name__": "m", "gpu": "1"}, t.copy(), np.zeros(len(t))),
            ({"__name__": "n"}, t[1:].copy(), np.zeros(len(t) - 1)),
        ]
    )
    (_, t0, v0), (_, t1, v1), (_, t2, _) = src.items()
    assert t0 is t1 and t2 is not t0 and v0 is not v1
    assert src.nbytes == 2 * t.nbytes - 8 + 3 * len(t) * 8 - 8 + 64 * (3 + 3 + 2)


def test_matching_series_are_remembered_per_selector_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    import gpulens.storage.archive as archive

    monkeypatch.setattr(archive, "MATCHED_MAX", 2)
    src = sample_source()
    for _ in range(2):
        for gpu in ("0", "1", "0|1", "2"):
            got = src.select_labels("m", [("gpu", "=~", gpu)], T0, T0 + 60_000)
            assert [lb["gpu"] for lb in got] == [g for g in ("0", "1") if g in gpu.split("|")]
            assert len(src._matched) <= 2
