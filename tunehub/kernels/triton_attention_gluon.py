"""``triton.attention``'s Hopper kernel written in Gluon (its ``GLUON`` knob).

Triton 3.6 compiles the plain kernel's key loop so that a warpgroup waits for every MMA in
flight before its softmax (``warp_group_dot_wait {pendings = 0}`` with the P @ V product among
its deps), leaving its tensor cores idle during the exponentials. Gluon, Triton's lower-level
language, issues ``warpgroup_mma`` and its wait explicitly, so this kernel orders each key
block j as FlashAttention-3's intra-warpgroup pipeline does (the scheme from its paper; the
code is ours):

    issue S_j = Q K_j^T; issue O += P_{j-1} V_{j-1}; wait for S_j alone (one group left);
    the softmax of S_j while P_{j-1} V_{j-1} runs; wait for it; rescale O; refill the slots

K and V stream through a ring of ``num_stages`` TMA-loaded slots behind mbarriers; a slot is
refilled once the MMA reading it has finished. One program takes ``BLOCK_M`` query rows of one
(batch, head), 16 rows a warp (one warpgroup for 64 rows, two for 128); causal programs walk
the keys up to the diagonal, longest first, and mask only the blocks that cross it. O leaves
through the tile Q came in by, stored with TMA.

The descriptors span every (batch, head)'s rows as one 2-D tensor (so the tensors must be
contiguous): a partial last key block reads the next (batch, head)'s rows, or zeros past the
end, and masks them; a partial last query tile computes such rows too and stores O through
masked pointers instead of TMA. wgmma is sm_90's instruction: neither other GPUs nor
Triton's interpreter run this kernel.
Imports torch and Triton: GPU run sandboxes, builds and tests only.
"""

# Gluon kernels take no Python annotations (Gluon reads them as its own type hints), so the
# @gluon.jit functions below are untyped by necessity; everything else is checked strictly.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

LOG2E = 1.4426950408889634
GLUON_DTYPES = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16}


