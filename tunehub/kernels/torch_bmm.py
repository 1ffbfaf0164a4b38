"""``torch.bmm``: the CPU Baseline template of ``bmm``: PyTorch's batched GEMM (its BLAS, oneDNN
or OpenBLAS as the build has it), timed like a tuned kernel.

What a PyTorch user writes: ``torch.bmm(a, b, out=c)``; a broadcast B is ``b.expand(batch, k,
n)`` (stride 0 along the batch, no copy). The one knob is ``threads``
(``torch.set_num_threads`` for the timed calls): one or every core, the thread counts the tuned
template offers. Checked on fresh random inputs into a NaN-poisoned C against the float64
reference and timed with warm caches, as ``blis.bmm`` is. Imports torch only to run.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from pathlib import Path
from typing import Any

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
from tunehub.kernels.blis_bmm import bmm_operands, check_bmm
from tunehub.kernels.environment import measurement_environment
from tunehub.kernels.machine import watch
from tunehub.kernels.space import Knob, SearchSpace
from tunehub.kernels.timing import pinned_to_current_cpu, time_calls


def torch_description() -> dict[str, Any]:
    """PyTorch's version and the CPU libraries it was built with."""
    import torch

    return {
        "torch": torch.__version__,
        "torch_mkl": bool(torch.backends.mkl.is_available()),  # type: ignore[no-untyped-call]
        "torch_mkldnn": bool(torch.backends.mkldnn.is_available()),  # type: ignore[no-untyped-call]
        "torch_threads": torch.get_num_threads(),
    }


class TorchBmmBaseline(Template):
    """PyTorch's CPU bmm; see the module docstring."""

    name = "torch.bmm"
    version = 1
    baseline = True
    device_kind = "cpu"

    def capabilities(self, target: Target) -> Capabilities:
        return Capabilities(
            kinds=("cpu",), ops=("bmm",), dtypes=("float32", "float64"), epilogues=("none",)
        )

    def space(self, workload: Workload, target: Target) -> SearchSpace:
        return SearchSpace(knobs=(Knob("threads", tuple(range(1, max(1, target.cores) + 1))),))

    def default_config(self, workload: Workload, target: Target) -> Config:
        return Config({"threads": 1})

    def baseline_configs(self, workload: Workload, target: Target) -> list[Config]:
        return [Config({"threads": n}) for n in sorted({1, max(1, target.cores)})]

    def build(self, request: MeasureRequest, *, build_dir: Path) -> Artifact:
        """Nothing to compile: the library is PyTorch's. Checks the request only."""
        problem = self.request_problem(request) or self.capabilities(request.target).problem(
            self.name, request.workload, request.target
        )
        if problem:
            raise BuildFailed(MeasureStatus.INVALID, str(problem))
        return Artifact(template=self.name, key="torch")

    def run(
        self, request: MeasureRequest, artifact: Artifact, *, timing: TimingPolicy
    ) -> MeasureResult:
        import torch

        workload = request.workload
        environment = measurement_environment()
        environment.update(torch_description())
        threads = int(request.config["threads"])
        seed = secrets.randbits(63)
        rng = np.random.default_rng(seed)
        a_np, b_np = bmm_operands(workload, rng)
        batch = int(workload.param("batch"))
        c_np = np.full((batch, workload.m, workload.n), np.nan, dtype=np.dtype(workload.dtype))
        a, c = torch.from_numpy(a_np), torch.from_numpy(c_np)
        b = torch.from_numpy(b_np)
        if b.dim() == 2:
            b = b.expand(batch, workload.k, workload.n)
        saved = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:

            def call() -> None:
                torch.bmm(a, b, out=c)

            start = time.perf_counter()
            call()
            ok, rows, max_abs, max_ratio, message = check_bmm(c_np, a_np, b_np, rng)
            verify_secs = time.perf_counter() - start
            environment.update(seed=seed, threads=threads, verify_rows=rows)
            if not ok:
                return MeasureResult(
                    MeasureStatus.WRONG_ANSWER,
                    error=message,
                    verify_secs=verify_secs,
                    environment=environment,
                )
            environment.update(max_abs_err=max_abs, max_err_ratio=max_ratio)
            pin = pinned_to_current_cpu() if threads == 1 else contextlib.nullcontext(None)
            with pin as cpu, watch() as machine:
                start = time.perf_counter()
                timed = time_calls(call, min_secs=timing.min_secs, max_repeats=timing.max_repeats)
                run_secs = time.perf_counter() - start
        finally:
            torch.set_num_threads(saved)
        environment.update(calls_per_repeat=timed.calls_per_repeat, pinned_cpu=cpu, machine=machine)
        return MeasureResult(
            MeasureStatus.OK,
            repeat_secs=timed.repeat_secs,
            verify_secs=verify_secs,
            run_secs=run_secs,
            environment=environment,
        )
