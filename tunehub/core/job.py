"""Job: one tuning request (workload, target, template, strategy, budget) and its state."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tunehub.core.errors import InvalidSpec
from tunehub.core.workload import Workload

MAX_TRIALS = 100_000
MAX_SECS = 7 * 24 * 3600.0
# The strategy a job gets when it names none: the one benchmarks/search_efficiency.py shows
# reaching 95% of the best in the fewest trials on the replay datasets (see README).
DEFAULT_STRATEGY = "transfer"
# Job priorities: runners claim a job of a higher priority first. Jobs people submit (API, CLI)
# run at PERSON; jobs queued by lookups (``tune=true``, ``tune_unseen``) at LOOKUP, so they use
# a device only while no person's job of its target waits.
PERSON_PRIORITY = 0
LOOKUP_PRIORITY = -10
# Longest template and strategy names (the database's columns).
NAME_LENGTHS = {"template": 64, "strategy": 32}


class JobState(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


@dataclass(frozen=True)
class Budget:
    """When a Session stops: after ``max_trials`` measurements or ``max_secs`` of wall time."""

    max_trials: int = 32
    max_secs: float = 300.0

    def __post_init__(self) -> None:
        if isinstance(self.max_trials, bool) or not isinstance(self.max_trials, int):
            raise InvalidSpec("budget.max_trials", "must be an integer")
        if not 1 <= self.max_trials <= MAX_TRIALS:
            raise InvalidSpec("budget.max_trials", f"must be in 1..{MAX_TRIALS}")
        if isinstance(self.max_secs, bool) or not isinstance(self.max_secs, (int, float)):
            raise InvalidSpec("budget.max_secs", "must be a number")
        if not 0 < self.max_secs <= MAX_SECS:
            raise InvalidSpec("budget.max_secs", f"must be in (0, {MAX_SECS:.0f}]")

    def to_dict(self) -> dict[str, Any]:
        return {"max_trials": self.max_trials, "max_secs": self.max_secs}


@dataclass(frozen=True)
class JobSpec:
    """What was asked: tune ``template`` for ``workload`` on the target with ``target_key``.

    Template and strategy names are checked against their registries where a job is made (the
    API, the CLI); here only their form is.
    """

    workload: Workload
    target_key: str
    template: str = "blis.gemm"
    strategy: str = DEFAULT_STRATEGY
    budget: Budget = Budget()
    seed: int = 0

    def __post_init__(self) -> None:
        for name, limit in NAME_LENGTHS.items():
            value = getattr(self, name)
            if not isinstance(value, str) or not 0 < len(value) <= limit:
                raise InvalidSpec(name, f"must be a name of 1..{limit} characters")


@dataclass(frozen=True)
class Job:
    """A stored job: its spec, state and progress (a snapshot; stores return new objects)."""

    id: int
    spec: JobSpec
    state: JobState
    trials_done: int
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    error: str = ""
    best_record_uid: str | None = None
    best_median_secs: float | None = None
    # The job runner that holds (or last held) it (see tunehub.core.owner); "" while QUEUED.
    owner: str = ""
    # When the owner's lease ends unless renewed; None unless RUNNING.
    lease_expires_at: datetime | None = None
    # Wall time spent tuning (measuring candidates) over every run of the job; baselines and
    # the final confirmation are timed apart. ``budget.max_secs`` is checked against it.
    tuning_secs: float = 0.0
    # The API key that submitted it (None: the CLI, or before keys existed).
    api_key_id: int | None = None
    # PERSON_PRIORITY, or LOOKUP_PRIORITY for a job a lookup queued (claimed after people's).
    priority: int = PERSON_PRIORITY
    # How often a runner resumed it (claimed it again after it had started: a time slice
    # over, a restart, a lost lease) and when it last did; ``started_at`` stays the first start.
    resumes: int = 0
    resumed_at: datetime | None = None
    # Results measured while the database was away that reached it through the result journal
    # (tunehub.db.journal) rather than at once.
    replayed: int = 0

    @property
    def from_lookup(self) -> bool:
        return self.priority < PERSON_PRIORITY

    @property
    def best_gflops(self) -> float | None:
        if self.best_median_secs is None:
            return None
        return self.spec.workload.gflops(self.best_median_secs)
