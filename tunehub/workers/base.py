"""Measurer: the interface every worker implements (local sandbox, replay, Ray)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from tunehub.core import MeasureRequest, MeasureResult


class Measurer(ABC):
    """Turns MeasureRequests into MeasureResults, one per request, in the same order.

    A candidate that crashes or hangs yields a ``runtime_error`` / ``timeout`` result; it never
    raises out of ``measure`` and never takes the measurer down.
    """

    @abstractmethod
    def measure(self, requests: Sequence[MeasureRequest]) -> list[MeasureResult]:
        """Measure every request and return their results in order."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release processes or connections."""
