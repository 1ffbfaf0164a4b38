"""MemoryScheduleStore: the in-memory ScheduleStore double for fast tests and throwaway runs."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable, Sequence
from datetime import UTC
from typing import Any

from tunehub.core import (
    Job,
    JobSpec,
    JobState,
    MeasureRecord,
    MeasureStatus,
    Schedule,
    Target,
    Workload,
    utc_now,
)
from tunehub.db.common import (
    baseline_threads,
    check_baseline,
    check_page,
    check_records,
    check_spec,
    check_target,
    fastest_ok,
    job_times,
    replaces,
    schedule_key,
    schedule_of,
    unknown_target,
)
from tunehub.db.store import JobNotFound, ScheduleStore


class MemoryScheduleStore(ScheduleStore):
    """Dicts behind one lock, behaving as SqlScheduleStore does (ordering, ties, errors).

    Values pass through JSON on the way in, as they do in a database, so an environment or
    toolchain dict changed by the caller later never changes what is stored.

    >>> from tunehub.core import Workload, JobSpec, local_cpu_target
    >>> store = MemoryScheduleStore()
    >>> store.put_target(local_cpu_target())
    >>> job = store.create_job(JobSpec(Workload(64, 64, 64), local_cpu_target().target_key))
    >>> store.claim_job().id == job.id
    True
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._targets: dict[str, Target] = {}
        self._workloads: dict[str, Workload] = {}
        self._jobs: dict[int, Job] = {}
        self._next_job_id = 1
        # uid -> (insertion number, record): the number breaks created_at ties like a row id
        # does: earlier commits first, by uid within one commit.
        self._records: dict[str, tuple[int, MeasureRecord]] = {}
        self._schedules: dict[tuple[str, str, str], Schedule] = {}
        # (workload_key, target_key, template, threads) -> uid of the latest ok record
        self._baselines: dict[tuple[str, str, str, int], str] = {}

    # --- targets and workloads -------------------------------------------------------------
    def put_target(self, target: Target) -> None:
        check_target(target)
        with self._lock:
            self._put_target(target)

    def get_target(self, target_key: str) -> Target | None:
        with self._lock:
            target = self._targets.get(target_key)
        return None if target is None else _copy_target(target)

    def put_workload(self, workload: Workload) -> None:
        with self._lock:
            self._workloads.setdefault(workload.key, workload)

    def get_workload(self, workload_key: str) -> Workload | None:
        with self._lock:
            return self._workloads.get(workload_key)

    # --- jobs ------------------------------------------------------------------------------
    def create_job(self, spec: JobSpec, *, claimed: bool = False, owner: str = "") -> Job:
        """Store a QUEUED (or claimed: RUNNING) job; its target must be stored first."""
        check_spec(spec)
        now = utc_now()
        with self._lock:
            if spec.target_key not in self._targets:
                raise unknown_target(spec.target_key)
            self._workloads.setdefault(spec.workload.key, spec.workload)
            job = Job(
                id=self._next_job_id,
                spec=spec,
                state=JobState.RUNNING if claimed else JobState.QUEUED,
                trials_done=0,
                created_at=now,
                started_at=now if claimed else None,
                owner=owner if claimed else "",
            )
            self._next_job_id += 1
            self._jobs[job.id] = job
            return job

    def get_job(self, job_id: int) -> Job:
        with self._lock:
            return self._job(job_id)

    def list_jobs(
        self, *, limit: int = 50, offset: int = 0, states: Sequence[JobState] = ()
    ) -> list[Job]:
        check_page(limit, offset)
        with self._lock:
            jobs = self._select_jobs(states)
        jobs.sort(key=lambda job: job.id, reverse=True)
        return jobs[offset : offset + limit]

    def count_jobs(self, *, states: Sequence[JobState] = ()) -> int:
        with self._lock:
            return len(self._select_jobs(states))

    def claim_job(self, *, owner: str = "") -> Job | None:
        with self._lock:
            queued = [job for job in self._jobs.values() if job.state is JobState.QUEUED]
            if not queued:
                return None
            oldest = min(queued, key=lambda job: job.id)
            claimed = dataclasses.replace(
                oldest, state=JobState.RUNNING, started_at=utc_now(), finished_at=None, owner=owner
            )
            self._jobs[claimed.id] = claimed
            return claimed

    def set_job_state(
        self,
        job_id: int,
        state: JobState,
        *,
        error: str = "",
        only_from: Sequence[JobState] = (),
    ) -> Job:
        state = JobState(state)
        with self._lock:
            job = self._job(job_id)
            if only_from and job.state not in only_from:
                return job
            started_at, finished_at = job_times(state, job.started_at, job.finished_at, utc_now())
            moved = dataclasses.replace(
                job,
                state=state,
                error=error,
                started_at=started_at,
                finished_at=finished_at,
                owner=job.owner if state is JobState.RUNNING else "",
            )
            self._jobs[job_id] = moved
            return moved

    # --- records and schedules -------------------------------------------------------------
    def commit_records(self, records: Sequence[MeasureRecord]) -> int:
        """Store records and update job progress, job bests and Schedules in one step.

        Every record's job_id must name a stored job, else JobNotFound and nothing is stored.
        """
        batch = check_records(records)
        with self._lock:
            for job_id in sorted({r.job_id for r in batch if r.job_id is not None}):
                if job_id not in self._jobs:
                    raise JobNotFound(job_id)
            new = [_copy_record(r) for r in batch if r.uid not in self._records]
            # By uid, as SqlScheduleStore inserts them: the order breaks created_at ties.
            for record in sorted(new, key=lambda r: r.uid):
                self._put_target(record.request.target)
                self._workloads.setdefault(record.request.workload.key, record.request.workload)
                self._records[record.uid] = (len(self._records), record)
            self._update_jobs(new)
            self._update_schedules(new)
        return len(new)

    def job_records(self, job_id: int) -> list[MeasureRecord]:
        """All records of a job, oldest first; raises JobNotFound."""
        with self._lock:
            self._job(job_id)
            return self._select_records(lambda r: r.job_id == job_id)

    def records_for(
        self, *, workload_key: str, target_key: str, template: str | None = None
    ) -> list[MeasureRecord]:
        def wanted(record: MeasureRecord) -> bool:
            request = record.request
            return (
                request.workload.key == workload_key
                and request.target.target_key == target_key
                and (template is None or request.template == template)
            )

        with self._lock:
            return self._select_records(wanted)

    def get_schedule(
        self, *, workload_key: str, target_key: str, template: str | None = None
    ) -> Schedule | None:
        with self._lock:
            found = [
                s
                for (w, t, tpl), s in self._schedules.items()
                if w == workload_key and t == target_key and template in (None, tpl)
            ]
        found.sort(key=lambda s: (s.median_secs, s.template))
        return found[0] if found else None

    def family_schedules(
        self, *, workload_key: str, family_key: str, template: str | None = None
    ) -> list[Schedule]:
        with self._lock:
            found = [
                s
                for (w, t, tpl), s in self._schedules.items()
                if w == workload_key
                and self._targets[t].family_key == family_key
                and template in (None, tpl)
            ]
        found.sort(key=lambda s: (s.median_secs, s.target_key, s.template))
        return found

    def target_schedules(self, *, target_key: str, template: str | None = None) -> list[Schedule]:
        with self._lock:
            found = [
                s
                for (_, t, tpl), s in self._schedules.items()
                if t == target_key and template in (None, tpl)
            ]
        found.sort(key=lambda s: (s.workload_key, s.template))
        return found

    # --- helpers (called with the lock held) -----------------------------------------------
    # --- baselines -------------------------------------------------------------------------
    def commit_baseline(self, record: MeasureRecord) -> bool:
        check_baseline(record)
        (record,) = check_records([record])
        with self._lock:
            if record.uid in self._records:
                return False
            record = _copy_record(record)
            self._put_target(record.request.target)
            self._workloads.setdefault(record.request.workload.key, record.request.workload)
            self._records[record.uid] = (len(self._records), record)
            if record.status is MeasureStatus.OK:
                request = record.request
                key = (
                    request.workload.key,
                    request.target.target_key,
                    request.template,
                    baseline_threads(record),
                )
                self._baselines[key] = record.uid
            return True

    def get_baseline(
        self, *, workload_key: str, target_key: str, threads: int, template: str | None = None
    ) -> MeasureRecord | None:
        with self._lock:
            found = [
                self._records[uid][1]
                for (w, t, tmpl, n), uid in self._baselines.items()
                if (w, t, n) == (workload_key, target_key, threads)
                and (template is None or tmpl == template)
            ]
        found.sort(key=lambda r: (r.median_secs or 0.0, r.request.template))
        return found[0] if found else None

    def _put_target(self, target: Target) -> None:
        if target.target_key not in self._targets:
            self._targets[target.target_key] = _copy_target(target)

    def _job(self, job_id: int) -> Job:
        job = self._jobs.get(job_id)
        if job is None:
            raise JobNotFound(job_id)
        return job

    def _select_jobs(self, states: Sequence[JobState]) -> list[Job]:
        wanted = {JobState(s) for s in states}
        return [job for job in self._jobs.values() if not wanted or job.state in wanted]

    def _select_records(self, wanted: Callable[[MeasureRecord], bool]) -> list[MeasureRecord]:
        found = [(r.created_at, n, r) for n, r in self._records.values() if wanted(r)]
        found.sort(key=lambda item: (item[0], item[1]))
        return [_copy_record(r) for _, _, r in found]

    def _update_jobs(self, new: Sequence[MeasureRecord]) -> None:
        for record in new:
            if record.job_id is not None:
                job = self._jobs[record.job_id]
                self._jobs[job.id] = dataclasses.replace(job, trials_done=job.trials_done + 1)
        for job_id, record in fastest_ok(new, lambda r: r.job_id).items():
            job = self._jobs[job_id]
            median = record.median_secs
            if median is not None and (
                job.best_median_secs is None or median < job.best_median_secs
            ):
                self._jobs[job.id] = dataclasses.replace(
                    job, best_record_uid=record.uid, best_median_secs=median
                )

    def _update_schedules(self, new: Sequence[MeasureRecord]) -> None:
        now = utc_now()
        for key, record in fastest_ok(new, schedule_key).items():
            current = self._schedules.get(key)
            median = record.median_secs
            if median is not None and (
                current is None or replaces(record.request.template_version, median, current)
            ):
                self._schedules[key] = schedule_of(record, now)


def _json_copy(value: Any) -> Any:
    return json.loads(json.dumps(value))


def _copy_target(target: Target) -> Target:
    return Target.from_dict(_json_copy(target.to_dict()))


def _copy_record(record: MeasureRecord) -> MeasureRecord:
    """A copy sharing nothing mutable with ``record``, normalised as a database would."""
    request = dataclasses.replace(record.request, target=_copy_target(record.request.target))
    result = dataclasses.replace(record.result, environment=_json_copy(record.result.environment))
    return dataclasses.replace(
        record,
        request=request,
        result=result,
        created_at=record.created_at.astimezone(UTC),
    )
