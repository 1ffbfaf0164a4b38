"""Core types and keys (Workload, Target, Config, records, Job, Schedule); nothing heavy."""

from __future__ import annotations

from tunehub.core.config import Config, KnobValue
from tunehub.core.errors import InvalidSpec
from tunehub.core.job import STRATEGIES as core_strategies
from tunehub.core.job import Budget, Job, JobSpec, JobState
from tunehub.core.keys import canonical_json, sha256_key
from tunehub.core.records import (
    MeasureRecord,
    MeasureRequest,
    MeasureResult,
    MeasureStatus,
    utc_now,
)
from tunehub.core.schedule import Schedule
from tunehub.core.target import LOCAL_CPU, Target, local_cpu_target
from tunehub.core.workload import Workload

__all__ = [
    "LOCAL_CPU",
    "Budget",
    "Config",
    "InvalidSpec",
    "Job",
    "JobSpec",
    "JobState",
    "KnobValue",
    "MeasureRecord",
    "MeasureRequest",
    "MeasureResult",
    "MeasureStatus",
    "Schedule",
    "Target",
    "Workload",
    "canonical_json",
    "core_strategies",
    "local_cpu_target",
    "sha256_key",
    "utc_now",
]
