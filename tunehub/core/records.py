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
    """How a measurement ended. Only ``OK`` carries times."""

    OK = "ok"
    INVALID = "invalid"  # the config breaks the space's constraints
    BUILD_ERROR = "build_error"  # code generation or compilation failed
    RUNTIME_ERROR = "runtime_error"  # crashed (signal, exception) while running
    WRONG_ANSWER = "wrong_answer"  # output differs from the reference
    TIMEOUT = "timeout"  # did not finish within the measurer's limit


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
