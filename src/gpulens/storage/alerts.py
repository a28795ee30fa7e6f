"""The live alerts' tables (docs/alerts.md): rules, channels, events with their deliveries, the
evaluation pass's episodes, snoozes, and named leases. Every read and write of an org's rows names the
org: a row of another org is as absent as a missing one."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TypeVar

from sqlalchemy import delete, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpulens.domain.alerts import (
    AlertEvent,
    AlertRule,
    Channel,
    ChannelType,
    Delivery,
    DeliveryStatus,
    EventType,
    StopAction,
    new_id,
)
from gpulens.storage.registry import RegistryTables
from gpulens.storage.tables import (
    AlertChannelRow,
    AlertDeliveryRow,
    AlertDigestRow,
    AlertEpisodeRow,
    AlertEventRow,
    AlertRuleRow,
    AlertSnoozeRow,
    LeaseRow,
)

T = TypeVar("T")
OrgRow = TypeVar("OrgRow", AlertRuleRow, AlertChannelRow, AlertDeliveryRow)  # rows with `id` and `org`


def _rule(row: AlertRuleRow) -> AlertRule:
    return AlertRule(
        rule_id=row.id,
        org=row.org,
        kind=row.kind,
        for_ms=row.for_ms,
        channels=tuple(row.channels or ()),
        severity=row.severity,
        action=None if row.stop_after_ms is None else StopAction(row.stop_after_ms),
        match=dict(row.match or {}),
        cooldown_ms=row.cooldown_ms,
        created_at=row.created_at,
        every_ms=row.every_ms,
        min_idle_gpu_hours=row.min_idle_gpu_hours,
    )


def _channel(row: AlertChannelRow) -> Channel:
    return Channel(
        channel_id=row.id,
        org=row.org,
        type=ChannelType(row.type),
        url=row.url,
        secret=row.secret,
        created_at=row.created_at,
        failing_since=row.failing_since,
        disabled_at=row.disabled_at,
        disabled_reason=row.disabled_reason,
    )


def _event(row: AlertEventRow) -> AlertEvent:
    return AlertEvent(
        event_id=row.id,
        org=row.org,
        type=EventType(row.type),
        created_at=row.created_at,
        execution_id=row.execution_id,
        rule_id=row.rule_id,
        payload=dict(row.payload),
    )


def _delivery(row: AlertDeliveryRow) -> Delivery:
    return Delivery(
        delivery_id=row.id,
        event_id=row.event_id,
        channel_id=row.channel_id,
        org=row.org,
        status=DeliveryStatus(row.status),
        attempts=row.attempts,
        created_at=row.created_at,
        next_attempt_at=row.next_attempt_at,
        last_error=row.last_error,
        delivered_at=row.delivered_at,
    )


@dataclass(frozen=True, slots=True)
class Episode:
    """A rule's episode on one execution, as the evaluation pass left it."""

    rule_id: str
    execution_id: str
    org: str
    started_ms: int
    fired_at: datetime | None
    fired_event_id: str | None
    stop_event_id: str | None
    resolved_at: datetime | None
    last_fired_at: datetime | None
    reposted_at: datetime | None = None  # the firing event last sent again to Alertmanager channels


_EPISODE_FIELDS = tuple(Episode.__dataclass_fields__)


def _episode(row: AlertEpisodeRow) -> Episode:
    return Episode(**{name: getattr(row, name) for name in _EPISODE_FIELDS})


