"""Probe: a grouped GEMM kernel reading A and B through TMA descriptors (A's rows a 2-D box,
each group's B a 3-D box of one group) against torch._grouped_mm and ``grouped_kernel`` with
the suite's tuned configs, on Mixtral's expert GEMMs, no search.

Each config is checked against a float64 reference into a NaN-poisoned output, then timed by
tunehub's policy (L2 flushed, CUDA-graph replay, median); the vendor is timed before and after
each shape's configs and the ratio is against the better of the two.

    PYTHONPATH=. python3 benchmarks/probes/grouped_tma.py --out "$OUT/grouped_tma.json"
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

from tunehub.core import Workload
from tunehub.kernels.gpu_timing import time_gpu
from tunehub.kernels.triton_bmm import grouped_operands, grouped_reference
from tunehub.kernels.triton_bmm_kernels import _swizzle, grouped_launch

SIZES = [0, 152, 156, 164, 171, 179, 187, 15]  # the suite's Mixtral routing of 512 tokens
SHAPES = {"mixtral-up-512": (14336, 4096), "mixtral-down-512": (4096, 14336)}  # (n, k)
KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages")
# The suite's tuned grouped_kernel configs (operators-h200-20261126.json): tile, programs/SM.
POINTER = {
    "mixtral-up-512": ((64, 256, 32, 4, 4, 4), 2),
    "mixtral-down-512": ((128, 256, 32, 4, 8, 4), 4),
}


@triton.jit
def grouped_tma_kernel(a_desc, b_desc, c_ptr, offs_ptr, N, K, G, TILE_BOUND, scm, scn,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       GROUP_M: tl.constexpr):  # type: ignore[no-untyped-def]  # fmt: skip
    grid_n = tl.cdiv(N, BLOCK_N)
    for tile in range(tl.program_id(0), TILE_BOUND, tl.num_programs(0)):
        group = tile * 0
        first = tile * 0
        row0 = tile * 0
        rows = tile * 0
        seen = tile * 0
        for g in range(0, G):
            lo = tl.load(offs_ptr + g)
            hi = tl.load(offs_ptr + g + 1)
            count = tl.cdiv(hi - lo, BLOCK_M) * grid_n
            inside = (tile >= seen) & (tile < seen + count)
            group = tl.where(inside, g, group)
            first = tl.where(inside, seen, first)
            row0 = tl.where(inside, lo, row0)
            rows = tl.where(inside, hi - lo, rows)
            seen += count
        if tile < seen:
            pid_m, pid_n = _swizzle(tile - first, tl.cdiv(rows, BLOCK_M), grid_n, GROUP_M)
            m0 = row0 + pid_m * BLOCK_M
            n0 = pid_n * BLOCK_N
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for kk in range(0, tl.cdiv(K, BLOCK_K)):
                # Rows past the group are the next group's (or zeros past A): computed, not
                # stored.
                a = a_desc.load([m0, kk * BLOCK_K])
                b = b_desc.load([group, kk * BLOCK_K, n0]).reshape(BLOCK_K, BLOCK_N)
                acc = tl.dot(a, b, acc)
            rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            rn = n0 + tl.arange(0, BLOCK_N)
            c = c_ptr + (row0 + rm)[:, None].to(tl.int64) * scm + rn[None, :] * scn
            tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=(rm[:, None] < rows) & (rn[None, :] < N))


def configs() -> list[dict[str, Any]]:
    out = []
    for (bm, bn), bk, (w, s), progs in itertools.product(
        ((64, 256), (128, 128), (128, 256), (64, 128)), (32, 64), ((4, 4), (8, 3), (8, 4)),
        (1, 2),
    ):  # fmt: skip
        if bm * bn / (32 * w) > 256 or (bm + bn) * bk * 2 * s > 220_000:
            continue
        out.append({**dict(zip(KEYS, (bm, bn, bk, 4, w, s), strict=True)), "PROGRAMS": progs})
    return out


def timed(call: Any, device: torch.device) -> float:
    t = time_gpu(call, min_secs=0.1, max_repeats=200, device=device)
    secs = sorted(t.repeat_secs)
    return secs[len(secs) // 2]


def tma_launch(ops: Any, cfg: dict[str, Any], sms: int) -> Any:
    a, b, out, offsets = ops.a, ops.b, ops.out, ops.offsets
    m, k = a.shape
    groups, _, n = b.shape
    bm, bn, bk = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
    ad = TensorDescriptor(a, [m, k], list(a.stride()), [bm, bk])
    bd = TensorDescriptor(b, [groups, k, n], list(b.stride()), [1, bk, bn])
    bound = (triton.cdiv(m, bm) + groups) * triton.cdiv(n, bn)
    grid = (min(bound, sms * cfg["PROGRAMS"]),)
    meta = {key: cfg[key] for key in KEYS}

    def launch() -> None:
        grouped_tma_kernel[grid](ad, bd, out, offsets, n, k, groups, bound, *out.stride(), **meta)

    return launch


def run(launch: Any, ops: Any, ref: Any, device: torch.device, cfg: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"config": cfg}
    try:
        t0 = time.perf_counter()
        ops.out.fill_(math.nan)
        launch()
        torch.cuda.synchronize(device)
        row["first_call_secs"] = round(time.perf_counter() - t0, 3)
        err = float((ops.out.double() - ref).norm() / ref.norm())
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
    parser.add_argument("--secs-per-shape", type=float, default=150.0)
    args = parser.parse_args()
    device = torch.device("cuda")
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    report: dict[str, Any] = {"probe": "grouped_tma", "device": torch.cuda.get_device_name(device),
                              "torch": torch.__version__, "rows": []}  # fmt: skip
    for name, (n, k) in SHAPES.items():
        wl = Workload.from_dict({"op": "grouped_mm", "m": sum(SIZES), "n": n, "k": k,
                                 "group_sizes": SIZES, "dtype": "float16"})  # fmt: skip
        ops = grouped_operands(wl, device, 5)
        ref = grouped_reference(ops)
        a, b, offsets = ops.a, ops.b, ops.offsets[1:]

        def vendor_call() -> Any:
            return torch._grouped_mm(a, b, offs=offsets)

        vendor = [timed(vendor_call, device) * 1e6]
        tile, progs = POINTER[name]
        pcfg = {**dict(zip(KEYS, tile, strict=True)), "SCHEDULE": "persistent", "PROGRAMS": progs}
        pointer = run(grouped_launch(a, b, ops.out, ops.offsets, pcfg, False, sms), ops, ref,
                      device, pcfg)  # fmt: skip
        started = time.perf_counter()
        results = []
        for cfg in configs():
            if time.perf_counter() - started > args.secs_per_shape:
                break
            results.append(run(tma_launch(ops, cfg, sms), ops, ref, device, cfg))
        vendor.append(timed(vendor_call, device) * 1e6)
        best = min(vendor)
        good = sorted((r for r in results if "us" in r), key=lambda r: r["us"])
        row = {
            "name": name,
            "vendor_us": vendor,
            "pointer": pointer,
            "pointer_vs_vendor": best / pointer["us"] if "us" in pointer else None,
            "tma_tried": len(results),
            "tma_failed": sum(1 for r in results if "us" not in r),
            "best_tma": good[0] if good else None,
            "best_tma_vs_vendor": best / good[0]["us"] if good else None,
            "results": results,
        }
        report["rows"].append(row)
        print(f"{name}: vendor {best:.1f} us, pointer {pointer.get('us', math.nan):.1f} us "
              f"({row['pointer_vs_vendor']}), best tma "
              f"{good[0]['us'] if good else math.nan:.1f} us ({row['best_tma_vs_vendor']}); "
              f"{len(results)} tried, {row['tma_failed']} failed", flush=True)  # fmt: skip
        for r in good[:4]:
            print("   ", round(r["us"], 1), r["config"], flush=True)
        failed = [r for r in results if "us" not in r]
        if failed:
            print("    first failure:", failed[0]["config"], failed[0].get("error"), flush=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
