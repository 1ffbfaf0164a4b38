"""Probe: why Triton 3.6's warp-specialised attention loop is wrong when causal on Hopper.

triton.attention's WARP_SPECIALIZE kernels were right in full attention at 2 stages and wrong
when causal (attention_gpu-persistent-h200-20261127T0706.json). This runs the causal loop in
variants that change one thing each, on one shape, and prints each 128-row tile's largest
error against the float32 reference (which tiles go wrong says what the pass mishandles) and
each variant's time beside the pointer-load kernel's and cuDNN's:

    python benchmarks/probes/attention_ws_causal.py --out $OUT/ws_causal.json

V0 the kernel as it is; V1 the query rows recomputed inside the loop; V2 the walk to kv_len
(trip count the same for every program; blocks above the diagonal all masked); V3 V2 with a
finite mask (-1e6 added, not -inf selected); V4 V1 with the finite mask.
"""

# ruff: noqa: B023, SIM108
# (a probe: each closure is called inside its loop iteration; Triton kernels keep if-blocks)

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tunehub.kernels import triton_attention_kernels as ak


@triton.jit
def _ws_causal(
    Q,
    K,
    V,
    Out,
    scale_log2,
    q_len,
    kv_len,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    VARIANT: tl.constexpr,
):
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    base = bh * q_len * HEAD_DIM
    kbase = bh * kv_len * HEAD_DIM
    start_m = pid_m * BLOCK_M
    q_desc = tl.make_tensor_descriptor(
        Q + base, shape=[q_len, HEAD_DIM], strides=[HEAD_DIM, 1], block_shape=[BLOCK_M, HEAD_DIM]
    )
    k_desc = tl.make_tensor_descriptor(
        K + kbase, shape=[kv_len, HEAD_DIM], strides=[HEAD_DIM, 1], block_shape=[BLOCK_N, HEAD_DIM]
    )
    v_desc = tl.make_tensor_descriptor(
        V + kbase, shape=[kv_len, HEAD_DIM], strides=[HEAD_DIM, 1], block_shape=[BLOCK_N, HEAD_DIM]
    )
    q = q_desc.load([start_m, 0])
    rows = start_m + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    if VARIANT == 2 or VARIANT == 3:
        hi = kv_len
    else:
        hi = tl.minimum(kv_len, start_m + BLOCK_M)
    for start_n in tl.range(0, hi, BLOCK_N, warp_specialize=True):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        k = k_desc.load([start_n, 0])
        v = v_desc.load([start_n, 0])
        if VARIANT == 1 or VARIANT == 4:
            r = start_m + tl.arange(0, BLOCK_M)
        else:
            r = rows
        ok = (start_n + cols)[None, :] <= r[:, None]
        s = tl.dot(q, tl.trans(k))
        if VARIANT >= 3:
            s = s * scale_log2 + tl.where(ok, 0.0, -1.0e6)
        else:
            s = tl.where(ok, s * scale_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    out = (acc * (1.0 / l_i)[:, None]).to(Out.dtype.element_ty)
    o_desc = tl.make_tensor_descriptor(
        Out + base, shape=[q_len, HEAD_DIM], strides=[HEAD_DIM, 1], block_shape=[BLOCK_M, HEAD_DIM]
    )
    o_desc.store([start_m, 0], out)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    args = parser.parse_args()
    from triton.testing import do_bench

    torch.manual_seed(0)
    b, h, n, d = 2, 32, 2048, 128
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16) for _ in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), is_causal=True
    )
    triton.set_allocator(
        lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda")
    )
    report: dict = {"shape": [b, h, n, d], "variants": {}}
    scale = ak.LOG2E / math.sqrt(d)
    for bm, bn in ((128, 128), (128, 64)):
        for variant in range(5):
            out = torch.full_like(q, float("nan"))
            grid = (triton.cdiv(n, bm), b * h)

            def call() -> None:
                _ws_causal[grid](
                    q,
                    k,
                    v,
                    out,
                    scale,
                    n,
                    n,
                    HEAD_DIM=d,
                    BLOCK_M=bm,
                    BLOCK_N=bn,
                    VARIANT=variant,
                    num_warps=4,
                    num_stages=2,
                )

            name = f"V{variant}-{bm}x{bn}"
            try:
                call()
                torch.cuda.synchronize()
            except Exception as exc:
                report["variants"][name] = {"error": f"{type(exc).__name__}: {exc}"[-400:]}
                print(name, "error", exc, flush=True)
                continue
            err = (out.float() - ref).abs()
            tiles = err[0, 0].reshape(n // bm, bm, d).amax(dim=(1, 2)).tolist()
            rel = float((out.float() - ref).norm() / ref.norm())
            ms = do_bench(call) if rel < 3e-3 else None
            report["variants"][name] = {
                "relative_error": rel,
                "tile_max_err_head0": tiles,
                "ms": ms,
            }
            print(
                name,
                f"rel {rel:.3g}",
                "ms",
                ms,
                "bad tiles",
                [i for i, e in enumerate(tiles) if not e < 0.05],
                flush=True,
            )
    plain = torch.empty_like(q)
    cfg = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3}
    call = ak.bind(q, k, v, plain, causal=True, config=cfg)
    report["ptr-64x64-w4-s3_ms"] = do_bench(call)
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
        report["cudnn_ms"] = do_bench(
            lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        )
    print("ptr-64x64-w4-s3", report["ptr-64x64-w4-s3_ms"], "cudnn", report["cudnn_ms"])
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
