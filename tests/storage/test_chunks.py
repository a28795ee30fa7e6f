"""The block codec and the store's sealed chunks: lossless, merged with the head, small on disk."""

from __future__ import annotations

import random
import sqlite3
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpulens.agent.samples import Sample
from gpulens.storage import chunks
from gpulens.storage.samples import BLOCK_MS, SampleStore, StoreStats

HOUR = BLOCK_MS
BASE = 1_767_225_600_000  # 2026-01-01, an hour boundary


def _bits(x: float) -> int:
    return int.from_bytes(struct.pack("<d", x), "little")


any_float = st.floats(allow_nan=True, allow_infinity=True) | st.integers(0, 2**64 - 1).map(
    lambda b: struct.unpack("<d", b.to_bytes(8, "little"))[0]  # every bit pattern, NaN payloads too
)


@settings(max_examples=300, deadline=None)
@given(
    first=st.integers(-(2**50), 2**50),
    gaps=st.lists(st.integers(1, 2**31), min_size=0, max_size=300),
    data=st.data(),
)
def test_codec_round_trips_bit_for_bit(first: int, gaps: list[int], data: st.DataObject) -> None:
    times = [first]
    for g in gaps:
        times.append(times[-1] + g)
    values = data.draw(st.lists(any_float, min_size=len(times), max_size=len(times)))
    t, v = chunks.decode(chunks.encode(times, values))
    assert t.tolist() == times
    assert [_bits(x) for x in v.tolist()] == [_bits(x) for x in values]
    pairs = chunks.decode_pairs(chunks.encode(times, values))
    assert [p[0] for p in pairs] == times and all(isinstance(p[0], int) for p in pairs)


def test_codec_rejects_what_it_did_not_write() -> None:
    good = chunks.encode([1, 2, 3], [1.0, 2.0, 3.0])
    for bad in (b"", b"\x01", good[:-3], b"\x02" + good[1:], good[:13] + b"\x00" * 20):
        with pytest.raises(chunks.CorruptChunk):
            chunks.decode(bad)
    with pytest.raises(ValueError):
        chunks.encode([], [])
    with pytest.raises(ValueError):
        chunks.encode([1, 2], [1.0])


def test_regular_gauges_compress_far_below_16_bytes() -> None:
    rng = random.Random(7)
    times = [BASE + 5000 * k + rng.randint(-3, 3) for k in range(720)]  # 5 s with a few ms of jitter
    util = [float(min(100, max(0, 80 + rng.randint(-5, 5)))) for _ in times]
    power = [round(250 + rng.uniform(-20, 20), 3) for _ in times]
    assert len(chunks.encode(times, util)) / len(times) < 2.5
    assert len(chunks.encode(times, power)) / len(times) < 8


# -- the store: sealing never changes an answer ----------------------------------------------------------


class Model:
    """What the store must answer: the last write per (series, timestamp)."""

    def __init__(self) -> None:
        self.points: dict[str, dict[int, float]] = {}

    def write(self, batch: list[Sample]) -> None:
        for s in batch:
            self.points.setdefault(dict(s.labels)["gpu"], {})[s.timestamp_ms] = s.value

    def select(self, start: int, end: int) -> dict[str, list[tuple[int, float]]]:
        out = {}
        for gpu, pts in self.points.items():
            got = sorted((t, v) for t, v in pts.items() if start <= t <= end)
            if got:
                out[gpu] = got
        return out


def _answer(store: SampleStore, start: int, end: int) -> dict[str, list[tuple[int, float]]]:
    return {labels["gpu"]: pts for labels, pts in store.select("m", [], start, end)}


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_sealed_and_head_samples_read_like_one_series(
    tmp_path_factory: pytest.TempPathFactory, seed: int
) -> None:
    """Random batches (in order, backfills, late data into sealed hours, rewrites of the same instant),
    random seal/flush calls; after each step random ranges answer exactly what was written last."""
    rng = random.Random(seed)
    path: Path = tmp_path_factory.mktemp("chunks") / "s.db"
    store = SampleStore.from_path(path)
    model = Model()
    try:
        now = BASE
        for _ in range(12):
            kind = rng.random()
            batch: list[Sample] = []
            if kind < 0.5:  # the collector: a few passes forward
                for _ in range(rng.randint(1, 40)):
                    now += rng.choice([1000, 5000, 60_000, 600_000])
                    batch += [
                        Sample("m", (("gpu", str(g)),), float(rng.randint(0, 100)), now) for g in range(3)
                    ]
            else:  # anything in the past: backfills, rewrites, late samples into sealed hours
                for _ in range(rng.randint(1, 50)):
                    t = rng.randint(BASE - HOUR, now)
                    batch.append(Sample("m", (("gpu", str(rng.randint(0, 3))),), rng.uniform(-1e6, 1e6), t))
            store.write(batch)
            model.write(batch)
            if rng.random() < 0.3:
                store.flush()
            if rng.random() < 0.2:
                store.seal(now)
            for _ in range(3):
                a, b = sorted(rng.randint(BASE - 2 * HOUR, now + HOUR) for _ in range(2))
                assert _answer(store, a, b) == model.select(a, b)
        store.seal(now + 2 * HOUR)
        assert store.stats().head_samples == 0
        assert _answer(store, 0, now) == model.select(0, now)
    finally:
        store.close()


