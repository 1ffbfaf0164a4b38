"""SQLAlchemy 2.0 tables (``*Row``): targets, workloads, jobs, records, schedules, baselines,
workers, API keys, models.

Rows stay inside ``tunehub.db``; stores turn them into core dataclasses before returning.
Every change here needs an Alembic migration in ``tunehub/db/migrations/versions``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    TypeDecorator,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from tunehub.db.common import KEY_LENGTH, OWNER_LENGTH, UID_LENGTH

# Stable constraint names let Alembic's batch mode (SQLite table rebuilds) find constraints.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# BIGINT ids, except on SQLite where only INTEGER PRIMARY KEY autoincrements (it is 64-bit there).
BigId = BigInteger().with_variant(Integer(), "sqlite")


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend.

    PostgreSQL stores ``timestamptz``; SQLite has no time zones, so values are stored as naive
    UTC and given back their UTC tzinfo when read. Naive datetimes are refused, not guessed.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(f"naive datetime {value.isoformat()}: tunehub stores aware UTC times")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JSON()}


class TargetRow(Base):
    """A device fingerprint; ``data`` is ``Target.to_dict()``."""

    __tablename__ = "targets"

    target_key: Mapped[str] = mapped_column(String(KEY_LENGTH), primary_key=True)
    family_key: Mapped[str] = mapped_column(String(KEY_LENGTH), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    name: Mapped[str] = mapped_column(String(256))
    data: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime]


class WorkloadRow(Base):
    """A workload, one typed column per common field (they are what shape queries filter on)
    and the operator's own fields in ``params``."""

    __tablename__ = "workloads"
    __table_args__ = (Index("ix_workloads_shape", "op", "dtype", "m", "n", "k"),)

    workload_key: Mapped[str] = mapped_column(String(KEY_LENGTH), primary_key=True)
    op: Mapped[str] = mapped_column(String(32))
    m: Mapped[int] = mapped_column(Integer)
    n: Mapped[int] = mapped_column(Integer)
    k: Mapped[int] = mapped_column(Integer)
    dtype: Mapped[str] = mapped_column(String(16))
    a_layout: Mapped[str] = mapped_column(String(16), server_default="row_major")
    b_layout: Mapped[str] = mapped_column(String(16), server_default="row_major")
    epilogue: Mapped[str] = mapped_column(String(32))
    allow_tf32: Mapped[bool] = mapped_column(Boolean, server_default=false())
    # The operator's own fields (``Workload.params``: bmm's batch, b_broadcast), {} for matmul.
    # m, n, k above are the operator's GEMM view, which shape queries filter on.
    params: Mapped[dict[str, Any]] = mapped_column(JSON, server_default="{}")
    created_at: Mapped[datetime]


class ApiKeyRow(Base):
    """An API key: its public prefix and the sha256 of the key, never the key itself."""

    __tablename__ = "api_keys"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    prefix: Mapped[str] = mapped_column(String(16), unique=True)
    secret_hash: Mapped[str] = mapped_column(String(KEY_LENGTH))
    name: Mapped[str] = mapped_column(String(64))
    scope: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime]
    revoked_at: Mapped[datetime | None]
    # Per-key limits; NULL: the service's setting.
    max_trials: Mapped[int | None] = mapped_column(Integer)
    max_secs: Mapped[float | None] = mapped_column(Float)
    max_queued_jobs: Mapped[int | None] = mapped_column(Integer)


