"""Probe: with the GELU in its epilogue, does one of ``triton.gemm``'s persistent variants
(``tma``, ``ws``, ``persistent``, whose epilogue can overlap the next tile's loads) beat the
library with its separate GELU pass, where the one-tile-per-program ``tiled`` kernel only
ties it (epilogue_fusion-h200-20261127T1301.json)?

For the models' MLP-up GEMMs (fp16, x times an nn.Linear weight, bias): the library as
tunehub's baseline runs it (``torch.addmm``, then ``gelu_`` for ``bias_gelu``), and each of
``triton.gemm``'s seed configs for the workload plus wide persistent tiles, launched through
``bind`` with the ``bias`` and the ``bias_gelu`` epilogue; ``do_bench`` medians, every output
checked against a float32 reference.

    python benchmarks/probes/gelu_variants.py --out $OUT/gelu_variants.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

SITES = [  # (name, M, N, K)
    ("gpt2-b8 mlp-up", 4096, 3072, 768),
    ("vit-b64 mlp-up", 12608, 3072, 768),
    ("vit-b8 mlp-up", 1576, 3072, 768),
]
EXTRA = [  # variant, BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, FLATTEN
    ("tma", 128, 256, 64, 8, 3, True), ("tma", 128, 256, 64, 8, 3, False),
    ("tma", 128, 128, 64, 8, 4, True), ("tma", 128, 128, 64, 4, 4, True),
    ("ws", 128, 256, 64, 4, 3, False), ("ws", 128, 128, 64, 4, 4, False),
    ("persistent", 128, 256, 64, 8, 3, True), ("persistent", 128, 128, 64, 8, 4, True),
]  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    import torch
    import triton

    from tunehub.client.triton import device_target
    from tunehub.core import Config, Workload
    from tunehub.kernels import triton_gemm_kernels as tk
    from tunehub.kernels.triton_gemm import TritonGemmTemplate, kernel_config

    def bench(fn: Any) -> float:
        return float(triton.testing.do_bench(fn, warmup=50, rep=200, return_mode="median")) * 1e3

    torch.manual_seed(0)
    target = device_target(torch.device("cuda"))
    template = TritonGemmTemplate()
    report: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    rows = []
    for name, m, n, k in SITES:
        x = torch.randn(m, k, device="cuda", dtype=torch.float16)
        w = torch.randn(n, k, device="cuda", dtype=torch.float16) / k**0.5
        b = torch.randn(n, device="cuda", dtype=torch.float16)
        base = x.float() @ w.float().t() + b.float()
        refs = {"bias": base, "bias_gelu": torch.nn.functional.gelu(base)}
        out = torch.empty(m, n, device="cuda", dtype=torch.float16)

        def library(epilogue: str, out: Any = out, x: Any = x, w: Any = w, b: Any = b) -> Any:
            def call() -> None:
                torch.addmm(b, x, w.t(), out=out)
                if epilogue == "bias_gelu":
                    torch.ops.aten.gelu_(out)

            return call

        row: dict[str, Any] = {"site": name, "shape": [m, n, k], "library_us": {}, "kernels": []}
        for epilogue in refs:
            row["library_us"][epilogue] = bench(library(epilogue))
        workload = Workload(m=m, n=n, k=k, dtype="float16", b_layout="col_major",
                            epilogue="bias_gelu")  # fmt: skip
        space = template.space(workload, target)
        seeds = template.seed_configs(workload, target)
        # Every persistent seed, the first few tiled ones (the rest are narrower tiles).
        tiled = [c for c in seeds if c["variant"] == "tiled"][:4]
        configs = [c for c in seeds if c["variant"] != "tiled"] + tiled
        for variant, bm, bn, bk, warps, stages, flat in EXTRA:
            config = Config({"variant": variant, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk,
                             "num_warps": warps, "num_stages": stages, "GROUP_M": 8,
                             "SPLIT_K": 1, "FLATTEN": flat})  # fmt: skip
            if config not in configs and space.is_valid(config):
                configs.append(config)
        for config in configs:
            item: dict[str, Any] = {"config": config.to_dict()}
            for epilogue, ref in refs.items():
                try:
                    launch = tk.bind(x, w.t(), b, out, epilogue=epilogue,
                                     config=kernel_config(config))  # fmt: skip
                    launch()
                    torch.cuda.synchronize()
                    err = float((out.float() - ref).norm() / ref.norm())
                    item[epilogue] = {"us": bench(launch), "err": err}
                except Exception as exc:  # a config that does not run here
                    item[epilogue] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
            row["kernels"].append(item)
            print(name, json.dumps(item), flush=True)
        for epilogue in refs:
            timed = [i for i in row["kernels"] if "us" in i[epilogue]]
            best = min(timed, key=lambda i: i[epilogue]["us"])
            row[f"best_{epilogue}"] = best["config"]
            row[f"library_over_best_{epilogue}"] = (
                row["library_us"][epilogue] / best[epilogue]["us"]
            )
            print(f"== {name} {epilogue}: library {row['library_us'][epilogue]:.1f} us, best "
                  f"{best[epilogue]['us']:.1f} us ({row[f'library_over_best_{epilogue}']:.3f}x) "
                  f"{best['config']}", flush=True)  # fmt: skip
        rows.append(row)
    report["rows"] = rows
    args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
