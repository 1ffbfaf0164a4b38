"""Measurements: statuses, MeasureRequest (asked), MeasureResult, MeasureRecord (stored)."""

from __future__ import annotations

import enum
import statistics
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from tunehub.core.config import Config
from tunehub.core.target import Target
from tunehub.core.workload import Workload


class MeasureStatus(enum.StrEnum):
    """How a measurement ended. Only ``OK`` carries times.

    The first six are verdicts on the config. The last three say the machine, not the config,
    ended the measurement: they are stored (a job's history shows them) but never count as a
    trial, never mark the config as measured, and never enter a model or a schedule.
    ``NOISY``: the config was timed, but no timing of it could be trusted (the machine was
    busy, or its times did not settle when re-measured); the error says why and the
    environment's ``guard`` keeps each attempt's time and machine state, never as a time.
    """

    OK = "ok"
    INVALID = "invalid"  # the config breaks the space's constraints
    BUILD_ERROR = "build_error"  # code generation or compilation failed
    RUNTIME_ERROR = "runtime_error"  # crashed (signal, exception) while running
    WRONG_ANSWER = "wrong_answer"  # output differs from the reference
    TIMEOUT = "timeout"  # did not finish within the measurer's limit
    CANCELLED = "cancelled"  # cut short by a cancel or a shutdown
    WORKER_ERROR = "worker_error"  # the sandbox could not start, or the worker was lost
    NOISY = "noisy"  # timed, but the timings could not be trusted (see the guard's reason)

    @property
    def verdict(self) -> bool:
        """Whether this status judges the config (rather than the machine)."""
        return self not in (
            MeasureStatus.CANCELLED,
            MeasureStatus.WORKER_ERROR,
            MeasureStatus.NOISY,
        )


VERDICTS = tuple(s for s in MeasureStatus if s.verdict)


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class MeasureRequest:
    """Measure ``config`` of ``template`` for ``workload`` on ``target``."""

    workload: Workload
    target: Target
    template: str
    template_version: int
    config: Config


@dataclass(frozen=True)
class MeasureResult:
    """What a worker answers. ``repeat_secs`` holds every timed repeat (empty unless ok)."""

    status: MeasureStatus
    repeat_secs: tuple[float, ...] = ()
    error: str = ""
    compile_secs: float = 0.0
    verify_secs: float = 0.0
    run_secs: float = 0.0
    environment: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status is MeasureStatus.OK and not self.repeat_secs:
            raise ValueError("an ok result needs at least one repeat time")
        if self.status is not MeasureStatus.OK and self.repeat_secs:
            raise ValueError(f"a {self.status.value} result carries no times")
        if any(not (t > 0 and t < float("inf")) for t in self.repeat_secs):
            raise ValueError(f"repeat times must be finite and positive: {self.repeat_secs}")

    @property
    def median_secs(self) -> float | None:
        return statistics.median(self.repeat_secs) if self.repeat_secs else None


@dataclass(frozen=True)
class MeasureRecord:
    """A stored measurement: the request, the result, where it belongs, when it was taken.

    ``uid`` identifies the record; storing a record whose uid is already stored is a no-op.
    ``job_id`` is None for measurements made outside a job (baselines, CLI runs, imports).
    """

    request: MeasureRequest
    result: MeasureResult
    job_id: int | None = None
    uid: str = field(default_factory=lambda: uuid.uuid4().hex)
    created_at: datetime = field(default_factory=utc_now)
    # The store's sequence number (increasing in commit order); None until stored.
    seq: int | None = field(default=None, compare=False)

    @property
    def status(self) -> MeasureStatus:
        return self.result.status

    @property
    def median_secs(self) -> float | None:
        return self.result.median_secs

    @property
    def gflops(self) -> float | None:
        secs = self.result.median_secs
        return self.request.workload.gflops(secs) if secs else None

    @property
    def config(self) -> Config:
        return self.request.config

    @property
    def verdict(self) -> bool:
        """Whether this record judges its config (see MeasureStatus.verdict)."""
        return self.result.status.verdict


RECORD_FORMAT = "tunehub.record/1"


def record_to_json(record: MeasureRecord) -> dict[str, Any]:
    """One self-describing JSON object per measurement (``RECORD_FORMAT``), for files and
    replay datasets: every field by name, the workload and target in full.

    >>> from tunehub.core.target import Target
    >>> from tunehub.core.workload import Workload
    >>> req = MeasureRequest(Workload(m=8, n=8, k=8), Target("cpu", "x", (), 1), "t", 1,
    ...                      Config({"MR": 4}))
    >>> rec = MeasureRecord(req, MeasureResult(MeasureStatus.OK, repeat_secs=(1e-6,)))
    >>> record_from_json(record_to_json(rec)) == rec
    True
    """
    request, result = record.request, record.result
    return {
        "format": RECORD_FORMAT,
        "uid": record.uid,
        "job_id": record.job_id,
        "created_at": record.created_at.isoformat(),
        "workload": request.workload.to_dict(),
        "target": request.target.to_dict(),
        "template": request.template,
        "template_version": request.template_version,
        "config": request.config.to_dict(),
        "status": result.status.value,
        "repeat_secs": list(result.repeat_secs),
        "error": result.error,
        "compile_secs": result.compile_secs,
        "verify_secs": result.verify_secs,
        "run_secs": result.run_secs,
        "environment": result.environment,
    }


def record_from_json(data: dict[str, Any]) -> MeasureRecord:
    """The inverse of ``record_to_json``; ValueError for another format."""
    if data.get("format") != RECORD_FORMAT:
        raise ValueError(f"not a {RECORD_FORMAT} record: format {data.get('format')!r}")
    request = MeasureRequest(
        workload=Workload.from_dict(data["workload"]),
        target=Target.from_dict(data["target"]),
        template=data["template"],
        template_version=int(data["template_version"]),
        config=Config(data["config"]),
    )
    result = MeasureResult(
        status=MeasureStatus(data["status"]),
        repeat_secs=tuple(float(s) for s in data.get("repeat_secs", ())),
        error=data.get("error", ""),
        compile_secs=float(data.get("compile_secs", 0.0)),
        verify_secs=float(data.get("verify_secs", 0.0)),
        run_secs=float(data.get("run_secs", 0.0)),
        environment=dict(data.get("environment", {})),
    )
    return MeasureRecord(
        request=request,
        result=result,
        job_id=data.get("job_id"),
        uid=data["uid"],
        created_at=datetime.fromisoformat(data["created_at"]),
    )
