"""Range answers read without an object per sample: the same series, samples and errors as parsing the
whole body, on every shape a Prometheus-compatible backend may send."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpulens.backends import promjson
from gpulens.backends.prometheus import PrometheusBackend
from gpulens.domain.errors import BackendBadResponse
from gpulens.domain.models import GridPoints, GridSamples, RangeQuery, TimedSamples, Window

# every test here runs on the compiled grid path and on the Python one (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("grid_path")

STEP = 15_000
T0 = 1_767_225_600_000


def body(series: list[tuple[dict[str, str], list[list[Any]]]], *, vm: bool = False) -> bytes:
    """As Prometheus writes it (or VictoriaMetrics, with its extra keys): values are [ms, text] pairs
    here, times written as Prometheus does (`1767225600`, `1767225600.500`)."""
    items = []
    for labels, values in series:
        pairs = ",".join(f"[{promjson.prometheus_time(t)},{orjson.dumps(v).decode()}]" for t, v in values)
        items.append(f'{{"metric":{orjson.dumps(labels).decode()},"values":[{pairs}]}}')
    result = '{"resultType":"matrix","result":[' + ",".join(items) + "]}"
    if vm:
        text = '{"status":"success","isPartial":false,"data":' + result
        text += ',"stats":{"seriesFetched":"8","executionTimeMsec":3}}'
    else:
        text = '{"status":"success","data":' + result + "}"
    return text.encode()


def grid(n: int, first_ms: int = T0, step_ms: int = STEP, value: str = "1.5") -> list[list[Any]]:
    return [[first_ms + k * step_ms, value] for k in range(n)]


def as_lists(samples: Any) -> list[tuple[float, str]]:
    return [(float(t), str(v)) for t, v in samples]


async def read(raw: bytes, window: Window, status: int = 200) -> list[Any]:
    transport = httpx.MockTransport(lambda request: httpx.Response(status, content=raw))
    backend = PrometheusBackend("http://prom:9090", httpx.Client(transport=transport))
    return await backend.query_range(RangeQuery("up", window))


def whole(raw: bytes) -> list[tuple[dict[str, str], list[tuple[float, str]]]]:
    """What parsing the whole body gives (the reference)."""
    result = orjson.loads(raw)["data"]["result"]
    return [(item["metric"], as_lists(item.get("values", []))) for item in result]


WINDOW = Window(T0, T0 + 99 * STEP, STEP)


async def test_a_gap_free_series_becomes_grid_samples_equal_to_the_whole_parse() -> None:
    raw = body([({}, grid(100, value="12.5"))])
    out = await read(raw, WINDOW)
    assert isinstance(out[0].samples, GridSamples)
    assert out[0].samples.first_ms == T0 and out[0].samples.last_ms == T0 + 99 * STEP
    assert as_lists(out[0].samples) == whole(raw)[0][1]
    assert out[0].samples.numbers == [12.5] * 100


@pytest.mark.parametrize("vm", [False, True])
async def test_several_series_labels_gaps_and_specials_each_take_their_path(vm: bool) -> None:
    gappy = grid(10)
    del gappy[4]
    with_nan = grid(10)
    with_nan[3][1] = "NaN"
    series = [
        ({"gpu": "0", "UUID": "GPU-a"}, grid(10, value="3")),
        ({"gpu": "1", "UUID": "GPU-b"}, gappy),
        ({"gpu": "2"}, with_nan),
        ({"gpu": "3"}, []),
        ({"gpu": "4", "odd": 'quote " and \\ and "values":[ inside'}, grid(3, value="1e-05")),
    ]
    raw = body(series, vm=vm)
    out = await read(raw, WINDOW)
    assert [(s.labels, as_lists(s.samples)) for s in out] == whole(raw)
    kinds = [type(s.samples).__name__ for s in out]
    assert kinds == ["GridSamples", "GridPoints", "GridPoints", "list", "GridSamples"]
    assert out[1].samples.offsets == [0, 1, 2, 3, 5, 6, 7, 8, 9] and out[1].samples.bad == []
    assert out[2].samples.offsets == list(range(10)) and out[2].samples.bad == [3]


async def test_millisecond_grids_and_one_point_series() -> None:
    step = 1_250
    raw = body([({}, grid(7, first_ms=T0 + 500, step_ms=step)), ({"a": "b"}, grid(1, first_ms=T0 + 1))])
    out = await read(raw, Window(T0, T0 + 20_000, step))
    assert isinstance(out[0].samples, GridSamples) and isinstance(out[1].samples, GridSamples)
    assert [(s.labels, as_lists(s.samples)) for s in out] == whole(raw)


async def test_another_time_spelling_falls_back_with_the_same_answer(grid_path: str) -> None:
    # VictoriaMetrics writes 1767225600.5, Prometheus 1767225600.500: not the Python path's canonical
    # text, so its general path; the compiled path reads any decimals of whole milliseconds
    text = b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":'
    text += b'[[1767225600.5,"1"],[1767225601.5,"2"]]}]}}'
    out = await read(text, Window(T0, T0 + 5_000, 1_000))
    assert isinstance(out[0].samples, GridSamples) == (grid_path == "compiled")
    assert as_lists(out[0].samples) == [(1767225600.5, "1"), (1767225601.5, "2")]


@pytest.mark.parametrize(
    "value",
    ["01", ".5", "1.", "+1", "1e999", "1,2", "null", "true", "[1]", "0x10", "1 ", ""],
)
async def test_a_value_that_is_not_a_json_number_is_refused_as_before(value: str) -> None:
    values = grid(5)
    values[2][1] = value
    with pytest.raises(BackendBadResponse):
        await read(body([({}, values)]), WINDOW)


async def test_times_that_are_not_the_grid_never_pass_as_one() -> None:
    # the same count and ends, one time moved: the separators differ from the canonical grid's
    values = grid(5)
    values[2][0] = values[2][0] + 1_000
    raw = body([({}, values)])
    out = await read(raw, WINDOW)
    assert not isinstance(out[0].samples, GridSamples)
    assert as_lists(out[0].samples) == whole(raw)[0][1]


async def test_error_envelopes_and_non_matrix_answers_are_the_backend_errors_they_were() -> None:
    error = orjson.dumps({"status": "error", "errorType": "bad_data", "error": "parse error"})
    with pytest.raises(BackendBadResponse, match="bad_data"):
        await read(error, WINDOW, status=400)
    vector = orjson.dumps({"status": "success", "data": {"resultType": "vector", "result": []}})
    with pytest.raises(BackendBadResponse, match="without a matrix"):
        await read(vector, WINDOW)
    with pytest.raises(BackendBadResponse):
        cut_short = b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":[[1,'
        await read(cut_short, WINDOW)


def test_cut_values_refuses_shapes_it_does_not_know() -> None:
    assert promjson.cut_values(b'{"status":"success","data":{}}') is None  # no values at all
    # a series whose values are followed by another key: the cut would swallow it, so no cut
    raw = b'{"data":{"result":[{"metric":{},"values":[[1,"1"]],"histograms":[[1,{"count":"1"}]]}]}}'
    assert promjson.cut_values(raw) is None


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.dictionaries(st.sampled_from(["gpu", "UUID", "x"]), st.text(max_size=8), max_size=3),
            st.integers(0, 40),  # points
            st.sets(st.integers(0, 39), max_size=3),  # points dropped (gaps)
            st.lists(
                st.one_of(
                    st.floats(allow_nan=False, allow_infinity=False).map(repr),
                    st.integers(-(10**12), 10**12).map(str),
                    st.sampled_from(["NaN", "+Inf", "-Inf", "0", "-0", "1e+21", "5e-324"]),
                ),
                min_size=1,
                max_size=5,
            ),
        ),
        max_size=4,
    ),
    st.booleans(),
)
async def test_any_answer_reads_as_the_whole_parse(series_spec: list[Any], vm: bool) -> None:
    series = []
    for labels, n, dropped, texts in series_spec:
        values = [
            [T0 + k * STEP, texts[k % len(texts)].replace("inf", "Inf").replace("nan", "NaN")]
            for k in range(n)
            if k not in dropped
        ]
        series.append((labels, values))
    raw = body(series, vm=vm)
    try:
        expected = whole(raw)
    except orjson.JSONDecodeError:  # pragma: no cover - orjson writes what it reads
        return
    out = await read(raw, WINDOW)
    assert [(s.labels, as_lists(s.samples)) for s in out] == expected
    for s in out:
        if isinstance(s.samples, GridSamples | GridPoints):
            numbers = [float(t) for t in s.samples.numbers]
            texts = [float(v) for _, v in as_lists(s.samples)]
            assert all(a == b or (a != a and b != b) for a, b in zip(numbers, texts, strict=True))  # NaN
        if isinstance(s.samples, GridPoints):
            specials = [k for k, (_, v) in enumerate(as_lists(s.samples)) if v in ("NaN", "+Inf", "-Inf")]
            assert s.samples.bad == specials
            ms = [round(t * 1000) for t, _ in as_lists(s.samples)]
            assert [s.samples.first_ms + o * STEP for o in s.samples.offsets] == ms


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.integers(1, 4), min_size=1, max_size=30),  # steps between samples, in grid steps
    st.sampled_from([1_000, 1_500, 15_000]),
    st.integers(0, 999),
    st.sampled_from(["prometheus", "victoriametrics", "three-decimals"]),
    st.lists(st.sampled_from(["1", "NaN", "2.5", "+Inf", "-Inf", "1e-05"]), min_size=1, max_size=4),
)
async def test_grids_with_gaps_read_as_grid_points_in_any_time_spelling(
    gaps: list[int], step: int, first_off: int, spelling: str, texts: list[str]
) -> None:
    """Times as Prometheus (`.500`), VictoriaMetrics (`.5`) or a float's repr write them: one answer."""
    first = T0 + first_off
    at = [first]
    for g in gaps:
        at.append(at[-1] + g * step)

    def time_text(ms: int) -> str:
        if spelling == "prometheus":
            return promjson.prometheus_time(ms)
        return repr(ms / 1000) if spelling == "victoriametrics" else f"{ms / 1000:.3f}"

    pairs = ",".join(f'[{time_text(t)},"{texts[k % len(texts)]}"]' for k, t in enumerate(at))
    raw = b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":['
    raw += pairs.encode() + b"]}]}}"
    out = await read(raw, Window(first, at[-1], step))
    assert as_lists(out[0].samples) == whole(raw)[0][1]
    assert isinstance(out[0].samples, GridSamples | GridPoints)


