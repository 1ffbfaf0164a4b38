"""SqlScheduleStore: the ScheduleStore on SQLite or PostgreSQL through SQLAlchemy 2.0."""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Integer,
    Select,
    String,
    Text,
    bindparam,
    case,
    cast,
    func,
    select,
    text,
    tuple_,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from tunehub.core import (
    ApiKey,
    AutotuneResult,
    Budget,
    Config,
    Confirmation,
    InvalidSpec,
    Job,
    JobSpec,
    JobState,
    KeyLimits,
    MeasureRecord,
    MeasureRequest,
    MeasureResult,
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
from tunehub.db.async_lookup import AsyncLookups
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
    record_floor,
    replayed_counts,
    replayed_secs,
    schedule_key,
    schedule_of,
    trials_of,
    unknown_target,
)
from tunehub.db.engine import (
    lookup_engine,
    make_engine,
    ping,
    read_once,
    safe_url,
    session_scope,
    write_engine,
)
from tunehub.db.store import (
    IN_CHUNK,
    ApiKeyNotFound,
    ChangeMark,
    JobNotFound,
    LeaseLost,
    LookupChanges,
    ScheduleListing,
    ScheduleStore,
    TunedShape,
)
from tunehub.db.tables import (
    ApiKeyRow,
    AutotuneRow,
    Base,
    BaselineRow,
    JobRow,
    ModelRow,
    RecordRow,
    ScheduleRow,
    TargetRow,
    WorkerRow,
    WorkloadRow,
    table,
)

log = logging.getLogger(__name__)

SUPPORTED_DIALECTS = ("sqlite", "postgresql")

_Insert = postgresql.Insert | sqlite.Insert


