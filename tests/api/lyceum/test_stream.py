"""The streamed Lyceum body: valid JSON, all 12 arrays, finite values, grid timestamps."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpulens.api.lyceum.metrics import SEND_AT_LEAST, TimestampText, encode_points, lyceum_points, stream_body
from gpulens.backends import promjson
from gpulens.domain import catalog as c
from gpulens.domain.models import Execution, ExecutionStatus, GridSamples, Sample, Window
from gpulens.service.fetch import OrderedFetch
from gpulens.service.metrics import ExecutionMetrics

# every test here runs on the compiled grid path and on the Python one (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("grid_path")

EXE = Execution("e1", "acme", "gpu-node-1", (), ExecutionStatus.RUNNING, datetime(2026, 1, 1, tzinfo=UTC))


def answer(results: dict[int, list[Sequence[Sample]]], window: Window) -> ExecutionMetrics[bytes]:
    jobs = [(i, chunk) for i in range(12) for chunk in range(len(results.get(i, [[]])))]

    async def run(job: tuple[int, int]) -> tuple[int, bytes]:
        return job[0], lyceum_points(window, results.get(job[0], [[]])[job[1]])

    return ExecutionMetrics(EXE, window, c.LYCEUM_METRICS, OrderedFetch(jobs, run, 3))  # type: ignore[arg-type]


async def collect(a: ExecutionMetrics[bytes]) -> dict[str, object]:
    await a._fetch.prime()
    body = b"".join([part async for part in stream_body(a, "e1")])
    return orjson.loads(body)  # type: ignore[no-any-return]


async def test_all_arrays_present_and_non_finite_dropped() -> None:
    w = Window(1767225600000, 1767225630000, 15000)
    data = await collect(
        answer(
            {
                0: [[[1767225600, "97.5"], [1767225615, "NaN"]], [[1767225630, "+Inf"]]],
                3: [[[1767225600, "-Inf"], [1767225615, "1400"]]],
                11: [[], [[1767225630, "12.25"]]],
            },
            w,
        )
    )
    assert list(data) == ["executionId", "hostname", "timeRange", *c.LYCEUM_KEYS]
    assert data["timeRange"] == {"start": "2026-01-01T00:00:00Z", "end": "2026-01-01T00:00:30Z"}
    assert data["gpuUtilizationPercent"] == [{"timestamp": "2026-01-01T00:00:00Z", "value": 97.5}]
    assert data["gpuPowerWatt"] == [{"timestamp": "2026-01-01T00:00:15Z", "value": 1400}]
    assert data["systemCpuUsagePercent"] == [{"timestamp": "2026-01-01T00:00:30Z", "value": 12.25}]
    assert data["gpuClockSmMhz"] == []


async def test_points_outside_window_are_dropped() -> None:
    ts = TimestampText(500)
    text = encode_points([[99, "1"], [100, "2"], [100.5, "3"], [101, "4"]], ts, 100_000, 100_500)
    assert orjson.loads(b"[" + text + b"]") == [
        {"timestamp": "1970-01-01T00:01:40Z", "value": 2},
        {"timestamp": "1970-01-01T00:01:40.500Z", "value": 3},
    ]


async def test_fast_path_equals_slow_path() -> None:
    ts = TimestampText(15_000)
    contiguous = [[1767225600 + 15 * k, str(k * 0.5)] for k in range(200)]
    fast = encode_points(contiguous, ts, 0, 2**62)
    gappy = contiguous[:50] + contiguous[51:]  # one point missing: the general path
    slow = encode_points(gappy, ts, 0, 2**62)
    assert orjson.loads(b"[" + slow + b"]") == [
        x for i, x in enumerate(orjson.loads(b"[" + fast + b"]")) if i != 50
    ]
    with_nan = [*contiguous[:3], [contiguous[3][0], "NaN"], *contiguous[4:10]]
    assert len(orjson.loads(b"[" + encode_points(with_nan, ts, 0, 2**62) + b"]")) == 9
    grid = GridSamples(
        1767225600_000, 15_000, [str(k * 0.5).encode() for k in range(200)], [k * 0.5 for k in range(200)]
    )
    assert encode_points(grid, ts, 0, 2**62) == fast
    clipped = encode_points(grid, ts, 1767225600_000 + 15_000, 1767225600_000 + 45_000)  # general path
    assert orjson.loads(b"[" + clipped + b"]") == orjson.loads(b"[" + fast + b"]")[1:4]
    leap = TimestampText(1000)
    assert leap(951782400000) == "2000-02-29T00:00:00Z" and leap(1767225599999) == "2025-12-31T23:59:59.999Z"


@given(st.lists(st.sampled_from(["1.5", "0", "NaN", "+Inf", "-Inf", "42"]), min_size=2, max_size=60))
def test_a_run_with_non_finite_values_encodes_as_the_general_path(values: list[str]) -> None:
    """A gap-free run holding NaN or Inf (a NaN burst of the exporter) leaves those points out, byte
    for byte as the per-point path does."""
    ts = TimestampText(15_000)
    run = [[1767225600 + 15 * k, v] for k, v in enumerate(values)]
    general = ",".join(
        f'{{"timestamp":"{ts(round(t * 1000))}","value":{v}}}'
        for t, v in run
        if v not in ("NaN", "+Inf", "-Inf")
    ).encode()
    assert encode_points(run, ts, 0, 2**62) == general


@given(
    st.lists(
        st.tuples(st.integers(1, 4), st.sampled_from(["1.5", "0", "NaN", "+Inf", "7e-05", "42"])), max_size=60
    ),
    st.integers(0, 5),
    st.integers(0, 5),
)
def test_samples_with_gaps_encode_as_the_general_path(
    steps: list[tuple[int, str]], cut_lo: int, cut_hi: int
) -> None:
    """Samples on the grid with gaps (missed scrapes, a series that stops and starts), some outside the
    requested bounds: byte for byte the per-point path's answer."""
    ts = TimestampText(15_000)
    t, run = 1767225600, []
    for gap, v in steps:
        t += 15 * gap
        run.append([float(t), v])
    lo = (run[0][0] * 1000 + cut_lo * 15_000) if run else 0
    hi = (run[-1][0] * 1000 - cut_hi * 15_000) if run else 0
    general = ",".join(
        f'{{"timestamp":"{ts(ms)}","value":{v}}}'
        for t, v in run
        if lo <= (ms := round(t * 1000)) <= hi and v not in ("NaN", "+Inf", "-Inf")
    ).encode()
    assert encode_points(run, ts, int(lo), int(hi)) == general
    if run:  # as the Prometheus backend hands it on (GridPoints, or GridSamples): never the general path
        decoded = promjson.grid_samples(orjson.dumps(run), 15_000)
        assert decoded is not None
        assert encode_points(decoded, ts, int(lo), int(hi)) == general


async def test_small_chunks_go_out_together_and_a_big_one_on_its_own() -> None:
    """Chunks are sent at least SEND_AT_LEAST at a time (each send passes every middleware), except
    the last; a chunk that big goes on its own, not copied into a joined one."""
    w = Window(1767225600000, 1767225600000 + 14_999 * 15_000, 15_000)
    small = [[[1767225600 + 15 * k, "1.5"]] for k in range(40)]  # 40 one-point chunks a metric
    big = GridSamples(1767225600_000, 15_000, [b"2.25"] * 15_000, [2.25] * 15_000)
    a = answer({0: small, 5: [big], 11: small}, w)  # type: ignore[dict-item]
    await a._fetch.prime()
    sent = [part async for part in stream_body(a, "e1")]
    big_text = lyceum_points(w, big)
    assert len(big_text) >= SEND_AT_LEAST
    assert any(part == big_text for part in sent)  # on its own
    assert len(sent) <= 4  # the small ones and the head before it, the big one, the rest
    data = orjson.loads(b"".join(sent))
    assert len(data["gpuUtilizationPercent"]) == 40 and len(data["systemCpuUsagePercent"]) == 40
    assert len(data[c.LYCEUM_KEYS[5]]) == 15_000