async def test_raw_answers_read_as_timed_samples_equal_to_the_whole_parse() -> None:
    """query_raw's pieces (6 h each): irregular times, a sample on a border kept once, NaN falls back."""
    start, end = T0, T0 + 13 * 3_600_000
    times = sorted(
        {start, *(start + k * 3_600_000 + 1_234 * k for k in range(1, 13)), start + 6 * 3_600_000, end}
    )
    texts = ["1.5", "2", "1e-05", "-3", "0.25"]
    raw = [[t, texts[k % len(texts)]] for k, t in enumerate(times)]
    nan_series = [[t, "NaN" if k == 2 else "1"] for k, t in enumerate(times)]

    def handle(request: httpx.Request) -> httpx.Response:
        form = dict(httpx.QueryParams(request.content.decode()))
        hi = round(float(form["time"]) * 1000)
        length = int(form["query"].rsplit("[", 1)[1].rstrip("ms]"))
        lo = hi - length
        inside = [[t, v] for t, v in raw if lo <= t <= hi]
        inside_nan = [[t, v] for t, v in nan_series if lo <= t <= hi]
        return httpx.Response(200, content=body([({"a": "1"}, inside), ({"a": "2"}, inside_nan)]))

    backend = PrometheusBackend("http://prom:9090", httpx.Client(transport=httpx.MockTransport(handle)))
    out = {s.labels["a"]: s.samples for s in await backend.query_raw("up", start, end)}
    assert as_lists(out["1"]) == [(t / 1000, v) for t, v in raw]
    assert as_lists(out["2"]) == [(t / 1000, v) for t, v in nan_series]
    assert isinstance(out["1"], TimedSamples) and not isinstance(out["2"], TimedSamples)
    assert out["1"].numbers == [float(v) for _, v in raw]


