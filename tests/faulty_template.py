"""Test-only templates: ``test.faulty``, whose ``mode`` knob makes build or run succeed, crash,
hang, lie or raise; and ``test.pipeline``, whose builds are slow and runs fast, and which logs
when each build and run began and ended (to check how the pipeline overlaps them).

Loaded into sandbox processes with ``TUNEHUB_TEMPLATE_MODULES=tests.faulty_template``.
``test.pipeline`` writes its intervals to the file named by ``$TUNEHUB_TEST_INTERVALS`` (one
line per build or run: ``kind pid start end i cores``, times from ``time.time()``), and its
build and run last ``$TUNEHUB_TEST_BUILD_SECS`` and ``$TUNEHUB_TEST_RUN_SECS``.
"""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import time
from pathlib import Path

import numpy as np

from tunehub.core import (
    Capabilities,
    Config,
    MeasureRequest,
    MeasureResult,
    MeasureStatus,
    Target,
    Workload,
)
from tunehub.kernels.base import Artifact, BuildFailed, Template, TimingPolicy
from tunehub.kernels.registry import register
from tunehub.kernels.space import Knob, SearchSpace

MODES = (
    "ok",
    "crash",
    "hang",
    "wrong",
    "raise",
    "exit",
    "noisy",
    "sleep60",
    "build_fail",
    "build_hang",
    "build_crash",
)


def _small_matmul_times(workload: Workload, repeats: int) -> tuple[float, ...]:
    """Time a real (small) matmul so an ok result carries genuine times."""
    a = np.ones((min(workload.m, 64), min(workload.k, 64)))
    b = np.ones((min(workload.k, 64), min(workload.n, 64)))
    secs = []
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        a @ b
        secs.append(max(time.perf_counter() - start, 1e-9))
    return tuple(secs)


class FaultyTemplate(Template):
    name = "test.faulty"
    version = 1

    def capabilities(self, target: Target) -> Capabilities:
        return Capabilities(kinds=("cpu",))

    def space(self, workload: Workload, target: Target) -> SearchSpace:
        return SearchSpace(knobs=(Knob("mode", MODES),))

    def default_config(self, workload: Workload, target: Target) -> Config:
        return Config({"mode": "ok"})

    def build(self, request: MeasureRequest, *, build_dir: Path) -> Artifact:
        mode = request.config["mode"]
        if mode == "build_fail":
            raise BuildFailed(MeasureStatus.BUILD_ERROR, "cc: deliberately failed")
        if mode == "build_hang":
            while True:
                time.sleep(3600)
        if mode == "build_crash":
            os.kill(os.getpid(), signal.SIGSEGV)
        return Artifact(template=self.name, key=str(mode), data={"built_by": os.getpid()})

    def run(
        self, request: MeasureRequest, artifact: Artifact, *, timing: TimingPolicy
    ) -> MeasureResult:
        mode = request.config["mode"]
        if mode == "crash":
            os.kill(os.getpid(), signal.SIGSEGV)
        if mode == "exit":
            os._exit(7)
        if mode == "hang":
            while True:
                time.sleep(3600)
        if mode == "sleep60":
            time.sleep(60)
        if mode == "raise":
            raise RuntimeError("faulty template was asked to raise")
        if mode == "noisy":
            # stray output must not reach the sandbox's protocol channel
            print("noise from the template (print)")
            os.write(1, b"noise from the template (fd 1)\n")
        if mode == "wrong":
            return MeasureResult(MeasureStatus.WRONG_ANSWER, error="deliberately wrong")
        return MeasureResult(
            MeasureStatus.OK,
            repeat_secs=_small_matmul_times(request.workload, min(3, timing.max_repeats)),
            environment={"pid": os.getpid(), "built_by": artifact.data.get("built_by")},
        )


def _log_interval(kind: str, start: float, end: float, config: Config) -> None:
    path = os.environ.get("TUNEHUB_TEST_INTERVALS")
    if not path:
        return
    cores = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
    line = f"{kind} {os.getpid()} {start:.6f} {end:.6f} {config['i']} {cores}\n"
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(line)
        fcntl.flock(f, fcntl.LOCK_UN)