@gluon.jit
def _load(desc, bar, smem, row, pred):
    mbarrier.expect(bar, desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(desc, [row, 0], bar, smem, pred=pred)


@gluon.jit
def _visible(keys, rows, kv_len, CAUSAL: gl.constexpr, EVEN_N: gl.constexpr):
    # Which (row, key) pairs of a masked block count: at or before the row when causal, and
    # within kv_len where that is no multiple of BLOCK_N (the 2-D descriptor reads a partial
    # last block's other keys from the next (batch, head), or as zeros past the end).
    if CAUSAL:
        ok = gl.expand_dims(keys, 0) <= gl.expand_dims(rows, 1)
        if not EVEN_N:
            ok = ok & (gl.expand_dims(keys, 0) < kv_len)
    else:
        ok = gl.expand_dims(keys, 0) < kv_len
    return ok


@gluon.jit
def _gluon_attention_fwd(
    q_desc,
    k_desc,
    v_desc,
    o_desc,
    Out,
    scale_log2,
    q_len,
    kv_len,
    CAUSAL: gl.constexpr,
    EVEN_M: gl.constexpr,
    EVEN_N: gl.constexpr,
    STAGES: gl.constexpr,
    num_warps: gl.constexpr,
):
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    dtype: gl.constexpr = q_desc.dtype
    # wgmma's accumulator layouts (16 rows a warp) for the scores and for O, P as O's
    # register operand, and their rows.
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_N, 16]
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, HEAD_DIM, 16]
    )
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)

    pid_m = gl.program_id(0)
    if CAUSAL:
        # Query tiles further down walk more key blocks: launch those first.
        pid_m = gl.num_programs(0) - 1 - pid_m
    bh = gl.program_id(1)
    start_m = pid_m * BLOCK_M
    q_row = bh * q_len + start_m
    kv_row = bh * kv_len
    hi = kv_len
    if CAUSAL:
        hi = gl.minimum(kv_len, start_m + BLOCK_M)
    n_blocks = gl.cdiv(hi, BLOCK_N)

    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_bar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_bar.index(i), count=1)
        mbarrier.init(v_bar.index(i), count=1)
    fence_async_shared()

    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [q_row, 0], q_bar, q_smem)
    for i in gl.static_range(STAGES):
        _load(k_desc, k_bar.index(i), k_smem.index(i), kv_row + i * BLOCK_N, i < n_blocks)
        _load(v_desc, v_bar.index(i), v_smem.index(i), kv_row + i * BLOCK_N, i < n_blocks)

    zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=o_layout)
    rows = start_m + gl.arange(0, BLOCK_M, layout=row_s)
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))

    # Key block 0: its scores alone, then its K slot refilled. Every row sees key 0, so the
    # row maximum is finite from here on. Masked key blocks (here and in the loop): those
    # crossing the causal diagonal, and a last block running past kv_len.
    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_bar.index(0), 0)
    s_tok = warpgroup_mma(
        q_smem, k_smem.index(0).permute((1, 0)), zero_s, use_acc=False, is_async=True
    )
    s = warpgroup_mma_wait(0, deps=(s_tok,))
    if (CAUSAL and start_m < BLOCK_N - 1) or (not EVEN_N and kv_len < BLOCK_N):
        s = gl.where(_visible(cols, rows, kv_len, CAUSAL, EVEN_N), s * scale_log2, float("-inf"))
        m_i = gl.max(s, 1)
        p = gl.exp2(s - gl.expand_dims(m_i, 1))
    else:
        # The scale is positive: the raw row maximum first, then one multiply-add a score.
        m_i = gl.max(s, 1) * scale_log2
        p = gl.exp2(s * scale_log2 - gl.expand_dims(m_i, 1))
    l_i = gl.sum(p, 1)
    if num_warps > 4:
        gl.thread_barrier()  # both warpgroups are done with the slot
    _load(k_desc, k_bar.index(0), k_smem.index(0), kv_row + STAGES * BLOCK_N, n_blocks > STAGES)
    p_op = gl.convert_layout(p.to(dtype), p_layout)

    for j in range(1, n_blocks):
        slot = j % STAGES
        prev = (j - 1) % STAGES
        mbarrier.wait(k_bar.index(slot), (j // STAGES) & 1)
        s_tok = warpgroup_mma(
            q_smem, k_smem.index(slot).permute((1, 0)), zero_s, use_acc=False, is_async=True
        )
        mbarrier.wait(v_bar.index(prev), ((j - 1) // STAGES) & 1)
        acc_tok = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
        # wgmma groups finish in order: one left in flight means S_j is done and the
        # P_{j-1} V_{j-1} product issued after it may still run during the softmax.
        s = warpgroup_mma_wait(1, deps=(s_tok,))
        start_n = j * BLOCK_N
        if (CAUSAL and start_n + BLOCK_N > start_m + 1) or (
            not EVEN_N and start_n + BLOCK_N > kv_len
        ):
            ok = _visible(start_n + cols, rows, kv_len, CAUSAL, EVEN_N)
            s = gl.where(ok, s * scale_log2, float("-inf"))
            m_new = gl.maximum(m_i, gl.max(s, 1))
            p = gl.exp2(s - gl.expand_dims(m_new, 1))
        else:
            m_new = gl.maximum(m_i, gl.max(s, 1) * scale_log2)
            p = gl.exp2(s * scale_log2 - gl.expand_dims(m_new, 1))
        alpha = gl.exp2(m_i - m_new)
        l_i = l_i * alpha + gl.sum(p, 1)
        m_i = m_new
        acc, p_op = warpgroup_mma_wait(0, deps=(acc_tok, p_op))
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        if num_warps > 4:
            gl.thread_barrier()
        # S_j has read K's slot and P_{j-1} V_{j-1} V's: refill both.
        nk = j + STAGES
        _load(k_desc, k_bar.index(slot), k_smem.index(slot), kv_row + nk * BLOCK_N, nk < n_blocks)
        nv = j - 1 + STAGES
        _load(v_desc, v_bar.index(prev), v_smem.index(prev), kv_row + nv * BLOCK_N, nv < n_blocks)

    last = n_blocks - 1
    mbarrier.wait(v_bar.index(last % STAGES), (last // STAGES) & 1)
    acc_tok = warpgroup_mma(p_op, v_smem.index(last % STAGES), acc, is_async=True)
    acc, p_op = warpgroup_mma_wait(0, deps=(acc_tok, p_op))
    out = acc / gl.expand_dims(gl.convert_layout(l_i, row_o), 1)
    mbarrier.invalidate(q_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(k_bar.index(i))
        mbarrier.invalidate(v_bar.index(i))
    if EVEN_M:
        q_smem.store(out.to(dtype))  # Q's tile is done with: O leaves through it
        fence_async_shared()
        tma.async_copy_shared_to_global(o_desc, [q_row, 0], q_smem)
        tma.store_wait(pendings=0)
    else:
        # A partial last tile: rows past q_len belong to the next (batch, head), so O goes
        # out through masked stores.
        o_rows = start_m + gl.arange(0, BLOCK_M, layout=row_o)
        dims = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
        offsets = gl.expand_dims((bh * q_len + o_rows).to(gl.int64) * HEAD_DIM, 1)
        offsets = offsets + gl.expand_dims(dims, 0)
        gl.store(Out + offsets, out.to(dtype), mask=gl.expand_dims(o_rows < q_len, 1))


def problem(config: Mapping[str, Any], contiguous: bool = True) -> str | None:
    """Why the kernel cannot run ``config`` (on tensors that are ``contiguous`` or not), or
    None; it takes any lengths."""
    warps = int(config["num_warps"])
    if warps not in (4, 8) or int(config["BLOCK_M"]) != 16 * warps:
        return "GLUON takes 16 query rows a warp: BLOCK_M=64 with 4 warps or 128 with 8"
    if not contiguous:
        return "GLUON needs contiguous Q, K, V and O"
    return None


def descriptor(t: Any, rows: int, block: int, head_dim: int) -> TensorDescriptor:
    """A host TMA descriptor over ``t`` (contiguous) seen as ``rows`` x head_dim, read in
    ``block``-row boxes. ``t`` may be a stand-in with ``dtype`` and ``data_ptr`` (a build)."""
    layout = gl.NVMMASharedLayout.get_default_for([block, head_dim], GLUON_DTYPES[t.dtype])
    return TensorDescriptor(t, [rows, head_dim], [head_dim, 1], [block, head_dim], layout)


def launch_args(
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    shapes: tuple[int, int, int, int, int],
    causal: bool,
    config: Mapping[str, Any],
) -> tuple[tuple[int, int], tuple[Any, ...], dict[str, Any]]:
    """The grid, arguments and keywords of one launch (bind and precompile both take them
    from here, so a precompiled binary is the one the launch looks up)."""
    batch, heads, q_len, kv_len, head_dim = shapes
    block_m, block_n = int(config["BLOCK_M"]), int(config["BLOCK_N"])
    grid = (-(-q_len // block_m), batch * heads)
    args = (
        descriptor(q, batch * heads * q_len, block_m, head_dim),
        descriptor(k, batch * heads * kv_len, block_n, head_dim),
        descriptor(v, batch * heads * kv_len, block_n, head_dim),
        descriptor(out, batch * heads * q_len, block_m, head_dim),
        out,
        LOG2E / math.sqrt(head_dim),
        q_len,
        kv_len,
    )
    kwargs = {
        "CAUSAL": bool(causal),
        "EVEN_M": q_len % block_m == 0,
        "EVEN_N": kv_len % block_n == 0,
        "STAGES": int(config["num_stages"]),
        "num_warps": int(config["num_warps"]),
    }
    return grid, args, kwargs