@pytest.mark.parametrize(
    "array",
    [
        b'[[1,"1"],[2,2,"1"]]',
        b'[[1,"1"],[,"1"]]',
        b'[[1,"1"],[2,"01"]]',
        b'[[1,"1"]],[[2,"1"]]',
        b'[[1,"1"],["2","1"]]',
    ],
)
def test_timed_samples_refuse_what_is_not_pairs_of_numbers(array: bytes) -> None:
    assert promjson.timed_samples(array) is None


# -- the cut accepts a `"values"` key only as Prometheus writes it ------------------------------------
PARSER = PrometheusBackend(
    "http://prom:9090", httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(500)))
)


def general(raw: bytes) -> Any:
    """What the general path (the whole body parsed by orjson) answers: the series, or the error."""
    try:
        series = PARSER._matrix(PARSER._decode(200, raw), "a range query")
    except BackendBadResponse as exc:
        return ("error", str(exc))
    return [(labels, as_lists(samples)) for labels, samples in series]


def cut(raw: bytes) -> Any:
    """What a range query's parse of `raw` answers (the cut wherever it applies), without the request."""
    try:
        series = PARSER._cut_matrix(200, raw, "a range query", WINDOW)
    except BackendBadResponse as exc:
        return ("error", str(exc))
    return [(labels, as_lists(samples)) for labels, samples in series]


