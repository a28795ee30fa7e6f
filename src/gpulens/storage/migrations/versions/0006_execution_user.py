"""Who ran an execution: an optional `user` (a login or an e-mail address; column `user_name`, as
`user` is reserved in SQL), for fleet usage and the alert rules' `match`; indexed with the org for
the usage table's grouping.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("executions") as batch:
        batch.add_column(sa.Column("user_name", sa.String(128), nullable=True))
    op.create_index("ix_executions_org_user", "executions", ["org", "user_name"])


def downgrade() -> None:
    op.drop_index("ix_executions_org_user", table_name="executions")
    with op.batch_alter_table("executions") as batch:
        batch.drop_column("user_name")
