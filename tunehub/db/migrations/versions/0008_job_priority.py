"""A priority per job: jobs that lookups queue (``tune=true``) wait behind people's jobs.

- jobs: ``priority`` (0 for every existing job and every job people submit; below 0 for a job
  a lookup queued). Runners claim the highest priority first, then the longest waiting.

Revision ID: 0008
Revises: 0007
Created: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("priority", sa.Integer(), server_default="0", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("priority")
