"""Parsing and formatting of the times and durations that cross the API (stdlib only)."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime

_DURATION_RE = re.compile(r"^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$")
_UNIT_MS = (365 * 86_400_000, 7 * 86_400_000, 86_400_000, 3_600_000, 60_000, 1000, 1)
_MAX_MS = 10 * 365 * 86_400_000  # ten years: beyond that a step or window makes no sense


def parse_duration_ms(raw: str) -> int:
    """A Prometheus duration (`15s`, `1h30m`, `500ms`) or a positive number of seconds, as ms.

    Raises ValueError with a message fit for a user.
    """
    text = raw.strip()
    if not text:
        raise ValueError("empty duration")
    match = _DURATION_RE.match(text)
    if match and any(match.groups()):
        total = sum(int(g) * unit for g, unit in zip(match.groups(), _UNIT_MS, strict=True) if g)
    else:
        try:
            seconds = float(text)
        except ValueError:
            raise ValueError(
                f"invalid duration {raw!r}: use a Prometheus duration such as 5s, 1m, 1h30m or seconds"
            ) from None
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


def parse_timestamp_ms(raw: str) -> int:
    """RFC 3339 / ISO 8601 (any offset, fractional seconds; no zone means UTC) or Unix seconds, as ms."""
    text = raw.strip()
    if not text:
        raise ValueError("empty timestamp")
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        if not math.isfinite(seconds):
            raise ValueError(f"invalid timestamp {raw!r}")
        return _checked(math.floor(seconds * 1000), raw)
    iso = text[:-1] + "+00:00" if text[-1] in "zZ" else text
    try:
        parsed = datetime.fromisoformat(iso)
    except ValueError:
        raise ValueError(f"invalid timestamp {raw!r}: use RFC 3339, e.g. 2026-11-28T10:00:00Z") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return _checked(datetime_to_ms(parsed), raw)


def _checked(ms: int, raw: str) -> int:
    # Year 1970..9999 keeps every later conversion (datetime, Prometheus float seconds) exact.
    if not 0 <= ms <= 253_402_300_799_000:
        raise ValueError(f"timestamp {raw!r} is out of range")
    return ms


def datetime_to_ms(value: datetime) -> int:
    """Milliseconds since the epoch, truncating microseconds (naive means UTC)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    delta = value - datetime(1970, 1, 1, tzinfo=UTC)
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
