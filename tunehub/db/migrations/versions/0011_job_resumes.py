"""Jobs remember their first start, their resumes and their replayed results.

- jobs: ``resumes`` (claims after the first: a time slice over, a restart, a lost lease),
  ``resumed_at`` (the last of them) and ``replayed`` (records that reached the store through
  the result journal after a database outage). ``started_at`` is no longer cleared when a job
  goes back to the queue: it stays the first start.

Revision ID: 0011
Revises: 0010
Created: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("resumes", sa.Integer(), server_default="0", nullable=False))
        batch.add_column(sa.Column("resumed_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("replayed", sa.Integer(), server_default="0", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("replayed")
        batch.drop_column("resumed_at")
        batch.drop_column("resumes")
