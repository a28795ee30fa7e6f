"""`query_raw`: every raw sample of a selector over a window (what the archive copies)."""

from __future__ import annotations

import math
import re
import urllib.parse
from collections.abc import Sequence

import httpx
import numpy as np
import orjson
import pytest

from gpulens.backends.embedded import EmbeddedBackend
from gpulens.backends.prometheus import RAW_PIECE_MS, PrometheusBackend, raw_pieces
from gpulens.domain.errors import BackendBadResponse
from gpulens.storage.archive import ArchiveSource

HOUR = 3_600_000
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def test_pieces_cover_the_window_once() -> None:
    assert raw_pieces(0, 10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert raw_pieces(5, 5, 4) == [(5, 5)]
    assert raw_pieces(0, 8, 4) == [(0, 4), (4, 8)]
    pieces = raw_pieces(T0, T0 + 25 * HOUR)
    assert len(pieces) == 5 and all(hi - lo <= RAW_PIECE_MS for lo, hi in pieces)
    assert pieces[0][0] == T0 and pieces[-1][1] == T0 + 25 * HOUR


def fake_prometheus(
    samples: dict[tuple[tuple[str, str], ...], list[int]], seen: list[dict[str, str]]
) -> httpx.MockTransport:
    """Answers `sel[Nms]` at `time` with the samples in [time - N, time] (Prometheus 2.x: closed)."""

    def handle(request: httpx.Request) -> httpx.Response:
        form = {k: v[0] for k, v in urllib.parse.parse_qs(request.content.decode()).items()}
        seen.append(form)
        m = re.fullmatch(r"(.*)\[(\d+)ms\]", form["query"])
        assert m is not None, form
        end = round(float(form["time"]) * 1000)
        start = end - int(m.group(2))
        result = [
            {
                "metric": dict(labels),
                "values": [[t / 1000, str(t // 1000 % 97)] for t in times if start <= t <= end],
            }
            for labels, times in samples.items()
        ]
        result = [r for r in result if r["values"]]
        body = {"status": "success", "data": {"resultType": "matrix", "result": result}}
        return httpx.Response(200, content=orjson.dumps(body))

    return httpx.MockTransport(handle)


async def test_prometheus_raw_reads_in_pieces_and_keeps_each_sample_once() -> None:
    a = (("__name__", "m"), ("gpu", "0"))
    b = (("__name__", "m"), ("gpu", "1"))
    every_15s = list(range(T0 - HOUR, T0 + 14 * HOUR, 15_000))
    data = {a: every_15s, b: every_15s[::4]}
    seen: list[dict[str, str]] = []
    backend = PrometheusBackend("http://prom:9090", httpx.Client(transport=fake_prometheus(data, seen)))
    start, end = T0, T0 + 13 * HOUR  # 3 pieces; samples fall exactly on the piece borders
    got = await backend.query_raw('m{gpu=~"0|1"}', start, end)
    assert len(seen) == 3
    assert {f["query"].split("[")[0] for f in seen} == {'m{gpu=~"0|1"}'}
    by_time = sorted(seen, key=lambda f: float(f["time"]))  # the pieces are asked concurrently
    assert all(f["query"].endswith(f"[{RAW_PIECE_MS + 1}ms]") for f in by_time[:2])  # 1 ms more than kept
    by = {tuple(sorted(s.labels.items())): s.samples for s in got}
    want_a = [t for t in every_15s if start <= t <= end]
    assert [round(t * 1000) for t, _ in by[a]] == want_a
    assert [round(t * 1000) for t, _ in by[b]] == [t for t in every_15s[::4] if start <= t <= end]
    assert by[a][0][1] == str(want_a[0] // 1000 % 97)


async def test_prometheus_raw_refuses_an_answer_without_a_matrix() -> None:
    body = {"status": "success", "data": {"resultType": "vector", "result": []}}
    transport = httpx.MockTransport(lambda r: httpx.Response(200, content=orjson.dumps(body)))
    backend = PrometheusBackend("http://prom:9090", httpx.Client(transport=transport))
    with pytest.raises(BackendBadResponse, match="raw query"):
        await backend.query_raw("m", T0, T0 + 1000)


def source(series: Sequence[tuple[dict[str, str], list[int], list[float]]]) -> ArchiveSource:
    return ArchiveSource(
        (labels, np.array(t, dtype=np.int64), np.array(v, dtype=np.float64)) for labels, t, v in series
    )


async def test_embedded_raw_gives_prometheus_json_values() -> None:
    src = source(
        [
            ({"__name__": "m", "gpu": "0"}, [T0, T0 + 1500, T0 + 3000], [1.0, 0.1 + 0.2, math.inf]),
            ({"__name__": "m", "gpu": "1"}, [T0 + 9_000_000], [2.0]),
            ({"__name__": "other"}, [T0], [3.0]),
        ]
    )
    backend = EmbeddedBackend(src)
    got = await backend.query_raw('m{gpu="0"}', T0, T0 + 10_000)
    assert [(s.labels, [list(p) for p in s.samples]) for s in got] == [  # pairs as Prometheus JSON has them
        (
            {"__name__": "m", "gpu": "0"},
            [[T0 // 1000, "1"], [(T0 + 1500) / 1000, "0.30000000000000004"], [T0 // 1000 + 3, "+Inf"]],
        )
    ]
    names = await backend.query_raw('{__name__=~"m|other"}', T0, T0)
    assert sorted(s.labels["__name__"] for s in names) == ["m", "other"]
    with pytest.raises(BackendBadResponse):
        await backend.query_raw("rate(m[5m])", T0, T0)