class SqlScheduleStore(ScheduleStore):
    """The ScheduleStore on a database at head (see ``tunehub.db.migrate.upgrade``).

    Give it a URL (the store owns the engine and disposes of it on ``close``) or an Engine made
    by ``make_engine`` (the caller owns it). One sessionmaker, one session per call, so one
    store serves every thread. Writes that read first (``commit_records``, ``claim_job``, …)
    hold SQLite's write lock from their first statement and rely on row locks, ``ON CONFLICT``
    and conditional updates on PostgreSQL, so several processes may share one database.

    >>> from tunehub.db import make_engine, upgrade
    >>> engine = make_engine("sqlite://")
    >>> upgrade(engine)
    >>> SqlScheduleStore(engine).count_jobs()
    0
    """

    def __init__(self, url_or_engine: str | Engine) -> None:
        if isinstance(url_or_engine, Engine):
            engine, self._owns_engine = url_or_engine, False
        else:
            engine, self._owns_engine = make_engine(url_or_engine), True
        if engine.dialect.name not in SUPPORTED_DIALECTS:
            raise ValueError(
                f"database: dialect {engine.dialect.name!r} is not supported; "
                f"use one of {', '.join(SUPPORTED_DIALECTS)}"
            )
        self._engine = engine
        self._read = sessionmaker(engine, expire_on_commit=False)
        self._write = sessionmaker(write_engine(engine), expire_on_commit=False)
        self._lookups = lookup_engine(engine)
        self._async_lookups: AsyncLookups | None = None
        if engine.dialect.name == "postgresql":
            queries = _LookupQueries.get()
            self._async_lookups = AsyncLookups(
                self._lookups, queries.schedules, queries.template_schedules
            )

    def __repr__(self) -> str:
        return f"SqlScheduleStore({safe_url(self._engine.url)!r})"

    @property
    def engine(self) -> Engine:
        return self._engine

    def close(self) -> None:
        if self._owns_engine:
            if self._lookups is not self._engine:
                self._lookups.dispose()
            self._engine.dispose()

    def ping(self, *, timeout_secs: float = 1.0) -> None:
        ping(self._engine, timeout_secs=timeout_secs)

    # --- targets and workloads -------------------------------------------------------------
    def put_target(self, target: Target) -> None:
        check_target(target)
        with session_scope(self._write) as session:
            self._put_targets(session, [target])

    def get_target(self, target_key: str) -> Target | None:
        with session_scope(self._read) as session:
            row = session.get(TargetRow, target_key)
            return None if row is None else _target(row)

    def get_targets(self, target_keys: Collection[str]) -> dict[str, Target]:
        found: dict[str, Target] = {}
        with session_scope(self._read) as session:
            for chunk in _chunks(target_keys):
                query = select(TargetRow).where(TargetRow.target_key.in_(chunk))
                found.update((row.target_key, _target(row)) for row in session.scalars(query))
        return found

    def list_targets(self) -> list[Target]:
        query = select(TargetRow).order_by(TargetRow.kind, TargetRow.name, TargetRow.target_key)
        with session_scope(self._read) as session:
            return [_target(row) for row in session.scalars(query)]

    def put_workload(self, workload: Workload) -> None:
        with session_scope(self._write) as session:
            self._put_workloads(session, [workload])

    def get_workload(self, workload_key: str) -> Workload | None:
        with session_scope(self._read) as session:
            row = session.get(WorkloadRow, workload_key)
            return None if row is None else _workload(row)

    def get_workloads(self, workload_keys: Collection[str]) -> dict[str, Workload]:
        found: dict[str, Workload] = {}
        with session_scope(self._read) as session:
            for chunk in _chunks(workload_keys):
                query = select(WorkloadRow).where(WorkloadRow.workload_key.in_(chunk))
                found.update((row.workload_key, _workload(row)) for row in session.scalars(query))
        return found

    # --- workers ---------------------------------------------------------------------------
    def register_worker(self, worker: Worker) -> None:
        check_worker(worker)
        with session_scope(self._write) as session:
            if session.get(TargetRow, worker.target_key) is None:
                raise unknown_target(worker.target_key)
            stmt = self._insert(WorkerRow).values(
                worker_id=worker.worker_id,
                target_key=worker.target_key,
                host=worker.host,
                pid=worker.pid,
                kind=worker.kind,
                device=worker.device,
                started_at=worker.started_at,
                heartbeat_at=worker.heartbeat_at,
                info=worker.info,
            )
            stmt = stmt.on_conflict_do_update(
                index_elements=["worker_id"],
                set_={
                    name: stmt.excluded[name]
                    for name in (
                        "target_key",
                        "host",
                        "pid",
                        "kind",
                        "device",
                        "heartbeat_at",
                        "info",
                    )
                },
            )
            session.execute(stmt)

    def heartbeat_worker(self, worker_id: str, *, at: datetime | None = None) -> bool:
        workers = table(WorkerRow)
        with session_scope(self._write) as session:
            found = session.execute(
                update(workers)
                .where(workers.c.worker_id == worker_id)
                .values(heartbeat_at=at or utc_now())
                .returning(workers.c.worker_id)
            ).scalar()
            return found is not None

    def remove_worker(self, worker_id: str) -> None:
        with session_scope(self._write) as session:
            row = session.get(WorkerRow, worker_id)
            if row is not None:
                session.delete(row)

    def list_workers(
        self, *, target_key: str | None = None, live_since: datetime | None = None
    ) -> list[Worker]:
        query = select(WorkerRow).order_by(WorkerRow.started_at, WorkerRow.worker_id)
        if target_key is not None:
            query = query.where(WorkerRow.target_key == target_key)
        if live_since is not None:
            query = query.where(WorkerRow.heartbeat_at >= live_since)
        with session_scope(self._read) as session:
            return [_worker(row) for row in session.scalars(query)]

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
        with session_scope(self._write) as session:
            if session.get(TargetRow, spec.target_key) is None:
                raise unknown_target(spec.target_key)
            if api_key_id is not None and session.get(ApiKeyRow, api_key_id) is None:
                raise ApiKeyNotFound(api_key_id)
            if (
                max_active_for_key is not None
                or max_active_total is not None
                or max_active_at_priority is not None
            ):
                self._check_queue(
                    session,
                    api_key_id,
                    max_active_for_key,
                    max_active_total,
                    priority=priority,
                    priority_limit=max_active_at_priority,
                )
            self._put_workloads(session, [spec.workload])
            row = JobRow(
                workload_key=spec.workload.key,
                target_key=spec.target_key,
                template=spec.template,
                strategy=spec.strategy,
                budget=spec.budget.to_dict(),
                seed=spec.seed,
                state=(JobState.RUNNING if claimed else JobState.QUEUED).value,
                trials_done=0,
                best_record_uid=None,
                best_median_secs=None,
                error="",
                created_at=now,
                started_at=now if claimed else None,
                owner=owner if claimed else "",
                lease_expires_at=lease,
                finished_at=None,
                api_key_id=api_key_id,
                queued_at=now,
                priority=priority,
            )
            session.add(row)
            session.flush()
            return _job(row, spec.workload)

    def get_job(self, job_id: int) -> Job:
        with session_scope(self._read) as session:
            found = session.execute(_jobs_query().where(JobRow.id == job_id)).one_or_none()
            if found is None:
                raise JobNotFound(job_id)
            return _job(found[0], _workload(found[1]))

    def list_jobs(
        self, *, limit: int = 50, offset: int = 0, states: Sequence[JobState] = ()
    ) -> list[Job]:
        check_page(limit, offset)
        query = _jobs_query().order_by(JobRow.id.desc()).limit(limit).offset(offset)
        if states:
            query = query.where(JobRow.state.in_([JobState(s).value for s in states]))
        with session_scope(self._read) as session:
            return [_job(job, _workload(w)) for job, w in session.execute(query)]

    def count_jobs(
        self,
        *,
        states: Sequence[JobState] = (),
        target_keys: Collection[str] | None = None,
        api_key_id: int | None = None,
        min_priority: int | None = None,
    ) -> int:
        query = _count_jobs_query(states, target_keys, api_key_id)
        if min_priority is not None:
            query = query.where(JobRow.priority >= min_priority)
        with session_scope(self._read) as session:
            return int(session.scalar(query) or 0)

    def owner_queues(
        self, *, target_keys: Collection[str], since: datetime, min_priority: int | None = None
    ) -> list[OwnerQueue]:
        queued = JobRow.state == JobState.QUEUED.value
        active = [s.value for s in ACTIVE_STATES]
        query = (
            select(
                JobRow.api_key_id,
                func.count(case((queued, JobRow.id))),
                func.min(case((queued, JobRow.created_at))),
                func.max(JobRow.started_at),
            )
            .where(
                JobRow.state.in_(active) | (JobRow.finished_at >= since),
                JobRow.target_key.in_(sorted(set(target_keys))),
            )
            .group_by(JobRow.api_key_id)
        )
        if min_priority is not None:
            query = query.where(JobRow.priority >= min_priority)
        with session_scope(self._read) as session:
            return [
                OwnerQueue(key, int(waiting), first, last)
                for key, waiting, first, last in session.execute(query)
                if waiting
            ]

    def active_jobs(
        self, *, workload_keys: Collection[str], target_keys: Collection[str]
    ) -> list[Job]:
        found: list[Job] = []
        states = [s.value for s in ACTIVE_STATES]
        targets = sorted(set(target_keys))
        if not targets:
            return found
        with session_scope(self._read) as session:
            for chunk in _chunks(workload_keys):
                query = _jobs_query().where(
                    JobRow.state.in_(states),
                    JobRow.workload_key.in_(chunk),
                    JobRow.target_key.in_(targets),
                )
                found += [_job(job, _workload(w)) for job, w in session.execute(query)]
        found.sort(key=lambda job: job.id)
        return found

    def claim_job(
        self,
        *,
        owner: str = "",
        target_keys: Collection[str] | None = None,
        lease_secs: float = DEFAULT_LEASE_SECS,
        fair_share: FairShare | None = None,
    ) -> Job | None:
        jobs = table(JobRow)
        lease_end(utc_now(), lease_secs)  # refuse a bad lease before touching anything
        if target_keys is not None and not target_keys:
            return None
        with session_scope(self._write) as session:
            while True:
                if fair_share is not None:
                    job_id = self._fair_pick(session, target_keys, fair_share)
                else:
                    # SKIP LOCKED lets concurrent claimers on PostgreSQL pass each other;
                    # SQLite ignores it (the write lock taken at BEGIN serialises claimers).
                    query = select(JobRow.id).where(JobRow.state == JobState.QUEUED.value)
                    if target_keys is not None:
                        query = query.where(JobRow.target_key.in_(sorted(target_keys)))
                    job_id = session.scalar(
                        query.order_by(JobRow.priority.desc(), JobRow.queued_at, JobRow.id)
                        .limit(1)
                        .with_for_update(skip_locked=True)
                    )
                if job_id is None:
                    return None
                now = utc_now()
                first = jobs.c.started_at.is_(None)
                claimed = session.execute(
                    update(jobs)
                    .where(jobs.c.id == job_id, jobs.c.state == JobState.QUEUED.value)
                    .values(
                        state=JobState.RUNNING.value,
                        # A resumed job keeps its first start and counts the resume.
                        started_at=func.coalesce(jobs.c.started_at, now),
                        resumes=jobs.c.resumes + case((first, 0), else_=1),
                        resumed_at=case((first, jobs.c.resumed_at), else_=now),
                        finished_at=None,
                        owner=owner,
                        lease_expires_at=lease_end(now, lease_secs),
                    )
                    .returning(jobs.c.id)
                ).scalar()
                # Another claimer took it between our read and our update: try the next one.
                if claimed is not None:
                    found = session.execute(_jobs_query().where(JobRow.id == job_id)).one()
                    return _job(found[0], _workload(found[1]))

    def _fair_pick(
        self, session: Session, target_keys: Collection[str] | None, policy: FairShare
    ) -> int | None:
        """The queued job to claim under ``policy``: each owner's head of the queue (its
        highest priority, then longest waiting; one query), ordered by ``fair_order`` on the
        owners' usage (one more query, only when several owners wait). Not locked: the
        claim's conditional update decides between concurrent claimers."""
        rank = (
            func.row_number()
            .over(
                partition_by=JobRow.api_key_id,
                order_by=(JobRow.priority.desc(), JobRow.queued_at, JobRow.id),
            )
            .label("rank")
        )
        queued = select(
            JobRow.id, JobRow.api_key_id, JobRow.priority, JobRow.queued_at, rank
        ).where(JobRow.state == JobState.QUEUED.value)
        if target_keys is not None:
            queued = queued.where(JobRow.target_key.in_(sorted(target_keys)))
        inner = queued.subquery()
        heads = [
            QueuedJob(row.id, row.api_key_id, row.priority, (row.queued_at, row.id))
            for row in session.execute(select(inner).where(inner.c.rank == 1))
        ]
        if len(heads) <= 1:
            return heads[0].job_id if heads else None
        owners = {h.api_key_id for h in heads}
        now = utc_now()
        cutoff = now - timedelta(seconds=policy.window_secs)
        ids = sorted(k for k in owners if k is not None)
        whose: ColumnElement[bool] = JobRow.api_key_id.in_(ids)
        if None in owners:
            whose = whose | JobRow.api_key_id.is_(None)
        active = [s.value for s in ACTIVE_STATES]
        rows = session.execute(
            select(JobRow.api_key_id, JobRow.state, JobRow.tuning_secs, JobRow.finished_at).where(
                whose,
                JobRow.state.in_(active) | (JobRow.finished_at >= cutoff),
            )
        ).all()
        running: dict[int | None, int] = {}
        for row in rows:
            if row.state == JobState.RUNNING.value:
                running[row.api_key_id] = running.get(row.api_key_id, 0) + 1
        usage = owner_usage(
            (JobTime(r.api_key_id, r.tuning_secs, r.state in active, r.finished_at) for r in rows),
            now=now,
            window_secs=policy.window_secs,
        )
        names = {
            key_id: name
            for key_id, name in session.execute(
                select(ApiKeyRow.id, ApiKeyRow.name).where(ApiKeyRow.id.in_(ids))
            )
        }
        return fair_order(heads, usage, policy, names=names, running=running)[0]

    def renew_leases(
        self, owner: str, job_ids: Collection[int], *, lease_secs: float = DEFAULT_LEASE_SECS
    ) -> set[int]:
        until = lease_end(utc_now(), lease_secs)
        if not job_ids:
            return set()
        jobs = table(JobRow)
        with session_scope(self._write) as session:
            renewed = session.scalars(
                update(jobs)
                .where(
                    jobs.c.id.in_(sorted(job_ids)),
                    jobs.c.owner == owner,
                    jobs.c.state == JobState.RUNNING.value,
                )
                .values(lease_expires_at=until)
                .returning(jobs.c.id)
            )
            return set(renewed)

    def requeue_expired(self, *, now: datetime | None = None) -> list[int]:
        now = now or utc_now()
        jobs = table(JobRow)
        with session_scope(self._write) as session:
            requeued = session.scalars(
                update(jobs)
                .where(
                    jobs.c.state == JobState.RUNNING.value,
                    jobs.c.lease_expires_at.is_(None) | (jobs.c.lease_expires_at < now),
                )
                .values(
                    state=JobState.QUEUED.value,
                    owner="",
                    lease_expires_at=None,
                    finished_at=None,
                    queued_at=utc_now(),
                )
                .returning(jobs.c.id)
            )
            return sorted(requeued)

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
        with session_scope(self._write) as session:
            row = session.get(JobRow, job_id, with_for_update=True)
            if row is None:
                raise JobNotFound(job_id)
            if (not only_from or JobState(row.state) in only_from) and (
                owner is None or row.owner == owner
            ):
                row.started_at, row.finished_at = job_times(
                    state, row.started_at, row.finished_at, utc_now()
                )
                row.state = state.value
                row.error = error
                if state is not JobState.RUNNING:
                    row.lease_expires_at = None
                if state is JobState.QUEUED:
                    row.owner = ""
                    row.queued_at = utc_now()
                session.flush()
            workload = session.get_one(WorkloadRow, row.workload_key)
            return _job(row, _workload(workload))

    # --- records and schedules -------------------------------------------------------------
    def commit_records(
        self,
        records: Sequence[MeasureRecord],
        *,
        tuning_secs: Mapping[int, float] | None = None,
        owner: str | None = None,
        replayed: bool = False,
    ) -> int:
        """Store records and update job progress, job bests and Schedules in one transaction.

        Every record's job_id must name a stored job, else JobNotFound and nothing is stored;
        with ``owner``, one that ``owner`` holds, else LeaseLost.
        """
        batch = check_records(records)
        secs = check_tuning_secs(tuning_secs)
        if not batch and not secs:
            return 0
        with session_scope(self._write) as session:
            job_ids = sorted({r.job_id for r in batch if r.job_id is not None} | set(secs))
            if job_ids:
                query = select(JobRow.id, JobRow.owner).where(JobRow.id.in_(job_ids))
                if owner is not None:
                    # Locked (by id order) until the commit, so a requeue or claim of the job
                    # waits for these records instead of slipping in between check and write.
                    query = query.order_by(JobRow.id).with_for_update()
                holders = {int(i): str(h) for i, h in session.execute(query)}
                missing = [job_id for job_id in job_ids if job_id not in holders]
                if missing:
                    raise JobNotFound(missing[0])
                if owner is not None:
                    for job_id in job_ids:
                        if holders[job_id] != owner:
                            raise LeaseLost(job_id, owner, holders[job_id])
            new: list[MeasureRecord] = []
            if batch:
                self._put_targets(session, [r.request.target for r in batch])
                self._put_workloads(session, [r.request.workload for r in batch])
                inserted = self._insert_records(session, batch)
                new = [r for r in batch if r.uid in inserted]
            if replayed:  # a second replay of the same journal changes nothing
                secs = replayed_secs(new, secs)
                jobs = table(JobRow)
                for job_id, count in sorted(replayed_counts(new).items()):
                    session.execute(
                        update(jobs)
                        .where(jobs.c.id == job_id)
                        .values(replayed=jobs.c.replayed + count)
                    )
            self._update_jobs(session, new, secs)
            self._update_schedules(session, new)
        return len(new)

    def job_records(
        self, job_id: int, *, after: int | None = None, limit: int | None = None
    ) -> list[MeasureRecord]:
        """A job's records in commit order; raises JobNotFound."""
        check_page(limit or 0, 0)
        query = _records_query().where(RecordRow.job_id == job_id)
        if after is not None:
            query = query.where(RecordRow.id > after)
        if limit is not None:
            query = query.limit(limit)
        with session_scope(self._read) as session:
            if session.get(JobRow, job_id) is None:
                raise JobNotFound(job_id)
            return _records(session, query)

    def count_job_records(self, job_id: int, *, through: int | None = None) -> int:
        query = select(func.count()).select_from(RecordRow).where(RecordRow.job_id == job_id)
        if through is not None:
            query = query.where(RecordRow.id <= through)
        with session_scope(self._read) as session:
            if session.get(JobRow, job_id) is None:
                raise JobNotFound(job_id)
            return int(session.scalar(query) or 0)

    def records_for(
        self, *, workload_key: str, target_key: str, template: str | None = None
    ) -> list[MeasureRecord]:
        query = _records_query().where(
            RecordRow.workload_key == workload_key, RecordRow.target_key == target_key
        )
        if template is not None:
            query = query.where(RecordRow.template == template)
        with session_scope(self._read) as session:
            return _records(session, query)

    def family_records(
        self,
        *,
        family_key: str,
        template: str,
        template_version: int | None = None,
        limit: int | None = None,
    ) -> list[MeasureRecord]:
        family = _family_filter(family_key, template, template_version)
        query = _records_query().where(*family)
        if limit is not None:
            latest = (
                select(RecordRow.id)
                .join(TargetRow, TargetRow.target_key == RecordRow.target_key)
                .where(*family)
                .order_by(RecordRow.id.desc())
                .limit(limit)
            )
            query = query.where(RecordRow.id.in_(latest.scalar_subquery()))
        with session_scope(self._read) as session:
            return _records(session, query)

    def get_schedule(
        self, *, workload_key: str, target_key: str, template: str | None = None
    ) -> Schedule | None:
        query = select(ScheduleRow).where(
            ScheduleRow.workload_key == workload_key, ScheduleRow.target_key == target_key
        )
        if template is not None:
            query = query.where(ScheduleRow.template == template)
        query = query.order_by(ScheduleRow.median_secs, ScheduleRow.template).limit(1)
        with session_scope(self._read) as session:
            row = session.scalars(query).first()
            return None if row is None else _schedule(row)

    def family_schedules(
        self, *, workload_key: str, family_key: str, template: str | None = None
    ) -> list[Schedule]:
        query = (
            select(ScheduleRow)
            .join(TargetRow, TargetRow.target_key == ScheduleRow.target_key)
            .where(ScheduleRow.workload_key == workload_key, TargetRow.family_key == family_key)
        )
        if template is not None:
            query = query.where(ScheduleRow.template == template)
        query = query.order_by(
            ScheduleRow.median_secs, ScheduleRow.target_key, ScheduleRow.template
        )
        with session_scope(self._read) as session:
            return [_schedule(row) for row in session.scalars(query)]

    def family_lookup(
        self, *, workload_key: str, family_key: str, template: str | None = None
    ) -> tuple[list[Schedule], list[MeasureRecord]]:
        # One round trip where the workload has no Baseline, two where it has: one pooled
        # connection without a liveness check (lookup_engine), on PostgreSQL in autocommit
        # (no BEGIN and COMMIT around a read), statements built once (_LookupQueries), the
        # schedules as plain rows (no ORM instances) with whether any Baseline of the
        # workload exists. Through a session each for the schedules and the Baseline, an
        # exact lookup made 8 round trips.
        queries = _LookupQueries.get()
        query = queries.schedules if template is None else queries.template_schedules
        params = {"workload_key": workload_key, "family_key": family_key, "template": template}

        def read(conn: Connection) -> tuple[list[Schedule], list[MeasureRecord]]:
            rows = conn.execute(query, params).all()
            found = [_schedule(row) for row in rows]
            if not found or not rows[0].has_baseline:
                return found, []
            with Session(bind=conn) as session:
                return found, _records(session, queries.baselines, params)

        return read_once(self._lookups, read)

    async def family_lookup_async(
        self, *, workload_key: str, family_key: str, template: str | None = None
    ) -> list[Schedule] | None:
        lookups = self._async_lookups
        if lookups is None or not lookups.available:
            return None
        params = {"workload_key": workload_key, "family_key": family_key}
        if template is not None:
            params["template"] = template
        rows = await lookups.fetch(params, template=template is not None)
        if rows is None:
            return None  # every connection busy: family_lookup
        if rows and rows[0].has_baseline:
            return None  # the Baselines too: family_lookup
        return [_schedule(row) for row in rows]

    async def aclose_async(self) -> None:
        if self._async_lookups is not None:
            await self._async_lookups.aclose()

    def schedules_for(
        self, *, workload_keys: Collection[str], family_keys: Collection[str]
    ) -> dict[tuple[str, str], list[Schedule]]:
        found: dict[tuple[str, str], list[Schedule]] = {}
        families = sorted(set(family_keys))
        if not families:
            return found
        # Plain rows, not ORM instances: a batch lookup reads up to a thousand schedules, and
        # building mapped objects (identity map, instance state) was half of its time.
        schedules = table(ScheduleRow)
        with session_scope(self._read) as session:
            for chunk in _chunks(workload_keys):
                query = (
                    select(*schedules.c, TargetRow.family_key)
                    .join(TargetRow, TargetRow.target_key == schedules.c.target_key)
                    .where(schedules.c.workload_key.in_(chunk), TargetRow.family_key.in_(families))
                    .order_by(schedules.c.median_secs, schedules.c.target_key, schedules.c.template)
                )
                for row in session.execute(query):
                    schedule = _schedule(row)
                    found.setdefault((schedule.workload_key, row.family_key), []).append(schedule)
        return found

    def target_schedules(self, *, target_key: str, template: str | None = None) -> list[Schedule]:
        query = select(ScheduleRow).where(ScheduleRow.target_key == target_key)
        if template is not None:
            query = query.where(ScheduleRow.template == template)
        query = query.order_by(ScheduleRow.workload_key, ScheduleRow.template)
        with session_scope(self._read) as session:
            return [_schedule(row) for row in session.scalars(query)]

    def tuned_shapes(
        self,
        *,
        target_key: str,
        template: str,
        template_version: int,
        workload_keys: Collection[str] | None = None,
    ) -> list[TunedShape]:
        columns = (
            ScheduleRow.workload_key,
            WorkloadRow.op,
            WorkloadRow.m,
            WorkloadRow.n,
            WorkloadRow.k,
            WorkloadRow.dtype,
            WorkloadRow.a_layout,
            WorkloadRow.b_layout,
            WorkloadRow.epilogue,
            cast(ScheduleRow.config, Text),  # as text: decoded once per distinct config
        )
        query = (
            select(*columns)
            .join(WorkloadRow, WorkloadRow.workload_key == ScheduleRow.workload_key)
            .where(
                ScheduleRow.target_key == target_key,
                ScheduleRow.template == template,
                ScheduleRow.template_version == template_version,
            )
        )
        chunks = [None] if workload_keys is None else _chunks(workload_keys)
        found: list[TunedShape] = []
        with session_scope(self._read) as session:
            for chunk in chunks:
                q = query if chunk is None else query.where(ScheduleRow.workload_key.in_(chunk))
                found.extend(TunedShape._make(row) for row in session.execute(q))
        found.sort(key=lambda shape: shape.workload_key)  # as target_schedules: by key
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
        # Three steps, so that only the page's rows are ever read whole: the page's keys (the
        # workloads and baselines joined only where the filter or the sort needs them), then
        # those schedules with their workloads, then their baselines.
        pk = (ScheduleRow.workload_key, ScheduleRow.target_key, ScheduleRow.template)
        best_secs = func.coalesce(ScheduleRow.confirmed_median_secs, ScheduleRow.median_secs)
        keys = select(*pk)
        if dtype is not None or op is not None or sort == "workload":
            keys = keys.join(WorkloadRow, WorkloadRow.workload_key == ScheduleRow.workload_key)
        filters: list[ColumnElement[bool]] = []
        if target_key is not None:
            filters.append(ScheduleRow.target_key == target_key)
        if template is not None:
            filters.append(ScheduleRow.template == template)
        if dtype is not None:
            filters.append(WorkloadRow.dtype == dtype)
        if op is not None:
            filters.append(WorkloadRow.op == op)
        columns: list[Any]
        if sort == "speedup":
            fastest = _fastest_baselines().subquery()
            keys = keys.outerjoin(
                fastest,
                (fastest.c.workload_key == ScheduleRow.workload_key)
                & (fastest.c.target_key == ScheduleRow.target_key),
            )
            columns = [fastest.c.secs / best_secs]
        elif sort == "workload":
            columns = [WorkloadRow.m, WorkloadRow.n, WorkloadRow.k]
        elif sort == "median_secs":
            columns = [best_secs]
        elif sort == "target":
            columns = [ScheduleRow.target_key]
        else:
            columns = [getattr(ScheduleRow, sort)]
        order = [(c.desc() if descending else c.asc()).nulls_last() for c in columns]
        keys = keys.where(*filters).order_by(*order, *pk).limit(limit).offset(offset)
        count = select(func.count()).select_from(ScheduleRow)
        if dtype is not None or op is not None:
            count = count.join(WorkloadRow, WorkloadRow.workload_key == ScheduleRow.workload_key)
        count = count.where(*filters)
        with session_scope(self._read) as session:
            page = [(w, t, tpl) for w, t, tpl in session.execute(keys)]
            total = session.execute(count).scalar_one()
            if not page:
                return [], total
            rows = session.execute(
                select(ScheduleRow, WorkloadRow)
                .join(WorkloadRow, WorkloadRow.workload_key == ScheduleRow.workload_key)
                .where(tuple_(*pk).in_(page))
            ).all()
            pairs = sorted({(w, t) for w, t, _ in page})
            baselines = dict(
                ((w, t), secs)
                for w, t, secs in session.execute(
                    _fastest_baselines().where(
                        tuple_(BaselineRow.workload_key, BaselineRow.target_key).in_(pairs)
                    )
                )
            )
        found = {(r.workload_key, r.target_key, r.template): (r, w) for r, w in rows}
        listings = []
        for key in page:
            row, workload = found[key]
            listings.append(
                ScheduleListing(_schedule(row), _workload(workload), baselines.get(key[:2]))
            )
        return listings, total

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
        with session_scope(self._write) as session:
            row = session.get(
                ScheduleRow, (workload_key, target_key, template), with_for_update=True
            )
            if row is None:
                return None
            current = _schedule(row)
            found = _records(session, _records_query().where(RecordRow.uid == winner_uid))
            moved = confirmed_schedule(
                current, found[0] if found else None, candidates, confirmation, utc_now()
            )
            if moved is None:
                return current
            for name, value in _schedule_values(moved).items():
                setattr(row, name, value)
            session.flush()
            return _schedule(row)

    # --- baselines -------------------------------------------------------------------------
    def commit_baseline(self, record: MeasureRecord) -> bool:
        check_baseline(record)
        batch = check_records([record])
        with session_scope(self._write) as session:
            self._put_targets(session, [record.request.target])
            self._put_workloads(session, [record.request.workload])
            new = record.uid in self._insert_records(session, batch)
            if new and record.status is MeasureStatus.OK:
                stmt = self._insert(BaselineRow).values(
                    workload_key=record.request.workload.key,
                    target_key=record.request.target.target_key,
                    template=record.request.template,
                    config_key=record.config.key,
                    config=record.config.to_dict(),
                    median_secs=record.median_secs,
                    record_uid=record.uid,
                    updated_at=utc_now(),
                )
                stmt = stmt.on_conflict_do_update(
                    index_elements=["workload_key", "target_key", "template", "config_key"],
                    set_={
                        name: stmt.excluded[name]
                        for name in ("median_secs", "record_uid", "updated_at")
                    },
                )
                session.execute(stmt)
        return new

    def get_baseline(
        self, *, workload_key: str, target_key: str, template: str, config: Config
    ) -> MeasureRecord | None:
        query = (
            _records_query()
            .join(BaselineRow, BaselineRow.record_uid == RecordRow.uid)
            .where(
                BaselineRow.workload_key == workload_key,
                BaselineRow.target_key == target_key,
                BaselineRow.template == template,
                BaselineRow.config_key == config.key,
            )
        )
        with session_scope(self._read) as session:
            found = _records(session, query)
        return found[0] if found else None

    def baselines_for(self, *, workload_keys: Collection[str]) -> list[MeasureRecord]:
        found: list[MeasureRecord] = []
        with session_scope(self._read) as session:
            for chunk in _chunks(workload_keys):
                query = (
                    _records_query()
                    .join(BaselineRow, BaselineRow.record_uid == RecordRow.uid)
                    .where(BaselineRow.workload_key.in_(chunk))
                )
                found += _records(session, query)
        return found

    def list_baselines(self, *, workload_key: str, target_key: str) -> list[MeasureRecord]:
        query = (
            _records_query()
            .join(BaselineRow, BaselineRow.record_uid == RecordRow.uid)
            .where(BaselineRow.workload_key == workload_key, BaselineRow.target_key == target_key)
            .order_by(None)
            .order_by(BaselineRow.template, RecordRow.id)
        )
        with session_scope(self._read) as session:
            return _records(session, query)

    # --- change feed ---------------------------------------------------------------------
    def lookup_changes(self, since: ChangeMark | None = None) -> LookupChanges:
        now = utc_now()
        floor = record_floor(since)
        if floor is None or since is None:
            return self._first_changes(now)
        # Every serving process reads this every lookup_refresh_secs on a thread beside its
        # event loop, whose lookups wait for the interpreter while the thread holds it: one
        # statement built once, on the lookup's own connection (read_once: autocommit, no
        # BEGIN, COMMIT or liveness ping), one round trip when nothing changed (nearly every
        # read). Through a session, four statements and their transaction took 5.6 ms of CPU
        # a read on the 2-core VM, a tenth of a serving process's samples under wrk.
        queries = _ChangeQueries.get()
        params = {"floor": floor, "jobs_after": jobs_floor(since, now)}
        known = [i for i in since.seen_records if i > floor]

        def read(conn: Connection) -> _ChangeRows:
            head = conn.execute(queries.head, params).one()._mapping
            newest = int(head["top"] or 0)
            if head["above"] == len(known) and newest <= since.record_id:
                records = [(i, "") for i in sorted(known)]
            else:
                records = [(int(i), str(k)) for i, k in conn.execute(queries.records, params)]
            jobs = []
            if head["jobs"]:
                jobs = [
                    (int(i), str(k), at)
                    for i, k, at in conn.execute(queries.jobs, params)
                    if at is not None
                ]
            return _ChangeRows(
                newest=newest,
                records=records,
                jobs=jobs,
                models=(int(head["models"]), int(head["model_top"] or 0)),
                api_keys=(int(head["keys"]), str(head["revoked"] or "")),
            )

        rows = read_once(self._lookups, read)
        return changes_since(
            since,
            newest_record_id=rows.newest,
            records=rows.records,
            jobs=rows.jobs,
            models=rows.models,
            api_keys=rows.api_keys,
            now=now,
        )

    def _first_changes(self, now: datetime) -> LookupChanges:
        """The feed's first mark (once per reader)."""
        with session_scope(self._read) as session:
            newest = int(session.scalar(select(func.max(RecordRow.id))) or 0)
            jobs = [
                (int(i), str(k), at)
                for i, k, at in session.execute(
                    select(JobRow.id, JobRow.workload_key, JobRow.finished_at).where(
                        JobRow.finished_at >= jobs_floor(None, now)
                    )
                )
                if at is not None
            ]
            models_row = session.execute(select(func.count(), func.max(ModelRow.id))).one()
            keys_row = session.execute(
                select(func.count(), func.max(ApiKeyRow.revoked_at)).select_from(ApiKeyRow)
            ).one()
        return changes_since(
            None,
            newest_record_id=newest,
            records=[],
            jobs=jobs,
            models=(int(models_row[0]), int(models_row[1] or 0)),
            api_keys=(int(keys_row[0]), str(keys_row[1] or "")),
            now=now,
        )

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
        row = ApiKeyRow(
            prefix=prefix,
            secret_hash=secret_hash,
            name=name,
            scope=Scope(scope).value,
            created_at=utc_now(),
            revoked_at=None,
            max_trials=limits.max_trials,
            max_secs=limits.max_secs,
            max_queued_jobs=limits.max_queued_jobs,
        )
        try:
            with session_scope(self._write) as session:
                session.add(row)
                session.flush()
                return _api_key(row)
        except IntegrityError:
            raise ValueError(f"prefix: an API key with prefix {prefix!r} exists") from None

    def get_api_key(self, *, prefix: str | None = None, key_id: int | None = None) -> ApiKey | None:
        if prefix is None and key_id is None:
            raise ValueError("get_api_key: give a prefix or a key_id")
        query = select(ApiKeyRow)
        if prefix is not None:
            query = query.where(ApiKeyRow.prefix == prefix)
        if key_id is not None:
            query = query.where(ApiKeyRow.id == key_id)
        with session_scope(self._read) as session:
            row = session.scalars(query).first()
            return None if row is None else _api_key(row)

    def list_api_keys(self) -> list[ApiKey]:
        with session_scope(self._read) as session:
            return [_api_key(r) for r in session.scalars(select(ApiKeyRow).order_by(ApiKeyRow.id))]

    def revoke_api_key(self, key_id: int) -> ApiKey:
        with session_scope(self._write) as session:
            row = session.get(ApiKeyRow, key_id, with_for_update=True)
            if row is None:
                raise ApiKeyNotFound(key_id)
            if row.revoked_at is None:
                row.revoked_at = utc_now()
                session.flush()
            return _api_key(row)

    # --- cost models -------------------------------------------------------------------------
    def count_family_records(
        self,
        *,
        family_key: str,
        template: str,
        template_version: int | None = None,
        after: int | None = None,
    ) -> int:
        query = (
            select(func.count())
            .select_from(RecordRow)
            .join(TargetRow, TargetRow.target_key == RecordRow.target_key)
            .where(*_family_filter(family_key, template, template_version))
        )
        if after is not None:
            query = query.where(RecordRow.id > after)
        with session_scope(self._read) as session:
            return int(session.scalar(query) or 0)

    def register_model(self, info: ModelInfo, artifact: bytes) -> ModelInfo:
        check_model(info)
        with session_scope(self._write) as session:
            latest = session.scalar(
                select(func.max(ModelRow.version)).where(
                    ModelRow.family_key == info.family_key,
                    ModelRow.template == info.template,
                    ModelRow.template_version == info.template_version,
                )
            )
            row = ModelRow(
                family_key=info.family_key,
                template=info.template,
                template_version=info.template_version,
                version=int(latest or 0) + 1,
                kind=info.kind,
                features=info.features,
                target_label=info.target_label,
                records_used=info.records_used,
                workloads_used=info.workloads_used,
                last_record_seq=info.last_record_seq,
                metrics=dict(info.metrics),
                created_at=info.created_at,
                accepted=info.accepted,
                reason=info.reason,
                artifact=bytes(artifact),
            )
            session.add(row)
            session.flush()
            return _model(row)

    def list_models(
        self, *, family_key: str | None = None, template: str | None = None, limit: int = 100
    ) -> list[ModelInfo]:
        check_page(limit, 0)
        query = select(ModelRow).order_by(ModelRow.id.desc()).limit(limit)
        if family_key is not None:
            query = query.where(ModelRow.family_key == family_key)
        if template is not None:
            query = query.where(ModelRow.template == template)
        with session_scope(self._read) as session:
            return [_model(row) for row in session.scalars(query)]

    def latest_model(
        self, *, family_key: str, template: str, template_version: int, accepted_only: bool = False
    ) -> ModelInfo | None:
        query = (
            select(ModelRow)
            .where(
                ModelRow.family_key == family_key,
                ModelRow.template == template,
                ModelRow.template_version == template_version,
            )
            .order_by(ModelRow.id.desc())
            .limit(1)
        )
        if accepted_only:
            query = query.where(ModelRow.accepted.is_(True))
        with session_scope(self._read) as session:
            row = session.scalars(query).first()
            return None if row is None else _model(row)

    def model_artifact(self, model_id: int) -> bytes | None:
        with session_scope(self._read) as session:
            blob = session.scalar(select(ModelRow.artifact).where(ModelRow.id == model_id))
            return None if blob is None else bytes(blob)

    # --- shared autotuning results ----------------------------------------------------------
    def put_autotune(self, result: AutotuneResult) -> tuple[AutotuneResult, bool]:
        row = AutotuneRow(
            cache_key=result.cache_key,
            kernel=result.kernel,
            key_doc=result.key_doc,
            best_index=result.best_index,
            timings_ms=[list(t) if t is not None else None for t in result.timings_ms],
            api_key_id=result.api_key_id,
            created_at=result.created_at,
        )
        try:
            with session_scope(self._write) as session:
                if session.get(AutotuneRow, result.cache_key) is None:
                    session.add(row)
                    session.flush()
                    return result, True
        except IntegrityError:
            pass  # another writer stored this key between the read and the insert
        found = self.get_autotune(result.cache_key)
        if found is None:
            raise RuntimeError(f"autotune result {result.cache_key} neither stored nor found")
        return found, False

    def get_autotune(self, cache_key: str) -> AutotuneResult | None:
        with session_scope(self._read) as session:
            row = session.get(AutotuneRow, cache_key)
            return None if row is None else self._autotune_of(row)

    @staticmethod
    def _autotune_of(row: AutotuneRow) -> AutotuneResult | None:
        """The row's result, or None (logged) for one stored before the document's limits were
        checked that breaks them: answered as absent (404), never as a server error."""
        try:
            return AutotuneResult(
                cache_key=row.cache_key,
                key_doc=dict(row.key_doc),
                best_index=row.best_index,
                timings_ms=tuple(
                    tuple(float(v) for v in t) if t is not None else None for t in row.timings_ms
                ),
                created_at=row.created_at,
                api_key_id=row.api_key_id,
            )
        except (InvalidSpec, RecursionError, TypeError, ValueError) as exc:
            log.warning("autotune result %s is unreadable, answered as absent: %s",
                        row.cache_key, exc)  # fmt: skip
            return None

    # --- helpers ---------------------------------------------------------------------------
    def _check_queue(
        self,
        session: Session,
        api_key_id: int | None,
        key_limit: int | None,
        total_limit: int | None,
        *,
        priority: int = PERSON_PRIORITY,
        priority_limit: int | None = None,
    ) -> None:
        """QueueFull if a new job would pass a limit. SQLite's write lock (taken at BEGIN)
        already serialises submissions; on PostgreSQL a transaction-scoped advisory lock does,
        so two submissions cannot both see room for one more."""
        if self._engine.dialect.name == "postgresql":
            session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _QUEUE_LOCK})
        total = int(session.scalar(_count_jobs_query(ACTIVE_STATES, None, None)) or 0)
        for_key = 0
        if api_key_id is not None and key_limit is not None:
            # Of the same priority: the jobs a key's lookups queued have their own bound.
            mine = _count_jobs_query(ACTIVE_STATES, None, api_key_id)
            for_key = int(session.scalar(mine.where(JobRow.priority == priority)) or 0)
        at_priority = 0
        if priority_limit is not None:
            at_priority = int(
                session.scalar(
                    _count_jobs_query(ACTIVE_STATES, None, None).where(JobRow.priority == priority)
                )
                or 0
            )
        check_queue(
            for_key=for_key,
            key_limit=key_limit if api_key_id is not None else None,
            total=total,
            total_limit=total_limit,
            at_priority=at_priority,
            priority_limit=priority_limit,
        )

    def _insert(self, row: type[Base]) -> _Insert:
        if self._engine.dialect.name == "postgresql":
            return postgresql.insert(table(row))
        return sqlite.insert(table(row))

    def _put_targets(self, session: Session, targets: Iterable[Target]) -> None:
        unique = {t.target_key: t for t in targets}
        now = utc_now()
        # Sorted, so concurrent transactions lock keys in one order and cannot deadlock.
        values = [
            {
                "target_key": key,
                "family_key": t.family_key,
                "kind": t.kind,
                "name": t.name,
                "data": t.to_dict(),
                "created_at": now,
            }
            for key, t in sorted(unique.items())
        ]
        stmt = self._insert(TargetRow).on_conflict_do_nothing(index_elements=["target_key"])
        session.execute(stmt, values)

    def _put_workloads(self, session: Session, workloads: Iterable[Workload]) -> None:
        unique = {w.key: w for w in workloads}
        now = utc_now()
        values = [
            {"workload_key": key, **_workload_columns(w), "created_at": now}
            for key, w in sorted(unique.items())
        ]  # to_dict's fields are the table's columns
        stmt = self._insert(WorkloadRow).on_conflict_do_nothing(index_elements=["workload_key"])
        session.execute(stmt, values)

    def _insert_records(self, session: Session, batch: Sequence[MeasureRecord]) -> set[str]:
        """Insert the records not stored yet; return the uids this transaction inserted."""
        stmt = self._insert(RecordRow).on_conflict_do_nothing(index_elements=["uid"])
        # Sorted by uid, so concurrent commits of the same records wait on each other in one
        # order instead of deadlocking; row ids (the tie-break after created_at) follow it.
        values = [_record_values(r) for r in sorted(batch, key=lambda r: r.uid)]
        return set(session.scalars(stmt.returning(table(RecordRow).c.uid), values))

    def _update_jobs(
        self, session: Session, new: Sequence[MeasureRecord], secs: Mapping[int, float]
    ) -> None:
        jobs = table(JobRow)
        counts = trials_of(new)
        for job_id in sorted(set(counts) | set(secs)):
            session.execute(
                update(jobs)
                .where(jobs.c.id == job_id)
                .values(
                    trials_done=jobs.c.trials_done + counts.get(job_id, 0),
                    tuning_secs=jobs.c.tuning_secs + secs.get(job_id, 0.0),
                )
            )
        for best_job_id, record in sorted(fastest_ok(new, _job_of).items()):
            median = record.median_secs
            # Conditional, so a concurrent faster commit is never overwritten by a slower one.
            session.execute(
                update(jobs)
                .where(
                    jobs.c.id == best_job_id,
                    (jobs.c.best_median_secs.is_(None)) | (jobs.c.best_median_secs > median),
                )
                .values(best_record_uid=record.uid, best_median_secs=median)
            )

    def _update_schedules(self, session: Session, new: Sequence[MeasureRecord]) -> None:
        now = utc_now()
        schedules = table(ScheduleRow)
        for _, record in sorted(fastest_ok(new, schedule_key).items()):
            schedule = schedule_of(record, now)
            stmt = self._insert(ScheduleRow).values(_schedule_values(schedule))
            stmt = stmt.on_conflict_do_update(
                index_elements=["workload_key", "target_key", "template"],
                set_={
                    name: stmt.excluded[name]
                    for name in (
                        "template_version",
                        "config",
                        "median_secs",
                        "gflops",
                        "record_uid",
                        "updated_at",
                        *_CONFIRMATION_COLUMNS,
                    )
                },
                # The rule of common.replaces: newer version, or same version and faster.
                where=(schedules.c.template_version < stmt.excluded.template_version)
                | (
                    (schedules.c.template_version == stmt.excluded.template_version)
                    & (schedules.c.median_secs > stmt.excluded.median_secs)
                ),
            )
            session.execute(stmt)


