"""ScheduleStore: the storage contract (targets, workers, workloads, jobs, records, schedules,
baselines, API keys, the cost-model registry).

Contract, for every implementation:
- Thread-safe: one store object is shared by the API, the job runner and worker threads.
- Returned objects are frozen snapshots; later writes never change them.
- Records are immutable once stored; committing a record whose ``uid`` is stored is a no-op.
  Each stored record gets a ``seq``, increasing in commit order; lists of records come in
  ``seq`` order.
- Only verdicts (``MeasureStatus.verdict``) count as a job's trials; machine failures
  (``cancelled``, ``worker_error``) are stored for the record and change nothing else.
- ``commit_records`` is one transaction: the records, the jobs' progress, best so far and
  tuning time, and every Schedule the new records beat are written together or not at all.
- Timestamps are timezone-aware UTC.
- Jobs are held with leases (see docs/leases.md): ``claim_job`` (or ``create_job(claimed=True)``)
  makes the caller the job's ``owner`` until ``lease_expires_at``; ``renew_leases`` extends it;
  ``requeue_expired`` puts RUNNING jobs whose lease ended back in the queue. Writes that pass
  ``owner`` (``commit_records``, ``set_job_state``) are fenced: they check, in their own
  transaction, that the job is still that owner's, so a runner that lost its lease (presumed
  dead, then back) cannot write for a job another runner now holds. The owner stays on a
  finished job (its last holder may still store what was in flight when it was cancelled) and
  is cleared only when the job goes back to the queue.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

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
    ModelInfo,
    Schedule,
    Scope,
    Target,
    Worker,
    Workload,
)
from tunehub.core.apikey import NO_LIMITS
from tunehub.core.fairshare import FairShare, OwnerQueue
from tunehub.core.job import PERSON_PRIORITY
from tunehub.core.owner import DEFAULT_LEASE_SECS

# Most keys in one ``IN (...)`` list: bulk reads are split in chunks of this many (SQLite
# allows 32766 bound parameters, PostgreSQL 65535; smaller lists plan well on both).
IN_CHUNK = 500


class JobNotFound(LookupError):
    def __init__(self, job_id: int) -> None:
        super().__init__(f"no job with id {job_id}")
        self.job_id = job_id


class QueueFull(RuntimeError):
    """A job was refused: its key (or the whole service) has as many active jobs as allowed."""

    def __init__(self, message: str, *, limit: int, active: int) -> None:
        super().__init__(message)
        self.limit = limit
        self.active = active


class LeaseLost(RuntimeError):
    """A fenced write was refused: the job is no longer held by the caller (its lease expired
    and the job went back to the queue, perhaps to another runner)."""

    def __init__(self, job_id: int, owner: str, holder: str) -> None:
        super().__init__(
            f"job {job_id}: the lease of {owner!r} is lost"
            + (f"; {holder!r} holds the job now" if holder else "; the job went back to the queue")
        )
        self.job_id = job_id
        self.owner = owner
        self.holder = holder


class StoreUnavailable(RuntimeError):
    """The database could not be reached (refused connections, a dropped connection, a lock
    that timed out): the write may succeed if tried again later."""


class ApiKeyNotFound(LookupError):
    def __init__(self, key: int | str) -> None:
        super().__init__(f"no API key {key}")
        self.key = key


# The columns a schedule listing sorts on (``list_schedules``'s ``sort``).
SCHEDULE_SORTS = (
    "updated_at",
    "confirmed_at",
    "speedup",
    "gflops",
    "median_secs",
    "workload",
    "template",
    "target",
)


@dataclass(frozen=True)
class ScheduleListing:
    """A stored schedule with its workload and the fastest vendor-library time for the same
    (workload, target), None where no baseline was measured."""

    schedule: Schedule
    workload: Workload
    baseline_secs: float | None

    @property
    def best_secs(self) -> float:
        """The figure to quote: the confirmed re-timing where there is one."""
        c = self.schedule.confirmation
        return c.median_secs if c is not None else self.schedule.median_secs

    @property
    def speedup(self) -> float | None:
        """Vendor library time over this schedule's (above 1: tunehub's kernel is faster)."""
        return None if self.baseline_secs is None else self.baseline_secs / self.best_secs


class TunedShape(NamedTuple):
    """One schedule's workload fields and config (see ``ScheduleStore.tuned_shapes``)."""

    workload_key: str
    op: str
    m: int
    n: int
    k: int
    dtype: str
    a_layout: str
    b_layout: str
    epilogue: str
    config: str  # the config as the store holds it: JSON text (decoded once per distinct one)


