"""API payloads: ``*Request`` bodies and ``*Out`` responses, apart from rows and core types."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tunehub.core import (
    LOCAL_CPU,
    Job,
    MeasureRecord,
    MeasureStatus,
    ModelInfo,
    Target,
    Worker,
    Workload,
)
from tunehub.core.job import DEFAULT_STRATEGY, MAX_SECS, MAX_TRIALS, NAME_LENGTHS
from tunehub.core.workload import DTYPES, EPILOGUES, LAYOUTS, MAX_DIM
from tunehub.service.redact import public_error

Dim = Annotated[int, Field(ge=1, le=MAX_DIM, strict=True)]
Dtype = Literal[DTYPES]  # type: ignore[valid-type]
Layout = Literal[LAYOUTS]  # type: ignore[valid-type]
Epilogue = Literal[EPILOGUES]  # type: ignore[valid-type]
Status = Literal[tuple(s.value for s in MeasureStatus)]  # type: ignore[valid-type]


# Names the API takes (targets, templates, strategies) are plain printable ASCII: a NUL byte or a
# character some database cannot store is a 422 here, never an error in the store.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:+-]*$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class WorkloadSpec(_Strict):
    """An operator and its shape: `matmul` is C[m,n] = epilogue(A[m,k] @ B[k,n] + bias[n]) (C
    row-major); other operators (`GET /api/v1/operators`) add fields of their own next to
    these (`bmm`: `batch`, `b_broadcast`), each checked by the operator (a 422 names a field
    it does not have or a value it refuses)."""

    # The operator's own fields arrive as extra members; Workload.from_dict checks them.
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    op: str = Field(
        default="matmul",
        min_length=1,
        max_length=32,
        pattern=NAME_PATTERN,
        description="Operator: `matmul` or `bmm` (the registered ones: `GET /api/v1/operators`).",
    )
    # Required, except for an operator that derives them from its own fields (conv2d):
    # Workload.from_dict says which is missing.
    m: Dim | None = Field(
        default=None,
        description="Rows of A and C (per batch entry for `bmm`); `conv2d` derives m, n and k "
        "from its own fields.",
    )
    n: Dim | None = Field(default=None, description="Columns of B and C.")
    k: Dim | None = Field(default=None, description="Columns of A, rows of B.")
    dtype: Dtype = Field(
        default="float32",
        description="Element type of A and B (and of C, except float8_e4m3, whose C is float16).",
    )
    a_layout: Layout = Field(default="row_major", description="How A (M x K) is stored.")
    b_layout: Layout = Field(
        default="row_major",
        description="How B (K x N) is stored; `col_major` is a row-major N x K matrix, as a "
        "linear layer's weight.",
    )
    epilogue: Epilogue = Field(
        default="none",
        description="Fused after the product: `bias` adds bias[n] to each row, `bias_relu` "
        "then clamps at zero, `bias_gelu` applies GELU (erf form) instead.",
    )
    allow_tf32: bool = Field(
        default=False,
        strict=True,
        description="float32 only: allow TensorFloat-32 products where the device has them.",
    )

    def to_core(self) -> Workload:
        return Workload.from_dict(self.model_dump())


class BudgetSpec(_Strict):
    """When a job stops: whichever limit comes first."""

    max_trials: int = Field(
        default=32, ge=1, le=MAX_TRIALS, strict=True, description="Stop after this many trials."
    )
    max_secs: float = Field(
        default=300.0,
        gt=0,
        le=MAX_SECS,
        strict=True,
        description="Stop after this much tuning time (over every run of the job; the "
        "baseline library's and the final confirmation's timings are not counted).",
    )


class JobRequest(_Strict):
    """Body of ``POST /api/v1/jobs``."""

    workload: WorkloadSpec = Field(description="What to tune.")
    target: str = Field(
        default=LOCAL_CPU,
        min_length=1,
        max_length=64,
        pattern=NAME_PATTERN,
        description="`local-cpu` (the service's own CPU), `local-cuda:N` (its GPU N), or any "
        "stored target key (`GET /api/v1/targets`); a job for a target with no live worker "
        "waits in the queue.",
    )
    template: str | None = Field(
        default=None,
        min_length=1,
        max_length=NAME_LENGTHS["template"],
        pattern=NAME_PATTERN,
        description="Kernel template to tune (`blis.gemm` and `blis.bmm` on CPUs, "
        "`triton.gemm` and `triton.bmm` on GPUs); by default the first, by name, that runs "
        "the workload on the target.",
    )
    strategy: str = Field(
        default=DEFAULT_STRATEGY,
        min_length=1,
        max_length=NAME_LENGTHS["strategy"],
        pattern=NAME_PATTERN,
        description="Search strategy, by registered name: `transfer` (the default: seeded by "
        "the global cost model and the nearest tuned workloads, then `model`), `model`, "
        "`optuna.tpe`, `optuna.cmaes`, `random`, `exhaustive`.",
    )
    budget: BudgetSpec = Field(default_factory=BudgetSpec, description="When to stop.")
    seed: int = Field(
        default=0, ge=0, le=2**31 - 1, strict=True, description="Seed of the strategy."
    )

    model_config = ConfigDict(
        extra="forbid",
        allow_inf_nan=False,
        json_schema_extra={
            "examples": [
                {
                    "workload": {"op": "matmul", "m": 256, "n": 256, "k": 256, "dtype": "float32"},
                    "target": "local-cpu",
                    "strategy": DEFAULT_STRATEGY,
                    "budget": {"max_trials": 32, "max_secs": 120},
                }
            ]
        },
    )


class JobBestOut(BaseModel):
    """The schedule the lookup serves for a job's workload on its target (``GET
    /api/v1/schedules/best`` with the job's template): the one best to quote."""

    config: dict[str, Any] = Field(description="Knob values, spelled as the kernel spells them.")
    template: str = Field(description="Template the config belongs to.")
    template_version: int = Field(description="Version of that template.")
    gflops: float = Field(
        description="GFLOP/s to quote: at the confirmed median once confirmed, else the best "
        "trial's."
    )
    median_secs: float = Field(description="The time behind `gflops`.")
    confirmed: bool = Field(
        description="True once a job re-timed the winner against the runners-up (the figures "
        "are the confirmation's); false: the best trial so far, unconfirmed."
    )
    confirmed_spread: float | None = Field(
        description="(max - min) / median of the confirmation rounds' medians."
    )
    confirmed_rounds: int | None = Field(description="Confirmation rounds.")
    confirmed_at: datetime | None = Field(description="When it was confirmed (UTC).")
    library: str | None = Field(
        description="The vendor library it is compared with (e.g. `OpenBLAS 0.3.21`); null "
        "if its Baseline was not measured."
    )
    baseline_gflops: float | None = Field(description="The library's GFLOP/s (same threads).")
    speedup_vs_baseline: float | None = Field(
        description="Library time / this schedule's time; below 1 the library is faster."
    )
    library_tie: float | None = Field(
        default=None,
        description="The speedup this schedule needs to be served over the library: 1.02, or 1 "
        "plus its confirmation rounds' spread (or the library's fastest round's margin under "
        "its median) where larger; null without a Baseline.",
    )
    baseline_faster: bool | None = Field(
        description="True when the library beats it or ties (its speedup under `library_tie`): "
        "lookups then say to prefer the library."
    )
    source: Literal["exact", "family"] = Field(
        description="`exact`: tuned on the job's target; `family`: on another target of its "
        "family (nothing on this one yet)."
    )
    record_id: str = Field(description="uid of the measurement behind the schedule.")
    target_key: str = Field(description="Target the schedule was measured on.")


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
    trials_done: int = Field(
        description="Trials measured so far: every verdict counts (ok or a failure of the "
        "config), machine failures and cancelled candidates do not."
    )
    tuning_secs: float = Field(description="Tuning time spent so far, over every run.")
    waiting_for: str | None = Field(
        description="Why a queued job is not running yet (e.g. `waiting for a worker of "
        "target …`); null otherwise."
    )
    best: JobBestOut | None = Field(
        default=None,
        description="The one best to quote: the schedule the lookup serves for this job's "
        "workload, target and template (the confirmed winner once a job confirmed it; before, "
        "the best trial so far, `confirmed: false`), with its speedup over the library; null "
        "while nothing is measured ok.",
    )
    best_gflops: float | None = Field(
        description="This job's fastest single trial, unconfirmed (it can differ from `best`: "
        "the confirmation re-times the top few and may pick another). Quote `best`."
    )
    best_median_secs: float | None = Field(description="Median time of that trial.")
    best_record_uid: str | None = Field(description="uid of that trial's record.")
    created_at: datetime = Field(description="When the job was submitted (UTC).")
    started_at: datetime | None = Field(
        description="When a runner first started it (UTC); a resume keeps it."
    )
    finished_at: datetime | None = Field(description="When it ended (UTC).")
    resumes: int = Field(
        default=0,
        description="How often it was resumed: claimed again after it had started (its time "
        "slice was over, the service restarted, its runner lost its lease).",
    )
    resumed_at: datetime | None = Field(default=None, description="When it last resumed (UTC).")
    replayed: int = Field(
        default=0,
        description="Results measured while the database was away past "
        "TUNEHUB_DB_OUTAGE_SECS that reached it later through the result journal.",
    )
    summary: str = Field(
        default="",
        description="What happened to it beyond its state, in words (resumes, results "
        "replayed from the journal); empty when nothing did.",
    )
    error: str = Field(description="Why it failed or was cancelled; empty otherwise.")
    submitted_by: str | None = Field(
        default=None,
        description="Name of the API key that submitted it; null for jobs of `tunehub tune`.",
    )
    queued_by_lookup: bool = Field(
        default=False,
        description="A lookup queued it (`tune=true`, or the service's `tune_unseen`): it runs "
        "only while no job people submitted for its target waits.",
    )

    @classmethod
    def from_core(
        cls,
        job: Job,
        target: Target | None,
        *,
        waiting_for: str | None = None,
        submitted_by: str | None = None,
        best: dict[str, Any] | None = None,
    ) -> JobOut:
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
            tuning_secs=job.tuning_secs,
            waiting_for=waiting_for,
            best=JobBestOut.model_validate(best) if best is not None else None,
            best_gflops=job.best_gflops,
            best_median_secs=job.best_median_secs,
            best_record_uid=job.best_record_uid,
            created_at=job.created_at,
            started_at=job.started_at,
            finished_at=job.finished_at,
            resumes=job.resumes,
            resumed_at=job.resumed_at,
            replayed=job.replayed,
            summary=job_summary(job),
            error=public_error(job.error),
            submitted_by=submitted_by,
            queued_by_lookup=job.from_lookup,
        )


