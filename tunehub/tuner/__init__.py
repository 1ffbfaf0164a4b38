"""Search strategies (ask/tell), the tuning Session, and schedule lookup."""

from __future__ import annotations

# The model-guided and Optuna strategies register themselves (their heavy imports are lazy).
from tunehub.tuner import model_strategy as _model_strategy  # noqa: F401
from tunehub.tuner import optuna_strategy as _optuna_strategy  # noqa: F401
from tunehub.tuner.history import EmptyHistory, HistoryView, StaticHistory, StoreHistory
from tunehub.tuner.lease import LeaseKeeper
from tunehub.tuner.lookup import LookupAnswer, baseline_dict, baseline_for, find_schedule
from tunehub.tuner.session import (
    DatabaseOutage,
    Progress,
    Session,
    SessionResult,
    session_for_job,
)
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
    "DatabaseOutage",
    "EmptyHistory",
    "ExhaustiveStrategy",
    "HistoryView",
    "LeaseKeeper",
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