class AlertStore(RegistryTables):
    """The alert tables of a registry (its engine and transaction rules)."""

    # -- rules ------------------------------------------------------------------------------------------
    def add_rule(self, rule: AlertRule) -> AlertRule:
        """The rule added, or written over the row of its id (its episodes kept: the operator's file
        changing a rule does not forget what fired)."""
        with self._write() as session:
            session.merge(
                AlertRuleRow(
                    id=rule.rule_id,
                    org=rule.org,
                    kind=rule.kind,
                    for_ms=rule.for_ms,
                    channels=list(rule.channels),
                    severity=rule.severity,
                    stop_after_ms=None if rule.action is None else rule.action.after_ms,
                    match=dict(rule.match),
                    cooldown_ms=rule.cooldown_ms,
                    created_at=rule.created_at,
                    every_ms=rule.every_ms,
                    min_idle_gpu_hours=rule.min_idle_gpu_hours,
                )
            )
        return rule

    def rules(self, org: str | None = None) -> list[AlertRule]:
        """The org's rules (every org's: None), oldest first."""
        stmt = select(AlertRuleRow).order_by(AlertRuleRow.created_at, AlertRuleRow.id)
        if org is not None:
            stmt = stmt.where(AlertRuleRow.org == org)
        with self._read() as session:
            return [_rule(r) for r in session.scalars(stmt)]

    def get_rule(self, org: str, rule_id: str) -> AlertRule | None:
        return self._org_row(AlertRuleRow, org, rule_id, _rule)

    def delete_rule(self, org: str, rule_id: str) -> bool:
        return self._delete_org_row(AlertRuleRow, org, rule_id)

    def _org_row(self, table: type[OrgRow], org: str, key: str, convert: Callable[[OrgRow], T]) -> T | None:
        """The `table` row `key` of `org`, converted; None when missing or another org's."""
        with self._read() as session:
            row = session.get(table, key)
            return None if row is None or row.org != org else convert(row)

    def _delete_org_row(self, table: type[OrgRow], org: str, key: str) -> bool:
        with self._write() as session:
            found = session.execute(delete(table).where(table.id == key, table.org == org))
            return bool(found.rowcount)  # type: ignore[attr-defined]

    # -- channels ---------------------------------------------------------------------------------------
    def add_channel(self, channel: Channel) -> Channel:
        """The channel added, or written over the row of its id (its deliveries and failing state
        kept)."""
        with self._write() as session:
            session.merge(
                AlertChannelRow(
                    id=channel.channel_id,
                    org=channel.org,
                    type=channel.type.value,
                    url=channel.url,
                    secret=channel.secret,
                    created_at=channel.created_at,
                )
            )
        return channel

    def channels(self, org: str) -> list[Channel]:
        stmt = (
            select(AlertChannelRow)
            .where(AlertChannelRow.org == org)
            .order_by(AlertChannelRow.created_at, AlertChannelRow.id)
        )
        with self._read() as session:
            return [_channel(r) for r in session.scalars(stmt)]

    def get_channel(self, org: str, channel_id: str) -> Channel | None:
        return self._org_row(AlertChannelRow, org, channel_id, _channel)

    def delete_channel(self, org: str, channel_id: str) -> bool:
        return self._delete_org_row(AlertChannelRow, org, channel_id)

    def channel_failed(self, channel_id: str, when: datetime, disable_after: timedelta) -> Channel | None:
        """Note a failed attempt; a channel failing for `disable_after` is disabled (and says why)."""
        with self._write() as session:
            row = session.get(AlertChannelRow, channel_id)
            if row is None:
                return None
            if row.failing_since is None:
                row.failing_since = when
            elif row.disabled_at is None and when - row.failing_since >= disable_after:
                row.disabled_at = when
                row.disabled_reason = f"every delivery failed since {row.failing_since.isoformat()}"
            return _channel(row)

    def disable_channel(self, channel_id: str, when: datetime, reason: str) -> Channel | None:
        """Disable a channel now (a receiver asked to stop sending), saying why."""
        with self._write() as session:
            row = session.get(AlertChannelRow, channel_id)
            if row is None:
                return None
            row.failing_since = row.failing_since or when
            row.disabled_at, row.disabled_reason = when, reason
            return _channel(row)

    def channel_succeeded(self, channel_id: str) -> None:
        with self._write() as session:
            session.execute(
                update(AlertChannelRow)
                .where(AlertChannelRow.id == channel_id)
                .values(failing_since=None, disabled_at=None, disabled_reason=None)
            )

    # -- events and deliveries ----------------------------------------------------------------------------
    def add_event(self, event: AlertEvent, channel_ids: Sequence[str], now: datetime) -> list[Delivery]:
        """Store the event and one pending delivery per channel, in one transaction (before anything
        is sent: a restart in between loses nothing)."""
        with self._write() as session:
            return self._add_event(session, event, channel_ids, now)

    def _add_event(
        self, session: Session, event: AlertEvent, channel_ids: Sequence[str], now: datetime
    ) -> list[Delivery]:
        session.add(
            AlertEventRow(
                id=event.event_id,
                org=event.org,
                type=event.type.value,
                created_at=event.created_at,
                execution_id=event.execution_id,
                rule_id=event.rule_id,
                payload=event.payload,
            )
        )
        session.flush()  # the event before its deliveries (their foreign key orders them, no relationship)
        rows = [
            AlertDeliveryRow(
                id=new_id("dlv"),
                event_id=event.event_id,
                channel_id=channel_id,
                org=event.org,
                status=DeliveryStatus.PENDING.value,
                attempts=0,
                created_at=now,
                next_attempt_at=now,
            )
            for channel_id in dict.fromkeys(channel_ids)
        ]
        session.add_all(rows)
        session.flush()
        return [_delivery(r) for r in rows]

    def get_event(self, event_id: str) -> AlertEvent | None:
        with self._read() as session:
            row = session.get(AlertEventRow, event_id)
            return None if row is None else _event(row)

    def deliveries(self, org: str, status: DeliveryStatus | None = None, limit: int = 100) -> list[Delivery]:
        stmt = select(AlertDeliveryRow).where(AlertDeliveryRow.org == org)
        if status is not None:
            stmt = stmt.where(AlertDeliveryRow.status == status.value)
        stmt = stmt.order_by(AlertDeliveryRow.created_at.desc(), AlertDeliveryRow.id).limit(limit)
        with self._read() as session:
            return [_delivery(r) for r in session.scalars(stmt)]

    def get_delivery(self, org: str, delivery_id: str) -> Delivery | None:
        return self._org_row(AlertDeliveryRow, org, delivery_id, _delivery)

    def claim_due(self, now: datetime, hold: timedelta, limit: int) -> list[Delivery]:
        """Pending deliveries due by `now` and not held by another sender, now held for `hold` by the
        caller (a replica that dies holding one leaves it to the others once `hold` passes). Nothing
        due (the common case, asked every second): one read, no write transaction."""
        due = (
            AlertDeliveryRow.status == DeliveryStatus.PENDING.value,
            AlertDeliveryRow.next_attempt_at <= now,
            or_(AlertDeliveryRow.claimed_until.is_(None), AlertDeliveryRow.claimed_until <= now),
        )
        with self._read() as session:
            if session.scalar(select(AlertDeliveryRow.id).where(*due).limit(1)) is None:
                return []
        with self._write() as session:
            rows = list(
                session.scalars(
                    select(AlertDeliveryRow)
                    .where(*due)
                    .order_by(AlertDeliveryRow.next_attempt_at, AlertDeliveryRow.id)
                    .limit(limit)
                    .with_for_update(skip_locked=True)
                )
            )
            for row in rows:
                row.claimed_until = now + hold
            return [_delivery(r) for r in rows]

    def delivery_done(
        self,
        delivery_id: str,
        *,
        status: DeliveryStatus,
        attempts: int,
        error: str | None,
        next_attempt_at: datetime | None,
        now: datetime,
    ) -> None:
        """The outcome of an attempt: delivered, failed for good, or pending again at `next_attempt_at`."""
        with self._write() as session:
            session.execute(
                update(AlertDeliveryRow)
                .where(AlertDeliveryRow.id == delivery_id)
                .values(
                    status=status.value,
                    attempts=attempts,
                    last_error=error,
                    next_attempt_at=next_attempt_at,
                    delivered_at=now if status is DeliveryStatus.DELIVERED else None,
                    claimed_until=None,
                )
            )

    def retry_delivery(self, org: str, delivery_id: str, now: datetime) -> Delivery | None:
        """A delivery of the org made pending again, due now (its event id unchanged)."""
        with self._write() as session:
            row = session.get(AlertDeliveryRow, delivery_id)
            if row is None or row.org != org:
                return None
            row.status = DeliveryStatus.PENDING.value
            row.next_attempt_at = now
            row.claimed_until = None
            return _delivery(row)

    # -- episodes and snoozes -------------------------------------------------------------------------------
    def episodes(self, rule_ids: Sequence[str] | None = None) -> list[Episode]:
        stmt = select(AlertEpisodeRow)
        if rule_ids is not None:
            stmt = stmt.where(AlertEpisodeRow.rule_id.in_(list(rule_ids)))
        with self._read() as session:
            return [_episode(r) for r in session.scalars(stmt)]

    def pass_episodes(self, execution_ids: Sequence[str]) -> list[Episode]:
        """What an evaluation pass reads: every episode of the running executions, and the open ones
        of any other (to be resolved: their execution stopped). Not the history of every execution
        that ever ran; read as plain rows."""
        t = AlertEpisodeRow
        stmt = select(*(getattr(t, name) for name in _EPISODE_FIELDS)).where(
            or_(t.resolved_at.is_(None), t.execution_id.in_(list(execution_ids)))
        )
        with self._read() as session:
            return [Episode(*row) for row in session.execute(stmt)]

    def episodes_for(self, org: str, execution_id: str) -> list[Episode]:
        """The org's open fired episodes on one execution (fired, not resolved), oldest fired first."""
        stmt = (
            select(AlertEpisodeRow)
            .where(
                AlertEpisodeRow.org == org,
                AlertEpisodeRow.execution_id == execution_id,
                AlertEpisodeRow.fired_at.is_not(None),
                AlertEpisodeRow.resolved_at.is_(None),
            )
            .order_by(AlertEpisodeRow.fired_at, AlertEpisodeRow.rule_id)
        )
        with self._read() as session:
            return [_episode(r) for r in session.scalars(stmt)]

    def save_episode(
        self, episode: Episode, events: Sequence[tuple[AlertEvent, Sequence[str]]], now: datetime
    ) -> None:
        """The episode's new state with the events it produced (and their deliveries), in one
        transaction: an event exists exactly when the state that produced it was saved."""
        with self._write() as session:
            row = session.get(AlertEpisodeRow, (episode.rule_id, episode.execution_id))
            if row is None:
                row = AlertEpisodeRow(rule_id=episode.rule_id, execution_id=episode.execution_id)
                session.add(row)
            for name in _EPISODE_FIELDS[2:]:
                setattr(row, name, getattr(episode, name))
            session.flush()
            for event, channel_ids in events:
                self._add_event(session, event, channel_ids, now)

    def repost(self, episode: Episode, channel_ids: Sequence[str], now: datetime) -> None:
        """The episode's firing event sent again to `channel_ids` (Alertmanager keeps an alert while
        it is re-posted): new pending deliveries of the same event, and the episode's `reposted_at`."""
        with self._write() as session:
            row = session.get(AlertEpisodeRow, (episode.rule_id, episode.execution_id))
            if row is None or episode.fired_event_id is None:
                return
            row.reposted_at = now
            session.add_all(
                AlertDeliveryRow(
                    id=new_id("dlv"),
                    event_id=episode.fired_event_id,
                    channel_id=channel_id,
                    org=episode.org,
                    status=DeliveryStatus.PENDING.value,
                    attempts=0,
                    created_at=now,
                    next_attempt_at=now,
                )
                for channel_id in channel_ids
            )

    def snooze(self, org: str, execution_id: str, until: datetime, now: datetime) -> None:
        with self._write() as session:
            row = session.get(AlertSnoozeRow, execution_id)
            if row is None:
                session.add(AlertSnoozeRow(execution_id=execution_id, org=org, until=until, created_at=now))
            else:
                row.org, row.until, row.created_at = org, until, now

    def snoozed_until(self, execution_ids: Sequence[str]) -> dict[str, datetime]:
        if not execution_ids:
            return {}
        with self._read() as session:
            rows = session.scalars(
                select(AlertSnoozeRow).where(AlertSnoozeRow.execution_id.in_(execution_ids))
            )
            return {r.execution_id: r.until for r in rows}

    # -- digests -------------------------------------------------------------------------------------------
    def last_digests(self) -> dict[str, int]:
        """Per digest rule, the end (Unix ms) of the latest period sent."""
        t = AlertDigestRow
        with self._read() as session:
            return {
                r: int(end)
                for r, end in session.execute(
                    select(t.rule_id, func.max(t.period_end_ms)).group_by(t.rule_id)
                )
            }

    def save_digest(
        self,
        rule: AlertRule,
        start_ms: int,
        end_ms: int,
        events: Sequence[tuple[AlertEvent, Sequence[str]]],
        users: int,
        now: datetime,
    ) -> bool:
        """The rule's period recorded as sent, with its events and their deliveries, in one transaction;
        False (nothing stored) when the period was already recorded (another replica sent it) or the
        rule is gone."""
        try:
            with self._write() as session:
                if session.get(AlertRuleRow, rule.rule_id) is None:
                    return False
                if session.get(AlertDigestRow, (rule.rule_id, end_ms)) is not None:
                    return False
                session.add(
                    AlertDigestRow(
                        rule_id=rule.rule_id,
                        period_end_ms=end_ms,
                        org=rule.org,
                        period_start_ms=start_ms,
                        users=users,
                        created_at=now,
                    )
                )
                session.flush()  # a concurrent insert of the same period fails here, before any event
                for event, channel_ids in events:
                    self._add_event(session, event, channel_ids, now)
        except IntegrityError:
            return False
        return True

    # -- leases ---------------------------------------------------------------------------------------------
    def take_lease(self, name: str, holder: str, now: datetime, ttl: timedelta) -> bool:
        """True when `holder` holds the lease `name` until now + ttl (taken free or expired, or renewed);
        two replicas creating it at once: one wins, the other sees it held."""

        def work(session: Session) -> bool:
            row = session.get(LeaseRow, name, with_for_update=True)
            if row is None:
                session.add(LeaseRow(name=name, holder=holder, expires_at=now + ttl))
                session.flush()
                return True
            if row.holder != holder and row.expires_at > now:
                return False
            row.holder, row.expires_at = holder, now + ttl
            return True

        return self.registry.write_retrying(work, f"the lease {name} is contended; retry")
