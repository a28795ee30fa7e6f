"""The compiled grid path (`gpulens._gridjson`): what it reads, it reads exactly as the general JSON
parse does, and what it writes is byte for byte what the Python encoder writes; anything else, on
any input (damaged on purpose, byte by byte), is None, never a crash or a wrong sample."""

from __future__ import annotations

import math
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpulens import native
from gpulens.api.lyceum.metrics import TimestampText, encode_points
from gpulens.backends import promjson
from gpulens.domain.models import GridPoints, GridSamples
from tests.conftest import missing_server

STEP = 15_000
T0 = 1_767_225_600_000

# a valid value text: JSON numbers of every form Prometheus or VictoriaMetrics write, and the specials
NUMBERS = st.one_of(
    st.integers(-(10**12), 10**12).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr).filter(lambda t: "e" not in t),
    st.decimals(allow_nan=False, allow_infinity=False, places=4).map(str).filter(lambda t: "E" not in t),
    st.sampled_from(["0", "-0", "0.0", "1e5", "1.5E-07", "-2e+10", "12345678901234567890", "0.000001"]),
)
VALUES = st.one_of(NUMBERS, NUMBERS, NUMBERS, st.sampled_from(["NaN", "+Inf", "-Inf"]))


def compiled() -> Any:
    if native.gridjson is None:
        missing_server("the compiled grid path (gpulens._gridjson: a C compiler and Python's headers)")
    return native.gridjson


def time_text(ms: int, spelling: int) -> str:
    seconds, milli = divmod(ms, 1000)
    if not milli:
        return str(seconds) if spelling == 0 else f"{seconds}.{'0' * spelling}"
    decimals = f"{milli:03d}"
    return f"{seconds}.{decimals if spelling else decimals.rstrip('0')}"


@st.composite
def arrays(draw: st.DrawFn) -> tuple[bytes, int]:
    """A values array on a grid (ms or s step), with gaps, specials, and times in any spelling."""
    step = draw(st.sampled_from([STEP, 1_000, 250, 60_000]))
    n = draw(st.integers(1, 60))
    indices = sorted(draw(st.sets(st.integers(0, 3 * n), min_size=n, max_size=n)))
    first = T0 + draw(st.integers(0, 100)) * 5
    spelling = draw(st.integers(0, 3))
    pairs = [f'[{time_text(first + k * step, spelling)},"{draw(VALUES)}"]' for k in indices]
    return ("[" + ",".join(pairs) + "]").encode(), step


def general(array: bytes) -> list[tuple[float, str]]:
    return [(float(t), v) for t, v in orjson.loads(array)]


def same_numbers(a: list[float], b: list[float]) -> bool:
    # as their readers take them (float64: orjson gives an int for an integer text, as before)
    return all((math.isnan(x) and math.isnan(y)) or float(x) == y for x, y in zip(a, b, strict=True))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arrays(), st.integers(-5, 200), st.integers(-5, 200))
def test_what_it_reads_is_the_general_parse_and_it_writes_the_python_encoders_bytes(
    drawn: tuple[bytes, int], lo: int, span: int
) -> None:
    array, step = drawn
    scanned = compiled().scan(array, step)
    assert scanned is not None  # every spelling above is one it reads
    first, offsets, _, _, bad = scanned
    samples = promjson.grid_samples(array, step)  # the compiled path
    assert isinstance(samples, GridSamples | GridPoints)
    assert isinstance(samples, GridSamples) == (offsets is None and not bad)
    assert list(samples) == general(array)
    # the floats made from the packed texts are the general parse's
    assert same_numbers(samples.numbers, [float(v) for _, v in general(array)])
    assert (samples.bad if isinstance(samples, GridPoints) else []) == bad
    # written: byte for byte the Python encoder's, on the plain (time, text) samples, any bounds
    lo_ms = first + lo * step
    hi_ms = lo_ms + span * step
    ts = TimestampText(step)
    assert encode_points(samples, ts, lo_ms, hi_ms) == encode_points(general(array), ts, lo_ms, hi_ms)


@st.composite
def damaged(draw: st.DrawFn) -> tuple[bytes, int]:
    """A valid array with bytes replaced, inserted or removed."""
    array, step = draw(arrays())
    data = bytearray(array)
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(data)))
        kind = draw(st.sampled_from(["replace", "insert", "delete"]))
        byte = draw(st.sampled_from(b'[]",.0123456789eE+-NaInf \\{}:u\x00'))
        if kind == "insert":
            data.insert(at, byte)
        elif at < len(data):
            if kind == "replace":
                data[at] = byte
            else:
                del data[at]
    return bytes(data), step


