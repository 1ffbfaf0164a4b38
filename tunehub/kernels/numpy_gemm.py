"""``numpy.matmul``: the Baseline template: numpy's BLAS (OpenBLAS) timed like a tuned kernel."""

from __future__ import annotations

import secrets
from typing import Any

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

from tunehub.core import Capabilities, MeasureRequest, MeasureResult, Target
from tunehub.kernels.base import Artifact, ThreadedCpuBaseline, TimingPolicy
from tunehub.kernels.environment import measurement_environment
from tunehub.kernels.reference import check_gemm, poisoned_output, random_operands, sample_rows
from tunehub.kernels.timing import LibraryCheck, measure_library_call


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


class NumpyGemmBaseline(ThreadedCpuBaseline):
    """``C = A @ B`` by ``np.matmul`` into a preallocated C, then the epilogue as separate
    numpy ops (``C += bias``; ``np.maximum(C, 0, out=C)``), as a user without tunehub writes
    it. The one knob is ``threads``, set through threadpoolctl for the timed calls.

    Verified and timed exactly as ``blis.gemm`` is: fresh random inputs, NaN-poisoned output,
    the same check, then warm-cache repeats (see ``tunehub.kernels.timing``), pinned to one
    CPU when single-threaded.
    """

    name = "numpy.matmul"
    version = 1
    library_key = "numpy"

    def capabilities(self, target: Target) -> Capabilities:
        return Capabilities(
            kinds=("cpu",),
            dtypes=("float32", "float64"),
            epilogues=("none", "bias", "bias_relu"),
        )

    def library_environment(self) -> dict[str, Any]:
        return blas_description()

    def run(
        self, request: MeasureRequest, artifact: Artifact, *, timing: TimingPolicy
    ) -> MeasureResult:
        workload = request.workload
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

        def check() -> LibraryCheck:
            rows = sample_rows(workload.m, workload.n, workload.k, rng)
            outcome = check_gemm(c, a, b, bias, workload.epilogue, rows=rows)
            return LibraryCheck(outcome.ok, outcome.message)

        with threadpool_limits(limits=threads, user_api="blas"):
            return measure_library_call(
                call, check, environment=environment, seed=seed, threads=threads, timing=timing
            )
