"""Probe: does Inductor's mm template with the activation (or residual add) fused into its
epilogue beat Inductor's default (cuBLAS, then a separate pointwise kernel) on the models'
GEMMs, and does tunehub's own measurement of the ``bias_gelu`` workload (its ``tiled`` kernel
with the GELU in its epilogue against ``torch.addmm`` + ``gelu_``) say the same?

For each site, fp16, x (M x K) and an nn.Linear weight (N x K):
- ``gelu``: ``F.gelu(F.linear(x, w, b))`` (GPT-2's and ViT's MLP up);
- ``residual``: ``r + F.linear(x, w, b)`` (attention out and MLP down).
Timed with ``triton.testing.do_bench`` (median): Inductor's default compile, then the same
function compiled with one ``template`` answer per tiled config; for ``gelu`` sites also
tunehub's ``tiled`` kernel with the ``bias_gelu`` epilogue and the library as tunehub's
baseline runs it.

    python benchmarks/probes/epilogue_fusion.py --out $OUT/epilogue_fusion.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

SITES = [  # (name, kind, batch, tokens, N, K): M = batch x tokens, x 3-D as in the models
    ("gpt2-b8 mlp-up", "gelu", 8, 512, 3072, 768),
    ("vit-b64 mlp-up", "gelu", 64, 197, 3072, 768),
    ("gpt2-b8 attn-out", "residual", 8, 512, 768, 768),
    ("gpt2-b8 mlp-down", "residual", 8, 512, 768, 3072),
    ("vit-b64 mlp-down", "residual", 64, 197, 768, 3072),
]
TILES = [  # BLOCK_M, BLOCK_N, BLOCK_K, warps, stages
    (128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (128, 128, 64, 4, 4), (64, 128, 64, 4, 4),
    (128, 64, 64, 4, 4), (256, 128, 64, 8, 3), (128, 128, 32, 4, 4), (64, 256, 64, 8, 4),
    (128, 256, 32, 8, 4), (128, 128, 128, 8, 3), (64, 128, 128, 4, 3), (64, 64, 64, 4, 4),
]  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    import torch
    import torch.nn.functional as F
    from inductor_route import bench, compile_planned, template_entry
    from torch._inductor.utils import run_and_get_code

    from tunehub.client.inductor_gemm import GemmSite
    from tunehub.kernels import triton_gemm_kernels as tk

    torch.manual_seed(0)
    report: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}

    def site_row(name: str, kind: str, batch: int, tokens: int, n: int, k: int) -> Any:
        m = batch * tokens
        x2 = torch.randn(m, k, device="cuda", dtype=torch.float16)
        x = x2.view(batch, tokens, k)
        w = torch.randn(n, k, device="cuda", dtype=torch.float16) / k**0.5
        b = torch.randn(n, device="cuda", dtype=torch.float16)
        r = torch.randn(batch, tokens, n, device="cuda", dtype=torch.float16)
        if kind == "gelu":

            def fn(x: Any, w: Any, b: Any, r: Any) -> Any:
                return F.gelu(F.linear(x, w, b))
        else:

            def fn(x: Any, w: Any, b: Any, r: Any) -> Any:
                return r + F.linear(x, w, b)

        expected = fn(x.float(), w.float(), b.float(), r.float())

        def err(out: Any, expected: Any = expected) -> float:
            return float((out.float() - expected).norm() / expected.norm())

        torch._dynamo.reset()
        default = torch.compile(fn)
        out, codes = run_and_get_code(default, x, w, b, r)
        code = "\n".join(codes)
        row: dict[str, Any] = {
            "site": name, "kind": kind, "shape": [m, n, k],
            "default_us": bench(lambda c=default: c(x, w, b, r)),
            "default_err": err(out),
            "default_kernels": {"extern": code.count("extern_kernels."),
                                "triton": code.count("@triton.jit")},
            "cublas_mm_us": bench(lambda: torch.mm(x2, w.t())),
            "templates": [],
        }  # fmt: skip
        if kind == "gelu":
            c = torch.empty(m, n, device="cuda", dtype=torch.float16)

            def library(c: Any = c) -> None:
                torch.addmm(b, x2, w.t(), out=c)
                torch.ops.aten.gelu_(c)

            row["library_addmm_gelu_us"] = bench(library)
        for bm, bn, bk, warps, stages in TILES:
            cfg = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8,
                   "num_warps": warps, "num_stages": stages}  # fmt: skip
            entry = template_entry(cfg, k)
            table = {
                GemmSite(op, m, n, k, "float16", "row_major", "col_major").key: entry
                for op in ("mm", "addmm")
            }
            item: dict[str, Any] = {"config": cfg}
            try:
                torch._dynamo.reset()
                compiled = compile_planned(fn, table, template=True)
                out, codes = run_and_get_code(compiled, x, w, b, r)
                code = "\n".join(codes)
                item.update(
                    template_us=bench(lambda c=compiled: c(x, w, b, r)),
                    template_err=err(out),
                    template_kernels=code.count("def triton_tem_"),
                    fused=any(
                        ("erf" if kind == "gelu" else "in_ptr") in part
                        for part in code.split("def triton_tem_")[1:]
                    ),
                    other_triton=code.count("@triton.jit") - code.count("def triton_tem_"),
                )
                if kind == "gelu":
                    config = {"variant": "tiled", "SPLIT_K": 1, **cfg}
                    c = torch.empty(m, n, device="cuda", dtype=torch.float16)
                    launch = tk.bind(x2, w.t(), b, c, epilogue="bias_gelu", config=config)
                    launch()
                    got = err(c.view(batch, tokens, n))
                    item.update(tunehub_tiled_us=bench(launch), tunehub_tiled_err=got)
            except Exception as exc:  # a config that does not compile here
                item["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            row["templates"].append(item)
            print(name, json.dumps(item), flush=True)
        timed = [t for t in row["templates"] if "template_us" in t]
        best = min(timed, key=lambda t: t["template_us"])
        row["best_template_us"] = best["template_us"]
        row["default_over_best_template"] = row["default_us"] / best["template_us"]
        if kind == "gelu":
            tiled = min(timed, key=lambda t: t.get("tunehub_tiled_us", 1e9))
            row["library_over_best_tunehub_tiled"] = (
                row["library_addmm_gelu_us"] / tiled["tunehub_tiled_us"]
            )
        print(
            f"== {name}: default {row['default_us']:.1f} us, best template "
            f"{best['template_us']:.1f} us ({row['default_over_best_template']:.3f}x), "
            f"cuBLAS mm alone {row['cublas_mm_us']:.1f} us",
            flush=True,
        )
        return row

    rows = [site_row(*site) for site in SITES]
    report["rows"] = rows
    args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
