"""Errors raised by core types; each names the field at fault so callers can report it."""

from __future__ import annotations


class InvalidSpec(ValueError):
    """A workload, config, budget or job spec is malformed.

    ``field`` is the dotted name of the offending field (``"m"``, ``"budget.max_trials"``).
    """

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason
