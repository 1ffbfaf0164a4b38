"""Schedule: the best record for (workload, target, template), what compilers look up."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from tunehub.core.config import Config


@dataclass(frozen=True)
class Schedule:
    workload_key: str
    target_key: str
    template: str
    template_version: int
    config: Config
    median_secs: float
    gflops: float
    record_uid: str
    updated_at: datetime
