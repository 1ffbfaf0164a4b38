"""Probe: ``bmm_tma_kernel`` (3-D TMA descriptors, boxes of one batch entry, TMA store)
against torch.bmm (cuBLAS) and ``bmm_kernel`` with the suite's tuned configs, on the suite's
batched GEMMs, no search.

Each config is checked against a float32 product into a NaN-poisoned output, then timed by
tunehub's policy (L2 flushed, CUDA-graph replay, median); torch.bmm is timed before and after
each shape's configs and the ratio is against the better of the two.

    PYTHONPATH=. python3 benchmarks/probes/bmm_tma.py --out "$OUT/bmm_tma.json"
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import time
from typing import Any

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from tunehub.kernels.gpu_timing import time_gpu
from tunehub.kernels.triton_bmm_kernels import _swizzle, bmm_launch

SHAPES = {  # name: (batch, m, n, k)
    "bert-scores-128": (12, 128, 128, 64),
    "bert-values-128": (12, 128, 64, 128),
    "llama-scores-512": (32, 512, 512, 128),
    "llama-values-512": (32, 512, 128, 512),
}
POINTER_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages")
# The suite's tuned bmm_kernel configs (operators-h200-20261126.json), BATCH_MAJOR last.
POINTER = {
    "bert-scores-128": ((64, 32, 64, 8, 4, 3), False),
    "bert-values-128": ((16, 64, 64, 8, 4, 3), False),
    "llama-scores-512": ((64, 128, 64, 8, 4, 2), True),
    "llama-values-512": ((128, 128, 64, 1, 8, 4), True),
}


@triton.jit
def bmm_tma_kernel(a_desc, b_desc, c_desc, M, N, K, BATCH,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   GROUP_M: tl.constexpr, BATCH_MAJOR: tl.constexpr,
                   PRECISION: tl.constexpr):  # type: ignore[no-untyped-def]  # fmt: skip
    # The operands as 3-D TMA descriptors (batch, rows, columns), boxes of one batch entry:
    # no masks (TMA zero-fills past the edges and clips the store), and a box of one entry
    # feeds the tensor cores from shared memory.
    pid = tl.program_id(0)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    if BATCH_MAJOR:
        entry = pid // (grid_m * grid_n)
        tile = pid % (grid_m * grid_n)
    else:
        entry = pid % BATCH
        tile = pid // BATCH
    pid_m, pid_n = _swizzle(tile, grid_m, grid_n, GROUP_M)
    m0 = pid_m * BLOCK_M
    n0 = pid_n * BLOCK_N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kk in range(0, tl.cdiv(K, BLOCK_K)):
        a = a_desc.load([entry, m0, kk * BLOCK_K]).reshape(BLOCK_M, BLOCK_K)
        b = b_desc.load([entry, kk * BLOCK_K, n0]).reshape(BLOCK_K, BLOCK_N)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
    c_desc.store([entry, m0, n0], acc.to(c_desc.dtype).reshape(1, BLOCK_M, BLOCK_N))


def configs(m: int, n: int, k: int) -> list[dict[str, Any]]:
    out = []
    for bm, bn, bk, (w, s), major in itertools.product(
        (64, 128), (32, 64, 128, 256), (32, 64, 128), ((4, 2), (4, 3), (4, 4), (8, 3)),
        (True, False),
    ):  # fmt: skip
        if bm > max(64, m) or bn > max(32, n) or bk > k:
            continue
        if bm * bn / (32 * w) > 256 or (bm + bn) * bk * 2 * s > 200_000:
            continue
        if not major and bm * bn < 128 * 128:  # entry-major only for the big tiles
            continue
        out.append(dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, num_warps=w,
                        num_stages=s, BATCH_MAJOR=major))  # fmt: skip
    return out


def timed(call: Any, device: torch.device) -> float:
    t = time_gpu(call, min_secs=0.05, max_repeats=300, device=device)
    secs = sorted(t.repeat_secs)
    return secs[len(secs) // 2]


def tma_launch(a: Any, b: Any, c: Any, cfg: dict[str, Any]) -> Any:
    bm, bn, bk = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
    batch, m, k = a.shape
    n = b.shape[-1]
    ad = TensorDescriptor(a, list(a.shape), list(a.stride()), [1, bm, bk])
    bd = TensorDescriptor(b, list(b.shape), list(b.stride()), [1, bk, bn])
    cd = TensorDescriptor(c, list(c.shape), list(c.stride()), [1, bm, bn])
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn) * batch,)
    meta = {key: cfg[key] for key in POINTER_KEYS}

    def launch() -> None:
        bmm_tma_kernel[grid](ad, bd, cd, m, n, k, batch, **meta,
                             BATCH_MAJOR=cfg["BATCH_MAJOR"], PRECISION="ieee")  # fmt: skip

    return launch


def run(launch: Any, c: Any, ref: Any, device: torch.device, cfg: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"config": cfg}
    try:
        t0 = time.perf_counter()
        c.fill_(math.nan)
        launch()
        torch.cuda.synchronize(device)
        row["first_call_secs"] = round(time.perf_counter() - t0, 3)
        err = float((c.float() - ref).norm() / ref.norm())
        row["relative_error"] = err
        if not err < 1e-2:
            row["error"] = f"relative error {err}"
            return row
        row["us"] = timed(launch, device) * 1e6
    except Exception as exc:  # a config that fails to compile or launch costs its row
        row["error"] = f"{type(exc).__name__}: {exc}"[:400]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--secs-per-shape", type=float, default=100.0)
    args = parser.parse_args()
    device = torch.device("cuda")
    report: dict[str, Any] = {"probe": "bmm_tma", "device": torch.cuda.get_device_name(device),
                              "torch": torch.__version__, "rows": []}  # fmt: skip
    for name, (batch, m, n, k) in SHAPES.items():
        g = torch.Generator(device=device).manual_seed(5)
        a = torch.empty(batch, m, k, device=device, dtype=torch.float16).uniform_(
            -1, 1, generator=g
        )
        b = torch.empty(batch, k, n, device=device, dtype=torch.float16).uniform_(
            -1, 1, generator=g
        )
        c = torch.empty(batch, m, n, device=device, dtype=torch.float16)
        ref = a.float() @ b.float()
        vendor = [timed(lambda: torch.bmm(a, b, out=c), device) * 1e6]
        tile, major = POINTER[name]
        pcfg = {**dict(zip(POINTER_KEYS, tile, strict=True)), "BATCH_MAJOR": major}
        pointer = run(bmm_launch(a, b, c, pcfg, False), c, ref, device, pcfg)
        started = time.perf_counter()
        results = []
        for cfg in configs(m, n, k):
            if time.perf_counter() - started > args.secs_per_shape:
                break
            results.append(run(tma_launch(a, b, c, cfg), c, ref, device, cfg))
        vendor.append(timed(lambda: torch.bmm(a, b, out=c), device) * 1e6)
        best_vendor = min(vendor)
        good = sorted((r for r in results if "us" in r), key=lambda r: r["us"])
        row = {
            "name": name,
            "cublas_us": vendor,
            "pointer": pointer,
            "pointer_vs_cublas": best_vendor / pointer["us"] if "us" in pointer else None,
            "tma_tried": len(results),
            "tma_failed": sum(1 for r in results if "us" not in r),
            "best_tma": good[0] if good else None,
            "best_tma_vs_cublas": best_vendor / good[0]["us"] if good else None,
            "results": results,
        }
        report["rows"].append(row)
        print(f"{name}: cublas {best_vendor:.2f} us, pointer {pointer.get('us', math.nan):.2f} us, "
              f"best tma {good[0]['us'] if good else math.nan:.2f} us "
              f"({row['best_tma_vs_cublas']}); {len(results)} tried, "
              f"{row['tma_failed']} failed", flush=True)  # fmt: skip
        for r in good[:4]:
            print("   ", round(r["us"], 2), r["config"], flush=True)
        failed = [r for r in results if "us" not in r]
        if failed:
            print("    first failure:", failed[0]["config"], failed[0].get("error"), flush=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
