"""tunehub's flash-attention kernel as a ``torch.library.triton_op``: ``tunehub::triton_attention``.

``triton_attention(q, k, v, causal, config)`` computes
``F.scaled_dot_product_attention(q, k, v, is_causal=causal)`` for batch x heads x len x
head_dim tensors (one head count for Q, K and V, the last dimension contiguous; causal masks
key j > query i, top-left aligned as SDPA does) with a ``triton.attention`` config (JSON) that
loads through pointers: configs with ``TMA`` build their descriptors in the kernel from scratch
memory Triton's allocator gives each launch, which a traced graph cannot provide, and stay
out. Its body launches the kernel through ``torch.library.wrap_triton``, so Inductor traces it
and its generated code calls the kernel like one of its own. Called outside a compile it runs
the kernel (on CPU tensors under ``TRITON_INTERPRET=1``).

The ``tunehub`` torch.compile backend puts it in a graph where tunehub measured it faster than
the best SDPA backend and no gradient flows through the attention. Importing this module
imports torch and triton and registers the op.
"""

from __future__ import annotations

import importlib
import json
from typing import Any

import torch
from torch.library import triton_op, wrap_triton

from tunehub.core import Workload
from tunehub.kernels.triton_gemm_limits import dtype_name

OP = "tunehub::triton_attention"


def attention_workload(q_shape: Any, kv_len: int, causal: bool, dtype: torch.dtype) -> Workload:
    """The ``attention`` Workload of a call (raises ``InvalidSpec`` for one no Workload
    describes, ``ValueError`` for a dtype no template takes)."""
    batch, heads, q_len, head_dim = (int(v) for v in q_shape)
    return Workload.from_dict(
        {
            "op": "attention", "dtype": dtype_name(dtype), "batch": batch, "heads": heads,
            "m": q_len, "n": int(kv_len), "k": head_dim, "causal": bool(causal),
        }
    )  # fmt: skip


def runs(config: dict[str, Any]) -> bool:
    """Whether the op runs this ``triton.attention`` config (pointer loads, no TMA)."""
    return not config.get("TMA", False) and not config.get("WARP_SPECIALIZE", False)


@triton_op(OP, mutates_args=())
def triton_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, config: str
) -> torch.Tensor:
    """``F.scaled_dot_product_attention(q, k, v, is_causal=causal)`` with
    ``triton.attention``'s kernel of ``config`` (JSON)."""
    # Looked up per call (and per trace): the tests reload the kernels under the interpreter.
    kernels = importlib.import_module("tunehub.kernels.triton_attention_kernels")
    cfg = json.loads(config)
    problem = kernels.config_problem(cfg)
    if problem or not runs(cfg):
        raise ValueError(f"{OP} cannot run {cfg}: {problem or 'TMA configs stay out'}")
    q, k, v = (t if t.stride(3) == 1 else t.contiguous() for t in (q, k, v))
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    batch, heads, q_len, head_dim = q.shape
    grid, args, kwargs = kernels.launch_args(
        q, k, v, out, (batch, heads, q_len, k.shape[2], head_dim),
        (q.stride(), k.stride(), v.stride(), out.stride()), causal, cfg,
    )  # fmt: skip
    wrap_triton(kernels._attention_fwd)[grid](*args, **kwargs)
    return out
