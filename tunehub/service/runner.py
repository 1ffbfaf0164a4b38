"""JobRunner: this process's workers (one per device) and the threads that run their jobs.

Each worker measures on one device of this host (the CPU, a GPU) and is registered in the store
with its target and a heartbeat, so ``GET /api/v1/targets`` shows it live and jobs for its
target are claimed by it. A job for a target with no live worker stays queued.

Jobs share a device fairly: after its time slice a job whose target has other jobs waiting is
handed back to the queue (behind them) and resumes later from its stored records. The runner
also watches its environment (the build dir can take files, the database takes writes); while
either fails it is degraded, says why, and claims no new job.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tunehub.core import Job, JobState, Target, Worker, utc_now
from tunehub.core.owner import owner_alive, process_owner
from tunehub.db.store import JobNotFound, ScheduleStore
from tunehub.kernels.build import dir_problem
from tunehub.tuner import Progress, session_for_job
from tunehub.workers.base import Measurer

log = logging.getLogger(__name__)

HEARTBEAT_SECS = 5.0
SLICE_CHECK_SECS = 1.0


@dataclass(eq=False)
class DeviceWorker:
    """One device this process measures on: its measurer, target and registration."""

    device: str
    measurer: Measurer
    target: Target
    worker_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    thread: threading.Thread | None = None
    current_job: int | None = None

    def record(self) -> Worker:
        now = utc_now()
        return Worker(
            worker_id=self.worker_id,
            target_key=self.target.target_key,
            host=socket.gethostname(),
            pid=os.getpid(),
            kind="local",
            device=self.device,
            started_at=now,
            heartbeat_at=now,
            info={"label": self.target.label, "capacity": self.measurer.capacity},
        )


class JobRunner:
    """Runs queued jobs on this process's workers, one job at a time per worker.

    On stop it interrupts each Session (in-flight candidates are killed and recorded as
    ``cancelled``) and puts the job back in the queue; on start it requeues jobs left RUNNING
    by a process that has died (a crash, a kill). Either way the job's next Session resumes
    from its stored records.

    ``add_worker`` registers a device at any time; a job that was waiting for a worker of its
    target starts as soon as one is registered.
    """

    def __init__(
        self,
        store: ScheduleStore,
        measurer_factory: Callable[[], Measurer] | None = None,
        *,
        poll_secs: float = 0.5,
        heartbeat_secs: float = HEARTBEAT_SECS,
        slice_secs: float | None = None,
        build_dir: Path | None = None,
        min_free_bytes: int = 0,
        health_secs: float | None = None,
    ) -> None:
        self.store = store
        self.poll_secs = poll_secs
        self.heartbeat_secs = heartbeat_secs
        self.slice_secs = slice_secs
        self.build_dir = build_dir
        self.min_free_bytes = min_free_bytes
        self.health_secs = health_secs if health_secs is not None else heartbeat_secs
        self._problems: dict[str, str] = {}  # "build_dir" / "database" -> why
        self.owner = process_owner()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._workers: list[DeviceWorker] = []
        self._started = False
        self._heartbeat: threading.Thread | None = None
        if measurer_factory is not None:
            self.add_worker(measurer_factory)

    @property
    def workers(self) -> list[DeviceWorker]:
        with self._lock:
            return list(self._workers)

    def add_worker(
        self,
        measurer_factory: Callable[[], Measurer],
        *,
        device: str = "cpu",
        target: Target | None = None,
    ) -> DeviceWorker:
        """Register a worker for the device the factory's measurer measures on (its
        fingerprint, or ``target``), and serve its target's jobs once the runner runs."""
        measurer = measurer_factory()
        found = target or measurer.target
        if found is None:
            measurer.close()
            raise ValueError("the measurer names no target: pass target=")
        worker = DeviceWorker(device=device, measurer=measurer, target=found)
        self.store.put_target(found)
        self.store.register_worker(worker.record())
        with self._lock:
            self._workers.append(worker)
            if self._started:
                self._start_worker(worker)
        log.info("worker %s: %s on %s", worker.worker_id[:8], device, found.short_label)
        return worker

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
    def problems(self) -> list[str]:
        """Why the runner is degraded (and claims no new job); empty while all is well."""
        with self._lock:
            return [f"{what}: {why}" for what, why in sorted(self._problems.items())]

    def _set_problem(self, what: str, why: str | None) -> None:
        with self._lock:
            before = self._problems.get(what)
            if why is None:
                self._problems.pop(what, None)
            else:
                self._problems[what] = why
        if why != before:
            if why is None:
                log.warning("%s is fine again; the runner takes jobs again", what)
            else:
                log.error("the runner is degraded and takes no new job: %s: %s", what, why)

    def check_health(self) -> list[str]:
        """Check the build dir now (the database is checked by every heartbeat)."""
        if self.build_dir is not None:
            self._set_problem(
                "build dir", dir_problem(self.build_dir, min_free_bytes=self.min_free_bytes)
            )
        return self.problems

    @property
    def alive(self) -> bool:
        with self._lock:
            return any(w.thread is not None and w.thread.is_alive() for w in self._workers)

    def start(self) -> None:
        self.check_health()
        self.requeue_orphans()
        self._stop.clear()
        with self._lock:
            self._started = True
            for worker in self._workers:
                self._start_worker(worker)
        self._heartbeat = threading.Thread(
            target=self._heartbeat_loop, name="tunehub-heartbeat", daemon=True
        )
        self._heartbeat.start()

    def _start_worker(self, worker: DeviceWorker) -> None:
        worker.thread = threading.Thread(
            target=self._loop, args=(worker,), name=f"tunehub-runner-{worker.device}", daemon=True
        )
        worker.thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        for worker in self.workers:
            if worker.thread is not None:
                worker.thread.join(timeout)
        if self._heartbeat is not None:
            self._heartbeat.join(timeout)
        for worker in self.workers:
            worker.measurer.close()
            try:
                self.store.remove_worker(worker.worker_id)
            except Exception:
                log.exception("could not unregister worker %s", worker.worker_id)

    def _heartbeat_loop(self) -> None:
        last_check = time.monotonic()
        while not self._stop.wait(min(self.heartbeat_secs, self.health_secs)):
            failure = None
            for worker in self.workers:
                try:
                    if not self.store.heartbeat_worker(worker.worker_id):
                        self.store.register_worker(worker.record())
                except Exception as exc:
                    log.exception("heartbeat of worker %s failed", worker.worker_id[:8])
                    failure = " ".join(str(exc).split())[:300]
            self._set_problem("database", f"cannot write: {failure}" if failure else None)
            if time.monotonic() - last_check >= self.health_secs:
                last_check = time.monotonic()
                try:
                    self.check_health()
                except Exception:
                    log.exception("the health check failed")

    def _loop(self, worker: DeviceWorker) -> None:
        keys = {worker.target.target_key}
        while not self._stop.is_set():
            try:
                if self.problems:  # degraded: a job claimed now would only fail
                    self._stop.wait(self.poll_secs * 4)
                    continue
                job = self.store.claim_job(owner=self.owner, target_keys=keys)
                if job is None:
                    self._stop.wait(self.poll_secs)
                    continue
                worker.current_job = job.id
                try:
                    self.run_job(job, worker)
                finally:
                    worker.current_job = None
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

    def run_job(self, job: Job, worker: DeviceWorker | None = None) -> None:
        """Run one claimed (RUNNING) job to its end on ``worker`` and record how it ended."""
        if worker is None:
            found = [w for w in self.workers if w.target.target_key == job.spec.target_key]
            if not found:
                self._finish(job.id, JobState.FAILED, "no worker of its target in this process")
                return
            worker = found[0]
        log.info("job %d: tuning %s on %s", job.id, job.spec.workload.label, worker.device)
        poll = _Throttle(lambda: self._cancelled(job.id), every_secs=0.25)
        pause = self._slice_over(job, worker)
        try:

            def report(p: Progress) -> None:
                log.info("job %d: %d/%d trials", job.id, p.trials_done, p.max_trials)
                for record in p.last:
                    if record.result.error:  # the whole text, paths and all, for the operator
                        log.info(
                            "job %d: %s %s: %s",
                            job.id,
                            record.status.value,
                            record.config,
                            record.result.error,
                        )

            result = session_for_job(
                job.spec,
                store=self.store,
                measurer=worker.measurer,
                target=worker.target,
                job_id=job.id,
                on_progress=report,
                should_stop=poll,
                should_pause=pause,
                tuning_secs_before=job.tuning_secs,
            ).run()
        except Exception as exc:
            log.exception("job %d failed", job.id)
            self._finish(job.id, JobState.FAILED, f"{type(exc).__name__}: {exc}")
            return
        if result.stopped_by == "cancelled":
            if self._stop.is_set():  # shutdown: back to the queue, to resume from its records
                self.store.set_job_state(job.id, JobState.QUEUED, only_from=(JobState.RUNNING,))
            return  # or cancelled by request, and the cancel already set the state
        if result.stopped_by == "paused":
            # Its slice is over and others wait: behind them in the queue (a cancel that got
            # in first stands), to resume from its records.
            self.store.set_job_state(job.id, JobState.QUEUED, only_from=(JobState.RUNNING,))
            log.info("job %d: time slice over after %d trials; back in the queue", job.id,
                     result.trials_done)  # fmt: skip
            return
        if result.stopped_by == "worker_error":
            self._finish(job.id, JobState.FAILED, result.error)
        elif result.best is not None or (
            result.stopped_by == "exhausted" and result.trials_done == 0
        ):
            # (The second case: earlier jobs measured every config; the Schedule has them all.)
            self._finish(job.id, JobState.SUCCEEDED, "")
        elif result.trials_done:
            self._finish(job.id, JobState.FAILED, "no candidate measured ok")
        else:
            self._finish(job.id, JobState.FAILED, f"no trial ran ({result.stopped_by})")
        log.info("job %d: %s after %d trials", job.id, result.stopped_by, result.trials_done)

    def _slice_over(self, job: Job, worker: DeviceWorker) -> Callable[[], bool]:
        """Whether ``job`` has had its time slice and another job of its target waits."""
        started = time.monotonic()
        keys = {worker.target.target_key}
        asked = [float("-inf")]  # when the queue was last looked at (once a second at most)

        def check() -> bool:
            now = time.monotonic()
            if self.slice_secs is None or now - started < self.slice_secs:
                return False
            if now - asked[0] < SLICE_CHECK_SECS:
                return False
            asked[0] = now
            try:
                return self.store.count_jobs(states=(JobState.QUEUED,), target_keys=keys) > 0
            except Exception:
                log.exception("job %d: could not look at the queue", job.id)
                return False

        return check

    def _finish(self, job_id: int, state: JobState, error: str) -> None:
        """End a RUNNING job; a cancel that got in first stands."""
        try:
            self.store.set_job_state(job_id, state, error=error, only_from=(JobState.RUNNING,))
        except JobNotFound:
            log.warning("job %d vanished while running", job_id)


class _Throttle:
    """Calls ``check`` at most every ``every_secs`` (a store read), answering the last value
    in between; once true it stays true."""

    def __init__(self, check: Callable[[], bool], every_secs: float) -> None:
        self._check = check
        self._every = every_secs
        self._last = float("-inf")
        self._value = False

    def __call__(self) -> bool:
        now = time.monotonic()
        if not self._value and now - self._last >= self._every:
            self._last = now
            self._value = self._check()
        return self._value
