"""``numpy.matmul``: the Baseline template: numpy's BLAS (OpenBLAS) timed like a tuned kernel."""

from __future__ import annotations

import contextlib
import secrets
import time
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

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
from tunehub.kernels.environment import measurement_environment
from tunehub.kernels.machine import watch
from tunehub.kernels.reference import check_gemm, poisoned_output, random_operands, sample_rows
from tunehub.kernels.space import Knob, SearchSpace
from tunehub.kernels.timing import pinned_to_current_cpu, time_calls


def blas_description() -> dict[str, Any]:
    """numpy's version and its BLAS library (name, version, kernel architecture)."""
    blas = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    info: dict[str, Any] = {"numpy": np.__version__}
    if blas:
        info.update(
            blas=blas[0].get("internal_api", ""),
            blas_version=blas[0].get("version", ""),
            blas_architecture=blas[0].get("architecture", ""),
        )
    return info


class NumpyGemmBaseline(Template):
    """``C = A @ B`` by ``np.matmul`` into a preallocated C, then the epilogue as separate
    numpy ops (``C += bias``; ``np.maximum(C, 0, out=C)``), as a user without tunehub writes
    it. The one knob is ``threads``, set through threadpoolctl for the timed calls.

    Verified and timed exactly as ``blis.gemm`` is: fresh random inputs, NaN-poisoned output,
    the same check, then warm-cache repeats (see ``tunehub.kernels.timing``), pinned to one
    CPU when single-threaded.
    """

    name = "numpy.matmul"
    version = 1
    baseline = True
    device_kind = "cpu"

    def capabilities(self, target: Target) -> Capabilities:
        return Capabilities(
            kinds=("cpu",),
            dtypes=("float32", "float64"),
            epilogues=("none", "bias", "bias_relu"),
        )

    def space(self, workload: Workload, target: Target) -> SearchSpace:
        return SearchSpace(knobs=(Knob("threads", tuple(range(1, max(1, target.cores) + 1))),))

    def default_config(self, workload: Workload, target: Target) -> Config:
        return Config({"threads": 1})

    def baseline_configs(self, workload: Workload, target: Target) -> list[Config]:
        """One thread and every core: the thread counts tuned CPU templates offer."""
        return [Config({"threads": n}) for n in sorted({1, max(1, target.cores)})]

    def build(self, request: MeasureRequest, *, build_dir: Path) -> Artifact:
        """Nothing to compile: the library is numpy's. Checks the request only."""
        problem = self.request_problem(request) or self.capabilities(request.target).problem(
            self.name, request.workload, request.target
        )
        if problem:
            raise BuildFailed(MeasureStatus.INVALID, str(problem))
        return Artifact(template=self.name, key="numpy", environment=blas_description())

    def run(
        self, request: MeasureRequest, artifact: Artifact, *, timing: TimingPolicy
    ) -> MeasureResult:
        workload = request.workload
        min_secs, max_repeats = timing.min_secs, timing.max_repeats
        environment = measurement_environment()
        environment.update(blas_description())
        threads = int(request.config["threads"])
        seed = secrets.randbits(63)
        rng = np.random.default_rng(seed)
        a, b, bias = random_operands(workload, rng)
        c = poisoned_output(workload)
        relu = workload.epilogue == "bias_relu"

        def call() -> None:
            np.matmul(a, b, out=c)
            if bias is not None:
                np.add(c, bias, out=c)
            if relu:
                np.maximum(c, 0, out=c)

        with threadpool_limits(limits=threads, user_api="blas"):
            start = time.perf_counter()
            call()
            check = check_gemm(
                c,
                a,
                b,
                bias,
                workload.epilogue,
                rows=sample_rows(workload.m, workload.n, workload.k, rng),
            )
            verify_secs = time.perf_counter() - start
            environment.update(seed=seed, threads=threads)
            if not check.ok:
                return MeasureResult(
                    MeasureStatus.WRONG_ANSWER,
                    error=check.message,
                    verify_secs=verify_secs,
                    environment=environment,
                )
            # One thread is pinned while timed, as blis.gemm's C loop pins its kernel.
            pin = pinned_to_current_cpu() if threads == 1 else contextlib.nullcontext(None)
            with pin as cpu, watch() as machine:
                start = time.perf_counter()
                timed = time_calls(call, min_secs=min_secs, max_repeats=max_repeats)
                run_secs = time.perf_counter() - start
        environment.update(calls_per_repeat=timed.calls_per_repeat, pinned_cpu=cpu, machine=machine)
        return MeasureResult(
            MeasureStatus.OK,
            repeat_secs=timed.repeat_secs,
            verify_secs=verify_secs,
            run_secs=run_secs,
            environment=environment,
        )
