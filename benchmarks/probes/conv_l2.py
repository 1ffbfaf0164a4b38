"""Probe: what bounds triton.conv2d's NHWC 3x3s at 7x7 and 14x14 against cuDNN (issue 24).

ResNet-50's 3x3s at 7x7 (512 channels) and 14x14 (256), batch 32, fp16 NHWC, stay at 0.71x and
0.83x of cuDNN on the TMA kernel's best tiles (64 x 128), while bigger tiles leave SMs idle
(52-98 tiles of 128 x 128 for 132 SMs). A tile of BM x BN pixels x channels reads
(BM + BN) x BK elements a K step from L2, so the whole GEMM reads
M x N x K x (1 / BM + 1 / BN) x 2 bytes: for 64 x 128 at these shapes ~200 MB in ~28 us.
This probe measures (1) the L2's read bandwidth (a buffer that fits in L2, read many times
over), (2) each kernel's time beside cuDNN's (``do_bench`` medians) and (3) under Nsight
Compute, the L2 and tensor-pipe throughput of the two best TMA tiles, a 128 x 128 tile and
cuDNN's own kernels (and their cluster size).

    python benchmarks/probes/conv_l2.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

from tunehub.core import Workload
from tunehub.kernels import triton_conv_kernels as kernels

BASE = {"GROUP_M": 1, "REPACK": False, "PATCH": "tap", "TMA": True}
CASES = {
    # The best tiles of the split-K probe (conv_split-h200-20261127T0543.json), then 128 x 128.
    "resnet50-3x3-7": (512, 7, [
        {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 128, "num_warps": 8, "num_stages": 4,
         "TILE_H": 1, "TILE_W": 8},
        {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3,
         "TILE_H": 1, "TILE_W": 8},
    ]),
    "resnet50-3x3-14": (256, 14, [
        {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 4, "num_stages": 3,
         "TILE_H": 2, "TILE_W": 8},
        {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3,
         "TILE_H": 1, "TILE_W": 16},
    ]),
}  # fmt: skip
BATCH = 32
BLOCK = 2048  # elements a program reads a step in the L2 read kernel
WANT = (
    "Duration", "L2 Cache Throughput", "DRAM Throughput", "Compute (SM) Throughput",
    "Memory Throughput", "L1/TEX Cache Throughput", "Grid Size", "Block Size", "Cluster",
    "Registers Per Thread", "Achieved Occupancy", "L2 Hit Rate", "Mem Busy", "Max Bandwidth",
    "Shared Memory Configuration Size", "Waves Per SM",
)  # fmt: skip


def workload(ch: int, side: int) -> Workload:
    return Workload.from_dict({
        "op": "conv2d", "dtype": "float16", "batch": BATCH, "in_channels": ch,
        "out_channels": ch, "height": side, "width": side, "kernel_h": 3, "kernel_w": 3,
        "pad_h": 1, "pad_w": 1, "data_layout": "nhwc",
    })  # fmt: skip


def launches(device: torch.device):
    """Per case: the operands, cuDNN's call and each config's bound launch."""
    out = {}
    for name, (ch, side, configs) in CASES.items():
        wl = workload(ch, side)
        ops = kernels.operands(wl, device, 0)
        ref = kernels.reference(ops)
        cudnn = lambda ops=ops: torch.nn.functional.conv2d(ops.x, ops.w, padding=1)  # noqa: E731
        bound = []
        for c in configs:
            cfg = {**BASE, **c}
            fn = kernels.bind(ops, cfg)
            fn()
            torch.cuda.synchronize()
            chk = kernels.check(ops.out, ref, "float16")
            bound.append((cfg, fn, chk))
        out[name] = (wl, ops, cudnn, bound)
    return out


@triton.jit
def _l2_read(src, dst, n_elems, PASSES: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    progs = tl.num_programs(0)
    acc = tl.zeros((BLOCK,), tl.float32)
    for _ in range(PASSES):
        for start in range(pid * BLOCK, n_elems, progs * BLOCK):
            offs = start + tl.arange(0, BLOCK)
            acc += tl.load(src + offs, mask=offs < n_elems, other=0.0).to(tl.float32)
    tl.store(dst + pid * BLOCK + tl.arange(0, BLOCK), acc)


def l2_bandwidth(device: torch.device) -> list[dict]:
    """Bytes read over seconds for buffers that fit in L2 (and one that does not), each read
    PASSES times by 4 programs an SM; CUDA events around 10 calls after a warm one."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    rows = []
    for mb in (8, 16, 24, 32, 1024):
        n = mb * 2**20 // 2
        src = torch.randn(n, device=device, dtype=torch.float16)
        block = BLOCK
        progs = 4 * sms
        dst = torch.empty(progs * block, device=device, dtype=torch.float32)
        passes = 1 if mb >= 1024 else 20

        def fn(src=src, dst=dst, n=n, passes=passes, progs=progs) -> None:
            _l2_read[(progs,)](src, dst, n, PASSES=passes, BLOCK=BLOCK, num_warps=8)

        fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(5):
            start.record()
            for _ in range(10):
                fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 10 / 1e3)
        secs = sorted(times)[2]
        rows.append({"buffer_mb": mb, "passes": passes, "secs": secs,
                     "tb_per_s": n * 2 * passes / secs / 1e12})  # fmt: skip
        print(f"read {mb} MB x {passes}: {rows[-1]['tb_per_s']:.2f} TB/s", flush=True)
    return rows