def job_summary(job: Job) -> str:
    """What happened to ``job`` beyond its state, in words ("" when nothing did).

    >>> from tunehub.core import JobSpec, JobState, Workload, utc_now
    >>> spec = JobSpec(Workload(m=8, n=8, k=8), "t" * 64)
    >>> job_summary(Job(1, spec, JobState.SUCCEEDED, 4, utc_now(), resumes=2, replayed=3))
    'resumed 2 times; 3 results measured while the database was away replayed from the journal'
    """
    parts = []
    if job.resumes:
        parts.append(f"resumed {job.resumes} time{'s' if job.resumes != 1 else ''}")
    if job.replayed:
        parts.append(
            f"{job.replayed} result{'s' if job.replayed != 1 else ''} measured while the "
            "database was away replayed from the journal"
        )
    return "; ".join(parts)


class JobListOut(BaseModel):
    """One page of jobs, newest first."""

    items: list[JobOut] = Field(description="The jobs of this page.")
    total: int = Field(description="Jobs matching the filter, on all pages.")
    limit: int = Field(description="Page size asked for.")
    offset: int = Field(description="Jobs skipped before this page.")


class RecordOut(BaseModel):
    """One measurement of one config."""

    uid: str = Field(description="Record id.")
    seq: int = Field(
        description="The store's sequence number: pass it as `after` for the next page."
    )
    trial: int = Field(description="1-based position of this record in its job.")
    config: dict[str, Any] = Field(description="Knob values, spelled as the kernel spells them.")
    status: Status = Field(  # type: ignore[valid-type]
        description="How the measurement ended; only `ok` carries times. `cancelled`, "
        "`worker_error` and `noisy` are the machine's doing, not the config's: they are not "
        "trials. `noisy`: timed, but no timing could be trusted (the machine was busy, or the "
        "re-measures did not settle); `error` says why."
    )
    median_secs: float | None = Field(description="Median of `repeat_secs`; null unless ok.")
    gflops: float | None = Field(description="2·m·n·k / median_secs / 1e9; null unless ok.")
    repeat_secs: list[float] = Field(description="Every timed repeat, in seconds.")
    error: str = Field(
        description="Why it failed: compiler output, signal, mismatch or exception (server "
        "paths and tracebacks are left out; the service's log has them); or empty."
    )
    compile_secs: float = Field(description="Time spent generating and compiling.")
    verify_secs: float = Field(description="Time spent checking against the reference.")
    run_secs: float = Field(description="Time spent in the timed repeats.")
    created_at: datetime = Field(description="When it was measured (UTC).")

    @classmethod
    def from_core(cls, record: MeasureRecord, trial: int) -> RecordOut:
        res = record.result
        return cls(
            uid=record.uid,
            seq=record.seq or 0,
            trial=trial,
            config=record.config.to_dict(),
            status=res.status.value,
            median_secs=res.median_secs,
            gflops=record.gflops,
            repeat_secs=list(res.repeat_secs),
            error=public_error(res.error),
            compile_secs=res.compile_secs,
            verify_secs=res.verify_secs,
            run_secs=res.run_secs,
            created_at=record.created_at,
        )


