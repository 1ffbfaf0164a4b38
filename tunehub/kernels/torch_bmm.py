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
from collections.abc import Iterator
from typing import Any

import numpy as np

from tunehub.core import (
    Capabilities,
    MeasureRequest,
    MeasureResult,
    Target,
)
from tunehub.kernels.base import Artifact, ThreadedCpuBaseline, TimingPolicy
from tunehub.kernels.blis_bmm import bmm_operands, check_bmm
from tunehub.kernels.environment import measurement_environment
from tunehub.kernels.timing import LibraryCheck, measure_library_call


def torch_description() -> dict[str, Any]:
    """PyTorch's version and the CPU libraries it was built with."""
    import torch

    return {
        "torch": torch.__version__,
        "torch_mkl": bool(torch.backends.mkl.is_available()),  # type: ignore[no-untyped-call]
        "torch_mkldnn": bool(torch.backends.mkldnn.is_available()),  # type: ignore[no-untyped-call]
        "torch_threads": torch.get_num_threads(),
    }


@contextlib.contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """PyTorch's intra-op thread count set for the block and restored after."""
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


class TorchBmmBaseline(ThreadedCpuBaseline):
    """PyTorch's CPU bmm; see the module docstring."""

    name = "torch.bmm"
    version = 1
    library_key = "torch"

    def capabilities(self, target: Target) -> Capabilities:
        return Capabilities(
            kinds=("cpu",), ops=("bmm",), dtypes=("float32", "float64"), epilogues=("none",)
        )

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

        def call() -> None:
            torch.bmm(a, b, out=c)

        def check() -> LibraryCheck:
            return LibraryCheck.of_sampled(check_bmm(c_np, a_np, b_np, rng))

        with torch_threads(threads):
            return measure_library_call(
                call, check, environment=environment, seed=seed, threads=threads, timing=timing
            )
