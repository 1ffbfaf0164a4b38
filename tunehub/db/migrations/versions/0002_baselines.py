"""Baselines: the latest vendor-library time per (workload, target, library, threads).

Revision ID: 0002
Revises: 0001
Created: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "baselines",
        sa.Column("workload_key", sa.String(length=64), nullable=False),
        sa.Column("target_key", sa.String(length=64), nullable=False),
        sa.Column("template", sa.String(length=64), nullable=False),
        sa.Column("threads", sa.Integer(), nullable=False),
        sa.Column("median_secs", sa.Float(), nullable=False),
        sa.Column("record_uid", sa.String(length=32), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["record_uid"], ["records.uid"], name=op.f("fk_baselines_record_uid_records")
        ),
        sa.ForeignKeyConstraint(
            ["target_key"], ["targets.target_key"], name=op.f("fk_baselines_target_key_targets")
        ),
        sa.ForeignKeyConstraint(
            ["workload_key"],
            ["workloads.workload_key"],
            name=op.f("fk_baselines_workload_key_workloads"),
        ),
        sa.PrimaryKeyConstraint(
            "workload_key", "target_key", "template", "threads", name=op.f("pk_baselines")
        ),
    )


def downgrade() -> None:
    op.drop_table("baselines")