@settings(max_examples=600, deadline=None)
@given(damaged())
def test_a_damaged_array_reads_as_the_general_parse_or_not_at_all(drawn: tuple[bytes, int]) -> None:
    array, step = drawn
    scanned = compiled().scan(array, step)
    if scanned is None:
        return
    first, offsets, blob, n, bad = scanned
    pairs = orjson.loads(array)  # what it read must be valid JSON of this shape
    assert len(pairs) == n and all(type(p) is list and len(p) == 2 and type(p[1]) is str for p in pairs)
    times = [round(float(t) * 1000) for t, _ in pairs]
    assert all(float(t) * 1000 == ms for (t, _), ms in zip(pairs, times, strict=True))
    grid = [(ms - first) // step for ms in times]
    assert times == [first + k * step for k in grid]
    assert grid == (list(range(n)) if offsets is None else offsets)
    assert blob.split(b",") == [v.encode() for _, v in pairs]
    for k, (_, v) in enumerate(pairs):
        number = orjson.loads(v) if k not in bad else None
        assert (k in bad) == (v in ("NaN", "+Inf", "-Inf"))
        assert number is None or math.isfinite(number)


@pytest.mark.parametrize(
    "array",
    [
        b"[]",
        b"",
        b"[",
        b'[[1,"01"]]',  # a leading zero
        b'[[1,"1."]]',
        b'[[1,"."]]',
        b'[[1,".5"]]',
        b'[[1,"+1"]]',
        b'[[1,"1e"]]',
        b'[[1,"1e999"]]',  # beyond a double: the Python path says what it is
        b'[[1,"' + b"1" * 41 + b'"]]',
        b'[[1,"-"]]',
        b'[[1,"nan"]]',
        b'[[1,"Infinity"]]',
        b'[[1,""]]',
        b'[[1,"1 "]]',
        b'[[01,"1"]]',
        b"[[1,1]]",  # a number value: not the API's string
        b'[[1.2345,"1"]]',  # not whole milliseconds
        b'[[1.,"1"]]',
        b'[[-1,"1"]]',
        b'[[1e3,"1"]]',
        b'[[1,"1"]',
        b'[[1,"1"]] ',
        b'[ [1,"1"]]',
        b'[[1,"1"],]',
        b'[[1,"1"],[1,"2"]]',  # not ascending
        b'[[2,"1"],[1,"2"]]',
        b'[[1,"1"],[17,"2"]]',  # off the 15 s grid
        b'[[1,"1\\"]]',
        b'[[1,"1"]][[2,"2"]]',
        b'[[1,"1","2"]]',
        b'[[1234567890123,"1"]]',  # thirteen digits of seconds
    ],
)
def test_what_is_not_the_shape_it_reads_is_none(array: bytes) -> None:
    assert compiled().scan(array, STEP) is None


def test_a_step_that_is_no_grid_reads_nothing() -> None:
    assert compiled().scan(b'[[1,"1"]]', 0) is None
    assert compiled().scan(b'[[1,"1"]]', -15_000) is None


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "1970-01-01T00:00:00Z"),
        (951_782_400_000, "2000-02-29T00:00:00Z"),
        (4_107_542_399_250, "2100-02-28T23:59:59.250Z"),
        (T0 + 1, "2026-01-01T00:00:00.001Z"),
        (253_402_300_799_000, "9999-12-31T23:59:59Z"),
    ],
)
def test_timestamps_are_written_as_the_python_encoder_writes_them(ms: int, text: str) -> None:
    out = compiled().items(ms, 1, b"1.5", 1, None, ms, ms)
    assert out == b'{"timestamp":"' + text.encode() + b'","value":1.5}'
    assert TimestampText(1)(ms) == text


def test_times_beyond_the_years_it_writes_are_left_to_python() -> None:
    assert compiled().items(253_402_300_800_000, 1_000, b"1", 1, None, 0, 2**62) is None
    assert compiled().items(-1_000, 1_000, b"1", 1, None, -(2**62), 2**62) is None
    # outside the bounds nothing is written, so nothing is out of range
    assert compiled().items(-1_000, 1_000, b"1", 1, None, 0, 10) == b""


@pytest.mark.parametrize(
    "args",
    [
        (T0, 0, b"1", 1, None, T0, T0),  # no step
        (T0, STEP, b"1,2", 1, None, T0, T0),  # more texts than n
        (T0, STEP, b"1", 2, None, T0, T0),  # fewer
        (T0, STEP, b"1,,2", 3, None, T0, T0),  # an empty text
        (T0, STEP, b"1,2", 2, [0], T0, T0),  # offsets of another length
        (T0, STEP, b"1,2", 2, (0, 1), T0, T0),  # offsets not a list
        (T0, STEP, b"1,2", 2, [0, 2**62], T0, T0),  # a time that overflows
        (T0, STEP, b"1,2", 2, [0, "x"], T0, T0),
    ],
)
def test_arguments_that_do_not_fit_are_errors_not_crashes(args: tuple[Any, ...]) -> None:
    with pytest.raises((ValueError, TypeError, OverflowError)):
        compiled().items(*args)


def test_packed_samples_make_their_texts_and_numbers_only_when_read() -> None:
    array = b'[[1767225600,"1.5"],[1767225615,"NaN"],[1767225645,"-2"]]'
    samples = promjson.grid_samples(array, STEP)
    assert isinstance(samples, GridPoints) and samples.blob == b"1.5,NaN,-2"
    assert samples.packed_offsets == [0, 1, 3] and samples.bad == [1]
    assert samples._texts is None and samples._numbers is None  # nothing made yet
    assert samples.texts == [b"1.5", b"NaN", b"-2"]
    assert same_numbers(samples.numbers, [1.5, math.nan, -2])
    assert len(samples) == 3 and samples[2] == (1767225645.0, "-2")


def test_under_ci_the_compiled_path_is_built() -> None:
    compiled()  # `make test` builds it: missing fails under CI, skips elsewhere
