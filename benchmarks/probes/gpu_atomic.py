"""Probe: split-K whose partials meet by fp32 atomics, beside the template's split-K and cuBLAS.

The template's one-kernel ``splitk`` has the last program to arrive at a tile sum every
split's fp32 partial in slot order: exact and repeatable, but that one program reads
SPLIT_K x BLOCK_M x BLOCK_N x 4 bytes alone (2 MB for 128x128 split 32), so on long-K shapes
the split stays at 64x64 tiles (8 ways on 256x256x65536), whose operand traffic through L2 is
twice that of 128x128 tiles. Here every program adds its partial into one fp32 tile with
``red.add`` (the sum happens in L2, spread over every program), counts itself in, and the last
arrival only reads the summed tile once, zeroes it for the next call, applies the epilogue and
stores C. Summation order is the arrival order: not bit-repeatable, within the dtype's
tolerance like any other order.

- ``atomic``: operands by pointers (the template's ``splitk`` main loop); since moved into
  the template as the variant ``splitk_atomic``, which the plan now runs in its place.
- ``atomic_tma``: operands through TMA descriptors (host-side, like the ``tma`` variant).
- ``tree``: no atomics on the data, and the same bits every run: the partials meet in a
  binary tree (pairs, then pairs of pairs, each pair's second arrival adds the first's slot),
  so the critical path reads log2(SPLIT_K) partials instead of SPLIT_K.

The probe kernels are here, not in the template, until they win. Each contender is checked against
a float64 reference into a NaN-poisoned C, then timed by tunehub's policy (L2 flushed, CUDA
graph replay, median) in alternating rounds (``gpu_splitk.run_shape``), and after every replay
its counters and accumulator are checked to be back at zero. A row-major, B column-major.

    PYTHONPATH=. python3 benchmarks/probes/gpu_atomic.py --out "$OUT/gpu_atomic.json"
    python3 benchmarks/probes/gpu_atomic.py --dry-run
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
from gpu_skinny import Launch, config, name  # noqa: E402
from gpu_splitk import Contender, report_head, run_shape, write_report  # noqa: E402

from tunehub.kernels.triton_gemm_kernels import (  # noqa: E402
    _descriptor,
    _load_offsets,
    _tile_coords,
)


@triton.jit
def _meet(acc, sum_ptr, counts_ptr, c_ptr, pid, off_m, off_n, M, N, stride_cm,
          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr):  # fmt: skip
    # Add this split's partial into the tile's fp32 sum (in L2), then count in; the last of
    # the SPLIT_K programs reads the sum, leaves zeros and a zero counter for the next call,
    # and stores C. The barrier orders every thread's adds before the one thread's count
    # (acq_rel at GPU scope), as in the template's splitk.
    offs_m = off_m + tl.arange(0, BLOCK_M)
    offs_n = off_n + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    ptrs = sum_ptr + offs_m[:, None] * N + offs_n[None, :]
    tl.atomic_add(ptrs, acc, mask=mask, sem="relaxed")
    tl.debug_barrier()
    arrived = tl.atomic_add(counts_ptr + pid, 1)
    if arrived == SPLIT_K - 1:
        tl.debug_barrier()
        total = tl.load(ptrs, mask=mask, other=0.0, cache_modifier=".cg")
        # Every thread has read before any zeroes: the store may map threads to elements
        # differently from the load.
        tl.debug_barrier()
        tl.store(ptrs, tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), mask=mask)
        tl.atomic_xchg(counts_ptr + pid, 0)
        c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :]
        tl.store(c_ptrs, total.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def tree_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    ws_ptr,
    counts_ptr,
    M: tl.constexpr,
    N: tl.constexpr,
    K: tl.constexpr,
    stride_am: tl.constexpr,
    stride_ak: tl.constexpr,
    stride_bk: tl.constexpr,
    stride_bn: tl.constexpr,
    stride_cm: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr,
    LEVELS: tl.constexpr,
):
    # The template's splitk main loop; the partials meet in a binary tree instead of all in
    # the last arrival: at level L, node j (splits j*2^L .. (j+1)*2^L - 1) stores its sum in
    # slot j*2^L and counts in at the pair's counter; the second of the pair adds the first's
    # slot and goes up a level, the first stops. Each node's sum is left + right whichever
    # program makes it (float addition commutes), so the bits repeat; the critical path reads
    # LEVELS partials instead of SPLIT_K. SPLIT_K is a power of two (2 ** LEVELS).
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m, pid_n = _tile_coords(pid, tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    offs_am = _load_offsets(pid_m, M, BLOCK_M)
    offs_bn = _load_offsets(pid_n, N, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    k_tiles = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(k_tiles, SPLIT_K)
    kt_start = pid_k * per_split
    kt_end = tl.minimum(kt_start + per_split, k_tiles)
    a_rows = a_ptr + offs_am[:, None] * stride_am
    b_cols = b_ptr + offs_bn[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(kt_start, kt_end):
        offs_kk = kt * BLOCK_K + offs_k
        a = tl.load(a_rows + offs_kk[None, :] * stride_ak)
        b = tl.load(b_cols + offs_kk[:, None] * stride_bk)
        acc = tl.dot(a, b, acc)
    slot_offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    tile_ws = ws_ptr + pid.to(tl.int64) * (SPLIT_K * BLOCK_M * BLOCK_N)
    tile_counts = counts_ptr + pid * SPLIT_K
    node = pid_k
    alive = True
    for level in tl.static_range(LEVELS):
        if alive:
            # Every thread is past its read of the last level's partner slot before any
            # writes this level's (it may be the same slot).
            tl.debug_barrier()
            tl.store(tile_ws + (node << level) * (BLOCK_M * BLOCK_N) + slot_offs, acc)
            tl.debug_barrier()
            counter = tile_counts + (SPLIT_K - (SPLIT_K >> level)) + (node >> 1)
            if tl.atomic_add(counter, 1) == 0:
                alive = False
            else:
                tl.debug_barrier()
                partner = tile_ws + ((node ^ 1) << level) * (BLOCK_M * BLOCK_N)
                acc += tl.load(partner + slot_offs, cache_modifier=".cg")
                tl.atomic_xchg(counter, 0)
                node = node >> 1
    if alive:
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :]
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def atomic_tma_kernel(
    a_desc,
    b_desc,
    c_ptr,
    sum_ptr,
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
    _meet(acc, sum_ptr, counts_ptr, c_ptr, pid, off_m, off_n, M, N, stride_cm, BLOCK_M,
          BLOCK_N, SPLIT_K)  # fmt: skip


def bind(a: Any, b: Any, out: Any, c: dict[str, Any], sms: int) -> Any:
    """The launch of ``c``: a probe kernel for variants ``atomic_tma``/``tree``, else the
    template's ``bind``."""
    import torch

    if c["variant"] == "tree":
        return _bind_tree(a, b, out, c)
    if c["variant"] != "atomic_tma":
        from tunehub.kernels import triton_gemm_kernels as kernels

        return kernels.bind(a, b, None, out, config=c, num_sms=sms)
    m, k = a.shape
    n = b.shape[1]
    bm, bn, bk, split = c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"], c["SPLIT_K"]
    tiles = math.ceil(m / bm) * math.ceil(n / bn)
    sums = torch.zeros(m * n, dtype=torch.float32, device=a.device)
    counts = torch.zeros(tiles, dtype=torch.int32, device=a.device)
    kwargs = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=c["GROUP_M"], SPLIT_K=split,
                  num_warps=c["num_warps"], num_stages=c["num_stages"])  # fmt: skip
    args = (_descriptor(a, [m, k], [a.stride(0), 1], [bm, bk]),
            _descriptor(b.t(), [n, k], [b.stride(1), 1], [bn, bk]),
            out, sums, counts, m, n, k, out.stride(0))  # fmt: skip
    launch = Launch(atomic_tma_kernel, (tiles, split), args, kwargs, out, counts)
    launch.deterministic = False
    launch.zeroed = [sums]
    return launch


