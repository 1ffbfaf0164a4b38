"""Search strategies (ask/tell), the tuning Session, and schedule lookup."""

from __future__ import annotations

from tunehub.tuner.history import EmptyHistory, HistoryView, StaticHistory, StoreHistory
from tunehub.tuner.lookup import LookupAnswer, baseline_dict, baseline_for, find_schedule
from tunehub.tuner.session import Progress, Session, SessionResult, session_for_job
from tunehub.tuner.strategy import (
    STRATEGIES,
    ExhaustiveStrategy,
    RandomStrategy,
    Strategy,
    StrategyContext,
    make_strategy,
    register_strategy,
    strategy_names,
)

__all__ = [
    "STRATEGIES",
    "EmptyHistory",
    "ExhaustiveStrategy",
    "HistoryView",
    "LookupAnswer",
    "Progress",
    "RandomStrategy",
    "Session",
    "SessionResult",
    "StaticHistory",
    "StoreHistory",
    "Strategy",
    "StrategyContext",
    "baseline_dict",
    "baseline_for",
    "find_schedule",
    "make_strategy",
    "register_strategy",
    "session_for_job",
    "strategy_names",
]