class RecordListOut(BaseModel):
    """A page of a job's records, in the order they were stored."""

    items: list[RecordOut] = Field(description="The records.")
    total: int = Field(description="Records the job has, on every page.")
    next_after: int | None = Field(
        description="Pass as `after` to get the records stored after this page (the last "
        "item's `seq`); null when the page is empty."
    )


class BaselineOut(BaseModel):
    """The vendor library's time for the same workload, target and thread count."""

    template: str = Field(description="Baseline template, e.g. `numpy.matmul`.")
    library: str = Field(description="The library behind it, e.g. `openblas 0.3.31`.")
    kernel: str = Field(
        description="The library's kernel that ran, where it says (OpenBLAS's core type, "
        "e.g. `SkylakeX`); empty if unknown."
    )
    config: dict[str, Any] = Field(description="How the library was run (threads, TF32, …).")
    threads: int = Field(description="Threads the library was allowed.")
    median_secs: float = Field(description="Its median time.")
    gflops: float = Field(description="Its GFLOP/s.")
    record_id: str = Field(description="uid of the measurement.")
    measured_at: datetime = Field(description="When it was measured (UTC).")


class BaselineListOut(BaseModel):
    """The vendor library's times for a job's workload and target, one per config."""

    items: list[BaselineOut] = Field(description="Baselines, by template, oldest first.")