@dataclass(frozen=True)
class ChangeMark:
    """Where a reader of ``ScheduleStore.lookup_changes`` stands (opaque to it): the newest
    record id seen and the ids seen just below it, the finished jobs seen, the models' and
    the API keys' fingerprints."""

    record_id: int = 0
    seen_records: frozenset[int] = frozenset()
    jobs_since: datetime | None = None
    seen_jobs: frozenset[tuple[int, datetime]] = frozenset()
    models: tuple[int, int] = (0, 0)
    api_keys: tuple[int, str] = (0, "")


@dataclass(frozen=True)
class LookupChanges:
    """What changed since a mark: the workloads whose schedules, baselines or confirmations
    may have changed (None: too many to list, assume all), whether models or API keys did."""

    mark: ChangeMark
    workload_keys: frozenset[str] | None = frozenset()
    models: bool = False
    api_keys: bool = False

    @property
    def any(self) -> bool:
        return (
            self.workload_keys is None or bool(self.workload_keys) or self.models or self.api_keys
        )


class ScheduleStore(ABC):
    # --- targets and workloads -------------------------------------------------------------
    @abstractmethod
    def put_target(self, target: Target) -> None:
        """Remember ``target`` under its target_key (idempotent)."""

    @abstractmethod
    def get_target(self, target_key: str) -> Target | None: ...

    @abstractmethod
    def get_targets(self, target_keys: Collection[str]) -> dict[str, Target]:
        """The stored targets among ``target_keys``, by key (unknown keys are left out), in a
        bounded number of queries however many keys are asked."""

    @abstractmethod
    def list_targets(self) -> list[Target]:
        """Every stored target, by kind then name then key."""

    @abstractmethod
    def put_workload(self, workload: Workload) -> None:
        """Remember ``workload`` under its key (idempotent)."""

    @abstractmethod
    def get_workload(self, workload_key: str) -> Workload | None: ...

    @abstractmethod
    def get_workloads(self, workload_keys: Collection[str]) -> dict[str, Workload]:
        """The stored workloads among ``workload_keys``, by key, in a bounded number of
        queries."""

    # --- workers ---------------------------------------------------------------------------
    @abstractmethod
    def register_worker(self, worker: Worker) -> None:
        """Store ``worker`` (its target must be stored), or refresh it if it is known."""

    @abstractmethod
    def heartbeat_worker(self, worker_id: str, *, at: datetime | None = None) -> bool:
        """Mark the worker alive now (or ``at``); False if it is not registered."""

    @abstractmethod
    def remove_worker(self, worker_id: str) -> None:
        """Forget the worker (idempotent)."""

    @abstractmethod
    def list_workers(
        self, *, target_key: str | None = None, live_since: datetime | None = None
    ) -> list[Worker]:
        """Registered workers (of one target), those that reported at or after ``live_since``
        only when it is given; oldest registration first."""

    # --- jobs ------------------------------------------------------------------------------
    @abstractmethod
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
        """Store a new QUEUED job (its workload too) and return it with its id.

        ``claimed=True`` stores it RUNNING (started now, owned by ``owner`` with a lease of
        ``lease_secs``) instead, for a caller that runs the job itself (``tunehub tune``), so
        no job runner can claim it while the caller renews the lease.
        The job's target must be stored first (``put_target``), else ValueError.

        ``api_key_id`` records the key that submitted it. With ``max_active_for_key`` (that
        key's jobs of the same priority: the jobs its lookups queued do not count against its
        own submissions) or ``max_active_total`` (every job), QueueFull is raised instead when that
        many jobs are already queued or running; the count and the insert are one transaction,
        so concurrent submissions cannot pass the limit together. ``priority`` orders the queue
        (``claim_job``); ``max_active_at_priority`` limits the active jobs of that same
        priority (the jobs lookups queue) in the same way.
        """

    @abstractmethod
    def get_job(self, job_id: int) -> Job:
        """The job, or raise JobNotFound."""

    @abstractmethod
    def list_jobs(
        self, *, limit: int = 50, offset: int = 0, states: Sequence[JobState] = ()
    ) -> list[Job]:
        """Jobs newest first (by id), optionally only those in ``states``."""

    @abstractmethod
    def count_jobs(
        self,
        *,
        states: Sequence[JobState] = (),
        target_keys: Collection[str] | None = None,
        api_key_id: int | None = None,
        min_priority: int | None = None,
    ) -> int:
        """Jobs in ``states`` (any), of ``target_keys``, submitted by ``api_key_id`` and of
        priority ``min_priority`` or higher (each when given)."""

    @abstractmethod
    def owner_queues(
        self, *, target_keys: Collection[str], since: datetime, min_priority: int | None = None
    ) -> list[OwnerQueue]:
        """The owners (API key ids; None for the jobs of no key) of QUEUED jobs of
        ``target_keys`` (of priority ``min_priority`` or higher, when given), each with its
        queued jobs, its oldest queued job's ``created_at``, and the latest ``started_at`` of
        its jobs of those targets that are QUEUED or RUNNING or ended at ``since`` or later;
        in one query (the runner's slice check, ``job_slice_secs``)."""

    @abstractmethod
    def active_jobs(
        self, *, workload_keys: Collection[str], target_keys: Collection[str]
    ) -> list[Job]:
        """QUEUED and RUNNING jobs of any of ``workload_keys`` on any of ``target_keys``,
        oldest first, in a bounded number of queries."""

    @abstractmethod
    def claim_job(
        self,
        *,
        owner: str = "",
        target_keys: Collection[str] | None = None,
        lease_secs: float = DEFAULT_LEASE_SECS,
        fair_share: FairShare | None = None,
    ) -> Job | None:
        """Atomically move a QUEUED job (for one of ``target_keys``, if given; of the highest
        priority, the one that has waited longest) to RUNNING (started now, owned by
        ``owner``, its lease ending ``lease_secs`` from now; a job that had started before
        keeps its first ``started_at`` and counts a resume). A job joins the back of the
        queue when it is created and each time it is moved back to QUEUED. Concurrent
        claimers (threads, processes, hosts) never get the same job. With ``fair_share``,
        the owner (API key) of the smallest recent usage over its weight goes first
        (``tunehub.core.fairshare``), then priority and age as without."""

    @abstractmethod
    def renew_leases(
        self, owner: str, job_ids: Collection[int], *, lease_secs: float = DEFAULT_LEASE_SECS
    ) -> set[int]:
        """Extend to ``lease_secs`` from now the leases ``owner`` holds on ``job_ids`` (RUNNING
        jobs owned by ``owner``) and return the ids renewed; the others are lost to the caller
        (requeued, taken by another owner, finished, or unknown) and it must stop running
        them. A lease that expired but was not requeued yet is renewed."""

    @abstractmethod
    def requeue_expired(self, *, now: datetime | None = None) -> list[int]:
        """Move back to QUEUED (owner cleared) every RUNNING job whose lease ended before
        ``now`` (default: now), or that has no lease; return their ids, ascending. The reaper
        of every job runner calls it, so a job whose runner died is taken up by another."""

    @abstractmethod
    def set_job_state(
        self,
        job_id: int,
        state: JobState,
        *,
        error: str = "",
        only_from: Sequence[JobState] = (),
        owner: str | None = None,
    ) -> Job:
        """Move a job to ``state`` with ``error`` and return it; raises JobNotFound.

        With ``only_from``, the move happens only if the job is in one of those states, and
        with ``owner`` only if ``owner`` holds it (fencing), checked and written in one
        transaction; otherwise the job is returned unchanged (compare its state and owner).
        QUEUED clears finished_at, the owner and the lease (started_at stays the first
        start); RUNNING keeps or sets
        started_at (and keeps the owner and lease); finished states set finished_at, end the
        lease and keep the owner (who ran it last).
        """

    # --- records and schedules -------------------------------------------------------------
    @abstractmethod
    def commit_records(
        self,
        records: Sequence[MeasureRecord],
        *,
        tuning_secs: Mapping[int, float] | None = None,
        owner: str | None = None,
        replayed: bool = False,
    ) -> int:
        """Store records in one transaction and update job progress and Schedules.

        Returns how many were new (duplicates by uid are skipped). Every record's workload and
        target are stored too. ``tuning_secs`` adds seconds of tuning time to jobs (by id), in
        the same transaction.

        Each new verdict adds one to its job's trials_done; a new ok record faster than the
        job's best becomes its best. A Schedule (workload, target, template) moves to a new ok
        record of a newer template version, or of the same version and strictly faster; a
        move clears the Schedule's confirmation. A record or ``tuning_secs`` entry whose job
        is not stored raises JobNotFound and nothing is stored.

        With ``owner`` (fencing), every job named must be held by ``owner``, checked in the
        same transaction: otherwise LeaseLost and nothing is stored. A job cancelled while
        its owner ran it is still the owner's, so what was in flight is stored.

        ``replayed``: the records come from the result journal (``tunehub.db.journal``), so
        a second replay must change nothing: each new record adds one to its job's
        ``replayed``, and a job's ``tuning_secs`` are added only if one of its records in the
        batch is new.
        """

    @abstractmethod
    def job_records(
        self, job_id: int, *, after: int | None = None, limit: int | None = None
    ) -> list[MeasureRecord]:
        """A job's records in commit order: those with ``seq`` above ``after`` (all if None),
        at most ``limit`` of them. Raises JobNotFound."""

    @abstractmethod
    def count_job_records(self, job_id: int, *, through: int | None = None) -> int:
        """How many records the job has (with ``seq`` at most ``through``, if given)."""

    @abstractmethod
    def records_for(
        self, *, workload_key: str, target_key: str, template: str | None = None
    ) -> list[MeasureRecord]:
        """All records for (workload, target[, template]), in commit order."""

    @abstractmethod
    def family_records(
        self,
        *,
        family_key: str,
        template: str,
        template_version: int | None = None,
        limit: int | None = None,
    ) -> list[MeasureRecord]:
        """Records of ``template`` (and version) for every workload on every target of the
        family, in commit order; with ``limit``, the latest that many."""

    @abstractmethod
    def get_schedule(
        self, *, workload_key: str, target_key: str, template: str | None = None
    ) -> Schedule | None:
        """The fastest schedule for (workload, target), over templates unless one is named."""

    @abstractmethod
    def family_schedules(
        self, *, workload_key: str, family_key: str, template: str | None = None
    ) -> list[Schedule]:
        """Schedules for this workload on any target of the family, fastest first."""

    def family_lookup(
        self, *, workload_key: str, family_key: str, template: str | None = None
    ) -> tuple[list[Schedule], list[MeasureRecord]]:
        """What a single lookup reads: ``family_schedules``, and when there is any, every
        Baseline's record of the workload on a target of the family (any library and
        config; none read when no schedule was found). The database reads both on one
        connection (a lookup is on every compiler's path: each round trip counts)."""
        schedules = self.family_schedules(
            workload_key=workload_key, family_key=family_key, template=template
        )
        if not schedules:
            return schedules, []
        baselines = [
            r
            for r in self.baselines_for(workload_keys=[workload_key])
            if r.request.target.family_key == family_key
        ]
        return schedules, baselines

    @abstractmethod
    def schedules_for(
        self, *, workload_keys: Collection[str], family_keys: Collection[str]
    ) -> dict[tuple[str, str], list[Schedule]]:
        """Schedules of any of ``workload_keys`` on any target of any of ``family_keys``, by
        (workload_key, family_key), each list fastest first (as ``family_schedules``), in a
        bounded number of queries however many keys are asked: what a batch lookup reads for
        all its items at once."""

    @abstractmethod
    def target_schedules(self, *, target_key: str, template: str | None = None) -> list[Schedule]:
        """Every schedule on one target, any order (the predicted tier reads ``tuned_shapes``
        instead: plain rows, no Schedule objects)."""

    @abstractmethod
    def tuned_shapes(
        self,
        *,
        target_key: str,
        template: str,
        template_version: int,
        workload_keys: Collection[str] | None = None,
    ) -> list[TunedShape]:
        """The workload fields and config of every schedule of ``template`` at
        ``template_version`` on one target (of ``workload_keys`` only, where given), by
        workload key: what the predicted tier's NeighbourIndex keeps, read as plain rows (no
        Schedule or Workload objects)."""

    @abstractmethod
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
        """One page of the stored schedules (filtered: ``op`` is the workload's operator),
        sorted on a ``SCHEDULE_SORTS`` column (ties by workload key, target key, template;
        schedules with no value for the column last), and how many match in all. The page is
        cut by the store, never by the caller."""

    @abstractmethod
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
        """Record a confirmation: the re-timed ``winner_uid`` (one of ``candidates``, record
        uids) becomes the Schedule, with ``confirmation``.

        Nothing changes (the current Schedule is returned) unless the current Schedule is one
        of ``candidates`` and the winner is an ok record of the same workload, target,
        template and template version: a record stored meanwhile by another job keeps its
        place. None if there is no Schedule.
        """

    # --- baselines -------------------------------------------------------------------------
    @abstractmethod
    def commit_baseline(self, record: MeasureRecord) -> bool:
        """Store a vendor library's measurement (a Baseline) in one transaction.

        The record (of a baseline template such as ``numpy.matmul``, no job) is stored with
        the other records, and, if ok, becomes the Baseline for (workload, target, template,
        config): the latest ok measurement wins, since a library is not tuned. Schedules are
        never touched. Returns whether the record was new.
        """

    @abstractmethod
    def get_baseline(
        self, *, workload_key: str, target_key: str, template: str, config: Config
    ) -> MeasureRecord | None:
        """The Baseline's record for this library and config, or None."""

    @abstractmethod
    def baselines_for(self, *, workload_keys: Collection[str]) -> list[MeasureRecord]:
        """Every Baseline's record of any of ``workload_keys`` (any target, library and
        config), in a bounded number of queries."""

    @abstractmethod
    def list_baselines(self, *, workload_key: str, target_key: str) -> list[MeasureRecord]:
        """Every Baseline of the workload on the target, by template then commit order."""

    # --- API keys ------------------------------------------------------------------------
    @abstractmethod
    def create_api_key(
        self,
        *,
        prefix: str,
        secret_hash: str,
        name: str,
        scope: Scope,
        limits: KeyLimits = NO_LIMITS,
    ) -> ApiKey:
        """Store a key by its public prefix and hash (ValueError if the prefix is taken)."""

    @abstractmethod
    def get_api_key(self, *, prefix: str | None = None, key_id: int | None = None) -> ApiKey | None:
        """The key with this prefix or id, revoked or not; None if there is none."""

    @abstractmethod
    def list_api_keys(self) -> list[ApiKey]:
        """Every key, revoked ones too, oldest first."""

    @abstractmethod
    def revoke_api_key(self, key_id: int) -> ApiKey:
        """Revoke a key from now on (idempotent: an earlier revocation time stays); raises
        ApiKeyNotFound."""

    # --- cost models -------------------------------------------------------------------------
    @abstractmethod
    def count_family_records(
        self,
        *,
        family_key: str,
        template: str,
        template_version: int | None = None,
        after: int | None = None,
    ) -> int:
        """How many records ``family_records`` would return with ``seq`` above ``after`` (all
        if None): what a trainer compares with a model's ``last_record_seq``."""

    @abstractmethod
    def register_model(self, info: ModelInfo, artifact: bytes) -> ModelInfo:
        """Store a trained model and its artifact in one transaction; returns it with its
        ``id`` and ``version`` (one more than the latest of its family, template and template
        version, from 1). ``info.id`` and ``info.version`` are ignored."""

    @abstractmethod
    def list_models(
        self, *, family_key: str | None = None, template: str | None = None, limit: int = 100
    ) -> list[ModelInfo]:
        """Registered models, newest first (by id), without their artifacts."""

    @abstractmethod
    def latest_model(
        self, *, family_key: str, template: str, template_version: int, accepted_only: bool = False
    ) -> ModelInfo | None:
        """The newest model of the family, template and template version, or None; with
        ``accepted_only``, the newest the quality gate accepted (the one in use)."""

    @abstractmethod
    def model_artifact(self, model_id: int) -> bytes | None:
        """The artifact of model ``model_id``, or None if there is no such model."""

    # --- shared autotuning results (tunehub.triton.autotune) -------------------------------
    @abstractmethod
    def put_autotune(self, result: AutotuneResult) -> tuple[AutotuneResult, bool]:
        """Store ``result`` unless one is stored under its cache key (the first stays: every
        process then runs the same config); returns the stored one and whether it is new."""

    @abstractmethod
    def get_autotune(self, cache_key: str) -> AutotuneResult | None: ...

    @abstractmethod
    def lookup_changes(self, since: ChangeMark | None = None) -> LookupChanges:
        """What may have changed a lookup's answer since ``since`` (None: nothing; just a mark
        to start from): the workloads with new records (so new schedules or baselines) or
        finished jobs (so confirmations), whether models were registered and whether API keys
        were made or revoked. Cheap: lookup caches in every serving process call it every
        few hundred milliseconds. See ``ChangeMark`` for the limits of what it sees."""

    async def family_lookup_async(
        self, *, workload_key: str, family_key: str, template: str | None = None
    ) -> list[Schedule] | None:
        """``family_lookup``'s schedules read on the running event loop, without a thread,
        where the store can (PostgreSQL) and the workload has no Baseline; None where it
        cannot (the caller reads with ``family_lookup``). Failures raise as they are."""
        return None

    async def aclose_async(self) -> None:  # noqa: B027 - optional hook
        """Close what ``family_lookup_async`` keeps for the running event loop."""

    def ping(self, *, timeout_secs: float = 1.0) -> None:  # noqa: B027 - optional hook
        """Raise ``StoreUnavailable`` unless the store could take a write now, waiting at most
        about ``timeout_secs`` for a lock (health checks call it; it writes nothing). A store
        in memory always can."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Dispose of connections."""
