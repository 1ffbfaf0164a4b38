"""The cost-model registry: one row per registered global model, with its artifact.

Revision ID: 0005
Revises: 0004
Created: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "models",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("family_key", sa.String(length=64), nullable=False),
        sa.Column("template", sa.String(length=64), nullable=False),
        sa.Column("template_version", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("features", sa.String(length=96), nullable=False),
        sa.Column("target_label", sa.String(length=256), nullable=False),
        sa.Column("records_used", sa.Integer(), nullable=False),
        sa.Column("workloads_used", sa.Integer(), nullable=False),
        sa.Column("last_record_seq", sa.BigInteger(), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("artifact", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_models")),
        sa.UniqueConstraint(
            "family_key",
            "template",
            "template_version",
            "version",
            name=op.f("uq_models_family_key"),
        ),
    )
    op.create_index(op.f("ix_models_family_key"), "models", ["family_key"])


def downgrade() -> None:
    op.drop_index(op.f("ix_models_family_key"), table_name="models")
    op.drop_table("models")
