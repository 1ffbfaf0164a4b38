"""Routes of the jobs resource: submit, list, show, records, cancel."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query, status

from tunehub.core import Budget, InvalidSpec, Job, JobSpec, JobState
from tunehub.db.store import JobNotFound, ScheduleStore
from tunehub.kernels.registry import UnknownTemplate, get_template
from tunehub.service.deps import StoreDep, resolve_target
from tunehub.service.schemas import (
    BaselineListOut,
    JobListOut,
    JobOut,
    JobRequest,
    RecordListOut,
    RecordOut,
)
from tunehub.tuner import baseline_dict, target_baselines

router = APIRouter(prefix="/api/v1/jobs", tags=["jobs"])

JobId = Annotated[int, Path(ge=1, le=2**31 - 1, description="Job id.")]


def job_out(store: ScheduleStore, job: Job) -> JobOut:
    return JobOut.from_core(job, store.get_target(job.spec.target_key))


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
def submit_job(body: JobRequest, store: StoreDep) -> JobOut:
    """Validate the request, store a QUEUED job and return it; the job runner tunes it."""
    try:
        workload = body.workload.to_core()
    except InvalidSpec as exc:  # rules that span fields, e.g. the m*n*k limit
        raise InvalidSpec(f"workload.{exc.field}", exc.reason) from None
    target = resolve_target(store, body.target)
    try:
        template = get_template(body.template)
    except UnknownTemplate as exc:
        raise InvalidSpec("template", str(exc.args[0])) from None
    reason = template.supports(workload, target)
    if reason is not None:
        raise InvalidSpec("template", reason)
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
    return JobListOut(
        items=[job_out(store, j) for j in jobs],
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
def list_job_records(job_id: JobId, store: StoreDep) -> RecordListOut:
    """Every record of the job, oldest first, failures included (with their status and error)."""
    _get_job(store, job_id)
    records = store.job_records(job_id)
    return RecordListOut(items=[RecordOut.from_core(r, i) for i, r in enumerate(records, 1)])


@router.get(
    "/{job_id}/baselines",
    response_model=BaselineListOut,
    operation_id="list_job_baselines",
    summary="The vendor library's times for the job's workload",
)
def list_job_baselines(job_id: JobId, store: StoreDep) -> BaselineListOut:
    """OpenBLAS (through numpy) timed for the job's workload on its target, per thread count,
    as the job's runner measured it before tuning; empty until then."""
    job = _get_job(store, job_id)
    target = store.get_target(job.spec.target_key)
    if target is None:
        return BaselineListOut(items=[])
    records = target_baselines(store, job.spec.workload, target)
    return BaselineListOut.model_validate({"items": [baseline_dict(r) for r in records]})


@router.post(
    "/{job_id}/cancel", response_model=JobOut, operation_id="cancel_job", summary="Cancel a job"
)
def cancel_job(job_id: JobId, store: StoreDep) -> JobOut:
    """Cancel a queued or running job; the runner stops it after the batch in flight.

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
