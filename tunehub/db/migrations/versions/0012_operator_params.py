"""Operators as a seam: a workload's own fields beyond the GEMM view.

- workloads: ``params`` (JSON; ``{}`` for every existing workload, all of them ``matmul``,
  which has no fields of its own). ``bmm`` keeps ``batch`` and ``b_broadcast`` there; m, n, k
  stay the typed columns shape queries filter on (each operator's GEMM view). Workload keys
  do not change: a matmul's key never included ``params``.

Revision ID: 0012
Revises: 0011
Created: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("workloads") as batch:
        batch.add_column(sa.Column("params", sa.JSON(), server_default="{}", nullable=False))


def downgrade() -> None:
    # Only matmul workloads can go back: an older tunehub reads no other operator.
    bind = op.get_bind()
    others = bind.execute(sa.text("SELECT count(*) FROM workloads WHERE op <> 'matmul'"))
    if others.scalar_one():
        raise RuntimeError(
            "the database holds workloads of operators other than matmul; "
            "a revision before 0012 cannot read them"
        )
    with op.batch_alter_table("workloads") as batch:
        batch.drop_column("params")
