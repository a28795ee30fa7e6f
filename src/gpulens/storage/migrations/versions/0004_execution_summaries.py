"""Stored summaries of finished executions: the summary route's body, computed once.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "execution_summaries",
        sa.Column("execution_id", sa.String(128), nullable=False),
        sa.Column("org", sa.String(63), nullable=False),
        sa.Column("key_digest", sa.String(64), nullable=False),
        sa.Column("settings_digest", sa.String(64), nullable=False),
        sa.Column("source_updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("computed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("compute_ms", sa.Integer(), nullable=False),
        sa.Column("byte_count", sa.Integer(), nullable=False),
        sa.Column("row", sa.JSON(), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("execution_id", name="pk_execution_summaries"),
    )


def downgrade() -> None:
    op.drop_table("execution_summaries")
