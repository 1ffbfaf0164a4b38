"""Probe: Triton 3.6's CTA clusters (``num_ctas``) on the conv TMA kernel (issue 24).

cuDNN runs ResNet-50's NHWC 3x3s at 7x7 and 14x14 in clusters of 4 CTAs (conv_l2 probe), so
one load can feed several CTAs' shared memory. Triton's only route to clusters is the launch
option ``num_ctas``: a program's tile spread over that many CTAs of a cluster. This probe runs
triton.conv2d's TMA kernel (``_conv2d_tma_kernel``) at num_ctas 1, 2 and 4 on a few tiles,
each output checked against float64, ``do_bench`` medians beside cuDNN's (before and after).

    python benchmarks/probes/conv_ctas.py --out result.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

from tunehub.core import Workload
from tunehub.kernels import triton_conv_kernels as kernels
from tunehub.kernels.conv2d_reference import conv_dims
from tunehub.kernels.triton_conv import tma_boxes

BATCH = 32
CASES = {"resnet50-3x3-7": (512, 7), "resnet50-3x3-14": (256, 14)}
# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages)
TILES = (
    (64, 128, 128, 8, 4), (128, 128, 64, 8, 3), (128, 128, 64, 4, 4), (128, 64, 64, 4, 4),
    (128, 256, 64, 8, 3), (256, 128, 64, 8, 3),
)  # fmt: skip
CTAS = (1, 2, 4)


def med(fn, reps: int = 3) -> float:
    times = sorted(do_bench(fn, warmup=25, rep=100, return_mode="median") for _ in range(reps))
    return times[reps // 2] * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda")
    result: dict = {
        "probe": "conv_ctas",
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rows": [],
    }
    for name, (ch, side) in CASES.items():
        wl = Workload.from_dict({
            "op": "conv2d", "dtype": "float16", "batch": BATCH, "in_channels": ch,
            "out_channels": ch, "height": side, "width": side, "kernel_h": 3, "kernel_w": 3,
            "pad_h": 1, "pad_w": 1, "data_layout": "nhwc",
        })  # fmt: skip
        ops = kernels.operands(wl, dev, 0)
        ref = kernels.reference(ops)
        d = conv_dims(wl)

        def cudnn(ops=ops) -> torch.Tensor:
            return F.conv2d(ops.x, ops.w, padding=1)

        before = med(cudnn)
        for bm, bn, bk, warps, stages in TILES:
            th, tw = tma_boxes(wl, bm)[0]
            cfg = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 1,
                   "num_warps": warps, "num_stages": stages, "REPACK": False, "PATCH": "tap",
                   "TMA": True, "TILE_H": th, "TILE_W": tw}  # fmt: skip
            for ctas in CTAS:
                row: dict = {"case": name, "config": cfg, "num_ctas": ctas}
                try:
                    opts = {"num_warps": warps, "num_stages": stages, "num_ctas": ctas}
                    launch = kernels._tma_launches(ops.x, ops.w, ops.out, d, cfg, opts)[-1]
                    fn = launch.bind()
                    ops.out.fill_(float("nan"))
                    fn()
                    torch.cuda.synchronize()
                    chk = kernels.check(ops.out, ref, "float16")
                    row["ok"], row["rel_error"] = chk.ok, chk.relative_error
                    if chk.ok:
                        row["us"] = med(fn, 1)
                except Exception as exc:
                    row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                result["rows"].append(row)
                print(name, (bm, bn, bk, warps, stages, th, tw), ctas,
                      round(row.get("us", 0), 1), row.get("error", ""), flush=True)  # fmt: skip
        after = med(cudnn)
        for row in result["rows"]:
            if row["case"] == name:
                row["cudnn_us"] = (before + after) / 2
                if "us" in row:
                    row["vs_cudnn"] = row["cudnn_us"] / row["us"]
        print(name, "cuDNN", round(before, 1), round(after, 1), flush=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
