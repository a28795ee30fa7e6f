"""Archives of finished executions and pods: their raw samples as compressed chunks.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_KINDS = ("execution", "pod")


def _ts(name: str, *, nullable: bool = False) -> sa.Column[datetime]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "archives",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("object_id", sa.String(128), nullable=False),
        sa.Column("org", sa.String(63), nullable=False),
        sa.Column("spec_digest", sa.String(64), nullable=False),
        sa.Column("options_digest", sa.String(64), nullable=False),
        sa.Column("hostname", sa.String(253), nullable=True),
        sa.Column("namespace", sa.String(63), nullable=True),
        sa.Column("name", sa.String(253), nullable=True),
        sa.Column("gpus", sa.JSON(), nullable=False),
        _ts("start_time"),
        _ts("end_time"),
        sa.Column("from_ms", sa.BigInteger(), nullable=False),
        sa.Column("to_ms", sa.BigInteger(), nullable=False),
        _ts("source_updated_at"),
        sa.Column("series_count", sa.Integer(), nullable=False),
        sa.Column("sample_count", sa.BigInteger(), nullable=False),
        sa.Column("raw_count", sa.BigInteger(), nullable=False),
        sa.Column("byte_count", sa.BigInteger(), nullable=False),
        _ts("created_at"),
        _ts("checked_at"),
        sa.CheckConstraint("kind IN (" + ", ".join(f"'{k}'" for k in _KINDS) + ")", name="ck_archives_kind"),
        sa.PrimaryKeyConstraint("id", name="pk_archives"),
    )
    op.create_index("ix_archives_kind_object_id", "archives", ["kind", "object_id"], unique=True)
    op.create_index("ix_archives_created_at", "archives", ["created_at"])
    op.create_table(
        "archive_series",
        sa.Column("archive_id", sa.String(36), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("labels", sa.Text(), nullable=False),
        sa.Column("sample_count", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["archive_id"], ["archives.id"], name="fk_archive_series_archive_id_archives", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("archive_id", "seq", name="pk_archive_series"),
    )


def downgrade() -> None:
    op.drop_table("archive_series")
    op.drop_table("archives")
