"""Rules every ScheduleStore shares: input checks, job timestamps, picking the fastest record."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from tunehub.core import (
    Confirmation,
    JobSpec,
    JobState,
    MeasureRecord,
    MeasureStatus,
    ModelInfo,
    Schedule,
    Target,
    Worker,
)
from tunehub.db.store import (
    SCHEDULE_SORTS,
    ChangeMark,
    LookupChanges,
    QueueFull,
    ScheduleListing,
)

KEY_LENGTH = 64  # sha256 hex: workload, target, family and config keys
UID_LENGTH = 32  # uuid4 hex: record uids
OWNER_LENGTH = 160  # host:pid:random of the job runner holding a job
TEMPLATE_LENGTH = 64
TARGET_KIND_LENGTH = 16
TARGET_NAME_LENGTH = 256
SEED_RANGE = range(-(2**63), 2**63)  # a BIGINT column
MAX_LEASE_SECS = 24 * 3600.0

K = TypeVar("K", bound=Hashable)


def check_page(limit: int, offset: int) -> None:
    if limit < 0:
        raise ValueError(f"limit: must be >= 0, got {limit}")
    if offset < 0:
        raise ValueError(f"offset: must be >= 0, got {offset}")


def check_sort(sort: str) -> None:
    if sort not in SCHEDULE_SORTS:
        raise ValueError(f"sort: expected one of {', '.join(SCHEDULE_SORTS)}; got {sort!r}")


def listing_sort_value(item: ScheduleListing, sort: str) -> Any:
    """The value ``item`` sorts by on column ``sort`` (None: it has none, it goes last)."""
    s = item.schedule
    if sort == "workload":
        return (item.workload.m, item.workload.n, item.workload.k)
    if sort == "confirmed_at":
        return s.confirmation.confirmed_at if s.confirmation else None
    if sort == "speedup":
        return item.speedup
    if sort == "median_secs":
        return item.best_secs
    if sort == "target":
        return s.target_key
    value: Any = getattr(s, sort)
    return value


def unknown_target(target_key: str) -> ValueError:
    return ValueError(
        f"target_key: unknown target {target_key!r}; store it with put_target() before "
        "creating a job for it"
    )


def _check_length(field: str, value: str, limit: int) -> None:
    if len(value) > limit:
        raise ValueError(f"{field}: at most {limit} characters, got {len(value)}: {value[:80]!r}")


def check_target(target: Target) -> None:
    """Refuse a target whose fields do not fit the database's columns."""
    _check_length("target.kind", target.kind, TARGET_KIND_LENGTH)
    _check_length("target.name", target.name, TARGET_NAME_LENGTH)


MODEL_KIND_LENGTH = 32
MODEL_FEATURES_LENGTH = 96


def check_model(info: ModelInfo) -> None:
    """Refuse a model whose fields do not fit the database's columns."""
    _check_length("model.template", info.template, TEMPLATE_LENGTH)
    _check_length("model.kind", info.kind, MODEL_KIND_LENGTH)
    _check_length("model.features", info.features, MODEL_FEATURES_LENGTH)
    _check_length("model.target_label", info.target_label, TARGET_NAME_LENGTH)
    if info.created_at.tzinfo is None:
        raise ValueError("model.created_at: naive datetime; tunehub stores aware UTC times")


def check_spec(spec: JobSpec) -> None:
    """Refuse a job spec whose fields do not fit the database's columns."""
    _check_length("template", spec.template, TEMPLATE_LENGTH)
    if spec.seed not in SEED_RANGE:
        raise ValueError(f"seed: must fit in 64 bits, got {spec.seed}")


def check_records(records: Sequence[MeasureRecord]) -> list[MeasureRecord]:
    """Validate ``records`` and drop repeats of a uid within the batch (the first one wins).

    Every backend refuses the same things: uids that do not fit, naive times, names too long
    for their columns, and environments that are not strict JSON (NaN is not JSON).
    """
    seen: set[str] = set()
    unique: list[MeasureRecord] = []
    for record in records:
        uid = record.uid
        if not isinstance(uid, str) or not 0 < len(uid) <= UID_LENGTH:
            raise ValueError(f"uid: must be a string of 1..{UID_LENGTH} characters, got {uid!r}")
        created_at = record.created_at
        if created_at.tzinfo is None or created_at.utcoffset() is None:
            raise ValueError(f"created_at: record {uid} has a naive datetime; use aware UTC")
        _check_length("template", record.request.template, TEMPLATE_LENGTH)
        check_target(record.request.target)
        try:
            json.dumps(record.result.environment, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"environment: record {uid} is not JSON: {exc}") from None
        if uid not in seen:
            seen.add(uid)
            unique.append(record)
    return unique


