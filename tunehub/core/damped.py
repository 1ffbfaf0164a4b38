"""DampedLog: a warning that repeats while a fault lasts, said once and then as a count."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

DAMPED_EVERY_SECS = 60.0


class DampedLog:
    """Says the first ``warning`` at once, then at most one line every ``every_secs`` with how
    many more there were; ``clear`` (the fault is over) says how many were left unsaid and arms
    it again. Thread-safe.

    >>> import logging
    >>> damped = DampedLog(logging.getLogger("demo"), every_secs=60)
    >>> for _ in range(240):  # 4 a second for a minute: one line now, one count later
    ...     damped.warning("cannot read the change feed: %s", "refused")
    >>> damped.repeats
    239
    """

    def __init__(
        self,
        logger: logging.Logger,
        *,
        every_secs: float = DAMPED_EVERY_SECS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.every_secs = every_secs
        self.clock = clock
        self._lock = threading.Lock()
        self._said_at: float | None = None  # None: no fault now
        self.repeats = 0  # warnings since the last line said

    @property
    def active(self) -> bool:
        with self._lock:
            return self._said_at is not None

    def exception(self, msg: str, *args: object) -> None:
        """``warning`` at ERROR level with the traceback of the exception being handled (for
        faults that repeat in a loop: the traceback once, then the count)."""
        self.warning(msg, *args, level=logging.ERROR, exc_info=True)

    def warning(
        self, msg: str, *args: object, level: int = logging.WARNING, exc_info: bool = False
    ) -> None:
        now = self.clock()
        with self._lock:
            if self._said_at is None:
                self._said_at = now
                self.repeats = 0
                say, count = True, 0
            elif now - self._said_at >= self.every_secs:
                count = self.repeats + 1
                self._said_at, self.repeats = now, 0
                say = True
            else:
                self.repeats += 1
                say, count = False, 0
        if say and count:
            self.logger.log(level, msg + " (%d times in the last %.0f s)", *args, count,
                            self.every_secs, exc_info=exc_info)  # fmt: skip
        elif say:
            self.logger.log(level, msg, *args, exc_info=exc_info)

    def clear(self, msg: str | None = None, *args: object) -> None:
        """The fault is over: say the count not yet said, and ``msg`` if given."""
        with self._lock:
            if self._said_at is None:
                return
            count, self._said_at, self.repeats = self.repeats, None, 0
        if count:
            self.logger.warning("the last warning repeated %d more times", count)
        if msg:
            self.logger.warning(msg, *args)
