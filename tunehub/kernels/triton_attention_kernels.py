"""``triton.attention``'s kernel, its launch, and attention's operands and reference check.

The kernel is a flash-attention forward of our own: one program per BLOCK_M query rows of one
(batch, head); it walks the keys BLOCK_N at a time, keeping the running row maximum and sum
of the softmax (online softmax, in float32, through exp2 with the scale folded in) and the
float32 output accumulator, and divides once at the end. Causal masking is top-left aligned
(query i sees keys j <= i, as ``scaled_dot_product_attention(is_causal=True)``), and the walk
stops at the last key block a row of the tile can see; keys past ``kv_len`` are masked only
when ``kv_len`` is not a multiple of BLOCK_N. ``num_stages`` pipelines the key loop's loads.

Operands are fresh normal Q, K, V (batch x heads x len x head_dim, contiguous) and a
NaN-poisoned O; the reference is float32 ``softmax(Q K^T / sqrt(d)) V`` on the same device,
a few heads at a time; the check is every element finite and the relative Frobenius error
within the dtype's tolerance. Imports torch and Triton: GPU run sandboxes and tests only.
"""

# Triton kernels take no Python annotations (Triton reads them as its own type hints), so the
# @triton.jit function below is untyped by necessity; everything else is checked strictly.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from tunehub.core import Workload

TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
# Relative Frobenius error allowed against the float32 reference: P is rounded to the
# operands' type before P @ V (about 2^-11 for float16, 2^-8 for bfloat16 per element).
TOLERANCE = {"float16": 3e-3, "bfloat16": 2e-2}
LOG2E = 1.4426950408889634
# The reference's score matrices are held at most this many bytes at a time.
REFERENCE_CHUNK_BYTES = 1 << 30


