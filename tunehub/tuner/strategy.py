"""Search strategies behind one ask/tell interface, and their registry."""

from __future__ import annotations

import itertools
import random
from abc import ABC, abstractmethod
from collections.abc import Sequence

from tunehub.core import Config, MeasureRecord
from tunehub.kernels.space import SearchSpace


class Strategy(ABC):
    """Proposes configs (``ask``) and learns from measured records (``tell``); the caller loops.

    A strategy never proposes a config it has been told about or already proposed. ``ask``
    returning an empty list means the space is exhausted. ``prior`` configs (e.g. the
    template's analytical-model default) are proposed first, in order, when they are valid.
    """

    name: str

    def __init__(self, space: SearchSpace, *, seed: int = 0, prior: Sequence[Config] = ()) -> None:
        self.space = space
        self.seed = seed
        self.prior = [c for c in prior if space.is_valid(c)]
        self._seen: set[str] = set()

    def seen(self, config: Config) -> bool:
        return config.key in self._seen

    def tell(self, records: Sequence[MeasureRecord]) -> None:
        """Learn from measured records (also used to seed from history)."""
        self._seen.update(r.config.key for r in records)

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

    def __init__(self, space: SearchSpace, *, seed: int = 0, prior: Sequence[Config] = ()) -> None:
        super().__init__(space, seed=seed, prior=prior)
        self._order: list[Config] | None = None

    def _candidates(self) -> Sequence[Config]:
        if self._order is None:
            self._order = list(self.space.points)
            random.Random(self.seed).shuffle(self._order)
        return self._order


STRATEGIES: dict[str, type[Strategy]] = {
    ExhaustiveStrategy.name: ExhaustiveStrategy,
    RandomStrategy.name: RandomStrategy,
}


def make_strategy(
    name: str, space: SearchSpace, *, seed: int = 0, prior: Sequence[Config] = ()
) -> Strategy:
    """Build the strategy registered under ``name`` (``random``, ``exhaustive``)."""
    try:
        cls = STRATEGIES[name]
    except KeyError:
        known = ", ".join(sorted(STRATEGIES))
        raise KeyError(f"unknown strategy {name!r}; known: {known}") from None
    return cls(space, seed=seed, prior=prior)
