"""Probe: composite tiles (a tile edge that is the sum of two powers of two, such as 192 = 128 +
64 or 80 = 64 + 16) on the shapes whose power-of-two tiles leave the H100's SMs idle.

``benchmarks/probes/gpu_waves.py`` showed (H100, 2026-11-25) that cuBLAS answers these shapes with
tiles no power of two: 3000x1000x4000 with a 192x128 tile (16x8 = 128 tiles for 132 SMs, where
tunehub's 128x256 makes 96), 1536^3 bf16 with 144x128 (132 tiles), 127x5000x2048 with 64x80
(126 tiles). Triton's blocks must be powers of two, but a program can hold two accumulators:
a 192-row tile is a 128-row and a 64-row block sharing the B tile each K step (two ``tl.dot``
a step), an 80-column one a 64- and a 16-column block sharing the A tile.

The kernel here is tunehub's ``tiled`` kernel (sizes and strides as constants, grouped tile
order, wrapped edge rows, no split-K) with that one change; it is timed against the search's
pick, the same kernel on power-of-two tiles and cuBLAS, by tunehub's policy
(``tunehub.kernels.gpu_timing``: L2 flushed before each repeat, CUDA-graph replay, median) in
alternating rounds, after a check against a float64 reference into a NaN-poisoned C.

    PYTHONPATH=. python3 benchmarks/probes/gpu_composite.py --out "$OUT/gpu_composite.json"
    TRITON_INTERPRET=1 python3 benchmarks/probes/gpu_composite.py --interpret   # CPU correctness
"""

# mypy: disable-error-code="untyped-decorator,no-untyped-def"
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))  # the other probes
sys.path.insert(0, str(HERE.parent))  # benchmarks/ (triton_kernel_check)
sys.path.insert(0, str(ROOT))  # the repository (tunehub)

if "--interpret" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from tunehub.kernels.triton_gemm_kernels import _tile_coords  # noqa: E402


def split_edge(edge: int) -> tuple[int, int]:
    """``edge`` as (a power of two, a smaller power of two or 0): 192 -> (128, 64)."""
    big = 1 << (edge.bit_length() - 1)
    rest = edge - big
    if rest and rest & (rest - 1):
        raise ValueError(f"tile edge {edge} is not the sum of two powers of two")
    return big, rest


@triton.jit
def _rows(start, SIZE: tl.constexpr, BLOCK: tl.constexpr):
    offs = start + tl.arange(0, BLOCK)
    if SIZE % BLOCK == 0:
        offs = tl.max_contiguous(tl.multiple_of(offs, BLOCK), BLOCK)
    else:
        offs = offs % SIZE
    return offs


