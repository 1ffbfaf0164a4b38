"""Probe: three kernels for the shapes still below cuBLAS, beside the search's pick.

- ``ncomp``: a tile whose N edge is two TMA boxes (BLOCK_N = BN0 + BN1, e.g. 80 = 64 + 16)
  sharing each A tile: cuBLAS runs 127x5000x2048 with 64x80 tiles (its M is our N: 126 tiles
  for 132 SMs) where our power-of-two tiles make 80 (64x128) or 158 (64x64).
- ``mcomp``: the M edge as two boxes, 144 = 128 + 16 (cuBLAS's 1536^3 bf16 tile: 132 tiles
  where 192x128 makes 96); the 16-row block is below wgmma's 64 rows (an mma.sync dot).
- ``splitk_tma``: the template's one-kernel split-K (last arriver sums the fp32 partials in
  slot order, resets the counter) with its operands loaded through TMA descriptors instead of
  pointers, for 256x256x65536 (16 tiles of 64x64 split 8 ways).

The kernels are here, not in the template, until they win. Each contender is checked against
a float64 reference into a NaN-poisoned C, then timed by tunehub's policy (L2 flushed, CUDA
graph replay, median) in alternating rounds (``gpu_splitk.run_shape``). A row-major, B
column-major (a linear layer's weight).

    PYTHONPATH=. python3 benchmarks/probes/gpu_skinny.py --out "$OUT/gpu_skinny.json"
    python3 benchmarks/probes/gpu_skinny.py --dry-run
"""

# mypy: disable-error-code="untyped-decorator,no-untyped-def"
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the other probes
sys.path.insert(0, str(HERE.parent))  # benchmarks/ (triton_kernel_check)
sys.path.insert(0, str(HERE.parents[1]))  # the repository (tunehub)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from gpu_splitk import Contender, report_head, run_shape, write_report  # noqa: E402

from tunehub.kernels.triton_gemm_kernels import _descriptor, _tile_coords  # noqa: E402


@triton.jit
def _store(c_ptr, acc, off_m, off_n, M, N, stride_cm, BM: tl.constexpr, BN: tl.constexpr):
    offs_m = off_m + tl.arange(0, BM)
    offs_n = off_n + tl.arange(0, BN)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :],
             acc.to(c_ptr.dtype.element_ty), mask=mask)  # fmt: skip