def test_crossing_ten_minutes_seals_the_head_and_reads_are_unchanged(tmp_path: Path) -> None:
    store = SampleStore.from_path(tmp_path / "s.db")
    try:
        series = 20
        for k in range(3 * 720 + 1):  # three hours and one pass at 5 s
            t = BASE + 5000 * k
            store.write([Sample("m", (("gpu", str(g)),), float((k + g) % 101), t) for g in range(series)])
            if k == 3 * 720 - 1:  # 5 s before the hour: the last 10 minutes (120 passes) are in the head
                assert store.stats().head_samples == series * 120
        # the pass at the hour sealed the hour before it: one chunk per series per hour
        assert store.stats() == StoreStats(series, series * 3 * 720, 3 * series)
        got = _answer(store, BASE + 3_599_000, BASE + 3_606_000)  # across a block border
        assert got["0"] == [(BASE + 3_600_000, float(720 % 101)), (BASE + 3_605_000, float(721 % 101))]
        # a late sample into a sealed hour replaces the sealed one, and is sealed at once
        store.write([Sample("m", (("gpu", "0"),), -1.0, BASE + 5000)])
        assert _answer(store, BASE + 5000, BASE + 5000)["0"] == [(BASE + 5000, -1.0)]
        assert store.flush() == 0
        assert store.stats() == StoreStats(series, series * 3 * 720, 3 * series)
    finally:
        store.close()


def test_files_with_the_old_series_major_table_are_moved_into_the_head(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.executescript(
        "CREATE TABLE series (id INTEGER PRIMARY KEY, name TEXT NOT NULL, labels TEXT NOT NULL,"
        " UNIQUE (name, labels));"
        "CREATE TABLE samples (series_id INTEGER NOT NULL, t_ms INTEGER NOT NULL, value REAL NOT NULL,"
        " PRIMARY KEY (series_id, t_ms)) WITHOUT ROWID;"
        """INSERT INTO series VALUES (1, 'm', '{"gpu":"0"}');"""
    )
    conn.executemany(
        "INSERT INTO samples VALUES (1, ?, ?)", [(BASE + 60_000 * k, float(k)) for k in range(90)]
    )
    conn.commit()
    conn.close()
    store = SampleStore.from_path(path)
    try:
        assert store.stats() == StoreStats(90, 0, 0)
        assert store.seal(BASE + 2 * HOUR) == 90
        [(labels, pts)] = store.select("m", [], 0, BASE + 2 * HOUR)
        assert labels == {"__name__": "m", "gpu": "0"} and pts == [
            (BASE + 60_000 * k, float(k)) for k in range(90)
        ]
        names = {r[0] for r in store._conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert "samples" not in names
    finally:
        store.close()


def test_seal_sweeps_what_a_stopped_writer_left(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    writer = SampleStore.from_path(path)
    writer.write([Sample("m", (("gpu", "0"),), float(k), BASE + 20_000 * k) for k in range(30)])
    writer.close()  # never crossed a 10-minute boundary: nothing sealed
    other = SampleStore.from_path(path)
    try:
        assert other.stats() == StoreStats(30, 0, 0)
        assert other.seal(BASE + 599_999) == 0  # the span has not ended yet
        assert other.seal(BASE + 600_000) == 30
        assert other.stats() == StoreStats(0, 30, 1)
        [(_, pts)] = other.select("m", [], BASE, BASE + HOUR)
        assert pts == [(BASE + 20_000 * k, float(k)) for k in range(30)]
    finally:
        other.close()


def test_bytes_per_sample_on_disk(tmp_path: Path) -> None:
    """Four hours of 64 GPU-like series at 5 s, sealed: the file holds well under 16 bytes a sample."""
    path = tmp_path / "s.db"
    store = SampleStore.from_path(path)
    rng = random.Random(11)
    n = 0
    try:
        for k in range(4 * 720):
            t = BASE + 5000 * k
            batch = [
                Sample("util", (("gpu", str(g)),), float(min(100, max(0, 70 + rng.randint(-9, 9)))), t)
                for g in range(32)
            ] + [
                Sample("power", (("gpu", str(g)),), round(200 + rng.uniform(-30, 30), 2), t)
                for g in range(32)
            ]
            n += store.write(batch)
        store.seal(t + HOUR)
        store.flush()
        store._conn.execute("VACUUM")
    finally:
        store.close()
    size = path.stat().st_size
    assert size / n < 8, f"{size / n:.2f} bytes per sample"
    assert n == 4 * 720 * 64
