"""What the usage digests store and read, on SQLite and PostgreSQL: a period of a rule is recorded once
however many replicas write it at the same moment (with its events, or nothing), and each execution's
usage over a window is the usage table's figures split by execution."""

from __future__ import annotations

import math
from collections import defaultdict
from datetime import UTC, datetime

from sqlalchemy import func, select

from gpulens.domain.alerts import DIGEST, AlertEvent, AlertRule, Channel, ChannelType, EventType, new_id
from gpulens.storage.alerts import AlertStore
from gpulens.storage.digests import DigestStore
from gpulens.storage.registry import Registry
from gpulens.storage.tables import AlertDeliveryRow, AlertDigestRow, AlertEventRow
from tests.storage.conftest import run_concurrently
from tests.storage.test_usage import FIELDS, MS_PER_DAY, MS_PER_HOUR, T0_MS, expected, written

NOW = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)


def count(registry: Registry, table: type) -> int:
    with registry.transaction() as session:
        return int(session.scalar(select(func.count()).select_from(table)) or 0)


def test_a_period_is_recorded_once_by_replicas_writing_it_together(registry: Registry) -> None:
    registry.ensure_org("acme")
    store = AlertStore(registry)
    store.add_channel(Channel("chn_copy", "acme", ChannelType.WEBHOOK, "https://x.example/d", None, NOW))
    rule = AlertRule(
        "rul_d", "acme", DIGEST, 0, ("chn_copy",), "info", created_at=NOW, every_ms=7 * MS_PER_DAY
    )
    store.add_rule(rule)
    start_ms, end_ms = 0, 7 * MS_PER_DAY

    def replica(i: int) -> bool:
        event_id = new_id("evt")
        event = AlertEvent(event_id, "acme", EventType.DIGEST, NOW, None, "rul_d", {"id": event_id, "n": i})
        return store.save_digest(rule, start_ms, end_ms, [(event, ["chn_copy"])], 0, NOW)

    results = run_concurrently(6, replica)
    assert sorted(results) == [False] * 5 + [True]
    assert count(registry, AlertDigestRow) == 1
    assert count(registry, AlertEventRow) == 1 and count(registry, AlertDeliveryRow) == 1
    assert store.last_digests() == {"rul_d": end_ms}
    # the next period is a new record; a deleted rule records nothing
    assert store.save_digest(rule, end_ms, 2 * end_ms, [], 0, NOW)
    assert store.last_digests() == {"rul_d": 2 * end_ms}
    store.delete_rule("acme", "rul_d")
    assert not store.save_digest(rule, 2 * end_ms, 3 * end_ms, [], 0, NOW)
    assert store.last_digests() == {} and count(registry, AlertDigestRow) == 0


def test_each_executions_usage_adds_up_to_the_usage_tables_rows(registry: Registry) -> None:
    data = written(registry)
    store = DigestStore(registry)
    windows = [
        (T0_MS, T0_MS + 5 * MS_PER_DAY),  # whole days
        (T0_MS + 7 * MS_PER_HOUR + 1234, T0_MS + 3 * MS_PER_DAY + 17 * MS_PER_HOUR),  # cut slices
        (T0_MS + 30 * 60_000, T0_MS + 50 * 60_000),  # inside one hour
    ]
    for start_ms, end_ms in windows:
        for org in ("acme", "beta"):
            found = store.executions_usage(org, start_ms, end_ms)
            assert all(u.execution.org == org for u in found)
            sums: dict[tuple[object, ...], dict[str, float]] = defaultdict(lambda: defaultdict(float))
            for u in found:
                for name in FIELDS:
                    sums[(u.execution.user,)][name] += getattr(u, name)
                sums[(u.execution.user,)]["executions"] += 1
            want = expected(data, org, start_ms, end_ms, ("user",))
            assert set(sums) == set(want)
            for group, figures in want.items():
                assert sums[group]["executions"] == figures["executions"]
                for name in FIELDS:
                    assert math.isclose(sums[group][name], figures[name], rel_tol=1e-9, abs_tol=1e-6)
    assert store.executions_usage("acme", T0_MS - MS_PER_DAY, T0_MS) == []