# Any constant shared by every tunehub process: the advisory lock that serialises submissions.
_QUEUE_LOCK = 0x7475_6E65_6875_62  # "tunehub"


def _chunks(keys: Collection[str]) -> list[list[str]]:
    """``keys`` (deduplicated, sorted) in lists of at most IN_CHUNK, for ``IN (...)`` reads."""
    ordered = sorted(set(keys))
    return [ordered[i : i + IN_CHUNK] for i in range(0, len(ordered), IN_CHUNK)]


def _count_jobs_query(
    states: Sequence[JobState], target_keys: Collection[str] | None, api_key_id: int | None
) -> Select[int]:
    query = select(func.count()).select_from(JobRow)
    if states:
        query = query.where(JobRow.state.in_([JobState(s).value for s in states]))
    if target_keys is not None:
        query = query.where(JobRow.target_key.in_(sorted(target_keys)))
    if api_key_id is not None:
        query = query.where(JobRow.api_key_id == api_key_id)
    return query


def _api_key(row: ApiKeyRow) -> ApiKey:
    return ApiKey(
        id=row.id,
        prefix=row.prefix,
        name=row.name,
        scope=Scope(row.scope),
        created_at=row.created_at,
        secret_hash=row.secret_hash,
        revoked_at=row.revoked_at,
        limits=KeyLimits(
            max_trials=row.max_trials, max_secs=row.max_secs, max_queued_jobs=row.max_queued_jobs
        ),
    )


