"""Probe: triton.conv2d's depthwise kernel walking the filter's taps (each loads the tile's
whole window) against the same tiles swept along the input's rows (SWEEP: each input row
loaded once a filter column, multiplied into every output row it reaches), on ConvNeXt-T's
7x7 depthwise convolutions, beside cuDNN (``F.conv2d``). Each config is checked against the
reference, then timed with ``triton.testing.do_bench`` (median):

    python benchmarks/probes/depthwise_sweep.py --out $OUT/depthwise_sweep.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tunehub.core import Workload
from tunehub.kernels import triton_conv_kernels as ck

SHAPES = {  # ConvNeXt-T stage 1 and stage 3, batch 32
    "dw-56": {"in_channels": 96, "height": 56},
    "dw-14": {"in_channels": 384, "height": 14},
}
TILES = (  # BLOCK_M, BLOCK_N, num_warps, TILE_W
    (32, 32, 1, 8),
    (64, 64, 2, 8),
    (64, 64, 2, 16),
    (64, 32, 2, 8),
    (64, 32, 1, 16),
    (128, 32, 4, 16),
    (128, 64, 4, 16),
    (64, 128, 4, 16),
    (128, 32, 2, 32),
    (256, 32, 4, 32),
    (32, 64, 2, 8),
    (32, 128, 4, 8),
    (128, 128, 8, 16),
    (64, 16, 1, 16),
)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    args = parser.parse_args()
    from triton.testing import do_bench

    report: dict[str, Any] = {"device": torch.cuda.get_device_name(0), "shapes": {}}
    for name, dims in SHAPES.items():
        for layout in ("nhwc", "nchw"):
            c, hw = dims["in_channels"], dims["height"]
            w = Workload.from_dict({
                "op": "conv2d", "batch": 32, "in_channels": c, "out_channels": c, "height": hw,
                "width": hw, "kernel_h": 7, "kernel_w": 7, "pad_h": 3, "pad_w": 3,
                "groups": c, "data_layout": layout, "dtype": "float16",
            })  # fmt: skip
            ops = ck.operands(w, torch.device("cuda"), seed=1)
            ref = ck.reference(ops)
            row: dict[str, Any] = {"configs": {}}
            row["cudnn_ms"] = do_bench(
                lambda ops=ops, c=c: F.conv2d(ops.x, ops.w, padding=3, groups=c)
            )
            for sweep in (False, True):
                for bm, bn, warps, tw in TILES:
                    cfg = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 16, "GROUP_M": 1,
                           "num_warps": warps, "num_stages": 1, "TILE_W": tw, "REPACK": False,
                           "SWEEP": sweep}  # fmt: skip
                    tag = f"{'sweep' if sweep else 'taps'}-{bm}x{bn}-w{warps}-tw{tw}"
                    ops.out.fill_(float("nan"))
                    call = ck.bind(ops, cfg)
                    call()
                    torch.cuda.synchronize()
                    check = ck.check(ops.out, ref, "float16")
                    ms = do_bench(call) if check.ok else None
                    row["configs"][tag] = {"ms": ms, "ok": check.ok, "error": check.message}
            for kind in ("taps", "sweep"):
                timed = {k: v["ms"] for k, v in row["configs"].items()
                         if k.startswith(kind) and v["ms"]}  # fmt: skip
                best = min(timed, key=timed.get)
                row[f"best_{kind}"] = best
                row[f"cudnn_over_{kind}"] = row["cudnn_ms"] / timed[best]
            report["shapes"][f"{name}-{layout}"] = row
            print(
                f"{name}-{layout}: cuDNN {row['cudnn_ms'] * 1e3:.1f}us  taps "
                f"{row['cudnn_over_taps']:.3f}x ({row['best_taps']})  sweep "
                f"{row['cudnn_over_sweep']:.3f}x ({row['best_sweep']})",
                flush=True,
            )
            if args.out:
                Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
