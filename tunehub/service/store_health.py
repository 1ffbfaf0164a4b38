"""StoreHealth: whether the store answers, as this process's requests and health checks see it."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from tunehub.core.damped import DampedLog
from tunehub.db.store import ScheduleStore, StoreUnavailable
from tunehub.service import metrics

log = logging.getLogger(__name__)

# What a 503 of an unreachable store asks the client to wait before trying again.
RETRY_AFTER_SECS = 5
CHECK_SECS = 1.0


class StoreHealth:
    """A request that met ``StoreUnavailable`` calls ``failed``: health is degraded from then
    on. ``problem`` checks the store itself (``ScheduleStore.ping``, at most every
    ``check_secs``), so health is right without any request and returns to ok by itself once
    the store takes writes again."""

    def __init__(
        self,
        store: ScheduleStore,
        *,
        check_secs: float = CHECK_SECS,
        ping_timeout_secs: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.check_secs = check_secs
        self.ping_timeout_secs = ping_timeout_secs
        self.clock = clock
        self._lock = threading.Lock()
        self._checking = threading.Lock()
        self._problem: str | None = None
        self._checked_at: float | None = None
        self._down_since: float | None = None  # when the current outage was first seen
        self._failures = DampedLog(log)

    def failed(self, reason: str) -> None:
        """A request could not reach the store (said once, then counted per minute)."""
        metrics.store_error()
        with self._lock:
            self._problem = reason
            if self._down_since is None:
                self._down_since = self.clock()
        self._failures.warning("requests get 503, the store cannot answer: %s", reason)

    def problem(self) -> str | None:
        """Why the store cannot answer now, or None; checks it unless it was just checked (or
        another thread is checking it now)."""
        due = self._checked_at is None or self.clock() - self._checked_at >= self.check_secs
        if due and self._checking.acquire(blocking=False):
            try:
                self._check()
            finally:
                self._checking.release()
        with self._lock:
            return self._problem

    def outage_secs(self) -> float:
        """How long the store has not answered, as this process saw it (0 while it answers)."""
        with self._lock:
            since = self._down_since
        return 0.0 if since is None else max(0.0, self.clock() - since)

    def _check(self) -> None:
        try:
            self.store.ping(timeout_secs=self.ping_timeout_secs)
        except StoreUnavailable as exc:
            reason: str | None = str(exc)
        except Exception as exc:  # not the store's outage, but health must answer
            self._failures.exception("the store's health check failed")  # each check: damped
            reason = f"{type(exc).__name__}: {exc}"
        else:
            reason = None
        with self._lock:
            self._problem = reason
            self._checked_at = self.clock()
            if reason is None:
                self._down_since = None
            elif self._down_since is None:
                self._down_since = self._checked_at
        if reason is None:
            self._failures.clear("the store answers again")
        else:
            self._failures.warning("the store cannot answer: %s", reason)
