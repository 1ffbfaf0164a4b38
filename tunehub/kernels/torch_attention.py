"""``torch.sdpa``: attention's vendor Baseline, ``scaled_dot_product_attention``, timed like a
tuned kernel.

What a PyTorch user writes: ``F.scaled_dot_product_attention(q, k, v, is_causal=causal)`` on
batch x heads x len x head_dim tensors. Its one knob is ``backend``: ``auto`` (PyTorch picks,
as a user gets; the backend it picked is recorded where ``torch._fused_sdp_choice`` can tell),
or one backend forced through ``torch.nn.attention.sdpa_kernel`` (``flash``, ``efficient``,
``cudnn``, ``math``), so the best one can be compared too. A backend that cannot run the
workload on the device is ``invalid`` with PyTorch's reason. Checked on fresh inputs against
the float32 reference and timed exactly as ``triton.attention`` is. Imports torch only to run.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from typing import Any

from tunehub.core import (
    Capabilities,
    Config,
    MeasureRequest,
    MeasureResult,
    MeasureStatus,
    Target,
    Workload,
)
from tunehub.kernels.base import Artifact, GpuLibraryBaseline, TimingPolicy
from tunehub.kernels.space import Knob, SearchSpace
from tunehub.kernels.triton_gemm import _device

BACKENDS = ("auto", "flash", "efficient", "cudnn", "math")
# torch.nn.attention.SDPBackend's member per knob value.
SDP_BACKEND = {
    "flash": "FLASH_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
    "cudnn": "CUDNN_ATTENTION",
    "math": "MATH",
}


def chosen_backend(q: Any, k: Any, v: Any, causal: bool) -> str | None:
    """The backend ``scaled_dot_product_attention`` picks for these inputs (``flash``, ...),
    from ``torch._fused_sdp_choice``; None where this PyTorch cannot say."""
    import torch
    from torch.nn.attention import SDPBackend

    try:
        index = int(torch._fused_sdp_choice(q, k, v, None, 0.0, causal))
    except Exception:
        return None
    for name, member in SDP_BACKEND.items():
        if int(getattr(SDPBackend, member)) == index:
            return name
    return None


class TorchSdpaBaseline(GpuLibraryBaseline):
    """``scaled_dot_product_attention``; see the module docstring."""

    name = "torch.sdpa"
    version = 1
    library_key = "sdpa"
    slowest_gflops = 50.0

    def capabilities(self, target: Target) -> Capabilities:
        return Capabilities(
            kinds=("cuda",),
            ops=("attention",),
            dtypes=("float16", "bfloat16"),
            a_layouts=("row_major",),
            b_layouts=("row_major",),
            epilogues=("none",),
        )

    def space(self, workload: Workload, target: Target) -> SearchSpace:
        return SearchSpace(knobs=(Knob("backend", BACKENDS),))

    def default_config(self, workload: Workload, target: Target) -> Config:
        return Config({"backend": "auto"})

    def baseline_configs(self, workload: Workload, target: Target) -> list[Config]:
        """PyTorch's own pick, and each fused backend forced (the best of them is what a
        tuned kernel must approach; ``math`` is the unfused reference path, left out)."""
        return [Config({"backend": b}) for b in BACKENDS if b != "math"]

    def run(
        self, request: MeasureRequest, artifact: Artifact, *, timing: TimingPolicy
    ) -> MeasureResult:
        import torch

        from tunehub.kernels import triton_attention_kernels as kernels
        from tunehub.kernels.gpu_timing import LIBRARY_FAILURES as failures
        from tunehub.kernels.gpu_timing import check_then_time, run_environment

        workload = request.workload
        device = _device()
        environment, seed = run_environment(device)
        backend = str(request.config["backend"])
        environment.update(
            library="torch.nn.functional.scaled_dot_product_attention",
            library_version=f"torch {torch.__version__}, CUDA {torch.version.cuda}",
        )
        try:
            ops = kernels.operands(workload, device, seed)
            if backend == "auto":
                picked = chosen_backend(ops.q, ops.k, ops.v, ops.causal)
                environment["sdpa_backend"] = picked or "unknown"
            else:
                environment["sdpa_backend"] = backend
            call = _call(ops, backend, torch)

            def first() -> Any:
                try:
                    with warnings.catch_warnings():
                        # A forced backend that cannot run warns why, then raises.
                        warnings.simplefilter("ignore", UserWarning)
                        return ops.out.copy_(call())
                except RuntimeError as exc:
                    if "No available kernel" in str(exc) or "No viable backend" in str(exc):
                        raise _CannotRun(exc) from None
                    raise

            return check_then_time(
                call,
                lambda _: kernels.check(ops.out, kernels.reference(ops), workload.dtype),
                device=device,
                environment=environment,
                timing=timing,
                first=first,
            )
        except _CannotRun as refused:
            return MeasureResult(
                MeasureStatus.INVALID,
                error=f"sdpa backend {backend} cannot run {workload.label}: {refused.cause}"[:2000],
                environment=environment,
            )
        except failures.catch as exc:
            return failures.record(exc, environment)


class _CannotRun(Exception):
    """A forced backend refused the workload at its first call (an ``invalid`` config)."""

    def __init__(self, cause: RuntimeError) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _call(ops: Any, backend: str, torch: Any) -> Callable[[], Any]:
    """The call a user writes. SDPA has no ``out=``: the check copies its result into the
    NaN-poisoned O once; the timed calls are SDPA's alone (its output allocation included)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    sdpa = torch.nn.functional.scaled_dot_product_attention
    forced = (
        contextlib.nullcontext
        if backend == "auto"
        else lambda: sdpa_kernel([getattr(SDPBackend, SDP_BACKEND[backend])])
    )

    def call() -> Any:
        with forced():
            return sdpa(ops.q, ops.k, ops.v, is_causal=ops.causal)

    return call
