"""Config: one point of a search space (knob -> value) with a stable hash."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from tunehub.core.errors import InvalidSpec
from tunehub.core.keys import canonical_json, sha256_key

KnobValue = int | str | bool


@dataclass(frozen=True)
class Config(Mapping[str, KnobValue]):
    """An immutable knob -> value mapping; knob names are spelled as the kernel spells them.

    Equality and the key tell ``True`` from ``1`` (Python's ``True == 1`` would not), so two
    configs are equal exactly when their keys are.

    >>> c = Config({"MR": 6, "NR": 16})
    >>> c["MR"], c == Config({"NR": 16, "MR": 6})
    (6, True)
    >>> Config({"PACKB": True}) == Config({"PACKB": 1})
    False
    """

    data: Mapping[str, KnobValue] = field(default_factory=dict)

    def __post_init__(self) -> None:
        items = dict(self.data)
        for name, value in items.items():
            if not isinstance(name, str) or not name:
                raise InvalidSpec("config", f"knob names must be non-empty strings, got {name!r}")
            if not isinstance(value, (int, str, bool)):
                raise InvalidSpec(f"config.{name}", f"must be int, str or bool, got {value!r}")
        object.__setattr__(self, "data", dict(sorted(items.items())))

    def __getitem__(self, name: str) -> KnobValue:
        return self.data[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)

    def __hash__(self) -> int:
        return hash(self._canonical)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Config):
            return self._canonical == other._canonical
        return NotImplemented

    @cached_property
    def _canonical(self) -> str:
        return canonical_json(self.data)

    def __repr__(self) -> str:
        return f"Config({dict(self.data)!r})"

    @cached_property
    def key(self) -> str:
        return sha256_key(dict(self.data))

    def typed_get(self, name: str, default: int) -> int:
        """An integer knob (not a bool), or ``default`` when absent or of another type."""
        value = self.data.get(name, default)
        return value if isinstance(value, int) and not isinstance(value, bool) else default

    def to_dict(self) -> dict[str, Any]:
        return dict(self.data)

    def replace(self, **changes: KnobValue) -> Config:
        return Config({**self.data, **changes})
