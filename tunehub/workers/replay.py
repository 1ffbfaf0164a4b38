"""ReplayMeasurer: the in-memory measurer double that answers from stored records."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from tunehub.core import MeasureRecord, MeasureRequest, MeasureResult, MeasureStatus
from tunehub.workers.base import Measurer

ReplayKey = tuple[str, str, str, str]
NOT_IN_HISTORY = "not in replay history"


def replay_key(request: MeasureRequest) -> ReplayKey:
    """(workload key, target key, template, config key); the template version is not part of
    it, so a history outlives version bumps that do not change timings."""
    return (
        request.workload.key,
        request.target.target_key,
        request.template,
        request.config.key,
    )


class ReplayMeasurer(Measurer):
    """Answers each request with the result of the matching stored record, without hardware.

    When a request matches several records the latest (by ``created_at``, then by order
    given) answers. A request with no record gets ``fallback(request)`` if given, else an
    ``invalid`` result saying it is not in the replay history. ``requests`` keeps every
    request asked, in order, so tests can check what a strategy measured.

    >>> ReplayMeasurer([]).measure([])
    []
    """

    def __init__(
        self,
        records: Iterable[MeasureRecord],
        *,
        fallback: Callable[[MeasureRequest], MeasureResult] | None = None,
        progress: Callable[[MeasureRequest, MeasureResult], None] | None = None,
    ) -> None:
        self._results: dict[ReplayKey, tuple[MeasureRecord, MeasureResult]] = {}
        self.fallback = fallback
        self.progress = progress
        self.requests: list[MeasureRequest] = []
        self.add(records)

    def add(self, records: Iterable[MeasureRecord]) -> None:
        """Extend the history."""
        for record in records:
            key = replay_key(record.request)
            known = self._results.get(key)
            if known is None or record.created_at >= known[0].created_at:
                self._results[key] = (record, record.result)

    def __len__(self) -> int:
        return len(self._results)

    def __contains__(self, request: object) -> bool:
        return isinstance(request, MeasureRequest) and replay_key(request) in self._results

    def measure(self, requests: Sequence[MeasureRequest]) -> list[MeasureResult]:
        results = []
        for request in requests:
            self.requests.append(request)
            known = self._results.get(replay_key(request))
            if known is not None:
                result = known[1]
            elif self.fallback is not None:
                result = self.fallback(request)
            else:
                result = MeasureResult(MeasureStatus.INVALID, error=NOT_IN_HISTORY)
            results.append(result)
            if self.progress is not None:
                self.progress(request, result)
        return results
