"""Worker: a process that measures on one device of one target, as the store knows it."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

# A worker that has not reported within this long is not live.
LIVE_SECS = 30.0


@dataclass(frozen=True)
class Worker:
    """A registered worker: which target it measures on, where, and when it last reported.

    ``kind`` is how it runs (``local``: inside a ``tunehub serve`` or ``tunehub tune``
    process); ``device`` names the device on its host (``cpu``, ``cuda:0``).
    """

    worker_id: str
    target_key: str
    host: str
    pid: int
    kind: str
    device: str
    started_at: datetime
    heartbeat_at: datetime
    info: dict[str, Any] = field(default_factory=dict)

    def live(self, now: datetime, within_secs: float = LIVE_SECS) -> bool:
        """Reported within ``within_secs`` and not known dead (``info["state"]`` ``lost``: a
        Ray actor that died is kept, marked so, until it ages out)."""
        if self.info.get("state") == "lost":
            return False
        return now - self.heartbeat_at <= timedelta(seconds=within_secs)