def _bind_tree(a: Any, b: Any, out: Any, c: dict[str, Any]) -> Any:
    import torch

    m, k = a.shape
    n = b.shape[1]
    bm, bn, bk, split = c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"], c["SPLIT_K"]
    tiles = math.ceil(m / bm) * math.ceil(n / bn)
    ws = torch.empty(tiles * split * bm * bn, dtype=torch.float32, device=a.device)
    counts = torch.zeros(tiles * split, dtype=torch.int32, device=a.device)
    kwargs = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=c["GROUP_M"], SPLIT_K=split,
                  LEVELS=split.bit_length() - 1, num_warps=c["num_warps"],
                  num_stages=c["num_stages"])  # fmt: skip
    args = (a, b, out, ws, counts, m, n, k, a.stride(0), a.stride(1), b.stride(0),
            b.stride(1), out.stride(0))  # fmt: skip
    return Launch(tree_kernel, (tiles, split), args, kwargs, out, counts)


def _tree(bm: int, bn: int, bk: int, w: int, s: int, split: int) -> Any:
    return config("tree", bm, bn, bk, w, s, split=split)


def _atomic(bm: int, bn: int, bk: int, w: int, s: int, split: int, tma: bool = False) -> Any:
    return config("atomic_tma" if tma else "splitk_atomic", bm, bn, bk, w, s, split=split)