def l2_bytes(wl: Workload, cfg: dict) -> float:
    """The A and B bytes a grid of BM x BN tiles reads from L2 (boxes' padding counted)."""
    d = {"n": BATCH, "side": int(wl.param("height"))}
    th, tw = cfg["TILE_H"], cfg["TILE_W"]
    tb = cfg["BLOCK_M"] // (th * tw)
    m_eff = math.ceil(d["n"] / tb) * tb * math.ceil(d["side"] / th) * th
    m_eff *= math.ceil(d["side"] / tw) * tw
    k = 9 * int(wl.param("in_channels"))
    n = wl.n
    tiles_m, tiles_n = m_eff // cfg["BLOCK_M"], math.ceil(n / cfg["BLOCK_N"])
    return tiles_m * tiles_n * (cfg["BLOCK_M"] + cfg["BLOCK_N"]) * k * 2.0


def ncu_child() -> None:
    device = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    cases = launches(device)
    for _, (_, _, cudnn, bound) in cases.items():
        cudnn()
        for _, fn, _ in bound:
            fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for _, (_, _, cudnn, bound) in cases.items():
        cudnn()
        for _, fn, _ in bound:
            fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--ncu-child", action="store_true")
    args = ap.parse_args()
    if args.ncu_child:
        ncu_child()
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    result: dict = {"probe": "conv_l2", "gpu": torch.cuda.get_device_name(),
                    "torch": torch.__version__, "triton": triton.__version__,
                    "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip
    result["l2_read"] = l2_bandwidth(device)
    rows = []
    for name, (wl, _, cudnn, bound) in launches(device).items():
        cud = sorted(do_bench(cudnn, warmup=25, rep=100, return_mode="median") for _ in range(3))
        for cfg, fn, chk in bound:
            us = sorted(do_bench(fn, warmup=25, rep=100, return_mode="median") for _ in range(3))
            t = us[1] * 1e3
            b = l2_bytes(wl, cfg)
            rows.append({"case": name, "config": cfg, "ok": chk.ok, "rel_error": chk.relative_error,
                         "us": t, "cudnn_us": cud[1] * 1e3, "vs_cudnn": cud[1] / us[1],
                         "l2_mb": b / 1e6, "l2_tb_per_s": b / (t * 1e-6) / 1e12})  # fmt: skip
            print(name, {k: v for k, v in rows[-1].items() if k != "config"}, flush=True)
    result["rows"] = rows
    (args.out / "conv_l2.json").write_text(json.dumps(result, indent=1))
    sys.path.insert(0, str(Path(__file__).parent))
    import ncu

    rc = ncu.profile(__file__, ["--ncu-child"], ".*", args.out / "conv_l2_ncu.csv", timeout=400,
                     sections=("SpeedOfLight", "LaunchStats", "Occupancy",
                               "MemoryWorkloadAnalysis"))  # fmt: skip
    if (args.out / "conv_l2_ncu.csv").exists():
        ncu.summarize((args.out / "conv_l2_ncu.csv").read_text(), WANT)
    return rc


if __name__ == "__main__":
    sys.exit(main())
