"""Probe: could ResNet-50's NHWC 3x3 at 7x7 and 14x14 (0.71x and 0.83x of cuDNN on the
implicit GEMM) run faster as an explicit im2col copy plus a GEMM? Per case, each piece timed
alone with ``triton.testing.do_bench`` (median) beside cuDNN (``F.conv2d`` on channels-last
tensors): the copy (a Triton gather of each output pixel's 3 x 3 x C patch into a row of an
(N·H·W) x 9C matrix), cuBLAS on that GEMM, and triton.gemm's kernels on it (a few tiles of
``tiled``, ``tma``, ``splitk``); the GEMM's output is checked against cuDNN's convolution.

    python benchmarks/probes/conv_im2col.py --out $OUT/conv_im2col.json
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
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tunehub.kernels import triton_gemm_kernels as tg


@triton.jit
def _im2col_nhwc(x, cols, M, H, W, C, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    # cols[p, (kh * 3 + kw) * C + c] = x[n, h + kh - 1, w + kw - 1, c] (zero outside).
    p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    tap = tl.program_id(1)
    c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    hw = H * W
    n = p // hw
    h = (p % hw) // W + tap // 3 - 1
    w = p % W + tap % 3 - 1
    ok = (p < M) & (h >= 0) & (h < H) & (w >= 0) & (w < W)
    src = x + ((n * H + h) * W + w).to(tl.int64)[:, None] * C + c[None, :]
    v = tl.load(src, mask=ok[:, None] & (c[None, :] < C), other=0.0)
    dst = cols + p.to(tl.int64)[:, None] * (9 * C) + tap * C + c[None, :]
    tl.store(dst, v, mask=(p[:, None] < M) & (c[None, :] < C))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    args = parser.parse_args()
    from triton.testing import do_bench

    report: dict[str, Any] = {"device": torch.cuda.get_device_name(0), "cases": {}}
    torch.manual_seed(0)
    for name, c, hw in (("3x3-7", 512, 7), ("3x3-14", 256, 14)):
        n = 32
        x = torch.randn(n, c, hw, hw, device="cuda", dtype=torch.float16)
        x = x.contiguous(memory_format=torch.channels_last)
        w = torch.randn(c, c, 3, 3, device="cuda", dtype=torch.float16) / (9 * c) ** 0.5
        w = w.contiguous(memory_format=torch.channels_last)
        ref = F.conv2d(x, w, padding=1)
        m, k = n * hw * hw, 9 * c
        cols = torch.empty(m, k, device="cuda", dtype=torch.float16)
        grid = (triton.cdiv(m, 64), 9, triton.cdiv(c, 64))

        def im2col() -> None:
            _im2col_nhwc[grid](x, cols, m, hw, hw, c, BLOCK_P=64, BLOCK_C=64, num_warps=4)

        im2col()
        wk = w.permute(0, 2, 3, 1).reshape(c, k)  # O x (kh, kw, C): a K x N B, column-major
        row: dict[str, Any] = {"mnk": [m, c, k]}
        row["cudnn_us"] = do_bench(lambda: F.conv2d(x, w, padding=1)) * 1e3
        row["im2col_us"] = do_bench(im2col) * 1e3
        out = torch.empty(m, c, device="cuda", dtype=torch.float16)
        row["cublas_us"] = do_bench(lambda: torch.matmul(cols, wk.t(), out=out)) * 1e3
        want = ref.permute(0, 2, 3, 1).reshape(m, c).float()
        row["cublas_rel_err"] = float((out.float() - want).norm() / want.norm())
        best = None
        for variant, bm, bn, bk, warps, stages, split in (
            ("tma", 128, 128, 64, 8, 4, 1),
            ("tma", 128, 64, 64, 4, 4, 1),
            ("tma", 64, 128, 64, 4, 4, 1),
            ("tiled", 128, 128, 64, 8, 4, 1),
            ("tiled", 64, 64, 64, 4, 4, 1),
            ("splitk", 128, 128, 64, 8, 4, 2),
            ("splitk", 128, 64, 64, 4, 4, 2),
            ("splitk", 64, 128, 64, 4, 4, 3),
            ("splitk_atomic", 128, 128, 64, 8, 4, 2),
            ("splitk_atomic", 128, 64, 64, 4, 4, 3),
        ):
            cfg = {
                "variant": variant,
                "BLOCK_M": bm,
                "BLOCK_N": bn,
                "BLOCK_K": bk,
                "GROUP_M": 8,
                "num_warps": warps,
                "num_stages": stages,
                "SPLIT_K": split,
            }
            tag = f"{variant}-{bm}x{bn}x{bk}-w{warps}-s{stages}-k{split}"
            try:
                call = tg.bind(cols, wk.t(), None, out, config=cfg)
                out.fill_(float("nan"))
                call()
                torch.cuda.synchronize()
                err = float((out.float() - want).norm() / want.norm())
                us = do_bench(call) * 1e3 if err < 2e-3 else None
            except Exception as exc:  # a config the kernels refuse, out of resources
                row[tag] = {"error": str(exc)[-200:]}
                continue
            row[tag] = {"us": us, "rel_err": err}
            if us and (best is None or us < row[best]["us"]):
                best = tag
        row["best_triton"] = best
        gemm = min(row["cublas_us"], row[best]["us"] if best else float("inf"))
        row["route_us"] = row["im2col_us"] + gemm
        row["cudnn_over_route"] = row["cudnn_us"] / row["route_us"]
        report["cases"][name] = row
        print(
            f"{name}: cuDNN {row['cudnn_us']:.1f}us  im2col {row['im2col_us']:.1f}us  cuBLAS "
            f"{row['cublas_us']:.1f}us  triton {row[best]['us'] if best else 0:.1f}us ({best})"
            f"  route {row['route_us']:.1f}us = {row['cudnn_over_route']:.3f}x",
            flush=True,
        )
        if args.out:
            Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