PLAN: dict[tuple[int, int, int, str], list[dict[str, Any]]] = {
    (256, 256, 65536, "float16"): [
        config("splitk", 64, 64, 128, 4, 6, group=4, split=8),  # the search's pick
        _tree(64, 64, 128, 4, 6, 8),
        _tree(64, 64, 128, 4, 5, 8),
        _tree(64, 128, 128, 4, 4, 16),
        _tree(128, 64, 128, 4, 4, 16),
        _tree(128, 128, 128, 8, 3, 32),
        _atomic(64, 64, 128, 4, 6, 8),
        _atomic(64, 64, 128, 4, 6, 8, tma=True),
        _atomic(128, 64, 128, 4, 4, 16),
    ],
    (512, 512, 16384, "float16"): [
        config("splitk", 64, 64, 128, 4, 5, split=2),
        config("splitk", 64, 128, 128, 4, 4, split=4),
        _tree(64, 128, 128, 4, 4, 4),
        _tree(128, 128, 128, 8, 3, 8),
        _atomic(64, 128, 128, 4, 4, 4),
        _atomic(128, 128, 128, 8, 3, 8),
    ],
    (128, 128, 32768, "float16"): [
        config("splitk", 64, 64, 128, 4, 5, split=32),
        _tree(64, 64, 128, 4, 5, 32),
        _tree(64, 64, 128, 4, 6, 32),
        _tree(64, 128, 128, 4, 4, 64),
        _atomic(64, 64, 128, 4, 5, 32),
        _atomic(64, 64, 128, 4, 5, 32, tma=True),
    ],
    (64, 4096, 8192, "float16"): [
        config("splitk", 64, 64, 128, 4, 5, split=2),
        _tree(64, 64, 128, 4, 5, 2),
        _tree(64, 128, 128, 4, 4, 4),
        _atomic(64, 128, 128, 4, 4, 4),
    ],
}


# --ncu: the template's pick, the atomic split at the same tile and at 128x128, and cuBLAS.
NCU_SHAPE = (256, 256, 65536)
NCU_CONFIGS = [
    config("splitk", 64, 64, 128, 4, 6, group=4, split=8),
    _atomic(64, 64, 128, 4, 6, 8, tma=True),
    _atomic(128, 128, 128, 8, 3, 32),
]