@triton.jit
def _store(c_ptr, acc, start_m, start_n, M, N, stride_cm, BM: tl.constexpr, BN: tl.constexpr):
    offs_m = start_m + tl.arange(0, BM)
    offs_n = start_n + tl.arange(0, BN)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :]
    tl.store(ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def composite_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    M: tl.constexpr,
    N: tl.constexpr,
    K: tl.constexpr,
    stride_am: tl.constexpr,
    stride_ak: tl.constexpr,
    stride_bk: tl.constexpr,
    stride_bn: tl.constexpr,
    stride_cm: tl.constexpr,
    BM0: tl.constexpr,
    BM1: tl.constexpr,
    BN0: tl.constexpr,
    BN1: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    # A tile of (BM0 + BM1) x (BN0 + BN1) with at most one of BM1, BN1 non-zero: the second
    # block shares the first's A (or B) tile every K step.
    BLOCK_M: tl.constexpr = BM0 + BM1
    BLOCK_N: tl.constexpr = BN0 + BN1
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = _tile_coords(pid, num_pid_m, num_pid_n, GROUP_M)
    m0 = pid_m * BLOCK_M
    n0 = pid_n * BLOCK_N
    rm0 = _rows(m0, M, BM0)
    rn0 = _rows(n0, N, BN0)
    offs_k = tl.arange(0, BLOCK_K)
    acc00 = tl.zeros((BM0, BN0), dtype=tl.float32)
    if BM1 > 0:
        rm1 = _rows(m0 + BM0, M, BM1)
        acc10 = tl.zeros((BM1, BN0), dtype=tl.float32)
    if BN1 > 0:
        rn1 = _rows(n0 + BN0, N, BN1)
        acc01 = tl.zeros((BM0, BN1), dtype=tl.float32)
    EVEN_K: tl.constexpr = K % BLOCK_K == 0
    for kt in range(tl.cdiv(K, BLOCK_K)):
        kk = kt * BLOCK_K + offs_k
        a0 = tl.load(
            a_ptr + rm0[:, None] * stride_am + kk[None, :] * stride_ak,
            mask=None if EVEN_K else kk[None, :] < K,
            other=None if EVEN_K else 0.0,
        )
        b0 = tl.load(
            b_ptr + kk[:, None] * stride_bk + rn0[None, :] * stride_bn,
            mask=None if EVEN_K else kk[:, None] < K,
            other=None if EVEN_K else 0.0,
        )
        acc00 = tl.dot(a0, b0, acc00)
        if BM1 > 0:
            a1 = tl.load(
                a_ptr + rm1[:, None] * stride_am + kk[None, :] * stride_ak,
                mask=None if EVEN_K else kk[None, :] < K,
                other=None if EVEN_K else 0.0,
            )
            acc10 = tl.dot(a1, b0, acc10)
        if BN1 > 0:
            b1 = tl.load(
                b_ptr + kk[:, None] * stride_bk + rn1[None, :] * stride_bn,
                mask=None if EVEN_K else kk[:, None] < K,
                other=None if EVEN_K else 0.0,
            )
            acc01 = tl.dot(a0, b1, acc01)
    _store(c_ptr, acc00, m0, n0, M, N, stride_cm, BM0, BN0)
    if BM1 > 0:
        _store(c_ptr, acc10, m0 + BM0, n0, M, N, stride_cm, BM1, BN0)
    if BN1 > 0:
        _store(c_ptr, acc01, m0, n0 + BN0, M, N, stride_cm, BM0, BN1)


def composite(a: Any, b: Any, out: Any, tile: dict[str, int]) -> Any:
    """A launcher for ``composite_kernel``: C = A @ B."""
    m, k = a.shape
    n = b.shape[1]
    bm0, bm1 = split_edge(tile["BLOCK_M"])
    bn0, bn1 = split_edge(tile["BLOCK_N"])
    if bm1 and bn1:
        raise ValueError("only one edge of a tile may be composite")
    grid = (math.ceil(m / tile["BLOCK_M"]) * math.ceil(n / tile["BLOCK_N"]),)

    def call() -> Any:
        composite_kernel[grid](
            a,
            b,
            out,
            m,
            n,
            k,
            a.stride(0),
            a.stride(1),
            b.stride(0),
            b.stride(1),
            out.stride(0),
            bm0,
            bm1,
            bn0,
            bn1,
            tile["BLOCK_K"],
            tile["GROUP_M"],
            num_warps=tile["num_warps"],
            num_stages=tile["num_stages"],
            num_ctas=tile.get("num_ctas", 1),
        )
        return out

    return call


def tile(bm: int, bn: int, bk: int, group: int, warps: int, stages: int) -> dict[str, int]:
    return {
        "BLOCK_M": bm,
        "BLOCK_N": bn,
        "BLOCK_K": bk,
        "GROUP_M": group,
        "num_warps": warps,
        "num_stages": stages,
    }


# Per shape (M, N, K, dtype), the contenders: ("pick", tunehub config) is the search's pick
# of 2026-11-24 through tunehub's own kernels; ("composite", tile) runs the kernel above.
CASES: list[tuple[tuple[int, int, int, str], list[tuple[str, dict[str, Any]]]]] = [
    (
        (3000, 1000, 4000, "float16"),
        [
            ("pick", {"variant": "tma", **tile(128, 256, 64, 8, 8, 4), "SPLIT_K": 1}),
            ("composite", tile(192, 128, 64, 8, 4, 4)),
            ("composite", tile(192, 128, 64, 8, 4, 3)),
            ("composite", tile(192, 128, 64, 4, 4, 4)),
            ("composite", tile(192, 128, 128, 8, 4, 2)),
            ("composite", {**tile(192, 128, 64, 8, 4, 4), "num_ctas": 2}),
            ("composite", {**tile(128, 256, 64, 8, 8, 4), "num_ctas": 2}),
            ("composite", tile(192, 64, 64, 8, 4, 4)),
            ("composite", tile(96, 128, 64, 8, 4, 4)),
        ],
    ),
    (
        (1536, 1536, 1536, "bfloat16"),
        [
            ("pick", {"variant": "tiled", **tile(64, 128, 64, 4, 4, 3), "SPLIT_K": 1}),
            ("composite", tile(192, 128, 64, 8, 4, 4)),
            ("composite", tile(128, 192, 64, 8, 4, 4)),
            ("composite", {**tile(128, 128, 64, 8, 8, 4), "num_ctas": 2}),
        ],
    ),
    (
        (4096, 4096, 4096, "float16"),
        [
            ("pick", {"variant": "tma", **tile(128, 256, 64, 4, 8, 4), "SPLIT_K": 1}),
            ("composite", tile(192, 128, 64, 8, 4, 4)),
            ("composite", {**tile(128, 256, 64, 8, 8, 4), "num_ctas": 2}),
        ],
    ),
]
INTERPRET_CASES: list[tuple[tuple[int, int, int, str], list[tuple[str, dict[str, Any]]]]] = [
    (
        (50, 70, 80, "float16"),
        [
            ("pick", {"variant": "tiled", **tile(16, 32, 32, 4, 4, 2), "SPLIT_K": 1}),
            ("composite", tile(48, 32, 32, 4, 4, 2)),
            ("composite", tile(16, 48, 32, 4, 4, 2)),
            ("composite", tile(32, 40, 32, 4, 4, 2)),
        ],
    ),
]


def describe(kind: str, c: dict[str, Any]) -> str:
    name = c.get("variant", kind)
    return (
        f"{name} {c['BLOCK_M']}x{c['BLOCK_N']}x{c['BLOCK_K']} g{c['GROUP_M']} "
        f"w{c['num_warps']} s{c['num_stages']}"
    ) + (f" ctas{c['num_ctas']}" if c.get("num_ctas", 1) > 1 else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--min-secs", type=float, default=0.1)
    parser.add_argument("--interpret", action="store_true", help="CPU, Triton's interpreter")
    args = parser.parse_args()

    from gpu_waves import git_commit, library_kernels

    from tunehub.core import Workload
    from tunehub.kernels import gpu_reference as ref
    from tunehub.kernels import triton_gemm_kernels as kernels
    from tunehub.kernels.gpu_timing import gpu_environment, time_gpu

    start = time.monotonic()
    device = torch.device("cpu") if args.interpret else torch.device("cuda")
    sms = 4 if args.interpret else torch.cuda.get_device_properties(device).multi_processor_count
    report: dict[str, Any] = {
        "benchmark": "gpu_composite",
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "commit": os.environ.get("TUNEHUB_COMMIT") or git_commit(),
        "environment": gpu_environment(device),
        "host": platform.node(),
        "timing": {"rounds": args.rounds, "min_secs_per_round": args.min_secs},
        "cases": [],
    }
    failures = 0
    lines = []
    for (m, n, k, dtype), contenders in INTERPRET_CASES if args.interpret else CASES:
        workload = Workload(m=m, n=n, k=k, dtype=dtype, b_layout="col_major")
        ops = ref.operands(workload, device, seed=99)
        expected = ref.reference(ops, workload.epilogue)
        runs: list[dict[str, Any]] = []
        for kind, c in [*contenders, ("cuBLAS", {})]:
            row: dict[str, Any] = {"kind": kind, "config": c, "round_secs": []}
            runs.append(row)
            out = torch.full_like(ops.out, math.nan)
            try:
                if kind == "cuBLAS":

                    def call(out: Any = out, ops: Any = ops) -> Any:
                        return torch.matmul(ops.a, ops.b, out=out)

                    row["name"] = "cuBLAS"
                elif kind == "pick":
                    call = kernels.bind(ops.a, ops.b, None, out, config=c, num_sms=sms)
                    row["name"] = describe(kind, c)
                else:
                    call = composite(ops.a, ops.b, out, c)
                    row["name"] = describe(kind, c)
                call()
                if device.type == "cuda":
                    torch.cuda.synchronize()
            except Exception as exc:  # a contender's failure is data here
                row["error"] = f"{type(exc).__name__}: {str(exc)[-400:]}"
                failures += 1
                continue
            checked = ref.check(out, expected, workload)
            row["relative_error"] = checked.relative_error
            if not checked.ok:
                row["error"] = checked.message
                failures += 1
                continue
            row["call"] = call
            if kind == "cuBLAS" and device.type == "cuda":
                row["kernels"] = library_kernels(call, device)
        live = [r for r in runs if "call" in r]
        for _ in range(args.rounds):
            for r in live:
                timed = time_gpu(r["call"], min_secs=args.min_secs, max_repeats=400, device=device)
                r["round_secs"].append(statistics.median(timed.repeat_secs))
        flops = 2.0 * m * n * k
        lib = next((r for r in live if r["kind"] == "cuBLAS"), None)
        pick = next((r for r in live if r["kind"] == "pick"), None)
        lines.append(f"== {m}x{n}x{k} {dtype}  {' / '.join(lib.get('kernels', [])) if lib else ''}")
        for r in sorted(runs, key=lambda r: statistics.median(r["round_secs"] or [math.inf])):
            r.pop("call", None)
            if not r["round_secs"]:
                lines.append(
                    f"   {r.get('name', r['kind']):>34}  failed: {r.get('error', '')[:160]}"
                )
                continue
            secs = statistics.median(r["round_secs"])
            r["tflops"] = flops / secs / 1e12
            rel = {
                "x cuBLAS": statistics.median(lib["round_secs"]) / secs if lib else math.nan,
                "x pick": statistics.median(pick["round_secs"]) / secs if pick else math.nan,
            }
            r.update({key.replace(" ", "_"): v for key, v in rel.items()})
            lines.append(
                f"   {r['name']:>34} {r['tflops']:7.1f} TFLOP/s  x cuBLAS {rel['x cuBLAS']:5.3f}"
                f"  x pick {rel['x pick']:5.3f}  rounds "
                + " ".join(f"{s * 1e6:.1f}" for s in r["round_secs"])
            )
        report["cases"].append({"shape": [m, n, k], "dtype": dtype, "contenders": runs})
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print("\n".join(lines))
    report.update(date=datetime.now(UTC).isoformat(), wall_secs=time.monotonic() - start)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1, default=str))
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