class TuningOut(BaseModel):
    """What a lookup that asked for tuning got."""

    queued: bool = Field(
        description="A tuning job is queued or running for this workload and target (this "
        "lookup's, or one queued before it)."
    )
    job_id: int | None = Field(description="That job's id; null if none was queued.")
    reason: str = Field(
        description="`queued`, `a job for it is already queued or running`, or why none was "
        "queued (no key that may write, the lookup-job limit, already tuned)."
    )


class ScheduleOut(BaseModel):
    """The answer of ``GET /api/v1/schedules/best``."""

    config: dict[str, Any] = Field(description="Knob values, spelled as the kernel spells them.")
    template: str = Field(description="Template the config belongs to.")
    template_version: int = Field(description="Version of that template.")
    median_secs: float | None = Field(
        description="Median time of the schedule's record; null for `predicted` and `default`."
    )
    gflops: float | None = Field(description="GFLOP/s of the schedule's record (or null).")
    confirmed_median_secs: float | None = Field(
        description="The winner re-timed at the end of a job, interleaved with the runners-up "
        "(median of the rounds' medians); null until confirmed. Quote this one."
    )
    confirmed_gflops: float | None = Field(description="GFLOP/s at the confirmed median.")
    confirmed_spread: float | None = Field(
        description="(max - min) / median of the confirmation rounds' medians."
    )
    confirmed_rounds: int | None = Field(description="Confirmation rounds.")
    confirmed_at: datetime | None = Field(description="When it was confirmed (UTC).")
    source: Literal["exact", "family", "predicted", "default"] = Field(
        description="`exact`: tuned on this target; `family`: tuned on another target of the "
        "same CPU model and ISA; `predicted`: nobody tuned this workload, the config is the "
        "global cost model's first pick, or the nearest tuned shapes' winner where the model "
        "rates it at least as high, or the analytical default where the model predicts it at "
        "most a margin slower (5% for triton.gemm) (see `model_version`, "
        "`predicted_median_secs`); "
        "`default`: no model yet, the template's analytical default."
    )
    record_id: str | None = Field(
        description="uid of the measurement behind this schedule (null if untuned)."
    )
    target_key: str = Field(description="Target the schedule was measured (or predicted) on.")
    workload_key: str = Field(description="sha256 of the workload's canonical JSON.")
    updated_at: datetime | None = Field(
        description="When the schedule last improved (UTC); null if untuned."
    )
    baseline: BaselineOut | None = Field(
        description="The vendor library measured on the schedule's target with the schedule's "
        "thread count; null if never measured."
    )
    speedup_vs_baseline: float | None = Field(
        description="Baseline time / schedule time; below 1 the library is faster."
    )
    library_tie: float | None = Field(
        default=None,
        description="The speedup this schedule needs to be served over the library: 1.02 (the "
        "noise of two side-by-side timings), or more where its confirmation's rounds moved "
        "more: 1 plus the spread of the winner's round medians, or plus how far the library's "
        "fastest round (re-timed beside it) came under its median; null without a Baseline.",
    )
    baseline_faster: bool | None = Field(
        description="True when the vendor library beats this schedule or ties with it (its "
        "speedup under `library_tie`): then prefer the library."
    )
    predicted_median_secs: float | None = Field(
        default=None, description="`predicted` only: the model's estimate of the config's time."
    )
    predicted_gflops: float | None = Field(
        default=None, description="`predicted` only: GFLOP/s at the predicted time."
    )
    model_id: int | None = Field(default=None, description="`predicted`: the model's id.")
    model_version: str | None = Field(
        default=None,
        description="`predicted`: the model that answered (template@version, family, version).",
    )
    tuning_job_id: int | None = Field(
        default=None,
        description="Untuned answers with `tune=true` (or the service's `tune_unseen`): the "
        "tuning job queued (or already queued) for this workload.",
    )
    tuning: TuningOut | None = Field(
        default=None,
        description="Whether this lookup queued tuning for the workload, or why not; null when "
        "tuning was not asked (`tune`) and the service does not tune unseen workloads.",
    )


