"""Schedule: the best record for (workload, target, template), what compilers look up."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from tunehub.core.config import Config


@dataclass(frozen=True)
class Confirmation:
    """The winner re-timed at the end of a job, interleaved with the runners-up: the median of
    its per-round medians and their spread ((max - min) / median over the rounds)."""

    median_secs: float
    spread: float
    rounds: int
    confirmed_at: datetime
    # The other candidates' confirmed medians, by record uid (for the record).
    others: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Schedule:
    """``median_secs`` is the winning record's; ``confirmation`` (None until a job confirmed
    it) is the re-timed figure, the one to quote."""

    workload_key: str
    target_key: str
    template: str
    template_version: int
    config: Config
    median_secs: float
    gflops: float
    record_uid: str
    updated_at: datetime
    confirmation: Confirmation | None = None
