"""Probe: ``_conv2d_tma_kernel`` (the input a 4-D TMA descriptor, one box per filter tap)
against cuDNN and the implicit-GEMM kernel's tuned config, on ResNet-50's 3x3 convolutions
(batch 32, NHWC, float16), no search.

Each config is checked against the float64 reference into a NaN-poisoned output, then timed
by tunehub's policy (L2 flushed, CUDA-graph replay, median); cuDNN (``benchmark=True``) is
timed before and after each shape's configs and the ratio is against the better of the two.

    PYTHONPATH=. python3 benchmarks/probes/conv_tma.py --out "$OUT/conv_tma.json"
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import time
from typing import Any

import torch

from tunehub.core import Workload
from tunehub.kernels import triton_conv_kernels as K
from tunehub.kernels.gpu_timing import time_gpu

SHAPES = {  # name: (channels, size), 3x3, stride 1, padding 1, C -> C
    "resnet50-3x3-56": (64, 56),
    "resnet50-3x3-28": (128, 28),
    "resnet50-3x3-14": (256, 14),
    "resnet50-3x3-7": (512, 7),
}
# The tuned implicit-GEMM (pointer loads) configs of operators-conv2d-nhwc-h200-20261126T1708.
POINTER_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages")
POINTER = {
    name: dict(zip(POINTER_KEYS, values, strict=True))
    for name, values in (
        ("resnet50-3x3-56", (128, 64, 64, 1, 4, 3)),
        ("resnet50-3x3-28", (64, 128, 64, 8, 4, 3)),
        ("resnet50-3x3-14", (64, 128, 64, 8, 4, 3)),
        ("resnet50-3x3-7", (64, 128, 128, 1, 8, 3)),
    )
}


def workload(c: int, hw: int, batch: int) -> Workload:
    return Workload.from_dict(
        {"op": "conv2d", "dtype": "float16", "batch": batch, "in_channels": c,
         "out_channels": c, "height": hw, "width": hw, "kernel_h": 3, "kernel_w": 3,
         "pad_h": 1, "pad_w": 1, "data_layout": "nhwc"}
    )  # fmt: skip


def tiles(batch: int, hw: int, block_m: int) -> list[tuple[float, int, int, int]]:
    """(useful fraction, TILE_B, TILE_H, TILE_W) boxes of ``block_m`` pixels, best first."""
    out = []
    for tw in (4, 8, 16, 32, 64):
        for th in (1, 2, 4, 8, 16, 32, 64):
            if block_m % (tw * th) or tw > 2 * hw or th > 2 * hw:
                continue
            tb = block_m // (tw * th)
            if tb > batch:
                continue
            cover = math.ceil(batch / tb) * tb * math.ceil(hw / th) * th * math.ceil(hw / tw) * tw
            out.append((batch * hw * hw / cover, tb, th, tw))
    return sorted(out, key=lambda t: (-t[0], t[1], -t[3]))


def configs(c: int, hw: int, batch: int) -> list[dict[str, Any]]:
    out = []
    for bm in (64, 128, 256):
        for eff, _tb, th, tw in tiles(batch, hw, bm)[: 2 if bm == 128 else 1]:
            for bn, bk, (w, s) in itertools.product(
                (64, 128, 256), (32, 64) if c <= 64 else (64,), ((4, 4), (8, 3))
            ):
                if bn > max(64, c) or bk > c:
                    continue
                if bm * bn / (32 * w) > 256 or (bm + bn) * bk * 2 * s > 220_000:
                    continue
                out.append(
                    dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, num_warps=w,
                         num_stages=s, TMA=True, TILE_H=th, TILE_W=tw, useful=round(eff, 3))
                )  # fmt: skip
    return out


def timed(call: Any, device: torch.device) -> float:
    t = time_gpu(call, min_secs=0.05, max_repeats=300, device=device)
    secs = sorted(t.repeat_secs)
    return secs[len(secs) // 2]


def run_config(ops: K.ConvOperands, cfg: dict[str, Any], device: torch.device) -> dict[str, Any]:
    kernel_cfg = {k: v for k, v in cfg.items() if k != "useful"}
    row: dict[str, Any] = {"config": cfg}
    try:
        t0 = time.perf_counter()
        launch = K.bind(ops, kernel_cfg)
        ops.out.fill_(math.nan)
        launch()
        torch.cuda.synchronize(device)
        row["first_call_secs"] = round(time.perf_counter() - t0, 3)
        check = K.check(ops.out, K.reference(ops), "float16")
        row["ok"], row["relative_error"] = check.ok, check.relative_error
        if not check.ok:
            row["error"] = check.message
            return row
        row["us"] = timed(launch, device) * 1e6
    except Exception as exc:  # a config that fails to compile or launch costs its row
        row["ok"], row["error"] = False, f"{type(exc).__name__}: {exc}"[:400]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--secs-per-shape", type=float, default=120.0)
    args = parser.parse_args()
    device = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    report: dict[str, Any] = {
        "probe": "conv_tma",
        "device": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "batch": args.batch,
        "rows": [],
    }
    for name in args.shapes.split(","):
        c, hw = SHAPES[name]
        wl = workload(c, hw, args.batch)
        ops = K.operands(wl, device, 7)
        x, w = ops.x, ops.w

        def cudnn(x: torch.Tensor = x, w: torch.Tensor = w) -> Any:
            return torch.nn.functional.conv2d(x, w, None, 1, 1)

        cudnn_us = [timed(cudnn, device) * 1e6]
        pointer = run_config(ops, {**POINTER[name], "REPACK": False}, device)
        started = time.perf_counter()
        results = []
        for cfg in configs(c, hw, args.batch):
            if time.perf_counter() - started > args.secs_per_shape:
                break
            results.append(run_config(ops, cfg, device))
        cudnn_us.append(timed(cudnn, device) * 1e6)
        best_vendor = min(cudnn_us)
        good = sorted((r for r in results if "us" in r), key=lambda r: r["us"])
        row = {
            "name": name,
            "cudnn_us": cudnn_us,
            "pointer": pointer,
            "tma_tried": len(results),
            "tma_failed": sum(1 for r in results if "us" not in r),
            "best_tma": good[0] if good else None,
            "best_tma_vs_cudnn": best_vendor / good[0]["us"] if good else None,
            "pointer_vs_cudnn": best_vendor / pointer["us"] if "us" in pointer else None,
            "results": results,
        }
        report["rows"].append(row)
        print(
            f"{name}: cudnn {best_vendor:.1f} us, "
            f"pointer {pointer.get('us', float('nan')):.1f} us, "
            f"best tma {good[0]['us'] if good else float('nan'):.1f} us "
            f"({row['best_tma_vs_cudnn']}) {good[0]['config'] if good else ''}; "
            f"{len(results)} tried, {row['tma_failed']} failed",
            flush=True,
        )
        for r in good[:5]:
            print("   ", round(r["us"], 1), r["config"], flush=True)
        failed = [r for r in results if "us" not in r]
        if failed:
            print("    first failure:", failed[0]["config"], failed[0].get("error"), flush=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