def _job_of(record: MeasureRecord) -> int | None:
    return record.job_id


_CONFIRMATION_COLUMNS = (
    "confirmed_median_secs",
    "confirmed_spread",
    "confirmed_rounds",
    "confirmed_at",
    "confirmed_others",
)


# --- rows to core types ------------------------------------------------------------------
def _target(row: TargetRow) -> Target:
    return Target.from_dict(row.data)


def _workload_columns(workload: Workload) -> dict[str, Any]:
    """A WorkloadRow's values: the common fields, and the operator's own under ``params``."""
    values = workload.to_dict()
    own = {name: values.pop(name) for name, _ in workload.params}
    return {**values, "params": own}


def _workload(row: WorkloadRow) -> Workload:
    return Workload(
        op=row.op,
        m=row.m,
        n=row.n,
        k=row.k,
        dtype=row.dtype,
        a_layout=row.a_layout,
        b_layout=row.b_layout,
        epilogue=row.epilogue,
        allow_tf32=bool(row.allow_tf32),
        params=tuple((row.params or {}).items()),
    )


def _fastest_baselines() -> Select[str, str, float]:
    """The fastest vendor-library time of each (workload, target)."""
    return select(
        BaselineRow.workload_key,
        BaselineRow.target_key,
        func.min(BaselineRow.median_secs).label("secs"),
    ).group_by(BaselineRow.workload_key, BaselineRow.target_key)


