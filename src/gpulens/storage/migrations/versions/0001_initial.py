"""Orgs, API keys and executions.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_STATUSES = (
    "pending",
    "starting",
    "running",
    "completed",
    "failed",
    "system_failure",
    "cancelled",
    "aborted",
)


def _ts(name: str, *, nullable: bool = True) -> sa.Column[datetime]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "orgs",
        sa.Column("slug", sa.String(63), nullable=False),
        sa.Column("name", sa.String(255), nullable=True),
        _ts("created_at", nullable=False),
        sa.PrimaryKeyConstraint("slug", name="pk_orgs"),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("org", sa.String(63), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("prefix", sa.String(16), nullable=False),
        sa.Column("key_hash", sa.String(64), nullable=False),
        sa.Column("is_admin", sa.Boolean(), nullable=False),
        sa.Column("is_active", sa.Boolean(), nullable=False),
        sa.Column("projects", sa.JSON(), nullable=True),
        _ts("created_at", nullable=False),
        _ts("expires_at"),
        _ts("last_used_at"),
        _ts("revoked_at"),
        sa.ForeignKeyConstraint(["org"], ["orgs.slug"], name="fk_api_keys_org_orgs", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_api_keys"),
    )
    op.create_index("ix_api_keys_key_hash", "api_keys", ["key_hash"], unique=True)
    op.create_index("ix_api_keys_org", "api_keys", ["org"])
    op.create_index("ix_api_keys_prefix", "api_keys", ["prefix"])
    op.create_table(
        "executions",
        sa.Column("execution_id", sa.String(128), nullable=False),
        sa.Column("org", sa.String(63), nullable=False),
        sa.Column("project", sa.String(128), nullable=True),
        sa.Column("hostname", sa.String(253), nullable=True),
        sa.Column("gpus", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("hardware_profile", sa.String(255), nullable=True),
        sa.Column("execution_type", sa.String(255), nullable=True),
        sa.Column("file_name", sa.String(1024), nullable=True),
        _ts("created_at", nullable=False),
        _ts("updated_at", nullable=False),
        _ts("start_time"),
        _ts("end_time"),
        sa.Column("return_code", sa.Integer(), nullable=True),
        sa.Column("system_errors", sa.JSON(), nullable=False),
        sa.CheckConstraint(
            "status IN (" + ", ".join(f"'{s}'" for s in _STATUSES) + ")", name="ck_executions_status"
        ),
        sa.ForeignKeyConstraint(["org"], ["orgs.slug"], name="fk_executions_org_orgs", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("execution_id", name="pk_executions"),
    )
    op.create_index("ix_executions_org_created_at", "executions", ["org", "created_at"])
    op.create_index("ix_executions_org_status", "executions", ["org", "status"])
    op.create_index("ix_executions_status", "executions", ["status"])
    op.create_index("ix_executions_created_at", "executions", ["created_at"])


def downgrade() -> None:
    op.drop_table("executions")
    op.drop_table("api_keys")
    op.drop_table("orgs")
