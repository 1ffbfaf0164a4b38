"""Probe: chosen ``triton.gemm`` configs side by side with cuBLAS on chosen shapes, no search.

Each config is compiled first by a pool of GPU-less processes, then checked against a float64
reference into a NaN-poisoned C and timed by tunehub's policy (``tunehub.kernels.gpu_timing``:
L2 flushed before each repeat, CUDA-graph replay, median) in alternating rounds
(``gpu_splitk.run_shape``). A row-major, B column-major, no epilogue. The default plan puts
``tma`` composite tiles (192 = 128 + 64 rows, two descriptors of A) beside the ``tiled``
composite tile and the search's last picks on the shapes whose power-of-two tiles leave SMs
idle.

    PYTHONPATH=. python3 benchmarks/probes/gpu_tiles.py --out "$OUT/gpu_tiles.json"
    python3 benchmarks/probes/gpu_tiles.py --shape 3000x1000x4000:float16 \\
        --config "tma 192x128x64 w4 s4 g8" --dry-run
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the other probes
sys.path.insert(0, str(HERE.parent))  # benchmarks/ (triton_kernel_check)
sys.path.insert(0, str(HERE.parents[1]))  # the repository (tunehub)

from gpu_splitk import (  # noqa: E402
    Contender,
    precompile,
    probe_device,
    report_head,
    run_shape,
    write_report,
)

SHAPES = ["3000x1000x4000:float16", "1536x1536x1536:bfloat16", "1024x1024x1024:float16",
          "4096x4096x4096:float16", "2048x2048x2048:float16"]  # fmt: skip
CONFIGS = [
    # the search's picks of gpu_gemm-h100-summary.txt (code 5fe7b53) and the tiled composite
    "tiled 192x128x64 w4 s5 g8",
    "tiled 192x128x64 w4 s4 g8",
    "tma 128x256x64 w8 s3 g8",
    "tma 64x128x128 w4 s4 g1",
    # tma composite tiles
    "tma 192x128x64 w4 s4 g8",
    "tma 192x128x64 w4 s4 g8 F",
    "tma 192x128x64 w4 s3 g8",
    "tma 192x128x64 w8 s4 g8",
    "tma 192x128x64 w8 s4 g8 F",
    "tma 192x128x64 w8 s5 g8",
    "tma 192x256x64 w8 s3 g8",
    "tma 192x64x64 w4 s5 g8",
]


def parse_config(text: str) -> dict[str, Any]:
    """``"tma 192x128x64 w4 s4 g8 [k2] [F]"`` as a config (F: FLATTEN on; persistent variants
    otherwise spell it off)."""
    words = text.split()
    bm, bn, bk = (int(x) for x in words[1].split("x"))
    knobs = {w[0]: int(w[1:]) for w in words[2:] if w[0] in "wsgk" and w[1:].isdigit()}
    config: dict[str, Any] = {
        "variant": words[0],
        "BLOCK_M": bm,
        "BLOCK_N": bn,
        "BLOCK_K": bk,
        "GROUP_M": knobs.get("g", 8),
        "num_warps": knobs.get("w", 4),
        "num_stages": knobs.get("s", 3),
        "SPLIT_K": knobs.get("k", 1),
    }
    if words[0] in ("persistent", "tma", "ws"):
        config["FLATTEN"] = "F" in words[2:]
    return config


def plan(
    shapes: list[str], configs: list[str]
) -> list[tuple[tuple[int, int, int, str], list[Contender]]]:
    from tunehub.kernels import triton_gemm_limits as limits

    props = {"compute_capability": 90, "smem_per_block_bytes": 232448, "regs_per_sm": 65536}
    out = []
    for spec in shapes:
        size, dtype = spec.split(":")
        m, n, k = (int(x) for x in size.split("x"))
        contenders = []
        for text in configs:
            c = parse_config(text)
            if c["BLOCK_M"] > max(16, 1 << (m - 1).bit_length()):
                continue
            if limits.config_problem(c, dtype, props) is None and not limits.workload_problem(
                c["variant"], m, n, k, dtype, "row", "col"
            ):
                contenders.append(Contender(text, c))
        contenders.append(Contender("cuBLAS", None))
        out.append(((m, n, k, dtype), contenders))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", action="append", default=[], help="MxNxK:dtype (repeatable)")
    parser.add_argument(
        "--config", action="append", default=[], help="e.g. 'tma 192x128x64 w4 s4 g8'"
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--min-secs", type=float, default=0.05)
    parser.add_argument("--budget-secs", type=float, default=200.0)
    parser.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    start = time.monotonic()
    planned = plan(args.shape or SHAPES, args.config or CONFIGS)
    if args.dry_run:
        for shape, contenders in planned:
            print("x".join(map(str, shape)))
            for c in contenders:
                print(f"  {c.role}")
        return 0
    device, sms, capability = probe_device("tiles")
    import torch

    built = precompile(planned, capability, sms, args.workers)
    print(f"# precompiled {built}", flush=True)
    report = report_head("gpu_tiles", device, args.rounds, args.min_secs)
    report["cases"] = []
    for (m, n, k, dtype), contenders in planned:
        if time.monotonic() - start > args.budget_secs:
            print(f"# {m}x{n}x{k}: skipped, past --budget-secs", flush=True)
            continue
        run_shape((m, n, k), contenders, rounds=args.rounds, min_secs=args.min_secs, sms=sms,
                  device=device, dtype=dtype)  # fmt: skip
        torch.cuda.empty_cache()
        flops = 2.0 * m * n * k
        lib = next(c for c in contenders if c.config is None)
        print(f"{m}x{n}x{k} {dtype}", flush=True)
        for c in sorted(contenders, key=Contender.secs):
            tf = flops / c.secs() / 1e12 if c.round_secs else math.nan
            ratio = lib.secs() / c.secs() if c.round_secs else math.nan
            rounds = " ".join(f"{flops / s / 1e12:.0f}" for s in c.round_secs)
            print(f"  {c.role:>28} {tf:7.1f} TFLOP/s  x cuBLAS {ratio:5.3f}  rounds [{rounds}]"
                  f"  regs {c.extra.get('registers')} stack {c.extra.get('stack')}"
                  f"  {'' if c.ok else c.note[:200]}")  # fmt: skip
        report["cases"].append(
            {
                "shape": [m, n, k],
                "dtype": dtype,
                "contenders": [c.record(flops, name=c.role) for c in contenders],
            }
        )  # fmt: skip
    write_report(report, args.out, start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