def _worker(row: WorkerRow) -> Worker:
    return Worker(
        worker_id=row.worker_id,
        target_key=row.target_key,
        host=row.host,
        pid=row.pid,
        kind=row.kind,
        device=row.device,
        started_at=row.started_at,
        heartbeat_at=row.heartbeat_at,
        info=dict(row.info),
    )


def _jobs_query() -> Select[JobRow, WorkloadRow]:
    return select(JobRow, WorkloadRow).join(
        WorkloadRow, WorkloadRow.workload_key == JobRow.workload_key
    )


def _job(row: JobRow, workload: Workload) -> Job:
    budget = row.budget
    return Job(
        id=row.id,
        spec=JobSpec(
            workload=workload,
            target_key=row.target_key,
            template=row.template,
            strategy=row.strategy,
            budget=Budget(max_trials=int(budget["max_trials"]), max_secs=float(budget["max_secs"])),
            seed=row.seed,
        ),
        state=JobState(row.state),
        trials_done=row.trials_done,
        created_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        error=row.error,
        best_record_uid=row.best_record_uid,
        best_median_secs=row.best_median_secs,
        owner=row.owner,
        lease_expires_at=row.lease_expires_at,
        tuning_secs=row.tuning_secs,
        api_key_id=row.api_key_id,
        priority=row.priority,
        resumes=row.resumes,
        resumed_at=row.resumed_at,
        replayed=row.replayed,
    )


