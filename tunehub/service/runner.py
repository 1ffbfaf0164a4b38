"""JobRunner: claims queued jobs and runs a tuning Session for each, in a background thread."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from tunehub.core import Job, JobState, local_cpu_target
from tunehub.core.owner import owner_alive, process_owner
from tunehub.db.store import JobNotFound, ScheduleStore
from tunehub.tuner import Progress, session_for_job
from tunehub.workers.base import Measurer

log = logging.getLogger(__name__)


class JobRunner:
    """One thread that runs jobs one after another on this machine's CPU.

    On stop it interrupts the Session between batches and puts the job back in the queue; on
    start it requeues jobs left RUNNING by a process that has died (a crash, a kill). Either
    way the job's next Session resumes from its stored records.
    """

    def __init__(
        self,
        store: ScheduleStore,
        measurer_factory: Callable[[], Measurer],
        *,
        poll_secs: float = 0.5,
    ) -> None:
        self.store = store
        self.measurer_factory = measurer_factory
        self.poll_secs = poll_secs
        self.owner = process_owner()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._measurer: Measurer | None = None

    def requeue_orphans(self) -> list[int]:
        """Put back to QUEUED the RUNNING jobs whose process has gone (a crash, a kill, a
        restart); jobs of live processes here (another ``serve``, a ``tunehub tune``) stay,
        and so do jobs owned on other hosts, which this process cannot check."""
        requeued = []
        for job in self.store.list_jobs(states=(JobState.RUNNING,), limit=500):
            alive = owner_alive(job.owner)
            if alive is None:
                log.warning("job %d runs on another host (%s); left as it is", job.id, job.owner)
            elif not alive:
                moved = self.store.set_job_state(
                    job.id, JobState.QUEUED, only_from=(JobState.RUNNING,)
                )
                if moved.state is JobState.QUEUED:
                    requeued.append(job.id)
        if requeued:
            log.info("requeued interrupted jobs %s", requeued)
        return requeued

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        self.requeue_orphans()
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="tunehub-runner", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._measurer is not None:
            self._measurer.close()
            self._measurer = None

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                job = self.store.claim_job(owner=self.owner)
                if job is None:
                    self._stop.wait(self.poll_secs)
                    continue
                self.run_job(job)
            except Exception:  # a database hiccup must not kill the runner
                log.exception("the job runner hit an error; it goes on")
                self._stop.wait(self.poll_secs * 4)

    def _cancelled(self, job_id: int) -> bool:
        if self._stop.is_set():
            return True
        try:
            return self.store.get_job(job_id).state is JobState.CANCELLED
        except JobNotFound:
            return True

    def run_job(self, job: Job) -> None:
        """Run one claimed (RUNNING) job to its end and record how it ended."""
        log.info("job %d: tuning %s", job.id, job.spec.workload.label)
        try:
            target = local_cpu_target()
            if job.spec.target_key != target.target_key:
                raise RuntimeError(
                    f"no worker here for target {job.spec.target_key[:12]}: this service "
                    f"measures only on {target.label} ({target.target_key[:12]})"
                )
            if self._measurer is None:
                self._measurer = self.measurer_factory()

            def report(p: Progress) -> None:
                log.info("job %d: %d/%d trials", job.id, p.trials_done, p.max_trials)

            result = session_for_job(
                job.spec,
                store=self.store,
                measurer=self._measurer,
                target=target,
                job_id=job.id,
                on_progress=report,
                should_stop=lambda: self._cancelled(job.id),
            ).run()
        except Exception as exc:
            log.exception("job %d failed", job.id)
            self._finish(job.id, JobState.FAILED, f"{type(exc).__name__}: {exc}")
            return
        if result.stopped_by == "cancelled":
            if self._stop.is_set():  # shutdown: back to the queue, to resume from its records
                self.store.set_job_state(job.id, JobState.QUEUED, only_from=(JobState.RUNNING,))
            return  # or cancelled by request, and the cancel already set the state
        if result.best is not None or (
            result.stopped_by == "exhausted" and result.trials_done == 0
        ):
            # (The second case: earlier jobs measured every config; the Schedule has them all.)
            self._finish(job.id, JobState.SUCCEEDED, "")
        elif result.trials_done:
            self._finish(job.id, JobState.FAILED, "no candidate measured ok")
        else:
            self._finish(job.id, JobState.FAILED, f"no trial ran ({result.stopped_by})")
        log.info("job %d: %s after %d trials", job.id, result.stopped_by, result.trials_done)

    def _finish(self, job_id: int, state: JobState, error: str) -> None:
        """End a RUNNING job; a cancel that got in first stands."""
        try:
            self.store.set_job_state(job_id, state, error=error, only_from=(JobState.RUNNING,))
        except JobNotFound:
            log.warning("job %d vanished while running", job_id)