# The most items one batch lookup may hold.
MAX_LOOKUP_ITEMS = 1000


class LookupItem(_Strict):
    """One workload to look up in a batch (the query of ``GET /api/v1/schedules/best``)."""

    workload: WorkloadSpec = Field(description="What to compute.")
    target: str = Field(
        default=LOCAL_CPU,
        min_length=1,
        max_length=64,
        pattern=NAME_PATTERN,
        description="`local-cpu`, `local-cuda:N` or a target key.",
    )
    template: str | None = Field(
        default=None,
        min_length=1,
        max_length=NAME_LENGTHS["template"],
        pattern=NAME_PATTERN,
        description="Only schedules of this template (default: any).",
    )


class LookupRequest(_Strict):
    """Body of ``POST /api/v1/schedules/lookup``."""

    items: list[Any] = Field(
        max_length=MAX_LOOKUP_ITEMS,
        description=f'Up to {MAX_LOOKUP_ITEMS} LookupItems: `{{"workload": {{op, m, n, k, '
        'dtype, a_layout, b_layout, epilogue, allow_tf32}, "target": str, "template": '
        "str|null}`. A malformed item is answered with its own 422 and does not fail the batch.",
    )
    tune: bool = Field(
        default=False,
        strict=True,
        description="Queue tuning for the untuned items (needs a key that may write), as "
        "`tune=true` does for one lookup.",
    )

    model_config = ConfigDict(
        extra="forbid",
        allow_inf_nan=False,
        json_schema_extra={
            "examples": [
                {
                    "items": [
                        {"workload": {"m": 256, "n": 256, "k": 256}, "target": "local-cpu"},
                        {"workload": {"m": 4096, "n": 4096, "k": 4096, "dtype": "float16"}},
                    ]
                }
            ]
        },
    )


class LookupHitOut(BaseModel):
    """An item answered: the same answer as ``GET /api/v1/schedules/best``."""

    ok: Literal[True] = Field(description="Always true here.")
    schedule: ScheduleOut = Field(description="The answer.")


class LookupMissOut(BaseModel):
    """An item not answered, and why."""

    ok: Literal[False] = Field(description="Always false here.")
    status: Literal[404, 422] = Field(
        description="404: no template runs the workload on the target; 422: the item is "
        "malformed (see `loc`)."
    )
    error: str = Field(description="Why.")
    loc: list[str | int] = Field(
        description='Where in the item the fault is (e.g. `["workload", "m"]`); empty for a 404.'
    )