@triton.jit
def ncomp_kernel(
    a_desc,
    b0_desc,
    b1_desc,
    c_ptr,
    M: tl.constexpr,
    N: tl.constexpr,
    K: tl.constexpr,
    stride_cm: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BN0: tl.constexpr,
    BN1: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    # One program per BLOCK_M x (BN0 + BN1) tile; B is described as its row-major transpose
    # (N x K), so each loaded box is transposed back.
    BLOCK_N: tl.constexpr = BN0 + BN1
    pid = tl.program_id(0)
    pid_m, pid_n = _tile_coords(pid, tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N
    acc0 = tl.zeros((BLOCK_M, BN0), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_M, BN1), dtype=tl.float32)
    for kt in range(tl.cdiv(K, BLOCK_K)):
        off_k = kt * BLOCK_K
        a = a_desc.load([off_m, off_k])
        acc0 = tl.dot(a, b0_desc.load([off_n, off_k]).T, acc0)
        acc1 = tl.dot(a, b1_desc.load([off_n + BN0, off_k]).T, acc1)
    _store(c_ptr, acc0, off_m, off_n, M, N, stride_cm, BLOCK_M, BN0)
    _store(c_ptr, acc1, off_m, off_n + BN0, M, N, stride_cm, BLOCK_M, BN1)


@triton.jit
def mcomp_kernel(
    a0_desc,
    a1_desc,
    b_desc,
    c_ptr,
    M: tl.constexpr,
    N: tl.constexpr,
    K: tl.constexpr,
    stride_cm: tl.constexpr,
    BM0: tl.constexpr,
    BM1: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    # One program per (BM0 + BM1) x BLOCK_N tile, the M edge two TMA boxes sharing each B tile.
    BLOCK_M: tl.constexpr = BM0 + BM1
    pid = tl.program_id(0)
    pid_m, pid_n = _tile_coords(pid, tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N
    acc0 = tl.zeros((BM0, BLOCK_N), dtype=tl.float32)
    acc1 = tl.zeros((BM1, BLOCK_N), dtype=tl.float32)
    for kt in range(tl.cdiv(K, BLOCK_K)):
        off_k = kt * BLOCK_K
        b = b_desc.load([off_n, off_k]).T
        acc0 = tl.dot(a0_desc.load([off_m, off_k]), b, acc0)
        acc1 = tl.dot(a1_desc.load([off_m + BM0, off_k]), b, acc1)
    _store(c_ptr, acc0, off_m, off_n, M, N, stride_cm, BM0, BLOCK_N)
    _store(c_ptr, acc1, off_m + BM0, off_n, M, N, stride_cm, BM1, BLOCK_N)


@triton.jit
def splitk_tma_kernel(
    a_desc,
    b_desc,
    c_ptr,
    ws_ptr,
    counts_ptr,
    M: tl.constexpr,
    N: tl.constexpr,
    K: tl.constexpr,
    stride_cm: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr,
):
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m, pid_n = _tile_coords(pid, tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N
    k_tiles = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(k_tiles, SPLIT_K)
    kt_start = pid_k * per_split
    kt_end = tl.minimum(kt_start + per_split, k_tiles)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(kt_start, kt_end):
        off_k = kt * BLOCK_K
        acc = tl.dot(a_desc.load([off_m, off_k]), b_desc.load([off_n, off_k]).T, acc)
    slot_offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    tile_ws = ws_ptr + pid.to(tl.int64) * (SPLIT_K * BLOCK_M * BLOCK_N)
    tl.store(tile_ws + pid_k * (BLOCK_M * BLOCK_N) + slot_offs, acc)
    tl.debug_barrier()
    arrived = tl.atomic_add(counts_ptr + pid, 1)
    if arrived == SPLIT_K - 1:
        tl.debug_barrier()
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for s in range(SPLIT_K):
            acc += tl.load(tile_ws + s * (BLOCK_M * BLOCK_N) + slot_offs, cache_modifier=".cg")
        tl.atomic_xchg(counts_ptr + pid, 0)
        _store(c_ptr, acc, off_m, off_n, M, N, stride_cm, BLOCK_M, BLOCK_N)


class Launch:
    """A bound launch of a probe kernel (``run_shape`` calls it and reads ``launches`` and
    ``counts``)."""

    def __init__(self, kernel: Any, grid: tuple[int, ...], args: tuple[Any, ...],
                 kwargs: dict[str, Any], out: Any, counts: Any = None) -> None:  # fmt: skip
        self.kernel, self.grid, self.args, self.kwargs = kernel, grid, args, kwargs
        self.out, self.counts, self.launches = out, counts, [kernel]

    def __call__(self) -> Any:
        self.kernel[self.grid](*self.args, **self.kwargs)
        return self.out


def bind(a: Any, b: Any, out: Any, c: dict[str, Any], sms: int) -> Any:
    """The launch of ``c``: a probe kernel for variants ``ncomp``/``splitk_tma``, else the
    template's ``bind``."""
    import torch

    m, k = a.shape
    n = b.shape[1]
    bm, bn, bk = c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"]
    opts = {"num_warps": c["num_warps"], "num_stages": c["num_stages"]}
    if c["variant"] == "ncomp":
        bn0 = 1 << (bn.bit_length() - 1)
        bn1 = bn - bn0
        args = (_descriptor(a, [m, k], [a.stride(0), 1], [bm, bk]),
                _descriptor(b.t(), [n, k], [b.stride(1), 1], [bn0, bk]),
                _descriptor(b.t(), [n, k], [b.stride(1), 1], [bn1, bk]),
                out, m, n, k, n)  # fmt: skip
        grid = (math.ceil(m / bm) * math.ceil(n / bn),)
        kwargs = dict(BLOCK_M=bm, BN0=bn0, BN1=bn1, BLOCK_K=bk, GROUP_M=c["GROUP_M"], **opts)
        return Launch(ncomp_kernel, grid, args, kwargs, out)
    if c["variant"] == "mcomp":
        bm0 = 1 << (bm.bit_length() - 1)
        bm1 = bm - bm0
        args = (_descriptor(a, [m, k], [a.stride(0), 1], [bm0, bk]),
                _descriptor(a, [m, k], [a.stride(0), 1], [bm1, bk]),
                _descriptor(b.t(), [n, k], [b.stride(1), 1], [bn, bk]),
                out, m, n, k, n)  # fmt: skip
        grid = (math.ceil(m / bm) * math.ceil(n / bn),)
        kwargs = dict(BM0=bm0, BM1=bm1, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=c["GROUP_M"], **opts)
        return Launch(mcomp_kernel, grid, args, kwargs, out)
    if c["variant"] == "splitk_tma":
        tiles = math.ceil(m / bm) * math.ceil(n / bn)
        split = c["SPLIT_K"]
        ws = torch.empty(tiles * split * bm * bn, dtype=torch.float32, device=a.device)
        counts = torch.zeros(tiles, dtype=torch.int32, device=a.device)
        args = (_descriptor(a, [m, k], [a.stride(0), 1], [bm, bk]),
                _descriptor(b.t(), [n, k], [b.stride(1), 1], [bn, bk]),
                out, ws, counts, m, n, k, n)  # fmt: skip
        kwargs = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=c["GROUP_M"], SPLIT_K=split,
                      **opts)  # fmt: skip
        return Launch(splitk_tma_kernel, (tiles, split), args, kwargs, out, counts)
    from tunehub.kernels import triton_gemm_kernels as kernels

    return kernels.bind(a, b, None, out, config=c, num_sms=sms)


def config(variant: str, bm: int, bn: int, bk: int, warps: int, stages: int, group: int = 8,
           split: int = 1, **extra: Any) -> dict[str, Any]:  # fmt: skip
    return {"variant": variant, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group,
            "num_warps": warps, "num_stages": stages, "SPLIT_K": split, **extra}  # fmt: skip


PLAN: dict[tuple[int, int, int, str], list[dict[str, Any]]] = {
    (127, 5000, 2048, "float16"): [
        config("tma", 64, 128, 128, 4, 4, group=16, FLATTEN=True),  # the search's pick
        config("tiled", 64, 64, 128, 4, 3),  # 158 tiles, two programs an SM
        *(config("ncomp", 64, 80, bk, 4, s) for bk, s in ((64, 5), (64, 6), (128, 3), (128, 4))),
        *(config("ncomp", 64, 96, bk, 4, s) for bk, s in ((64, 5), (128, 4))),
        *(config("ncomp", 128, 48, bk, 4, s) for bk, s in ((64, 5), (128, 4))),
        config("ncomp", 64, 80, 128, 8, 4),
    ],
    (256, 256, 65536, "float16"): [
        config("splitk", 64, 64, 128, 4, 6, group=4, split=8),  # the search's pick
        *(
            config("splitk_tma", 64, 64, bk, 4, s, group=4, split=8)
            for bk, s in ((128, 4), (128, 5), (128, 6), (256, 3), (256, 4))
        ),
        config("splitk_tma", 128, 64, 128, 4, 5, group=4, split=16),
        config("splitk_tma", 128, 128, 128, 8, 4, group=4, split=32),
    ],
    (1536, 1536, 1536, "bfloat16"): [
        config("tma", 192, 128, 64, 4, 4, FLATTEN=False),  # the search's pick
        *(config("mcomp", 144, 128, 64, w, s) for w, s in ((4, 3), (4, 4), (4, 5), (8, 4))),
        config("mcomp", 144, 128, 128, 4, 3),
    ],
}


# --plan deep: the same kernels with deeper pipelines (cuBLAS's kernel names for these shapes
# say 11 stages of BLOCK_K 64 on 127x5000x2048; the template's space stops at 6 stages).
DEEP: dict[tuple[int, int, int, str], list[dict[str, Any]]] = {
    (127, 5000, 2048, "float16"): [
        config("tma", 64, 128, 128, 4, 4, group=16, FLATTEN=True),  # the search's pick
        config("tma", 64, 128, 64, 4, 8, group=16, FLATTEN=True),
        config("tma", 64, 128, 64, 4, 8, group=16, FLATTEN=False),
        *(config("ncomp", 64, 80, 128, 4, s) for s in (5, 6)),
        *(config("ncomp", 64, 80, 64, 4, s) for s in (8, 10, 11)),
        config("tiled", 64, 64, 64, 4, 10),
    ],
    (256, 256, 65536, "float16"): [
        config("splitk", 64, 64, 128, 4, 6, group=4, split=8),  # the search's pick
        config("splitk", 64, 64, 128, 4, 7, group=4, split=8),
        *(config("splitk", 64, 64, 64, 4, s, group=4, split=8) for s in (8, 10, 12)),
        config("splitk_tma", 64, 64, 128, 4, 7, group=4, split=8),
        *(config("splitk_tma", 64, 64, 64, 4, s, group=4, split=8) for s in (8, 12)),
    ],
}


def name(c: Contender) -> str:
    if c.config is None:
        return "cuBLAS"
    x = c.config
    return (f"{x['variant']} {x['BLOCK_M']}x{x['BLOCK_N']}x{x['BLOCK_K']} w{x['num_warps']} "
            f"s{x['num_stages']}" + (f" k{x['SPLIT_K']}" if x["SPLIT_K"] > 1 else ""))  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--min-secs", type=float, default=0.05)
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--plan", choices=("tiles", "deep"), default="tiles")
    args = parser.parse_args()
    plan = DEEP if args.plan == "deep" else PLAN
    if args.dry_run:
        for shape, configs in plan.items():
            print("x".join(map(str, shape)), *(name(Contender("", c)) for c in configs), sep="\n  ")
        return 0
    import torch

    start = time.monotonic()
    device = torch.device("cuda", torch.cuda.current_device())
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    report = report_head("gpu_skinny", device, args.rounds, args.min_secs)
    report["cases"] = []
    for (m, n, k, dtype), configs in plan.items():
        contenders = [Contender("probe", c) for c in configs] + [Contender("cuBLAS", None)]
        run_shape((m, n, k), contenders, rounds=args.rounds, min_secs=args.min_secs, sms=sms,
                  device=device, dtype=dtype, binder=bind)  # fmt: skip
        flops = 2.0 * m * n * k
        lib = contenders[-1]
        pick = contenders[0]
        print(f"{m}x{n}x{k} {dtype}", flush=True)
        for c in sorted(contenders, key=Contender.secs):
            tf = flops / c.secs() / 1e12 if c.round_secs else math.nan
            rounds = " ".join(f"{flops / s / 1e12:.0f}" for s in c.round_secs)
            print(f"  {name(c):>30} {tf:7.1f} TFLOP/s  x cuBLAS {lib.secs() / c.secs():5.3f}  "
                  f"x pick {pick.secs() / c.secs():5.3f}  rounds [{rounds}]  "
                  f"{'' if c.ok else c.note[:200]}")  # fmt: skip
        report["cases"].append({"shape": [m, n, k], "dtype": dtype,
                                "contenders": [c.record(flops, name=name(c))
                                               for c in contenders]})  # fmt: skip
        torch.cuda.empty_cache()
    write_report(report, args.out, start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
