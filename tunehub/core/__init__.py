"""Core types and keys (Workload, Target, Config, records, Job, Schedule); nothing heavy."""

from __future__ import annotations

from tunehub.core.apikey import ApiKey, KeyLimits, Scope
from tunehub.core.autotune import AutotuneResult
from tunehub.core.capabilities import Capabilities, Unsupported
from tunehub.core.config import Config, KnobValue
from tunehub.core.errors import InvalidSpec
from tunehub.core.job import Budget, Job, JobSpec, JobState
from tunehub.core.keys import canonical_json, sha256_key
from tunehub.core.model import ModelInfo
from tunehub.core.records import (
    RECORD_FORMAT,
    VERDICTS,
    MeasureRecord,
    MeasureRequest,
    MeasureResult,
    MeasureStatus,
    record_from_json,
    record_to_json,
    utc_now,
)
from tunehub.core.schedule import Confirmation, Schedule
from tunehub.core.target import LOCAL_CPU, Target, local_cpu_target
from tunehub.core.worker import Worker
from tunehub.core.workload import Workload

__all__ = [
    "LOCAL_CPU",
    "RECORD_FORMAT",
    "VERDICTS",
    "ApiKey",
    "AutotuneResult",
    "Budget",
    "Capabilities",
    "Config",
    "Confirmation",
    "InvalidSpec",
    "Job",
    "JobSpec",
    "JobState",
    "KeyLimits",
    "KnobValue",
    "MeasureRecord",
    "MeasureRequest",
    "MeasureResult",
    "MeasureStatus",
    "ModelInfo",
    "Schedule",
    "Scope",
    "Target",
    "Unsupported",
    "Worker",
    "Workload",
    "canonical_json",
    "local_cpu_target",
    "record_from_json",
    "record_to_json",
    "sha256_key",
    "utc_now",
]
