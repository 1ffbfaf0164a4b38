"""The measurement sandbox: a child process that builds or runs one request at a time, and its
handle.

Run as ``python -m tunehub.workers.sandbox``. A worker keeps build sandboxes (compiling
candidates, each pinned to a core reserved for building) and one run sandbox per device (the
only process that checks and times there; for a GPU it owns the CUDA context). The parent
(``SandboxProcess``) writes jobs to the child's stdin and reads results from its stdout, each
message an 8-byte big-endian length followed by a pickle. The child writes nothing else to that
stdout: at start it moves the
protocol to a private copy of fd 1 and points fd 1 at stderr, so stray prints from templates,
libraries or C code land in the sandbox log instead of corrupting the channel.

A candidate that segfaults, aborts or hangs takes only the child down; the parent reports it
(``SandboxDied`` / ``SandboxTimeout``) and starts a fresh child for the next request.
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import logging
import os
import pickle
import select
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, BinaryIO, TypeVar

from tunehub.core import MeasureRequest, MeasureResult, MeasureStatus, Target
from tunehub.kernels.base import Artifact, BuildFailed, DeviceContextLost, Template, TimingPolicy

log = logging.getLogger(__name__)

T = TypeVar("T")

_HEADER = struct.Struct(">Q")
MAX_MESSAGE_BYTES = 256 << 20
TRACEBACK_TAIL_CHARS = 3000
STDERR_TAIL_CHARS = 3000
STARTUP_TIMEOUT_SECS = 60.0
STOP_TIMEOUT_SECS = 5.0


@dataclass(frozen=True)
class BuildJob:
    """Build ``request`` into ``build_dir``, pinned to CPU ``core`` (None: not pinned)."""

    request: MeasureRequest
    build_dir: str
    core: int | None = None


@dataclass(frozen=True)
class RunJob:
    """Check and time ``artifact`` for ``request``, pinned to ``cores`` (empty: not pinned)."""

    request: MeasureRequest
    artifact: Artifact
    timing: TimingPolicy
    cores: tuple[int, ...] = ()


@dataclass(frozen=True)
class FingerprintJob:
    """Take the fingerprint (a Target) of the device this sandbox measures on."""

    kind: str


@dataclass(frozen=True)
class Built:
    """A build's answer: the artifact, or the failed build's result."""

    artifact: Artifact | None = None
    failure: MeasureResult | None = None


@dataclass(frozen=True)
class Fingerprint:
    """A device's Target, and the name its host-wide lock goes by (``cpu``, ``cuda-<uuid>``:
    the same in every process of the host, whatever CUDA_VISIBLE_DEVICES says)."""

    target: Target | None = None
    lock_name: str = ""
    error: str = ""


@dataclass(frozen=True)
class _Ready:
    pid: int


# --- the wire format ---------------------------------------------------------------------------
def write_message(stream: BinaryIO | IO[bytes], message: Any) -> None:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(payload)) + payload)
    stream.flush()


def _read_exact(stream: BinaryIO | IO[bytes], size: int) -> bytes | None:
    chunks = []
    while size:
        chunk = stream.read(size)
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def read_message(stream: BinaryIO | IO[bytes]) -> Any:
    """The next message; EOFError when the other side closed the stream."""
    header = _read_exact(stream, _HEADER.size)
    if header is None:
        raise EOFError("stream closed")
    (size,) = _HEADER.unpack(header)
    if size > MAX_MESSAGE_BYTES:
        raise ValueError(f"message of {size} bytes is too large")
    payload = _read_exact(stream, size)
    if payload is None:
        raise EOFError("stream closed inside a message")
    return pickle.loads(payload)


# --- the child ---------------------------------------------------------------------------------
def _failure(status: MeasureStatus, error: str) -> MeasureResult:
    return MeasureResult(status, error=error, environment={"sandbox_pid": os.getpid()})


def _template(request: MeasureRequest) -> Template | MeasureResult:
    """The request's template, or the result saying why it cannot be measured here."""
    from tunehub.kernels.registry import UnknownTemplate, get_template

    try:
        template = get_template(request.template)
    except UnknownTemplate as exc:
        return _failure(MeasureStatus.INVALID, str(exc))
    except Exception as exc:  # a plugin module that fails to import
        return _failure(MeasureStatus.RUNTIME_ERROR, _describe(exc))
    if request.template_version != template.version:
        return _failure(
            MeasureStatus.INVALID,
            f"request is for {template.name} v{request.template_version}, "
            f"this worker has v{template.version}",
        )
    return template


