"""Probe: where does triton.conv2d's direct depthwise kernel spend its instructions, and do
fewer of them make it faster than cuDNN on ConvNeXt-T's NHWC 7x7 depthwise layers?

The kernel (``_depthwise_kernel``) converts every loaded fp16 element to float32 once per
filter tap it meets (sm_90 has no fp16-times-fp16-into-fp32 FMA on its CUDA cores), so a
tap costs an FFMA and a conversion per element (SASS read on the VM: 224 FFMA and 280 HADD2
a filter row for 32 x 32 tiles on one warp). Variants, each a constexpr of one kernel here:

- ``ACC16``: a filter row's taps multiplied and summed in packed fp16 (HFMA2, two elements
  an instruction, no conversions), each row's partial sum then added into float32; the
  7-term partial sums round in fp16, so the error grows (checked against a float32
  convolution below, tunehub's fp16 tolerance 2e-3 of the norm).
- ``FLAT``: a program's BLOCK_M pixels consecutive in the flattened (image, row, column)
  order instead of a box of rows of TILE_W within one image: no lanes idle where a
  power-of-two box overhangs a 14 x 14 or 7 x 7 image (a quarter of them at 8 x 8).

KH is a run-time argument as in the production kernel (a constant trip count gets the row
loop unrolled by ptxas and the registers spill).

    python benchmarks/probes/depthwise_acc.py --out depthwise_acc.json
    python benchmarks/probes/depthwise_acc.py --sass          # sm_90 build and counts, no GPU

NHWC fp16, stride 1 (batch 32); each output checked; medians of ``triton.testing.do_bench``;
cuDNN (``F.conv2d`` on channels-last tensors) timed before and after each shape.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import subprocess
import sys
import time
from typing import Any

import torch
import triton
import triton.language as tl

sys.path.insert(0, ".")

from tunehub.kernels.triton_conv_kernels import _store_pixels


@triton.jit
def _filter_row(
    acc, x_tile, w_col, fh, ih0, iw0, rows, col_in, H, W, sxh, sxw, swh, sww,
    KW: tl.constexpr, ACC16: tl.constexpr,
):  # fmt: skip
    # One filter row's KW taps added into acc (float32); with ACC16 summed in x's dtype first.
    ih = ih0 + fh
    h_in = rows & (ih >= 0) & (ih < H)
    part = tl.zeros(acc.shape, dtype=x_tile.dtype.element_ty)
    for fw in tl.static_range(KW):
        iw = iw0 + fw
        ok = h_in & (iw >= 0) & (iw < W)
        a = tl.load(x_tile + (fh * sxh + fw * sxw), mask=ok[:, None] & col_in[None, :], other=0.0)
        f = tl.load(w_col + fh * swh + fw * sww, mask=col_in, other=0.0)
        if ACC16:
            part = tl.fma(a, f[None, :], part)
        else:
            acc += a.to(tl.float32) * f.to(tl.float32)[None, :]
    if ACC16:
        acc += part.to(tl.float32)
    return acc


@triton.jit
def _dw(
    x, w, y,
    CHANNELS, H, W, OH, OW, TILES_H, TILES_W, PH, PW, NPIX,
    sxn, sxh, sxw, swo, swh, sww, syn, syo, syh, syw,
    KH, KW: tl.constexpr, TILE_W: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, ACC16: tl.constexpr, FLAT: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    i = tl.arange(0, BLOCK_M)
    if FLAT:
        # BLOCK_M consecutive output pixels of the flattened (image, row, column) order: no
        # lanes lost where a pow2 box overhangs a 14 x 14 or 7 x 7 image.
        rm = pid * BLOCK_M + i
        img = rm // (OH * OW)
        pix = rm % (OH * OW)
        oh = pix // OW
        ow = pix % OW
        rows = rm < NPIX
    else:
        img = pid // (TILES_H * TILES_W)
        tile = pid % (TILES_H * TILES_W)
        oh = tile // TILES_W * (BLOCK_M // TILE_W) + i // TILE_W
        ow = tile % TILES_W * TILE_W + i % TILE_W
        rows = (oh < OH) & (ow < OW)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_in = rn < CHANNELS
    ih0 = oh - PH
    iw0 = ow - PW
    x_tile = x + (img.to(tl.int64) * sxn + ih0 * sxh + iw0 * sxw)[:, None] + rn[None, :]
    w_col = w + rn * swo
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for fh in range(KH):
        acc = _filter_row(acc, x_tile, w_col, fh, ih0, iw0, rows, col_in, H, W,
                          sxh, sxw, swh, sww, KW, ACC16)  # fmt: skip
    _store_pixels(y, acc, img, oh, ow, rn, syn, syo, syh, syw, rows[:, None] & col_in[None, :])


@triton.jit
def _pick(a0, a1, a2, a3, T: tl.constexpr, v):
    # a_T += v for a constexpr T: the strip's accumulators as named values.
    if T == 0:
        a0 += v
    elif T == 1:
        a1 += v
    elif T == 2:
        a2 += v
    else:
        a3 += v
    return a0, a1, a2, a3


@triton.jit
def _dw_strip(
    x, w, y,
    CHANNELS, H, W, OH, OW, STRIPS_W, NSTRIPS, PH, PW,
    sxn, sxh, sxw, swo, swh, sww, syn, syo, syh, syw,
    KH, KW: tl.constexpr, STRIP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    # Each of the tile's BLOCK_M rows is a strip of STRIP consecutive output pixels of one
    # output row: a filter row loads the STRIP + KW - 1 input pixels the strip reaches once
    # (converted to float32 once) and adds each into the STRIP accumulators it reaches.
    s = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    valid = s < NSTRIPS
    img = s // (OH * STRIPS_W)
    r = s % (OH * STRIPS_W)
    oh = r // STRIPS_W
    ow0 = (r % STRIPS_W) * STRIP
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_in = rn < CHANNELS
    base = x + (img.to(tl.int64) * sxn)[:, None] + rn[None, :]
    w_col = w + rn * swo
    a0 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    a1 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    a2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    a3 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for fh in range(KH):
        ih = oh - PH + fh
        h_ok = valid & (ih >= 0) & (ih < H)
        row = base + (ih * sxh)[:, None]
        fs = ()
        for fw in tl.static_range(KW):
            f = tl.load(w_col + fh * swh + fw * sww, mask=col_in, other=0.0)
            fs = fs + (f.to(tl.float32)[None, :],)  # noqa: RUF005 (Triton builds tuples so)
        for j in tl.static_range(STRIP + KW - 1):
            iw = ow0 - PW + j
            ok = h_ok & (iw >= 0) & (iw < W)
            v = tl.load(row + (iw * sxw)[:, None], mask=ok[:, None] & col_in[None, :], other=0.0)
            v = v.to(tl.float32)
            for fw in tl.static_range(KW):
                if j - fw >= 0 and j - fw < STRIP:
                    a0, a1, a2, a3 = _pick(a0, a1, a2, a3, j - fw, v * fs[fw])
    ok = valid[:, None] & col_in[None, :]
    _store_pixels(y, a0, img, oh, ow0, rn, syn, syo, syh, syw, ok & (ow0 < OW)[:, None])
    if STRIP > 1:
        _store_pixels(y, a1, img, oh, ow0 + 1, rn, syn, syo, syh, syw, ok & (ow0 + 1 < OW)[:, None])
    if STRIP > 2:
        _store_pixels(y, a2, img, oh, ow0 + 2, rn, syn, syo, syh, syw, ok & (ow0 + 2 < OW)[:, None])
        _store_pixels(y, a3, img, oh, ow0 + 3, rn, syn, syo, syh, syw, ok & (ow0 + 3 < OW)[:, None])


def launch_strip(x, w, y, k, pad, cfg):
    n, c, h, wd = x.shape
    oh, ow = y.shape[2], y.shape[3]
    bm, bn, strip = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["STRIP"]
    strips_w = triton.cdiv(ow, strip)
    nstrips = n * oh * strips_w
    grid = (triton.cdiv(nstrips, bm), triton.cdiv(c, bn))
    sx, sw, sy = x.stride(), w.stride(), y.stride()
    args = (x, w, y, c, h, wd, oh, ow, strips_w, nstrips, pad, pad, sx[0], sx[2], sx[3],
            sw[0], sw[2], sw[3], sy[0], sy[1], sy[2], sy[3], k)  # fmt: skip
    kw = {"KW": k, "STRIP": strip, "BLOCK_M": bm, "BLOCK_N": bn, "num_stages": 1,
          "num_warps": cfg["num_warps"]}  # fmt: skip
    return grid, args, kw


def launch(x, w, y, k, pad, cfg):
    n, c, h, wd = x.shape
    oh, ow = y.shape[2], y.shape[3]
    bm, bn, tw = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["TILE_W"]
    th, tiles_w = triton.cdiv(oh, bm // tw), triton.cdiv(ow, tw)
    npix = n * oh * ow
    blocks = triton.cdiv(npix, bm) if cfg["FLAT"] else n * th * tiles_w
    grid = (blocks, triton.cdiv(c, bn))
    sx, sw, sy = x.stride(), w.stride(), y.stride()
    args = (x, w, y, c, h, wd, oh, ow, th, tiles_w, pad, pad, npix, sx[0], sx[2], sx[3],
            sw[0], sw[2], sw[3], sy[0], sy[1], sy[2], sy[3], k)  # fmt: skip
    kw = {"KW": k, "TILE_W": tw, "BLOCK_M": bm, "BLOCK_N": bn, "ACC16": cfg["ACC16"],
          "FLAT": cfg["FLAT"], "num_stages": 1, "num_warps": cfg["num_warps"]}  # fmt: skip
    return grid, args, kw


TILES = [  # (BLOCK_M, BLOCK_N, num_warps, TILE_W): triton.conv2d's NHWC depthwise seeds first
    (32, 32, 1, 8),
    (64, 64, 2, 8),
    (32, 32, 1, 32),
    (64, 32, 2, 16),
    (32, 128, 4, 16),
    (128, 32, 4, 32),
    (32, 64, 2, 8),
    (64, 32, 1, 8),
    (16, 64, 1, 8),
    (64, 64, 4, 8),
    (32, 64, 1, 8),
    (16, 32, 1, 4),
]
CONFIGS = [
    {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": nw, "TILE_W": tw, "ACC16": acc16, "FLAT": flat}
    for (bm, bn, nw, tw), acc16, flat in itertools.product(TILES, (False, True), (False, True))
    if not (flat and tw != 8)  # TILE_W means nothing to a flat tile: one of each
]
STRIP_CONFIGS = [
    {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": nw, "STRIP": strip, "ACC16": False,
     "FLAT": None}
    for bm, bn, nw, strip in itertools.product((16, 32, 64), (32, 64), (1, 2, 4, 8), (2, 4))
    if 4 <= bm * bn // (32 * nw) <= 16
]  # fmt: skip
SHAPES = [  # (name, batch, channels, size, kernel, dtype)
    ("convnext-dw-56", 32, 96, 56, 7, torch.float16),
    ("convnext-dw-28", 32, 192, 28, 7, torch.float16),
    ("convnext-dw-14", 32, 384, 14, 7, torch.float16),
    ("convnext-dw-7", 32, 768, 7, 7, torch.float16),
    ("convnext-dw-14-bf16", 32, 384, 14, 7, torch.bfloat16),
]


def sass_counts() -> None:
    from triton.backends.compiler import GPUTarget

    from tunehub.kernels.triton_gemm_kernels import _compile_like_jit

    x = torch.zeros(32, 384, 14, 14, dtype=torch.float16).to(memory_format=torch.channels_last)
    w = torch.zeros(384, 1, 7, 7, dtype=torch.float16).to(memory_format=torch.channels_last)
    y = torch.zeros_like(x)
    for cfg in CONFIGS[:4]:
        _, args, kw = launch(x, w, y, 7, 3, cfg)
        compiled, _ = _compile_like_jit(_dw, GPUTarget("cuda", 90, 32), args, kw)
        with open("/tmp/dw_probe.cubin", "wb") as f:
            f.write(compiled.asm["cubin"])
        sass = subprocess.run(
            [triton.knobs.nvidia.cuobjdump.path, "-sass", "/tmp/dw_probe.cubin"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        ops: collections.Counter[str] = collections.Counter()
        for line in sass.splitlines():
            parts = line.split("*/")
            if len(parts) < 3 or not line.strip().startswith("/*"):
                continue
            words = parts[1].split()
            if words and words[0].startswith("@"):
                words = words[1:]
            if words:
                ops[words[0].split(".")[0]] += 1
        keep = ("FFMA", "HFMA2", "HADD2", "HMUL2", "FADD", "LDG", "ISETP", "IMAD", "IADD3")
        print(cfg, {k: ops[k] for k in keep}, "total", sum(ops.values()))


def profile_target() -> None:
    dev = torch.device("cuda")
    x = torch.randn(32, 384, 14, 14, device=dev, dtype=torch.float16)
    x = x.to(memory_format=torch.channels_last)
    w = torch.randn(384, 1, 7, 7, device=dev, dtype=torch.float16)
    w = w.to(memory_format=torch.channels_last)
    y = torch.empty_like(x)
    for _ in range(2):
        torch.nn.functional.conv2d(x, w, padding=3, groups=384)
        for cfg in (CONFIGS[0], CONFIGS[2]):
            grid, a, kw = launch(x, w, y, 7, 3, cfg)
            _dw[grid](*a, **kw)
    torch.cuda.synchronize()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="depthwise_acc.json")
    p.add_argument("--sass", action="store_true")
    p.add_argument("--shapes", default="")
    p.add_argument("--variants", default="all", help="all, or plain: no ACC16 or FLAT rows")
    p.add_argument(
        "--profile-target",
        action="store_true",
        help="run cuDNN and the first tile (float32, ACC16) once on dw-14, for ncu",
    )
    args = p.parse_args()
    if args.sass:
        sass_counts()
        return
    if args.profile_target:
        profile_target()
        return
    from triton.testing import do_bench

    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda")
    results: dict[str, Any] = {
        "probe": "depthwise_acc",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "shapes": [],
    }
    wanted = set(filter(None, args.shapes.split(",")))
    for name, n, c, s, k, dtype in SHAPES:
        if wanted and name not in wanted:
            continue
        pad = k // 2
        g = torch.Generator(device=dev).manual_seed(1)
        x = torch.empty(n, c, s, s, device=dev, dtype=dtype).uniform_(-1, 1, generator=g)
        w = torch.empty(c, 1, k, k, device=dev, dtype=dtype).uniform_(-1, 1, generator=g)
        x = x.to(memory_format=torch.channels_last)
        w = w.to(memory_format=torch.channels_last)
        ref = torch.nn.functional.conv2d(x.float(), w.float(), padding=pad, groups=c)
        ref_norm = ref.norm().item()

        def cudnn(x=x, w=w, pad=pad, c=c):
            return torch.nn.functional.conv2d(x, w, padding=pad, groups=c)

        cudnn_err = ((cudnn().float() - ref).norm() / ref_norm).item()
        before = do_bench(cudnn, warmup=25, rep=100, return_mode="median")
        rows = []
        todo = [c for c in CONFIGS if args.variants == "all" or not (c["ACC16"] or c["FLAT"])]
        for cfg in todo + STRIP_CONFIGS:
            y = torch.full(ref.shape, float("nan"), device=dev, dtype=dtype)
            y = y.to(memory_format=torch.channels_last)
            if "STRIP" in cfg:
                grid, a, kw = launch_strip(x, w, y, k, pad, cfg)
                kern = _dw_strip[grid]
            else:
                grid, a, kw = launch(x, w, y, k, pad, cfg)
                kern = _dw[grid]
            kern(*a, **kw)
            torch.cuda.synchronize()
            err = ((y.float() - ref).norm() / ref_norm).item()
            ms = do_bench(lambda kern=kern, a=a, kw=kw: kern(*a, **kw), warmup=25, rep=100,
                          return_mode="median")  # fmt: skip
            rows.append({"config": cfg, "ms": ms, "rel_err": err})
        # triton.conv2d's own kernel on three tiles: the probe's float32 path should match it.
        from tunehub.core.workload import Workload
        from tunehub.kernels import triton_conv_kernels as ck

        workload = Workload.from_dict({
            "op": "conv2d", "batch": n, "in_channels": c, "out_channels": c, "height": s,
            "width": s, "kernel_h": k, "kernel_w": k, "pad_h": pad, "pad_w": pad, "groups": c,
            "data_layout": "nhwc", "dtype": "float16" if dtype == torch.float16 else "bfloat16",
        })  # fmt: skip
        for bm, bn, nw, tw in ((32, 32, 1, 8), (64, 64, 2, 8), (64, 64, 2, 16)):
            cfg = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 16, "GROUP_M": 1, "num_warps": nw,
                   "num_stages": 1, "TILE_W": tw, "REPACK": False}  # fmt: skip
            y = torch.full(ref.shape, float("nan"), device=dev, dtype=dtype)
            y = y.to(memory_format=torch.channels_last)
            (ln,) = ck.conv_launches(x, w, y, workload, cfg)
            call = ln.bind()
            call()
            torch.cuda.synchronize()
            err = ((y.float() - ref).norm() / ref_norm).item()
            ms = do_bench(call, warmup=25, rep=100, return_mode="median")
            rows.append({"config": {**cfg, "ACC16": None, "kernel": "triton.conv2d"}, "ms": ms,
                         "rel_err": err})  # fmt: skip
        after = do_bench(cudnn, warmup=25, rep=100, return_mode="median")
        vendor = min(before, after)
        best = {}
        tol = 2e-3 if dtype == torch.float16 else 1.5e-2

        def kind(c):
            if c["ACC16"] is None:
                return "triton.conv2d"
            if "STRIP" in c:
                return "fp32-strip"
            return ("acc16" if c["ACC16"] else "fp32") + ("-flat" if c["FLAT"] else "-box")

        for r in rows:
            if r["rel_err"] < tol:
                k_ = kind(r["config"])
                if k_ not in best or r["ms"] < best[k_]["ms"]:
                    best[k_] = {**r, "vs_cudnn": vendor / r["ms"]}
        shape = {"name": name, "batch": n, "channels": c, "size": s, "kernel": k,
                 "cudnn_ms": [before, after], "cudnn_rel_err": cudnn_err, "best": best,
                 "rows": rows}  # fmt: skip
        results["shapes"].append(shape)
        print(
            name, "cudnn us", [round(v * 1e3, 1) for v in (before, after)], f"err {cudnn_err:.2e}"
        )
        for label, b in best.items():
            print(
                f"  {label}: {b['ms'] * 1e3:.1f} us {b['vs_cudnn']:.3f}x",
                f"err {b['rel_err']:.2e} {b['config']}",
            )
        for r in rows:
            if r["config"]["ACC16"] is None:
                print(
                    "  triton.conv2d",
                    r["config"]["BLOCK_M"],
                    r["config"]["BLOCK_N"],
                    r["config"]["num_warps"],
                    r["config"]["TILE_W"],
                    f"{r['ms'] * 1e3:.1f} us",
                )
        errs = [r["rel_err"] for r in rows if r["config"]["ACC16"]]
        if errs:
            print(f"  acc16 errors {min(errs):.2e}-{max(errs):.2e}")
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
