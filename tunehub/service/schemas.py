"""API payloads: ``*Request`` bodies and ``*Out`` responses, apart from rows and core types."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tunehub.core import LOCAL_CPU, Job, MeasureRecord, Target, Workload
from tunehub.core.job import MAX_SECS, MAX_TRIALS, STRATEGIES
from tunehub.core.workload import DTYPES, EPILOGUES, LAYOUTS, MAX_DIM, OPS

Dim = Annotated[int, Field(ge=1, le=MAX_DIM, strict=True)]
Op = Literal[OPS]  # type: ignore[valid-type]
Dtype = Literal[DTYPES]  # type: ignore[valid-type]
Layout = Literal[LAYOUTS]  # type: ignore[valid-type]
Epilogue = Literal[EPILOGUES]  # type: ignore[valid-type]
StrategyName = Literal[STRATEGIES]  # type: ignore[valid-type]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class WorkloadSpec(_Strict):
    """A GEMM C[m,n] = A[m,k] @ B[k,n] (+ epilogue), row-major."""

    op: Op = Field(default="matmul", description="Operator; only `matmul` so far.")
    m: Dim = Field(description="Rows of A and C.")
    n: Dim = Field(description="Columns of B and C.")
    k: Dim = Field(description="Columns of A, rows of B.")
    dtype: Dtype = Field(default="float32", description="Element type of A, B and C.")
    layout: Layout = Field(default="row_major", description="Memory layout of A, B and C.")
    epilogue: Epilogue = Field(
        default="none",
        description="Fused after the product: `bias` adds bias[n] to each row, `bias_relu` "
        "then clamps at zero.",
    )

    def to_core(self) -> Workload:
        return Workload(**self.model_dump())


class BudgetSpec(_Strict):
    """When a job stops: whichever limit comes first."""

    max_trials: int = Field(
        default=32, ge=1, le=MAX_TRIALS, strict=True, description="Stop after this many trials."
    )
    max_secs: float = Field(
        default=300.0, gt=0, le=MAX_SECS, description="Stop after this much wall time."
    )


class JobRequest(_Strict):
    """Body of ``POST /api/v1/jobs``."""

    workload: WorkloadSpec = Field(description="What to tune.")
    target: str = Field(
        default=LOCAL_CPU,
        min_length=1,
        max_length=64,
        description="`local-cpu` (the service's own CPU) or a stored target key.",
    )
    template: str = Field(
        default="blis.gemm", min_length=1, max_length=64, description="Kernel template to tune."
    )
    strategy: StrategyName = Field(default="random", description="Search strategy.")
    budget: BudgetSpec = Field(default_factory=BudgetSpec, description="When to stop.")
    seed: int = Field(default=0, ge=0, le=2**31 - 1, description="Seed of the strategy.")

    model_config = ConfigDict(
        extra="forbid",
        allow_inf_nan=False,
        json_schema_extra={
            "examples": [
                {
                    "workload": {"op": "matmul", "m": 256, "n": 256, "k": 256, "dtype": "float32"},
                    "target": "local-cpu",
                    "strategy": "random",
                    "budget": {"max_trials": 32, "max_secs": 120},
                }
            ]
        },
    )


class JobOut(BaseModel):
    """A tuning job and its progress."""

    id: int = Field(description="Job id.")
    state: Literal["queued", "running", "succeeded", "failed", "cancelled"] = Field(
        description="`queued` → `running` → `succeeded` | `failed` | `cancelled`."
    )
    workload: WorkloadSpec = Field(description="What is tuned.")
    workload_key: str = Field(description="sha256 of the workload's canonical JSON.")
    workload_label: str = Field(description="Readable workload, e.g. `matmul 256x256x256 float32`.")
    target_key: str = Field(description="sha256 fingerprint of the device and toolchain.")
    target_label: str = Field(description="Readable target: kind, model, cores, ISA.")
    template: str = Field(description="Kernel template tuned, e.g. `blis.gemm`.")
    strategy: str = Field(description="Search strategy.")
    budget: BudgetSpec = Field(description="When the job stops.")
    seed: int = Field(description="Seed of the strategy.")
    trials_done: int = Field(description="Trials measured so far (every status counts).")
    best_gflops: float | None = Field(description="Best GFLOP/s among `ok` trials so far.")
    best_median_secs: float | None = Field(description="Median time of the best trial.")
    best_record_uid: str | None = Field(description="uid of the best record so far.")
    created_at: datetime = Field(description="When the job was submitted (UTC).")
    started_at: datetime | None = Field(description="When a runner started it (UTC).")
    finished_at: datetime | None = Field(description="When it ended (UTC).")
    error: str = Field(description="Why it failed or was cancelled; empty otherwise.")

    @classmethod
    def from_core(cls, job: Job, target: Target | None) -> JobOut:
        w = job.spec.workload
        return cls(
            id=job.id,
            state=job.state.value,
            workload=WorkloadSpec(**w.to_dict()),
            workload_key=w.key,
            workload_label=w.label,
            target_key=job.spec.target_key,
            target_label=target.label if target else job.spec.target_key[:12],
            template=job.spec.template,
            strategy=job.spec.strategy,
            budget=BudgetSpec(**job.spec.budget.to_dict()),
            seed=job.spec.seed,
            trials_done=job.trials_done,
            best_gflops=job.best_gflops,
            best_median_secs=job.best_median_secs,
            best_record_uid=job.best_record_uid,
            created_at=job.created_at,
            started_at=job.started_at,
            finished_at=job.finished_at,
            error=job.error,
        )


class JobListOut(BaseModel):
    """One page of jobs, newest first."""

    items: list[JobOut] = Field(description="The jobs of this page.")
    total: int = Field(description="Jobs matching the filter, on all pages.")
    limit: int = Field(description="Page size asked for.")
    offset: int = Field(description="Jobs skipped before this page.")


class RecordOut(BaseModel):
    """One measurement of one config."""

    uid: str = Field(description="Record id.")
    trial: int = Field(description="1-based position of this record in its job.")
    config: dict[str, Any] = Field(description="Knob values, spelled as the kernel spells them.")
    status: Literal["ok", "invalid", "build_error", "runtime_error", "wrong_answer", "timeout"] = (
        Field(description="How the measurement ended; only `ok` carries times.")
    )
    median_secs: float | None = Field(description="Median of `repeat_secs`; null unless ok.")
    gflops: float | None = Field(description="2·m·n·k / median_secs / 1e9; null unless ok.")
    repeat_secs: list[float] = Field(description="Every timed repeat, in seconds.")
    error: str = Field(description="Compiler output, signal, mismatch or traceback; or empty.")
    compile_secs: float = Field(description="Time spent generating and compiling.")
    verify_secs: float = Field(description="Time spent checking against the reference.")
    run_secs: float = Field(description="Time spent in the timed repeats.")
    created_at: datetime = Field(description="When it was measured (UTC).")

    @classmethod
    def from_core(cls, record: MeasureRecord, trial: int) -> RecordOut:
        res = record.result
        return cls(
            uid=record.uid,
            trial=trial,
            config=record.config.to_dict(),
            status=res.status.value,
            median_secs=res.median_secs,
            gflops=record.gflops,
            repeat_secs=list(res.repeat_secs),
            error=res.error,
            compile_secs=res.compile_secs,
            verify_secs=res.verify_secs,
            run_secs=res.run_secs,
            created_at=record.created_at,
        )


class RecordListOut(BaseModel):
    """Every record of a job, oldest first."""

    items: list[RecordOut] = Field(description="The records.")


class BaselineOut(BaseModel):
    """The vendor library's time for the same workload, target and thread count."""

    template: str = Field(description="Baseline template, e.g. `numpy.matmul`.")
    library: str = Field(description="The library behind it, e.g. `openblas 0.3.31`.")
    threads: int = Field(description="Threads the library was allowed.")
    median_secs: float = Field(description="Its median time.")
    gflops: float = Field(description="Its GFLOP/s.")
    record_id: str = Field(description="uid of the measurement.")
    measured_at: datetime = Field(description="When it was measured (UTC).")