def ncu_child() -> None:
    """Launched under ncu: each of NCU_CONFIGS and cuBLAS twice, after a warm-up."""
    import torch

    from tunehub.core import Workload
    from tunehub.kernels import gpu_reference as ref

    m, n, k = NCU_SHAPE
    device = torch.device("cuda", 0)
    ops = ref.operands(Workload(m=m, n=n, k=k, dtype="float16", b_layout="col_major"), device, 7)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    launches = [bind(ops.a, ops.b, ops.out, c, sms) for c in NCU_CONFIGS]
    launches.append(lambda: torch.matmul(ops.a, ops.b, out=ops.out))
    for launch in launches:
        launch()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for launch in launches:
        for _ in range(2):
            launch()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def read_rate(m: int, n: int, k: int, dtype: str, device: Any) -> dict[str, float]:
    """How fast this GPU reads A and B once (``torch.sum`` of each, timed by the same policy:
    L2 flushed, graph replay): the floor under a kernel that streams its operands once."""
    import statistics

    from tunehub.core import Workload
    from tunehub.kernels import gpu_reference as ref
    from tunehub.kernels.gpu_timing import time_gpu

    ops = ref.operands(Workload(m=m, n=n, k=k, dtype=dtype, b_layout="col_major"), device, 3)
    timed = time_gpu(lambda: (ops.a.sum(), ops.b.sum()), min_secs=0.05, max_repeats=200,
                     device=device)  # fmt: skip
    secs = statistics.median(timed.repeat_secs)
    size = ops.a.numel() * ops.a.element_size() + ops.b.numel() * ops.b.element_size()
    return {"bytes": size, "secs": secs, "tb_per_s": size / secs / 1e12}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--min-secs", type=float, default=0.05)
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--ncu", type=Path, default=None, help="profile NCU_CONFIGS; CSV here")
    parser.add_argument("--ncu-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.ncu_child:
        ncu_child()
        return 0
    if args.ncu:
        import ncu

        return ncu.profile(__file__, ["--ncu-child"], "atomic|_gemm_|nvjet|splitKreduce", args.ncu)
    if args.dry_run:
        for shape, configs in PLAN.items():
            print("x".join(map(str, shape)), *(name(Contender("", c)) for c in configs), sep="\n  ")
        return 0
    import torch

    start = time.monotonic()
    device = torch.device("cuda", torch.cuda.current_device())
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    report = report_head("gpu_atomic", device, args.rounds, args.min_secs)
    report["cases"] = []
    for (m, n, k, dtype), configs in PLAN.items():
        contenders = [Contender("probe", c) for c in configs] + [Contender("cuBLAS", None)]
        run_shape((m, n, k), contenders, rounds=args.rounds, min_secs=args.min_secs, sms=sms,
                  device=device, dtype=dtype, binder=bind)  # fmt: skip
        flops = 2.0 * m * n * k
        lib = contenders[-1]
        pick = contenders[0]
        rate = read_rate(m, n, k, dtype, device)
        print(f"{m}x{n}x{k} {dtype}  (reading A and B once: {rate['secs'] * 1e6:.1f} us, "
              f"{rate['tb_per_s']:.2f} TB/s)", flush=True)  # fmt: skip
        for c in sorted(contenders, key=Contender.secs):
            tf = flops / c.secs() / 1e12 if c.round_secs else math.nan
            rounds = " ".join(f"{s * 1e6:.1f}" for s in c.round_secs)
            print(f"  {name(c):>34} {tf:7.1f} TFLOP/s  x cuBLAS {lib.secs() / c.secs():5.3f}  "
                  f"x pick {pick.secs() / c.secs():5.3f}  rounds us [{rounds}]  "
                  f"{'' if c.ok else c.note[:200]}", flush=True)  # fmt: skip
        report["cases"].append({"shape": [m, n, k], "dtype": dtype, "read_rate": rate,
                                "contenders": [c.record(flops, name=name(c))
                                               for c in contenders]})  # fmt: skip
        torch.cuda.empty_cache()
    write_report(report, args.out, start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
