"""Probe (issue 24): ``triton.conv2d``'s ``rows`` order after its loads were masked at the
filter row's end, on ResNet-50's stem (batch 32, fp16) against cuDNN, both layouts; every
output checked against float64, and an infinity in the input checked to reach only the
outputs whose window holds it.

    python benchmarks/probes/conv_rows_check.py --out $OUT/conv_rows_check.json
"""

from __future__ import annotations

import argparse
import json
import math
from datetime import UTC, datetime

import torch
import triton
from triton.testing import do_bench

from tunehub.core import Workload
from tunehub.kernels import triton_conv_kernels as ck

STEM = {"op": "conv2d", "dtype": "float16", "batch": 32, "in_channels": 3, "out_channels": 64,
        "height": 224, "width": 224, "kernel_h": 7, "kernel_w": 7, "stride_h": 2,
        "stride_w": 2, "pad_h": 3, "pad_w": 3}  # fmt: skip
# (BLOCK_M, BLOCK_K, num_warps, num_stages, GROUP_M): the suites' picks and the probe's best.
TILES = ((256, 16, 4, 4, 1), (128, 32, 4, 1, 1), (256, 32, 4, 2, 8), (256, 16, 4, 4, 8))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    args = p.parse_args()
    dev = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    result = {
        "probe": "conv_rows_check", "date": datetime.now(UTC).isoformat(timespec="seconds"),
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

        case: dict = {"layout": layout, "cudnn_us": [do_bench(cudnn, warmup=50, rep=200) * 1e3]}
        rows = []
        for bm, bk, warps, stages, group in TILES:
            config = {"BLOCK_M": bm, "BLOCK_N": 64, "BLOCK_K": bk, "GROUP_M": group,
                      "num_warps": warps, "num_stages": stages, "REPACK": False,
                      "PATCH": "rows"}  # fmt: skip
            ops.out.fill_(math.nan)
            launch = ck.bind(ops, config)
            launch()
            torch.cuda.synchronize()
            check = ck.check(ops.out, ref, "float16")
            us = do_bench(launch, warmup=25, rep=200) * 1e3 if check.ok else None
            rows.append({"config": config, "us": us, "ok": check.ok,
                         "rel_err": check.relative_error})  # fmt: skip
            print(layout, config, us and round(us, 1), check.ok, flush=True)
        case["cudnn_us"].append(do_bench(cudnn, warmup=50, rep=200) * 1e3)
        saved = ops.x[0, 1, 50, 40].clone()
        ops.x[0, 1, 50, 40] = math.inf
        ck.bind(ops, rows[0]["config"])()
        finite = torch.isfinite(ck.reference(ops))  # float64
        case["inf_reaches_only_its_windows"] = bool(torch.equal(torch.isfinite(ops.out), finite))
        case["nonfinite_outputs"] = {
            "float64": int((~finite).sum()),
            "rows": int((~torch.isfinite(ops.out)).sum()),
            "cudnn_fp16": int(
                (~torch.isfinite(torch.nn.functional.conv2d(ops.x, ops.w, **kw))).sum()
            ),
        }
        ops.x[0, 1, 50, 40] = saved
        case["rows"] = rows
        inf = (case["inf_reaches_only_its_windows"], case["nonfinite_outputs"])
        print(layout, "cudnn", [round(u, 1) for u in case["cudnn_us"]], "inf", inf, flush=True)
        result["cases"].append(case)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