def _pin(cores: tuple[int, ...] | list[int]) -> None:
    if cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(cores))


def _machine_failure(reason: str, compile_secs: float = 0.0) -> Built:
    """A build the machine could not do (a full or read-only disk): ``worker_error``, not a
    verdict on the config, which stays unmeasured."""
    return Built(
        failure=MeasureResult(
            MeasureStatus.WORKER_ERROR,
            error=f"the machine cannot build: {reason}",
            compile_secs=compile_secs,
            environment={"sandbox_pid": os.getpid()},
        )
    )


def build_job(job: BuildJob) -> Built:
    """Build one job in this process; exceptions become ``build_error`` failures, except the
    machine's own (the build dir cannot take files, a full disk, no permission), which become
    ``worker_error``."""
    from tunehub.kernels.build import dir_problem, environment_error, mentions_environment

    template = _template(job.request)
    if isinstance(template, MeasureResult):
        return Built(failure=template)
    build_dir = Path(job.build_dir)
    problem = dir_problem(build_dir)
    if problem is not None:
        return _machine_failure(problem)
    start = time.perf_counter()
    try:
        _pin([job.core] if job.core is not None else [])
        artifact = template.build(job.request, build_dir=build_dir)
        if not isinstance(artifact, Artifact):
            raise TypeError(f"{template.name}.build returned {type(artifact).__name__}")
        return Built(artifact=artifact)
    except BuildFailed as exc:
        failure = exc.result()
        trouble = mentions_environment(failure.error)
        if trouble is not None:  # e.g. the compiler could not write: the disk, not the code
            return _machine_failure(
                f"{trouble} ({dir_problem(build_dir) or 'while compiling'})\n{failure.error}",
                failure.compile_secs,
            )
        return Built(failure=failure)
    except Exception as exc:
        spent = time.perf_counter() - start
        machine = environment_error(exc)
        if machine is not None:
            log.error("building %s: the machine failed: %s", job.request.template, machine)
            return _machine_failure(f"{machine.strerror or machine}: {machine}", spent)
        log.exception("building %s failed", job.request.template)
        return Built(
            failure=MeasureResult(
                MeasureStatus.BUILD_ERROR,
                error=_describe(exc),
                compile_secs=spent,
                environment={"sandbox_pid": os.getpid()},
            )
        )


class _Restart(Exception):
    """Reply with ``result``, then exit: the device context cannot be trusted any more."""

    def __init__(self, result: MeasureResult) -> None:
        super().__init__(result.error)
        self.result = result


def run_job(job: RunJob) -> MeasureResult:
    """Check and time one job in this process; exceptions become ``runtime_error`` results."""
    template = _template(job.request)
    if isinstance(template, MeasureResult):
        return template
    from tunehub.kernels.machine import watch

    try:
        _pin(job.cores)
        with watch(job.cores or None) as machine:
            result = template.run(job.request, job.artifact, timing=job.timing)
        if not isinstance(result, MeasureResult):
            raise TypeError(f"{template.name}.run returned {type(result).__name__}")
        if result.status is MeasureStatus.OK and "machine" not in result.environment:
            # A template that does not watch its timed region: the whole run stands for it.
            machine["scope"] = "run"
            result = dataclasses.replace(
                result, environment={**result.environment, "machine": machine}
            )
        return result
    except DeviceContextLost as exc:
        raise _Restart(exc.result) from None
    except Exception as exc:
        log.exception("running %s failed", job.request.template)
        return _failure(MeasureStatus.RUNTIME_ERROR, _describe(exc))


def fingerprint_job(job: FingerprintJob) -> Fingerprint:
    from tunehub.kernels.devices import device_lock_name, fingerprint

    try:
        return Fingerprint(target=fingerprint(job.kind), lock_name=device_lock_name(job.kind))
    except Exception as exc:
        log.exception("fingerprinting the %s device failed", job.kind)
        return Fingerprint(error=f"{type(exc).__name__}: {exc}")


