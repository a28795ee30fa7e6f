"""Lyceum metrics query parameters: ASCII digits only, and the one range of timestamps (422)."""

from __future__ import annotations

import pytest

from tests.api.lyceum.conftest import MetricsApi


@pytest.mark.parametrize(
    ("param", "raw"),
    [
        ("step", "١h"),  # Arabic-Indic digit: `\d` and int() take it
        ("step", "1_000"),  # float() takes underscores
        ("step", "１５s"),  # fullwidth digits
        ("step", "１５"),
        ("start", "１７６７２６０４００"),  # fullwidth Unix seconds: float() takes them
        ("end", "1_767_261_000"),
        ("start", "２０２６-01-01T10:00:00Z"),
        ("start", "1900-01-01T00:00:00Z"),  # before 1970
        ("start", "0001-01-01T00:00:00Z"),
        ("start", "-1"),
        ("end", "9999-12-31T23:59:59Z"),  # past int64 nanoseconds in Prometheus
        ("end", "2262-01-01T00:00:00Z"),
        ("end", "1e13"),
    ],
)
def test_non_ascii_and_out_of_range_parameters_are_422(mapi: MetricsApi, param: str, raw: str) -> None:
    eid = mapi.register()
    r = mapi.metrics(eid, **{param: raw})
    assert r.status_code == 422, r.text
    (err,) = r.json()["detail"]
    assert err["loc"] == ["query", param] and err["input"] == raw
    assert mapi.prom.range_queries == []


def test_the_last_accepted_end_is_answered(mapi: MetricsApi) -> None:
    eid = mapi.register()
    r = mapi.metrics(eid, end="2261-12-31T23:59:59.999Z", step="1h")
    assert r.status_code == 200, r.text  # clamped to the execution's end
