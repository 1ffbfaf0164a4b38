"""Probe: the Gluon attention kernel with Q read once into registers (``Q_REGS``) against Q
read from shared memory by every Q K^T product, beside cuDNN, each output checked against
float32 SDPA. At 64 query rows a program the Q K^T wgmma reads as many bytes of Q as of K
from shared memory; from registers only K is read there.

    python benchmarks/probes/attention_gluon_qregs.py --out $OUT/qregs.json
"""

# ruff: noqa: B023
# (a probe: each closure is called inside its loop iteration)

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tunehub.kernels import triton_attention_gluon as gk

SHAPES = (  # batch, heads, tokens, head_dim, causal, dtype
    (8, 32, 512, 128, True, torch.float16),
    (4, 32, 1024, 128, True, torch.float16),
    (2, 32, 2048, 128, True, torch.float16),
    (1, 32, 4096, 128, True, torch.float16),
    (1, 32, 8192, 128, True, torch.float16),
    (2, 16, 2048, 128, False, torch.float16),
    (16, 16, 1024, 64, True, torch.float16),
)
CONFIGS = ((64, 64, 2), (64, 64, 3), (64, 128, 1), (64, 128, 2))  # BLOCK_M, BLOCK_N, stages


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    args = parser.parse_args()
    from triton.testing import do_bench

    torch.manual_seed(0)
    report: dict[str, Any] = {"device": torch.cuda.get_device_name(0), "shapes": {}}
    for b, h, n, d, causal, dtype in SHAPES:
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=dtype) for _ in range(3))
        ref = torch.nn.functional.scaled_dot_product_attention(
            q.float(), k.float(), v.float(), is_causal=causal
        )
        name = f"b{b}h{h}-{n}-d{d}-{'causal' if causal else 'full'}"
        row: dict[str, Any] = {}
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
            row["cudnn"] = {"ms": do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=causal))}  # fmt: skip
        for bm, bn, stages in CONFIGS:
            for q_regs in (False, True):
                cname = f"{bm}x{bn}-s{stages}{'-qregs' if q_regs else ''}"
                out = torch.full_like(q, float("nan"))
                cfg = {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": 4, "num_stages": stages}
                grid, a, kw = gk.launch_args(q, k, v, out, (b, h, n, n, d), causal, cfg)
                kernel = gk._gluon_attention_fwd[grid]

                def call() -> None:
                    kernel(*a, **kw, Q_REGS=q_regs)

                try:
                    call()
                    torch.cuda.synchronize()
                except Exception as exc:  # out of resources
                    row[cname] = {"error": f"{type(exc).__name__}: {exc}"[-400:]}
                    continue
                rel = float((out.float() - ref).norm() / ref.norm())
                ok = bool(torch.isfinite(out).all()) and rel < 3e-3
                row[cname] = {"relative_error": rel, "ms": do_bench(call) if ok else None}
        report["shapes"][name] = row
        base = row["cudnn"]["ms"]
        for cname, r in row.items():
            ratio = f"{base / r['ms']:.3f}x" if r.get("ms") else "-"
            print(f"{name:28s} {cname:18s} {ratio:8s} rel {r.get('relative_error', 0):.2g} "
                  f"{r.get('error', '')[:100]}", flush=True)  # fmt: skip
        if args.out:
            Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
