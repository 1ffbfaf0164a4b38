"""Probe: ``triton.conv2d``'s TMA kernel with its K steps split (SPLIT_K) against the same
config unsplit and cuDNN, on ResNet-50's NHWC 3x3s at 7x7 and 14x14 (batch 32, fp16), where
the suite's tuning at 64 trials kept SPLIT_K 1. Each config checked against the float64
reference, timed by tunehub's policy (L2 flushed, CUDA-graph replay, median).

    PYTHONPATH=. python3 benchmarks/probes/conv_split.py --out "$OUT/conv_split.json"
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch
import torch.nn.functional as F

from tunehub.core import Workload
from tunehub.kernels import triton_conv_kernels as ck
from tunehub.kernels.gpu_timing import time_gpu

SHAPES = {"resnet50-3x3-7-nhwc": (512, 7), "resnet50-3x3-14-nhwc": (256, 14)}
# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, TILE_H, TILE_W): the suite's winners and seeds.
TILES = ((64, 128, 128, 8, 4, 1, 8), (64, 128, 64, 4, 3, 2, 8), (128, 64, 64, 8, 3, 1, 8),
         (128, 128, 64, 4, 4, 1, 8))  # fmt: skip


def median_us(call: Any, device: torch.device) -> float:
    t = time_gpu(call, min_secs=0.05, max_repeats=200, device=device)
    secs = sorted(t.repeat_secs)
    return secs[len(secs) // 2] * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    device = torch.device("cuda")
    report: dict[str, Any] = {"probe": "conv_split", "device": torch.cuda.get_device_name(),
                              "rows": []}  # fmt: skip
    for name, (channels, size) in SHAPES.items():
        w = Workload.from_dict({"op": "conv2d", "dtype": "float16", "batch": 32,
                                "in_channels": channels, "out_channels": channels,
                                "height": size, "width": size, "kernel_h": 3, "kernel_w": 3,
                                "pad_h": 1, "pad_w": 1, "data_layout": "nhwc"})  # fmt: skip
        ops = ck.operands(w, device, seed=3)
        ref = ck.reference(ops)
        torch.backends.cudnn.benchmark = True
        cudnn = [median_us(lambda ops=ops: F.conv2d(ops.x, ops.w, padding=1), device)]
        for bm, bn, bk, warps, stages, th, tw in TILES:
            for split in (1, 2, 3, 4):
                config = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 1,
                          "num_warps": warps, "num_stages": stages, "REPACK": False,
                          "PATCH": "tap", "TMA": True, "TILE_H": th, "TILE_W": tw,
                          "SPLIT_K": split}  # fmt: skip
                row: dict[str, Any] = {"shape": name, "config": config}
                try:
                    launch = ck.bind(ops, config)
                    ops.out.fill_(float("nan"))
                    launch()
                    check = ck.check(ops.out, ref, "float16")
                    row["ok"] = check.ok
                    if check.ok:
                        row["us"] = median_us(launch, device)
                except Exception as exc:  # a config that fails costs its row
                    row["error"] = f"{type(exc).__name__}: {exc}"[:300]
                report["rows"].append(row)
                print(name, bm, bn, bk, warps, stages, th, tw, "split", split,
                      row.get("us"), row.get("error", ""), flush=True)  # fmt: skip
        cudnn.append(median_us(lambda ops=ops: F.conv2d(ops.x, ops.w, padding=1), device))
        report.setdefault("cudnn_us", {})[name] = cudnn
        print(name, "cuDNN", cudnn, flush=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