class JobRow(Base):
    """A tuning job; its target row must exist first (the service stores the target first)."""

    __tablename__ = "jobs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    workload_key: Mapped[str] = mapped_column(
        String(KEY_LENGTH), ForeignKey("workloads.workload_key"), index=True
    )
    target_key: Mapped[str] = mapped_column(String(KEY_LENGTH), ForeignKey("targets.target_key"))
    template: Mapped[str] = mapped_column(String(64))
    strategy: Mapped[str] = mapped_column(String(32))
    budget: Mapped[dict[str, Any]] = mapped_column(JSON)
    seed: Mapped[int] = mapped_column(BigInteger)
    state: Mapped[str] = mapped_column(String(16), index=True)
    trials_done: Mapped[int] = mapped_column(Integer)
    # Not a foreign key: records point at jobs, and a cycle would complicate every insert.
    best_record_uid: Mapped[str | None] = mapped_column(String(UID_LENGTH))
    best_median_secs: Mapped[float | None] = mapped_column(Float)
    error: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime]
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    # host:pid:random of the job runner that holds (or last held) the job; "" while QUEUED.
    # Its writes for the job are checked against this column (fencing).
    owner: Mapped[str] = mapped_column(String(OWNER_LENGTH), server_default="")
    # When the owner's lease ends unless renewed; NULL unless RUNNING (NULL while RUNNING: a
    # job from before leases, expired).
    lease_expires_at: Mapped[datetime | None]
    # Seconds spent tuning over every run of the job (what budget.max_secs limits).
    tuning_secs: Mapped[float] = mapped_column(Float, server_default="0")
    # The key that submitted it (NULL: the CLI, or a job from before keys).
    api_key_id: Mapped[int | None] = mapped_column(Integer, ForeignKey("api_keys.id"), index=True)
    # When it last joined the queue: runners take the longest-waiting job first, so a job
    # handed back after its time slice goes behind the others.
    queued_at: Mapped[datetime]
    # Runners claim the highest priority first: people's jobs (0) before jobs that lookups
    # queued (below 0), then the longest waiting.
    priority: Mapped[int] = mapped_column(Integer, server_default="0")
    # Claims after the first (``started_at`` stays the first start) and the last one's time.
    resumes: Mapped[int] = mapped_column(Integer, server_default="0")
    resumed_at: Mapped[datetime | None]
    # Records that reached the store through the result journal (tunehub.db.journal).
    replayed: Mapped[int] = mapped_column(Integer, server_default="0")


class RecordRow(Base):
    """One measurement, immutable once stored; ``median_secs`` is NULL unless status is ok."""

    __tablename__ = "records"
    __table_args__ = (
        Index("ix_records_workload_target_template", "workload_key", "target_key", "template"),
        Index("ix_records_target_template", "target_key", "template"),
        CheckConstraint(
            "(status = 'ok' AND median_secs IS NOT NULL AND median_secs > 0)"
            " OR (status <> 'ok' AND median_secs IS NULL)",
            name="median_iff_ok",
        ),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    uid: Mapped[str] = mapped_column(String(UID_LENGTH), unique=True)
    job_id: Mapped[int | None] = mapped_column(Integer, ForeignKey("jobs.id"), index=True)
    workload_key: Mapped[str] = mapped_column(
        String(KEY_LENGTH), ForeignKey("workloads.workload_key")
    )
    target_key: Mapped[str] = mapped_column(String(KEY_LENGTH), ForeignKey("targets.target_key"))
    template: Mapped[str] = mapped_column(String(64))
    template_version: Mapped[int] = mapped_column(Integer)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    config_key: Mapped[str] = mapped_column(String(KEY_LENGTH))
    status: Mapped[str] = mapped_column(String(16), index=True)
    median_secs: Mapped[float | None] = mapped_column(Float)
    repeat_secs: Mapped[list[float]] = mapped_column(JSON)
    error: Mapped[str] = mapped_column(Text)
    compile_secs: Mapped[float] = mapped_column(Float)
    verify_secs: Mapped[float] = mapped_column(Float)
    run_secs: Mapped[float] = mapped_column(Float)
    environment: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime]


class ScheduleRow(Base):
    """The fastest ok record for (workload, target, template), copied out for fast lookups."""

    __tablename__ = "schedules"
    __table_args__ = (CheckConstraint("median_secs > 0", name="positive_median"),)

    workload_key: Mapped[str] = mapped_column(
        String(KEY_LENGTH), ForeignKey("workloads.workload_key"), primary_key=True
    )
    target_key: Mapped[str] = mapped_column(
        String(KEY_LENGTH), ForeignKey("targets.target_key"), primary_key=True, index=True
    )
    template: Mapped[str] = mapped_column(String(64), primary_key=True)
    template_version: Mapped[int] = mapped_column(Integer)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    median_secs: Mapped[float] = mapped_column(Float)
    gflops: Mapped[float] = mapped_column(Float)
    record_uid: Mapped[str] = mapped_column(String(UID_LENGTH), ForeignKey("records.uid"))
    updated_at: Mapped[datetime]
    # The winner re-timed at the end of a job (all NULL until then; cleared when it moves).
    confirmed_median_secs: Mapped[float | None] = mapped_column(Float)
    confirmed_spread: Mapped[float | None] = mapped_column(Float)
    confirmed_rounds: Mapped[int | None] = mapped_column(Integer)
    confirmed_at: Mapped[datetime | None]
    confirmed_others: Mapped[dict[str, Any] | None] = mapped_column(JSON)