def _record_values(record: MeasureRecord) -> dict[str, Any]:
    request, result = record.request, record.result
    return {
        "uid": record.uid,
        "job_id": record.job_id,
        "workload_key": request.workload.key,
        "target_key": request.target.target_key,
        "template": request.template,
        "template_version": request.template_version,
        "config": request.config.to_dict(),
        "config_key": request.config.key,
        "status": result.status.value,
        "median_secs": result.median_secs,
        "repeat_secs": list(result.repeat_secs),
        "error": result.error,
        "compile_secs": result.compile_secs,
        "verify_secs": result.verify_secs,
        "run_secs": result.run_secs,
        "environment": result.environment,
        "created_at": record.created_at,
    }


def _family_filter(
    family_key: str, template: str, template_version: int | None
) -> list[ColumnElement[bool]]:
    """Where a record (joined with its target) is of this template (and version, if given) on
    a target of this family."""
    found = [TargetRow.family_key == family_key, RecordRow.template == template]
    if template_version is not None:
        found.append(RecordRow.template_version == template_version)
    return found


class _LookupQueries:
    """The single lookup's statements (``family_lookup``), built once with bound parameters
    ``workload_key``, ``family_key`` and ``template``: building a statement and its cache key
    on every lookup was a tenth of the lookup's CPU time."""

    _built: _LookupQueries | None = None

    def __init__(self) -> None:
        schedules = table(ScheduleRow)
        workload_key = bindparam("workload_key", type_=String())
        family_key = bindparam("family_key", type_=String())
        has_baseline = (
            select(BaselineRow.workload_key)
            .where(BaselineRow.workload_key == workload_key)
            .exists()
            .label("has_baseline")
        )
        query = (
            select(*schedules.c, has_baseline)
            .join(TargetRow, TargetRow.target_key == schedules.c.target_key)
            .where(schedules.c.workload_key == workload_key, TargetRow.family_key == family_key)
        )
        order = (schedules.c.median_secs, schedules.c.target_key, schedules.c.template)
        self.schedules = query.order_by(*order)
        self.template_schedules = query.where(
            schedules.c.template == bindparam("template")
        ).order_by(*order)
        self.baselines = (
            _records_query()
            .join(BaselineRow, BaselineRow.record_uid == RecordRow.uid)
            .where(BaselineRow.workload_key == workload_key, TargetRow.family_key == family_key)
        )

    @classmethod
    def get(cls) -> _LookupQueries:
        built = cls._built
        if built is None:  # two threads may both build them: the same statements
            built = cls._built = cls()
        return built


