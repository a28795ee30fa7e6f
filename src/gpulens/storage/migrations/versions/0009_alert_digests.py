"""Usage digests (docs/alerts.md, "Digests"): a digest rule's period and per-user threshold on
`alert_rules`, and `alert_digests`, one row per rule and period sent (its key refuses a second
sending of the same period).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("alert_rules") as batch:
        batch.add_column(sa.Column("every_ms", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("min_idle_gpu_hours", sa.Float(), nullable=True))
    op.create_table(
        "alert_digests",
        sa.Column("rule_id", sa.String(40), nullable=False),
        sa.Column("period_end_ms", sa.BigInteger(), nullable=False),
        sa.Column("org", sa.String(63), nullable=False),
        sa.Column("period_start_ms", sa.BigInteger(), nullable=False),
        sa.Column("users", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["rule_id"], ["alert_rules.id"], name="fk_alert_digests_rule_id_alert_rules", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("rule_id", "period_end_ms", name="pk_alert_digests"),
    )


def downgrade() -> None:
    op.drop_table("alert_digests")
    with op.batch_alter_table("alert_rules") as batch:
        batch.drop_column("min_idle_gpu_hours")
        batch.drop_column("every_ms")