def job_times(
    state: JobState, started_at: datetime | None, finished_at: datetime | None, now: datetime
) -> tuple[datetime | None, datetime | None]:
    """(started_at, finished_at) after a move to ``state``.

    QUEUED keeps the first start and clears the finish (the job resumes later); RUNNING keeps
    an earlier start or starts now and clears the finish; a finished state finishes now.
    """
    if state is JobState.QUEUED:
        return started_at, None
    if state is JobState.RUNNING:
        return started_at or now, None
    return started_at, now


def replayed_counts(new: Sequence[MeasureRecord]) -> dict[int, int]:
    """New records replayed from the result journal, by job."""
    counts: dict[int, int] = {}
    for record in new:
        if record.job_id is not None:
            counts[record.job_id] = counts.get(record.job_id, 0) + 1
    return counts


def replayed_secs(new: Sequence[MeasureRecord], secs: dict[int, float]) -> dict[int, float]:
    """The tuning seconds of a replayed batch that count: those of jobs with a new record (a
    batch replayed twice adds its seconds once)."""
    jobs = {record.job_id for record in new}
    return {job_id: value for job_id, value in secs.items() if job_id in jobs}


def lease_end(now: datetime, lease_secs: float) -> datetime:
    """When a lease taken or renewed at ``now`` for ``lease_secs`` ends (ValueError unless
    ``lease_secs`` is a positive number)."""
    if isinstance(lease_secs, bool) or not isinstance(lease_secs, (int, float)):
        raise ValueError(f"lease_secs: must be a number, got {lease_secs!r}")
    if not 0 < lease_secs <= MAX_LEASE_SECS:
        raise ValueError(f"lease_secs: must be in (0, {MAX_LEASE_SECS:.0f}], got {lease_secs}")
    return now + timedelta(seconds=lease_secs)


def fastest_ok(
    records: Iterable[MeasureRecord], key: Callable[[MeasureRecord], K | None]
) -> dict[K, MeasureRecord]:
    """The fastest ok record per ``key`` (None: skip the record); on a tie the earlier stays."""
    best: dict[K, MeasureRecord] = {}
    for record in records:
        median = record.median_secs
        k = key(record)
        if record.status is not MeasureStatus.OK or median is None or k is None:
            continue
        current = best.get(k)
        if current is None or median < (current.median_secs or float("inf")):
            best[k] = record
    return best


def schedule_key(record: MeasureRecord) -> tuple[str, str, str]:
    request = record.request
    return request.workload.key, request.target.target_key, request.template


def schedule_of(record: MeasureRecord, updated_at: datetime) -> Schedule:
    """The Schedule that ``record`` (an ok record) would set."""
    median = record.median_secs
    gflops = record.gflops
    if median is None or gflops is None:
        raise ValueError(f"record {record.uid} is {record.status.value}, not ok: no schedule")
    request = record.request
    return Schedule(
        workload_key=request.workload.key,
        target_key=request.target.target_key,
        template=request.template,
        template_version=request.template_version,
        config=request.config,
        median_secs=median,
        gflops=gflops,
        record_uid=record.uid,
        updated_at=updated_at.astimezone(UTC),
    )


def check_baseline(record: MeasureRecord) -> None:
    if record.job_id is not None:
        raise ValueError("a baseline record belongs to no job (job_id must be None)")


WORKER_FIELD_LENGTHS = {"worker_id": 64, "host": 255, "kind": 16, "device": 32}


def check_worker(worker: Worker) -> None:
    """Refuse a worker whose fields do not fit the database's columns."""
    for name, limit in WORKER_FIELD_LENGTHS.items():
        value = getattr(worker, name)
        if not isinstance(value, str) or not value:
            raise ValueError(f"worker.{name}: must be a non-empty string")
        _check_length(f"worker.{name}", value, limit)
    for name in ("started_at", "heartbeat_at"):
        when = getattr(worker, name)
        if when.tzinfo is None or when.utcoffset() is None:
            raise ValueError(f"worker.{name}: naive datetime; use aware UTC")
    try:
        json.dumps(worker.info, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"worker.info: not JSON: {exc}") from None


def trials_of(records: Iterable[MeasureRecord]) -> dict[int, int]:
    """Verdicts per job: what each record adds to its job's trials_done."""
    counts: dict[int, int] = {}
    for record in records:
        if record.job_id is not None and record.verdict:
            counts[record.job_id] = counts.get(record.job_id, 0) + 1
    return counts


def check_tuning_secs(tuning_secs: Mapping[int, float] | None) -> dict[int, float]:
    """Validated seconds of tuning time per job id."""
    out: dict[int, float] = {}
    for job_id, secs in (tuning_secs or {}).items():
        if not (isinstance(secs, (int, float)) and 0 <= secs < float("inf")):
            raise ValueError(f"tuning_secs: job {job_id} needs a finite number >= 0, got {secs}")
        if secs:
            out[int(job_id)] = float(secs)
    return out


