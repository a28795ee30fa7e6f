"""The registry's tables (SQLAlchemy 2 declarative); migrations/versions/ must create exactly these."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    TypeDecorator,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from gpulens.domain.alerts import ID_MAX as ALERT_ID_MAX
from gpulens.domain.models import ExecutionStatus
from gpulens.domain.timeparse import require_utc
from gpulens.domain.workloads import PodPhase

# Stable constraint names, so later migrations can address them on every dialect.
NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

STATUS_VALUES = tuple(s.value for s in ExecutionStatus)
PHASE_VALUES = tuple(p.value for p in PodPhase)


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes in and out (a naive one in raises: domain/timeparse.require_utc); SQLite
    keeps naive UTC text, PostgreSQL timestamptz."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        value = require_utc(value, "a registry column")
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class StrList(TypeDecorator[list[str]]):
    """A JSON list of strings; SQL NULL for None (plain JSON would store the JSON literal null)."""

    impl = JSON(none_as_null=True)
    cache_ok = True

    def process_result_value(self, value: Any, dialect: Dialect) -> list[str] | None:
        if value is None:
            return None
        return [str(v) for v in value]


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class OrgRow(Base):
    __tablename__ = "orgs"

    slug: Mapped[str] = mapped_column(String(63), primary_key=True)
    name: Mapped[str | None] = mapped_column(String(255))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class ApiKeyRow(Base):
    __tablename__ = "api_keys"
    __table_args__ = (Index("ix_api_keys_key_hash", "key_hash", unique=True),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    org: Mapped[str] = mapped_column(String(63), ForeignKey("orgs.slug", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(255))
    prefix: Mapped[str] = mapped_column(String(16), index=True)
    key_hash: Mapped[str] = mapped_column(String(64))
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    is_active: Mapped[bool] = mapped_column(Boolean, default=True)
    projects: Mapped[list[str] | None] = mapped_column(StrList())
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class ExecutionRow(Base):
    __tablename__ = "executions"
    __table_args__ = (
        CheckConstraint("status IN (" + ", ".join(f"'{s}'" for s in STATUS_VALUES) + ")", name="status"),
        Index("ix_executions_org_created_at", "org", "created_at"),
        Index("ix_executions_org_status", "org", "status"),
        Index("ix_executions_status", "status"),
        Index("ix_executions_created_at", "created_at"),
        Index("ix_executions_org_user", "org", "user_name"),
    )

    execution_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    org: Mapped[str] = mapped_column(String(63), ForeignKey("orgs.slug", ondelete="CASCADE"))
    project: Mapped[str | None] = mapped_column(String(128))
    user: Mapped[str | None] = mapped_column("user_name", String(128))  # "user" is reserved in SQL
    hostname: Mapped[str | None] = mapped_column(String(253))
    gpus: Mapped[list[str]] = mapped_column(StrList())
    status: Mapped[str] = mapped_column(String(16))
    hardware_profile: Mapped[str | None] = mapped_column(String(255))
    execution_type: Mapped[str | None] = mapped_column(String(255))
    file_name: Mapped[str | None] = mapped_column(String(1024))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
    start_time: Mapped[datetime | None] = mapped_column(UTCDateTime())
    end_time: Mapped[datetime | None] = mapped_column(UTCDateTime())
    return_code: Mapped[int | None] = mapped_column(Integer)
    system_errors: Mapped[list[str]] = mapped_column(StrList())


class WorkloadRow(Base):
    __tablename__ = "workloads"
    __table_args__ = (Index("ix_workloads_org_created_at", "org", "created_at"),)

    workload_id: Mapped[str] = mapped_column(String(36), primary_key=True)  # lower-case UUID text
    name: Mapped[str] = mapped_column(String(253))
    org: Mapped[str] = mapped_column(String(63), ForeignKey("orgs.slug", ondelete="CASCADE"))
    project: Mapped[str | None] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())


class PodRow(Base):
    __tablename__ = "pods"
    __table_args__ = (
        CheckConstraint("phase IN (" + ", ".join(f"'{p}'" for p in PHASE_VALUES) + ")", name="phase"),
        Index("ix_pods_workload_id", "workload_id"),
    )

    pod_id: Mapped[str] = mapped_column(String(36), primary_key=True)  # lower-case UUID text
    workload_id: Mapped[str] = mapped_column(
        String(36), ForeignKey("workloads.workload_id", ondelete="CASCADE")
    )
    name: Mapped[str] = mapped_column(String(253))
    namespace: Mapped[str] = mapped_column(String(63))
    node: Mapped[str | None] = mapped_column(String(253))
    gpus: Mapped[list[str]] = mapped_column(StrList())
    phase: Mapped[str] = mapped_column(String(16))
    start_time: Mapped[datetime | None] = mapped_column(UTCDateTime())
    end_time: Mapped[datetime | None] = mapped_column(UTCDateTime())
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())


ARCHIVE_KINDS = ("execution", "pod")


class ArchiveRow(Base):
    """One archive of a finished execution or pod (storage/archive.py): what it was made from, and
    its size. `id` is new on every rebuild, so it doubles as the archive's generation."""

    __tablename__ = "archives"
    __table_args__ = (
        CheckConstraint("kind IN (" + ", ".join(f"'{k}'" for k in ARCHIVE_KINDS) + ")", name="kind"),
        Index("ix_archives_kind_object_id", "kind", "object_id", unique=True),
        Index("ix_archives_created_at", "created_at"),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    object_id: Mapped[str] = mapped_column(String(128))
    org: Mapped[str] = mapped_column(String(63))
    spec_digest: Mapped[str] = mapped_column(String(64))  # registration + settings it was made for
    options_digest: Mapped[str] = mapped_column(String(64))  # the settings part alone
    hostname: Mapped[str | None] = mapped_column(String(253))  # execution: host; pod: node
    namespace: Mapped[str | None] = mapped_column(String(63))
    name: Mapped[str | None] = mapped_column(String(253))
    gpus: Mapped[list[str]] = mapped_column(StrList())
    start_time: Mapped[datetime] = mapped_column(UTCDateTime())
    end_time: Mapped[datetime] = mapped_column(UTCDateTime())
    from_ms: Mapped[int] = mapped_column(BigInteger)  # the samples copied: [from_ms, to_ms]
    to_ms: Mapped[int] = mapped_column(BigInteger)
    source_updated_at: Mapped[datetime] = mapped_column(UTCDateTime())  # the registry row's updated_at
    series_count: Mapped[int] = mapped_column(Integer)
    sample_count: Mapped[int] = mapped_column(BigInteger)
    raw_count: Mapped[int] = mapped_column(BigInteger)  # samples as the backend counts them (late data)
    byte_count: Mapped[int] = mapped_column(BigInteger)  # chunk and label bytes
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    checked_at: Mapped[datetime] = mapped_column(UTCDateTime())  # last late-data check


class ArchiveSeriesRow(Base):
    """One series of an archive: its labels (canonical JSON, `__name__` included) and its samples as
    compressed chunks (gpulens.storage.chunks), one per UTC day, framed by length."""

    __tablename__ = "archive_series"

    archive_id: Mapped[str] = mapped_column(
        String(36), ForeignKey("archives.id", ondelete="CASCADE"), primary_key=True
    )
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    labels: Mapped[str] = mapped_column(Text)
    sample_count: Mapped[int] = mapped_column(Integer)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class ExecutionSummaryRow(Base):
    """The stored summary of a finished execution (storage/summaries.py): its whole body as served,
    and what a list row shows. `key_digest` says what it was computed for (the registration fields
    and the settings, prices included): a row whose key differs from the execution's now is stale
    and never served. No foreign key: like an archive, it outlives nothing it refers to."""

    __tablename__ = "execution_summaries"

    execution_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    org: Mapped[str] = mapped_column(String(63))
    key_digest: Mapped[str] = mapped_column(String(64))  # registration + settings + the price it used
    settings_digest: Mapped[str] = mapped_column(String(64))  # the settings part alone (prices file whole)
    source_updated_at: Mapped[datetime] = mapped_column(UTCDateTime())  # the registry row's updated_at
    computed_at: Mapped[datetime] = mapped_column(UTCDateTime())
    compute_ms: Mapped[int] = mapped_column(Integer)  # how long reading and computing took
    byte_count: Mapped[int] = mapped_column(Integer)
    row: Mapped[dict[str, Any]] = mapped_column(JSON)  # mean utilization, cost, findings per kind
    body: Mapped[bytes] = mapped_column(LargeBinary)  # the summary route's JSON body (orjson bytes)


class UsageSliceRow(Base):
    """One UTC hour of a stored summary's receipt (shaping/usage.hourly; docs/usage.md): written and
    replaced with the summary, summed by the fleet usage table. Times in Unix ms, GPU time in whole
    GPU-ms (so sums are exact)."""

    __tablename__ = "usage_slices"
    __table_args__ = (Index("ix_usage_slices_org_hour", "org", "hour_ms"),)

    execution_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    hour_ms: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    org: Mapped[str] = mapped_column(String(63))
    start_ms: Mapped[int] = mapped_column(BigInteger)  # the part of the hour the execution covers
    end_ms: Mapped[int] = mapped_column(BigInteger)
    gpu_ms: Mapped[int] = mapped_column(BigInteger)
    idle_ms: Mapped[int] = mapped_column(BigInteger)
    idle_held_ms: Mapped[int] = mapped_column(BigInteger)
    input_bound_ms: Mapped[int] = mapped_column(BigInteger)
    throttled_ms: Mapped[int] = mapped_column(BigInteger)
    useful_gpu_s: Mapped[float] = mapped_column(Float)
    energy_j: Mapped[float] = mapped_column(Float)
    cost: Mapped[float | None] = mapped_column(Float)  # at the summary's GPU-hour price (None: unpriced)


class UsageDayRow(Base):
    """One UTC day of a stored summary's receipt: the sums of its hourly slices of that day, written
    and replaced with them, so that the usage table reads whole days inside a window from one row per
    execution and day (storage/usage.py) and only the edge days from the hourly slices."""

    __tablename__ = "usage_days"
    __table_args__ = (Index("ix_usage_days_org_day", "org", "day_ms"),)

    execution_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    day_ms: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    org: Mapped[str] = mapped_column(String(63))
    gpu_ms: Mapped[int] = mapped_column(BigInteger)
    idle_ms: Mapped[int] = mapped_column(BigInteger)
    idle_held_ms: Mapped[int] = mapped_column(BigInteger)
    input_bound_ms: Mapped[int] = mapped_column(BigInteger)
    throttled_ms: Mapped[int] = mapped_column(BigInteger)
    useful_gpu_s: Mapped[float] = mapped_column(Float)
    energy_j: Mapped[float] = mapped_column(Float)
    cost: Mapped[float | None] = mapped_column(Float)  # the priced slices' cost (None: none priced)
    priced_ms: Mapped[int] = mapped_column(BigInteger)  # the GPU-ms of the priced slices


# -- live alerts (storage/alerts.py, docs/alerts.md) ---------------------------------------------------


class AlertRuleRow(Base):
    __tablename__ = "alert_rules"

    id: Mapped[str] = mapped_column(String(ALERT_ID_MAX), primary_key=True)
    org: Mapped[str] = mapped_column(String(63), ForeignKey("orgs.slug", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(ALERT_ID_MAX))
    for_ms: Mapped[int] = mapped_column(BigInteger)
    channels: Mapped[list[str]] = mapped_column(StrList())
    severity: Mapped[str] = mapped_column(String(16))
    stop_after_ms: Mapped[int | None] = mapped_column(BigInteger)  # the warn-then-stop action
    match: Mapped[dict[str, str]] = mapped_column(JSON)
    cooldown_ms: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    every_ms: Mapped[int | None] = mapped_column(BigInteger)  # a digest's period (for_ms is 0 then)
    min_idle_gpu_hours: Mapped[float | None] = mapped_column(Float)  # a digest's per-user threshold


class AlertChannelRow(Base):
    __tablename__ = "alert_channels"

    id: Mapped[str] = mapped_column(String(ALERT_ID_MAX), primary_key=True)
    org: Mapped[str] = mapped_column(String(63), ForeignKey("orgs.slug", ondelete="CASCADE"), index=True)
    type: Mapped[str] = mapped_column(String(16))
    url: Mapped[str] = mapped_column(Text)
    secret: Mapped[str | None] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    failing_since: Mapped[datetime | None] = mapped_column(UTCDateTime())
    disabled_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    disabled_reason: Mapped[str | None] = mapped_column(Text)


class AlertEventRow(Base):
    __tablename__ = "alert_events"
    __table_args__ = (Index("ix_alert_events_org_created_at", "org", "created_at"),)

    id: Mapped[str] = mapped_column(String(ALERT_ID_MAX), primary_key=True)
    org: Mapped[str] = mapped_column(String(63), ForeignKey("orgs.slug", ondelete="CASCADE"))
    type: Mapped[str] = mapped_column(String(ALERT_ID_MAX))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    execution_id: Mapped[str | None] = mapped_column(String(128))
    rule_id: Mapped[str | None] = mapped_column(String(ALERT_ID_MAX))
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)


class AlertDeliveryRow(Base):
    __tablename__ = "alert_deliveries"
    __table_args__ = (
        Index("ix_alert_deliveries_status_next", "status", "next_attempt_at"),
        Index("ix_alert_deliveries_org_created_at", "org", "created_at"),
    )

    id: Mapped[str] = mapped_column(String(ALERT_ID_MAX), primary_key=True)
    event_id: Mapped[str] = mapped_column(
        String(ALERT_ID_MAX), ForeignKey("alert_events.id", ondelete="CASCADE")
    )
    channel_id: Mapped[str] = mapped_column(
        String(ALERT_ID_MAX), ForeignKey("alert_channels.id", ondelete="CASCADE")
    )
    org: Mapped[str] = mapped_column(String(63), ForeignKey("orgs.slug", ondelete="CASCADE"))
    status: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    next_attempt_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    last_error: Mapped[str | None] = mapped_column(Text)
    delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    claimed_until: Mapped[datetime | None] = mapped_column(UTCDateTime())  # one replica sends it at a time


class AlertEpisodeRow(Base):
    """A rule's open (or last) episode on one execution: what the evaluation pass keeps between passes."""

    __tablename__ = "alert_episodes"

    rule_id: Mapped[str] = mapped_column(
        String(ALERT_ID_MAX), ForeignKey("alert_rules.id", ondelete="CASCADE"), primary_key=True
    )
    execution_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    org: Mapped[str] = mapped_column(String(63))
    started_ms: Mapped[int] = mapped_column(BigInteger)  # where the finding's episode began
    fired_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    fired_event_id: Mapped[str | None] = mapped_column(String(ALERT_ID_MAX))
    stop_event_id: Mapped[str | None] = mapped_column(String(ALERT_ID_MAX))
    resolved_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    last_fired_at: Mapped[datetime | None] = mapped_column(UTCDateTime())  # the cool-down's start
    reposted_at: Mapped[datetime | None] = mapped_column(UTCDateTime())  # Alertmanager: last re-post


class AlertDigestRow(Base):
    """A digest rule's period that was sent (service/alerts/digest.py): written with the digest's events
    in one transaction, its key refusing a second sending of the same period by another replica."""

    __tablename__ = "alert_digests"

    rule_id: Mapped[str] = mapped_column(
        String(ALERT_ID_MAX), ForeignKey("alert_rules.id", ondelete="CASCADE"), primary_key=True
    )
    period_end_ms: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    org: Mapped[str] = mapped_column(String(63))
    period_start_ms: Mapped[int] = mapped_column(BigInteger)
    users: Mapped[int] = mapped_column(Integer)  # per-user digests stored
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class AlertSnoozeRow(Base):
    __tablename__ = "alert_snoozes"

    execution_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    org: Mapped[str] = mapped_column(String(63), ForeignKey("orgs.slug", ondelete="CASCADE"))
    until: Mapped[datetime] = mapped_column(UTCDateTime())
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class LeaseRow(Base):
    """A named lease (the alert evaluation pass): one replica holds it until `expires_at`."""

    __tablename__ = "leases"

    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    holder: Mapped[str] = mapped_column(String(128))
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())
