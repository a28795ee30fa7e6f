"""Hourly slices of stored summaries' receipts, summed by the fleet usage table (docs/usage.md).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "usage_slices",
        sa.Column("execution_id", sa.String(128), nullable=False),
        sa.Column("hour_ms", sa.BigInteger(), nullable=False),
        sa.Column("org", sa.String(63), nullable=False),
        sa.Column("start_ms", sa.BigInteger(), nullable=False),
        sa.Column("end_ms", sa.BigInteger(), nullable=False),
        sa.Column("gpu_ms", sa.BigInteger(), nullable=False),
        sa.Column("idle_ms", sa.BigInteger(), nullable=False),
        sa.Column("idle_held_ms", sa.BigInteger(), nullable=False),
        sa.Column("input_bound_ms", sa.BigInteger(), nullable=False),
        sa.Column("throttled_ms", sa.BigInteger(), nullable=False),
        sa.Column("useful_gpu_s", sa.Float(), nullable=False),
        sa.Column("energy_j", sa.Float(), nullable=False),
        sa.Column("cost", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("execution_id", "hour_ms", name="pk_usage_slices"),
    )
    op.create_index("ix_usage_slices_org_hour", "usage_slices", ["org", "hour_ms"])


def downgrade() -> None:
    op.drop_index("ix_usage_slices_org_hour", table_name="usage_slices")
    op.drop_table("usage_slices")