async def fast(raw: bytes) -> Any:
    """What a range query answers on `raw` (the cut wherever it applies)."""
    try:
        series = await read(raw, WINDOW)
    except BackendBadResponse as exc:
        return ("error", str(exc))
    return [(s.labels, as_lists(s.samples)) for s in series]


def envelope(*items: str, extra: str = "") -> bytes:
    return (
        '{"status":"success","data":{"resultType":"matrix","result":[' + ",".join(items) + "]}" + extra + "}"
    ).encode()


PAIRS = f'[[{T0 // 1000},"5"],[{(T0 + STEP) // 1000},"6"]]'


@pytest.mark.parametrize(
    "raw",
    [
        # an escaped key after a real empty array: orjson keeps the later one, [] (a longer key's
        # `"values":[` is not cut, nor the array of `x"values`)
        envelope('{"metric":{},"\\u0076alues":[],"x\\"values":' + PAIRS + "}"),
        # the escaped key's [] counted for a series while the array cut is another object's
        envelope('{"metric":{},"\\u0076alues":[]}', extra=',"stats":{"values":' + PAIRS + "}"),
        # a duplicate key (the later array wins) and an escaped [] elsewhere: as many [] as arrays
        envelope(
            '{"metric":{"a":"1"},"values":[],"values":' + PAIRS + "}", '{"metric":{},"\\u0076alues":[]}'
        ),
        # the real key last: it wins, as the cut assumes (the cut may stand)
        envelope('{"metric":{"a":"1"},"\\u0076alues":' + PAIRS + ',"values":[]}'),
        envelope('{"metric":{"a":"1"},"values":' + PAIRS + "}", '{"metric":{},"valu\\u0065s":' + PAIRS + "}"),
        # a NUL in a label value (the cut's markers are NULs): parsed whole
        envelope('{"metric":{"a":"\\u00000"},"values":' + PAIRS + "}"),
    ],
    ids=[
        "escaped-after-empty",
        "array-outside-the-series",
        "duplicate-key",
        "escaped-first",
        "second-escaped",
        "nul",
    ],
)
async def test_keys_spelled_with_escapes_read_exactly_as_the_general_path(raw: bytes) -> None:
    assert promjson.cut_values(raw) is None or b'"values":[]}' in raw
    assert await fast(raw) == general(raw)


async def test_the_text_of_the_key_inside_a_longer_key_or_a_label_is_not_cut() -> None:
    raw = envelope(
        '{"metric":{"a":"\\",\\"values\\":[[1,\\"9\\"]]"},"x\\"values":[[1,"9"]],"values":' + PAIRS + "}",
        '{"metric":{"x\\"values":"y"},"values":' + PAIRS + "}",
    )
    cut = promjson.cut_values(raw)
    assert cut is not None and cut[1] == [PAIRS.encode()] * 2  # only the two real keys
    out = await read(raw, WINDOW)
    assert all(isinstance(s.samples, GridSamples) for s in out)  # the fast path kept
    assert [(s.labels, as_lists(s.samples)) for s in out] == general(raw)