@triton.jit
def _attention_fwd(
    Q,
    K,
    V,
    Out,
    scale_log2,
    stride_qb,
    stride_qh,
    stride_qm,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_ob,
    stride_oh,
    stride_om,
    q_len,
    kv_len,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    EVEN_N: tl.constexpr,
):
    start_m = tl.program_id(0)
    head = tl.program_id(1).to(tl.int64)
    batch = tl.program_id(2).to(tl.int64)
    q_base = Q + batch * stride_qb + head * stride_qh
    k_base = K + batch * stride_kb + head * stride_kh
    v_base = V + batch * stride_vb + head * stride_vh
    o_base = Out + batch * stride_ob + head * stride_oh
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    dims = tl.arange(0, HEAD_DIM)
    row_ok = rows[:, None] < q_len
    q = tl.load(q_base + rows[:, None] * stride_qm + dims[None, :], mask=row_ok, other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    hi = kv_len
    if CAUSAL:
        hi = tl.minimum(kv_len, (start_m + 1) * BLOCK_M)
    for start_n in range(0, hi, BLOCK_N):
        keys = start_n + cols
        if EVEN_N:
            k = tl.load(k_base + keys[None, :] * stride_kn + dims[:, None])
            v = tl.load(v_base + keys[:, None] * stride_vn + dims[None, :])
        else:
            k = tl.load(
                k_base + keys[None, :] * stride_kn + dims[:, None],
                mask=keys[None, :] < kv_len,
                other=0.0,
            )
            v = tl.load(
                v_base + keys[:, None] * stride_vn + dims[None, :],
                mask=keys[:, None] < kv_len,
                other=0.0,
            )
        s = tl.dot(q, k) * scale_log2
        if not EVEN_N:
            s = tl.where(keys[None, :] < kv_len, s, float("-inf"))
        if CAUSAL:
            s = tl.where(keys[None, :] <= rows[:, None], s, float("-inf"))
        # Every row sees key 0 in the first block, so m_new is finite from there on.
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    acc = acc / l_i[:, None]
    tl.store(
        o_base + rows[:, None] * stride_om + dims[None, :],
        acc.to(Out.dtype.element_ty),
        mask=row_ok,
    )


def bind(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    *,
    causal: bool,
    config: dict[str, Any],
) -> Callable[[], None]:
    """A callable writing ``out = attention(q, k, v)`` with ``config`` (BLOCK_M, BLOCK_N,
    num_warps, num_stages). Tensors are batch x heads x len x head_dim, last dim contiguous."""
    batch, heads, q_len, head_dim = q.shape
    kv_len = k.shape[2]
    if head_dim not in (16, 32, 64, 128, 256) or k.shape[3] != head_dim:
        raise ValueError(f"head_dim {head_dim} is not a power of two in [16, 256]")
    for name, t in (("q", q), ("k", k), ("v", v), ("out", out)):
        if t.stride(3) != 1:
            raise ValueError(f"{name}'s last dimension is not contiguous")
    block_m, block_n = int(config["BLOCK_M"]), int(config["BLOCK_N"])
    grid = (triton.cdiv(q_len, block_m), heads, batch)
    scale_log2 = LOG2E / math.sqrt(head_dim)
    kernel = _attention_fwd[grid]

    def call() -> None:
        kernel(
            q,
            k,
            v,
            out,
            scale_log2,
            *q.stride()[:3],
            *k.stride()[:3],
            *v.stride()[:3],
            *out.stride()[:3],
            q_len,
            kv_len,
            HEAD_DIM=head_dim,
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            CAUSAL=bool(causal),
            EVEN_N=kv_len % block_n == 0,
            num_warps=int(config["num_warps"]),
            num_stages=int(config["num_stages"]),
        )

    return call


# --- operands, reference, check ----------------------------------------------------------------
@dataclass
class AttentionOperands:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    out: torch.Tensor
    causal: bool
    seed: int


def _count(workload: Workload, name: str) -> int:
    value = workload.param(name)
    if not isinstance(value, int):
        raise TypeError(f"{name} of {workload.label} is not an integer")
    return value


def operands(workload: Workload, device: torch.device, seed: int) -> AttentionOperands:
    """Fresh standard-normal Q, K, V and a NaN-poisoned O for ``workload`` on ``device``."""
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    dtype = TORCH_DTYPES[workload.dtype]
    batch, heads = (_count(workload, "batch"), _count(workload, "heads"))
    q_shape = (batch, heads, workload.m, workload.k)
    kv_shape = (batch, heads, workload.n, workload.k)

    def draw(shape: tuple[int, ...]) -> torch.Tensor:
        return torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(dtype)

    q, k, v = draw(q_shape), draw(kv_shape), draw(kv_shape)
    out = torch.full(q_shape, math.nan, dtype=dtype, device=device)
    return AttentionOperands(q, k, v, out, bool(workload.param("causal")), seed)


def reference(ops: AttentionOperands) -> torch.Tensor:
    """float32 ``softmax(Q K^T / sqrt(d)) V`` (causal: key j > query i masked), a few
    (batch, head) pairs at a time so the score matrices stay within REFERENCE_CHUNK_BYTES."""
    batch, heads, q_len, d = ops.q.shape
    kv_len = ops.k.shape[2]
    q = ops.q.reshape(batch * heads, q_len, d)
    k = ops.k.reshape(batch * heads, kv_len, d)
    v = ops.v.reshape(batch * heads, kv_len, d)
    out = torch.empty((batch * heads, q_len, d), dtype=torch.float32, device=q.device)
    step = max(1, REFERENCE_CHUNK_BYTES // max(1, q_len * kv_len * 4))
    mask = None
    if ops.causal:
        mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=q.device).tril()
    for lo in range(0, batch * heads, step):
        hi = min(lo + step, batch * heads)
        s = q[lo:hi].float() @ k[lo:hi].float().transpose(1, 2) / math.sqrt(d)
        if mask is not None:
            s.masked_fill_(~mask, float("-inf"))
        out[lo:hi] = torch.softmax(s, dim=-1) @ v[lo:hi].float()
    return out.reshape(batch, heads, q_len, d)


@dataclass(frozen=True)
class AttentionCheck:
    ok: bool
    relative_error: float
    tolerance: float
    message: str


def check(out: torch.Tensor, ref: torch.Tensor, dtype: str) -> AttentionCheck:
    """Every element of O finite, and ``||O - ref|| / ||ref||`` within the dtype's tolerance."""
    tol = TOLERANCE[dtype]
    finite = torch.isfinite(out)
    bad = int((~finite).sum())
    if bad:
        where = torch.nonzero(~finite)[0].tolist()
        return AttentionCheck(
            False,
            math.inf,
            tol,
            f"{bad} of {out.numel()} elements are not finite (first at O{where}): unwritten or "
            "overflowed",
        )
    diff = (out.float() - ref).flatten()
    scale = float(torch.linalg.vector_norm(ref))
    rel = float(torch.linalg.vector_norm(diff)) / scale if scale > 0 else 0.0
    if rel > tol:
        worst = int(torch.argmax(diff.abs()))
        where = list(torch.unravel_index(torch.tensor(worst), out.shape))
        index = tuple(int(i) for i in where)
        return AttentionCheck(
            False,
            rel,
            tol,
            f"relative error {rel:.3g} over the {dtype} tolerance {tol:.3g}; worst at "
            f"O{list(index)} = {out[index].item()!r}, expected {ref[index].item()!r}",
        )
    return AttentionCheck(True, rel, tol, "")
