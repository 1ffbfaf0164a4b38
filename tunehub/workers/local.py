"""LocalMeasurer: builds candidates in parallel sandboxes and times them one at a time on a device.

The pipeline of one measurer (one device of this host):

    submit ─▶ build queue ─▶ build sandboxes (N, each pinned to a core reserved for building)
                                  │ artifact
                                  ▼
             run queue ─▶ the device's run sandbox (checks and times, one candidate at a time,
                          holding the device's host-wide lock and the cores it times on)

So the device times the previous candidate while the next ones compile, a build never runs on
the cores being timed, and two processes of this host never time on the device at once (see
``tunehub.workers.locks``). Results resolve futures as they finish.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

from tunehub.core import MeasureRequest, MeasureResult, MeasureStatus, Target, local_cpu_target
from tunehub.kernels.base import Artifact, Template, TimingPolicy
from tunehub.kernels.build import evict_build_cache, remove_temp_files
from tunehub.kernels.registry import UnknownTemplate, get_template
from tunehub.workers.base import Measurer, cancelled_result, resolve
from tunehub.workers.locks import Cancelled, CoreLocks, usable_cores
from tunehub.workers.sandbox import (
    BuildJob,
    Built,
    Fingerprint,
    FingerprintJob,
    RunJob,
    SandboxDied,
    SandboxProcess,
    SandboxTimeout,
)

log = logging.getLogger(__name__)

DEFAULT_BUILD_TIMEOUT_SECS = 300.0
DEFAULT_MAX_CANDIDATE_SECS = 900.0
DEFAULT_RETRIES = 2
MAX_BUILDERS = 16
FINGERPRINT_TIMEOUT_SECS = 120.0
RESTART_BACKOFF_SECS = 0.5
EVICT_EVERY_SECS = 30.0


def _child_env(build_dir: Path, device: str, extra: Mapping[str, str] | None) -> dict[str, str]:
    env = dict(os.environ)
    # The child imports what this process can import (plugin templates, a source checkout).
    paths = [os.path.abspath(p or os.curdir) for p in sys.path]
    paths = [p for p in dict.fromkeys(paths) if os.path.isdir(p)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    # numpy's reference runs on one BLAS thread, so no idle BLAS threads spin while timing.
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    env.setdefault("MKL_NUM_THREADS", "1")
    env["TUNEHUB_BUILD_DIR"] = str(build_dir)
    # Build sandboxes compile Triton kernels into this cache and the run sandbox loads them.
    env.setdefault("TRITON_CACHE_DIR", str(build_dir / "triton"))
    env["TUNEHUB_DEVICE"] = device
    if device.startswith("cuda:"):
        env["CUDA_VISIBLE_DEVICES"] = device.partition(":")[2]
    env.update(extra or {})
    return env


@dataclass(eq=False)
class _Item:
    """One request on its way through the pipeline (guarded by the measurer's lock)."""

    request: MeasureRequest
    future: Future[MeasureResult]
    template: Template | None
    submitted: float = field(default_factory=time.monotonic)
    state: str = "queued"  # queued | building | built | running | done
    artifact: Artifact | None = None
    sandbox: SandboxProcess | None = None
    cancelled: bool = False
    build_started: float = 0.0


class WorkerError(Exception):
    """The machine failed (a sandbox could not start), not the candidate."""


def _stop_all(sandboxes: list[SandboxProcess], workdir: Path | None) -> None:
    for sandbox in sandboxes:
        sandbox.stop()
    if workdir is not None:
        shutil.rmtree(workdir, ignore_errors=True)


class LocalMeasurer(Measurer):
    """Measures requests on one device of this host (``cpu`` or ``cuda:N``) in sandboxes.

    A child that dies while running a candidate yields ``runtime_error`` naming the signal or
    exit code, with the tail of its stderr; one that exceeds the time limit is killed (with
    its process group) and yields ``timeout``. A child that cannot start is retried
    ``retries`` times, then the request is answered ``worker_error`` (the machine's failure,
    not the config's). A cancelled request is answered ``cancelled`` at once and the sandbox
    working on it is killed. Either way a fresh child serves the next request.

    The run limit is ``timeout_secs`` if given, else the template's run allowance (which
    grows with the workload's FLOPs); either is capped at ``max_candidate_secs``. Builds have
    ``build_timeout_secs`` (also capped). Compiled kernels are cached in ``build_dir``
    (default ``<workdir>/build``), at most ``build_cache_max_bytes`` of them (least recently
    used ones are evicted; 0: no limit); without ``workdir`` a temporary one is made and
    removed by ``close``. A build the machine cannot do (a full or read-only build dir) is a
    ``worker_error``; what a killed build leaves half-written is removed.

    >>> with LocalMeasurer() as measurer:  # doctest: +SKIP
    ...     future = measurer.submit(request)
    ...     result = future.result()
    """

    def __init__(
        self,
        *,
        device: str = "cpu",
        workdir: Path | None = None,
        build_dir: Path | None = None,
        timing: TimingPolicy | None = None,
        timeout_secs: float | None = None,
        max_candidate_secs: float = DEFAULT_MAX_CANDIDATE_SECS,
        build_timeout_secs: float = DEFAULT_BUILD_TIMEOUT_SECS,
        builders: int | None = None,
        retries: int = DEFAULT_RETRIES,
        env: Mapping[str, str] | None = None,
        python: str = sys.executable,
        cores: tuple[int, ...] | None = None,
        build_cache_max_bytes: int = 0,
    ) -> None:
        if device != "cpu" and not device.startswith("cuda:"):
            raise ValueError(f"device must be 'cpu' or 'cuda:N', got {device!r}")
        limits = {
            "timeout_secs": timeout_secs,
            "max_candidate_secs": max_candidate_secs,
            "build_timeout_secs": build_timeout_secs,
        }
        for name, value in limits.items():
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be positive")
        self.device = device
        self._owns_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="tunehub-measure-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.build_dir = build_dir or self.workdir / "build"
        self.timing = timing or TimingPolicy()
        self.timeout_secs = timeout_secs
        self.max_candidate_secs = max_candidate_secs
        self.build_timeout_secs = min(build_timeout_secs, max_candidate_secs)
        self.retries = max(0, retries)
        self.cores = CoreLocks(cores if cores is not None else usable_cores())
        n_builders = builders or max(1, min(MAX_BUILDERS, len(self.cores.cores) - 1))
        child_env = _child_env(self.build_dir, device, env)
        self.build_cache_max_bytes = build_cache_max_bytes
        self._evicted_at = 0.0
        self._run_sandbox = SandboxProcess(
            log_path=self.workdir / "run-sandbox.log",
            env=child_env,
            python=python,
            tmp_dir=self.workdir / "tmp-run",
        )
        self._build_sandboxes = [
            SandboxProcess(
                log_path=self.workdir / f"build-sandbox-{i}.log",
                env=child_env,
                python=python,
                tmp_dir=self.workdir / f"tmp-build-{i}",
            )
            for i in range(n_builders)
        ]
        # Re-entrant: resolving a future runs its callbacks (ours take the lock) in place.
        self._lock = threading.RLock()
        self._wake = threading.Condition(self._lock)
        # Held by whoever talks to the run sandbox outside the run thread (fingerprinting).
        self._run_guard = threading.Lock()
        self._build_queue: deque[_Item] = deque()
        self._run_queue: deque[_Item] = deque()
        self._items: dict[Future[MeasureResult], _Item] = {}
        self._closed = False
        self._fingerprint: Fingerprint | None = None
        self._threads: list[threading.Thread] = []
        self._started = False
        self._seq = itertools.count()
        # A measurer that is never closed still takes its children (and temp workdir) along.
        self._finalizer = weakref.finalize(
            self,
            _stop_all,
            [self._run_sandbox, *self._build_sandboxes],
            self.workdir if self._owns_workdir else None,
        )

    # --- what it is ------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        """Builders + one candidate timing + one built and waiting: the device never idles
        for a build, and no more is built ahead than will be timed soon."""
        return len(self._build_sandboxes) + 2

    @property
    def builders(self) -> int:
        return len(self._build_sandboxes)

    @property
    def target(self) -> Target:
        """The device's fingerprint (for a GPU, taken in the run sandbox, which starts)."""
        return self.fingerprint().target or local_cpu_target()

    @property
    def sandbox_pid(self) -> int | None:
        """The run sandbox's pid (None before the first request or after a failure)."""
        return self._run_sandbox.pid if self._run_sandbox.alive else None

    @property
    def sandbox_starts(self) -> int:
        """How many run sandboxes have been started (1 + restarts)."""
        return self._run_sandbox.starts

    def sandbox_pids(self) -> list[int]:
        """Pids of every live sandbox (run and build)."""
        return [
            s.pid
            for s in (self._run_sandbox, *self._build_sandboxes)
            if s.alive and s.pid is not None
        ]

    def fingerprint(self) -> Fingerprint:
        """The device's Target and host-wide lock name (asked once of the run sandbox for a
        GPU; the CPU is fingerprinted in this process). RuntimeError if it cannot be taken."""
        if self._fingerprint is not None:
            return self._fingerprint
        if self.device == "cpu":
            self._fingerprint = Fingerprint(target=local_cpu_target(), lock_name="cpu")
            return self._fingerprint
        with self._run_guard:
            if self._fingerprint is None:
                try:
                    self._ensure_started(self._run_sandbox, lambda: self._closed)
                    found = self._run_sandbox.call(
                        FingerprintJob("cuda"), FINGERPRINT_TIMEOUT_SECS, Fingerprint
                    )
                except (WorkerError, Cancelled, SandboxDied, SandboxTimeout) as exc:
                    raise RuntimeError(f"cannot fingerprint {self.device}: {exc}") from None
                if found.target is None:
                    raise RuntimeError(f"cannot fingerprint {self.device}: {found.error}")
                self._fingerprint = found
            return self._fingerprint

    def in_progress(self) -> list[tuple[Future[MeasureResult], MeasureRequest, str]]:
        """The requests being worked on: (future, request, state), state one of ``queued``,
        ``building``, ``built``, ``running`` (what a worker reports as its live state)."""
        with self._lock:
            return [
                (future, item.request, item.state)
                for future, item in self._items.items()
                if item.state != "done"
            ]

    def limit_for(self, request: MeasureRequest, template: Template | None) -> float:
        """The time limit for checking and timing one request."""
        if self.timeout_secs is not None:
            return min(self.timeout_secs, self.max_candidate_secs)
        if template is None:
            return self.max_candidate_secs
        return min(
            template.run_allowance_secs(request.workload, self.timing), self.max_candidate_secs
        )

    def host_work(self) -> contextlib.AbstractContextManager[object]:
        """Hold a core this measurer's timings may use (pinning the calling thread to it) while
        the caller computes: a timing on every core never runs beside the tuning loop's own
        work (see ``CoreLocks.working``)."""
        return self.cores.working(cancelled=lambda: self._closed)

    # --- submit and cancel -----------------------------------------------------------------
    def submit(self, request: MeasureRequest) -> Future[MeasureResult]:
        future: Future[MeasureResult] = Future()
        future.set_running_or_notify_cancel()
        try:
            template: Template | None = get_template(request.template)
        except UnknownTemplate:
            template = None  # the sandbox answers invalid, naming the known templates
        except Exception:  # a plugin that fails to import here fails in the sandbox too
            template = None
        item = _Item(request, future, template)
        with self._wake:
            if self._closed:
                raise RuntimeError("LocalMeasurer is closed")
            self._start_threads()
            self._items[future] = item
            self._build_queue.append(item)
            self._wake.notify_all()
        future.add_done_callback(self._forget)
        return future

    def _forget(self, future: Future[MeasureResult]) -> None:
        with self._lock:
            self._items.pop(future, None)

    def cancel(self, futures: Iterable[Future[MeasureResult]]) -> None:
        """Answer these requests ``cancelled`` now, killing the sandboxes working on them."""
        for future in futures:
            with self._wake:
                item = self._items.get(future)
                if item is None:
                    resolve(future, cancelled_result())
                    continue
                item.cancelled = True
                if item.state in ("queued", "built"):
                    with contextlib.suppress(ValueError):
                        (self._build_queue if item.state == "queued" else self._run_queue).remove(
                            item
                        )
                    item.state = "done"
                    resolve(future, cancelled_result())
                elif item.state in ("building", "running") and item.sandbox is not None:
                    # The thread waiting on it sees the sandbox die and answers cancelled.
                    item.sandbox.signal_kill()
                self._wake.notify_all()

    # --- the threads -----------------------------------------------------------------------
    def _start_threads(self) -> None:
        if self._started:
            return
        self._started = True
        for i, sandbox in enumerate(self._build_sandboxes):
            self._threads.append(
                threading.Thread(
                    target=self._build_loop,
                    args=(sandbox,),
                    name=f"tunehub-build-{self.device}-{i}",
                    daemon=True,
                )
            )
        self._threads.append(
            threading.Thread(target=self._run_loop, name=f"tunehub-run-{self.device}", daemon=True)
        )
        for thread in self._threads:
            thread.start()

    def _take(self, queue: deque[_Item], state: str, sandbox: SandboxProcess) -> _Item | None:
        with self._wake:
            while not queue and not self._closed:
                self._wake.wait()
            if self._closed:
                return None
            item = queue.popleft()
            item.state = state
            item.sandbox = sandbox
            return item

    def _finish(self, item: _Item, result: MeasureResult) -> None:
        with self._wake:
            item.state = "done"
            item.sandbox = None
            if item.cancelled and result.status is not MeasureStatus.OK:
                result = cancelled_result()
        resolve(item.future, result)

    def _build_loop(self, sandbox: SandboxProcess) -> None:
        while True:
            item = self._take(self._build_queue, "building", sandbox)
            if item is None:
                return
            try:
                self._build(item, sandbox)
            except Exception as exc:  # never lose a request to a bug here
                log.exception("building %s failed unexpectedly", item.request.template)
                self._finish(
                    item, MeasureResult(MeasureStatus.WORKER_ERROR, error=f"worker bug: {exc}")
                )

    def _build(self, item: _Item, sandbox: SandboxProcess) -> None:
        request = item.request

        def stop() -> bool:
            return item.cancelled or self._closed

        try:
            self._ensure_started(sandbox, stop)
            item.build_started = time.monotonic()
            built = self._call_build(sandbox, request, stop)
        except WorkerError as exc:
            self._finish(item, self._worker_error(str(exc)))
            return
        except Cancelled:
            self._finish(item, cancelled_result())
            return
        except SandboxTimeout:
            self._finish(
                item,
                MeasureResult(
                    MeasureStatus.TIMEOUT,
                    error=f"the build did not finish within {self.build_timeout_secs:.0f}s; "
                    "its sandbox was killed",
                    compile_secs=time.monotonic() - item.build_started,
                    environment=self._environment(item, sandbox),
                ),
            )
            return
        except SandboxDied as exc:
            tail = sandbox.stderr_tail()
            self._finish(
                item,
                MeasureResult(
                    MeasureStatus.BUILD_ERROR,
                    error=f"{exc} while building\n{tail}".strip(),
                    compile_secs=time.monotonic() - item.build_started,
                    environment=self._environment(item, sandbox),
                ),
            )
            return
        if built.failure is not None or built.artifact is None:
            failure = built.failure or MeasureResult(
                MeasureStatus.BUILD_ERROR, error="the build returned nothing"
            )
            env = {**failure.environment, **self._environment(item, sandbox)}
            self._finish(item, _with_environment(failure, env))
            return
        with self._wake:
            if item.cancelled or self._closed:
                item.state = "done"
                item.sandbox = None
                resolve(item.future, cancelled_result())
                return
            item.artifact = built.artifact
            item.state = "built"
            item.sandbox = None
            self._run_queue.append(item)
            self._wake.notify_all()

    def _call_build(
        self, sandbox: SandboxProcess, request: MeasureRequest, stop: Callable[[], bool]
    ) -> Built:
        pid = sandbox.pid
        try:
            with self.cores.building(cancelled=stop) as core:
                built = sandbox.call(
                    BuildJob(request, str(self.build_dir), core), self.build_timeout_secs, Built
                )
        except (SandboxTimeout, SandboxDied):
            if pid is not None:  # killed mid-build: what it half-wrote goes too
                remove_temp_files(self.build_dir, pid)
            raise
        self._evict()
        return built

    def _evict(self) -> None:
        """Keep the build cache within its size, now and then (a scan costs a little)."""
        if not self.build_cache_max_bytes:
            return
        with self._lock:
            if time.monotonic() - self._evicted_at < EVICT_EVERY_SECS:
                return
            self._evicted_at = time.monotonic()
        freed = evict_build_cache(
            self.build_dir, self.build_cache_max_bytes, keep_secs=2 * self.max_candidate_secs
        )
        if freed:
            log.info("build cache: evicted %d MiB least recently used", freed >> 20)

    def _run_loop(self) -> None:
        sandbox = self._run_sandbox
        while True:
            item = self._take(self._run_queue, "running", sandbox)
            if item is None:
                return
            try:
                self._run(item, sandbox)
            except Exception as exc:
                log.exception("running %s failed unexpectedly", item.request.template)
                self._finish(
                    item, MeasureResult(MeasureStatus.WORKER_ERROR, error=f"worker bug: {exc}")
                )

    def _run(self, item: _Item, sandbox: SandboxProcess) -> None:
        request, artifact = item.request, item.artifact
        assert artifact is not None

        def stop() -> bool:
            return item.cancelled or self._closed

        limit = self.limit_for(request, item.template)
        cores_used = item.template.cores_used(request.config) if item.template else 1
        start = time.monotonic()
        try:
            lock_name = self.fingerprint().lock_name or self.device
            with self._run_guard:
                self._ensure_started(sandbox, stop)
            with self.cores.timing(lock_name, cores_used, cancelled=stop) as cores:
                start = time.monotonic()
                own_cpu = time.process_time()
                job = RunJob(request, artifact, self.timing, cores)
                result = sandbox.call(job, limit, MeasureResult)
                # This process's own CPU time (the service, the tuning loop, other measurers'
                # threads) while the candidate was checked and timed: tunehub's share of the
                # "others" the timing saw on its cores.
                own_cpu = time.process_time() - own_cpu
                own_wall = time.monotonic() - start
        except WorkerError as exc:
            self._finish(item, self._worker_error(str(exc)))
            return
        except Cancelled:
            self._finish(item, cancelled_result())
            return
        except SandboxTimeout:
            log.warning("%s %s timed out after %.1fs", request.template, request.config, limit)
            self._finish(
                item,
                MeasureResult(
                    MeasureStatus.TIMEOUT,
                    error=f"no result within {limit:.1f}s; the sandbox was killed",
                    compile_secs=artifact.compile_secs,
                    run_secs=time.monotonic() - start,
                    environment=self._environment(item, sandbox),
                ),
            )
            return
        except SandboxDied as exc:
            tail = sandbox.stderr_tail()
            log.warning("%s %s: %s", request.template, request.config, exc)
            self._finish(
                item,
                MeasureResult(
                    MeasureStatus.RUNTIME_ERROR,
                    error=f"{exc} while measuring\n{tail}".strip(),
                    compile_secs=artifact.compile_secs,
                    run_secs=time.monotonic() - start,
                    environment=self._environment(item, sandbox),
                ),
            )
            return
        env = {**result.environment, **self._environment(item, sandbox)}
        env["host_process"] = {"cpu_secs": round(own_cpu, 4), "wall_secs": round(own_wall, 4)}
        self._finish(item, _with_environment(result, env))

    # --- sandboxes -------------------------------------------------------------------------
    def _ensure_started(self, sandbox: SandboxProcess, stop: object) -> None:
        """Start ``sandbox`` if it is not running, retrying; WorkerError when it cannot."""
        if sandbox.alive:
            return
        error = ""
        for attempt in range(self.retries + 1):
            if callable(stop) and stop():
                raise Cancelled("stopped while starting a sandbox")
            try:
                sandbox.start()
                return
            except (OSError, SandboxDied) as exc:
                error = f"{type(exc).__name__}: {exc}"
                tail = sandbox.stderr_tail()
                log.error(
                    "sandbox for %s could not start (attempt %d of %d): %s\n%s",
                    self.device,
                    attempt + 1,
                    self.retries + 1,
                    error,
                    tail,
                )
                if tail:
                    error = f"{error}\n{tail}"
                time.sleep(RESTART_BACKOFF_SECS * (attempt + 1))
        raise WorkerError(
            f"the sandbox could not start after {self.retries + 1} attempts: {error}".strip()
        )

    def _worker_error(self, error: str) -> MeasureResult:
        return MeasureResult(
            MeasureStatus.WORKER_ERROR,
            error=error,
            environment={"host": socket.gethostname(), "device": self.device},
        )

    def _environment(self, item: _Item, sandbox: SandboxProcess) -> dict[str, object]:
        now = time.monotonic()
        return {
            "host": socket.gethostname(),
            "device": self.device,
            "sandbox_pid": sandbox.pid,
            "queue_secs": round(max(0.0, (item.build_started or now) - item.submitted), 6),
        }

    # --- lifecycle -------------------------------------------------------------------------
    def close(self) -> None:
        """Cancel what is in flight, stop the sandboxes, remove a temporary workdir."""
        with self._wake:
            if self._closed:
                return
            self._closed = True
            pending = list(self._items.values())
            self._wake.notify_all()
        for item in pending:
            with self._wake:
                item.cancelled = True
                if item.sandbox is not None:
                    item.sandbox.signal_kill()
                if item.state in ("queued", "built"):
                    item.state = "done"
                    resolve(item.future, cancelled_result())
        for thread in self._threads:
            thread.join(timeout=10.0)
        for item in pending:
            resolve(item.future, cancelled_result())
        self._finalizer()

    def __enter__(self) -> LocalMeasurer:
        return self


def _with_environment(result: MeasureResult, environment: dict[str, object]) -> MeasureResult:
    return MeasureResult(
        result.status,
        repeat_secs=result.repeat_secs,
        error=result.error,
        compile_secs=result.compile_secs,
        verify_secs=result.verify_secs,
        run_secs=result.run_secs,
        environment=dict(environment),
    )