def test_cut_values_refuses_a_key_at_the_bodys_start() -> None:
    assert promjson.cut_values(b'"values":[[1,"1"]]') is None


KEY_SPELLINGS = [
    '"values"',
    '"\\u0076alues"',
    '"valu\\u0065s"',
    '"\\u0076\\u0061\\u006c\\u0075\\u0065\\u0073"',
]
TRICKY_TEXT = ['"values":[', '","values":[[1,"2"]]', "\\", '"', "\0", "{", "},{"]


def array_text(n: int, value: str) -> str:
    return "[" + ",".join(f'[{promjson.prometheus_time(T0 + k * STEP)},"{value}"]' for k in range(n)) + "]"


DECOY_KEYS = ['"x\\"values"', '"values\\""', '"v"']  # keys that hold the text, and one that does not
fragment = st.tuples(
    st.sampled_from(KEY_SPELLINGS + DECOY_KEYS),
    st.sampled_from([0, 0, 1, 2]),
    st.sampled_from(["1.5", "NaN"]),
)
series_spec = st.tuples(
    st.dictionaries(
        st.sampled_from(["gpu", 'x"values', "values"]),
        st.lists(st.sampled_from([*TRICKY_TEXT, "0", "a"]), max_size=3).map("".join),
        max_size=2,
    ),
    st.lists(fragment, max_size=3),
    st.booleans(),  # the metric first or last
)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(series_spec, min_size=1, max_size=3),
    st.one_of(st.none(), st.tuples(st.sampled_from(KEY_SPELLINGS), st.sampled_from([0, 1, 2]))),
)
def test_any_spelling_of_the_keys_reads_as_the_general_path(specs: list[Any], stats: Any) -> None:
    """Bodies whose series carry the key `values` spelled plainly or with escapes, once, twice or not
    at all, other keys ending in `values`, label names and values holding the key's text: a range
    query answers exactly what parsing the whole body answers (the series, or the same error)."""
    items = []
    for labels, fragments, metric_first in specs:
        members = [f"{key}:{array_text(n, value)}" for key, n, value in fragments]
        metric = '"metric":' + orjson.dumps(labels).decode()
        items.append("{" + ",".join([metric, *members] if metric_first else [*members, metric]) + "}")
    extra = "" if stats is None else ',"stats":{' + f"{stats[0]}:{array_text(stats[1], '1')}" + "}"
    raw = envelope(*items, extra=extra)
    orjson.loads(raw)  # the body is JSON
    assert cut(raw) == general(raw)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(0, 40),  # where the series starts on the query's grid (past its end: off it)
    st.integers(1, 30),  # its samples
    st.sampled_from([0, -1, 1, 7, 15_000, 500]),  # one time moved by this many ms (0: none)
    st.integers(0, 29),
    st.sampled_from([15_000, 60_000]),
)
def test_the_query_grid_checks_a_series_as_its_own_grid_does(
    k0: int, n: int, moved: int, at: int, step: int
) -> None:
    """A series' times are checked against a slice of the query grid's text: the same decision as
    its own grid's text, wherever it starts or ends, and a moved time never passes."""
    query = Window(T0, T0 + 29 * step, step)
    values = grid(n, first_ms=T0 + k0 * step, step_ms=step, value="2.5")
    if moved and at < n:
        values[at][0] += moved
    array = body([({}, values)]).split(b'"values":', 1)[1].rsplit(b"}]}}", 1)[0]
    with_query = promjson.grid_samples(array, step, query)
    alone = promjson.grid_samples(array, step)
    assert type(with_query) is type(alone)
    if alone is not None:
        assert as_lists(with_query) == as_lists(alone) == [(t / 1000, v) for t, v in values]
    if moved and at < n and moved % step and n > 1:  # one point alone is a grid wherever it is
        assert not isinstance(with_query, GridSamples)