def _describe(exc: BaseException) -> str:
    tail = "".join(traceback.format_exception(exc))[-TRACEBACK_TAIL_CHARS:]
    return f"{type(exc).__name__}: {exc}\n{tail}"


def serve(inp: BinaryIO | IO[bytes], out: BinaryIO | IO[bytes]) -> None:
    """Answer jobs until the parent sends None or closes the stream."""
    write_message(out, _Ready(os.getpid()))
    while True:
        try:
            job = read_message(inp)
        except EOFError:
            return
        if job is None:
            return
        if isinstance(job, BuildJob):
            write_message(out, build_job(job))
        elif isinstance(job, RunJob):
            try:
                write_message(out, run_job(job))
            except _Restart as restart:
                write_message(out, restart.result)
                return
        elif isinstance(job, FingerprintJob):
            write_message(out, fingerprint_job(job))
        else:
            raise TypeError(f"unknown sandbox job {type(job).__name__}")


def _exit_with_parent() -> None:
    """Exit if the parent goes away, even while the main thread is stuck in a hung kernel."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(3)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main() -> None:
    protocol_out = os.fdopen(os.dup(1), "wb")
    protocol_in = os.fdopen(os.dup(0), "rb")
    os.dup2(2, 1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdout = sys.stderr
    faulthandler.enable(file=sys.stderr)  # a crash leaves a Python traceback in the log
    logging.basicConfig(
        stream=sys.stderr,
        level=os.environ.get("TUNEHUB_SANDBOX_LOG_LEVEL", "WARNING"),
        format="%(asctime)s sandbox[%(process)d] %(levelname)s %(name)s: %(message)s",
    )
    _exit_with_parent()
    serve(protocol_in, protocol_out)


# --- the parent's handle -----------------------------------------------------------------------
class SandboxDied(RuntimeError):
    """The child exited while measuring; the message says how (signal name or exit code)."""


class SandboxTimeout(RuntimeError):
    """The child did not answer in time and was killed."""


def describe_exit(returncode: int | None) -> str:
    """'killed by SIGSEGV (signal 11)' / 'exited with status 3'."""
    if returncode is None:
        return "is still running"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "an unknown signal"
        return f"was killed by {name} (signal {-returncode})"
    return f"exited with status {returncode}"


class SandboxProcess:
    """One sandbox child: start, send a job, wait for the answer within a deadline, kill.

    The child runs in its own process group, so killing it also kills what it started (a
    compiler, OpenMP helpers). Its stderr goes to ``log_path`` (truncated at each start). With
    ``tmp_dir`` it gets that as its TMPDIR, emptied whenever a child is killed or replaced, so
    what a killed compiler left half-written does not pile up.
    """

    def __init__(
        self,
        *,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        python: str = sys.executable,
        cwd: Path | None = None,
        tmp_dir: Path | None = None,
    ) -> None:
        self.log_path = log_path
        self.env = dict(env) if env is not None else dict(os.environ)
        self.tmp_dir = tmp_dir
        if tmp_dir is not None:
            self.env["TMPDIR"] = str(tmp_dir)
        self.python = python
        self.cwd = cwd
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._log_mark = 0
        self.starts = 0

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        """Start the child and wait for its ready message (SandboxDied if it never comes)."""
        self.kill()
        if self._log is not None:
            self._log.close()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self.tmp_dir is not None:
            self.tmp_dir.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - lives as long as the child
        self._log_mark = 0
        self._proc = subprocess.Popen(
            [self.python, "-m", "tunehub.workers.sandbox"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=self.env,
            cwd=self.cwd,
            start_new_session=True,
            bufsize=0,
        )
        self.starts += 1
        try:
            ready = self._receive(time.monotonic() + STARTUP_TIMEOUT_SECS)
        except SandboxTimeout:
            raise SandboxDied(f"sandbox did not start within {STARTUP_TIMEOUT_SECS:.0f}s") from None
        if not isinstance(ready, _Ready):
            self.kill()
            raise SandboxDied(f"sandbox sent {type(ready).__name__} instead of its ready message")
        log.debug("sandbox %d started", ready.pid)

    def call(self, job: Any, timeout_secs: float, answer: type[T]) -> T:
        """Send ``job`` and return the child's answer, which must be an ``answer``.

        The child must be running (``start``). SandboxDied if the child exits first (it is
        then reaped), SandboxTimeout if no answer comes within ``timeout_secs`` (the child's
        process group is then killed).
        """
        if not self.alive:
            raise SandboxDied("sandbox is not running")
        self._log_mark = self._log_size()
        proc = self._proc
        assert proc is not None and proc.stdin is not None
        try:
            write_message(proc.stdin, job)
        except (BrokenPipeError, OSError):
            raise SandboxDied(self._death()) from None
        result = self._receive(time.monotonic() + timeout_secs)
        if not isinstance(result, answer):
            self.kill()
            raise SandboxDied(f"sandbox answered with {type(result).__name__}")
        return result

    def _receive(self, deadline: float) -> Any:
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        fd = proc.stdout.fileno()
        header = self._read(fd, _HEADER.size, deadline)
        (size,) = _HEADER.unpack(header)
        if size > MAX_MESSAGE_BYTES:
            self.kill()
            raise SandboxDied(f"sandbox sent a {size}-byte message")
        payload = self._read(fd, size, deadline)
        try:
            return pickle.loads(payload)
        except Exception as exc:  # a garbled answer: the child cannot be trusted any more
            self.kill()
            raise SandboxDied(f"sandbox sent an unreadable answer ({exc})") from None

    def _read(self, fd: int, size: int, deadline: float) -> bytes:
        chunks: list[bytes] = []
        while size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.kill()
                raise SandboxTimeout("sandbox did not answer in time; killed")
            readable, _, _ = select.select([fd], [], [], remaining)
            if not readable:
                continue
            chunk = os.read(fd, min(size, 1 << 20))
            if not chunk:
                raise SandboxDied(self._death())
            chunks.append(chunk)
            size -= len(chunk)
        return b"".join(chunks)

    def _death(self) -> str:
        """Reap the dead child and say how it ended."""
        proc = self._proc
        assert proc is not None
        try:
            code = proc.wait(timeout=STOP_TIMEOUT_SECS)
        except subprocess.TimeoutExpired:
            self.kill()
            code = proc.returncode
        self._close_pipes()
        self.clear_tmp()
        return f"sandbox process {proc.pid} {describe_exit(code)}"

    def _log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def stderr_tail(self, chars: int = STDERR_TAIL_CHARS) -> str:
        """The end of what the child wrote to stderr since the last job was sent."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(self._log_mark, f.tell() - chars))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def signal_kill(self) -> None:
        """Send SIGKILL to the child's process group, from any thread; the thread talking to
        the child sees it die (and reaps it)."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)

    def kill(self) -> None:
        """Kill the child's process group (if running), reap it, and empty its temp dir."""
        proc = self._proc
        if proc is not None:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            self._close_pipes()
        self._proc = None
        self.clear_tmp()

    def clear_tmp(self) -> None:
        """Empty the child's temp dir (what a killed compiler left there)."""
        if self.tmp_dir is not None and self.tmp_dir.is_dir():
            for path in self.tmp_dir.iterdir():
                with contextlib.suppress(OSError):
                    if path.is_dir() and not path.is_symlink():
                        shutil.rmtree(path, ignore_errors=True)
                    else:
                        path.unlink()

    def stop(self) -> None:
        """Ask the child to exit; kill it if it does not within a few seconds."""
        proc = self._proc
        if proc is not None and proc.poll() is None and proc.stdin is not None:
            try:
                write_message(proc.stdin, None)
                proc.wait(timeout=STOP_TIMEOUT_SECS)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()
        if self._log is not None:
            self._log.close()
            self._log = None

    def _close_pipes(self) -> None:
        proc = self._proc
        if proc is None:
            return
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


if __name__ == "__main__":
    # Run the imported module's main, not this __main__ copy's: pickled messages must name
    # classes as tunehub.workers.sandbox.*, which is what the parent unpickles.
    from tunehub.workers import sandbox

    sandbox.main()
