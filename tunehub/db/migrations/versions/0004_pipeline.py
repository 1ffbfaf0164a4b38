"""One pipeline for every device: operand layouts and TF32 in workloads, tuning time in jobs,
confirmed schedules, baselines keyed by their config, and workers.

- workloads: ``layout`` (always ``row_major``) becomes ``a_layout`` and ``b_layout``, plus
  ``allow_tf32``; workload keys do not change (see ``Workload.key_dict``).
- jobs: ``tuning_secs``, the tuning time over every run of a job.
- schedules: the winner's confirmation (median, spread, rounds, time, the runners-up).
- baselines: keyed by the baseline template's config (``config_key``) instead of a thread
  count; existing rows get the key of ``{"threads": n}``.
- workers: one row per worker, with its target and heartbeat.
- records: an index on (target_key, template) for reading a target family's history.

Revision ID: 0004
Revises: 0003
Created: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from tunehub.core import Config

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _baselines_table(key_column: sa.Column[object], *extra: sa.Column[object]) -> None:
    op.create_table(
        "baselines",
        sa.Column("workload_key", sa.String(length=64), nullable=False),
        sa.Column("target_key", sa.String(length=64), nullable=False),
        sa.Column("template", sa.String(length=64), nullable=False),
        key_column,
        *extra,
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
            "workload_key", "target_key", "template", key_column.name, name=op.f("pk_baselines")
        ),
    )


def upgrade() -> None:
    with op.batch_alter_table("workloads") as batch:
        batch.add_column(
            sa.Column("a_layout", sa.String(length=16), server_default="row_major", nullable=False)
        )
        batch.add_column(
            sa.Column("b_layout", sa.String(length=16), server_default="row_major", nullable=False)
        )
        batch.add_column(
            sa.Column("allow_tf32", sa.Boolean(), server_default=sa.false(), nullable=False)
        )
        batch.drop_column("layout")

    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("tuning_secs", sa.Float(), server_default="0", nullable=False))

    with op.batch_alter_table("schedules") as batch:
        batch.add_column(sa.Column("confirmed_median_secs", sa.Float(), nullable=True))
        batch.add_column(sa.Column("confirmed_spread", sa.Float(), nullable=True))
        batch.add_column(sa.Column("confirmed_rounds", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("confirmed_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("confirmed_others", sa.JSON(), nullable=True))

    op.create_index("ix_records_target_template", "records", ["target_key", "template"])

    # Baselines change their primary key: read the few rows, rebuild the table, write them back.
    bind = op.get_bind()
    old = sa.table(
        "baselines",
        sa.column("workload_key", sa.String),
        sa.column("target_key", sa.String),
        sa.column("template", sa.String),
        sa.column("threads", sa.Integer),
        sa.column("median_secs", sa.Float),
        sa.column("record_uid", sa.String),
        sa.column("updated_at", sa.DateTime(timezone=True)),
    )
    rows = [dict(r._mapping) for r in bind.execute(sa.select(old))]
    op.drop_table("baselines")
    _baselines_table(
        sa.Column("config_key", sa.String(length=64), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
    )
    if rows:
        new = sa.table(
            "baselines",
            sa.column("workload_key", sa.String),
            sa.column("target_key", sa.String),
            sa.column("template", sa.String),
            sa.column("config_key", sa.String),
            sa.column("config", sa.JSON),
            sa.column("median_secs", sa.Float),
            sa.column("record_uid", sa.String),
            sa.column("updated_at", sa.DateTime(timezone=True)),
        )
        values = []
        for row in rows:
            config = Config({"threads": int(row.pop("threads"))})
            values.append({**row, "config_key": config.key, "config": config.to_dict()})
        op.bulk_insert(new, values)

    op.create_table(
        "workers",
        sa.Column("worker_id", sa.String(length=64), nullable=False),
        sa.Column("target_key", sa.String(length=64), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("device", sa.String(length=32), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("info", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["target_key"], ["targets.target_key"], name=op.f("fk_workers_target_key_targets")
        ),
        sa.PrimaryKeyConstraint("worker_id", name=op.f("pk_workers")),
    )
    op.create_index(op.f("ix_workers_target_key"), "workers", ["target_key"])
    op.create_index(op.f("ix_workers_heartbeat_at"), "workers", ["heartbeat_at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_workers_heartbeat_at"), table_name="workers")
    op.drop_index(op.f("ix_workers_target_key"), table_name="workers")
    op.drop_table("workers")

    # Only thread-count baselines fit the old table; others are dropped.
    bind = op.get_bind()
    new = sa.table(
        "baselines",
        sa.column("workload_key", sa.String),
        sa.column("target_key", sa.String),
        sa.column("template", sa.String),
        sa.column("config", sa.JSON),
        sa.column("median_secs", sa.Float),
        sa.column("record_uid", sa.String),
        sa.column("updated_at", sa.DateTime(timezone=True)),
    )
    rows = [dict(r._mapping) for r in bind.execute(sa.select(new))]
    op.drop_table("baselines")
    _baselines_table(sa.Column("threads", sa.Integer(), nullable=False))
    values = []
    for row in rows:
        config = row.pop("config") or {}
        threads = config.get("threads")
        if set(config) == {"threads"} and isinstance(threads, int):
            values.append({**row, "threads": threads})
    if values:
        old = sa.table(
            "baselines",
            sa.column("workload_key", sa.String),
            sa.column("target_key", sa.String),
            sa.column("template", sa.String),
            sa.column("threads", sa.Integer),
            sa.column("median_secs", sa.Float),
            sa.column("record_uid", sa.String),
            sa.column("updated_at", sa.DateTime(timezone=True)),
        )
        op.bulk_insert(old, values)

    op.drop_index("ix_records_target_template", table_name="records")
    with op.batch_alter_table("schedules") as batch:
        for name in (
            "confirmed_others",
            "confirmed_at",
            "confirmed_rounds",
            "confirmed_spread",
            "confirmed_median_secs",
        ):
            batch.drop_column(name)
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("tuning_secs")
    with op.batch_alter_table("workloads") as batch:
        batch.add_column(
            sa.Column("layout", sa.String(length=32), server_default="row_major", nullable=False)
        )
        batch.drop_column("allow_tf32")
        batch.drop_column("b_layout")
        batch.drop_column("a_layout")
