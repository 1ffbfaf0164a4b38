"""ReplayMeasurer: the in-memory measurer double that answers from stored records."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import Future

from tunehub.core import MeasureRecord, MeasureRequest, MeasureResult, MeasureStatus, Target
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

    Futures come back already resolved. When a request matches several records the latest
    (by ``created_at``, then by order given) answers. A request with no record gets
    ``fallback(request)`` if given, else an ``invalid`` result saying it is not in the replay
    history. ``requests`` keeps every request asked, in order, so tests can check what a
    strategy measured. ``capacity`` is how many requests a caller keeps in flight (as many
    as a real worker pool would take).

    >>> ReplayMeasurer([]).measure([])
    []
    """

    def __init__(
        self,
        records: Iterable[MeasureRecord],
        *,
        fallback: Callable[[MeasureRequest], MeasureResult] | None = None,
        capacity: int = 1,
        target: Target | None = None,
    ) -> None:
        self._results: dict[ReplayKey, tuple[MeasureRecord, MeasureResult]] = {}
        self.fallback = fallback
        self._capacity = max(1, capacity)
        self._target = target
        self.requests: list[MeasureRequest] = []
        self.add(records)

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def target(self) -> Target | None:
        """The target it stands in for, when it plays one device's worker."""
        return self._target

    def add(self, records: Iterable[MeasureRecord]) -> None:
        """Extend the history (machine failures are not answers: they are skipped)."""
        for record in records:
            if not record.verdict:
                continue
            key = replay_key(record.request)
            known = self._results.get(key)
            if known is None or record.created_at >= known[0].created_at:
                self._results[key] = (record, record.result)

    def __len__(self) -> int:
        return len(self._results)

    def __contains__(self, request: object) -> bool:
        return isinstance(request, MeasureRequest) and replay_key(request) in self._results

    def answer(self, request: MeasureRequest) -> MeasureResult:
        """The result for ``request`` (recorded in ``requests``)."""
        self.requests.append(request)
        known = self._results.get(replay_key(request))
        if known is not None:
            return known[1]
        if self.fallback is not None:
            return self.fallback(request)
        return MeasureResult(MeasureStatus.INVALID, error=NOT_IN_HISTORY)

    def submit(self, request: MeasureRequest) -> Future[MeasureResult]:
        future: Future[MeasureResult] = Future()
        future.set_result(self.answer(request))
        return future
