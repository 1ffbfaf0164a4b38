"""Fair share between keys: which queued job a runner claims next.

Each API key is an owner (the jobs of no key, from the CLI or before keys, are one owner).
An owner's *usage* is the device time its jobs spent tuning recently (``Job.tuning_secs``):
a job queued or running counts whole; a job that ended counts less and less as its end
recedes, nothing once it ended ``window_secs`` ago (a linear decay over the window). Its
*share* is its usage over its weight (``weights`` by key name; others weigh
``default_weight``). The next job is, of the queued ones:

1. people's jobs before those a lookup queued (priority below PERSON_PRIORITY), as before;
2. the owner of the smallest share first;
3. then the owner with fewer jobs running now (a job that just started has no time yet);
4. then the highest priority, then the job that has waited longest (queue order).

With one owner queued this is the old order: priority, then age. With a time slice, a key
with many jobs holds back another key's first job for one slice at most: the running job is
handed back at the end of its slice (another job waits), its time is counted for its owner,
and the other key, at share 0, is claimed next. When several keys' first jobs wait at once,
the running job's slice is shortened so that the last of them still starts within one slice
of the oldest's submission (``job_slice_secs``): with ``n`` such keys, the time left until
then is shared by the running job, the ``n - 1`` keys before the last and a margin. Such a
slice end does not wait for what the job has in flight (``first_jobs_waiting``): a trial,
or the library baseline a new job measures first, can take longer than the whole share on
a busy machine; it is cut short and measured again when the job resumes.

>>> from datetime import timedelta
>>> now = utc_now()
>>> usage = owner_usage(
...     [JobTime(1, 600.0, True, None), JobTime(2, 600.0, False, now - timedelta(minutes=30))],
...     now=now, window_secs=3600.0)
>>> usage
{1: 600.0, 2: 300.0}
>>> heads = [QueuedJob(10, 1, 0, 0), QueuedJob(11, 2, 0, 1), QueuedJob(12, 3, 0, 2)]
>>> fair_order(heads, usage, FairShare(weights={"big": 4.0}), names={1: "big"})
[12, 10, 11]
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tunehub.core.job import PERSON_PRIORITY
from tunehub.core.records import utc_now

DEFAULT_WINDOW_SECS = 3600.0


@dataclass(frozen=True)
class FairShare:
    """The fair-share policy: the usage window and the owners' weights (by key name)."""

    window_secs: float = DEFAULT_WINDOW_SECS
    weights: Mapping[str, float] = field(default_factory=dict)
    default_weight: float = 1.0

    def __post_init__(self) -> None:
        if not self.window_secs > 0:
            raise ValueError(f"window_secs must be > 0, got {self.window_secs!r}")
        for name, weight in {**self.weights, "(default)": self.default_weight}.items():
            if not weight > 0:
                raise ValueError(f"the weight of {name!r} must be > 0, got {weight!r}")

    def weight(self, name: str | None) -> float:
        if name is None:
            return self.default_weight
        return float(self.weights.get(name, self.default_weight))


@dataclass(frozen=True)
class JobTime:
    """One job's tuning time, for its owner's usage: ``active`` while queued or running
    (counts whole), else its ``finished_at`` decides how much still counts."""

    api_key_id: int | None
    tuning_secs: float
    active: bool
    finished_at: datetime | None


@dataclass(frozen=True)
class QueuedJob:
    """A queued job as the claim orders it; ``queue_position`` sorts as the queue does
    (when it joined, or the in-memory store's tick)."""

    job_id: int
    api_key_id: int | None
    priority: int
    queue_position: Any


@dataclass(frozen=True)
class OwnerQueue:
    """One owner's jobs of a target, as the running job's slice check sees them: how many
    wait, when the oldest of those was submitted, and when any job of the owner last
    started (running, handed back or ended lately)."""

    api_key_id: int | None
    queued: int
    first_created_at: datetime | None
    last_started_at: datetime | None

    @property
    def first_job_waits(self) -> bool:
        """Whether none of the owner's jobs has started since its oldest waiting job was
        submitted: its first job (of this visit) still waits."""
        return self.queued > 0 and (
            self.last_started_at is None
            or (self.first_created_at is not None and self.last_started_at < self.first_created_at)
        )


