"""GPU GEMM operands and their check (imports torch; GPU run sandboxes and tests only).

Fresh random operands uniform in [-1, 1) (float8 ones drawn in float16, then rounded), stored
as the workload's layouts say; C filled with NaN, so an element a kernel never writes fails
the check; the reference in float64 on the same device (the GPU's float64 matrix units make
it cheap), and the check ``||C - ref|| / ||ref||`` against a tolerance per dtype (any NaN or
infinity fails).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from tunehub.core import Workload
from tunehub.kernels.triton_gemm_limits import TOLERANCE

TORCH_DTYPES: dict[str, torch.dtype] = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
    "float8_e4m3": torch.float8_e4m3fn,
}


def kernel_dtype(workload: Workload) -> str:
    """The Triton kernels' name for the workload's operand dtype."""
    return "float8_e4m3fn" if workload.dtype == "float8_e4m3" else workload.dtype


@dataclass
class Operands:
    a: torch.Tensor
    b: torch.Tensor
    bias: torch.Tensor | None
    out: torch.Tensor
    seed: int


def _matrix(
    rows: int, cols: int, layout: str, dtype: torch.dtype, device: torch.device, g: torch.Generator
) -> torch.Tensor:
    draw = torch.float16 if dtype == torch.float8_e4m3fn else dtype
    shape = (rows, cols) if layout == "row_major" else (cols, rows)
    t = torch.empty(shape, dtype=draw, device=device).uniform_(-1.0, 1.0, generator=g)
    t = t if layout == "row_major" else t.t()
    return t.to(dtype) if draw != dtype else t


def operands(workload: Workload, device: torch.device, seed: int) -> Operands:
    """Fresh A, B, bias and a NaN-poisoned C for ``workload`` on ``device``."""
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    dtype = TORCH_DTYPES[workload.dtype]
    out_dtype = TORCH_DTYPES[workload.output_dtype]
    a = _matrix(workload.m, workload.k, workload.a_layout, dtype, device, g)
    b = _matrix(workload.k, workload.n, workload.b_layout, dtype, device, g)
    bias = None
    if workload.has_bias:
        bias = torch.empty(workload.n, dtype=out_dtype, device=device).uniform_(
            -1.0, 1.0, generator=g
        )
    out = torch.full((workload.m, workload.n), math.nan, dtype=out_dtype, device=device)
    return Operands(a, b, bias, out, seed)


def reference(ops: Operands, epilogue: str) -> torch.Tensor:
    """float64 ``epilogue(A @ B + bias)`` on the operands' device."""
    ref = ops.a.to(torch.float64) @ ops.b.to(torch.float64)
    if epilogue != "none":
        assert ops.bias is not None
        ref += ops.bias.to(torch.float64)[None, :]
    if epilogue == "bias_relu":
        ref.relu_()
    elif epilogue == "bias_gelu":
        ref = torch.nn.functional.gelu(ref)
    return ref


def tolerance(workload: Workload) -> float:
    if workload.dtype == "float32" and workload.allow_tf32:
        return TOLERANCE["tf32"]
    return TOLERANCE[kernel_dtype(workload)]


@dataclass(frozen=True)
class GpuCheck:
    ok: bool
    relative_error: float
    tolerance: float
    message: str


def check(out: torch.Tensor, ref: torch.Tensor, workload: Workload) -> GpuCheck:
    """Compare C with the reference: every element finite, and the relative Frobenius error
    within the dtype's tolerance."""
    tol = tolerance(workload)
    finite = torch.isfinite(out)
    bad = int((~finite).sum())
    if bad:
        where = torch.nonzero(~finite)[0].tolist()
        return GpuCheck(
            False,
            math.inf,
            tol,
            f"{bad} of {out.numel()} elements are not finite (first at C[{where[0]}, "
            f"{where[1]}] = {out[where[0], where[1]].item()!r}): unwritten or overflowed",
        )
    diff = float(torch.linalg.vector_norm(out.to(torch.float64) - ref))
    scale = float(torch.linalg.vector_norm(ref))
    rel = diff / scale if scale > 0 else diff
    if rel > tol:
        worst = int(torch.argmax((out.to(torch.float64) - ref).abs()))
        i, j = divmod(worst, out.shape[1])
        return GpuCheck(
            False,
            rel,
            tol,
            f"relative error {rel:.3g} over the {workload.dtype} tolerance {tol:.3g}; worst at "
            f"C[{i}, {j}] = {out[i, j].item()!r}, expected {ref[i, j].item()!r}",
        )
    return GpuCheck(True, rel, tol, "")
