"""The cost models' quality gate: whether each registered model was accepted, and why.

- models: ``accepted`` (NULL for every existing model: registered before the gate, so never
  used until the trainer retrains and gates it; true or false for a model registered since)
  and ``reason`` (the gate's figures behind its verdict). Lookups and jobs use the newest
  accepted model of a (family, template, template version) only.

Revision ID: 0010
Revises: 0009
Created: 2026-11-26
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("models") as batch:
        batch.add_column(sa.Column("accepted", sa.Boolean(), nullable=True))
        batch.add_column(sa.Column("reason", sa.Text(), server_default="", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("models") as batch:
        batch.drop_column("reason")
        batch.drop_column("accepted")