@dataclass(frozen=True)
class _ChangeRows:
    """What one read of the change feed found (``lookup_changes``)."""

    newest: int
    records: list[tuple[int, str]]
    jobs: list[tuple[int, str, datetime]]
    models: tuple[int, int]
    api_keys: tuple[int, str]


class _ChangeQueries:
    """The change feed's statements (``lookup_changes`` after its first read), built once
    with bound parameters ``floor`` (records above it) and ``jobs_after``: ``head`` counts
    what may have changed in one row (the records above the floor and the newest id, the
    jobs finished since ``jobs_after``, the models' and API keys' counts and newest), and
    ``records`` and ``jobs`` list them, read only when ``head`` says there is something."""

    _built: _ChangeQueries | None = None

    def __init__(self) -> None:
        floor = bindparam("floor", type_=Integer())
        above = RecordRow.id > floor
        finished = JobRow.finished_at >= bindparam("jobs_after")
        self.head = select(
            select(func.count()).select_from(RecordRow).where(above).scalar_subquery()
            .label("above"),
            select(func.max(RecordRow.id)).where(above).scalar_subquery().label("top"),
            select(func.count()).select_from(JobRow).where(finished).scalar_subquery()
            .label("jobs"),
            select(func.count()).select_from(ModelRow).scalar_subquery().label("models"),
            select(func.max(ModelRow.id)).scalar_subquery().label("model_top"),
            select(func.count()).select_from(ApiKeyRow).scalar_subquery().label("keys"),
            select(func.max(ApiKeyRow.revoked_at)).scalar_subquery().label("revoked"),
        )  # fmt: skip
        self.records = (
            select(RecordRow.id, RecordRow.workload_key)
            .where(above)
            .order_by(RecordRow.id)
            .limit(CHANGE_LOOKBACK_IDS + CHANGE_MAX_LISTED + 1)
        )
        self.jobs = select(JobRow.id, JobRow.workload_key, JobRow.finished_at).where(finished)

    @classmethod
    def get(cls) -> _ChangeQueries:
        built = cls._built
        if built is None:  # two threads may both build them: the same statements
            built = cls._built = cls()
        return built