class LookupBatchOut(BaseModel):
    """Answer of ``POST /api/v1/schedules/lookup``: one result per item, in the order asked."""

    results: list[LookupHitOut | LookupMissOut] = Field(description="One per item, in order.")


# Metrics of the analytical default on a model's held-out workloads: stored with the model's
# under this prefix, shown apart (``ModelOut.default_metrics``).
DEFAULT_PREFIX = "default_"


class ModelOut(BaseModel):
    """A registered global cost model, its held-out metrics, the analytical default's on the
    same workloads, and the quality gate's verdict."""

    id: int = Field(description="Model id.")
    version: int = Field(description="Version within its family, template and template version.")
    label: str = Field(description="template@version, family key prefix and version.")
    family_key: str = Field(description="The target family it serves.")
    target_label: str = Field(description="Readable family: kind, model, arch.")
    template: str = Field(description="Template it ranks configs of.")
    template_version: int = Field(description="That template's version.")
    kind: str = Field(description="Model kind, e.g. `xgboost`.")
    features: str = Field(description="Feature set and version it was trained on.")
    records_used: int = Field(description="Records it was trained on.")
    workloads_used: int = Field(description="Workloads those records cover.")
    metrics: dict[str, float] = Field(
        description="Held out, one workload at a time: `spearman` (median rank correlation "
        "with measured throughput), `top1_fraction` (median share of the workload's best that "
        "the model's first pick reaches), `top1_geomean` (its geometric mean over the "
        "`compared_workloads`: those where the analytical default was measured), "
        "`time_log2_error` (median |log2| error of its predicted time), "
        "`held_out_workloads`, `compared_workloads`, `train_secs`."
    )
    default_metrics: dict[str, float] = Field(
        description="The template's analytical default on the same held-out workloads: "
        "`top1_geomean` and `top1_fraction` (geometric mean and median share of the best it "
        "reaches): the bar the model's first pick must clear."
    )
    accepted: bool | None = Field(
        description="The quality gate's verdict: true, the model may be used; false, refused "
        "(kept as a candidate, never used); null, registered before the gate (never used)."
    )
    active: bool = Field(
        description="The model in use for its family, template and template version: the "
        "newest accepted one. It ranks job candidates and answers `predicted` lookups."
    )
    reason: str = Field(
        description="The gate's figures behind its verdict, e.g. `refused: first pick 3.8% of "
        "the best < the default's 85.6% (geomean over 5 held-out workloads)`."
    )
    created_at: datetime = Field(description="When it was registered (UTC).")

    @classmethod
    def from_core(cls, info: ModelInfo, *, active: bool = False) -> ModelOut:
        finite = {k: v for k, v in info.metrics.items() if math.isfinite(v)}
        reason = info.reason or (
            "not gated: registered before the quality gate; never used until the trainer "
            "retrains it"
            if info.accepted is None
            else ""
        )
        return cls(
            id=info.id,
            version=info.version,
            label=info.label,
            family_key=info.family_key,
            target_label=info.target_label,
            template=info.template,
            template_version=info.template_version,
            kind=info.kind,
            features=info.features,
            records_used=info.records_used,
            workloads_used=info.workloads_used,
            metrics={k: v for k, v in finite.items() if not k.startswith(DEFAULT_PREFIX)},
            default_metrics={
                k.removeprefix(DEFAULT_PREFIX): v
                for k, v in finite.items()
                if k.startswith(DEFAULT_PREFIX)
            },
            accepted=info.accepted,
            active=active,
            reason=reason,
            created_at=info.created_at,
        )


class ModelListOut(BaseModel):
    """Registered models, newest first, and the ones in use."""

    active: list[ModelOut] = Field(
        description="The model in use for each family, template and template version that has "
        "an accepted one (also where it is older than this page)."
    )
    items: list[ModelOut] = Field(
        description="Registered models, newest first: accepted, refused candidates (with the "
        "gate's reason) and models registered before the gate."
    )


class PredictionOut(BaseModel):
    """The global model's predicted time for one measured record."""

    uid: str = Field(description="Record id.")
    trial: int = Field(description="1-based position of the record in its job.")
    measured_secs: float = Field(description="Its measured median.")
    predicted_secs: float = Field(description="The model's predicted time for its config.")


class PredictionListOut(BaseModel):
    """Predicted against measured time for a job's ok records."""

    model: ModelOut | None = Field(description="The model that predicted (null: none yet).")
    items: list[PredictionOut] = Field(description="One per ok record, in trial order.")
    spearman: float | None = Field(
        description="Rank correlation of predicted and measured times (null under 3 records)."
    )


