"""Run:ai-style workloads and their pods.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_PHASES = ("Pending", "Running", "Succeeded", "Failed", "Unknown")


def _ts(name: str, *, nullable: bool = True) -> sa.Column[datetime]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "workloads",
        sa.Column("workload_id", sa.String(36), nullable=False),
        sa.Column("name", sa.String(253), nullable=False),
        sa.Column("org", sa.String(63), nullable=False),
        sa.Column("project", sa.String(128), nullable=True),
        _ts("created_at", nullable=False),
        _ts("updated_at", nullable=False),
        sa.ForeignKeyConstraint(["org"], ["orgs.slug"], name="fk_workloads_org_orgs", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("workload_id", name="pk_workloads"),
    )
    op.create_index("ix_workloads_org_created_at", "workloads", ["org", "created_at"])
    op.create_table(
        "pods",
        sa.Column("pod_id", sa.String(36), nullable=False),
        sa.Column("workload_id", sa.String(36), nullable=False),
        sa.Column("name", sa.String(253), nullable=False),
        sa.Column("namespace", sa.String(63), nullable=False),
        sa.Column("node", sa.String(253), nullable=True),
        sa.Column("gpus", sa.JSON(), nullable=False),
        sa.Column("phase", sa.String(16), nullable=False),
        _ts("start_time"),
        _ts("end_time"),
        _ts("created_at", nullable=False),
        _ts("updated_at", nullable=False),
        sa.CheckConstraint("phase IN (" + ", ".join(f"'{p}'" for p in _PHASES) + ")", name="ck_pods_phase"),
        sa.ForeignKeyConstraint(
            ["workload_id"],
            ["workloads.workload_id"],
            name="fk_pods_workload_id_workloads",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("pod_id", name="pk_pods"),
    )
    op.create_index("ix_pods_workload_id", "pods", ["workload_id"])


def downgrade() -> None:
    op.drop_table("pods")
    op.drop_table("workloads")
