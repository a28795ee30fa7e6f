"""A range answer's JSON read without a Python object per sample, wherever it can be.

A 24 h Lyceum read is twelve answers of ~5,800 samples each. Decoded as JSON, every sample costs a
list, a number and a string (three allocations, and the collector's attention); checked, merged and
re-encoded, as many again. Here each series' `"values":[...]` array is cut out of the body as bytes,
the rest (the envelope, labels, warnings) is parsed by orjson with `[]` in their place, and an array
whose samples lie on one gap-free grid becomes a `GridSamples`: its times are checked against the
canonical text of that grid (byte for byte, so nothing about them is trusted), its values split out
as bytes and checked to be JSON numbers in one C call. An array on a grid with gaps (missed scrapes a
backend does not bridge, series that stop and start) or holding NaN/Inf (a scrape's NaN burst)
becomes a `GridPoints`: its times parsed in one C call and checked by numpy to be whole milliseconds
on the grid, its special values found by comparing texts in C. Anything else (times off any grid,
another shape) falls back to the general path for that array or that body, with exactly the answer
the general path gives.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
from cachetools import LRUCache

from gpulens import native
from gpulens.domain.models import GridPoints, GridSamples, TimedSamples, Window, special_number

VALUES_KEY = b'"values":['
_KEY_STARTS = (ord("{"), ord(","))  # the byte before a key, in JSON as Prometheus writes it
_MARKED = b"\\u0000"  # a NUL in a JSON string: only the markers of cut arrays hold one
_NUMBER_CHARS = b"0123456789.eE+-,"  # finite decimal texts joined by commas


def cut_values(body: bytes) -> tuple[Any, list[bytes]] | None:
    r"""(the body parsed with every series' `"values"` array replaced by `[]`, those arrays in the
    series' order), or None when the body does not have that shape (the caller then parses it whole).

    `"values":[` is a key only right after `{` or `,`; elsewhere the text is the end of a longer key
    (`"x\"values"`), or no JSON at all, and stays for orjson to parse. Each array cut is replaced by a
    marker naming it (`"\u0000<i>"`, which no body holds: one that does is parsed whole), and the cut
    is kept only when the markers are exactly the `values` of the result's series, in order. So a key
    spelled with escapes (`"\u0076alues"`, which orjson reads as `values`), a duplicate key, or a
    `"values"` array outside the series all leave the answer to the general path."""
    if _MARKED in body:
        return None
    pieces: list[bytes] = []
    arrays: list[bytes] = []
    at = search = 0
    while (found := body.find(VALUES_KEY, search)) >= 0:
        search = found + 1
        if found == 0 or body[found - 1] not in _KEY_STARTS:
            continue  # inside a longer key: not one to cut
        start = found + len(VALUES_KEY) - 1  # the array's `[`
        if body.startswith(b"[]", start):
            end = start + 2
        else:
            close = body.find(b"}", start)  # a memchr: the first brace after it ends its series
            if close < 0 or body[close - 2 : close] != b"]]":
                return None
            end = close
        array = body[start:end]
        if b"{" in array or b"}" in array or b":" in array or b"\\" in array:
            return None  # not one plain array of pairs (each test a memchr: no copy of the array)
        pieces += (body[at:start], b'"\\u0000%d"' % len(arrays))
        arrays.append(array)
        at = search = end
    if not arrays:
        return None
    pieces.append(body[at:])
    try:
        envelope = orjson.loads(b"".join(pieces))
    except orjson.JSONDecodeError:
        return None
    data = envelope.get("data") if type(envelope) is dict else None
    result = data.get("result") if type(data) is dict else None
    if type(result) is not list:
        return None
    count = 0
    for item in result:
        if type(item) is dict and "values" in item:
            if item["values"] != f"\0{count}":
                return None  # not the array cut for this series
            item["values"] = []
            count += 1
    return (envelope, arrays) if count == len(arrays) else None


def grid_samples(array: bytes, step_ms: int, query: Window | None = None) -> GridSamples | GridPoints | None:
    """The array's samples when they lie on one grid of `step_ms`: a `GridSamples` when they are
    finite and gap-free, written as Prometheus writes times (`1767139200`, `1767139200.250`), else a
    `GridPoints` (gaps, NaN/+Inf/-Inf, times at whole milliseconds in any spelling orjson reads as
    the same number); None when they are not on one grid or not that shape. `query`: the range
    query's grid, whose text checks the times of every series of its answer. Read by the compiled
    grid path where it is built and the array is as Prometheus writes it (packed samples: no object
    per sample), else in Python."""
    compiled = native.gridjson
    if compiled is not None and step_ms > 0:
        scanned = compiled.scan(array, step_ms)
        if scanned is not None:
            first_ms, offsets, blob, n, bad = scanned
            if offsets is None and not bad:
                return GridSamples.packed(first_ms, step_ms, blob, n)
            return GridPoints.packed(first_ms, step_ms, offsets, blob, n, bad)
    parts = array[1:-1].split(b'"')  # `[t,` "v" `],[t,` "v" ... `]`
    n = len(parts) // 2
    if n == 0 or len(parts) != 2 * n + 1:
        return None
    texts = parts[1::2]
    first_ms = _time_ms(parts[0][1:-1])
    last_ms = first_ms if n == 1 else _time_ms(parts[-3][3:-1])
    separators = b"".join(parts[0::2])
    if (
        first_ms is not None
        and last_ms is not None
        and last_ms - first_ms == (n - 1) * step_ms
        and _on_grid(separators, first_ms, step_ms, n, query)
    ):
        numbers = _numbers(b",".join(texts), n)
        if numbers is not None:
            return GridSamples(first_ms, step_ms, texts, numbers)
        offsets = list(range(n))
    else:
        on_grid = _grid_offsets(separators, n, step_ms)
        if on_grid is None:
            return None
        first_ms, offsets = on_grid
    values = _values(texts, n)
    if values is None:
        return None
    numbers, bad = values
    return GridPoints(first_ms, step_ms, offsets, texts, numbers, bad)


def _grid_offsets(separators: bytes, n: int, step_ms: int) -> tuple[int, list[int]] | None:
    """(the first time in ms, the grid index of each of the n times from it) of the times in
    `[t0,],[t1,],...,],[tn,]`, when each is a whole millisecond on one grid of `step_ms`, ascending;
    else None."""
    ms = _whole_seconds(separators, n)
    if ms is None:
        seconds = _seconds(separators, n)
        if seconds is None:
            return None
        at = np.array(seconds, dtype=np.float64)
        ms = np.rint(at * 1000.0).astype(np.int64)
        if not (ms / 1000 == at).all():  # not whole milliseconds: the general path says what they are
            return None
    offsets = ms - ms[0]
    if (offsets % step_ms).any() or (np.diff(offsets) <= 0).any():
        return None
    listed: list[int] = (offsets // step_ms).tolist()
    return int(ms[0]), listed


_RECORD_END = np.frombuffer(b",],[", dtype=np.uint8)


def _whole_seconds(separators: bytes, n: int) -> npt.NDArray[np.int64] | None:
    """The n times of `[t0,],[t1,],...,],[tn,]` in ms when each is whole seconds written with the
    same number of digits (as Prometheus writes every time from 2001 to 2286 at a whole-second step):
    read as fixed-width records by numpy, no Python object per time; else None."""
    if not (separators.startswith(b"[") and separators.endswith(b",]")):
        return None
    records = separators[1:-2] + b",],["
    width, odd = divmod(len(records), n)
    if odd or not 5 <= width <= 16:  # 1 to 12 digits and `,],[`
        return None
    table = np.frombuffer(records, dtype=np.uint8).reshape(n, width)
    digits = table[:, : width - 4] - ord("0")  # a byte that is not a digit wraps above 9
    if (table[:, width - 4 :] != _RECORD_END).any() or (digits > 9).any():
        return None
    if width > 5 and not digits[:, 0].all():
        return None  # a leading zero: not a JSON number
    powers = 10 ** np.arange(width - 5, -1, -1, dtype=np.int64)
    ms: npt.NDArray[np.int64] = (digits.astype(np.int64) @ powers) * 1000
    return ms


def _seconds(separators: bytes, n: int) -> list[float] | None:
    """The n times of `[t0,],[t1,],...,],[tn,]` (JSON numbers); else None."""
    if not (separators.startswith(b"[") and separators.endswith(b",]")):
        return None
    times = separators[1:-2].replace(b",],[", b",")
    if times.translate(None, b"0123456789.,"):  # anything but the times left: not that shape
        return None
    return _numbers(times, n)


_SPECIALS = (b"NaN", b"+Inf", b"-Inf")  # the API's other spellings of a value


def _values(texts: list[bytes], n: int) -> tuple[list[float], list[int]] | None:
    """(the numbers of the n value texts, the indices of those NaN or +/-Inf) when each is a finite
    JSON number or one of those three spellings, whole; else None."""
    joined = joined_before = b"," + b",".join(texts) + b","
    replaced = False
    if joined.translate(None, _NUMBER_CHARS):
        for special in _SPECIALS:  # whole values only ("1NaN" stays); twice for adjacent ones
            if special in joined:
                whole = b"," + special + b","
                joined = joined.replace(whole, b",0,").replace(whole, b",0,")
                replaced = True
    numbers = _numbers(joined[1:-1], n)
    if numbers is None:
        return None
    bad: list[int] = []
    if replaced:  # where the specials are: each value's first and last byte, by numpy
        table = np.frombuffer(joined_before, dtype=np.uint8)
        commas = np.flatnonzero(table == ord(","))  # n + 1 of them: no value holds one (parsed above)
        first, last = table[commas[:-1] + 1], table[commas[1:] - 1]
        found = np.flatnonzero((first == ord("N")) | (last == ord("f")))
        bad = found.tolist()
        for k, lead in zip(bad, first[found].tolist(), strict=True):
            numbers[k] = special_number(lead)
    return numbers, bad


def timed_samples(array: bytes) -> TimedSamples | None:
    """The array's samples when they are all finite (a raw selector's, at any times); else None."""
    parts = array[1:-1].split(b'"')  # `[t,` "v" `],[t,` "v" ... `]`
    n = len(parts) // 2
    if n == 0 or len(parts) != 2 * n + 1:
        return None
    seconds = _seconds(b"".join(parts[0::2]), n)  # `[t0,],[t1,],...,],[tn,]`
    texts = parts[1::2]
    numbers = _numbers(b",".join(texts), n)
    if seconds is None or numbers is None:
        return None
    return TimedSamples(seconds, texts, numbers)


def _numbers(joined: bytes, n: int) -> list[float] | None:
    """The n comma-joined JSON numbers (finite decimals only), parsed; else None."""
    if joined.translate(None, _NUMBER_CHARS):  # NaN, Inf or anything else: the general path
        return None
    try:
        numbers: list[float] = orjson.loads(b"[" + joined + b"]")  # JSON's number grammar, in C
    except orjson.JSONDecodeError:
        return None
    return numbers if len(numbers) == n else None  # fewer or more: a text holding a comma


def _time_ms(text: bytes) -> int | None:
    whole, dot, frac = text.partition(b".")
    if not whole.isdigit() or (dot and not (frac.isdigit() and len(frac) <= 3)):
        return None
    return int(whole) * 1000 + (int(frac.ljust(3, b"0")) if dot else 0)


def prometheus_time(ms: int) -> str:
    """A time as Prometheus' API writes it: whole seconds, or seconds and three decimals."""
    seconds, milli = divmod(ms, 1000)
    return f"{seconds}.{milli:03d}" if milli else str(seconds)


