"""SearchSpace: a template's knobs for one workload and target, with constraints, built once."""

from __future__ import annotations

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


@dataclass(frozen=True)
class KnobConstraint:
    """A constraint that reads only ``knobs``; enumeration checks it as soon as those are set.

    >>> fits = KnobConstraint(("MR", "NR"), lambda c: int(c["MR"]) * int(c["NR"]) <= 64)
    >>> fits(Config({"MR": 4, "NR": 16}))
    True
    """

    knobs: tuple[str, ...]
    check: Callable[[Config], bool]

    def __call__(self, config: Config) -> bool:
        return self.check(config)


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

    def fix(self, **values: KnobValue) -> SearchSpace:
        """This space with the named knobs pinned to one value each (e.g. ``threads=1``).

        >>> space = SearchSpace((Knob("MR", (4, 8)), Knob("threads", (1, 2))))
        >>> [c["MR"] for c in space.fix(threads=2).points]
        [4, 8]
        """
        knobs = []
        for knob in self.knobs:
            if knob.name in values:
                if values[knob.name] not in knob.values:
                    raise ValueError(f"{knob.name}={values[knob.name]!r} is not in {knob.values}")
                knob = Knob(knob.name, (values[knob.name],))
            knobs.append(knob)
        unknown = set(values) - set(self.names)
        if unknown:
            raise ValueError(f"no knobs named {sorted(unknown)} in this space")
        return SearchSpace(tuple(knobs), self.constraints)

    def is_valid(self, config: Config) -> bool:
        if set(config) != set(self.names):
            return False
        for knob in self.knobs:
            if config[knob.name] not in knob.values:
                return False
        return all(check(config) for check in self.constraints)

    def _enumerate(self) -> Iterator[Config]:
        """Valid points in cross-product order.

        A KnobConstraint is checked as soon as the knobs it reads are set (knobs are set in
        order), so a large raw product with tight constraints stays cheap to enumerate; other
        constraints are checked on whole points.
        """
        if not self.knobs:
            empty = Config({})
            if all(check(empty) for check in self.constraints):
                yield empty
            return
        position = {name: i for i, name in enumerate(self.names)}
        stages: list[list[Constraint]] = [[] for _ in self.knobs]
        for check in self.constraints:
            depth = len(self.knobs) - 1
            if isinstance(check, KnobConstraint) and set(check.knobs) <= set(position):
                depth = max((position[name] for name in check.knobs), default=0)
            stages[depth].append(check)
        yield from self._extend({}, 0, stages)

    def _extend(
        self, partial: dict[str, KnobValue], depth: int, stages: list[list[Constraint]]
    ) -> Iterator[Config]:
        knob = self.knobs[depth]
        last = depth == len(self.knobs) - 1
        for value in knob.values:
            partial[knob.name] = value
            if last or stages[depth]:
                config = Config(dict(partial))
                if not all(check(config) for check in stages[depth]):
                    continue
                if last:
                    yield config
                    continue
            yield from self._extend(partial, depth + 1, stages)
        del partial[knob.name]

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
