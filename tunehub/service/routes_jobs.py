"""Routes of the jobs resource: submit, list, show, records, cancel."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query, status

from tunehub.core import Budget, InvalidSpec, Job, JobSpec, JobState, utc_now
from tunehub.core.registry import UnknownName
from tunehub.core.worker import LIVE_SECS
from tunehub.db.store import JobNotFound, ScheduleStore
from tunehub.kernels.registry import get_template
from tunehub.service.deps import LocalTargetsDep, StoreDep, resolve_target
from tunehub.service.schemas import (
    BaselineListOut,
    JobListOut,
    JobOut,
    JobRequest,
    RecordListOut,
    RecordOut,
)
from tunehub.tuner import baseline_dict, strategy_names

router = APIRouter(prefix="/api/v1/jobs", tags=["jobs"])

JobId = Annotated[int, Path(ge=1, le=2**31 - 1, description="Job id.")]
MAX_PAGE = 1000


def live_target_keys(store: ScheduleStore) -> set[str]:
    """Targets with a worker that reported within the last LIVE_SECS."""
    since = utc_now() - timedelta(seconds=LIVE_SECS)
    return {w.target_key for w in store.list_workers(live_since=since)}


def job_out(store: ScheduleStore, job: Job, live: set[str] | None = None) -> JobOut:
    target = store.get_target(job.spec.target_key)
    waiting = None
    if job.state is JobState.QUEUED:
        live = live_target_keys(store) if live is None else live
        if job.spec.target_key not in live:
            label = target.short_label if target else job.spec.target_key[:12]
            waiting = f"waiting for a worker of target {label}"
    return JobOut.from_core(job, target, waiting_for=waiting)


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
)
def submit_job(body: JobRequest, store: StoreDep, local: LocalTargetsDep) -> JobOut:
    """Validate the request, store a QUEUED job and return it; a worker of its target runs it
    (it waits in the queue, saying so, while no worker of the target is live)."""
    try:
        workload = body.workload.to_core()
    except InvalidSpec as exc:  # rules that span fields, e.g. the m*n*k limit
        raise InvalidSpec(f"workload.{exc.field}", exc.reason) from None
    target = resolve_target(store, body.target, local=local)
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
    return job_out(store, store.create_job(spec))


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
    live = live_target_keys(store)
    return JobListOut(
        items=[job_out(store, j, live) for j in jobs],
        total=store.count_jobs(states=states),
        limit=limit,
        offset=offset,
    )


@router.get("/{job_id}", response_model=JobOut, operation_id="get_job", summary="Show a job")
def get_job(job_id: JobId, store: StoreDep) -> JobOut:
    return job_out(store, _get_job(store, job_id))


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
    "/{job_id}/cancel", response_model=JobOut, operation_id="cancel_job", summary="Cancel a job"
)
def cancel_job(job_id: JobId, store: StoreDep) -> JobOut:
    """Cancel a queued or running job; a running one stops within a second or two (the
    candidates in flight are killed and recorded as `cancelled`).

    Cancelling a finished job changes nothing and returns it as it is.
    """
    _get_job(store, job_id)
    job = store.set_job_state(
        job_id,
        JobState.CANCELLED,
        error="cancelled by request",
        only_from=(JobState.QUEUED, JobState.RUNNING),
    )
    return job_out(store, job)