class BaselineListOut(BaseModel):
    """The vendor library's times for a job's workload and target, one per thread count."""

    items: list[BaselineOut] = Field(description="Baselines, fewest threads first.")


class ScheduleOut(BaseModel):
    """The answer of ``GET /api/v1/schedules/best``."""

    config: dict[str, Any] = Field(description="Knob values, spelled as the kernel spells them.")
    template: str = Field(description="Template the config belongs to.")
    template_version: int = Field(description="Version of that template.")
    median_secs: float = Field(description="Median time of the schedule's record.")
    gflops: float = Field(description="GFLOP/s of the schedule's record.")
    source: Literal["exact", "family"] = Field(
        description="`exact`: tuned on this target; `family`: tuned on another target of the "
        "same CPU model and ISA."
    )
    record_id: str = Field(description="uid of the measurement behind this schedule.")
    target_key: str = Field(description="Target the schedule was measured on.")
    workload_key: str = Field(description="sha256 of the workload's canonical JSON.")
    updated_at: datetime = Field(description="When the schedule last improved (UTC).")
    baseline: BaselineOut | None = Field(
        description="The vendor library measured on the schedule's target with the schedule's "
        "thread count; null if never measured."
    )
    speedup_vs_baseline: float | None = Field(
        description="Baseline time / schedule time; below 1 the library is faster."
    )
    baseline_faster: bool | None = Field(
        description="True when the vendor library beats this schedule (then prefer the library)."
    )


class HealthOut(BaseModel):
    """Liveness."""

    status: Literal["ok"] = Field(description="Always `ok` when the service answers.")
    version: str = Field(description="tunehub version.")
    database: str = Field(description="Kind of store behind the service.")
    runner: bool = Field(description="Whether this process's job runner is alive.")
