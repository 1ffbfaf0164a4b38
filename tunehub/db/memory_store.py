"""MemoryScheduleStore: the in-memory ScheduleStore double for fast tests and throwaway runs."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from tunehub.core import (
    ApiKey,
    AutotuneResult,
    Config,
    Confirmation,
    Job,
    JobSpec,
    JobState,
    KeyLimits,
    MeasureRecord,
    MeasureStatus,
    ModelInfo,
    Schedule,
    Scope,
    Target,
    Worker,
    Workload,
    utc_now,
)
from tunehub.core.apikey import NO_LIMITS
from tunehub.core.fairshare import (
    FairShare,
    JobTime,
    OwnerQueue,
    QueuedJob,
    fair_order,
    owner_usage,
)
from tunehub.core.job import PERSON_PRIORITY
from tunehub.core.owner import DEFAULT_LEASE_SECS
from tunehub.db.common import (
    ACTIVE_STATES,
    CHANGE_LOOKBACK_IDS,
    CHANGE_MAX_LISTED,
    changes_since,
    check_baseline,
    check_model,
    check_page,
    check_queue,
    check_records,
    check_sort,
    check_spec,
    check_target,
    check_tuning_secs,
    check_worker,
    confirmed_schedule,
    fastest_ok,
    job_times,
    jobs_floor,
    lease_end,
    listing_sort_value,
    record_floor,
    replaces,
    replayed_counts,
    replayed_secs,
    schedule_key,
    schedule_of,
    trials_of,
    unknown_target,
)
from tunehub.db.store import (
    ApiKeyNotFound,
    ChangeMark,
    JobNotFound,
    LeaseLost,
    LookupChanges,
    ScheduleListing,
    ScheduleStore,
    TunedShape,
)


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
        # uid -> record, with its seq (1, 2, ... in commit order, by uid within one commit,
        # as SqlScheduleStore's row ids are).
        self._records: dict[str, MeasureRecord] = {}
        self._schedules: dict[tuple[str, str, str], Schedule] = {}
        # (workload_key, target_key, template, config_key) -> uid of the latest ok record
        self._baselines: dict[tuple[str, str, str, str], str] = {}
        self._workers: dict[str, Worker] = {}
        self._api_keys: dict[int, ApiKey] = {}
        # job id -> its place in the queue (the order in which jobs last became QUEUED)
        self._queued_at: dict[int, int] = {}
        self._queue_ticks = 0
        self._models: dict[int, tuple[ModelInfo, bytes]] = {}
        self._autotune: dict[str, AutotuneResult] = {}

    # --- targets and workloads -------------------------------------------------------------
    def put_target(self, target: Target) -> None:
        check_target(target)
        with self._lock:
            self._put_target(target)

    def get_target(self, target_key: str) -> Target | None:
        with self._lock:
            target = self._targets.get(target_key)
        return None if target is None else _copy_target(target)

    def get_targets(self, target_keys: Collection[str]) -> dict[str, Target]:
        with self._lock:
            found = {k: self._targets[k] for k in set(target_keys) if k in self._targets}
        return {k: _copy_target(t) for k, t in found.items()}

    def list_targets(self) -> list[Target]:
        with self._lock:
            targets = [_copy_target(t) for t in self._targets.values()]
        return sorted(targets, key=lambda t: (t.kind, t.name, t.target_key))

    def put_workload(self, workload: Workload) -> None:
        with self._lock:
            self._workloads.setdefault(workload.key, workload)

    def get_workload(self, workload_key: str) -> Workload | None:
        with self._lock:
            return self._workloads.get(workload_key)

    def get_workloads(self, workload_keys: Collection[str]) -> dict[str, Workload]:
        with self._lock:
            return {k: self._workloads[k] for k in set(workload_keys) if k in self._workloads}

    # --- workers ---------------------------------------------------------------------------
    def register_worker(self, worker: Worker) -> None:
        check_worker(worker)
        with self._lock:
            if worker.target_key not in self._targets:
                raise unknown_target(worker.target_key)
            known = self._workers.get(worker.worker_id)
            started = known.started_at if known else worker.started_at
            self._workers[worker.worker_id] = dataclasses.replace(
                worker, started_at=started, info=_json_copy(worker.info)
            )

    def heartbeat_worker(self, worker_id: str, *, at: datetime | None = None) -> bool:
        with self._lock:
            worker = self._workers.get(worker_id)
            if worker is None:
                return False
            self._workers[worker_id] = dataclasses.replace(worker, heartbeat_at=at or utc_now())
            return True

    def remove_worker(self, worker_id: str) -> None:
        with self._lock:
            self._workers.pop(worker_id, None)

    def list_workers(
        self, *, target_key: str | None = None, live_since: datetime | None = None
    ) -> list[Worker]:
        with self._lock:
            found = [
                w
                for w in self._workers.values()
                if (target_key is None or w.target_key == target_key)
                and (live_since is None or w.heartbeat_at >= live_since)
            ]
        return sorted(found, key=lambda w: (w.started_at, w.worker_id))

    # --- jobs ------------------------------------------------------------------------------
    def create_job(
        self,
        spec: JobSpec,
        *,
        claimed: bool = False,
        owner: str = "",
        lease_secs: float = DEFAULT_LEASE_SECS,
        api_key_id: int | None = None,
        max_active_for_key: int | None = None,
        max_active_total: int | None = None,
        priority: int = PERSON_PRIORITY,
        max_active_at_priority: int | None = None,
    ) -> Job:
        """Store a QUEUED (or claimed: RUNNING) job; its target must be stored first."""
        check_spec(spec)
        now = utc_now()
        lease = lease_end(now, lease_secs) if claimed else None
        with self._lock:
            if spec.target_key not in self._targets:
                raise unknown_target(spec.target_key)
            if api_key_id is not None and api_key_id not in self._api_keys:
                raise ApiKeyNotFound(api_key_id)
            if (
                max_active_for_key is not None
                or max_active_total is not None
                or max_active_at_priority is not None
            ):
                active = self._select_jobs(ACTIVE_STATES)
                check_queue(
                    # Of the same priority: a key's lookup jobs have their own bound.
                    for_key=sum(
                        1 for j in active if j.api_key_id == api_key_id and j.priority == priority
                    ),
                    key_limit=max_active_for_key if api_key_id is not None else None,
                    total=len(active),
                    total_limit=max_active_total,
                    at_priority=sum(1 for j in active if j.priority == priority),
                    priority_limit=max_active_at_priority,
                )
            self._workloads.setdefault(spec.workload.key, spec.workload)
            job = Job(
                id=self._next_job_id,
                spec=spec,
                state=JobState.RUNNING if claimed else JobState.QUEUED,
                trials_done=0,
                created_at=now,
                started_at=now if claimed else None,
                owner=owner if claimed else "",
                lease_expires_at=lease,
                api_key_id=api_key_id,
                priority=priority,
            )
            self._next_job_id += 1
            self._jobs[job.id] = job
            self._enqueue(job.id)
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

    def count_jobs(
        self,
        *,
        states: Sequence[JobState] = (),
        target_keys: Collection[str] | None = None,
        api_key_id: int | None = None,
        min_priority: int | None = None,
    ) -> int:
        with self._lock:
            return sum(
                1
                for job in self._select_jobs(states)
                if (target_keys is None or job.spec.target_key in target_keys)
                and (api_key_id is None or job.api_key_id == api_key_id)
                and (min_priority is None or job.priority >= min_priority)
            )

    def owner_queues(
        self, *, target_keys: Collection[str], since: datetime, min_priority: int | None = None
    ) -> list[OwnerQueue]:
        owners: dict[int | None, OwnerQueue] = {}
        with self._lock:
            for job in self._jobs.values():
                if job.spec.target_key not in target_keys or (
                    min_priority is not None and job.priority < min_priority
                ):
                    continue
                if job.state not in ACTIVE_STATES and (
                    job.finished_at is None or job.finished_at < since
                ):
                    continue
                queued = job.state is JobState.QUEUED
                had = owners.get(job.api_key_id, OwnerQueue(job.api_key_id, 0, None, None))
                first, last = had.first_created_at, had.last_started_at
                if queued and (first is None or job.created_at < first):
                    first = job.created_at
                if job.started_at is not None and (last is None or job.started_at > last):
                    last = job.started_at
                owners[job.api_key_id] = OwnerQueue(
                    job.api_key_id, had.queued + queued, first, last
                )
        return [owner for owner in owners.values() if owner.queued]

    def active_jobs(
        self, *, workload_keys: Collection[str], target_keys: Collection[str]
    ) -> list[Job]:
        workloads, targets = set(workload_keys), set(target_keys)
        with self._lock:
            found = [
                job
                for job in self._select_jobs(ACTIVE_STATES)
                if job.spec.workload.key in workloads and job.spec.target_key in targets
            ]
        return sorted(found, key=lambda job: job.id)

    def claim_job(
        self,
        *,
        owner: str = "",
        target_keys: Collection[str] | None = None,
        lease_secs: float = DEFAULT_LEASE_SECS,
        fair_share: FairShare | None = None,
    ) -> Job | None:
        lease_end(utc_now(), lease_secs)
        with self._lock:
            queued = [
                job
                for job in self._jobs.values()
                if job.state is JobState.QUEUED
                and (target_keys is None or job.spec.target_key in target_keys)
            ]
            if not queued:
                return None
            oldest = min(queued, key=lambda job: (-job.priority, self._queued_at[job.id], job.id))
            if fair_share is not None:
                oldest = self._jobs[self._fair_pick(queued, fair_share)]
            now = utc_now()
            resumed = oldest.started_at is not None  # it keeps its first start
            claimed = dataclasses.replace(
                oldest,
                state=JobState.RUNNING,
                started_at=oldest.started_at or now,
                resumes=oldest.resumes + resumed,
                resumed_at=now if resumed else oldest.resumed_at,
                finished_at=None,
                owner=owner,
                lease_expires_at=lease_end(now, lease_secs),
            )
            self._jobs[claimed.id] = claimed
            return claimed

    def _fair_pick(self, queued: Sequence[Job], policy: FairShare) -> int:
        """The id to claim among ``queued`` under ``policy`` (the lock held)."""
        heads: dict[int | None, QueuedJob] = {}
        for job in queued:
            head = QueuedJob(job.id, job.api_key_id, job.priority, self._queued_at[job.id])
            best = heads.get(job.api_key_id)
            if best is None or (-head.priority, head.queue_position) < (
                -best.priority,
                best.queue_position,
            ):
                heads[job.api_key_id] = head
        jobs = [j for j in self._jobs.values() if j.api_key_id in heads]
        usage = owner_usage(
            (
                JobTime(j.api_key_id, j.tuning_secs, j.state in ACTIVE_STATES, j.finished_at)
                for j in jobs
            ),
            window_secs=policy.window_secs,
        )
        running: dict[int | None, int] = {}
        for j in jobs:
            if j.state is JobState.RUNNING:
                running[j.api_key_id] = running.get(j.api_key_id, 0) + 1
        names = {k: self._api_keys[k].name for k in heads if k is not None and k in self._api_keys}
        return fair_order(list(heads.values()), usage, policy, names=names, running=running)[0]

    def renew_leases(
        self, owner: str, job_ids: Collection[int], *, lease_secs: float = DEFAULT_LEASE_SECS
    ) -> set[int]:
        until = lease_end(utc_now(), lease_secs)
        renewed = set()
        with self._lock:
            for job_id in job_ids:
                job = self._jobs.get(job_id)
                if job is not None and job.owner == owner and job.state is JobState.RUNNING:
                    self._jobs[job_id] = dataclasses.replace(job, lease_expires_at=until)
                    renewed.add(job_id)
        return renewed

    def requeue_expired(self, *, now: datetime | None = None) -> list[int]:
        now = now or utc_now()
        requeued = []
        with self._lock:
            for job_id, job in sorted(self._jobs.items()):
                if job.state is JobState.RUNNING and (
                    job.lease_expires_at is None or job.lease_expires_at < now
                ):
                    self._jobs[job_id] = dataclasses.replace(
                        job,
                        state=JobState.QUEUED,
                        owner="",
                        lease_expires_at=None,
                        finished_at=None,
                    )
                    self._enqueue(job_id)
                    requeued.append(job_id)
        return requeued

    def set_job_state(
        self,
        job_id: int,
        state: JobState,
        *,
        error: str = "",
        only_from: Sequence[JobState] = (),
        owner: str | None = None,
    ) -> Job:
        state = JobState(state)
        with self._lock:
            job = self._job(job_id)
            if only_from and job.state not in only_from:
                return job
            if owner is not None and job.owner != owner:
                return job
            started_at, finished_at = job_times(state, job.started_at, job.finished_at, utc_now())
            moved = dataclasses.replace(
                job,
                state=state,
                error=error,
                started_at=started_at,
                finished_at=finished_at,
                owner="" if state is JobState.QUEUED else job.owner,
                lease_expires_at=job.lease_expires_at if state is JobState.RUNNING else None,
            )
            self._jobs[job_id] = moved
            if state is JobState.QUEUED:
                self._enqueue(job_id)
            return moved

    # --- records and schedules -------------------------------------------------------------
    def commit_records(
        self,
        records: Sequence[MeasureRecord],
        *,
        tuning_secs: Mapping[int, float] | None = None,
        owner: str | None = None,
        replayed: bool = False,
    ) -> int:
        """Store records and update job progress, job bests and Schedules in one step.

        Every record's job_id must name a stored job, else JobNotFound and nothing is stored;
        with ``owner``, one that ``owner`` holds, else LeaseLost.
        """
        batch = check_records(records)
        secs = check_tuning_secs(tuning_secs)
        with self._lock:
            job_ids = sorted({r.job_id for r in batch if r.job_id is not None} | set(secs))
            for job_id in job_ids:
                if job_id not in self._jobs:
                    raise JobNotFound(job_id)
            for job_id in job_ids:
                holder = self._jobs[job_id].owner
                if owner is not None and holder != owner:
                    raise LeaseLost(job_id, owner, holder)
            new = []
            # By uid, as SqlScheduleStore inserts them.
            for record in sorted(batch, key=lambda r: r.uid):
                if record.uid in self._records:
                    continue
                record = self._store_record(record)
                new.append(record)
            if replayed:  # a second replay of the same journal changes nothing
                secs = replayed_secs(new, secs)
                for job_id, count in replayed_counts(new).items():
                    job = self._jobs[job_id]
                    self._jobs[job_id] = dataclasses.replace(job, replayed=job.replayed + count)
            self._update_jobs(new, secs)
            self._update_schedules(new)
        return len(new)

    def job_records(
        self, job_id: int, *, after: int | None = None, limit: int | None = None
    ) -> list[MeasureRecord]:
        """A job's records in commit order; raises JobNotFound."""
        check_page(limit or 0, 0)
        with self._lock:
            self._job(job_id)
            found = self._select_records(
                lambda r: r.job_id == job_id and (after is None or (r.seq or 0) > after)
            )
        return found if limit is None else found[:limit]

    def count_job_records(self, job_id: int, *, through: int | None = None) -> int:
        with self._lock:
            self._job(job_id)
            return sum(
                1
                for r in self._records.values()
                if r.job_id == job_id and (through is None or (r.seq or 0) <= through)
            )

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

    def family_records(
        self,
        *,
        family_key: str,
        template: str,
        template_version: int | None = None,
        limit: int | None = None,
    ) -> list[MeasureRecord]:
        def wanted(record: MeasureRecord) -> bool:
            request = record.request
            return (
                request.target.family_key == family_key
                and request.template == template
                and template_version in (None, request.template_version)
            )

        with self._lock:
            found = self._select_records(wanted)
        return found if limit is None else found[max(0, len(found) - limit) :]

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

    def schedules_for(
        self, *, workload_keys: Collection[str], family_keys: Collection[str]
    ) -> dict[tuple[str, str], list[Schedule]]:
        workloads, families = set(workload_keys), set(family_keys)
        with self._lock:
            found = [
                (s, self._targets[t].family_key)
                for (w, t, _), s in self._schedules.items()
                if w in workloads and self._targets[t].family_key in families
            ]
        found.sort(key=lambda sf: (sf[0].median_secs, sf[0].target_key, sf[0].template))
        out: dict[tuple[str, str], list[Schedule]] = {}
        for schedule, family_key in found:
            out.setdefault((schedule.workload_key, family_key), []).append(schedule)
        return out

    def target_schedules(self, *, target_key: str, template: str | None = None) -> list[Schedule]:
        with self._lock:
            found = [
                s
                for (_, t, tpl), s in self._schedules.items()
                if t == target_key and template in (None, tpl)
            ]
        found.sort(key=lambda s: (s.workload_key, s.template))
        return found

    def tuned_shapes(
        self,
        *,
        target_key: str,
        template: str,
        template_version: int,
        workload_keys: Collection[str] | None = None,
    ) -> list[TunedShape]:
        wanted = None if workload_keys is None else set(workload_keys)
        with self._lock:
            found = []
            for (w, t, tpl), s in self._schedules.items():
                if t != target_key or tpl != template or s.template_version != template_version:
                    continue
                workload = self._workloads.get(w)
                if workload is None or (wanted is not None and w not in wanted):
                    continue
                found.append(
                    TunedShape(
                        w,
                        workload.op,
                        workload.m,
                        workload.n,
                        workload.k,
                        workload.dtype,
                        workload.a_layout,
                        workload.b_layout,
                        workload.epilogue,
                        json.dumps(s.config.to_dict(), sort_keys=True),
                    )
                )
        found.sort(key=lambda shape: shape.workload_key)
        return found

    def list_schedules(
        self,
        *,
        target_key: str | None = None,
        template: str | None = None,
        dtype: str | None = None,
        op: str | None = None,
        sort: str = "updated_at",
        descending: bool = True,
        limit: int = 50,
        offset: int = 0,
    ) -> tuple[list[ScheduleListing], int]:
        check_page(limit, offset)
        check_sort(sort)
        with self._lock:
            fastest: dict[tuple[str, str], float] = {}
            for (w, t, _, _), uid in self._baselines.items():
                secs = self._records[uid].result.median_secs
                if secs is not None and secs < fastest.get((w, t), float("inf")):
                    fastest[(w, t)] = secs
            found = [
                ScheduleListing(s, self._workloads[w], fastest.get((w, t)))
                for (w, t, tpl), s in self._schedules.items()
                if target_key in (None, t)
                and template in (None, tpl)
                and dtype in (None, self._workloads[w].dtype)
                and op in (None, self._workloads[w].op)
            ]

        found.sort(
            key=lambda i: (i.schedule.workload_key, i.schedule.target_key, i.schedule.template)
        )  # stable: the column's order below keeps these ties in order
        valued = [i for i in found if listing_sort_value(i, sort) is not None]
        valued.sort(key=lambda i: listing_sort_value(i, sort), reverse=descending)
        ordered = valued + [i for i in found if listing_sort_value(i, sort) is None]
        return ordered[offset : offset + limit], len(ordered)

    def confirm_schedule(
        self,
        *,
        workload_key: str,
        target_key: str,
        template: str,
        candidates: Collection[str],
        winner_uid: str,
        confirmation: Confirmation,
    ) -> Schedule | None:
        key = (workload_key, target_key, template)
        with self._lock:
            current = self._schedules.get(key)
            moved = confirmed_schedule(
                current,
                self._records.get(winner_uid),
                candidates,
                _json_copy_confirmation(confirmation),
                utc_now(),
            )
            if moved is not None:
                self._schedules[key] = moved
                return moved
            return current

    # --- baselines -------------------------------------------------------------------------
    def commit_baseline(self, record: MeasureRecord) -> bool:
        check_baseline(record)
        (record,) = check_records([record])
        with self._lock:
            if record.uid in self._records:
                return False
            record = self._store_record(record)
            if record.status is MeasureStatus.OK:
                request = record.request
                key = (
                    request.workload.key,
                    request.target.target_key,
                    request.template,
                    request.config.key,
                )
                self._baselines[key] = record.uid
            return True

    def get_baseline(
        self, *, workload_key: str, target_key: str, template: str, config: Config
    ) -> MeasureRecord | None:
        with self._lock:
            uid = self._baselines.get((workload_key, target_key, template, config.key))
            return None if uid is None else _copy_record(self._records[uid])

    def baselines_for(self, *, workload_keys: Collection[str]) -> list[MeasureRecord]:
        wanted = set(workload_keys)
        with self._lock:
            return [
                _copy_record(self._records[uid])
                for (w, _, _, _), uid in self._baselines.items()
                if w in wanted
            ]

    def list_baselines(self, *, workload_key: str, target_key: str) -> list[MeasureRecord]:
        with self._lock:
            found = [
                self._records[uid]
                for (w, t, _, _), uid in self._baselines.items()
                if (w, t) == (workload_key, target_key)
            ]
        found.sort(key=lambda r: (r.request.template, r.seq or 0))
        return [_copy_record(r) for r in found]

    # --- API keys ------------------------------------------------------------------------
    def create_api_key(
        self,
        *,
        prefix: str,
        secret_hash: str,
        name: str,
        scope: Scope,
        limits: KeyLimits = NO_LIMITS,
    ) -> ApiKey:
        with self._lock:
            if any(k.prefix == prefix for k in self._api_keys.values()):
                raise ValueError(f"prefix: an API key with prefix {prefix!r} exists")
            key = ApiKey(
                id=len(self._api_keys) + 1,
                prefix=prefix,
                name=name,
                scope=Scope(scope),
                created_at=utc_now(),
                secret_hash=secret_hash,
                limits=limits,
            )
            self._api_keys[key.id] = key
            return key

    def get_api_key(self, *, prefix: str | None = None, key_id: int | None = None) -> ApiKey | None:
        if prefix is None and key_id is None:
            raise ValueError("get_api_key: give a prefix or a key_id")
        with self._lock:
            for key in self._api_keys.values():
                if (prefix is None or key.prefix == prefix) and (
                    key_id is None or key.id == key_id
                ):
                    return key
        return None

    def list_api_keys(self) -> list[ApiKey]:
        with self._lock:
            return sorted(self._api_keys.values(), key=lambda k: k.id)

    def revoke_api_key(self, key_id: int) -> ApiKey:
        with self._lock:
            key = self._api_keys.get(key_id)
            if key is None:
                raise ApiKeyNotFound(key_id)
            if key.revoked_at is None:
                key = dataclasses.replace(key, revoked_at=utc_now())
                self._api_keys[key_id] = key
            return key

    # --- cost models -------------------------------------------------------------------------
    def count_family_records(
        self,
        *,
        family_key: str,
        template: str,
        template_version: int | None = None,
        after: int | None = None,
    ) -> int:
        with self._lock:
            return sum(
                1
                for r in self._records.values()
                if r.request.target.family_key == family_key
                and r.request.template == template
                and template_version in (None, r.request.template_version)
                and (after is None or (r.seq or 0) > after)
            )

    def register_model(self, info: ModelInfo, artifact: bytes) -> ModelInfo:
        check_model(info)
        with self._lock:
            version = 1 + max(
                (
                    m.version
                    for m, _ in self._models.values()
                    if (m.family_key, m.template, m.template_version)
                    == (info.family_key, info.template, info.template_version)
                ),
                default=0,
            )
            stored = dataclasses.replace(
                info,
                id=len(self._models) + 1,
                version=version,
                metrics=_json_copy(info.metrics),
                created_at=info.created_at.astimezone(UTC),
            )
            self._models[stored.id] = (stored, bytes(artifact))
            return stored

    def list_models(
        self, *, family_key: str | None = None, template: str | None = None, limit: int = 100
    ) -> list[ModelInfo]:
        check_page(limit, 0)
        with self._lock:
            found = [
                m
                for m, _ in self._models.values()
                if family_key in (None, m.family_key) and template in (None, m.template)
            ]
        return sorted(found, key=lambda m: -m.id)[:limit]

    def latest_model(
        self, *, family_key: str, template: str, template_version: int, accepted_only: bool = False
    ) -> ModelInfo | None:
        found = [
            m
            for m in self.list_models(family_key=family_key, template=template, limit=1 << 30)
            if m.template_version == template_version and (m.accepted or not accepted_only)
        ]
        return found[0] if found else None

    def model_artifact(self, model_id: int) -> bytes | None:
        with self._lock:
            found = self._models.get(model_id)
        return None if found is None else found[1]

    # --- shared autotuning results ----------------------------------------------------------
    def put_autotune(self, result: AutotuneResult) -> tuple[AutotuneResult, bool]:
        with self._lock:
            found = self._autotune.get(result.cache_key)
            if found is not None:
                return found, False
            self._autotune[result.cache_key] = result
            return result, True

    def get_autotune(self, cache_key: str) -> AutotuneResult | None:
        with self._lock:
            return self._autotune.get(cache_key)

    # --- change feed ---------------------------------------------------------------------
    def lookup_changes(self, since: ChangeMark | None = None) -> LookupChanges:
        now = utc_now()
        floor = record_floor(since)
        after = jobs_floor(since, now)
        with self._lock:
            newest = len(self._records)
            records: list[tuple[int, str]] = []
            if floor is not None:
                records = [
                    (r.seq or 0, r.request.workload.key)
                    for r in list(self._records.values())[floor:]
                ][: CHANGE_LOOKBACK_IDS + CHANGE_MAX_LISTED + 1]
            jobs = [
                (job.id, job.spec.workload.key, job.finished_at)
                for job in self._jobs.values()
                if job.finished_at is not None and job.finished_at >= after
            ]
            models = (len(self._models), max(self._models, default=0))
            revoked = [k.revoked_at for k in self._api_keys.values() if k.revoked_at is not None]
            api_keys = (len(self._api_keys), str(max(revoked)) if revoked else "")
        return changes_since(
            since,
            newest_record_id=newest,
            records=records,
            jobs=jobs,
            models=models,
            api_keys=api_keys,
            now=now,
        )

    # --- helpers (called with the lock held) -----------------------------------------------
    def _enqueue(self, job_id: int) -> None:
        self._queue_ticks += 1
        self._queued_at[job_id] = self._queue_ticks

    def _store_record(self, record: MeasureRecord) -> MeasureRecord:
        stored = dataclasses.replace(_copy_record(record), seq=len(self._records) + 1)
        self._put_target(stored.request.target)
        self._workloads.setdefault(stored.request.workload.key, stored.request.workload)
        self._records[stored.uid] = stored
        return stored

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
        found = [r for r in self._records.values() if wanted(r)]
        found.sort(key=lambda r: r.seq or 0)
        return [_copy_record(r) for r in found]

    def _update_jobs(self, new: Sequence[MeasureRecord], secs: Mapping[int, float]) -> None:
        for job_id, count in trials_of(new).items():
            job = self._jobs[job_id]
            self._jobs[job.id] = dataclasses.replace(job, trials_done=job.trials_done + count)
        for job_id, extra in secs.items():
            job = self._jobs[job_id]
            self._jobs[job.id] = dataclasses.replace(job, tuning_secs=job.tuning_secs + extra)
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


def _json_copy_confirmation(confirmation: Confirmation) -> Confirmation:
    return dataclasses.replace(
        confirmation,
        others=_json_copy(confirmation.others),
        confirmed_at=confirmation.confirmed_at.astimezone(UTC),
    )


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
