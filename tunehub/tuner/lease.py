"""LeaseKeeper: renews the leases of the jobs a process runs, and reaps expired ones.

A job runner holds each job it runs with a lease (``ScheduleStore.claim_job``). The keeper's
thread renews every held lease each third of the lease time; a renewal that finds a job no
longer held (its lease expired and the job was requeued, perhaps taken by another replica)
marks it lost, and whoever runs it must stop at once (``lost``). With ``reap``, each round
also puts back in the queue the RUNNING jobs whose lease expired: a replica that died loses
its jobs to the others within about one lease time. After a round that could not reach the
database, reaping waits one lease time, so holders renew first once it is back.
"""

from __future__ import annotations

import logging
import threading
import time

from tunehub.core.damped import DampedLog
from tunehub.core.owner import DEFAULT_LEASE_SECS
from tunehub.db.store import ScheduleStore

log = logging.getLogger(__name__)


class LeaseKeeper:
    """Keeps the leases of held jobs alive while they run (see the module docstring).

    >>> from tunehub.db import MemoryScheduleStore
    >>> keeper = LeaseKeeper(MemoryScheduleStore(), lease_secs=30)
    >>> keeper.renew_secs
    10.0
    >>> keeper.hold(1, "me")
    >>> keeper.tick()  # renews what it holds, then reaps: nothing to requeue here
    []
    >>> keeper.lost(1)  # no such job: its lease is lost
    True
    """

    def __init__(
        self, store: ScheduleStore, *, lease_secs: float = DEFAULT_LEASE_SECS, reap: bool = True
    ) -> None:
        if not lease_secs > 0:
            raise ValueError(f"lease_secs: must be > 0, got {lease_secs}")
        self.store = store
        self.lease_secs = float(lease_secs)
        self.renew_secs = self.lease_secs / 3
        self.reap = reap
        self._lock = threading.Lock()
        self._held: dict[int, str] = {}  # job id -> owner
        self._lost: set[int] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # After the database was away, leases of every runner ran out together: give their
        # holders one lease time to renew before reaping, so an outage alone moves no job.
        self._reap_after = float("-inf")
        self._renew_failed = DampedLog(log)  # each renewal of an outage: once, then counted

    def hold(self, job_id: int, owner: str) -> None:
        """Renew ``owner``'s lease on ``job_id`` until ``release``."""
        with self._lock:
            self._held[job_id] = owner
            self._lost.discard(job_id)

    def release(self, job_id: int) -> None:
        """Stop renewing (the job ended, or went back to the queue)."""
        with self._lock:
            self._held.pop(job_id, None)
            self._lost.discard(job_id)

    def lost(self, job_id: int) -> bool:
        """Whether a renewal found ``job_id`` no longer held by its owner."""
        with self._lock:
            return job_id in self._lost

    def mark_lost(self, job_id: int) -> None:
        """Record that the job is no longer held (seen elsewhere: a fenced write refused)."""
        with self._lock:
            if job_id in self._held:
                self._lost.add(job_id)

    def tick(self) -> list[int]:
        """Renew every held lease, then reap (if on); returns the jobs the reaper requeued.

        Raises what the store raises (a database away): the next round tries again.
        """
        with self._lock:
            by_owner: dict[str, set[int]] = {}
            for job_id, owner in self._held.items():
                if job_id not in self._lost:
                    by_owner.setdefault(owner, set()).add(job_id)
        for owner, job_ids in sorted(by_owner.items()):
            renewed = self.store.renew_leases(owner, job_ids, lease_secs=self.lease_secs)
            for job_id in sorted(job_ids - renewed):
                with self._lock:
                    still_held = self._held.get(job_id) == owner
                    if still_held:
                        self._lost.add(job_id)
                if still_held:
                    log.warning("job %d: lease of %s lost; its run here stops", job_id, owner)
        reap = self.reap and time.monotonic() >= self._reap_after
        requeued = self.store.requeue_expired() if reap else []
        if requeued:
            log.warning("jobs %s: their runner's lease expired; back in the queue", requeued)
        return requeued

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="tunehub-leases", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.wait(self.renew_secs):
            try:
                self.tick()
            except Exception as exc:  # the database away: renew when it is back
                self._reap_after = time.monotonic() + self.lease_secs
                self._renew_failed.warning("could not renew leases: %s",
                                           " ".join(str(exc).split())[:300])  # fmt: skip
            else:
                self._renew_failed.clear("leases are renewed again")
