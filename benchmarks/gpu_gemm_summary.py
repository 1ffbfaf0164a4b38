"""Summarise ``gpu_gemm.py`` JSON files (one run may span several calls) as one table.

Per case: TFLOP/s of tunehub's kernel, cuBLAS and torch.compile max-autotune side by side,
the ratios, and ``answer``: what the lookup serves (the kernel, or cuBLAS where it says the
library is faster) over the faster of cuBLAS and torch.compile. Then the issue's aggregates:
the fp16 geomean and minimum against cuBLAS, and the minima against compile.

    python3 benchmarks/gpu_gemm_summary.py benchmarks/results/gpu_gemm-h100-20261125T0755*.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

CUBLAS = "cuBLAS"


def _secs(case: dict[str, Any], prefix: str) -> float:
    for side in case["sides"]:
        if side["name"].startswith(prefix):
            return float(side["secs"])
    return math.nan


def describe(config: dict[str, Any]) -> str:
    text = (
        f"{config['variant']} {config['BLOCK_M']}x{config['BLOCK_N']}x{config['BLOCK_K']} "
        f"w{config['num_warps']} s{config['num_stages']} g{config['GROUP_M']} "
        f"k{config['SPLIT_K']}"
    )
    return text + (" F" if config.get("FLATTEN") else "") + (" padK" if config.get("PAD_K") else "")


def rows(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for case in cases:
        w = case["workload"]
        flops = 2.0 * w["m"] * w["n"] * w["k"]
        mine, lib, comp = (_secs(case, p) for p in ("tunehub", CUBLAS, "torch.compile"))
        served = lib if case["tunehub"].get("lookup_says_library_faster") else mine
        epilogue = "" if w["epilogue"] == "none" else f" {w['epilogue']}"
        out.append(
            {
                "case": f"{w['m']}x{w['n']}x{w['k']}{epilogue} {w['dtype']}",
                "dtype": w["dtype"],
                "tflops": [flops / s / 1e12 for s in (mine, lib, comp)],
                "x_cublas": lib / mine,
                "x_compile": comp / mine,
                "answer": min(lib, comp) / served,
                "config": describe(case["tunehub"]["config"]),
                "library": bool(case["tunehub"].get("lookup_says_library_faster")),
            }
        )
    return out


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def table(found: list[dict[str, Any]]) -> str:
    head = f"{'case':>34} {'tunehub':>8} {'cuBLAS':>8} {'compile':>8} {'x cuBLAS':>8} "
    lines = [head + f"{'x compile':>9} {'answer':>8}  config found"]
    for r in found:
        t = r["tflops"]
        lines.append(
            f"{r['case']:>34} {t[0]:8.1f} {t[1]:8.1f} {t[2]:8.1f} {r['x_cublas']:8.3f} "
            f"{r['x_compile']:9.3f} {r['answer']:8.3f}  {r['config']}"
            + ("  [lookup: use cuBLAS]" if r["library"] else "")
        )
    fp16 = [r["x_cublas"] for r in found if r["dtype"] == "float16"]
    every = [r["x_cublas"] for r in found]
    lines.append(
        f"# fp16 ({len(fp16)} cases) geomean tunehub/cuBLAS {geomean(fp16):.3f} "
        f"(min {min(fp16, default=math.nan):.3f}); all {len(every)} cases {geomean(every):.3f}; "
        f"tunehub/compile geomean {geomean([r['x_compile'] for r in found]):.3f} "
        f"(min {min((r['x_compile'] for r in found), default=math.nan):.3f}); answer / faster "
        f"of cuBLAS and compile: min {min((r['answer'] for r in found), default=math.nan):.3f}, "
        f"{sum(r['answer'] >= 0.98 for r in found)} of {len(found)} >= 0.98"
    )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path)
    args = parser.parse_args()
    cases: list[dict[str, Any]] = []
    for path in args.files:
        cases.extend(json.loads(path.read_text())["cases"])
    print(table(rows(cases)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