def _log_replica_run(start: float, end: float, request: MeasureRequest) -> None:
    """One line per timed run, ``m ppid start end``, to ``$TUNEHUB_TEST_REPLICA_RUNS``: which
    ``tunehub serve`` (the sandbox's parent) ran which job (the workload's m) when."""
    path = os.environ.get("TUNEHUB_TEST_REPLICA_RUNS")
    if not path:
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(f"{request.workload.m} {os.getppid()} {start:.6f} {end:.6f}\n")
        fcntl.flock(f, fcntl.LOCK_UN)


class PipelineTemplate(Template):
    """Slow builds, fast runs; every build and run logs its interval."""

    name = "test.pipeline"
    version = 1

    def capabilities(self, target: Target) -> Capabilities:
        return Capabilities(kinds=("cpu",))

    def space(self, workload: Workload, target: Target) -> SearchSpace:
        return SearchSpace(knobs=(Knob("i", tuple(range(64))),))

    def default_config(self, workload: Workload, target: Target) -> Config:
        return Config({"i": 0})

    def build(self, request: MeasureRequest, *, build_dir: Path) -> Artifact:
        start = time.time()
        time.sleep(float(os.environ.get("TUNEHUB_TEST_BUILD_SECS", "0.3")))
        _log_interval("build", start, time.time(), request.config)
        return Artifact(template=self.name, key=str(request.config["i"]))

    def run(
        self, request: MeasureRequest, artifact: Artifact, *, timing: TimingPolicy
    ) -> MeasureResult:
        start = time.time()
        time.sleep(float(os.environ.get("TUNEHUB_TEST_RUN_SECS", "0.05")))
        end = time.time()
        _log_interval("run", start, end, request.config)
        _log_replica_run(start, end, request)
        return MeasureResult(
            MeasureStatus.OK,
            repeat_secs=(1e-3 * (1 + int(request.config["i"]) % 7),),
            run_secs=end - start,
            environment={"pid": os.getpid(), "affinity": sorted(os.sched_getaffinity(0))},
        )


class SleepyTemplate(FaultyTemplate):
    """One config, which runs for a minute (to cancel while it runs)."""

    name = "test.sleepy"

    def space(self, workload: Workload, target: Target) -> SearchSpace:
        return SearchSpace(knobs=(Knob("mode", ("sleep60",)),))

    def default_config(self, workload: Workload, target: Target) -> Config:
        return Config({"mode": "sleep60"})


class MachineTroubleTemplate(FaultyTemplate):
    """Builds that fail for the machine's reasons, or leave litter behind when killed."""

    name = "test.machine"

    def space(self, workload: Workload, target: Target) -> SearchSpace:
        return SearchSpace(knobs=(Knob("mode", ("ok", "enospc", "cc_full", "litter_hang")),))

    def build(self, request: MeasureRequest, *, build_dir: Path) -> Artifact:
        mode = request.config["mode"]
        if mode == "enospc":
            raise OSError(errno.ENOSPC, "No space left on device", str(build_dir / "k.c"))
        if mode == "cc_full":
            raise BuildFailed(
                MeasureStatus.BUILD_ERROR,
                "cc exited with status 1\ncc1: fatal error: error writing to /tmp/ccQx.s: "
                "No space left on device",
            )
        if mode == "litter_hang":  # half-written files, as a compiler killed mid-way leaves
            (build_dir / f"kernel-abc.c.{os.getpid()}.tmp.c").write_text("half")
            (Path(os.environ.get("TMPDIR", "/tmp")) / f"cc{os.getpid()}.s").write_text("half")
            while True:
                time.sleep(3600)
        return super().build(request, build_dir=build_dir)


register(FaultyTemplate())
register(PipelineTemplate())
register(SleepyTemplate())
register(MachineTroubleTemplate())
