"""Probe: which cuBLAS kernels run the compiled models' GEMMs, and in what CTA clusters.

Reads, under Nsight Compute, the kernel ``F.linear`` (fp16, with a bias where the model has
one) launches for GPT-2 b8's, ViT-B b64's and LLaMA-7B prefill's GEMMs: its name, grid, block,
cluster size, registers, duration and SM / L2 throughput (issue 25: whether the library
kernels tunehub's Triton kernels trail on these shapes run in clusters, which Triton 3.6
cannot build).

    python benchmarks/probes/cublas_clusters.py --out DIR
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

SHAPES = (  # name, M, N, K, bias
    ("gpt2-b8-qkv", 4096, 2304, 768, True),
    ("gpt2-b8-mlp-up", 4096, 3072, 768, True),
    ("gpt2-b8-mlp-down", 4096, 768, 3072, True),
    ("vit-b64-mlp-down", 12608, 768, 3072, True),
    ("llama-prefill-qkv", 4096, 4096, 4096, False),
)
WANT = (
    "Duration", "Grid Size", "Block Size", "Cluster Size", "Registers Per Thread",
    "Compute (SM) Throughput", "L2 Cache Throughput", "DRAM Throughput",
)  # fmt: skip


def child() -> None:
    torch.manual_seed(0)
    calls = []
    for _, m, n, k, bias in SHAPES:
        x = torch.randn(m, k, device="cuda", dtype=torch.float16)
        w = torch.randn(n, k, device="cuda", dtype=torch.float16)
        b = torch.randn(n, device="cuda", dtype=torch.float16) if bias else None
        calls.append(lambda x=x, w=w, b=b: F.linear(x, w, b))
    for call in calls:
        call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for call in calls:
        call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--child", action="store_true")
    args = ap.parse_args()
    if args.child:
        child()
        return 0
    sys.path.insert(0, str(Path(__file__).parent))
    import ncu

    print("order:", [s[0] for s in SHAPES], torch.cuda.get_device_name(), flush=True)
    csv = args.out / "cublas_clusters_ncu.csv"
    rc = ncu.profile(__file__, ["--child"], ".*", csv, sections=("SpeedOfLight", "LaunchStats"))
    if csv.exists():
        ncu.summarize(csv.read_text(), WANT)
    return rc


if __name__ == "__main__":
    sys.exit(main())
