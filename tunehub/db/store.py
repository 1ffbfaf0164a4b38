"""ScheduleStore: the storage contract (targets, workloads, jobs, records, schedules).

Contract, for every implementation:
- Thread-safe: one store object is shared by the API and the job runner threads.
- Returned objects are frozen snapshots; later writes never change them.
- Records are immutable once stored; committing a record whose ``uid`` is stored is a no-op.
- ``commit_records`` is one transaction: the records, the job's progress and best so far, and
  every Schedule the new records beat are written together or not at all.
- Timestamps are timezone-aware UTC.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from tunehub.core import (
    Job,
    JobSpec,
    JobState,
    MeasureRecord,
    Schedule,
    Target,
    Workload,
)


class JobNotFound(LookupError):
    def __init__(self, job_id: int) -> None:
        super().__init__(f"no job with id {job_id}")
        self.job_id = job_id


class ScheduleStore(ABC):
    # --- targets and workloads -------------------------------------------------------------
    @abstractmethod
    def put_target(self, target: Target) -> None:
        """Remember ``target`` under its target_key (idempotent)."""

    @abstractmethod
    def get_target(self, target_key: str) -> Target | None: ...

    @abstractmethod
    def put_workload(self, workload: Workload) -> None:
        """Remember ``workload`` under its key (idempotent)."""

    @abstractmethod
    def get_workload(self, workload_key: str) -> Workload | None: ...

    # --- jobs ------------------------------------------------------------------------------
    @abstractmethod
    def create_job(self, spec: JobSpec, *, claimed: bool = False, owner: str = "") -> Job:
        """Store a new QUEUED job (its workload too) and return it with its id.

        ``claimed=True`` stores it RUNNING (started now, owned by ``owner``) instead, for a
        caller that runs the job itself (``tunehub tune``), so no job runner can claim it.
        The job's target must be stored first (``put_target``), else ValueError.
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
    def count_jobs(self, *, states: Sequence[JobState] = ()) -> int: ...

    @abstractmethod
    def claim_job(self, *, owner: str = "") -> Job | None:
        """Atomically move the oldest QUEUED job to RUNNING (started now, owned by ``owner``)."""

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
    def commit_records(self, records: Sequence[MeasureRecord]) -> int:
        """Store records in one transaction and update job progress and Schedules.

        Returns how many were new (duplicates by uid are skipped). Every record's workload and
        target are stored too. A Schedule (workload, target, template) moves to the fastest
        ``ok`` record.

        Each new record adds one to its job's trials_done; a new ok record faster than the job's
        best becomes its best. Only a strictly faster ok record moves a Schedule. A record whose
        job_id names no stored job raises JobNotFound and nothing is stored.
        """

    @abstractmethod
    def job_records(self, job_id: int) -> list[MeasureRecord]:
        """All records of a job, oldest first. Raises JobNotFound.

        Oldest means by created_at; records with equal times come in commit order, and by uid
        within one commit.
        """

    @abstractmethod
    def records_for(
        self, *, workload_key: str, target_key: str, template: str | None = None
    ) -> list[MeasureRecord]:
        """All records for (workload, target[, template]), oldest first (history for seeding)."""

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

    # --- baselines -------------------------------------------------------------------------
    @abstractmethod
    def commit_baseline(self, record: MeasureRecord) -> bool:
        """Store a vendor library's measurement (a Baseline) in one transaction.

        The record (of a baseline template such as ``numpy.matmul``, config ``{"threads": n}``,
        no job) is stored with the other records, and, if ok, becomes the Baseline for
        (workload, target, template, threads): the latest ok measurement wins, since a library
        is not tuned. Schedules are never touched. Returns whether the record was new.
        """

    @abstractmethod
    def get_baseline(
        self, *, workload_key: str, target_key: str, threads: int, template: str | None = None
    ) -> MeasureRecord | None:
        """The Baseline's record for ``threads`` threads (the fastest library if none named)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Dispose of connections."""
