"""Probe: Triton 3.6's warp-specialised attention loop with the causal mask as data.

The warp-specialised loop computed wrong outputs whenever its mask compared key and query
indices (attention_ws_causal-h200-20261127T0720.json), and right ones with a mask on the key
index alone. Here the causal mask is a loaded tile: a [2 x BLOCK, BLOCK] fp32 tensor (zeros,
then the diagonal's 0 / -inf triangle) read through a TMA descriptor like K and V, the
diagonal block picking the second half; no index of the query rows enters the loop. Each
variant is checked against SDPA in float32 and timed beside the pointer-load kernel and cuDNN:

    python benchmarks/probes/attention_ws_bias.py --out $OUT/ws_bias.json
"""

# ruff: noqa: B023
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
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tunehub.kernels import triton_attention_kernels as ak


@triton.jit
def _ws_bias(Q, K, V, Out, Bias, scale_log2, n_ctx, HEAD_DIM: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WS: tl.constexpr):  # fmt: skip
    # Bias: (BLOCK_M / BLOCK_N + 1) tiles of BLOCK_M x BLOCK_N, fp16: zeros for the blocks
    # below the diagonal, then the diagonal's BLOCK_M / BLOCK_N blocks' 0 / -inf patterns.
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    base = bh * n_ctx * HEAD_DIM
    start_m = pid_m * BLOCK_M
    shape = [n_ctx, HEAD_DIM]
    q_desc = tl.make_tensor_descriptor(Q + base, shape, [HEAD_DIM, 1], [BLOCK_M, HEAD_DIM])
    k_desc = tl.make_tensor_descriptor(K + base, shape, [HEAD_DIM, 1], [BLOCK_N, HEAD_DIM])
    v_desc = tl.make_tensor_descriptor(V + base, shape, [HEAD_DIM, 1], [BLOCK_N, HEAD_DIM])
    b_desc = tl.make_tensor_descriptor(
        Bias, [(BLOCK_M // BLOCK_N + 1) * BLOCK_M, BLOCK_N], [BLOCK_N, 1], [BLOCK_M, BLOCK_N]
    )
    q = q_desc.load([start_m, 0])
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for start_n in tl.range(0, start_m + BLOCK_M, BLOCK_N, warp_specialize=WS):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        k = k_desc.load([start_n, 0])
        v = v_desc.load([start_n, 0])
        tile = tl.maximum(start_n - start_m + BLOCK_N, 0) // BLOCK_N
        bias = b_desc.load([tile * BLOCK_M, 0])
        s = tl.dot(q, tl.trans(k)) * scale_log2 + bias.to(tl.float32)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    out = (acc * (1.0 / l_i)[:, None]).to(Out.dtype.element_ty)
    o_desc = tl.make_tensor_descriptor(Out + base, shape, [HEAD_DIM, 1], [BLOCK_M, HEAD_DIM])
    o_desc.store([start_m, 0], out)


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
    for b, h, n in ((8, 32, 512), (2, 32, 2048), (1, 32, 8192)):
        d = 128
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16) for _ in range(3))
        ref = torch.nn.functional.scaled_dot_product_attention(
            q.float(), k.float(), v.float(), is_causal=True
        )
        row: dict[str, Any] = {}
        for bm, bn in ((128, 64), (64, 64), (128, 128)):
            rows = torch.arange(bm, device="cuda")[:, None]
            tiles = [torch.zeros(bm, bn, device="cuda")]
            for j in range(0, bm, bn):
                cols = j + torch.arange(bn, device="cuda")[None, :]
                tiles.append(torch.where(cols <= rows, 0.0, float("-inf")))
            bias = torch.cat(tiles).to(torch.float16).contiguous()
            for ws, warps, stages in ((True, 4, 2), (False, 8, 3), (False, 4, 3)):
                out = torch.full_like(q, float("nan"))
                grid = (triton.cdiv(n, bm), b * h)

                def call() -> None:
                    _ws_bias[grid](q, k, v, out, bias, ak.LOG2E / math.sqrt(d), n,
                                   HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, WS=ws,
                                   num_warps=warps, num_stages=stages)  # fmt: skip

                name = f"{'ws' if ws else 'tma'}-{bm}x{bn}-w{warps}-s{stages}"
                try:
                    call()
                    torch.cuda.synchronize()
                except Exception as exc:  # out of resources, a compiler failure
                    row[name] = {"error": f"{type(exc).__name__}: {exc}"[-300:]}
                    print(b, h, n, name, "error", str(exc)[-200:], flush=True)
                    continue
                rel = float((out.float() - ref).norm() / ref.norm())
                ms = do_bench(call) if rel < 3e-3 else None
                row[name] = {"relative_error": rel, "ms": ms}
        plain = torch.empty_like(q)
        cfg = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3}
        row["ptr-64x64-w4-s3"] = {"ms": do_bench(ak.bind(q, k, v, plain, causal=True, config=cfg))}
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
            row["cudnn"] = {"ms": do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=True))}  # fmt: skip
        report["shapes"][f"b{b}h{h}-{n}"] = row
        cudnn = row["cudnn"]["ms"]
        for name, r in row.items():
            ratio = f"{cudnn / r['ms']:.3f}x" if r.get("ms") else "-"
            print(f"b{b}h{h}-{n} {name:18s} {ratio} rel {r.get('relative_error', 0):.2g} "
                  f"{r.get('error', '')[:80]}", flush=True)  # fmt: skip
        if args.out:
            Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
