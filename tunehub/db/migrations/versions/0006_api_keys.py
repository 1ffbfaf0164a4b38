"""API keys, the key that submitted each job, and when each job joined the queue.

- api_keys: a public prefix, the sha256 of the key (never the key), name, scope, revocation
  time and per-key limits.
- jobs: ``api_key_id`` (NULL for CLI jobs and jobs from before keys) and ``queued_at`` (set to
  ``created_at`` for existing jobs), which orders the queue so a job handed back after its time
  slice waits behind the others.

Revision ID: 0006
Revises: 0005
Created: 2026-11-23
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
    op.create_table(
        "api_keys",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("secret_hash", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("scope", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("max_trials", sa.Integer(), nullable=True),
        sa.Column("max_secs", sa.Float(), nullable=True),
        sa.Column("max_queued_jobs", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("prefix", name=op.f("uq_api_keys_prefix")),
    )
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("api_key_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("queued_at", sa.DateTime(timezone=True), nullable=True))
        batch.create_foreign_key(
            op.f("fk_jobs_api_key_id_api_keys"), "api_keys", ["api_key_id"], ["id"]
        )
        batch.create_index(op.f("ix_jobs_api_key_id"), ["api_key_id"])
    op.execute("UPDATE jobs SET queued_at = created_at")
    with op.batch_alter_table("jobs") as batch:
        batch.alter_column("queued_at", existing_type=sa.DateTime(timezone=True), nullable=False)


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index(op.f("ix_jobs_api_key_id"))
        batch.drop_constraint(op.f("fk_jobs_api_key_id_api_keys"), type_="foreignkey")
        batch.drop_column("queued_at")
        batch.drop_column("api_key_id")
    op.drop_table("api_keys")
