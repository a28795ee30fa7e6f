"""Durations and timestamps as the API accepts them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpulens.domain.timeparse import (
    MAX_TIMESTAMP_MS,
    MIN_TIMESTAMP_MS,
    checked_datetime,
    datetime_to_ms,
    format_duration_ms,
    format_rfc3339_ms,
    parse_duration_ms,
    parse_timestamp_ms,
    require_utc,
    to_utc,
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


# ---------------------------------------------------------------- ASCII only, one range


@pytest.mark.parametrize(
    "raw", ["١h", "1_000", "１５s", "１５", "1٥m", "5s\u3000", "\u00a05s", "1.5_0", "0x10"]
)
def test_durations_are_ascii_digits_only(raw: str) -> None:
    with pytest.raises(ValueError):
        parse_duration_ms(raw)


@pytest.mark.parametrize(
    "raw",
    [
        "１７６７２６０４００",
        "1_767_260_400",
        "١٧٦٧٢٦٠٤٠٠",
        "２０２６-01-01T00:00:00Z",
        "2026-01-01\u00e910:00:00",
        "0x10",
    ],
)
def test_timestamps_are_ascii_only(raw: str) -> None:
    with pytest.raises(ValueError):
        parse_timestamp_ms(raw)


def test_the_range_ends_where_prometheus_nanoseconds_still_fit() -> None:
    assert MIN_TIMESTAMP_MS == 0
    assert MAX_TIMESTAMP_MS * 1_000_000 < 2**63  # Prometheus' int64 nanoseconds
    assert format_rfc3339_ms(MAX_TIMESTAMP_MS) == "2261-12-31T23:59:59.999Z"
    assert parse_timestamp_ms("2261-12-31T23:59:59.999Z") == MAX_TIMESTAMP_MS
    assert parse_timestamp_ms("1970-01-01T00:00:00Z") == 0 == parse_timestamp_ms("0")


@pytest.mark.parametrize(
    "raw",
    [
        "1969-12-31T23:59:59.999Z",
        "1900-01-01T00:00:00Z",
        "0001-01-01T00:00:00Z",
        "0001-01-01T00:00:00+01:00",
        "2262-01-01T00:00:00Z",
        "9999-12-31T23:59:59Z",
        "9999-12-31T23:59:59-01:00",
        "-0.001",
        "9214646400",
    ],
)
def test_timestamps_outside_the_range(raw: str) -> None:
    with pytest.raises(ValueError, match="out of range"):
        parse_timestamp_ms(raw)


@pytest.mark.parametrize(
    "value",
    [
        datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=1))),  # astimezone(UTC) overflows
        datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone(timedelta(hours=-1))),  # likewise
        datetime(1, 1, 1),
        datetime(1900, 1, 1, tzinfo=UTC),
        datetime(2262, 1, 1, tzinfo=UTC),
    ],
)
def test_checked_datetime_refuses_what_lies_outside(value: datetime) -> None:
    with pytest.raises(ValueError, match="out of range"):
        checked_datetime(value)


def test_checked_datetime_gives_utc() -> None:
    plus_two = datetime(2026, 11, 28, 12, 0, tzinfo=timezone(timedelta(hours=2)))
    assert checked_datetime(plus_two) == datetime(2026, 11, 28, 10, 0, tzinfo=UTC)
    assert checked_datetime(plus_two).tzinfo is UTC
    assert checked_datetime(datetime(1970, 1, 1)) == datetime(1970, 1, 1, tzinfo=UTC)
    late = datetime(2261, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC)
    assert checked_datetime(late) == late


def test_the_one_zone_rule_naive_means_utc_at_the_edges_and_is_a_bug_inside() -> None:
    plus_two = datetime(2026, 11, 28, 12, 0, tzinfo=timezone(timedelta(hours=2)))
    naive = datetime(2026, 11, 28, 10, 0)
    utc = datetime(2026, 11, 28, 10, 0, tzinfo=UTC)
    # at an edge: a time without a zone is UTC (never this machine's local time), an offset converts
    assert to_utc(naive) == to_utc(plus_two) == utc
    assert to_utc(naive).tzinfo is UTC and to_utc(plus_two).tzinfo is UTC
    assert datetime_to_ms(naive) == datetime_to_ms(utc) == parse_timestamp_ms("2026-11-28T10:00:00")
    # inside: aware only
    assert require_utc(plus_two) == utc and require_utc(plus_two).tzinfo is UTC
    with pytest.raises(TypeError, match="naive"):
        require_utc(naive, "start_time")


@given(st.integers(min_value=MIN_TIMESTAMP_MS, max_value=MAX_TIMESTAMP_MS))
def test_every_accepted_timestamp_round_trips(ms: int) -> None:
    assert parse_timestamp_ms(format_rfc3339_ms(ms)) == ms
