"""Probe: data-parallel + stream-K over TMA loads (Osama et al., PPoPP 2023) on the shapes whose
tiles leave the H100's SMs idle, beside the search's pick of the last benchmark and cuBLAS.

The kernel is here, not in the template: on the H100 it lost to the search's pick on every
shape probed (benchmarks/notes/gpu_kernels_v2.md, "Stream-K"), so the space does not offer it.
It is ``triton.gemm``'s ``tma`` kernel (host-side descriptors, sizes as constants) with the
tile loop replaced: whole waves of tiles one a program, the rest shared out as equal runs of
(tile, K step) iterations over one program per SM; a tile cut between programs is summed, in
program order (the same bits every run), by the program that arrives last at its counter,
which then resets it. No program waits for another.

No search: per shape a fixed list of ``streamk`` tiles and the config the 64-trial search found
in ``gpu_gemm-h100-summary.txt`` (code 5fe7b53), all compiled first by a pool of GPU-less
processes, then checked against a float64 reference into a NaN-poisoned C and timed by
tunehub's policy (``tunehub.kernels.gpu_timing``: L2 flushed before each repeat, CUDA-graph
replay, median) in alternating rounds (``gpu_splitk.run_shape``). Each ``streamk`` contender
is also checked to give the same bits after every timed replay as on its first call, with its
tile counters back at zero. Operands as the benchmark's: A row-major, B column-major.

    PYTHONPATH=. python3 benchmarks/probes/gpu_streamk.py --out "$OUT/gpu_streamk.json"
    python3 benchmarks/probes/gpu_streamk.py --dry-run          # the plan, no GPU needed
    python3 benchmarks/probes/gpu_streamk.py --ncu 1536x1536x1536:bfloat16 --out-dir $OUT

``--ncu`` runs ``NCU_CONFIGS`` on one shape under Nsight Compute (speed of light, launch,
occupancy, memory, warp stalls) and writes its CSV and a summary to ``--out-dir``.
"""

from __future__ import annotations

import argparse
import math
import os
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
from gpu_splitk import (  # noqa: E402
    Contender,
    precompile,
    probe_device,
    report_head,
    run_shape,
    write_report,
)

from tunehub.kernels.triton_gemm_kernels import (  # noqa: E402
    _descriptor,
    _epilogue,
    _store_tile,
    _tile_coords,
)

H100_SMS = 132
# (M, N, K, dtype): the issue suite's and the broad suite's losers to cuBLAS, and two shapes
# whose 128x256 tiles leave part of a last wave idle (4096^3: 3.9 waves; 2048x6144: 2.9).
SHAPES: list[tuple[int, int, int, str]] = [
    (3000, 1000, 4000, "float16"),
    (127, 5000, 2048, "float16"),
    (256, 256, 65536, "float16"),
    (1536, 1536, 1536, "bfloat16"),
    (512, 512, 512, "float16"),
    (1024, 1024, 1024, "float16"),
    (4096, 4096, 4096, "float16"),
    (2048, 6144, 4096, "float16"),
]
# What the search found for each (variant, BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, GROUP_M,
# SPLIT_K), from gpu_gemm-h100-summary.txt.
FOUND: dict[tuple[int, int, int], tuple[Any, ...]] = {
    (3000, 1000, 4000): ("tiled", 192, 128, 64, 4, 5, 8, 1),
    (127, 5000, 2048): ("tma", 64, 128, 128, 4, 4, 16, 1),
    (256, 256, 65536): ("splitk", 64, 64, 128, 4, 6, 4, 8),
    (1536, 1536, 1536): ("tiled", 192, 128, 64, 4, 4, 8, 1),
    (512, 512, 512): ("tiled", 64, 64, 128, 4, 6, 4, 1),
    (1024, 1024, 1024): ("tma", 64, 128, 128, 4, 4, 1, 1),
    (4096, 4096, 4096): ("tma", 128, 256, 64, 8, 3, 8, 1),
    (2048, 6144, 4096): ("ws", 128, 256, 128, 4, 2, 8, 1),
}
# streamk tiles (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages).
STREAMK_TILES = [
    (128, 256, 64, 8, 3),
    (128, 128, 64, 8, 4),
    (64, 128, 128, 4, 4),
    (128, 64, 64, 4, 4),
    (64, 64, 128, 4, 5),
]