class BaselineRow(Base):
    """The latest ok measurement of a vendor library (a baseline template) for (workload,
    target, library, config); the measurement itself is a row of ``records``."""

    __tablename__ = "baselines"

    workload_key: Mapped[str] = mapped_column(
        String(KEY_LENGTH), ForeignKey("workloads.workload_key"), primary_key=True
    )
    target_key: Mapped[str] = mapped_column(
        String(KEY_LENGTH), ForeignKey("targets.target_key"), primary_key=True
    )
    template: Mapped[str] = mapped_column(String(64), primary_key=True)
    config_key: Mapped[str] = mapped_column(String(KEY_LENGTH), primary_key=True)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    median_secs: Mapped[float] = mapped_column(Float)
    record_uid: Mapped[str] = mapped_column(String(UID_LENGTH), ForeignKey("records.uid"))
    updated_at: Mapped[datetime]


class WorkerRow(Base):
    """A worker measuring on one device of a target; live while it keeps reporting."""

    __tablename__ = "workers"

    worker_id: Mapped[str] = mapped_column(String(KEY_LENGTH), primary_key=True)
    target_key: Mapped[str] = mapped_column(
        String(KEY_LENGTH), ForeignKey("targets.target_key"), index=True
    )
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(16))
    device: Mapped[str] = mapped_column(String(32))
    started_at: Mapped[datetime]
    heartbeat_at: Mapped[datetime] = mapped_column(index=True)
    info: Mapped[dict[str, Any]] = mapped_column(JSON)


class ModelRow(Base):
    """A registered cost model (the global model of a target family for one template
    version) with its held-out metrics and the quality gate's verdict; ``artifact`` is the
    model itself, read apart. The newest accepted model of a (family, template, version) is
    the one in use."""

    __tablename__ = "models"
    __table_args__ = (UniqueConstraint("family_key", "template", "template_version", "version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    family_key: Mapped[str] = mapped_column(String(KEY_LENGTH), index=True)
    template: Mapped[str] = mapped_column(String(64))
    template_version: Mapped[int] = mapped_column(Integer)
    version: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(32))
    features: Mapped[str] = mapped_column(String(96))
    target_label: Mapped[str] = mapped_column(String(256))
    records_used: Mapped[int] = mapped_column(Integer)
    workloads_used: Mapped[int] = mapped_column(Integer)
    last_record_seq: Mapped[int] = mapped_column(BigInteger)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime]
    # The quality gate's verdict (NULL: registered before the gate) and its figures.
    accepted: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    reason: Mapped[str] = mapped_column(Text, server_default="")
    artifact: Mapped[bytes] = mapped_column(LargeBinary, deferred=True)


class AutotuneRow(Base):
    """A user kernel's shared autotuning result (``AutotuneResult``), by its cache key."""

    __tablename__ = "autotune_results"

    cache_key: Mapped[str] = mapped_column(String(KEY_LENGTH), primary_key=True)
    kernel: Mapped[str] = mapped_column(String(256))
    key_doc: Mapped[dict[str, Any]] = mapped_column(JSON)
    best_index: Mapped[int] = mapped_column(Integer)
    timings_ms: Mapped[list[Any]] = mapped_column(JSON)
    api_key_id: Mapped[int | None] = mapped_column(ForeignKey("api_keys.id"))
    created_at: Mapped[datetime]


def table(row: type[Base]) -> Table:
    """The Core ``Table`` of a row class (for bulk and dialect-specific statements)."""
    result = row.__table__
    if not isinstance(result, Table):
        raise TypeError(f"{row.__name__} is not mapped to a Table")
    return result