class WorkerOut(BaseModel):
    """A worker measuring on one device of a target."""

    worker_id: str = Field(description="Worker id.")
    host: str = Field(description="Host it runs on.")
    pid: int = Field(description="Its process id there.")
    kind: str = Field(description="How it runs (`local`: inside a tunehub service process).")
    device: str = Field(description="The device on its host, e.g. `cpu`, `cuda:0`.")
    started_at: datetime = Field(description="When it registered (UTC).")
    heartbeat_at: datetime = Field(description="When it last reported (UTC).")

    @classmethod
    def from_core(cls, worker: Worker) -> WorkerOut:
        return cls(
            worker_id=worker.worker_id,
            host=worker.host,
            pid=worker.pid,
            kind=worker.kind,
            device=worker.device,
            started_at=worker.started_at,
            heartbeat_at=worker.heartbeat_at,
        )


class TemplateOptionsOut(BaseModel):
    """A template a job on a target may name, and what it runs there (its capabilities)."""

    name: str = Field(description="Template name, e.g. `blis.gemm`.")
    version: int = Field(description="Template version.")
    ops: list[str] = Field(description="Operators it computes, e.g. `matmul`.")
    dtypes: list[str] = Field(description="Element types it has kernels of on this target.")
    epilogues: list[str] = Field(description="Epilogues it fuses.")
    a_layouts: list[str] = Field(description="Layouts of A it reads.")
    b_layouts: list[str] = Field(description="Layouts of B it reads.")
    allow_tf32: bool = Field(description="Whether it takes `allow_tf32` float32 workloads.")


class TargetOut(BaseModel):
    """A device fingerprint and its live workers."""

    target_key: str = Field(description="sha256 of the whole fingerprint (device + toolchain).")
    family_key: str = Field(description="sha256 of kind, name and arch only.")
    label: str = Field(description="Readable: kind, name, cores or SMs, arch.")
    kind: str = Field(description="`cpu` or `cuda`.")
    name: str = Field(description="CPU model or GPU name.")
    vendor: str = Field(description="Vendor, where the fingerprint has it.")
    arch: list[str] = Field(description="ISA flags (CPU) or compute capability (GPU).")
    cores: int = Field(description="Usable CPU cores, or streaming multiprocessors.")
    memory_bytes: int = Field(description="Device memory (0 where not fingerprinted).")
    l1d_bytes: int = Field(description="L1 data cache per core (0 if unknown).")
    l2_bytes: int = Field(description="L2 cache (per core on CPUs; 0 if unknown).")
    l3_bytes: int = Field(description="L3 cache (0 if unknown).")
    toolchain: dict[str, str] = Field(description="Compiler, driver and library versions.")
    properties: dict[str, Any] = Field(description="What else spaces depend on (GPUs).")
    live: bool = Field(description="Whether a worker of this target reported recently.")
    aliases: list[str] = Field(description="Names this service also accepts, e.g. `local-cpu`.")
    workers: list[WorkerOut] = Field(description="Its live workers.")
    templates: list[TemplateOptionsOut] = Field(
        default_factory=list,
        description="The templates a job on this target may name, with the dtypes, "
        "epilogues and layouts each runs here (what the dashboard's submit form offers).",
    )

    @classmethod
    def from_core(
        cls,
        target: Target,
        workers: list[Worker],
        aliases: list[str],
        templates: list[TemplateOptionsOut] | None = None,
    ) -> TargetOut:
        return cls(
            target_key=target.target_key,
            family_key=target.family_key,
            label=target.label,
            kind=target.kind,
            name=target.name,
            vendor=target.vendor,
            arch=list(target.arch),
            cores=target.cores,
            memory_bytes=target.memory_bytes,
            l1d_bytes=target.l1d_bytes,
            l2_bytes=target.l2_bytes,
            l3_bytes=target.l3_bytes,
            toolchain=dict(target.toolchain),
            properties=dict(target.properties),
            live=bool(workers),
            aliases=aliases,
            workers=[WorkerOut.from_core(w) for w in workers],
            templates=templates or [],
        )