# mypy: disable-error-code="untyped-decorator,no-untyped-def"
@triton.jit
def _tma_tile(
    a_desc,
    b_desc,
    off_m,
    off_n,
    kt_lo,
    kt_hi,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    A_COL: tl.constexpr,
    B_COL: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    # One tile's K steps [kt_lo, kt_hi) through TMA descriptors, as ``_gemm_tma_kernel`` does.
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(kt_lo, kt_hi):
        off_k = kt * BLOCK_K
        a = a_desc.load([off_k, off_m]).T if A_COL else a_desc.load([off_m, off_k])
        b = b_desc.load([off_n, off_k]).T if B_COL else b_desc.load([off_k, off_n])
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
    return acc


@triton.jit
def _gemm_streamk_kernel(
    a_desc,
    b_desc,
    c_ptr,
    bias_ptr,
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
    A_COL: tl.constexpr,
    B_COL: tl.constexpr,
    NUM_SMS: tl.constexpr,
    EPILOGUE: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    DP_TILES: tl.constexpr,
    SK_ITERS: tl.constexpr,
):
    # Data-parallel + stream-K (Osama et al., "Stream-K", PPoPP 2023): NUM_SMS programs. The
    # first DP_TILES tiles (whole waves) go one a program, round robin, as ``tma`` does. The
    # rest, whose tiles alone would leave SMs idle, are one run of (tile, K step) iterations
    # cut into NUM_SMS equal shares of SK_ITERS: a program computes each piece of a tile its
    # share covers. A tile covered by one program is stored at once; a tile cut between
    # programs is summed as ``splitk`` does: each piece goes to its program's workspace slot
    # (slot 0 for the piece its share starts in, slot 1 for the piece it ends in: no share
    # holds more than two cut pieces), the program that arrives last at the tile's counter
    # adds the pieces in program order (the same bits whoever arrives last), applies the
    # epilogue, stores C and sets the counter back to zero. Nobody waits on anybody.
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    num_tiles = num_pid_m * num_pid_n
    for tile_id in range(pid, DP_TILES, NUM_SMS):
        pid_m, pid_n = _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        acc = _tma_tile(
            a_desc, b_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, 0, k_tiles,
            BLOCK_M, BLOCK_N, BLOCK_K, A_COL, B_COL, INPUT_PRECISION,
        )  # fmt: skip
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = _epilogue(acc, bias_ptr, offs_n, N, EPILOGUE)
        _store_tile(c_ptr, acc, offs_m, offs_n, M, N, stride_cm)
    sk_total = (num_tiles - DP_TILES) * k_tiles
    first = pid * SK_ITERS
    it = first
    it_end = tl.minimum(first + SK_ITERS, sk_total)
    slot_offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    while it < it_end:
        sk_tile = it // k_tiles
        kt_lo = it - sk_tile * k_tiles
        kt_hi = tl.minimum(k_tiles, kt_lo + (it_end - it))
        pid_m, pid_n = _tile_coords(DP_TILES + sk_tile, num_pid_m, num_pid_n, GROUP_M)
        acc = _tma_tile(
            a_desc, b_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, kt_lo, kt_hi,
            BLOCK_M, BLOCK_N, BLOCK_K, A_COL, B_COL, INPUT_PRECISION,
        )  # fmt: skip
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        tile_start = sk_tile * k_tiles
        p_first = tile_start // SK_ITERS
        p_last = (tile_start + k_tiles - 1) // SK_ITERS
        if p_first == p_last:
            acc = _epilogue(acc, bias_ptr, offs_n, N, EPILOGUE)
            _store_tile(c_ptr, acc, offs_m, offs_n, M, N, stride_cm)
        else:
            slot = tl.where(first >= tile_start, 0, 1)
            tl.store(ws_ptr + (pid * 2 + slot).to(tl.int64) * (BLOCK_M * BLOCK_N) + slot_offs, acc)
            # Every thread's piece is written before one thread counts the program in (the
            # atomic is acq_rel at GPU scope: the last arrival sees every earlier piece).
            tl.debug_barrier()
            arrived = tl.atomic_add(counts_ptr + sk_tile, 1)
            if arrived == p_last - p_first:
                tl.debug_barrier()
                acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                for p in range(p_first, p_last + 1):
                    s = tl.where(p * SK_ITERS >= tile_start, 0, 1)
                    piece = ws_ptr + (p * 2 + s).to(tl.int64) * (BLOCK_M * BLOCK_N) + slot_offs
                    # .cg: read through L2, where the other SMs' pieces are.
                    acc += tl.load(piece, cache_modifier=".cg")
                tl.atomic_xchg(counts_ptr + sk_tile, 0)
                acc = _epilogue(acc, bias_ptr, offs_n, N, EPILOGUE)
                _store_tile(c_ptr, acc, offs_m, offs_n, M, N, stride_cm)
        it += kt_hi - kt_lo


def schedule(m: int, n: int, k: int, c: dict[str, Any], sms: int) -> tuple[int, int, int]:
    """(tiles computed whole, tiles shared, K steps in each program's share). Tiles in whole
    waves all go whole; otherwise the last full wave and the partial one are shared (one to
    two tiles' worth of K steps a program), and with fewer tiles than SMs all are."""
    tiles = math.ceil(m / c["BLOCK_M"]) * math.ceil(n / c["BLOCK_N"])
    k_tiles = math.ceil(k / c["BLOCK_K"])
    full, rest = divmod(tiles, sms)
    dp_tiles = tiles if rest == 0 else max(0, full - 1) * sms
    sk_tiles = tiles - dp_tiles
    return dp_tiles, sk_tiles, max(1, math.ceil(sk_tiles * k_tiles / sms))


class StreamK:
    """One bound launch of the stream-K kernel (C = A @ B, A row-major, B column-major), with
    its workspace (two tile slots a program) and zeroed tile counters."""

    def __init__(self, a: Any, b: Any, out: Any, c: dict[str, Any], sms: int) -> None:
        import torch

        m, k = a.shape
        n = b.shape[1]
        bm, bn, bk = c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"]
        assert a.stride(1) == 1 and b.stride(0) == 1, "A row-major, B column-major"
        dp_tiles, sk_tiles, sk_iters = schedule(m, n, k, c, sms)
        self.workspace = torch.empty(2 * sms * bm * bn, dtype=torch.float32, device=a.device)
        self.counts = torch.zeros(max(1, sk_tiles), dtype=torch.int32, device=a.device)
        self.launches = [None]
        self.out = out
        self.grid = (sms,)
        self.args = (_descriptor(a, [m, k], [a.stride(0), 1], [bm, bk]),
                     _descriptor(b.t(), [n, k], [b.stride(1), 1], [bn, bk]),
                     out, None, self.workspace, self.counts, m, n, k, n)  # fmt: skip
        self.kwargs = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=c["GROUP_M"],
                           A_COL=False, B_COL=True, NUM_SMS=sms, EPILOGUE="none",
                           INPUT_PRECISION="tf32", DP_TILES=dp_tiles, SK_ITERS=sk_iters,
                           num_warps=c["num_warps"], num_stages=c["num_stages"])  # fmt: skip

    def __call__(self) -> Any:
        _gemm_streamk_kernel[self.grid](*self.args, **self.kwargs)
        return self.out


