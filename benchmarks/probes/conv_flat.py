"""Probe (issue 24): ``triton.conv2d``'s K orders (PATCH: tap, flat, rows) on ResNet-50's
stem (7x7/2 on 3 channels, batch 32, fp16) against cuDNN, both layouts.
Every config's output is checked against float64 first; times are ``do_bench`` medians, cuDNN
timed before and after each layout's configs.

    python benchmarks/probes/conv_flat.py --out $OUT/conv_flat.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from datetime import UTC, datetime

import torch
import triton
from triton.testing import do_bench

from tunehub.core import Workload
from tunehub.kernels import triton_conv_kernels as ck

STEM = {"op": "conv2d", "dtype": "float16", "batch": 32, "in_channels": 3, "out_channels": 64,
        "height": 224, "width": 224, "kernel_h": 7, "kernel_w": 7, "stride_h": 2,
        "stride_w": 2, "pad_h": 3, "pad_w": 3}  # fmt: skip


def configs(layout: str) -> list[dict]:
    base = {"BLOCK_N": 64, "GROUP_M": 8}
    out = [  # the per-tap kernel's best from the 2026-11-27 suites' neighbourhood
        {**base, "BLOCK_M": bm, "BLOCK_K": 16, "num_warps": w, "num_stages": s,
         "REPACK": layout == "nchw", "PATCH": "tap"}
        for bm, w, s in ((128, 4, 3), (256, 8, 3))
    ]  # fmt: skip
    repacks = (False,) if layout == "nhwc" else (True, False)
    for bm, bk, w, rp in itertools.product((128, 256), (16, 64), (4, 8), repacks):
        out.append({**base, "BLOCK_M": bm, "BLOCK_K": bk, "num_warps": w, "num_stages": 2,
                    "REPACK": rp, "PATCH": "flat"})  # fmt: skip
    for bm, bk, w, s in itertools.product((128, 256), (16, 32, 64), (4, 8), (2, 3, 4)):
        if bm * 64 / (32 * w) > 256:
            continue
        out.append({**base, "BLOCK_M": bm, "BLOCK_K": bk, "num_warps": w, "num_stages": s,
                    "REPACK": False, "PATCH": "rows"})  # fmt: skip
    return out


def _pad_us(ops: ck.ConvOperands) -> float:
    """The rows order's copy into its padded buffer alone."""
    launches = ck.conv_launches(
        ops.x, ops.w, ops.out, ops.workload,
        {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 4,
         "num_stages": 3, "PATCH": "rows"},
    )  # fmt: skip
    pad = launches[0]
    kernel = pad.kernel[pad.grid]
    return do_bench(lambda: kernel(*pad.args, **pad.kwargs), warmup=25, rep=100) * 1e3


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--cp", type=int, default=0, help="rows: channels a padded pixel (0: C's)")
    p.add_argument("--orders", default="tap,flat,rows")
    args = p.parse_args()
    if args.cp:
        ck.rows_channels = lambda icg: args.cp
    dev = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    result = {
        "probe": "conv_flat", "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(), "torch": torch.__version__,
        "triton": triton.__version__, "cases": [],
    }  # fmt: skip
    for layout in ("nhwc", "nchw"):
        w = Workload.from_dict({**STEM, "data_layout": layout})
        ops = ck.operands(w, dev, seed=1)
        ref = ck.reference(ops)
        kw = ck.torch_args(w)

        def cudnn(ops: ck.ConvOperands = ops, kw: dict = kw) -> None:
            torch.nn.functional.conv2d(ops.x, ops.w, **kw)

        case = {"layout": layout, "cudnn_us": [do_bench(cudnn, warmup=50, rep=200) * 1e3]}
        rows = []
        case["cp"] = args.cp or None
        case["rows_pad_copy_us"] = _pad_us(ops)
        print(layout, "pad copy", round(case["rows_pad_copy_us"], 1), "us", flush=True)
        for config in [c for c in configs(layout) if c["PATCH"] in args.orders.split(",")]:
            t0 = time.perf_counter()
            try:
                ops.out.fill_(float("nan"))
                launch = ck.bind(ops, config)
                launch()
                torch.cuda.synchronize()
                check = ck.check(ops.out, ref, "float16")
                if not check.ok:
                    rows.append({"config": config, "error": check.message})
                    continue
                us = do_bench(launch, warmup=25, rep=100) * 1e3
                rows.append({"config": config, "us": us, "rel_err": check.relative_error,
                             "secs": time.perf_counter() - t0})  # fmt: skip
            except Exception as exc:
                rows.append({"config": config, "error": f"{type(exc).__name__}: {exc}"[:300]})
        case["cudnn_us"].append(do_bench(cudnn, warmup=50, rep=200) * 1e3)
        timed = sorted((r for r in rows if "us" in r), key=lambda r: r["us"])
        for order in ("tap", "flat", "rows"):
            case[f"best_{order}"] = next((r for r in timed if r["config"]["PATCH"] == order), None)
        case["errors"] = sum("error" in r for r in rows)
        case["rows"] = rows
        print(layout, "cudnn", [round(u, 1) for u in case["cudnn_us"]], "errors", case["errors"])
        for order in ("tap", "flat", "rows"):
            best = case[f"best_{order}"]
            print(" ", order, best and (round(best["us"], 1), best["config"]), flush=True)
        result["cases"].append(case)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