class TargetListOut(BaseModel):
    """Every stored target, live ones first, and the search strategies a job may name."""

    items: list[TargetOut] = Field(description="The targets.")
    strategies: list[str] = Field(
        default_factory=list, description="Registered search strategies, by name."
    )
    default_strategy: str = Field(
        default=DEFAULT_STRATEGY, description="The strategy of a job that names none."
    )


class HealthOut(BaseModel):
    """Liveness, whether the store answers and whether this process's job runner can work."""

    status: Literal["ok", "degraded"] = Field(
        description="`ok`; `degraded` while the database takes no writes (checked by this "
        "request at most once a second, and set at once by any request that got 503 for it) "
        "or the job runner cannot work (its build dir cannot take files): the runner then "
        "claims no new job, and cached lookups are still answered. Back to `ok` by itself "
        "once the database answers again."
    )
    problems: list[str] = Field(description="Why it is degraded; empty when `ok`.")
    version: str = Field(description="tunehub version.")
    database: str = Field(description="Kind of store behind the service.")
    runner: bool = Field(description="Whether this process's job runner is alive.")
    workers: list[str] = Field(description="Devices this process measures on, e.g. `cpu`.")


# --- cluster view: workers and the schedule listing (the dashboard's Workers and Schedules) ---

WorkerState = Literal["idle", "building", "timing", "lost"]


class WorkerStateOut(BaseModel):
    """A worker as the store knows it, with its live state."""

    worker_id: str = Field(description="Worker id.")
    kind: str = Field(description="`local` (inside a tunehub service) or `ray` (a Ray actor).")
    target_key: str = Field(description="The target it measures on.")
    target_label: str = Field(description="That target, readable.")
    host: str = Field(description="Host it runs on.")
    node: str = Field(description="Ray node id, or the host for local workers.")
    device: str = Field(description="The device on its host, e.g. `cpu`, `cuda:0`.")
    device_name: str = Field(description="GPU name or CPU model.")
    state: WorkerState = Field(
        description="`idle`, `building` (compiling candidates), `timing` (a candidate on the "
        "device), or `lost`: no heartbeat within the live window (30 s), or a Ray actor the "
        "service saw die (at once)."
    )
    lost_reason: str | None = Field(
        default=None, description="Why a Ray worker is lost (its actor or node died), if known."
    )
    job_id: int | None = Field(description="The job it is on (null when idle or lost).")
    config: dict[str, Any] | None = Field(description="The config it is measuring, if any.")
    heartbeat_at: datetime = Field(description="When it last reported (UTC).")
    started_at: datetime = Field(description="When it registered (UTC).")
    live: bool = Field(description="Whether it reported within the live window.")


class WorkerStateListOut(BaseModel):
    """The answer of ``GET /api/v1/workers``."""

    workers: list[WorkerStateOut] = Field(description="Oldest registration first.")


class ScheduleRowOut(BaseModel):
    """One stored schedule as the schedules listing shows it."""

    workload_key: str = Field(description="sha256 of the workload's canonical JSON.")
    workload: WorkloadSpec = Field(description="The workload.")
    workload_label: str = Field(description="The workload, readable.")
    target_key: str = Field(description="Target it was tuned on.")
    target_label: str = Field(description="That target, readable.")
    template: str = Field(description="Template of the config.")
    template_version: int = Field(description="Version of that template.")
    config: dict[str, Any] = Field(description="Knob values.")
    median_secs: float = Field(description="The quoted time: confirmed where confirmed.")
    gflops: float = Field(description="GFLOP/s at that time.")
    baseline_secs: float | None = Field(
        description="The fastest vendor-library time measured for this workload on this "
        "target; null if none was measured."
    )
    speedup_vs_baseline: float | None = Field(
        description="Baseline time / schedule time; below 1 the library is faster."
    )
    source: Literal["exact"] = Field(
        description="What a lookup on this target answers with it: `exact` (stored "
        "schedules are exact answers for their own target; `family`, `predicted` and "
        "`default` answers are derived at lookup time and not stored)."
    )
    updated_at: datetime = Field(description="When it last improved (UTC).")
    confirmed_at: datetime | None = Field(description="When it was re-timed (UTC), or null.")


class ScheduleListOut(BaseModel):
    """One page of ``GET /api/v1/schedules``."""

    items: list[ScheduleRowOut] = Field(description="This page, in the order asked.")
    total: int = Field(description="Schedules matching the filters, over all pages.")
    limit: int = Field(description="Most items a page holds (as asked).")
    offset: int = Field(description="Matches skipped before this page (as asked).")
