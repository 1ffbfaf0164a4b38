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
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime

from tunehub.core import (
    ApiKey,
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


class ApiKeyNotFound(LookupError):
    def __init__(self, key: int | str) -> None:
        super().__init__(f"no API key {key}")
        self.key = key


class ScheduleStore(ABC):
    # --- targets and workloads -------------------------------------------------------------
    @abstractmethod
    def put_target(self, target: Target) -> None:
        """Remember ``target`` under its target_key (idempotent)."""

    @abstractmethod
    def get_target(self, target_key: str) -> Target | None: ...

    @abstractmethod
    def list_targets(self) -> list[Target]:
        """Every stored target, by kind then name then key."""

    @abstractmethod
    def put_workload(self, workload: Workload) -> None:
        """Remember ``workload`` under its key (idempotent)."""

    @abstractmethod
    def get_workload(self, workload_key: str) -> Workload | None: ...

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
        api_key_id: int | None = None,
        max_active_for_key: int | None = None,
        max_active_total: int | None = None,
    ) -> Job:
        """Store a new QUEUED job (its workload too) and return it with its id.

        ``claimed=True`` stores it RUNNING (started now, owned by ``owner``) instead, for a
        caller that runs the job itself (``tunehub tune``), so no job runner can claim it.
        The job's target must be stored first (``put_target``), else ValueError.

        ``api_key_id`` records the key that submitted it. With ``max_active_for_key`` (that
        key's jobs) or ``max_active_total`` (every job), QueueFull is raised instead when that
        many jobs are already queued or running; the count and the insert are one transaction,
        so concurrent submissions cannot pass the limit together.
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
    ) -> int:
        """Jobs in ``states`` (any), of ``target_keys`` and submitted by ``api_key_id`` (when
        given)."""

    @abstractmethod
    def claim_job(
        self, *, owner: str = "", target_keys: Collection[str] | None = None
    ) -> Job | None:
        """Atomically move the QUEUED job that has waited longest (for one of ``target_keys``,
        if given) to RUNNING (started now, owned by ``owner``). A job joins the back of the
        queue when it is created and each time it is moved back to QUEUED."""

    @abstractmethod
    def set_job_state(
        self,
        job_id: int,
        state: JobState,
        *,
        error: str = "",
        only_from: Sequence[JobState] = (),
    ) -> Job:
        """Move a job to ``state`` with ``error`` and return it; raises JobNotFound.

        With ``only_from``, the move happens only if the job is in one of those states, checked
        and written in one transaction; otherwise the job is returned unchanged (compare its
        state). QUEUED clears started_at, finished_at and the owner; RUNNING keeps or sets
        started_at; finished states set finished_at and clear the owner.
        """

    # --- records and schedules -------------------------------------------------------------
    @abstractmethod
    def commit_records(
        self,
        records: Sequence[MeasureRecord],
        *,
        tuning_secs: Mapping[int, float] | None = None,
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

    @abstractmethod
    def target_schedules(self, *, target_key: str, template: str | None = None) -> list[Schedule]:
        """Every schedule on one target (for predicting unseen shapes), any order."""

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
        self, *, family_key: str, template: str, template_version: int
    ) -> ModelInfo | None:
        """The newest model of the family, template and template version, or None."""

    @abstractmethod
    def model_artifact(self, model_id: int) -> bytes | None:
        """The artifact of model ``model_id``, or None if there is no such model."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Dispose of connections."""
