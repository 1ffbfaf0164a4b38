"""Probe: a Hopper flash-attention forward in Gluon that overlaps the softmax with the MMAs.

In ``triton.attention``'s kernel (Triton 3.6) a warpgroup waits for every MMA in flight before
its softmax (``warp_group_dot_wait {pendings = 0}`` with the P @ V product among its deps),
so its tensor cores idle during the exponentials. Gluon exposes ``warpgroup_mma`` and its wait
directly, so this kernel orders each key block j as FlashAttention-3's intra-warpgroup
pipeline does (the scheme from its paper; the code is ours):

    issue S_j = Q K_j^T;  issue O += P_{j-1} V_{j-1};  wait for S_j only (one group left);
    softmax of S_j (while P_{j-1} V_{j-1} runs);  wait for it;  rescale O;  refill the slots

with K and V in a ring of TMA-loaded stages behind mbarriers, one or two warpgroups a program
(64 query rows each), causal blocks walked up to the diagonal, the mask applied only on
blocks that cross it. Lengths must be multiples of the tiles (the probe's 2-D descriptors
span every (batch, head)). Each config is checked against float32 SDPA and timed beside
triton.attention's best plain candidates and cuDNN:

    python benchmarks/probes/attention_gluon.py --out $OUT/attention_gluon.json
"""

# ruff: noqa: B023, SIM300
# (a probe: each closure is called inside its loop iteration)

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import torch
import triton
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

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tunehub.kernels import triton_attention_kernels as ak


