"""Probe: warp specialisation for the NHWC 3x3s at 7x7 and 14x14 (issue 24).

Nsight Compute read cuDNN's kernel for these layers (conv_l2 probe) as a warp-specialised one
(384 threads: a producer warpgroup and two consumers) in clusters of 4, 104-120 CTAs, at
42-48% of the SMs' tensor rate; triton.conv2d's TMA kernel (one tile a program, no warp
specialisation) reached 33-36%. Two questions, both timed beside cuDNN / cuBLAS with
``do_bench`` medians and checked:

A. On the layers' im2col GEMMs (1,568 x 512 x 4,608 and 6,272 x 256 x 2,304), is
   ``triton.gemm``'s ``ws`` variant (Triton 3.6's producer/consumer split on sm_90) ahead of
   its ``tma`` variant?
B. Does the conv TMA kernel gain from it: a persistent copy of ``_conv2d_tma_kernel`` with
   in-kernel descriptors and ``tl.range(..., warp_specialize=WS)`` on the tile loop, WS on and
   off, against the template's own kernel.

    python benchmarks/probes/conv_ws.py --out result.json
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import time

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.testing import do_bench

from tunehub.core import Config, Workload
from tunehub.kernels import triton_conv_kernels as kernels
from tunehub.kernels import triton_gemm_kernels as gemm
from tunehub.kernels.cuda_device import cuda_target
from tunehub.kernels.triton_conv_kernels import _store_pixels, _tap_step, _tile_coords
from tunehub.kernels.triton_gemm import TritonGemmTemplate, kernel_config

BATCH = 32
CASES = {"resnet50-3x3-7": (512, 7), "resnet50-3x3-14": (256, 14)}
# (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, TILE_H, TILE_W) for the conv kernels, num_warps 4.
CONV_TILES = {
    "resnet50-3x3-7": [
        (64, 128, 64, 3, 1, 8), (64, 128, 128, 3, 1, 8), (64, 256, 64, 3, 1, 8),
        (128, 128, 64, 3, 1, 8), (128, 64, 64, 4, 1, 8), (64, 64, 64, 4, 1, 8),
        (128, 256, 64, 3, 1, 8),
    ],
    "resnet50-3x3-14": [
        (64, 128, 64, 3, 2, 8), (128, 128, 64, 3, 1, 16), (128, 128, 64, 4, 2, 8),
        (64, 256, 64, 3, 2, 8), (128, 64, 64, 4, 2, 8), (64, 128, 128, 3, 2, 8),
        (128, 256, 64, 3, 2, 8),
    ],
}  # fmt: skip


def _scratch(size: int, alignment: int, stream) -> torch.Tensor:
    return torch.empty(size, dtype=torch.int8, device="cuda")


@triton.jit
def conv_ws_kernel(
    x_ptr, w_ptr, y,
    BATCH, H, W, C, OH, OW, OCG, KW, TAPS, STEPS, CHANNEL_BLOCKS, TILES_B, TILES_H, TILES_W,
    PH, PW, sxn, sxh, sxw, swo, syn, syo, syh, syw,
    NUM_SMS: tl.constexpr, TILE_B: tl.constexpr, TILE_H: tl.constexpr, TILE_W: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, WS: tl.constexpr,
):  # fmt: skip
    BLOCK_M: tl.constexpr = TILE_B * TILE_H * TILE_W
    x_desc = tl.make_tensor_descriptor(
        x_ptr, shape=[BATCH, H, W, C], strides=[sxn, sxh, sxw, 1],
        block_shape=[TILE_B, TILE_H, TILE_W, BLOCK_K],
    )  # fmt: skip
    w_desc = tl.make_tensor_descriptor(
        w_ptr, shape=[OCG, TAPS * C], strides=[swo, 1], block_shape=[BLOCK_N, BLOCK_K]
    )
    num_m = TILES_B * TILES_H * TILES_W
    num_n = tl.cdiv(OCG, BLOCK_N)
    for tile in tl.range(tl.program_id(0), num_m * num_n, NUM_SMS, warp_specialize=WS):
        pid_m, pid_n = _tile_coords(tile, num_m, num_n, GROUP_M)
        n0 = pid_m // (TILES_H * TILES_W) * TILE_B
        oh0 = pid_m // TILES_W % TILES_H * TILE_H
        ow0 = pid_m % TILES_W * TILE_W
        oc0 = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for step in range(STEPS):
            tap, c0, fh, fw = _tap_step(step, CHANNEL_BLOCKS, KW, BLOCK_K)
            a = x_desc.load([n0, oh0 + fh - PH, ow0 + fw - PW, c0])
            a = tl.reshape(a, (BLOCK_M, BLOCK_K))
            b = w_desc.load([oc0, tap * C + c0])
            acc = tl.dot(a, b.T, acc)
        i = tl.arange(0, BLOCK_M)
        img = n0 + i // (TILE_H * TILE_W)
        oh = oh0 + i // TILE_W % TILE_H
        ow = ow0 + i % TILE_W
        rn = oc0 + tl.arange(0, BLOCK_N)
        ok = (img < BATCH) & (oh < OH) & (ow < OW)
        _store_pixels(
            y, acc, img, oh, ow, rn, syn, syo, syh, syw, ok[:, None] & (rn < OCG)[None, :]
        )


def conv_workload(ch: int, side: int) -> Workload:
    return Workload.from_dict({
        "op": "conv2d", "dtype": "float16", "batch": BATCH, "in_channels": ch,
        "out_channels": ch, "height": side, "width": side, "kernel_h": 3, "kernel_w": 3,
        "pad_h": 1, "pad_w": 1, "data_layout": "nhwc",
    })  # fmt: skip


def med(fn, reps: int = 3) -> float:
    return (
        sorted(do_bench(fn, warmup=25, rep=100, return_mode="median") for _ in range(reps))[
            reps // 2
        ]
        * 1e3
    )


def rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    o = out.double()
    if not bool(torch.isfinite(o).all()):
        return float("inf")
    return float(torch.linalg.vector_norm(o - ref) / torch.linalg.vector_norm(ref))


def part_a(target, per_variant: int, log) -> list[dict]:
    rows = []
    tmpl = TritonGemmTemplate()
    for name, (ch, side) in CASES.items():
        m, n, k = BATCH * side * side, ch, 9 * ch
        a = torch.empty(m, k, device="cuda").uniform_(-1, 1).half()
        wt = torch.empty(n, k, device="cuda").uniform_(-1, 1).half()
        ref = a.double() @ wt.double().t()
        cublas = lambda a=a, wt=wt: F.linear(a, wt)  # noqa: E731
        cub = med(cublas)
        wl = Workload(op="matmul", m=m, n=n, k=k, dtype="float16", b_layout="col_major")
        pts = [p for p in tmpl.space(wl, target).points if p["GROUP_M"] == 8]
        rng = random.Random(0)
        for variant in ("ws", "tma"):
            mine = [p for p in pts if p["variant"] == variant and p["BLOCK_M"] in (64, 128)
                    and p["BLOCK_N"] in (64, 128, 256) and p["BLOCK_K"] in (64, 128)]  # fmt: skip
            for cfg in rng.sample(mine, min(per_variant, len(mine))):
                d = cfg.to_dict()
                out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
                try:
                    fn = gemm.bind(a, wt.t(), None, out, allow_tf32=False,
                                   config=kernel_config(Config(d)))  # fmt: skip
                    fn()
                    torch.cuda.synchronize()
                    err = rel(out, ref)
                    row = {"part": "A", "case": name, "variant": variant, "config": d,
                           "rel_error": err, "cublas_us": cub}  # fmt: skip
                    if err < 2e-3:
                        row["us"] = med(fn, 1)
                        row["vs_cublas"] = cub / row["us"]
                except Exception as exc:
                    row = {"part": "A", "case": name, "variant": variant, "config": d,
                           "error": f"{type(exc).__name__}: {str(exc)[:200]}"}  # fmt: skip
                rows.append(row)
            best = max((r for r in rows if r.get("variant") == variant and r["case"] == name
                        and "us" in r), key=lambda r: r["vs_cublas"], default=None)  # fmt: skip
            if best:
                log(f"A {name} {variant}: best {best['us']:.1f} us, {best['vs_cublas']:.3f}x "
                    f"cuBLAS ({cub:.1f} us) {best['config']}")  # fmt: skip
    return rows


def part_b(sms: int, log) -> list[dict]:
    rows = []
    dev = torch.device("cuda")
    for name, (ch, side) in CASES.items():
        wl = conv_workload(ch, side)
        ops = kernels.operands(wl, dev, 0)
        ref = kernels.reference(ops)
        cudnn = lambda ops=ops: F.conv2d(ops.x, ops.w, padding=1)  # noqa: E731
        cud = med(cudnn)
        x, w, y = ops.x, ops.w, ops.out
        sx, sy = x.stride(), y.stride()
        for bm, bn, bk, stages, th, tw in CONV_TILES[name]:
            tb = bm // (th * tw)
            tiles = (triton.cdiv(BATCH, tb), triton.cdiv(side, th), triton.cdiv(side, tw))
            cb = triton.cdiv(ch, bk)
            num_tiles = tiles[0] * tiles[1] * tiles[2] * triton.cdiv(ch, bn)
            for ws in (False, True):
                row = {"part": "B", "case": name, "tile": [bm, bn, bk, stages, th, tw], "ws": ws,
                       "cudnn_us": cud}  # fmt: skip
                grid = (min(sms, num_tiles),)

                args = (
                    x,
                    w,
                    y,
                    BATCH,
                    side,
                    side,
                    ch,
                    side,
                    side,
                    ch,
                    3,
                    9,
                    9 * cb,
                    cb,
                    *tiles,
                    1,
                    1,
                    sx[0],
                    sx[2],
                    sx[3],
                    w.stride(0),
                    *sy,
                )
                kw = {
                    "NUM_SMS": sms,
                    "TILE_B": tb,
                    "TILE_H": th,
                    "TILE_W": tw,
                    "BLOCK_N": bn,
                    "BLOCK_K": bk,
                    "GROUP_M": 8,
                    "WS": ws,
                    "num_warps": 4,
                    "num_stages": stages,
                }
                fn = functools.partial(conv_ws_kernel[grid], *args, **kw)
                try:
                    y.fill_(float("nan"))
                    fn()
                    torch.cuda.synchronize()
                    row["rel_error"] = rel(y, ref)
                    if row["rel_error"] < 2e-3:
                        row["us"] = med(fn, 1)
                        row["vs_cudnn"] = cud / row["us"]
                except Exception as exc:
                    row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                rows.append(row)
                log(f"B {row}")
            # The template's own kernel at the same tile (one tile a program, host descriptors).
            cfg = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 1, "num_warps": 4,
                   "num_stages": stages, "REPACK": False, "PATCH": "tap", "TMA": True,
                   "TILE_H": th, "TILE_W": tw}  # fmt: skip
            row = {"part": "B", "case": name, "tile": [bm, bn, bk, stages, th, tw],
                   "template": True, "cudnn_us": cud}  # fmt: skip
            try:
                fn2 = kernels.bind(ops, cfg)
                y.fill_(float("nan"))
                fn2()
                torch.cuda.synchronize()
                row["rel_error"] = rel(y, ref)
                row["us"] = med(fn2, 1)
                row["vs_cudnn"] = cud / row["us"]
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            rows.append(row)
            log(f"B {row}")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--per-variant", type=int, default=20)
    ap.add_argument("--parts", default="B,A")
    args = ap.parse_args()
    triton.set_allocator(_scratch)
    torch.backends.cudnn.benchmark = True
    target = cuda_target()
    result = {"probe": "conv_ws", "gpu": torch.cuda.get_device_name(),
              "torch": torch.__version__, "triton": triton.__version__,
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "rows": [], "log": []}  # fmt: skip

    def log(s: str) -> None:
        print(s, flush=True)
        result["log"].append(s)

    for part in args.parts.split(","):
        if part == "B":
            result["rows"] += part_b(target.cores, log)
        else:
            result["rows"] += part_a(target, args.per_variant, log)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
