"""Shared autotuning results of users' Triton kernels (``tunehub.triton.autotune``).

- autotune_results: one row per cache key (sha256 of the key document it stores): the kernel's
  name, the document, the winning config's index, every config's timings, and the API key
  that uploaded it.

Revision ID: 0009
Revises: 0008 (written on 0006; chained after the client branch's 0008 when that was merged)
Created: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "autotune_results",
        sa.Column("cache_key", sa.String(length=64), nullable=False),
        sa.Column("kernel", sa.String(length=256), nullable=False),
        sa.Column("key_doc", sa.JSON(), nullable=False),
        sa.Column("best_index", sa.Integer(), nullable=False),
        sa.Column("timings_ms", sa.JSON(), nullable=False),
        sa.Column("api_key_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["api_key_id"],
            ["api_keys.id"],
            name=op.f("fk_autotune_results_api_key_id_api_keys"),
        ),
        sa.PrimaryKeyConstraint("cache_key", name=op.f("pk_autotune_results")),
    )


def downgrade() -> None:
    op.drop_table("autotune_results")
