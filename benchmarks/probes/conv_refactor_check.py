"""Probe (review of issue 24's conv change): triton.conv2d's kernels after their epilogue and
dot moved into shared helpers (``_mma``, ``_store_pixels``) against the same kernels before
(the file at a given commit, ``--before``), alternately in one process on one GPU: the
pointer-load (tap), TMA, depthwise and rows kernels on the suite's configs, every output
checked against float64.

    git show REV:tunehub/kernels/triton_conv_kernels.py > before_ck.py
    python benchmarks/probes/conv_refactor_check.py --before before_ck.py --out $OUT/x.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import statistics
import sys
from datetime import UTC, datetime

import torch
import triton
from triton.testing import do_bench

from tunehub.core import Workload
from tunehub.kernels import triton_conv_kernels as after

BASE = {"op": "conv2d", "dtype": "float16", "batch": 32, "data_layout": "nhwc"}
CASES = [
    ("3x3-56 tap", {"in_channels": 64, "out_channels": 64, "height": 56, "width": 56,
                    "kernel_h": 3, "kernel_w": 3, "pad_h": 1, "pad_w": 1},
     {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 4,
      "num_stages": 3}),
    ("3x3-28 tma", {"in_channels": 128, "out_channels": 128, "height": 28, "width": 28,
                    "kernel_h": 3, "kernel_w": 3, "pad_h": 1, "pad_w": 1},
     {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 4,
      "num_stages": 3, "TMA": True, "TILE_H": 4, "TILE_W": 4}),
    ("dw-56 direct", {"in_channels": 96, "out_channels": 96, "height": 56, "width": 56,
                      "kernel_h": 7, "kernel_w": 7, "pad_h": 3, "pad_w": 3, "groups": 96},
     {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 1, "num_warps": 1,
      "num_stages": 1, "TILE_W": 8}),
    ("stem rows", {"in_channels": 3, "out_channels": 64, "height": 224, "width": 224,
                   "kernel_h": 7, "kernel_w": 7, "stride_h": 2, "stride_w": 2, "pad_h": 3,
                   "pad_w": 3},
     {"BLOCK_M": 256, "BLOCK_N": 64, "BLOCK_K": 16, "GROUP_M": 1, "num_warps": 4,
      "num_stages": 4, "PATCH": "rows"}),
]  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--before", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    spec = importlib.util.spec_from_file_location("before_ck", args.before)
    assert spec and spec.loader
    before = importlib.util.module_from_spec(spec)
    sys.modules["before_ck"] = before  # its dataclasses look their module up
    spec.loader.exec_module(before)
    dev = torch.device("cuda")
    result = {"probe": "conv_refactor_check",
              "date": datetime.now(UTC).isoformat(timespec="seconds"),
              "device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": triton.__version__, "cases": []}  # fmt: skip
    for name, shape, config in CASES:
        w = Workload.from_dict({**BASE, **shape})
        ops = after.operands(w, dev, seed=1)
        ref = after.reference(ops)
        times: dict[str, list[float]] = {"before": [], "after": []}
        checks = {}
        for label, module in (("before", before), ("after", after)):
            ops.out.fill_(math.nan)
            launch = module.bind(ops, {**config, "REPACK": False})
            launch()
            torch.cuda.synchronize()
            checks[label] = after.check(ops.out, ref, "float16").ok
        launches = {
            label: module.bind(ops, {**config, "REPACK": False})
            for label, module in (("before", before), ("after", after))
        }
        for _ in range(5):
            for label, launch in launches.items():
                times[label].append(do_bench(launch, warmup=10, rep=50) * 1e3)
        row = {"case": name, "config": config, "checks": checks,
               "before_us": statistics.median(times["before"]),
               "after_us": statistics.median(times["after"]), "times_us": times}  # fmt: skip
        print(name, checks, round(row["before_us"], 2), round(row["after_us"], 2), flush=True)
        result["cases"].append(row)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