def first_jobs_waiting(owners: Iterable[OwnerQueue], *, own_key: int | None) -> list[datetime]:
    """When the other keys whose first job waits (``OwnerQueue.first_job_waits``) queued it:
    a job of ``own_key`` whose slice ends while this is not empty hands the device back at
    once, cutting short what it has in flight (it is measured again when the job resumes),
    since those keys were promised the device within one slice of queueing."""
    return [
        o.first_created_at
        for o in owners
        if o.first_job_waits and o.api_key_id != own_key and o.first_created_at is not None
    ]


def job_slice_secs(
    owners: Iterable[OwnerQueue],
    *,
    own_key: int | None,
    started_at: datetime,
    slice_secs: float,
    min_slice_secs: float,
) -> float | None:
    """How long a job of ``own_key`` that (re)started at ``started_at`` runs before it is
    handed back, with ``owners`` as they are now; None while nothing else waits.

    The whole slice, unless other keys wait whose first job has not started (no job of theirs
    has started since they queued: ``OwnerQueue.first_job_waits``): then the slice ends
    early enough that each of them starts within one slice of the oldest one's submission:
    the time left until then is shared evenly by this job, the keys before the last, and one
    share more, kept as a margin for the hand-backs (each cuts short what is in flight).
    Never shorter than ``min_slice_secs``.

    >>> from datetime import timedelta
    >>> t0 = utc_now()
    >>> new = [OwnerQueue(2, 1, t0, None), OwnerQueue(3, 1, t0, None)]
    >>> job_slice_secs(new, own_key=1, started_at=t0, slice_secs=30.0, min_slice_secs=1.0)
    10.0
    >>> job_slice_secs(new[:1], own_key=1, started_at=t0 - timedelta(seconds=10),
    ...                slice_secs=30.0, min_slice_secs=1.0)
    20.0
    >>> job_slice_secs([OwnerQueue(1, 4, t0, t0)], own_key=1, started_at=t0,
    ...                slice_secs=30.0, min_slice_secs=1.0)
    30.0
    """
    owners = list(owners)
    if not any(o.queued > 0 for o in owners):
        return None
    first = first_jobs_waiting(owners, own_key=own_key)
    if not first:
        return slice_secs
    left = (min(first) - started_at).total_seconds() + slice_secs
    return min(slice_secs, max(min_slice_secs, left / (len(first) + 1)))


def owner_usage(
    jobs: Iterable[JobTime], *, now: datetime | None = None, window_secs: float
) -> dict[int | None, float]:
    """Each owner's recent tuning seconds (see the module docstring)."""
    now = now or utc_now()
    usage: dict[int | None, float] = {}
    for job in jobs:
        if job.tuning_secs <= 0:
            continue
        share = 1.0
        if not job.active:
            if job.finished_at is None:
                continue
            age = (now - job.finished_at).total_seconds()
            share = max(0.0, 1.0 - max(0.0, age) / window_secs)
        if share > 0:
            usage[job.api_key_id] = usage.get(job.api_key_id, 0.0) + job.tuning_secs * share
    return usage


def fair_order(
    heads: Collection[QueuedJob],
    usage: Mapping[int | None, float],
    policy: FairShare,
    *,
    names: Mapping[int, str] | None = None,
    running: Mapping[int | None, int] | None = None,
) -> list[int]:
    """Job ids of ``heads`` in claim order (see the module docstring). ``names``: key names
    by id (for weights); ``running``: jobs running now per owner."""
    names = names or {}
    running = running or {}

    def key(job: QueuedJob) -> tuple[Any, ...]:
        owner = job.api_key_id
        weight = policy.weight(names.get(owner) if owner is not None else None)
        return (
            job.priority < PERSON_PRIORITY,
            usage.get(owner, 0.0) / weight,
            running.get(owner, 0),
            -job.priority,
            job.queue_position,
            job.job_id,
        )

    return [job.job_id for job in sorted(heads, key=key)]
