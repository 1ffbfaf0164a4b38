"""Probe: a warp-specialised, persistent "ping-pong" GEMM in Gluon against cuBLAS.

triton.gemm's kernels run 0.81-0.97x of cuBLAS on GPT-2's and ViT-B's hidden-768 GEMMs and
0.70x on the NHWC 3x3 convolutions' im2col GEMMs (docs/benchmarks.md): short K loops (12
steps at K = 768) where a tile's prologue and epilogue weigh, and few tiles a wave. This
kernel splits each persistent program into a producer warp issuing TMA loads into a ring of
``STAGES`` slots and two consumer warpgroups taking alternate tiles, so one's epilogue (and
its TMA store, left in flight) runs while the other's MMAs do (the ping-pong schedule of
CUTLASS's Hopper kernels, written here from that description). C = A @ W^T as ``F.linear``
computes it, fp16, each output checked against cuBLAS's and timed beside it:

    python benchmarks/probes/gemm_gluon.py --out $OUT/gemm_gluon.json
"""

# ruff: noqa: B023, RUF005, RUF059, SIM113
# (a probe; Gluon kernels index their loops by hand and unpack every partition's arguments)

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor


@gluon.jit
def _tile(t, num_pid_m, num_pid_n, GROUP_M: gl.constexpr):
    # Grouped order: GROUP_M rows of tiles share their B columns in L2.
    group = GROUP_M * num_pid_n
    first_m = (t // group) * GROUP_M
    size_m = gl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (t % group) % size_m
    pid_n = (t % group) // size_m
    return pid_m, pid_n


@gluon.jit
def _producer(descs, bars, bufs, sizes, CONSUMER: gl.constexpr, GROUP_M: gl.constexpr,
              CONSUMERS: gl.constexpr):  # fmt: skip
    a_desc, b_desc, c_desc = descs
    ready, empty, turn = bars
    a_bufs, b_bufs, c_bufs = bufs
    M, N, K = sizes
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    k_steps = gl.cdiv(K, BLOCK_K)
    tiles = num_pid_m * num_pid_n
    i = 0
    for t in range(gl.program_id(0), tiles, gl.num_programs(0)):
        pid_m, pid_n = _tile(t, num_pid_m, num_pid_n, GROUP_M)
        for k in range(k_steps):
            s = i * k_steps + k
            slot = s % STAGES
            mbarrier.wait(empty.index(slot), ((s // STAGES) & 1) ^ 1)
            bar = ready.index(slot)
            mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(a_desc, [pid_m * BLOCK_M, k * BLOCK_K], bar,
                                            a_bufs.index(slot))  # fmt: skip
            tma.async_copy_global_to_shared(b_desc, [pid_n * BLOCK_N, k * BLOCK_K], bar,
                                            b_bufs.index(slot))  # fmt: skip
        i += 1


@gluon.jit
def _consumer(descs, bars, bufs, sizes, CONSUMER: gl.constexpr, GROUP_M: gl.constexpr,
              CONSUMERS: gl.constexpr):  # fmt: skip
    a_desc, b_desc, c_desc = descs
    ready, empty, turn = bars
    a_bufs, b_bufs, c_bufs = bufs
    M, N, K = sizes
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16]
    )
    c_smem = c_bufs.index(CONSUMER)
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    k_steps = gl.cdiv(K, BLOCK_K)
    tiles = num_pid_m * num_pid_n
    i = 0
    for t in range(gl.program_id(0), tiles, gl.num_programs(0)):
        if i % CONSUMERS == CONSUMER:
            pid_m, pid_n = _tile(t, num_pid_m, num_pid_n, GROUP_M)
            acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=layout)
            if CONSUMERS > 1:
                # Mainloops take turns (consumer 0 first): a consumer waits on its slots
                # only once the other has consumed the slices before them, so a slot's
                # parity never runs a phase ahead of the producer.
                n = i // CONSUMERS
                mbarrier.wait(turn.index(CONSUMER), (n & 1) ^ (1 - CONSUMER))
            for k in range(k_steps):
                s = i * k_steps + k
                slot = s % STAGES
                mbarrier.wait(ready.index(slot), (s // STAGES) & 1)
                acc = warpgroup_mma(a_bufs.index(slot), b_bufs.index(slot).permute((1, 0)), acc,
                                    is_async=True)  # fmt: skip
                # One MMA left in flight: the one before it is done, so its slot is free.
                acc = warpgroup_mma_wait(1, deps=(acc,))
                mbarrier.arrive(empty.index((s + STAGES - 1) % STAGES), pred=k > 0)
            acc = warpgroup_mma_wait(0, deps=(acc,))
            mbarrier.arrive(empty.index((i * k_steps + k_steps - 1) % STAGES))
            if CONSUMERS > 1:
                mbarrier.arrive(turn.index(1 - CONSUMER))  # its epilogue runs beside the next
            tma.store_wait(0)  # the previous tile's store has left c_smem
            c_smem.store(acc.to(c_desc.dtype))
            fence_async_shared()
            tma.async_copy_shared_to_global(c_desc, [pid_m * BLOCK_M, pid_n * BLOCK_N], c_smem)
        i += 1
    tma.store_wait(0)


@gluon.jit
def _gemm_pingpong(a_desc, b_desc, c_desc, M, N, K, STAGES: gl.constexpr,
                   GROUP_M: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                   CONSUMERS: gl.constexpr):  # fmt: skip
    dtype: gl.constexpr = a_desc.dtype
    a_bufs = gl.allocate_shared_memory(dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    c_bufs = gl.allocate_shared_memory(dtype, [2] + c_desc.block_type.shape, c_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    for i in gl.static_range(2):
        mbarrier.init(turn.index(i), count=1)
    fence_async_shared()
    descs = (a_desc, b_desc, c_desc)
    bars = (ready, empty, turn)
    bufs = (a_bufs, b_bufs, c_bufs)
    sizes = (M, N, K)
    if CONSUMERS == 2:
        gl.warp_specialize(
            [
                (_consumer, (descs, bars, bufs, sizes, 0, GROUP_M, CONSUMERS)),
                (_consumer, (descs, bars, bufs, sizes, 1, GROUP_M, CONSUMERS)),
                (_producer, (descs, bars, bufs, sizes, 0, GROUP_M, CONSUMERS)),
            ],
            [4, 1],
            [CONSUMER_REGS, 40],
        )
    else:
        gl.warp_specialize(
            [
                (_consumer, (descs, bars, bufs, sizes, 0, GROUP_M, CONSUMERS)),
                (_producer, (descs, bars, bufs, sizes, 0, GROUP_M, CONSUMERS)),
            ],
            [1],
            [40],
        )


def gemm_pingpong(a, w, c, block_m, block_n, block_k, stages, group_m=8, regs=232, maxnreg=168,
                  consumers=2):  # fmt: skip
    m, k = a.shape
    n = w.shape[0]
    gdt = gl.float16 if a.dtype == torch.float16 else gl.bfloat16

    def desc(t, block):
        return TensorDescriptor.from_tensor(
            t, block, gl.NVMMASharedLayout.get_default_for(block, gdt)
        )

    ad, bd = desc(a, [block_m, block_k]), desc(w, [block_n, block_k])
    cd = desc(c, [block_m, block_n])
    tiles = triton.cdiv(m, block_m) * triton.cdiv(n, block_n)
    sms = torch.cuda.get_device_properties(a.device).multi_processor_count
    grid = (min(sms, tiles),)

    def call() -> None:
        extra = {"maxnreg": maxnreg} if maxnreg else {}
        _gemm_pingpong[grid](ad, bd, cd, m, n, k, STAGES=stages, GROUP_M=group_m,
                             CONSUMER_REGS=regs, CONSUMERS=consumers, num_warps=4,
                             **extra)  # fmt: skip

    return call


SHAPES = (  # name, M, N, K
    ("gpt2-b8-qkv", 4096, 2304, 768),
    ("gpt2-b8-attn-out", 4096, 768, 768),
    ("gpt2-b8-mlp-up", 4096, 3072, 768),
    ("gpt2-b8-mlp-down", 4096, 768, 3072),
    ("vit-b64-mlp-up", 12608, 3072, 768),
    ("vit-b64-mlp-down", 12608, 768, 3072),
    ("llama-qkv", 4096, 4096, 4096),
    ("conv3x3-7x7-im2col", 1568, 512, 4608),
    ("conv3x3-14x14-im2col", 6272, 256, 2304),
)
CONFIGS = (  # BLOCK_M, BLOCK_N, BLOCK_K, STAGES
    (128, 128, 64, 4), (128, 128, 64, 3), (64, 256, 64, 4), (64, 128, 64, 6), (128, 64, 64, 6),
)  # fmt: skip
VARIANTS = {  # name: (consumers, consumer regs, maxnreg)
    "ws1": (1, 232, None),
    "pp": (2, 232, 168),
    "pp-noregs": (2, 168, None),
}


def run(variant: str, shapes: list[str], configs: list[tuple[int, ...]]) -> dict[str, Any]:
    from triton.testing import do_bench

    consumers, regs, maxnreg = VARIANTS[variant]
    torch.manual_seed(0)
    out: dict[str, Any] = {}
    for name, m, n, k in SHAPES:
        if name not in shapes:
            continue
        a = torch.randn(m, k, device="cuda", dtype=torch.float16)
        w = torch.randn(n, k, device="cuda", dtype=torch.float16) / k**0.5
        ref = torch.nn.functional.linear(a, w)
        row: dict[str, Any] = {"cublas": {"ms": do_bench(lambda: torch.nn.functional.linear(a, w))}}
        for bm, bn, bk, stages in configs:
            cname = f"{variant}-{bm}x{bn}x{bk}-s{stages}"
            c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
            call = gemm_pingpong(a, w, c, bm, bn, bk, stages, regs=regs, maxnreg=maxnreg,
                                 consumers=consumers)  # fmt: skip
            try:
                call()
                torch.cuda.synchronize()
            except triton.CompilationError as exc:
                row[cname] = {"error": f"{type(exc).__name__}: {exc}"[-800:]}
                continue
            err = float((c.float() - ref.float()).norm() / ref.float().norm())
            ok = bool(torch.isfinite(c).all()) and err < 1e-2
            row[cname] = {"relative_error": err, "ms": do_bench(call) if ok else None}
            base = row["cublas"]["ms"]
            ratio = f"{base / row[cname]['ms']:.3f}x" if row[cname]["ms"] else "-"
            print(f"{name:22s} {cname:24s} {ratio:8s} rel {err:.2g}", flush=True)
        out[name] = row
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    parser.add_argument("--child", help="variant to run in this process (internal)")
    parser.add_argument("--shapes", default=",".join(s[0] for s in SHAPES))
    parser.add_argument("--configs", default="all")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args()
    shapes = args.shapes.split(",")
    configs = (
        list(CONFIGS)
        if args.configs == "all"
        else [CONFIGS[int(i)] for i in args.configs.split(",")]
    )
    if args.child:
        print("RESULT " + json.dumps(run(args.child, shapes, configs)), flush=True)
        return 0
    import subprocess

    report: dict[str, Any] = {"device": torch.cuda.get_device_name(0), "variants": {}}
    for variant in args.variants.split(","):
        # A small check first in its own process (a faulting kernel kills its CUDA context).
        for cfg in range(len(CONFIGS)):
            try:
                proc = subprocess.run(
                    [sys.executable, __file__, "--child", variant, "--shapes", "gpt2-b8-attn-out",
                     "--configs", str(cfg)], capture_output=True, text=True, timeout=60,
                )  # fmt: skip
            except subprocess.TimeoutExpired:
                report["variants"][f"{variant}-check-{cfg}"] = {"rc": "hung", "tail": ""}
                print(variant, cfg, "hung", flush=True)
                continue
            key = f"{variant}-check-{cfg}"
            report["variants"][key] = {
                "rc": proc.returncode,
                "tail": (proc.stdout + proc.stderr)[-600:],
            }
            print(key, "rc", proc.returncode, proc.stdout.strip().splitlines()[:1], flush=True)
        good = [str(i) for i in range(len(CONFIGS))
                if report["variants"][f"{variant}-check-{i}"]["rc"] == 0]  # fmt: skip
        if not good:
            continue
        proc = subprocess.run(
            [sys.executable, __file__, "--child", variant, "--configs", ",".join(good)],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        print(proc.stdout[-6000:], proc.stderr[-1500:], flush=True)
        lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        report["variants"][variant] = (
            json.loads(lines[-1][7:]) if lines else {"rc": proc.returncode}
        )
        if args.out:
            Path(args.out).write_text(json.dumps(report, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
