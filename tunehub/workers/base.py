"""Measurer: the interface every worker implements (local sandboxes, replay, Ray).

A measurer takes requests one by one and answers each with a future, resolved when its result
is ready, in whatever order results finish: a caller keeps ``capacity`` requests in flight so
that every build slot and the device stay busy, and stores each result as it arrives.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, InvalidStateError, wait
from contextlib import AbstractContextManager, nullcontext
from types import TracebackType

from tunehub.core import MeasureRequest, MeasureResult, MeasureStatus, Target

CANCELLED_ERROR = "cancelled before a result: the candidate's sandbox was stopped"


def cancelled_result(reason: str = CANCELLED_ERROR) -> MeasureResult:
    """The result of a request cut short by a cancel or a shutdown (not a verdict)."""
    return MeasureResult(MeasureStatus.CANCELLED, error=reason)


def resolve(future: Future[MeasureResult], result: MeasureResult) -> bool:
    """Set ``future``'s result unless it already has one; whether this call set it."""
    try:
        future.set_result(result)
    except InvalidStateError:
        return False
    return True


class Measurer(ABC):
    """Turns MeasureRequests into MeasureResults through futures.

    Rules for every measurer:
    - a candidate that crashes, hangs or lies yields a ``runtime_error`` / ``timeout`` /
      ``wrong_answer`` result; it never raises out of ``submit`` or a future, and never
      takes the measurer down;
    - a failure of the machine rather than the candidate (a sandbox that cannot start, a
      worker lost) is retried a bounded number of times, then answered ``worker_error``;
    - ``cancel`` answers the given futures ``cancelled`` at once, killing what measures them;
    - a future is always resolved with a MeasureResult (``close`` cancels what is left).
    """

    @property
    def capacity(self) -> int:
        """How many requests to keep in flight to keep every slot busy (default 1)."""
        return 1

    @property
    def target(self) -> Target | None:
        """The target this measurer measures on, if it is one device's (None: any, as a
        replay measurer answers for whatever its history holds)."""
        return None

    @property
    def live(self) -> bool:
        """Whether its answers are fresh timings, so that measuring a request again may answer
        otherwise (a worker's are; a replay answers what was stored). The session re-measures
        untrusted timings only of a live measurer."""
        return True

    def host_work(self) -> AbstractContextManager[object]:
        """A context for the caller's own CPU work on this host (a search step, a model fit)
        while this measurer times: where the measurer times on this host's CPU, the work gets
        a core no timing uses, and a timing that needs every core waits for it. Default:
        nothing to keep apart (the timing happens elsewhere)."""
        return nullcontext()

    @abstractmethod
    def submit(self, request: MeasureRequest) -> Future[MeasureResult]:
        """Queue ``request``; the future resolves with its result."""

    def cancel(self, futures: Iterable[Future[MeasureResult]]) -> None:
        """Answer these futures ``cancelled`` now (those still without a result)."""
        for future in futures:
            resolve(future, cancelled_result())

    def measure(self, requests: Sequence[MeasureRequest]) -> list[MeasureResult]:
        """Measure every request and return their results in order (waits for all)."""
        futures = [self.submit(request) for request in requests]
        wait(futures)
        return [f.result() for f in futures]

    def close(self) -> None:  # noqa: B027 - optional hook
        """Cancel what is in flight and release processes or connections."""

    def __enter__(self) -> Measurer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
