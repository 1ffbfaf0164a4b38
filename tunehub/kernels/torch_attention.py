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
import secrets
import time
import warnings
from collections.abc import Callable
from pathlib import Path
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
from tunehub.kernels.base import Artifact, BuildFailed, DeviceContextLost, Template, TimingPolicy
from tunehub.kernels.space import Knob, SearchSpace
from tunehub.kernels.triton_gemm import _device, _synchronize

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


class TorchSdpaBaseline(Template):
    """``scaled_dot_product_attention``; see the module docstring."""

    name = "torch.sdpa"
    version = 1
    baseline = True
    device_kind = "cuda"
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

    def cores_used(self, config: Config) -> int:
        return 1

    def build(self, request: MeasureRequest, *, build_dir: Path) -> Artifact:
        """Nothing to compile: the kernels are PyTorch's. Checks the request only."""
        problem = self.request_problem(request) or self.capabilities(request.target).problem(
            self.name, request.workload, request.target
        )
        if problem:
            raise BuildFailed(MeasureStatus.INVALID, str(problem))
        return Artifact(template=self.name, key="sdpa")

    def run(
        self, request: MeasureRequest, artifact: Artifact, *, timing: TimingPolicy
    ) -> MeasureResult:
        import torch

        from tunehub.kernels import triton_attention_kernels as kernels
        from tunehub.kernels.gpu_timing import gpu_environment, time_gpu

        workload = request.workload
        device = _device()
        environment: dict[str, Any] = gpu_environment(device)
        seed = secrets.randbits(62)
        backend = str(request.config["backend"])
        environment.update(
            seed=seed,
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
            start = time.perf_counter()
            try:
                with warnings.catch_warnings():
                    # A forced backend that cannot run warns why, then raises.
                    warnings.simplefilter("ignore", UserWarning)
                    ops.out.copy_(call())
            except RuntimeError as exc:
                if "No available kernel" in str(exc) or "No viable backend" in str(exc):
                    return MeasureResult(
                        MeasureStatus.INVALID,
                        error=f"sdpa backend {backend} cannot run {workload.label}: {exc}"[:2000],
                        environment=environment,
                    )
                raise
            _synchronize(device)
            ref = kernels.reference(ops)
            check = kernels.check(ops.out, ref, workload.dtype)
            del ref
            verify_secs = time.perf_counter() - start
            environment.update(relative_error=check.relative_error, tolerance=check.tolerance)
            if not check.ok:
                return MeasureResult(
                    MeasureStatus.WRONG_ANSWER,
                    error=check.message,
                    verify_secs=verify_secs,
                    environment=environment,
                )
            start = time.perf_counter()
            timed = time_gpu(
                call, min_secs=timing.min_secs, max_repeats=timing.max_repeats, device=device
            )
            run_secs = time.perf_counter() - start
        except torch.cuda.OutOfMemoryError as exc:
            return MeasureResult(
                MeasureStatus.RUNTIME_ERROR,
                error=f"out of GPU memory: {exc}"[:2000],
                environment=environment,
            )
        except RuntimeError as exc:
            failed = MeasureResult(
                MeasureStatus.RUNTIME_ERROR,
                error=f"{type(exc).__name__}: {exc}"[:3000],
                environment=environment,
            )
            if "CUDA error" in str(exc):
                raise DeviceContextLost(failed) from None
            return failed
        environment.update(graph=timed.graph, flush_bytes=timed.flush_bytes, machine=timed.machine)
        return MeasureResult(
            MeasureStatus.OK,
            repeat_secs=timed.repeat_secs,
            verify_secs=verify_secs,
            run_secs=run_secs,
            environment=environment,
        )


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
