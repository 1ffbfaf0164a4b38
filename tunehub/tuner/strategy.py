"""Search strategies behind one ask/tell interface, the context they are built with, their registry.

A strategy is made from a StrategyContext (the space, the workload, the target, the template,
a read-only view of the store's history for this and similar workloads, a seed, the template's
seed configs and, optionally, a cost model). The Session owns the loop: it asks for as many
configs as it has free measurement slots, measures them, and tells the strategy each record as
it arrives. A strategy never touches the store or the workers.

Strategies are found by name in ``STRATEGIES`` (built-ins, then the ``tunehub.strategies``
entry points, then modules named in ``$TUNEHUB_STRATEGY_MODULES``).
"""

from __future__ import annotations

import itertools
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tunehub.core import Config, MeasureRecord, MeasureStatus, Target, Workload
from tunehub.core.registry import Registry
from tunehub.kernels.base import Template
from tunehub.kernels.space import SearchSpace
from tunehub.tuner.history import EmptyHistory, HistoryView

if TYPE_CHECKING:
    from tunehub.cost_model.base import CostModel


@dataclass(frozen=True)
class StrategyContext:
    """Everything a strategy may read. ``history`` is read-only; ``prior`` are the configs to
    measure first (the template's analytical model and its variants); ``cost_model`` is the
    model the strategy may consult and update (None: the strategy runs without one).
    ``model_refused`` says why the family's newest global model failed the quality gate when
    none is in use: a strategy then trains no stand-in on the same history."""

    space: SearchSpace
    workload: Workload
    target: Target
    template: Template
    history: HistoryView = field(default_factory=EmptyHistory)
    seed: int = 0
    prior: Sequence[Config] = ()
    cost_model: CostModel | None = None
    model_refused: str = ""


class Strategy(ABC):
    """Proposes configs (``ask``) and learns from measured records (``tell``); the caller loops.

    A strategy never proposes a config it has been told a verdict about or already proposed.
    Records whose status is not a verdict (``cancelled``, ``worker_error``) release their
    config, so it may be proposed again; except ``noisy``: the guard already re-measured it
    (a later job, whose history holds no noisy record, may try it again). ``ask`` returning
    an empty list means the space is exhausted. ``context.prior`` configs are proposed
    first, in order, when they are valid.
    """

    name: str

    def __init__(self, context: StrategyContext) -> None:
        self.context = context
        self.space = context.space
        self.seed = context.seed
        self.prior = [c for c in context.prior if context.space.is_valid(c)]
        self._seen: set[str] = set()

    def seen(self, config: Config) -> bool:
        return config.key in self._seen

    def tell(self, records: Sequence[MeasureRecord]) -> None:
        """Learn from measured records (also used to seed from history)."""
        for record in records:
            if record.verdict or record.status is MeasureStatus.NOISY:
                self._seen.add(record.config.key)
            else:
                self._seen.discard(record.config.key)

    def ask(self, n: int) -> list[Config]:
        """Up to ``n`` configs not seen yet."""
        out: list[Config] = []
        for config in itertools.chain(self.prior, self._candidates()):
            if len(out) >= n:
                break
            if config.key not in self._seen:
                self._seen.add(config.key)
                out.append(config)
        return out

    @abstractmethod
    def _candidates(self) -> Sequence[Config]:
        """Every config of the space in the order this strategy would try them."""


class ExhaustiveStrategy(Strategy):
    """Every valid config of the space, in enumeration order."""

    name = "exhaustive"

    def _candidates(self) -> Sequence[Config]:
        return self.space.points


class RandomStrategy(Strategy):
    """Uniform sampling without replacement, reproducible from ``seed``.

    The order is a seeded shuffle of the whole space, so a job that restarts with the same seed
    continues where it stopped instead of re-sampling measured points.
    """

    name = "random"

    def __init__(self, context: StrategyContext) -> None:
        super().__init__(context)
        self._order: list[Config] | None = None

    def _candidates(self) -> Sequence[Config]:
        if self._order is None:
            self._order = list(self.space.points)
            random.Random(self.seed).shuffle(self._order)
        return self._order


StrategyFactory = Callable[[StrategyContext], Strategy]

STRATEGIES: Registry[StrategyFactory] = Registry(
    "tunehub.strategies", kind="strategy", env_var="TUNEHUB_STRATEGY_MODULES"
)
STRATEGIES.register(ExhaustiveStrategy.name, ExhaustiveStrategy)
STRATEGIES.register(RandomStrategy.name, RandomStrategy)


def register_strategy(name: str, factory: StrategyFactory) -> StrategyFactory:
    """Offer ``factory`` (a Strategy subclass, or any callable taking a StrategyContext) under
    ``name``; plugin modules call this at import."""
    return STRATEGIES.register(name, factory)


def strategy_names() -> tuple[str, ...]:
    return STRATEGIES.names()


def make_strategy(name: str, context: StrategyContext) -> Strategy:
    """Build the strategy registered under ``name``; UnknownName (a KeyError) if none."""
    return STRATEGIES.get(name)(context)
