"""Parsing and formatting of the times and durations that cross the API (stdlib only)."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime

__all__ = [
    "MAX_TIMESTAMP_MS",
    "MIN_TIMESTAMP_MS",
    "TIMESTAMP_RANGE",
    "checked_datetime",
    "datetime_to_ms",
    "format_duration_ms",
    "format_optional",
    "format_rfc3339",
    "format_rfc3339_ms",
    "ms_to_datetime",
    "parse_duration_ms",
    "parse_timestamp_ms",
    "require_utc",
    "to_utc",
]


# ASCII only, everywhere: `\d`, int() and float() also take other scripts' digits ("١", "１"), and
# float() takes "1_000"; none of those is a time a client meant to send.
_DURATION_RE = re.compile(
    r"(?:([0-9]+)y)?(?:([0-9]+)w)?(?:([0-9]+)d)?(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?(?:([0-9]+)ms)?"
)
_NUMBER_RE = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_ASCII_SPACE = " \t\r\n"
_UNIT_MS = (365 * 86_400_000, 7 * 86_400_000, 86_400_000, 3_600_000, 60_000, 1000, 1)
_MAX_MS = 10 * 365 * 86_400_000  # ten years: beyond that a step or window makes no sense

# THE range of every timestamp gpulens accepts (query parameters, request bodies, the CLI):
# from the epoch up to the end of 2261. Prometheus keeps times as int64 nanoseconds, which end
# on 2262-04-11; the months before that leave room for the windows a query reaches back over.
MIN_TIMESTAMP_MS = 0  # 1970-01-01T00:00:00Z
MAX_TIMESTAMP_MS = 9_214_646_399_999  # 2261-12-31T23:59:59.999Z
TIMESTAMP_RANGE = "between 1970-01-01T00:00:00Z and 2261-12-31T23:59:59.999Z"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _ascii_text(raw: str, what: str) -> str:
    text = raw.strip(_ASCII_SPACE)
    if not text:
        raise ValueError(f"empty {what}")
    if not text.isascii():
        raise ValueError(f"invalid {what} {raw!r}: only ASCII characters are accepted")
    return text


def parse_duration_ms(raw: str) -> int:
    """A Prometheus duration (`15s`, `1h30m`, `500ms`) or a positive number of seconds, as ms.

    Raises ValueError with a message fit for a user.
    """
    text = _ascii_text(raw, "duration")
    match = _DURATION_RE.fullmatch(text)
    if match and any(match.groups()):
        total = sum(int(g) * unit for g, unit in zip(match.groups(), _UNIT_MS, strict=True) if g)
    else:
        if not _NUMBER_RE.fullmatch(text):
            raise ValueError(
                f"invalid duration {raw!r}: use a Prometheus duration such as 5s, 1m, 1h30m or seconds"
            )
        seconds = float(text)
        if not math.isfinite(seconds):
            raise ValueError(f"invalid duration {raw!r}: not a finite number")
        total = round(seconds * 1000)
    if total <= 0:
        raise ValueError("zero or negative query resolution step widths are not accepted")
    if total > _MAX_MS:
        raise ValueError(f"duration {raw!r} is longer than ten years")
    return total


def format_duration_ms(ms: int) -> str:
    """The shortest Prometheus duration for a whole number of milliseconds."""
    if ms <= 0:
        raise ValueError("duration must be positive")
    parts: list[str] = []
    for unit, name in ((86_400_000, "d"), (3_600_000, "h"), (60_000, "m"), (1000, "s"), (1, "ms")):
        count, ms = divmod(ms, unit)
        if count:
            parts.append(f"{count}{name}")
    return "".join(parts)


def human_duration(ms: int) -> str:
    """A duration as people read it in a sentence: `45 s`, `12 min`, `2 h 5 min`."""
    seconds = round(ms / 1000)
    if seconds < 120:
        return f"{seconds} s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, rest = divmod(minutes, 60)
    return f"{hours} h {rest} min" if rest else f"{hours} h"


def parse_timestamp_ms(raw: str) -> int:
    """RFC 3339 / ISO 8601 (any offset, fractional seconds; no zone means UTC) or Unix seconds, as ms,
    within MIN_TIMESTAMP_MS..MAX_TIMESTAMP_MS. Raises ValueError with a message fit for a user."""
    text = _ascii_text(raw, "timestamp")
    if _NUMBER_RE.fullmatch(text):
        seconds = float(text)
        if not math.isfinite(seconds):
            raise ValueError(f"invalid timestamp {raw!r}")
        if abs(seconds) >= 1e15:  # far out of range, and `seconds * 1000` may overflow to infinity
            raise ValueError(f"timestamp {raw!r} is out of range: it must lie {TIMESTAMP_RANGE}")
        return _in_range(math.floor(seconds * 1000), raw)
    iso = text[:-1] + "+00:00" if text[-1] in "zZ" else text
    try:
        parsed = datetime.fromisoformat(iso)
    except ValueError:
        raise ValueError(f"invalid timestamp {raw!r}: use RFC 3339, e.g. 2026-11-28T10:00:00Z") from None
    return _in_range(datetime_to_ms(parsed), raw)


# THE rule for zones (docs/compatibility.md, "Timestamps"): at the edges (request parameters and
# bodies, the CLI, what discovery reads) a time without a zone means UTC, which is what `runapy`
# sends for a naive datetime; `to_utc` applies it. Past the services every datetime is aware and
# in UTC: storage checks that with `require_utc`, and a naive one reaching it is a bug, raised.


def to_utc(value: datetime) -> datetime:
    """At an edge: `value` in UTC; a naive one is read as UTC (never as this machine's local time)."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def require_utc(value: datetime, what: str = "datetime") -> datetime:
    """Inside (storage): an aware `value`, in UTC. A naive one raises TypeError: it should have been
    converted at the edge with `to_utc`, and guessing its zone here would hide that bug."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise TypeError(f"{what}: naive datetime {value.isoformat()} reached storage; convert it with to_utc")
    return value.astimezone(UTC)


def checked_datetime(value: datetime) -> datetime:
    """`value` in UTC (`to_utc`: naive means UTC) if it lies in the accepted range; else ValueError.

    The range is checked before converting: moving 0001-01-01T00:00:00+01:00 (or
    9999-12-31T23:59:59-01:00) to UTC overflows datetime.
    """
    _in_range(datetime_to_ms(value), value.isoformat())
    return to_utc(value)


def _in_range(ms: int, raw: str) -> int:
    if not MIN_TIMESTAMP_MS <= ms <= MAX_TIMESTAMP_MS:
        raise ValueError(f"timestamp {raw!r} is out of range: it must lie {TIMESTAMP_RANGE}")
    return ms


def datetime_to_ms(value: datetime) -> int:
    """Milliseconds since the epoch, truncating microseconds (naive means UTC, as `to_utc`)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)  # not to_utc: astimezone overflows at datetime's ends
    delta = value - _EPOCH  # timedelta arithmetic: no overflow at either end of datetime's range
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


def ms_to_datetime(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).replace(microsecond=(ms % 1000) * 1000)


def format_rfc3339_ms(ms: int) -> str:
    """`YYYY-MM-DDTHH:MM:SSZ`, with `.fff` only when the milliseconds are not zero."""
    seconds, millis = divmod(ms, 1000)
    base = datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{base}.{millis:03d}Z" if millis else f"{base}Z"


def format_rfc3339(value: datetime) -> str:
    return format_rfc3339_ms(datetime_to_ms(value))


def format_optional(value: datetime | None) -> str | None:
    """RFC 3339 UTC text, or None for no time (the wire's `null`)."""
    return None if value is None else format_rfc3339(value)
