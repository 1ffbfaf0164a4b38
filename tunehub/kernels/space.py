"""SearchSpace: a template's knobs for one workload and target, with constraints, built once."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from tunehub.core import Config, KnobValue

Constraint = Callable[[Config], bool]


@dataclass(frozen=True)
class Knob:
    """One tunable parameter and the values it may take, in a meaningful order."""

    name: str
    values: tuple[KnobValue, ...]

    def __post_init__(self) -> None:
        if not self.values:
            raise ValueError(f"knob {self.name} has no values")


@dataclass
class SearchSpace:
    """The cross product of ``knobs`` filtered by ``constraints`` (Python predicates, no eval).

    Valid points are enumerated once, lazily, so sampling and neighbours are cheap afterwards.
    Spaces stay small enough to enumerate (the templates bound them to ~1e5 points).
    """

    knobs: tuple[Knob, ...]
    constraints: tuple[Constraint, ...] = ()
    _points: list[Config] | None = field(default=None, init=False, repr=False)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(k.name for k in self.knobs)

    def is_valid(self, config: Config) -> bool:
        if set(config) != set(self.names):
            return False
        for knob in self.knobs:
            if config[knob.name] not in knob.values:
                return False
        return all(check(config) for check in self.constraints)

    def _enumerate(self) -> Iterator[Config]:
        for combo in itertools.product(*(k.values for k in self.knobs)):
            config = Config(dict(zip(self.names, combo, strict=True)))
            if all(check(config) for check in self.constraints):
                yield config

    @property
    def points(self) -> Sequence[Config]:
        """Every valid config, in knob order."""
        if self._points is None:
            self._points = list(self._enumerate())
        return self._points

    def __len__(self) -> int:
        return len(self.points)

    def sample(self, rng: random.Random, n: int) -> list[Config]:
        """Up to ``n`` distinct valid configs, uniformly at random."""
        pts = self.points
        return rng.sample(list(pts), min(n, len(pts)))

    def neighbours(self, config: Config) -> list[Config]:
        """Valid configs that differ from ``config`` by one step of one knob."""
        out = []
        for knob in self.knobs:
            idx = knob.values.index(config[knob.name])
            for step in (-1, 1):
                if 0 <= idx + step < len(knob.values):
                    cand = config.replace(**{knob.name: knob.values[idx + step]})
                    if all(check(cand) for check in self.constraints):
                        out.append(cand)
        return out