@gluon.jit
def _load_kv(desc, bar, smem, row, pred):
    mbarrier.expect(bar, desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(desc, [row, 0], bar, smem, pred=pred)


@gluon.jit
def _gluon_attention(q_desc, k_desc, v_desc, o_desc, scale_log2, q_len, kv_len,
                     CAUSAL: gl.constexpr, STAGES: gl.constexpr,
                     num_warps: gl.constexpr):  # fmt: skip
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    dtype: gl.constexpr = q_desc.dtype
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
        _load_kv(k_desc, k_bar.index(i), k_smem.index(i), kv_row + i * BLOCK_N, i < n_blocks)
        _load_kv(v_desc, v_bar.index(i), v_smem.index(i), kv_row + i * BLOCK_N, i < n_blocks)

    zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=row_s)
    l_i = gl.zeros([BLOCK_M], gl.float32, layout=row_s)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=o_layout)
    rows = gl.arange(0, BLOCK_M, layout=row_s)
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))

    # Block 0: its scores, then its slot of K refilled.
    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_bar.index(0), 0)
    s_tok = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), zero_s, use_acc=False,
                          is_async=True)  # fmt: skip
    s = warpgroup_mma_wait(0, deps=(s_tok,))
    # The online softmax in base 2 (inlined: Gluon verifies a called function's reductions
    # without the kernel's warp count). Block 0 crosses the diagonal only in the first tile.
    start_n = 0
    if CAUSAL and start_n + BLOCK_N > start_m + 1:
        ok = gl.expand_dims(start_n + cols, 0) <= gl.expand_dims(start_m + rows, 1)
        s = gl.where(ok, s * scale_log2, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1))
        p = gl.exp2(s - gl.expand_dims(m_new, 1))
    else:
        m_new = gl.maximum(m_i, gl.max(s, 1) * scale_log2)
        p = gl.exp2(s * scale_log2 - gl.expand_dims(m_new, 1))
    l_i = gl.sum(p, 1)
    m_i = m_new
    if num_warps > 4:
        gl.thread_barrier()  # both warpgroups are done reading the slot
    _load_kv(k_desc, k_bar.index(0), k_smem.index(0), kv_row + STAGES * BLOCK_N,
             STAGES < n_blocks)  # fmt: skip
    p_op = gl.convert_layout(p.to(dtype), p_layout)

    for j in range(1, n_blocks):
        slot = j % STAGES
        prev = (j - 1) % STAGES
        mbarrier.wait(k_bar.index(slot), (j // STAGES) & 1)
        s_tok = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), zero_s,
                              use_acc=False, is_async=True)  # fmt: skip
        mbarrier.wait(v_bar.index(prev), ((j - 1) // STAGES) & 1)
        acc_tok = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
        s = warpgroup_mma_wait(1, deps=(s_tok,))  # S_j is done; P_{j-1} V_{j-1} may run on
        start_n = j * BLOCK_N
        if CAUSAL and start_n + BLOCK_N > start_m + 1:
            ok = gl.expand_dims(start_n + cols, 0) <= gl.expand_dims(start_m + rows, 1)
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
        _load_kv(k_desc, k_bar.index(slot), k_smem.index(slot), kv_row + (j + STAGES) * BLOCK_N,
                 j + STAGES < n_blocks)  # fmt: skip
        _load_kv(v_desc, v_bar.index(prev), v_smem.index(prev),
                 kv_row + (j - 1 + STAGES) * BLOCK_N, j - 1 + STAGES < n_blocks)  # fmt: skip

    last = n_blocks - 1
    mbarrier.wait(v_bar.index(last % STAGES), (last // STAGES) & 1)
    acc_tok = warpgroup_mma(p_op, v_smem.index(last % STAGES), acc, is_async=True)
    acc, p_op = warpgroup_mma_wait(0, deps=(acc_tok, p_op))
    out = acc / gl.expand_dims(gl.convert_layout(l_i, row_o), 1)
    mbarrier.invalidate(q_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(k_bar.index(i))
        mbarrier.invalidate(v_bar.index(i))
    q_smem.store(out.to(dtype))  # Q's tile is done with: O goes out through it
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [q_row, 0], q_smem)
    tma.store_wait(pendings=0)


def gluon_attention(q, k, v, out, causal, block_m, block_n, stages, num_warps):
    b, h, n_q, d = q.shape
    n_kv = k.shape[2]
    gdt = gl.float16 if q.dtype == torch.float16 else gl.bfloat16

    def desc(t, rows, block):
        layout = gl.NVMMASharedLayout.get_default_for([block, d], gdt)
        flat = t.view(b * h * rows, d)
        return TensorDescriptor(flat, list(flat.shape), list(flat.stride()), [block, d], layout)

    qd, od = desc(q, n_q, block_m), desc(out, n_q, block_m)
    kd, vd = desc(k, n_kv, block_n), desc(v, n_kv, block_n)
    grid = (n_q // block_m, b * h)
    scale = ak.LOG2E / math.sqrt(d)

    def call() -> None:
        _gluon_attention[grid](qd, kd, vd, od, scale, n_q, n_kv, CAUSAL=causal, STAGES=stages,
                               num_warps=num_warps)  # fmt: skip

    return call


CONFIGS = (  # BLOCK_M, BLOCK_N, STAGES, num_warps
    (64, 64, 2, 4), (64, 64, 3, 4), (64, 128, 2, 4), (128, 64, 2, 8), (128, 128, 2, 8),
)  # fmt: skip
SHAPES = (  # batch, heads, tokens, head_dim, causal, dtype
    (8, 32, 512, 128, True, torch.float16),
    (4, 32, 1024, 128, True, torch.float16),
    (2, 32, 2048, 128, True, torch.float16),
    (1, 32, 4096, 128, True, torch.float16),
    (1, 32, 8192, 128, True, torch.float16),
    (4, 32, 2048, 128, True, torch.bfloat16),
    (16, 16, 1024, 64, True, torch.float16),
    (2, 16, 2048, 128, False, torch.float16),
    (4, 16, 4096, 64, False, torch.float16),
)
TRITON = {
    "ptr-64x64-w4-s3": {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3},
    "tma-128x128-w8-s3": {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 3,
                          "TMA": True},
    "ws-128x128-w4-s2": {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 4, "num_stages": 2,
                         "TMA": True, "WARP_SPECIALIZE": True},
}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    args = parser.parse_args()
    from triton.testing import do_bench

    triton.set_allocator(
        lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda")
    )
    report: dict[str, Any] = {"device": torch.cuda.get_device_name(0), "shapes": {}}
    torch.manual_seed(0)
    for b, h, n, d, causal, dtype in SHAPES:
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=dtype) for _ in range(3))
        ref = torch.nn.functional.scaled_dot_product_attention(
            q.float(), k.float(), v.float(), is_causal=causal
        )
        name = f"b{b}h{h}-{n}-d{d}-{'causal' if causal else 'full'}-{str(dtype)[6:]}"
        row: dict[str, Any] = {}
        tol = 3e-3 if dtype == torch.float16 else 2e-2
        contenders: dict[str, Any] = {}
        for bm, bn, stages, warps in CONFIGS:
            contenders[f"gluon-{bm}x{bn}-s{stages}-w{warps}"] = (
                lambda out, bm=bm, bn=bn, st=stages, w=warps: gluon_attention(
                    q, k, v, out, causal, bm, bn, st, w)
            )  # fmt: skip
        for tname, cfg in TRITON.items():
            if cfg.get("WARP_SPECIALIZE") and causal:
                continue
            contenders[tname] = lambda out, cfg=cfg: ak.bind(q, k, v, out, causal=causal,
                                                              config=cfg)  # fmt: skip
        for cname, make in contenders.items():
            out = torch.full_like(q, float("nan"))
            try:
                call = make(out)
                call()
                torch.cuda.synchronize()
            except Exception as exc:  # a compiler failure, out of resources
                row[cname] = {"error": f"{type(exc).__name__}: {exc}"[-600:]}
                print(name, cname, "error", str(exc)[-300:], flush=True)
                continue
            rel = float((out.float() - ref).norm() / ref.norm())
            finite = bool(torch.isfinite(out).all())
            ok = finite and rel < tol
            row[cname] = {"relative_error": rel, "finite": finite,
                          "ms": do_bench(call) if ok else None}  # fmt: skip
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
            row["cudnn"] = {"ms": do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=causal))}  # fmt: skip
        report["shapes"][name] = row
        cudnn = row["cudnn"]["ms"]
        for cname, r in row.items():
            ratio = f"{cudnn / r['ms']:.3f}x" if r.get("ms") else "-"
            print(f"{name:34s} {cname:22s} {ratio:8s} rel {r.get('relative_error', 0):.2g} "
                  f"{r.get('error', '')[:100]}", flush=True)  # fmt: skip
        if args.out:
            Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
