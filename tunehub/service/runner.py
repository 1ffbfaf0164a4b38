"""JobRunner: this process's workers (one per device) and the threads that run their jobs.

Each worker measures on one device of this host (the CPU, a GPU) and is registered in the store
with its target and a heartbeat, so ``GET /api/v1/targets`` shows it live and jobs for its
target are claimed by it. A job for a target with no live worker stays queued.

Jobs share a device fairly: after its time slice a job whose target has other jobs waiting is
handed back to the queue (behind them) and resumes later from its stored records; while other
keys' first jobs wait the slice is shorter, so several keys queueing at once each start within
one slice, and it ends at once (what is in flight is cut short, measured again on resume). The
next job claimed is that of the key with the least device time used
recently (fair share between keys, ``tunehub.core.fairshare``), then of the highest priority,
then the longest waiting. The runner
also watches its environment (the build dir can take files, the database takes writes); while
either fails it is degraded, says why, and claims no new job.

Several runners (``tunehub serve`` replicas on one database, on one host or many) share the
queue through leases: each runner is an owner; it claims a job with a lease, renews it while it
runs the job, and stops the job at once if a renewal (or a fenced write) finds it lost. Each
runner's reaper puts back in the queue the jobs whose lease expired, so a replica that died
(SIGKILL, a lost host) loses its jobs to the others, which resume them from their records.
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
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tunehub.core import Job, JobState, Target, Worker, utc_now
from tunehub.core.damped import DampedLog
from tunehub.core.fairshare import FairShare, first_jobs_waiting, job_slice_secs
from tunehub.core.owner import DEFAULT_LEASE_SECS, new_owner, owner_replica
from tunehub.db.journal import ReplayReport, ResultJournal
from tunehub.db.store import JobNotFound, ScheduleStore, StoreUnavailable
from tunehub.kernels.build import dir_problem
from tunehub.service import metrics
from tunehub.tuner import DatabaseOutage, LeaseKeeper, Progress, session_for_job
from tunehub.tuner.session import DB_OUTAGE_SECS
from tunehub.workers.base import Measurer

if TYPE_CHECKING:  # Ray is imported only when a cluster is attached
    from tunehub.workers.ray_measurer import ActorSlot, RayCluster

log = logging.getLogger(__name__)

HEARTBEAT_SECS = 5.0
FAIR_SHARE = FairShare()  # between keys, see tunehub.core.fairshare
SLICE_CHECK_SECS = 1.0
MIN_SLICE_SECS = 5.0


@dataclass(eq=False)
class DeviceWorker:
    """One device this process measures on: its measurer, target and registration.

    A ``local`` worker measures on this host; a ``ray`` worker is an actor on a cluster node
    (``host``, ``pid`` and ``node`` are the actor's), each job getting its own client of the
    target's actors from ``measurer_for_job``. ``available`` says whether the target can be
    measured at all now (a Ray target whose actors all died cannot: its job is handed back to
    the queue to wait for one); ``live_state`` answers the live part of ``Worker.info``.
    """

    device: str
    measurer: Measurer
    target: Target
    worker_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    thread: threading.Thread | None = None
    current_job: int | None = None
    kind: str = "local"
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    node: str = field(default_factory=socket.gethostname)
    measurer_for_job: Callable[[int], Measurer] | None = None
    available: Callable[[], bool] = lambda: True
    live_state: Callable[[], dict[str, Any]] | None = None
    retired: bool = False
    lost: str | None = None  # why its actor died (a retired ray worker): recorded as ``lost``
    capacity: int | None = None  # this device's own (a ray worker's measurer is its pool's)
    started_at: datetime = field(default_factory=utc_now)

    def state(self) -> dict[str, Any]:
        """``state`` (idle, building, timing), ``job_id`` and ``config``, as now."""
        if self.live_state is not None:
            found = self.live_state()
            if found:
                return {k: found.get(k) for k in ("state", "job_id", "config")}
        in_progress = getattr(self.measurer, "in_progress", None)
        state: dict[str, Any] = {"state": "idle", "job_id": self.current_job, "config": None}
        if callable(in_progress):
            for wanted, name in (("running", "timing"), ("building", "building")):
                found_items = [req for _, req, st in in_progress() if st == wanted]
                if found_items:
                    state.update(state=name, config=dict(found_items[0].config))
                    break
        return state

    def record(self, *, live: bool = False) -> Worker:
        """The store's record; ``live`` asks the worker for its live state (else idle)."""
        now = utc_now()
        info: dict[str, Any] = {
            "label": self.target.label,
            "capacity": self.capacity or self.measurer.capacity,
            "node": self.node,
            "device_name": self.target.name,
        }
        info.update(self.state() if live else {"state": "idle", "job_id": None, "config": None})
        if self.lost is not None:  # kept in the list as lost, with why, not removed
            info.update(state="lost", job_id=None, config=None, lost=self.lost)
        return Worker(
            worker_id=self.worker_id,
            target_key=self.target.target_key,
            host=self.host,
            pid=self.pid,
            kind=self.kind,
            device=self.device,
            started_at=self.started_at,
            heartbeat_at=now,
            info=info,
        )


class JobRunner:
    """Runs queued jobs on this process's workers, one job at a time per worker.

    On stop it interrupts each Session (in-flight candidates are killed and recorded as
    ``cancelled``) and puts the job back in the queue; jobs left RUNNING by a runner that died
    (a crash, a kill, a lost host) go back to the queue when their lease expires (the reaper of
    every runner, this one's from its start). Either way the job's next Session resumes from
    its stored records. ``owner`` names this runner in the jobs it holds (a fresh
    ``host:pid:random`` by default, prefixed with ``replica_id`` if given: a restarted replica
    of the same id takes its jobs back at start, see ``take_back``).

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
        min_slice_secs: float = MIN_SLICE_SECS,
        build_dir: Path | None = None,
        min_free_bytes: int = 0,
        health_secs: float | None = None,
        lease_secs: float = DEFAULT_LEASE_SECS,
        db_outage_secs: float = DB_OUTAGE_SECS,
        owner: str | None = None,
        replica_id: str | None = None,
        journal: ResultJournal | None = None,
        fair_share: FairShare | None = FAIR_SHARE,
    ) -> None:
        self.store = store
        self.fair_share = fair_share  # who is claimed next (None: priority, then age)
        self.poll_secs = poll_secs
        self.heartbeat_secs = heartbeat_secs
        self.slice_secs = slice_secs
        # The shortest a slice gets when other keys wait (see _slice_over).
        self.min_slice_secs = min_slice_secs
        self.build_dir = build_dir
        self.min_free_bytes = min_free_bytes
        self.health_secs = health_secs if health_secs is not None else heartbeat_secs
        self._problems: dict[str, str] = {}  # "build_dir" / "database" -> why
        self.replica_id = replica_id
        self.owner = owner or new_owner(replica_id)
        self.lease_secs = lease_secs
        self.db_outage_secs = db_outage_secs
        # Where results wait when the database is away past db_outage_secs (replayed before
        # this runner claims anything, so a resumed job never measures them again).
        self.journal = journal
        self.leases = LeaseKeeper(store, lease_secs=lease_secs)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._workers: list[DeviceWorker] = []
        self._started = False
        self._heartbeat: threading.Thread | None = None
        self._cluster: RayCluster | None = None
        self._discovery: threading.Thread | None = None
        self.discover_secs = heartbeat_secs
        self._ray_states: dict[str, dict[str, Any]] = {}
        # Faults these loops meet repeat every period while they last: the traceback once,
        # then a count a minute (tunehub.core.damped), and a line when they are over.
        self._damped = {name: DampedLog(log) for name in ("ray", "states", "beat", "loop", "slice")}
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

    @property
    def cluster(self) -> RayCluster | None:
        return self._cluster

    def attach_cluster(self, cluster: RayCluster, *, discover_secs: float | None = None) -> None:
        """Measure through ``cluster``'s actors: each actor is a ``ray`` worker, registered
        while it lives; its target's jobs are claimed here. Actors are looked for every
        ``discover_secs`` (default: the heartbeat's period), so a node that joins is used."""
        self._cluster = cluster
        if discover_secs is not None:
            self.discover_secs = discover_secs

    def sync_cluster(self) -> None:
        """Register the actors that started since the last look and retire those gone."""
        cluster = self._cluster
        if cluster is None:
            return
        added, removed = cluster.refresh(known_target=self.store.get_target)
        gone = {slot.worker_id: slot for slot in removed}
        for worker in self.workers:
            slot = gone.get(worker.worker_id)
            if slot is not None:
                # Its row stays, marked lost with why: GET /api/v1/workers shows what died (for
                # an hour) instead of dropping it, and it is not live for claiming jobs.
                worker.lost = slot.lost_reason or "its actor is gone"
                worker.retired = True
                try:
                    self.store.register_worker(worker.record())
                except Exception:
                    log.exception("could not mark worker %s lost", worker.worker_id)
        for slot in added:
            self._add_ray_worker(cluster, slot)

    def _add_ray_worker(self, cluster: RayCluster, slot: ActorSlot) -> DeviceWorker:
        key = slot.target.target_key
        pool = cluster.pool(key)
        assert pool is not None
        worker_id = slot.worker_id
        worker = DeviceWorker(
            device=slot.device,
            measurer=cluster.measurer(key),
            target=slot.target,
            worker_id=worker_id,
            kind="ray",
            host=slot.host,
            pid=slot.pid,
            node=slot.node_id,
            measurer_for_job=lambda job_id: cluster.measurer(key, job_id=job_id),
            available=lambda: pool.live,
            live_state=lambda: self._ray_states.get(worker_id, {}),
            capacity=slot.capacity,
        )
        self.store.put_target(slot.target)
        self.store.register_worker(worker.record())
        with self._lock:
            self._workers.append(worker)
            if self._started:
                self._start_worker(worker)
        return worker

    def _discovery_loop(self) -> None:
        while not self._stop.wait(self.discover_secs):
            try:
                self.sync_cluster()
            except Exception:
                self._damped["ray"].exception("looking for ray workers failed; tried again later")
            else:
                self._damped["ray"].clear("looking for ray workers works again")

    def take_back(self) -> list[int]:
        """Requeue at once the RUNNING jobs an earlier process of this replica held (same
        ``replica_id``, another owner): that process is gone or, if not, loses them (its
        writes are fenced); their next run resumes from their records. Nothing without a
        replica id."""
        if not self.replica_id:
            return []
        taken = []
        for job in self.store.list_jobs(states=(JobState.RUNNING,), limit=1000):
            if owner_replica(job.owner) != self.replica_id or job.owner == self.owner:
                continue
            moved = self.store.set_job_state(
                job.id, JobState.QUEUED, only_from=(JobState.RUNNING,), owner=job.owner
            )
            if moved.state is JobState.QUEUED:
                taken.append(job.id)
        if taken:
            log.info("replica %s: took back jobs %s of its earlier process", self.replica_id,
                     taken)  # fmt: skip
        return taken

    def requeue_expired(self) -> list[int]:
        """Put back to QUEUED the RUNNING jobs whose lease expired (their runner died, or
        lost the database for longer than a lease); the reaper does it every renewal round."""
        requeued = self.store.requeue_expired()
        if requeued:
            log.info("requeued jobs whose lease expired: %s", requeued)
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

    def replay_journal(self) -> ReplayReport | None:
        """Store what the result journal holds (a crash or an outage left it), before any
        job is claimed; None when it is empty. Raises StoreUnavailable if the store is away."""
        if self.journal is None or not self.journal:
            return None
        report = self.journal.replay(self.store)
        for job_id, count in sorted(report.stored.items(), key=lambda kv: kv[0] or 0):
            if count:
                log.warning("job %s: %d result(s) replayed from the result journal", job_id,
                            count)  # fmt: skip
        return report

    def start(self) -> None:
        self.check_health()
        try:
            self.replay_journal()
            self.take_back()
            self.requeue_expired()
        except Exception:
            log.exception("could not requeue expired jobs; the reaper tries again")
        self.leases.start()
        self._stop.clear()
        with self._lock:
            self._started = True
            for worker in self._workers:
                self._start_worker(worker)
        if self._cluster is not None:
            try:
                self.sync_cluster()
            except Exception:
                log.exception("looking for ray workers failed; tried again later")
            self._discovery = threading.Thread(
                target=self._discovery_loop, name="tunehub-ray-discovery", daemon=True
            )
            self._discovery.start()
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
        self.leases.stop()
        if self._discovery is not None:
            self._discovery.join(timeout)
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
            if self._cluster is not None:
                try:
                    self._ray_states = self._cluster.statuses()
                except Exception:
                    self._damped["states"].exception("could not ask the ray workers their state")
                else:
                    self._damped["states"].clear()
            for worker in self.workers:
                if worker.retired:
                    continue
                try:
                    # The live state rides along: Worker.info is refreshed with the heartbeat.
                    self.store.register_worker(worker.record(live=True))
                    if worker.retired:  # lost while this beat was written: say so again
                        self.store.register_worker(worker.record())
                except StoreUnavailable as exc:  # said once by _set_problem, not each beat
                    failure = " ".join(str(exc).split())[:300]
                except Exception as exc:
                    self._damped["beat"].exception("heartbeat of worker %s failed",
                                                   worker.worker_id[:8])  # fmt: skip
                    failure = " ".join(str(exc).split())[:300]
            self._set_problem("database", f"cannot write: {failure}" if failure else None)
            if failure is None:
                self._damped["beat"].clear()
            if time.monotonic() - last_check >= self.health_secs:
                last_check = time.monotonic()
                try:
                    self.check_health()
                except Exception:
                    log.exception("the health check failed")

    def _loop(self, worker: DeviceWorker) -> None:
        keys = {worker.target.target_key}
        while not self._stop.is_set() and not worker.retired:
            try:
                if self.problems:  # degraded: a job claimed now would only fail
                    self._stop.wait(self.poll_secs * 4)
                    continue
                if not worker.available():  # its target's actors are gone: claim nothing
                    self._stop.wait(self.poll_secs)
                    continue
                try:
                    self.replay_journal()  # what an outage or a crash left, before any claim
                except StoreUnavailable as exc:
                    log.debug("the result journal waits for the database: %s", exc)
                    self._stop.wait(self.poll_secs * 4)
                    continue
                job = self.store.claim_job(
                    owner=self.owner,
                    target_keys=keys,
                    lease_secs=self.lease_secs,
                    fair_share=self.fair_share,
                )
                if job is None:
                    self._stop.wait(self.poll_secs)
                    continue
                worker.current_job = job.id
                try:
                    self.run_job(job, worker)
                finally:
                    worker.current_job = None
            except Exception:  # a database hiccup must not kill the runner
                self._damped["loop"].exception("the job runner hit an error; it goes on")
                self._stop.wait(self.poll_secs * 4)
        if worker.retired:  # its actor is gone: the thread ends once its job is handed on
            with self._lock:
                if worker in self._workers:
                    self._workers.remove(worker)

    def _cancelled(self, job: Job) -> bool:
        """Whether the run of ``job`` must stop: shutdown, a cancel, or the lease lost."""
        if self._stop.is_set() or self.leases.lost(job.id):
            return True
        try:
            now = self.store.get_job(job.id)
        except JobNotFound:
            return True
        except Exception as exc:  # the database away: go on; the session keeps the results
            log.debug("job %d: could not read its state: %s", job.id, exc)
            return False
        if now.owner != job.owner:  # requeued or taken by another runner: no longer ours
            self.leases.mark_lost(job.id)
            return True
        return now.state is JobState.CANCELLED

    def run_job(self, job: Job, worker: DeviceWorker | None = None) -> None:
        """Run one claimed (RUNNING) job to its end on ``worker`` and record how it ended."""
        if worker is None:
            found = [w for w in self.workers if w.target.target_key == job.spec.target_key]
            if not found:
                self._finish(job, JobState.FAILED, "no worker of its target in this process")
                return
            worker = found[0]
        log.info("job %d: tuning %s on %s", job.id, job.spec.workload.label, worker.device)
        self.leases.hold(job.id, job.owner)
        try:
            self._run(job, worker)
        finally:
            self.leases.release(job.id)

    def _run(self, job: Job, worker: DeviceWorker) -> None:
        poll = _Throttle(lambda: self._cancelled(job), every_secs=0.25)
        pause = self._slice_over(job, worker)
        measurer = worker.measurer
        if worker.measurer_for_job is not None:
            measurer = worker.measurer_for_job(job.id)
        try:

            def report(p: Progress) -> None:
                metrics.records_measured(worker.target.target_key, p.last)
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
                measurer=measurer,
                target=worker.target,
                job_id=job.id,
                on_progress=report,
                should_stop=poll,
                should_pause=pause,
                pause_now=pause.now,
                tuning_secs_before=job.tuning_secs,
                owner=job.owner,
                db_outage_secs=self.db_outage_secs,
                journal=self.journal,
            ).run()
        except DatabaseOutage as exc:
            log.error("job %d failed: %s", job.id, exc)
            # The database may still be away: the failure is written once it is back (the
            # lease is renewed meanwhile, so the job is not handed to another runner).
            self._finish(job, JobState.FAILED, str(exc), retry_secs=float("inf"))
            return
        except StoreUnavailable as exc:
            # Not the job's fault, and its state cannot be written now: left to its lease,
            # which is no longer renewed, so a reaper requeues it and a runner resumes it.
            log.error("job %d stopped, the database is away (resumed later): %s", job.id, exc)
            return
        except Exception as exc:
            log.exception("job %d failed", job.id)
            self._finish(job, JobState.FAILED, f"{type(exc).__name__}: {exc}")
            return
        finally:
            if measurer is not worker.measurer:
                measurer.close()
        if result.stopped_by == "lease_lost" or self.leases.lost(job.id):
            log.warning("job %d: lost its lease; another runner resumes it", job.id)
            return  # the job is someone else's now: write nothing
        if result.stopped_by == "cancelled":
            if self._stop.is_set():  # shutdown: back to the queue, to resume from its records
                self.store.set_job_state(
                    job.id, JobState.QUEUED, only_from=(JobState.RUNNING,), owner=job.owner
                )
            return  # or cancelled by request, and the cancel already set the state
        if result.stopped_by == "paused":
            # Its slice is over and others wait: behind them in the queue (a cancel that got
            # in first stands), to resume from its records.
            self.store.set_job_state(
                job.id, JobState.QUEUED, only_from=(JobState.RUNNING,), owner=job.owner
            )
            why = "time slice over" if worker.available() else "no worker of its target left"
            log.info("job %d: %s after %d trials; back in the queue", job.id, why,
                     result.trials_done)  # fmt: skip
            return
        if result.stopped_by in ("worker_error", "noisy"):  # the machine failed, or was too busy
            self._finish(job, JobState.FAILED, result.error)
        elif result.best is not None or (
            result.stopped_by == "exhausted" and result.trials_done == 0
        ):
            # (The second case: earlier jobs measured every config; the Schedule has them all.)
            self._finish(job, JobState.SUCCEEDED, "")
        elif result.trials_done:
            self._finish(job, JobState.FAILED, "no candidate measured ok")
        else:
            self._finish(job, JobState.FAILED, f"no trial ran ({result.stopped_by})")
        log.info("job %d: %s after %d trials", job.id, result.stopped_by, result.trials_done)

    def _slice_over(self, job: Job, worker: DeviceWorker) -> _SliceEnd:
        """Whether ``job`` has had its time slice and another job of its target waits (the
        answer's ``now`` says whether the hand-back can wait for what is in flight).

        The slice is ``slice_secs``, shorter while other keys' first jobs wait
        (``tunehub.core.fairshare.job_slice_secs``): several keys queueing at once behind a
        long job each start within one slice of queueing, instead of each waiting for the
        whole slices of those before it. Never shorter than ``min_slice_secs``. A slice that
        ends for such keys ends at once: what is in flight is cut short (stored cancelled,
        measured again when the job resumes), for a trial or a library baseline can take
        longer than the slice's share on a busy machine, and those keys would wait for it."""
        started, started_at = time.monotonic(), utc_now()
        window = (self.fair_share or FAIR_SHARE).window_secs

        def recently() -> datetime:  # the jobs that ended since still say who has had a turn
            return utc_now() - timedelta(seconds=window)

        keys = {worker.target.target_key}
        asked = [float("-inf")]  # when the queue was last looked at
        shortest = min(self.slice_secs or 0.0, self.min_slice_secs)
        # Once a second at most, and often enough for a short slice to end on time.
        every = min(SLICE_CHECK_SECS, max(0.02, shortest / 8))
        end = _SliceEnd()

        def check() -> bool:
            if not worker.available():  # every actor of the target is gone: wait for one
                return True
            now = time.monotonic()
            if self.slice_secs is None or now - started < shortest:
                return False
            if now - asked[0] < every:
                return False
            asked[0] = now
            try:
                # Only a job that would be claimed before this one takes its place: a job a
                # lookup queued never pauses a person's.
                owners = self.store.owner_queues(
                    target_keys=keys, since=recently(), min_priority=job.priority
                )
            except Exception:  # every check while the store is away: damped
                self._damped["slice"].exception("job %d: could not look at the queue", job.id)
                return False
            self._damped["slice"].clear("job %d: the queue can be looked at again", job.id)
            secs = job_slice_secs(
                owners,
                own_key=job.api_key_id,
                started_at=started_at,
                slice_secs=self.slice_secs,
                min_slice_secs=self.min_slice_secs,
            )
            over = secs is not None and now - started >= secs
            if over and first_jobs_waiting(owners, own_key=job.api_key_id):
                end.at_once = True
            return over

        end.check = check
        return end

    def _finish(self, job: Job, state: JobState, error: str, *, retry_secs: float = 0) -> None:
        """End a RUNNING job this runner holds; a cancel that got in first stands, and so
        does a runner that took the job over. With ``retry_secs``, a database that cannot be
        reached is tried again for that long (or until the runner stops)."""
        deadline = time.monotonic() + retry_secs
        while True:
            try:
                self.store.set_job_state(
                    job.id, state, error=error, only_from=(JobState.RUNNING,), owner=job.owner
                )
                return
            except JobNotFound:
                log.warning("job %d vanished while running", job.id)
                return
            except Exception:
                if time.monotonic() >= deadline or self._stop.is_set():
                    raise
                self._stop.wait(1.0)


class _SliceEnd:
    """A running job's slice end, as its Session asks: called, whether the slice is over
    (the orderly hand-back: what is in flight finishes first); ``now``, whether the slice
    that ended cannot wait for that (another key's first job is due)."""

    def __init__(self) -> None:
        self.check: Callable[[], bool] = lambda: False
        self.at_once = False  # once so, so until the hand-back

    def __call__(self) -> bool:
        return self.check()

    def now(self) -> bool:
        if not self.at_once:
            self.check()  # a whole slice that ended may meet a key's first job queued since
        return self.at_once


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
