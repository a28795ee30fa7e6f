"""Live alerts: rules, channels, events, deliveries, episodes, snoozes, and a lease table.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TZ = sa.DateTime(timezone=True)


def _org() -> sa.Column[str]:
    return sa.Column("org", sa.String(63), nullable=False)


def upgrade() -> None:
    op.create_table(
        "alert_rules",
        sa.Column("id", sa.String(40), nullable=False),
        _org(),
        sa.Column("kind", sa.String(40), nullable=False),
        sa.Column("for_ms", sa.BigInteger(), nullable=False),
        sa.Column("channels", sa.JSON(none_as_null=True), nullable=False),
        sa.Column("severity", sa.String(16), nullable=False),
        sa.Column("stop_after_ms", sa.BigInteger(), nullable=True),
        sa.Column("match", sa.JSON(), nullable=False),
        sa.Column("cooldown_ms", sa.BigInteger(), nullable=False),
        sa.Column("created_at", TZ, nullable=False),
        sa.ForeignKeyConstraint(["org"], ["orgs.slug"], name="fk_alert_rules_org_orgs", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_alert_rules"),
    )
    op.create_index("ix_alert_rules_org", "alert_rules", ["org"])
    op.create_table(
        "alert_channels",
        sa.Column("id", sa.String(40), nullable=False),
        _org(),
        sa.Column("type", sa.String(16), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("secret", sa.String(128), nullable=True),
        sa.Column("created_at", TZ, nullable=False),
        sa.Column("failing_since", TZ, nullable=True),
        sa.Column("disabled_at", TZ, nullable=True),
        sa.Column("disabled_reason", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["org"], ["orgs.slug"], name="fk_alert_channels_org_orgs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_alert_channels"),
    )
    op.create_index("ix_alert_channels_org", "alert_channels", ["org"])
    op.create_table(
        "alert_events",
        sa.Column("id", sa.String(40), nullable=False),
        _org(),
        sa.Column("type", sa.String(40), nullable=False),
        sa.Column("created_at", TZ, nullable=False),
        sa.Column("execution_id", sa.String(128), nullable=True),
        sa.Column("rule_id", sa.String(40), nullable=True),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["org"], ["orgs.slug"], name="fk_alert_events_org_orgs", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_alert_events"),
    )
    op.create_index("ix_alert_events_org_created_at", "alert_events", ["org", "created_at"])
    op.create_table(
        "alert_deliveries",
        sa.Column("id", sa.String(40), nullable=False),
        sa.Column("event_id", sa.String(40), nullable=False),
        sa.Column("channel_id", sa.String(40), nullable=False),
        _org(),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("created_at", TZ, nullable=False),
        sa.Column("next_attempt_at", TZ, nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("delivered_at", TZ, nullable=True),
        sa.Column("claimed_until", TZ, nullable=True),
        sa.ForeignKeyConstraint(
            ["event_id"],
            ["alert_events.id"],
            name="fk_alert_deliveries_event_id_alert_events",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["channel_id"],
            ["alert_channels.id"],
            name="fk_alert_deliveries_channel_id_alert_channels",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["org"], ["orgs.slug"], name="fk_alert_deliveries_org_orgs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_alert_deliveries"),
    )
    op.create_index("ix_alert_deliveries_status_next", "alert_deliveries", ["status", "next_attempt_at"])
    op.create_index("ix_alert_deliveries_org_created_at", "alert_deliveries", ["org", "created_at"])
    op.create_table(
        "alert_episodes",
        sa.Column("rule_id", sa.String(40), nullable=False),
        sa.Column("execution_id", sa.String(128), nullable=False),
        _org(),
        sa.Column("started_ms", sa.BigInteger(), nullable=False),
        sa.Column("fired_at", TZ, nullable=True),
        sa.Column("fired_event_id", sa.String(40), nullable=True),
        sa.Column("stop_event_id", sa.String(40), nullable=True),
        sa.Column("resolved_at", TZ, nullable=True),
        sa.Column("last_fired_at", TZ, nullable=True),
        sa.Column("reposted_at", TZ, nullable=True),
        sa.ForeignKeyConstraint(
            ["rule_id"], ["alert_rules.id"], name="fk_alert_episodes_rule_id_alert_rules", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("rule_id", "execution_id", name="pk_alert_episodes"),
    )
    op.create_table(
        "alert_snoozes",
        sa.Column("execution_id", sa.String(128), nullable=False),
        _org(),
        sa.Column("until", TZ, nullable=False),
        sa.Column("created_at", TZ, nullable=False),
        sa.ForeignKeyConstraint(["org"], ["orgs.slug"], name="fk_alert_snoozes_org_orgs", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("execution_id", name="pk_alert_snoozes"),
    )
    op.create_table(
        "leases",
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("holder", sa.String(128), nullable=False),
        sa.Column("expires_at", TZ, nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_leases"),
    )


def downgrade() -> None:
    for table in (
        "leases",
        "alert_snoozes",
        "alert_episodes",
        "alert_deliveries",
        "alert_events",
        "alert_channels",
        "alert_rules",
    ):
        op.drop_table(table)
