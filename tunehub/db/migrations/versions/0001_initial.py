"""Initial schema: targets, workloads, jobs, records, schedules.

Revision ID: 0001
Revises:
Created: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "targets",
        sa.Column("target_key", sa.String(length=64), nullable=False),
        sa.Column("family_key", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("name", sa.String(length=256), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("target_key", name=op.f("pk_targets")),
    )
    op.create_index(op.f("ix_targets_family_key"), "targets", ["family_key"])

    op.create_table(
        "workloads",
        sa.Column("workload_key", sa.String(length=64), nullable=False),
        sa.Column("op", sa.String(length=32), nullable=False),
        sa.Column("m", sa.Integer(), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("k", sa.Integer(), nullable=False),
        sa.Column("dtype", sa.String(length=16), nullable=False),
        sa.Column("layout", sa.String(length=32), nullable=False),
        sa.Column("epilogue", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("workload_key", name=op.f("pk_workloads")),
    )
    op.create_index("ix_workloads_shape", "workloads", ["op", "dtype", "m", "n", "k"])

    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("workload_key", sa.String(length=64), nullable=False),
        sa.Column("target_key", sa.String(length=64), nullable=False),
        sa.Column("template", sa.String(length=64), nullable=False),
        sa.Column("strategy", sa.String(length=32), nullable=False),
        sa.Column("budget", sa.JSON(), nullable=False),
        sa.Column("seed", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("trials_done", sa.Integer(), nullable=False),
        sa.Column("best_record_uid", sa.String(length=32), nullable=True),
        sa.Column("best_median_secs", sa.Float(), nullable=True),
        sa.Column("error", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["target_key"], ["targets.target_key"], name=op.f("fk_jobs_target_key_targets")
        ),
        sa.ForeignKeyConstraint(
            ["workload_key"],
            ["workloads.workload_key"],
            name=op.f("fk_jobs_workload_key_workloads"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
    )
    op.create_index(op.f("ix_jobs_state"), "jobs", ["state"])
    op.create_index(op.f("ix_jobs_workload_key"), "jobs", ["workload_key"])

    op.create_table(
        "records",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("uid", sa.String(length=32), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.Column("workload_key", sa.String(length=64), nullable=False),
        sa.Column("target_key", sa.String(length=64), nullable=False),
        sa.Column("template", sa.String(length=64), nullable=False),
        sa.Column("template_version", sa.Integer(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("config_key", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("median_secs", sa.Float(), nullable=True),
        sa.Column("repeat_secs", sa.JSON(), nullable=False),
        sa.Column("error", sa.Text(), nullable=False),
        sa.Column("compile_secs", sa.Float(), nullable=False),
        sa.Column("verify_secs", sa.Float(), nullable=False),
        sa.Column("run_secs", sa.Float(), nullable=False),
        sa.Column("environment", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "(status = 'ok' AND median_secs IS NOT NULL AND median_secs > 0)"
            " OR (status <> 'ok' AND median_secs IS NULL)",
            name=op.f("ck_records_median_iff_ok"),
        ),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_records_job_id_jobs")),
        sa.ForeignKeyConstraint(
            ["target_key"], ["targets.target_key"], name=op.f("fk_records_target_key_targets")
        ),
        sa.ForeignKeyConstraint(
            ["workload_key"],
            ["workloads.workload_key"],
            name=op.f("fk_records_workload_key_workloads"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_records")),
        sa.UniqueConstraint("uid", name=op.f("uq_records_uid")),
    )
    op.create_index(op.f("ix_records_job_id"), "records", ["job_id"])
    op.create_index(op.f("ix_records_status"), "records", ["status"])
    op.create_index(
        "ix_records_workload_target_template",
        "records",
        ["workload_key", "target_key", "template"],
    )

    op.create_table(
        "schedules",
        sa.Column("workload_key", sa.String(length=64), nullable=False),
        sa.Column("target_key", sa.String(length=64), nullable=False),
        sa.Column("template", sa.String(length=64), nullable=False),
        sa.Column("template_version", sa.Integer(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("median_secs", sa.Float(), nullable=False),
        sa.Column("gflops", sa.Float(), nullable=False),
        sa.Column("record_uid", sa.String(length=32), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("median_secs > 0", name=op.f("ck_schedules_positive_median")),
        sa.ForeignKeyConstraint(
            ["record_uid"], ["records.uid"], name=op.f("fk_schedules_record_uid_records")
        ),
        sa.ForeignKeyConstraint(
            ["target_key"], ["targets.target_key"], name=op.f("fk_schedules_target_key_targets")
        ),
        sa.ForeignKeyConstraint(
            ["workload_key"],
            ["workloads.workload_key"],
            name=op.f("fk_schedules_workload_key_workloads"),
        ),
        sa.PrimaryKeyConstraint(
            "workload_key", "target_key", "template", name=op.f("pk_schedules")
        ),
    )
    op.create_index(op.f("ix_schedules_target_key"), "schedules", ["target_key"])


def downgrade() -> None:
    op.drop_index(op.f("ix_schedules_target_key"), table_name="schedules")
    op.drop_table("schedules")
    op.drop_index("ix_records_workload_target_template", table_name="records")
    op.drop_index(op.f("ix_records_status"), table_name="records")
    op.drop_index(op.f("ix_records_job_id"), table_name="records")
    op.drop_table("records")
    op.drop_index(op.f("ix_jobs_workload_key"), table_name="jobs")
    op.drop_index(op.f("ix_jobs_state"), table_name="jobs")
    op.drop_table("jobs")
    op.drop_index("ix_workloads_shape", table_name="workloads")
    op.drop_table("workloads")
    op.drop_index(op.f("ix_targets_family_key"), table_name="targets")
    op.drop_table("targets")