def bind(a: Any, b: Any, out: Any, c: dict[str, Any], sms: int) -> Any:
    """The launch of config ``c``: the stream-K kernel for ``variant == "streamk"``, else the
    template's."""
    if c["variant"] == "streamk":
        return StreamK(a, b, out, c, sms)
    from tunehub.kernels import triton_gemm_kernels as kernels

    return kernels.bind(a, b, None, out, config=c, num_sms=sms)


def config(variant: str, bm: int, bn: int, bk: int, warps: int, stages: int,
           group: int = 8, split: int = 1) -> dict[str, Any]:  # fmt: skip
    return {
        "variant": variant,
        "BLOCK_M": bm,
        "BLOCK_N": bn,
        "BLOCK_K": bk,
        "GROUP_M": group,
        "num_warps": warps,
        "num_stages": stages,
        "SPLIT_K": split,
    }


def plan(sms: int) -> list[tuple[tuple[int, int, int, str], list[Contender]]]:
    from tunehub.kernels import triton_gemm_limits as limits

    props = {"compute_capability": 90, "smem_per_block_bytes": 232448, "regs_per_sm": 65536}
    out = []
    for m, n, k, dtype in SHAPES:
        contenders = [Contender("found", config(*FOUND[(m, n, k)]))]
        for tile in STREAMK_TILES:
            c = config("streamk", *tile)
            if c["BLOCK_M"] > max(16, 1 << (m - 1).bit_length()):
                continue
            # The same resources as the template's tma kernel of that tile.
            if limits.config_problem(c | {"variant": "tma"}, dtype, props) is None:
                dp, sk, iters = schedule(m, n, k, c, sms)
                contenders.append(Contender("streamk", c, extra={"dp_tiles": dp,
                                                                  "sk_tiles": sk,
                                                                  "sk_iters": iters}))  # fmt: skip
        contenders.append(Contender("cuBLAS", None))
        out.append(((m, n, k, dtype), contenders))
    return out


# --ncu: stream-K beside the same tile through ``tma`` (unflattened: the same K loop).
NCU_CONFIGS = [
    config("tma", 128, 128, 64, 8, 4) | {"FLATTEN": False},
    config("streamk", 128, 128, 64, 8, 4),
    config("tma", 128, 256, 64, 8, 3) | {"FLATTEN": False},
    config("streamk", 128, 256, 64, 8, 3),
]
NCU_SECTIONS = ("SpeedOfLight", "LaunchStats", "Occupancy", "MemoryWorkloadAnalysis",
                "WarpStateStats", "SchedulerStats")  # fmt: skip


