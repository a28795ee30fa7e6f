"""Durations and timestamps as the API accepts them."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpulens.domain.timeparse import (
    datetime_to_ms,
    format_duration_ms,
    format_rfc3339_ms,
    parse_duration_ms,
    parse_timestamp_ms,
)


@pytest.mark.parametrize(
    ("raw", "ms"),
    [
        ("15s", 15_000),
        ("5s", 5000),
        ("1m", 60_000),
        ("1h30m", 5_400_000),
        ("500ms", 500),
        ("2d", 172_800_000),
        ("1w", 604_800_000),
        ("15", 15_000),
        ("0.5", 500),
        (" 30s ", 30_000),
        ("1m30s500ms", 90_500),
    ],
)
def test_durations(raw: str, ms: int) -> None:
    assert parse_duration_ms(raw) == ms


@pytest.mark.parametrize(
    "raw",
    ["", "0", "0s", "-5s", "-1", "abc", "5 s", "1.5s", "nan", "inf", "1e400", "0.0001", "s", "11y", "15S"],
)
def test_bad_durations(raw: str) -> None:
    with pytest.raises(ValueError):
        parse_duration_ms(raw)


@given(st.integers(min_value=1, max_value=10 * 365 * 86_400_000))
def test_duration_format_round_trip(ms: int) -> None:
    assert parse_duration_ms(format_duration_ms(ms)) == ms


@pytest.mark.parametrize(
    ("raw", "iso"),
    [
        ("2026-11-28T10:00:00Z", "2026-11-28T10:00:00Z"),
        ("2026-11-28T10:00:00+00:00", "2026-11-28T10:00:00Z"),
        ("2026-11-28T12:00:00+02:00", "2026-11-28T10:00:00Z"),
        ("2026-11-28T05:30:00-04:30", "2026-11-28T10:00:00Z"),
        ("2026-11-28T10:00:00.250Z", "2026-11-28T10:00:00.250Z"),
        ("2026-11-28T10:00:00.123456789Z", "2026-11-28T10:00:00.123Z"),
        ("2026-11-28T10:00:00", "2026-11-28T10:00:00Z"),
        ("2026-11-28 10:00:00z", "2026-11-28T10:00:00Z"),
        ("1795860000", "2026-11-28T10:00:00Z"),
        ("1795860000.5", "2026-11-28T10:00:00.500Z"),
    ],
)
def test_timestamps(raw: str, iso: str) -> None:
    assert format_rfc3339_ms(parse_timestamp_ms(raw)) == iso


@pytest.mark.parametrize(
    "raw",
    [
        "",
        "yesterday",
        "2026-13-01T00:00:00Z",
        "2026-11-28T25:00:00Z",
        "nan",
        "-5",
        "1e30",
        "2026-11-28T10:00:00+25:00",
        "{}",
        "2026-11-28T10:00:00Zjunk",
    ],
)
def test_bad_timestamps(raw: str) -> None:
    with pytest.raises(ValueError):
        parse_timestamp_ms(raw)


def test_datetime_ms_truncates_microseconds() -> None:
    assert datetime_to_ms(datetime(2026, 1, 1, 0, 0, 0, 999_999, tzinfo=UTC)) % 1000 == 999
