"""``torch.matmul``: the GPU Baseline template: cuBLAS through PyTorch, timed like a tuned kernel.

What a PyTorch user writes: ``torch.matmul(a, b, out=c)``; with a bias ``torch.addmm(bias, a,
b, out=c)``, then ReLU or GELU in place as a separate op; float8 through
``torch._scaled_mm`` (unit scales, float16 out; it wants A row-major and B column-major, so
other layouts are copied once, outside the timing). Its one knob is ``allow_tf32`` (cuBLAS's
TF32 switch for float32), set from the workload. Checked and timed exactly as ``triton.gemm``
is (``tunehub.kernels.gpu_reference`` and ``gpu_timing``). Imports torch only to run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tunehub.core import (
    Capabilities,
    MeasureRequest,
    MeasureResult,
    Target,
    Workload,
)
from tunehub.kernels.base import Artifact, Tf32GpuBaseline, TimingPolicy
from tunehub.kernels.triton_gemm import capability_of


class TorchMatmulBaseline(Tf32GpuBaseline):
    """cuBLAS through PyTorch; see the module docstring."""

    name = "torch.matmul"
    version = 1
    library_key = "cublas"
    slowest_gflops = 50.0

    def capabilities(self, target: Target) -> Capabilities:
        dtypes = ["float16", "bfloat16", "float32", "float64"]
        if capability_of(target) >= 89:
            dtypes.append("float8_e4m3")
        return Capabilities(kinds=("cuda",), dtypes=tuple(dtypes), tf32=True)

    def run(
        self, request: MeasureRequest, artifact: Artifact, *, timing: TimingPolicy
    ) -> MeasureResult:
        import torch

        from tunehub.kernels import gpu_reference as ref
        from tunehub.kernels.gpu_timing import MATMUL_FAILURES as failures
        from tunehub.kernels.gpu_timing import check_then_time, run_environment, tf32
        from tunehub.kernels.triton_gemm import _device

        workload = request.workload
        device = _device()
        environment, seed = run_environment(device)
        environment.update(
            library="cuBLAS",
            library_version=f"torch {torch.__version__}, CUDA {torch.version.cuda}",
            library_kernel="torch._scaled_mm"
            if workload.dtype == "float8_e4m3"
            else "torch.addmm"
            if workload.has_bias
            else "torch.matmul",
        )
        allow = bool(request.config["allow_tf32"])
        try:
            with tf32(allow):
                ops = ref.operands(workload, device, seed)
                return check_then_time(
                    _call(workload, ops, torch),
                    lambda _: ref.check(ops.out, ref.reference(ops, workload.epilogue), workload),
                    device=device,
                    environment=environment,
                    timing=timing,
                )
        except failures.catch as exc:
            return failures.record(exc, environment)


def _call(workload: Workload, ops: Any, torch: Any) -> Callable[[], Any]:
    """The PyTorch calls a user would write for this workload, writing into ``ops.out``."""
    a, b, bias, out = ops.a, ops.b, ops.bias, ops.out
    act: Callable[[Any], Any] | None = None
    if workload.epilogue == "bias_relu":
        act = torch.relu_
    elif workload.epilogue == "bias_gelu":
        act = torch.ops.aten.gelu_
    if workload.dtype == "float8_e4m3":
        a_ = a if a.stride(1) == 1 else a.contiguous()  # _scaled_mm: A row-major
        b_ = b if b.stride(0) == 1 else b.t().contiguous().t()  # and B column-major
        one = torch.ones((), dtype=torch.float32, device=a.device)

        def fp8() -> Any:
            torch._scaled_mm(
                a_, b_, scale_a=one, scale_b=one, bias=bias, out_dtype=out.dtype, out=out
            )
            return act(out) if act is not None else out

        return fp8
    if bias is None:
        return lambda: torch.matmul(a, b, out=out)

    def addmm() -> Any:
        torch.addmm(bias, a, b, out=out)
        return act(out) if act is not None else out

    return addmm
