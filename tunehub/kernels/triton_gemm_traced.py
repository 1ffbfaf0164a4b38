"""``triton.gemm``'s launches for code that is traced rather than run: every buffer a launch
needs is allocated by torch ops in the call (no cached workspaces, no data pointer read), so a
``torch.library.triton_op`` body that launches them through ``wrap_triton`` traces into a graph
Inductor compiles, and Inductor's generated code calls the kernels directly.

Import only where torch and triton are installed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton

from tunehub.kernels.triton_gemm_kernels import (
    Launch,
    _checked_config,
    _launches,
    _pad_launch,
    _padded_buffer,
    _Problem,
)
from tunehub.kernels.triton_gemm_limits import (
    ONE_KERNEL_SPLIT_VARIANTS,
    _canonical,
    dtype_name,
    padded_k,
    splitk_workspace_elems,
    workload_problem,
)


def traced_launches(
    a: torch.Tensor,
    b: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    *,
    epilogue: str,
    allow_tf32: bool,
    config: Mapping[str, Any],
    num_sms: int,
) -> list[Launch]:
    """The launches of ``out = epilogue(a @ b + bias)`` (as ``bind`` checks and packs them),
    with the one-kernel split-Ks' sum and tile counters zeroed and ``PAD_K``'s padded copies
    allocated in the call. ``bind`` keeps those buffers across calls; a traced graph cannot
    hold state between its calls, so it pays one small memset per call instead."""
    name = dtype_name(a.dtype)
    cfg = _checked_config(config, name)
    m, k = a.shape
    n = b.shape[1]
    a_layout, sam, sak = _canonical(m, k, (a.stride(0), a.stride(1)), "a")
    b_layout, sbk, sbn = _canonical(k, n, (b.stride(0), b.stride(1)), "b")
    pad: list[Launch] = []
    kp = padded_k(k, name)
    if cfg.get("PAD_K") and kp != k:
        a_pad = _padded_buffer(m, kp, a_layout, a)
        b_pad = _padded_buffer(kp, n, b_layout, b)
        specs = ((a_layout, sam, sak), (b_layout, sbk, sbn))
        pad.append(_pad_launch(m, n, k, kp, *specs, (a, a_pad, b, b_pad)))
        a, b, k = a_pad, b_pad, kp
        a_layout, sam, sak = _canonical(m, k, (a.stride(0), a.stride(1)), "a")
        b_layout, sbk, sbn = _canonical(k, n, (b.stride(0), b.stride(1)), "b")
    problem_text = workload_problem(cfg["variant"], m, n, k, name, a_layout, b_layout)
    if problem_text:
        raise ValueError(f"config {cfg['variant']}: {problem_text}")
    workspace = counts = None
    if cfg["variant"] in ONE_KERNEL_SPLIT_VARIANTS:
        tiles = triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"])
        workspace = torch.zeros(
            splitk_workspace_elems(m, n, cfg), dtype=torch.float32, device=out.device
        )
        counts = torch.zeros(tiles, dtype=torch.int32, device=out.device)
    elif cfg["SPLIT_K"] > 1:
        workspace = torch.empty((cfg["SPLIT_K"], m, n), dtype=torch.float32, device=out.device)
    problem = _Problem(
        m, n, k, name, epilogue, allow_tf32, (sam, sak), (sbk, sbn), a_layout, b_layout
    )
    return pad + _launches(problem, cfg, (a, b, out, bias, workspace, counts), num_sms)


def traceable(arg: Any) -> Any:
    """A host TMA descriptor as Inductor can trace it: Inductor keeps a descriptor's base
    tensor and block shape and remakes it with ``TensorDescriptor.from_tensor``, which reads
    shape and strides off the base, so the base becomes a view that has exactly the
    descriptor's shape and strides (a column-major operand's transpose, say)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    if not isinstance(arg, TensorDescriptor):
        return arg
    view = arg.base.as_strided(list(arg.shape), list(arg.strides))
    return TensorDescriptor.from_tensor(view, list(arg.block_shape))
