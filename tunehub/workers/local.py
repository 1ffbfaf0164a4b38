"""LocalMeasurer: measures requests one at a time on this machine, inside a sandbox process."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType

from tunehub.core import MeasureRequest, MeasureResult, MeasureStatus, utc_now
from tunehub.workers.base import Measurer
from tunehub.workers.sandbox import SandboxDied, SandboxJob, SandboxProcess, SandboxTimeout

log = logging.getLogger(__name__)

ProgressFn = Callable[[MeasureRequest, MeasureResult], None]

DEFAULT_MIN_SECS = 0.2
DEFAULT_MAX_REPEATS = 50
DEFAULT_BUILD_ALLOWANCE_SECS = 120.0
# The default run allowance assumes the slowest candidate worth waiting for runs at
# SLOWEST_GFLOPS and needs CALLS_ALLOWED calls (verify, warm-up, three repeats, slack).
SLOWEST_GFLOPS = 1.0
CALLS_ALLOWED = 6
RUN_OVERHEAD_SECS = 10.0


def _child_env(build_dir: Path | None, extra: Mapping[str, str] | None) -> dict[str, str]:
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
    if build_dir is not None:
        env["TUNEHUB_BUILD_DIR"] = str(build_dir)
    env.update(extra or {})
    return env


def _shutdown(sandbox: SandboxProcess, workdir: Path | None) -> None:
    sandbox.stop()
    if workdir is not None:
        shutil.rmtree(workdir, ignore_errors=True)


class LocalMeasurer(Measurer):
    """Measures each request in a long-lived sandbox child (``tunehub.workers.sandbox``).

    Requests run strictly one at a time, so no candidate compiles while another is timed.
    A child that dies (signal, abort, exit) yields ``runtime_error`` naming the signal or exit
    code, with the tail of the child's stderr; one that exceeds the request's time limit is
    killed (with its process group) and yields ``timeout``. Either way a fresh child serves
    the next request. ``progress(request, result)`` is called after each result.

    The limit is ``timeout_secs`` if given, else ``build_allowance_secs`` plus a run allowance
    that grows with the workload's flops (see ``timeout_for``). Compiled kernels are cached in
    ``build_dir`` (default: the template's, under ``workdir``). Without ``workdir`` a temporary
    one is made and removed by ``close``.

    >>> with LocalMeasurer(timeout_secs=60) as measurer:  # doctest: +SKIP
    ...     results = measurer.measure(requests)
    """

    def __init__(
        self,
        *,
        workdir: Path | None = None,
        build_dir: Path | None = None,
        min_secs: float = DEFAULT_MIN_SECS,
        max_repeats: int = DEFAULT_MAX_REPEATS,
        timeout_secs: float | None = None,
        build_allowance_secs: float = DEFAULT_BUILD_ALLOWANCE_SECS,
        env: Mapping[str, str] | None = None,
        progress: ProgressFn | None = None,
        python: str = sys.executable,
    ) -> None:
        if max_repeats < 1:
            raise ValueError("max_repeats must be at least 1")
        if timeout_secs is not None and timeout_secs <= 0:
            raise ValueError("timeout_secs must be positive")
        self._owns_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="tunehub-measure-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.build_dir = build_dir
        self.min_secs = min_secs
        self.max_repeats = max_repeats
        self.timeout_secs = timeout_secs
        self.build_allowance_secs = build_allowance_secs
        self.progress = progress
        self._sandbox = SandboxProcess(
            log_path=self.workdir / "sandbox.log",
            env=_child_env(build_dir, env),
            python=python,
        )
        self._lock = threading.Lock()
        self._closed = False
        # A measurer that is never closed still takes its child (and temp workdir) with it.
        self._finalizer = weakref.finalize(
            self, _shutdown, self._sandbox, self.workdir if self._owns_workdir else None
        )

    @property
    def sandbox_pid(self) -> int | None:
        """The current child's pid (None before the first request or after a failure)."""
        return self._sandbox.pid if self._sandbox.alive else None

    @property
    def sandbox_starts(self) -> int:
        """How many children have been started (1 + restarts after failures)."""
        return self._sandbox.starts

    def timeout_for(self, request: MeasureRequest) -> float:
        """The time limit for one request: build, verify and time it."""
        if self.timeout_secs is not None:
            return self.timeout_secs
        run_secs = (
            RUN_OVERHEAD_SECS
            + 4 * self.min_secs
            + CALLS_ALLOWED * request.workload.flops / (SLOWEST_GFLOPS * 1e9)
        )
        return self.build_allowance_secs + run_secs

    def measure(self, requests: Sequence[MeasureRequest]) -> list[MeasureResult]:
        with self._lock:
            if self._closed:
                raise RuntimeError("LocalMeasurer is closed")
            results = []
            for request in requests:
                result = self._measure_one(request)
                results.append(result)
                if self.progress is not None:
                    try:
                        self.progress(request, result)
                    except Exception:
                        log.exception("progress callback failed")
            return results

    def _measure_one(self, request: MeasureRequest) -> MeasureResult:
        job = SandboxJob(request, str(self.workdir), self.min_secs, self.max_repeats)
        limit = self.timeout_for(request)
        start = time.monotonic()
        try:
            return self._sandbox.call(job, limit)
        except SandboxTimeout:
            log.warning("%s %s timed out after %.1fs", request.template, request.config, limit)
            return MeasureResult(
                MeasureStatus.TIMEOUT,
                error=f"no result within {limit:.1f}s; the sandbox was killed",
                run_secs=time.monotonic() - start,
                environment=self._environment(),
            )
        except OSError as exc:  # the sandbox could not even be started (fds, memory, exec)
            log.error("cannot start a sandbox for %s: %s", request.template, exc)
            return MeasureResult(
                MeasureStatus.RUNTIME_ERROR,
                error=f"could not start the sandbox: {exc}",
                run_secs=time.monotonic() - start,
                environment=self._environment(),
            )
        except SandboxDied as exc:
            tail = self._sandbox.stderr_tail()
            log.warning("%s %s: %s", request.template, request.config, exc)
            return MeasureResult(
                MeasureStatus.RUNTIME_ERROR,
                error=f"{exc} while measuring\n{tail}".strip(),
                run_secs=time.monotonic() - start,
                environment=self._environment(),
            )

    @staticmethod
    def _environment() -> dict[str, str]:
        return {"host": socket.gethostname(), "measured_at": utc_now().isoformat()}

    def close(self) -> None:
        """Stop the sandbox child; remove the workdir if this measurer made it."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._finalizer()

    def __enter__(self) -> LocalMeasurer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
