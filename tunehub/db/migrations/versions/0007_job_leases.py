"""Job leases: when the lease of a RUNNING job's owner expires unless renewed.

- jobs: ``lease_expires_at`` (NULL unless RUNNING). RUNNING jobs from before leases get NULL,
  which counts as expired: the first runner's reaper puts them back in the queue, as the
  host:pid liveness check did for orphaned jobs.

Revision ID: 0007
Revises: 0006
Created: 2026-11-24
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
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("lease_expires_at")