def ncu_child(spec: str) -> None:
    """Launched under ncu: each of NCU_CONFIGS twice on the shape, after a warm-up."""
    import torch

    from tunehub.core import Workload
    from tunehub.kernels import gpu_reference as ref

    shape, dtype = spec.split(":")
    m, n, k = (int(x) for x in shape.split("x"))
    device = torch.device("cuda", 0)
    ops = ref.operands(Workload(m=m, n=n, k=k, dtype=dtype, b_layout="col_major"), device, 7)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    launches = [bind(ops.a, ops.b, ops.out, c, sms) for c in NCU_CONFIGS]
    for launch in launches:
        launch()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for launch in launches:
        for _ in range(2):
            launch()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def run_ncu(spec: str, out_dir: Path) -> int:
    import ncu

    tag = spec.replace(":", "-")
    csv_out = out_dir / f"streamk_ncu-{tag}.csv"
    return ncu.profile(__file__, ["--ncu-child", spec], "_gemm_", csv_out, sections=NCU_SECTIONS)


def name(c: Contender) -> str:
    if c.config is None:
        return c.role
    x = c.config
    text = (f"{x['variant']} {x['BLOCK_M']}x{x['BLOCK_N']}x{x['BLOCK_K']} w{x['num_warps']} "
            f"s{x['num_stages']} g{x['GROUP_M']}")  # fmt: skip
    return text + (f" k{x['SPLIT_K']}" if x["SPLIT_K"] > 1 else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--min-secs", type=float, default=0.05)
    parser.add_argument("--budget-secs", type=float, default=200.0)
    parser.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--ncu", default=None, help="MxNxK:dtype to profile under ncu")
    parser.add_argument("--ncu-child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--ncu-summary", type=Path, default=None, help="summarise an ncu CSV")
    parser.add_argument("--out-dir", type=Path, default=Path("."))
    args = parser.parse_args()
    if args.ncu_child:
        ncu_child(args.ncu_child)
        return 0
    if args.ncu:
        return run_ncu(args.ncu, args.out_dir)
    if args.ncu_summary:
        import ncu

        ncu.summarize(args.ncu_summary.read_text())
        return 0
    start = time.monotonic()
    if args.dry_run:
        for shape, contenders in plan(H100_SMS):
            print("x".join(map(str, shape)))
            for c in contenders:
                print(f"  {c.role:>8}  {name(c)}  {c.extra or ''}")
        return 0
    device, sms, capability = probe_device("streamk")
    import torch

    planned = plan(sms)
    # streamk contenders run this file's kernel, compiled at its first call.
    built = precompile(planned, capability, sms, args.workers,
                       skip=lambda c: c.role == "streamk")  # fmt: skip
    print(f"# precompiled {built}", flush=True)
    report = report_head("gpu_streamk", device, args.rounds, args.min_secs)
    report["cases"] = []
    for (m, n, k, dtype), contenders in planned:
        if time.monotonic() - start > args.budget_secs:
            print(f"# {m}x{n}x{k}: skipped, past --budget-secs", flush=True)
            continue
        run_shape((m, n, k), contenders, rounds=args.rounds, min_secs=args.min_secs, sms=sms,
                  device=device, dtype=dtype, binder=bind)  # fmt: skip
        torch.cuda.empty_cache()
        flops = 2.0 * m * n * k
        lib = next(c for c in contenders if c.role == "cuBLAS")
        found = next(c for c in contenders if c.role == "found")
        print(f"{m}x{n}x{k} {dtype}", flush=True)
        for c in sorted(contenders, key=Contender.secs):
            tf = flops / c.secs() / 1e12 if c.round_secs else math.nan
            ratio = lib.secs() / c.secs() if c.round_secs else math.nan
            vs_found = found.secs() / c.secs() if c.round_secs else math.nan
            print(f"  {name(c):>40} {tf:7.1f} TFLOP/s  x cuBLAS {ratio:5.3f}  x found "
                  f"{vs_found:5.3f}  {'' if c.ok else c.note[:160]}  "
                  f"{ {k: v for k, v in c.extra.items() if k != 'graph'} }")  # fmt: skip
        report["cases"].append(
            {
                "shape": [m, n, k],
                "dtype": dtype,
                "contenders": [c.record(flops, role=c.role, name=name(c)) for c in contenders],
            }
        )  # fmt: skip
    write_report(report, args.out, start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
