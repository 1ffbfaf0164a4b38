"""Probe: how much of the fused GELU's cost in ``triton.gemm``'s flattened ``tma`` kernel is
the exact erf (libdevice's ``erff``), against a cheaper erf of 1.5e-7 absolute error
(Abramowitz and Stegun 7.1.26: a degree-5 polynomial in 1 / (1 + p|x|) times exp(-x^2)).

ViT-B b64's and GPT-2 b8's MLP up (fp16, x times an nn.Linear weight, bias), the config the
tuning picked (tma 128 x 256 x 64, 8 warps, 3 stages, flattened): the bias alone, the bias and
the exact GELU, the bias and the cheaper GELU (the kernels' ``_epilogue`` replaced in a fresh
process before any compile), and ``torch.addmm`` then ``gelu_``; ``do_bench`` medians, every
output checked against a float64 reference.

    python benchmarks/probes/gelu_erf.py --out $OUT/gelu_erf.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import triton
import triton.language as tl

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

SITES = [("vit-b64 mlp-up", 12608, 3072, 768), ("gpt2-b8 mlp-up", 4096, 3072, 768)]
CONFIG = {"variant": "tma", "BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8,
          "SPLIT_K": 1, "num_warps": 8, "num_stages": 3, "FLATTEN": True}  # fmt: skip


@triton.jit
def _cheap_epilogue(acc, bias_ptr, offs_n, N, EPILOGUE: tl.constexpr):
    if EPILOGUE != "none":
        bias = tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0)
        acc = acc + bias.to(tl.float32)[None, :]
        if EPILOGUE == "bias_relu":
            acc = tl.maximum(acc, 0.0)
        elif EPILOGUE == "bias_gelu":
            z = acc * 0.7071067811865476
            az = tl.abs(z)
            t = tl.fdiv(tl.full(az.shape, 1.0, tl.float32), 1.0 + 0.3275911 * az,
                        ieee_rounding=False)  # fmt: skip
            poly = 1.061405429 * t - 1.453152027
            poly = poly * t + 1.421413741
            poly = poly * t - 0.284496736
            poly = poly * t + 0.254829592
            y = 1.0 - poly * t * tl.exp(-az * az)
            erf = tl.where(z < 0.0, -y, y)
            acc = 0.5 * acc * (1.0 + erf)
    return acc


def patch_cheap_erf() -> None:
    """The kernels' epilogue replaced, before any of them compiles."""
    from tunehub.kernels import triton_gemm_kernels as tk

    tk._epilogue = _cheap_epilogue


def measure(cheap: bool) -> list[dict[str, Any]]:
    if cheap:
        patch_cheap_erf()
    import torch

    from tunehub.kernels import triton_gemm_kernels as tk

    def bench(fn: Any) -> float:
        return float(triton.testing.do_bench(fn, warmup=50, rep=200, return_mode="median")) * 1e3

    rows = []
    for name, m, n, k in SITES:
        gen = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(m, k, device="cuda", dtype=torch.float16, generator=gen)
        w = torch.randn(n, k, device="cuda", dtype=torch.float16, generator=gen) / k**0.5
        b = torch.randn(n, device="cuda", dtype=torch.float16, generator=gen)
        base = x.double() @ w.double().t() + b.double()
        refs = {"bias": base, "bias_gelu": torch.nn.functional.gelu(base)}
        out = torch.empty(m, n, device="cuda", dtype=torch.float16)
        row: dict[str, Any] = {"site": name, "shape": [m, n, k], "cheap_erf": cheap}
        for epilogue in ("bias", "bias_gelu") if not cheap else ("bias_gelu",):
            launch = tk.bind(x, w.t(), b, out, epilogue=epilogue, config=CONFIG)
            launch()
            torch.cuda.synchronize()
            ref = refs[epilogue]
            row[epilogue] = {
                "us": bench(launch),
                "rel_err": float((out.double() - ref).norm() / ref.norm()),
                "max_abs_err": float((out.double() - ref).abs().max()),
            }
        if not cheap:

            def library(out: Any = out, x: Any = x, w: Any = w, b: Any = b) -> None:
                torch.addmm(b, x, w.t(), out=out)
                torch.ops.aten.gelu_(out)

            library()
            ref = refs["bias_gelu"]
            row["library_gelu"] = {
                "us": bench(library),
                "rel_err": float(
                    (out.double() - refs["bias_gelu"]).norm() / refs["bias_gelu"].norm()
                ),
            }
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path)
    parser.add_argument("--one", choices=("exact", "cheap"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print("ROWS " + json.dumps(measure(args.one == "cheap")))
        return 0
    results: dict[str, Any] = {"config": CONFIG}
    for mode in ("exact", "cheap"):  # each in a fresh process: no kernel compiled before
        done = subprocess.run([sys.executable, __file__, "--one", mode], capture_output=True,
                              text=True, timeout=240)  # fmt: skip
        sys.stderr.write(done.stderr[-3000:])
        lines = [line for line in done.stdout.splitlines() if line.startswith("ROWS ")]
        results[mode] = json.loads(lines[-1][5:]) if lines else {"error": done.stderr[-2000:]}
    for exact, cheap in zip(results["exact"], results["cheap"], strict=False):
        lib = exact["library_gelu"]["us"]
        print(f"{exact['site']}: bias {exact['bias']['us']:.1f} us, exact GELU "
              f"{exact['bias_gelu']['us']:.1f} us ({lib / exact['bias_gelu']['us']:.3f}x lib), "
              f"cheap GELU {cheap['bias_gelu']['us']:.1f} us ({lib / cheap['bias_gelu']['us']:.3f}x"
              f" lib, max abs err {cheap['bias_gelu']['max_abs_err']:.2e} vs exact "
              f"{exact['bias_gelu']['max_abs_err']:.2e}), library {lib:.1f} us")  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