def _records_query() -> Select[RecordRow, WorkloadRow, TargetRow]:
    return (
        select(RecordRow, WorkloadRow, TargetRow)
        .join(WorkloadRow, WorkloadRow.workload_key == RecordRow.workload_key)
        .join(TargetRow, TargetRow.target_key == RecordRow.target_key)
        .order_by(RecordRow.id)
    )


def _records(
    session: Session,
    query: Select[RecordRow, WorkloadRow, TargetRow],
    params: Mapping[str, Any] | None = None,
) -> list[MeasureRecord]:
    workloads: dict[str, Workload] = {}
    targets: dict[str, Target] = {}
    out: list[MeasureRecord] = []
    for row, workload_row, target_row in session.execute(query, params):
        workload = workloads.get(row.workload_key)
        if workload is None:
            workload = workloads[row.workload_key] = _workload(workload_row)
        target = targets.get(row.target_key)
        if target is None:
            target = targets[row.target_key] = _target(target_row)
        out.append(_record(row, workload, target))
    return out


def _record(row: RecordRow, workload: Workload, target: Target) -> MeasureRecord:
    return MeasureRecord(
        request=MeasureRequest(
            workload=workload,
            target=target,
            template=row.template,
            template_version=row.template_version,
            config=Config(row.config),
        ),
        result=MeasureResult(
            status=MeasureStatus(row.status),
            repeat_secs=tuple(float(t) for t in row.repeat_secs),
            error=row.error,
            compile_secs=row.compile_secs,
            verify_secs=row.verify_secs,
            run_secs=row.run_secs,
            environment=dict(row.environment),
        ),
        job_id=row.job_id,
        uid=row.uid,
        created_at=row.created_at,
        seq=row.id,
    )


def _model(row: ModelRow) -> ModelInfo:
    return ModelInfo(
        id=row.id,
        version=row.version,
        family_key=row.family_key,
        template=row.template,
        template_version=row.template_version,
        kind=row.kind,
        features=row.features,
        target_label=row.target_label,
        records_used=row.records_used,
        workloads_used=row.workloads_used,
        last_record_seq=row.last_record_seq,
        metrics={str(k): float(v) for k, v in (row.metrics or {}).items()},
        created_at=row.created_at,
        accepted=row.accepted,
        reason=row.reason or "",
    )


def _schedule_values(schedule: Schedule) -> dict[str, Any]:
    c = schedule.confirmation
    return {
        "workload_key": schedule.workload_key,
        "target_key": schedule.target_key,
        "template": schedule.template,
        "template_version": schedule.template_version,
        "config": schedule.config.to_dict(),
        "median_secs": schedule.median_secs,
        "gflops": schedule.gflops,
        "record_uid": schedule.record_uid,
        "updated_at": schedule.updated_at,
        "confirmed_median_secs": c.median_secs if c else None,
        "confirmed_spread": c.spread if c else None,
        "confirmed_rounds": c.rounds if c else None,
        "confirmed_at": c.confirmed_at if c else None,
        "confirmed_others": dict(c.others) if c else None,
    }


def _schedule(row: Any) -> Schedule:
    """A Schedule from a ScheduleRow, or from a plain row holding the same columns."""
    confirmation = None
    if (
        row.confirmed_median_secs is not None
        and row.confirmed_spread is not None
        and row.confirmed_at is not None
    ):
        confirmation = Confirmation(
            median_secs=row.confirmed_median_secs,
            spread=row.confirmed_spread,
            rounds=row.confirmed_rounds or 0,
            confirmed_at=row.confirmed_at,
            others={str(k): float(v) for k, v in (row.confirmed_others or {}).items()},
        )
    return Schedule(
        workload_key=row.workload_key,
        target_key=row.target_key,
        template=row.template,
        template_version=row.template_version,
        config=Config(row.config),
        median_secs=row.median_secs,
        gflops=row.gflops,
        record_uid=row.record_uid,
        updated_at=row.updated_at,
        confirmation=confirmation,
    )