def confirmed_schedule(
    current: Schedule | None,
    winner: MeasureRecord | None,
    candidates: Collection[str],
    confirmation: Confirmation,
    now: datetime,
) -> Schedule | None:
    """The Schedule after a confirmation, or None to leave ``current`` as it is (see
    ``ScheduleStore.confirm_schedule``)."""
    if current is None or winner is None:
        return None
    if current.record_uid not in candidates or winner.uid not in candidates:
        return None
    if (
        winner.status is not MeasureStatus.OK
        or schedule_key(winner) != (current.workload_key, current.target_key, current.template)
        or winner.request.template_version != current.template_version
    ):
        return None
    updated_at = current.updated_at if winner.uid == current.record_uid else now
    return dataclasses.replace(schedule_of(winner, updated_at), confirmation=confirmation)


def replaces(version: int, median_secs: float, current: Schedule) -> bool:
    """Whether an ok record (of template ``version``, ``median_secs``) replaces ``current``:
    a newer template version always does (an older one's configs may not build any more), an
    older one never does, and within one version only a strictly faster record does."""
    if version != current.template_version:
        return version > current.template_version
    return median_secs < current.median_secs


ACTIVE_STATES = (JobState.QUEUED, JobState.RUNNING)


def check_queue(
    *,
    for_key: int,
    key_limit: int | None,
    total: int,
    total_limit: int | None,
    at_priority: int = 0,
    priority_limit: int | None = None,
) -> None:
    """Raise QueueFull when a new job would pass a limit on queued-or-running jobs."""
    if priority_limit is not None and at_priority >= priority_limit:
        raise QueueFull(
            f"{at_priority} jobs queued by lookups are queued or running, the limit is "
            f"{priority_limit}",
            limit=priority_limit,
            active=at_priority,
        )
    if key_limit is not None and for_key >= key_limit:
        raise QueueFull(
            f"this key has {for_key} jobs queued or running, its limit is {key_limit}: wait "
            "for some to finish or cancel them",
            limit=key_limit,
            active=for_key,
        )
    if total_limit is not None and total >= total_limit:
        raise QueueFull(
            f"the service has {total} jobs queued or running, its limit is {total_limit}: "
            "try again later",
            limit=total_limit,
            active=total,
        )


# --- change feed for lookup caches ----------------------------------------------------------
# Record ids a reader looks back over: a transaction that took its ids before others but
# committed after them is still seen, unless more than this many records committed meanwhile.
CHANGE_LOOKBACK_IDS = 1000
# More changed workloads than this in one read: the reader forgets everything instead.
CHANGE_MAX_LISTED = 10_000
# Finished jobs are looked back over this long, for the same reason.
CHANGE_LOOKBACK_SECS = 60.0


def record_floor(since: ChangeMark | None) -> int | None:
    """Read records with ids above this (None: only the newest id is needed)."""
    return None if since is None else max(since.record_id - CHANGE_LOOKBACK_IDS, 0)


def jobs_floor(since: ChangeMark | None, now: datetime) -> datetime:
    """Read jobs finished at or after this."""
    seen = since.jobs_since if since is not None and since.jobs_since is not None else now
    return seen - timedelta(seconds=CHANGE_LOOKBACK_SECS)


def changes_since(
    since: ChangeMark | None,
    *,
    newest_record_id: int,
    records: Sequence[tuple[int, str]],
    jobs: Sequence[tuple[int, str, datetime]],
    models: tuple[int, int],
    api_keys: tuple[int, str],
    now: datetime,
) -> LookupChanges:
    """The changes between ``since`` and the rows read: ``records`` are (id, workload key)
    above ``record_floor(since)`` in id order (at most CHANGE_LOOKBACK_IDS + CHANGE_MAX_LISTED
    + 1), ``jobs`` (id, workload key, finished_at) finished since ``jobs_floor``."""
    top = max(newest_record_id, since.record_id if since is not None else 0)
    floor = top - CHANGE_LOOKBACK_IDS
    mark = ChangeMark(
        record_id=top,
        seen_records=frozenset(i for i, _ in records if i > floor),
        jobs_since=max((at for _, _, at in jobs), default=None)
        or (since.jobs_since if since is not None else None)
        or now,
        seen_jobs=frozenset((i, at) for i, _, at in jobs),
        models=models,
        api_keys=api_keys,
    )
    if since is None:
        return LookupChanges(mark)
    changed = {key for i, key in records if i not in since.seen_records}
    changed |= {key for i, key, at in jobs if (i, at) not in since.seen_jobs}
    overflow = len(records) > CHANGE_LOOKBACK_IDS + CHANGE_MAX_LISTED or len(changed) > (
        CHANGE_MAX_LISTED
    )
    return LookupChanges(
        mark,
        workload_keys=None if overflow else frozenset(changed),
        models=models != since.models,
        api_keys=api_keys != since.api_keys,
    )
