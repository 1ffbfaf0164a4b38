"""Routes of the jobs resource: submit, list, show, records, cancel."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query, status

from tunehub.core import (
    ApiKey,
    Budget,
    InvalidSpec,
    Job,
    JobSpec,
    JobState,
    Scope,
    Target,
    Workload,
    utc_now,
)
from tunehub.core.operators import get_operator
from tunehub.core.registry import UnknownName
from tunehub.core.worker import LIVE_SECS
from tunehub.db.store import JobNotFound, ScheduleStore
from tunehub.kernels.base import Template
from tunehub.kernels.registry import get_template, template_names
from tunehub.service.auth import KeyedRoute, ReadAccess, needs_key
from tunehub.service.deps import LocalTargetsDep, SettingsDep, StoreDep, resolve_target
from tunehub.service.schemas import (
    BaselineListOut,
    JobListOut,
    JobOut,
    JobRequest,
    RecordListOut,
    RecordOut,
)
from tunehub.service.settings import Settings
from tunehub.tuner import LookupAnswer, baseline_dict, strategy_names
from tunehub.tuner.best import best_dict, job_bests
from tunehub.tuner.lookup import lookup_templates

router = APIRouter(
    prefix="/api/v1/jobs", tags=["jobs"], route_class=KeyedRoute, dependencies=[ReadAccess]
)
SubmitKey = Annotated[ApiKey, needs_key(Scope.WRITE, "submitting a job")]
CancelKey = Annotated[ApiKey, needs_key(Scope.WRITE, "cancelling a job")]
KEY_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"description": "No API key, or one that is malformed, unknown or revoked."},
    403: {"description": "The key's scope does not allow this."},
}

JobId = Annotated[int, Path(ge=1, le=2**31 - 1, description="Job id.")]
MAX_PAGE = 1000


def live_target_keys(store: ScheduleStore) -> set[str]:
    """Targets with a worker that reported within the last LIVE_SECS (and is not lost)."""
    now = utc_now()
    since = now - timedelta(seconds=LIVE_SECS)
    return {w.target_key for w in store.list_workers(live_since=since) if w.live(now)}


class Lookups:
    """Targets and key names looked up once per request, however many jobs name them."""

    def __init__(self, store: ScheduleStore) -> None:
        self.store = store
        self.targets: dict[str, Target | None] = {}
        self.keys: dict[int, str | None] = {}

    def target(self, target_key: str) -> Target | None:
        if target_key not in self.targets:
            self.targets[target_key] = self.store.get_target(target_key)
        return self.targets[target_key]

    def key_name(self, key_id: int | None) -> str | None:
        if key_id is None:
            return None
        if key_id not in self.keys:
            key = self.store.get_api_key(key_id=key_id)
            self.keys[key_id] = key.name if key else None
        return self.keys[key_id]


def job_outs(
    store: ScheduleStore, jobs: Sequence[Job], live: set[str] | None = None
) -> list[JobOut]:
    """Jobs as the API shows them, each with its ``best`` (the schedule the lookup serves for
    its workload): a bounded number of store reads however many jobs."""
    lookups = Lookups(store)  # each target and key looked up once per page
    targets = {job.spec.target_key: lookups.target(job.spec.target_key) for job in jobs}
    bests = job_bests(store, jobs, targets)
    return [
        job_out(store, job, live, lookups, best=best) for job, best in zip(jobs, bests, strict=True)
    ]


def job_out(
    store: ScheduleStore,
    job: Job,
    live: set[str] | None = None,
    lookups: Lookups | None = None,
    *,
    best: LookupAnswer | None = None,
) -> JobOut:
    """The job as the API shows it (``lookups`` shares lookups over a page of jobs; ``best``
    is its served schedule, see ``job_outs``)."""
    lookups = lookups or Lookups(store)
    target = lookups.target(job.spec.target_key)
    waiting = None
    if job.state is JobState.QUEUED:
        live = live_target_keys(store) if live is None else live
        if job.spec.target_key not in live:
            label = target.short_label if target else job.spec.target_key[:12]
            waiting = f"waiting for a worker of target {label}"
    return JobOut.from_core(
        job,
        target,
        waiting_for=waiting,
        submitted_by=lookups.key_name(job.api_key_id),
        best=best_dict(best) if best is not None else None,
    )


def _get_job(store: ScheduleStore, job_id: int) -> Job:
    try:
        return store.get_job(job_id)
    except JobNotFound as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=str(exc)) from None


@router.post(
    "",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=JobOut,
    operation_id="submit_job",
    summary="Queue a tuning job",
    responses={
        **KEY_RESPONSES,
        429: {"description": "The key (or the service) has as many jobs queued as allowed."},
    },
)
def submit_job(
    body: JobRequest,
    store: StoreDep,
    local: LocalTargetsDep,
    settings: SettingsDep,
    key: SubmitKey,
) -> JobOut:
    """Validate the request, store a QUEUED job and return it; a worker of its target runs it
    (it waits in the queue, saying so, while no worker of the target is live).

    Needs a key of scope `write`. The budget must fit the key's limits (else the service's:
    `TUNEHUB_MAX_JOB_TRIALS`, `TUNEHUB_MAX_JOB_SECS`), and the key may have only so many jobs
    queued or running (`TUNEHUB_MAX_QUEUED_JOBS_PER_KEY`: a 429 beyond)."""
    check_budget(body.budget.max_trials, body.budget.max_secs, key, settings)
    try:
        workload = body.workload.to_core()
    except InvalidSpec as exc:  # rules that span fields, e.g. the m*n*k limit
        raise InvalidSpec(f"workload.{exc.field}", exc.reason) from None
    target = resolve_target(store, body.target, local=local)
    if body.template is None:
        template = default_template(workload, target)
    else:
        try:
            template = get_template(body.template)
        except UnknownName as exc:
            raise InvalidSpec("template", str(exc)) from None
    template.check(workload, target)  # Unsupported: a 422 naming the field
    if body.strategy not in strategy_names():
        known = ", ".join(strategy_names())
        raise InvalidSpec("strategy", f"unknown strategy {body.strategy!r}; known: {known}")
    spec = JobSpec(
        workload=workload,
        target_key=target.target_key,
        template=template.name,
        strategy=body.strategy,
        budget=Budget(max_trials=body.budget.max_trials, max_secs=body.budget.max_secs),
        seed=body.seed,
    )
    job = store.create_job(
        spec,
        api_key_id=key.id,
        max_active_for_key=key.limits.max_queued_jobs or settings.max_queued_jobs_per_key,
        max_active_total=settings.max_queued_jobs,
    )
    (out,) = job_outs(store, [job])
    return out


def default_template(workload: Workload, target: Target) -> Template:
    """The operator's default template for the target's kind (``blis.gemm`` for a CPU matmul,
    ``triton.gemm`` on CUDA; a 422 naming the field it refuses); for a kind the operator names
    none for, the first template, by name, that runs ``workload`` on ``target``; else a 422
    naming what stops the closest one (the template of this operator and target kind that
    refuses a field of the workload, e.g. its dtype), or the operator when none computes it."""
    name = get_operator(workload.op).default_templates.get(target.kind)
    if name is not None and name in template_names():
        return get_template(name)  # its check below names the field it refuses
    runs = lookup_templates(workload, target, None)
    if runs:
        return runs[0]
    for name in template_names():
        tmpl = get_template(name)
        if tmpl.baseline or tmpl.device_kind != target.kind:
            continue
        problem = tmpl.problem(workload, target)
        if problem is not None and problem.field not in ("workload.op", "target"):
            raise InvalidSpec(f"workload.{problem.field.removeprefix('workload.')}", problem.reason)
    raise InvalidSpec(
        "workload.op", f"no template computes {workload.op} on {target.kind} {target.name}"
    )


def check_budget(max_trials: int, max_secs: float, key: ApiKey, settings: Settings) -> None:
    """A 422 naming the field and the limit when a budget asks for more than it may."""
    own = key.limits
    limit_trials = own.max_trials or settings.max_job_trials
    if max_trials > limit_trials:
        whose = f"the limit of key {key.label}" if own.max_trials else "TUNEHUB_MAX_JOB_TRIALS"
        raise InvalidSpec("budget.max_trials", f"at most {limit_trials} trials per job ({whose})")
    limit_secs = own.max_secs or settings.max_job_secs
    if max_secs > limit_secs:
        whose = f"the limit of key {key.label}" if own.max_secs else "TUNEHUB_MAX_JOB_SECS"
        raise InvalidSpec(
            "budget.max_secs",
            f"at most {limit_secs:g} s ({limit_secs / 3600:.3g} h) of tuning per job ({whose})",
        )


@router.get("", response_model=JobListOut, operation_id="list_jobs", summary="List jobs")
def list_jobs(
    store: StoreDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0,
    state: Annotated[JobState | None, Query(description="Only jobs in this state.")] = None,
) -> JobListOut:
    """Jobs, newest first."""
    states = (state,) if state else ()
    jobs = store.list_jobs(limit=limit, offset=offset, states=states)
    return JobListOut(
        items=job_outs(store, jobs, live_target_keys(store)),
        total=store.count_jobs(states=states),
        limit=limit,
        offset=offset,
    )


@router.get("/{job_id}", response_model=JobOut, operation_id="get_job", summary="Show a job")
def get_job(job_id: JobId, store: StoreDep) -> JobOut:
    """The job, its progress, and `best`: the schedule the lookup serves for its workload
    (confirmed, or the best trial so far) with its speedup over the library."""
    (out,) = job_outs(store, [_get_job(store, job_id)])
    return out


@router.get(
    "/{job_id}/records",
    response_model=RecordListOut,
    operation_id="list_job_records",
    summary="Every measurement of a job",
)
def list_job_records(
    job_id: JobId,
    store: StoreDep,
    after: Annotated[
        int | None,
        Query(ge=0, le=2**62, description="Only records stored after this `seq` (a cursor)."),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description="At most this many.")] = MAX_PAGE,
) -> RecordListOut:
    """The job's records in the order they were stored, failures included (with their
    status and error), a page at a time: pass the last page's `next_after` as `after` to
    get only what is new."""
    _get_job(store, job_id)
    records = store.job_records(job_id, after=after, limit=limit)
    before = store.count_job_records(job_id, through=after) if after else 0
    total = store.count_job_records(job_id)
    return RecordListOut(
        items=[RecordOut.from_core(r, before + i) for i, r in enumerate(records, 1)],
        total=total,
        next_after=records[-1].seq if records else after,
    )


@router.get(
    "/{job_id}/baselines",
    response_model=BaselineListOut,
    operation_id="list_job_baselines",
    summary="The vendor library's times for the job's workload",
)
def list_job_baselines(job_id: JobId, store: StoreDep) -> BaselineListOut:
    """The vendor library (OpenBLAS through numpy, cuBLAS through torch) timed for the job's
    workload on its target, per config, as a runner measured it before tuning; empty until
    then."""
    job = _get_job(store, job_id)
    records = store.list_baselines(
        workload_key=job.spec.workload.key, target_key=job.spec.target_key
    )
    return BaselineListOut.model_validate({"items": [baseline_dict(r) for r in records]})


@router.post(
    "/{job_id}/cancel",
    response_model=JobOut,
    operation_id="cancel_job",
    summary="Cancel a job",
    responses=KEY_RESPONSES,
)
def cancel_job(job_id: JobId, store: StoreDep, key: CancelKey) -> JobOut:
    """Cancel a queued or running job; a running one stops within a second or two (the
    candidates in flight are killed and recorded as `cancelled`).

    Needs the key that submitted the job (scope `write`), or a key of scope `admin`.
    Cancelling a finished job changes nothing and returns it as it is.
    """
    job = _get_job(store, job_id)
    if job.api_key_id != key.id and not key.scope.allows(Scope.ADMIN):
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            detail=f"job {job_id} was not submitted by key {key.label}; cancelling it needs "
            "the key that submitted it or a key of scope admin",
        )
    job = store.set_job_state(
        job_id,
        JobState.CANCELLED,
        error="cancelled by request",
        only_from=(JobState.QUEUED, JobState.RUNNING),
    )
    (out,) = job_outs(store, [job])
    return out
