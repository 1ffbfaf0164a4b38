"""Search strategies (ask/tell), the tuning Session, and schedule lookup."""

from __future__ import annotations

from tunehub.tuner.lookup import LookupAnswer, baseline_dict, find_schedule, target_baselines
from tunehub.tuner.session import Progress, Session, SessionResult, session_for_job
from tunehub.tuner.strategy import (
    STRATEGIES,
    ExhaustiveStrategy,
    RandomStrategy,
    Strategy,
    make_strategy,
)

__all__ = [
    "STRATEGIES",
    "ExhaustiveStrategy",
    "LookupAnswer",
    "Progress",
    "RandomStrategy",
    "Session",
    "SessionResult",
    "Strategy",
    "baseline_dict",
    "find_schedule",
    "make_strategy",
    "session_for_job",
    "target_baselines",
]