def _on_grid(separators: bytes, first_ms: int, step_ms: int, n: int, query: Window | None) -> bool:
    """Whether `separators` are exactly what Prometheus writes between the values of an array on
    that grid (`grid_separators`). On whole seconds inside the query's grid, they are compared with
    a slice of the query grid's text (made once a query and kept: a damaged month has a series piece,
    so a grid of its own, per restart and chunk, and making each one's text cost a quarter of the
    read); else with the grid's own text."""
    if query is not None and query.step_ms == step_ms and first_ms % 1000 == 0 and step_ms % 1000 == 0:
        k0, off = divmod(first_ms - query.start_ms, step_ms)
        last_s = (query.start_ms + (query.points - 1) * step_ms) // 1000
        width = len(str(query.start_ms // 1000)) + 4  # `[t,` and `]` / `,],[`: the same for every t
        if not off and k0 >= 0 and k0 + n <= query.points and len(str(last_s)) + 4 == width:
            whole = grid_separators(query.start_ms, step_ms, query.points)
            return separators == whole[k0 * width : (k0 + n) * width - 1]
    return separators == grid_separators(first_ms, step_ms, n)


# The grids of recent reads by their text's size: a 24 h read's twelve series share one; a damaged
# month's chunks are 78 grids (a piece per exporter restart) that each of its twelve metrics asks in
# turn, which a cache of the last 32 grids missed every time (a tenth of the read's CPU)
_GRIDS_BYTES = 16 << 20
_grids: LRUCache[tuple[int, int, int], bytes] = LRUCache(maxsize=_GRIDS_BYTES, getsizeof=len)
_grids_lock = threading.Lock()  # a caller's own httpx client decodes in worker threads


def grid_separators(first_ms: int, step_ms: int, n: int) -> bytes:
    """What lies between the values of an array on that grid: `[t0,` `],[t1,` ... `]`, joined."""
    key = (first_ms, step_ms, n)
    with _grids_lock:
        found = _grids.get(key)
    if found is None:
        found = _separators(first_ms, step_ms, n)
        if len(found) <= _GRIDS_BYTES // 8:
            with _grids_lock:
                _grids[key] = found
    return found


def _separators(first_ms: int, step_ms: int, n: int) -> bytes:
    if first_ms % 1000 == 0 and step_ms % 1000 == 0:
        first_s, step_s = first_ms // 1000, step_ms // 1000
        last_s = first_s + (n - 1) * step_s
        digits = len(str(first_s))
        if n > 1 and first_s > 0 and len(str(last_s)) == digits:  # fixed width: written by numpy at once
            return _fixed_width_grid(first_s, step_s, n, digits)
        times = ",],[".join(map(str, range(first_s, first_s + n * step_s, step_s)))
    else:
        as_text: Callable[[int], str] = prometheus_time
        times = ",],[".join(map(as_text, range(first_ms, first_ms + n * step_ms, step_ms)))
    return ("[" + times + ",]").encode("ascii")


def _fixed_width_grid(first_s: int, step_s: int, n: int, digits: int) -> bytes:
    """`grid_separators` of whole seconds that all have `digits` digits: a table of n records
    `<digits>,],[` filled by numpy, the last one cut to `,]`, a `[` before."""
    seconds = first_s + np.arange(n, dtype=np.int64) * step_s
    table = np.empty((n, digits + 4), dtype=np.uint8)
    for j in range(digits):
        table[:, j] = seconds // 10 ** (digits - 1 - j) % 10 + ord("0")
    table[:, digits:] = _RECORD_END
    return b"[" + table.tobytes()[:-2]
