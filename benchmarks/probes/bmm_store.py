"""Probe: where LLaMA's scores products (Q.K^T: batch x N x N x 128, fp16) lose to cuBLAS.

The suite's tuned ``bmm_kernel`` runs them at 0.63-0.72x of torch.bmm from 1,024 tokens up;
the output (N x N a head) is 16-64x the bytes read, so the store decides. Variants, each on
every shape, checked against a float32 product into a NaN-poisoned output and timed by
tunehub's policy (L2 flushed, CUDA-graph replay, median), torch.bmm timed before and after:

- ``pointer``: ``bmm_kernel`` with the suite's tuned configs (pointer loads and stores).
- ``pst``: the same pointer loads, C written through a 3-D TMA descriptor (one entry a box).
- ``pers``: persistent (one program per SM, or two), A, B and C through 3-D TMA descriptors,
  the tile loop flattened or not, the store of a tile as one box or two halves (``SUB``) or
  through pointers (``STORE_TMA`` off); ``WS``: Triton's warp specialisation of the loop.

    PYTHONPATH=. python3 benchmarks/probes/bmm_store.py --out "$OUT/bmm_store.json"
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
from tunehub.kernels.triton_bmm_kernels import bmm_launch
from tunehub.kernels.triton_gemm_kernels import _tile_coords

SHAPES = {  # name: (batch, m, n, k)
    "llama-scores-1024": (32, 1024, 1024, 128),
    "llama-scores-2048": (32, 2048, 2048, 128),
    "llama-scores-4096": (32, 4096, 4096, 128),
    "llama-scores-8192": (16, 8192, 8192, 128),
}
KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages")
POINTER = [  # the suite's tuned configs (operators-bmm-llama-full-h200-20261127T01*.json)
    (64, 128, 64, 8, 4, 2),
    (128, 128, 64, 8, 8, 3),
    (128, 256, 64, 8, 8, 3),
]


@triton.jit
def bmm_pst_kernel(a_ptr, b_ptr, c_desc, M, N, K, sab, sam, sak, sbb, sbk, sbn,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   GROUP_M: tl.constexpr):  # type: ignore[no-untyped-def]  # fmt: skip
    pid = tl.program_id(0)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    entry = pid // (grid_m * grid_n)
    pid_m, pid_n = _tile_coords(pid % (grid_m * grid_n), grid_m, grid_n, GROUP_M)
    e = entry.to(tl.int64)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + e * sab + rm[:, None].to(tl.int64) * sam + rk[None, :] * sak
    b_ptrs = b_ptr + e * sbb + rk[:, None].to(tl.int64) * sbk + rn[None, :] * sbn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kk in range(0, tl.cdiv(K, BLOCK_K)):
        left = K - kk * BLOCK_K
        a = tl.load(a_ptrs, mask=(rm[:, None] < M) & (rk[None, :] < left), other=0.0)
        b = tl.load(b_ptrs, mask=(rk[:, None] < left) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * sak
        b_ptrs += BLOCK_K * sbk
    c_desc.store([entry, pid_m * BLOCK_M, pid_n * BLOCK_N],
                 acc.to(c_desc.dtype).reshape(1, BLOCK_M, BLOCK_N))  # fmt: skip


@triton.jit
def bmm_pers_kernel(a_desc, b_desc, c_desc, c_ptr, M, N, K, BATCH, scb, scm,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    GROUP_M: tl.constexpr, FLATTEN: tl.constexpr, SUB: tl.constexpr,
                    STORE_TMA: tl.constexpr, DEVICE_DESC: tl.constexpr,
                    WS: tl.constexpr):  # type: ignore[no-untyped-def]  # fmt: skip
    if DEVICE_DESC:  # ``a_desc`` etc. are the tensors: descriptors built here (for WS)
        a_desc = tl.make_tensor_descriptor(a_desc, shape=[BATCH, M, K], strides=[M * K, K, 1],
                                           block_shape=[1, BLOCK_M, BLOCK_K])  # fmt: skip
        b_desc = tl.make_tensor_descriptor(b_desc, shape=[BATCH, K, N], strides=[K * N, N, 1],
                                           block_shape=[1, BLOCK_K, BLOCK_N])  # fmt: skip
        c_desc = tl.make_tensor_descriptor(c_desc, shape=[BATCH, M, N], strides=[M * N, N, 1],
                                           block_shape=[1, BLOCK_M, BLOCK_N])  # fmt: skip
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    per_entry = grid_m * grid_n
    total = per_entry * BATCH
    k_tiles = tl.cdiv(K, BLOCK_K)
    for t in tl.range(tl.program_id(0), total, tl.num_programs(0), flatten=FLATTEN,
                      warp_specialize=WS):  # fmt: skip
        entry = t // per_entry
        pid_m, pid_n = _tile_coords(t % per_entry, grid_m, grid_n, GROUP_M)
        m0 = pid_m * BLOCK_M
        n0 = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kk in range(k_tiles):
            a = a_desc.load([entry, m0, kk * BLOCK_K]).reshape(BLOCK_M, BLOCK_K)
            b = b_desc.load([entry, kk * BLOCK_K, n0]).reshape(BLOCK_K, BLOCK_N)
            acc = tl.dot(a, b, acc)
        if STORE_TMA:
            c = acc.to(c_desc.dtype)
            if SUB:
                c0, c1 = c.reshape(BLOCK_M, 2, BLOCK_N // 2).permute(0, 2, 1).split()
                c_desc.store([entry, m0, n0], c0.reshape(1, BLOCK_M, BLOCK_N // 2))
                c_desc.store([entry, m0, n0 + BLOCK_N // 2],
                             c1.reshape(1, BLOCK_M, BLOCK_N // 2))  # fmt: skip
            else:
                c_desc.store([entry, m0, n0], c.reshape(1, BLOCK_M, BLOCK_N))
        else:
            rm = m0 + tl.arange(0, BLOCK_M)
            rn = n0 + tl.arange(0, BLOCK_N)
            ptrs = c_ptr + entry.to(tl.int64) * scb + rm[:, None].to(tl.int64) * scm + rn[None, :]
            tl.store(ptrs, acc.to(c_ptr.dtype.element_ty),
                     mask=(rm[:, None] < M) & (rn[None, :] < N))  # fmt: skip


def desc(t: Any, box: list[int]) -> Any:
    return TensorDescriptor(t, list(t.shape), list(t.stride()), box)


def pst_launch(a: Any, b: Any, c: Any, cfg: dict[str, Any]) -> Any:
    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    batch, m, k = a.shape
    n = b.shape[-1]
    cd = desc(c, [1, bm, bn])
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn) * batch,)
    meta = {key: cfg[key] for key in KEYS}
    args = (a, b, cd, m, n, k, *a.stride(), *b.stride())

    def launch() -> None:
        bmm_pst_kernel[grid](*args, **meta)

    return launch


def pers_launch(a: Any, b: Any, c: Any, cfg: dict[str, Any], sms: int) -> Any:
    bm, bn, bk = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
    batch, m, k = a.shape
    n = b.shape[-1]
    sub = cfg["SUB"]
    ws = cfg.get("WS", False)
    if ws:
        ad, bd, cd = a, b, c
    else:
        ad, bd = desc(a, [1, bm, bk]), desc(b, [1, bk, bn])
        cd = desc(c, [1, bm, bn // 2 if sub else bn])
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn) * batch
    grid = (min(tiles, sms * cfg["PROGRAMS"]),)
    meta = {key: cfg[key] for key in KEYS}
    flags = {"FLATTEN": cfg["FLATTEN"], "SUB": sub, "STORE_TMA": cfg.get("STORE_TMA", True),
             "DEVICE_DESC": ws, "WS": ws}  # fmt: skip

    def launch() -> None:
        bmm_pers_kernel[grid](ad, bd, cd, c, m, n, k, batch, c.stride(0), c.stride(1),
                              **meta, **flags)  # fmt: skip

    return launch


def pst_configs() -> list[dict[str, Any]]:
    return []  # run 1 (bmm_store-h200-20261127T0520): no gain over pointer stores


def pers_configs() -> list[dict[str, Any]]:
    # Run 2: flattened only (run 1: unflattened 0.59-0.72x), TMA and pointer stores, 256-row
    # tiles, the tile order; warp specialisation last (unflattened, 4 warps, device
    # descriptors: Triton 3.6's limits for it on sm_90).
    out = []
    for (bm, bn, w), (bk, s), g, store in itertools.product(
        ((128, 256, 8), (256, 128, 8), (128, 128, 4), (128, 128, 8), (256, 256, 8)),
        ((64, 3), (64, 4), (128, 2), (64, 2), (32, 4)), (8, 1, 32), (True, False),
    ):  # fmt: skip
        staging = bm * bn * 2 if store else 0
        if (bm + bn) * bk * 2 * s + staging > 225_000 or bm * bn / (32 * w) > 256:
            continue
        if g != 8 and (bm, bn, bk, s) != (128, 256, 64, 3):
            continue
        out.append({**dict(zip(KEYS, (bm, bn, bk, g, w, s), strict=True)),
                    "FLATTEN": True, "SUB": False, "PROGRAMS": 1, "STORE_TMA": store})  # fmt: skip
    for bn, s in ((128, 3), (256, 2), (128, 4), (256, 3)):
        out.append({**dict(zip(KEYS, (128, bn, 64, 8, 4, s), strict=True)), "FLATTEN": False,
                    "SUB": False, "PROGRAMS": 1, "STORE_TMA": True, "WS": True})  # fmt: skip
    return out


def timed(call: Any, device: torch.device) -> float:
    t = time_gpu(call, min_secs=0.05, max_repeats=200, device=device)
    secs = sorted(t.repeat_secs)
    return secs[len(secs) // 2]


def cublas_us(a: Any, b: Any, c: Any, device: torch.device) -> float:
    return timed(lambda: torch.bmm(a, b, out=c), device) * 1e6


def run(launch: Any, c: Any, ref: Any, device: torch.device) -> dict[str, Any]:
    row: dict[str, Any] = {}
    try:
        c.fill_(math.nan)
        launch()
        torch.cuda.synchronize(device)
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
    parser.add_argument("--secs", type=float, default=420.0, help="stop starting configs after")
    args = parser.parse_args()
    device = torch.device("cuda")
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    started = time.perf_counter()
    report: dict[str, Any] = {"probe": "bmm_store", "device": torch.cuda.get_device_name(device),
                              "torch": torch.__version__, "triton": triton.__version__,
                              "shapes": {}}  # fmt: skip
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                                 device=device))  # fmt: skip
    ops = {}
    for name, (batch, m, n, k) in SHAPES.items():
        g = torch.Generator(device=device).manual_seed(5)
        half = {"device": device, "dtype": torch.float16}
        a = torch.empty(batch, m, k, **half).uniform_(-1, 1, generator=g)
        b = torch.empty(batch, k, n, **half).uniform_(-1, 1, generator=g)
        c = torch.empty(batch, m, n, device=device, dtype=torch.float16)
        ref = (a.float() @ b.float()).half().float()
        ops[name] = (a, b, c, ref)
        cublas = cublas_us(a, b, c, device)
        report["shapes"][name] = {"cublas_us": [cublas], "rows": []}
        print(f"{name}: cublas {cublas:.1f} us", flush=True)

    def each_shape(kind: str, cfg: dict[str, Any], make: Any) -> None:
        for name, (a, b, c, ref) in ops.items():
            row = {"kind": kind, "config": cfg, **run(make(a, b, c), c, ref, device)}
            report["shapes"][name]["rows"].append(row)

    for t in POINTER:
        cfg = {**dict(zip(KEYS, t, strict=True)), "BATCH_MAJOR": True}
        each_shape("pointer", cfg, lambda a, b, c, cfg=cfg: bmm_launch(a, b, c, cfg, False))
    todo = [("pst", c) for c in pst_configs()] + [("pers", c) for c in pers_configs()]
    print(f"{len(todo)} TMA-store configs", flush=True)
    for kind, cfg in todo:
        if time.perf_counter() - started > args.secs:
            report["stopped_early"] = f"after {args.secs} s"
            break
        if kind == "pst":
            each_shape(kind, cfg, lambda a, b, c, cfg=cfg: pst_launch(a, b, c, cfg))
        else:
            each_shape(kind, cfg, lambda a, b, c, cfg=cfg: pers_launch(a, b, c, cfg, sms))
        with open(args.out, "w") as f:  # kept should a later config hang the GPU
            json.dump(report, f, indent=1)
    for name, (a, b, c, _) in ops.items():
        entry = report["shapes"][name]
        entry["cublas_us"].append(cublas_us(a, b, c, device))
        best = min(entry["cublas_us"])
        good = sorted((r for r in entry["rows"] if "us" in r), key=lambda r: r["us"])
        print(f"{name}: cublas {entry['cublas_us']}, {len(entry['rows'])} rows, "
              f"{sum('error' in r for r in entry['rows'])} failed", flush=True)  # fmt: skip
        for kind in ("pointer", "pst", "pers"):
            mine = [r for r in good if r["kind"] == kind][:3]
            for r in mine:
                print(f"   {kind:8s} {r['us']:8.1f} us {best / r['us']:.3f}x {r['config']}",
                      flush=True)  # fmt: skip
        bad = [r for r in entry["rows"] if "error" in r]
        if bad:
            print("   first failure:", bad[0]["config"], bad[0]["error"], flush=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
