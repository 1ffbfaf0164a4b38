"""Probe: does filling the GPU's last wave (split-K of any count, composite tiles) bring
triton.gemm to cuBLAS on small-output GEMMs: ResNet-50's 3x3s at 7x7 and 14x14 as GEMMs, and
GPT-2's and ViT-B's hidden-768 layers? Each config checked against cuBLAS's output and timed
beside it (``triton.testing.do_bench``, median):

    python benchmarks/probes/gemm_fill.py --out $OUT/gemm_fill.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from typing import Any

import torch
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tunehub.kernels import triton_gemm_kernels as tg

SHAPES = {  # M, N, K: activations x nn.Linear weights (B column-major)
    "conv3x3-7": (1568, 512, 4608),
    "conv3x3-14": (6272, 256, 2304),
    "gpt2-b8-down": (4096, 768, 3072),
    "gpt2-b8-qkv": (4096, 2304, 768),
    "vit-b64-down": (12608, 768, 3072),
}


def configs(m: int, n: int, k: int) -> list[dict[str, Any]]:
    out = []
    if m * n <= 4096 * 768:  # few output tiles: split K into any count
        for (bm, bn), split in itertools.product(((128, 128), (128, 64), (64, 128)), range(2, 9)):
            out.append({"variant": "splitk_atomic", "BLOCK_M": bm, "BLOCK_N": bn,
                        "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8 if bm == bn else 4,
                        "num_stages": 4, "SPLIT_K": split})  # fmt: skip
    if n % 192 == 0 or n % 128 == 0:  # composite tiles filling the last wave
        tiles = ((128, 192, 8, 3), (192, 128, 8, 3), (128, 144, 8, 3), (128, 128, 8, 4),
                 (128, 256, 8, 3), (64, 192, 4, 4))  # fmt: skip
        for bm, bn, warps, stages in tiles:
            out.append({"variant": "tma", "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 64,
                        "GROUP_M": 8, "num_warps": warps, "num_stages": stages, "SPLIT_K": 1,
                        "FLATTEN": True})  # fmt: skip
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    args = parser.parse_args()
    report: dict[str, Any] = {"device": torch.cuda.get_device_name(0), "shapes": {}}
    torch.manual_seed(0)
    for name, (m, n, k) in SHAPES.items():
        x = torch.randn(m, k, device="cuda", dtype=torch.float16)
        w = torch.randn(n, k, device="cuda", dtype=torch.float16) / k**0.5
        ref = torch.nn.functional.linear(x, w).float()
        row: dict[str, Any] = {"mnk": [m, n, k], "configs": {}}
        row["cublas_us"] = do_bench(lambda x=x, w=w: torch.nn.functional.linear(x, w)) * 1e3
        out = torch.empty(m, n, device="cuda", dtype=torch.float16)
        for cfg in configs(m, n, k):
            tag = (f"{cfg['variant']}-{cfg['BLOCK_M']}x{cfg['BLOCK_N']}-k{cfg['SPLIT_K']}"
                   f"{'-flat' if cfg.get('FLATTEN') else ''}")  # fmt: skip
            try:
                call = tg.bind(x, w.t(), None, out, config=cfg)
                out.fill_(float("nan"))
                call()
                torch.cuda.synchronize()
                err = float((out.float() - ref).norm() / ref.norm())
                us = do_bench(call) * 1e3 if err < 2e-3 else None
                row["configs"][tag] = {"us": us, "rel_err": err}
            except Exception as exc:  # refused, out of resources
                row["configs"][tag] = {"error": str(exc)[-160:]}
        timed = {t: v["us"] for t, v in row["configs"].items() if v.get("us")}
        best = sorted(timed, key=timed.get)[:3]
        row["best"] = best
        row["cublas_over_best"] = row["cublas_us"] / timed[best[0]]
        report["shapes"][name] = row
        print(
            f"{name:12s} cuBLAS {row['cublas_us']:7.1f}us  best "
            + ", ".join(f"{t} {row['cublas_us'] / timed[t]:.3f}x" for t in best),
            flush=True,
        )
        if args.out:
            Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
