"""The Triton conv2d kernels, their operands, reference and check (imports torch and Triton:
GPU run sandboxes and tests only).

``_conv2d_kernel`` (implicit GEMM): one program computes a BLOCK_M x BLOCK_N tile of one
group's GEMM C[N·OH·OW, O/groups]: its rows are output pixels over the batch, its columns
output channels. Its one K loop runs over (filter tap, channel block) pairs: the tap's input
offsets and padding mask are computed once per step for the tile's rows (scalar index math,
not a division per element), then the BLOCK_M x BLOCK_K patch tile (masked loads: the padding
reads zeros) and the BLOCK_K x BLOCK_N filter tile are loaded and their ``tl.dot``
accumulated in float32. One flat loop, not nested tap and channel loops, so that Triton
pipelines it (``num_stages``) across taps. Every operand is addressed through its four
strides, so one kernel reads NCHW and NHWC (channels_last) alike; Triton specialises a stride
of 1, so the contiguous dimension's loads are vectorised. GROUP_M orders the tiles so that
GROUP_M row tiles sweep the columns together (the filters stay in L2). The grid's second axis
is the group. With ``FLAT`` (``PATCH="flat"``) a step's BLOCK_K columns are instead BLOCK_K
consecutive indices of the whole (tap, channel) patch, each with its own tap and padding
mask: few channels a group (ResNet's stem reads 3) then fill the tensor cores' K instead of
padding each tap's block of 16 with zeros.

``_conv2d_rows_kernel`` (``PATCH="rows"``, one group): the same GEMM over a copy of the input
that ``_pad_channels_last`` makes in the call: channels-last, the padding written as zeros, C
rounded up to a power of two (CP). A filter row's KW taps are then KW x CP consecutive
elements from each output pixel's first, so a step loads them as whole vectors, masked only
by row and by the row's end (a multiple of CP).

``_depthwise_kernel`` (one input channel per group): a direct convolution, no GEMM. One
program computes a block of BLOCK_M output pixels of one image, BLOCK_M / TILE_W rows of
TILE_W, x BLOCK_N output channels (a block of rows shares most of its input window between
taps, which stays in L1); for each of the filter's taps it loads the input tile at the tap's
offset from pointers computed once and one filter value per channel, and accumulates their
product in float32. The filter's rows are a loop, its columns unrolled: all 49 taps of a
7x7 unrolled took 7-11 s to compile a config on an H100 and ran no faster.

``_depthwise_strip_kernel`` (``STRIP`` > 1; stride and dilation 1 along W): the same direct
convolution with each of the program's BLOCK_M rows a strip of STRIP consecutive output pixels
of one output row (numbered over image, row and strip, so a narrow image wastes no lanes but
its last strip's overhang). A filter row loads the STRIP + KW - 1 input pixels its strips
reach once each, converts them to float32 once, and adds each, times the filter value, into
every accumulator of the strip it reaches (a tuple of STRIP tiles, the pairs chosen at compile
time): KW loads and conversions a filter row become (STRIP + KW - 1) / STRIP. The kernel
above spends as many instructions converting as multiplying (sm_90 SASS: 224 FFMA and 280
HADD2 a filter row for 32 x 32 pixels and channels on one warp).
"""

from __future__ import annotations

# mypy: disable-error-code="untyped-decorator,no-untyped-def"
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from tunehub.core import Config, Workload
from tunehub.kernels.conv2d_reference import (
    conv_dims,
    is_depthwise,
    is_nhwc,
    pointwise_bmm,
    pointwise_gemm,
)
from tunehub.kernels.triton_conv import rows_channels
from tunehub.kernels.triton_gemm_kernels import Launch, _compile_like_jit, _tile_coords
from tunehub.kernels.triton_gemm_limits import TOLERANCE

TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


@triton.jit
def _tap_step(step, CHANNEL_BLOCKS, KW, BLOCK_K: tl.constexpr):
    # Step ``step`` of the flat K loop: its filter tap (and the tap's row and column) and the
    # first input channel of its block.
    tap = step // CHANNEL_BLOCKS
    return tap, (step % CHANNEL_BLOCKS) * BLOCK_K, tap // KW, tap % KW


@triton.jit
def _mma(acc, a, b, IEEE: tl.constexpr):
    # acc + a @ b, float32 operands at full precision (IEEE) or on TF32.
    if IEEE:
        return acc + tl.dot(a, b, input_precision="ieee")
    return acc + tl.dot(a, b)


@triton.jit
def _store_pixels(y, acc, img, oh, ow, oc, syn, syo, syh, syw, mask):
    # The tile's rows are output pixels (image, row, column), its columns output channels.
    y_ptr = (
        y
        + (img.to(tl.int64) * syn + oh * syh + ow * syw)[:, None]
        + (oc.to(tl.int64) * syo)[None, :]
    )
    tl.store(y_ptr, acc.to(y.dtype.element_ty), mask=mask)


@triton.jit
def _pixel_tile(
    M, OCG, OH, OW, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr
):
    # The program's tile (grid axis 0, GROUP_M order) of the GEMM C[M = N·OH·OW, OCG]: its
    # rows and columns, and each row's output pixel (image, row, column).
    pid_m, pid_n = _tile_coords(
        tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(OCG, BLOCK_N), GROUP_M
    )
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ohw = OH * OW
    pix = rm % ohw
    return rm, rn, rm // ohw, pix // OW, pix % OW


@triton.jit
def _conv2d_kernel(
    x, w, y,
    M, H, W, OH, OW, KW, ICG, OCG, STEPS, CHANNEL_BLOCKS, PATCH,
    SH, SW, PH, PW, DH, DW,
    sxn, sxc, sxh, sxw, swo, swc, swh, sww, syn, syo, syh, syw,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, FLAT: tl.constexpr, IEEE: tl.constexpr,
):  # fmt: skip
    g = tl.program_id(1)
    rm, rn, img, oh, ow = _pixel_tile(M, OCG, OH, OW, BLOCK_M, BLOCK_N, GROUP_M)
    ih0 = oh * SH - PH
    iw0 = ow * SW - PW
    row_in = rm < M
    x_row = x + img.to(tl.int64) * sxn + g * ICG * sxc
    w_col = w + (g * OCG + rn).to(tl.int64) * swo
    col_in = rn < OCG
    x_pix = x_row + ih0 * sxh + iw0 * sxw  # each row's first tap, for FLAT
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step in range(STEPS):
        if FLAT:
            # BLOCK_K consecutive indices of the flat (tap, channel) K: the tap and channel
            # of each column, its offset in the input, and the padding per element.
            rk = step * BLOCK_K + tl.arange(0, BLOCK_K)
            tap = rk // ICG
            rc = rk % ICG
            fh = tap // KW
            fw = tap % KW
            k_in = rk < PATCH
            ih = ih0[:, None] + (fh * DH)[None, :]
            iw = iw0[:, None] + (fw * DW)[None, :]
            a_mask = (row_in[:, None] & k_in[None, :]) & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
            a_ptr = x_pix[:, None] + (fh * DH * sxh + fw * DW * sxw + rc * sxc)[None, :]
            a = tl.load(a_ptr, mask=a_mask, other=0.0)
            b_ptr = w_col[None, :] + (fh * swh + fw * sww + rc * swc)[:, None]
            b = tl.load(b_ptr, mask=k_in[:, None] & col_in[None, :], other=0.0)
        else:
            _, c0, fh, fw = _tap_step(step, CHANNEL_BLOCKS, KW, BLOCK_K)
            ih = ih0 + fh * DH
            iw = iw0 + fw * DW
            a_rows = row_in & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
            rc = c0 + tl.arange(0, BLOCK_K)
            c_in = rc < ICG
            a_ptr = x_row[:, None] + (ih * sxh + iw * sxw)[:, None] + (rc * sxc)[None, :]
            a = tl.load(a_ptr, mask=a_rows[:, None] & c_in[None, :], other=0.0)
            b_ptr = w_col[None, :] + (fh * swh + fw * sww) + (rc * swc)[:, None]
            b = tl.load(b_ptr, mask=c_in[:, None] & col_in[None, :], other=0.0)
        acc = _mma(acc, a, b, IEEE)
    _store_pixels(
        y, acc, img, oh, ow, g * OCG + rn, syn, syo, syh, syw, row_in[:, None] & col_in[None, :]
    )


@triton.jit
def _conv2d_tma_kernel(
    x_desc, w_desc, y,
    BATCH, OH, OW, ICG, OCG, KW, STEPS, CHANNEL_BLOCKS, TILES_B, TILES_H, TILES_W,
    PH, PW, DH, DW, syn, syo, syh, syw,
    TILE_B: tl.constexpr, TILE_H: tl.constexpr, TILE_W: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    IEEE: tl.constexpr,
):  # fmt: skip
    BLOCK_M: tl.constexpr = TILE_B * TILE_H * TILE_W
    pid_m, pid_n = _tile_coords(
        tl.program_id(0), TILES_B * TILES_H * TILES_W, tl.cdiv(OCG, BLOCK_N), GROUP_M
    )
    n0 = pid_m // (TILES_H * TILES_W) * TILE_B
    oh0 = pid_m // TILES_W % TILES_H * TILE_H
    ow0 = pid_m % TILES_W * TILE_W
    oc0 = pid_n * BLOCK_N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step in range(STEPS):
        tap, c0, fh, fw = _tap_step(step, CHANNEL_BLOCKS, KW, BLOCK_K)
        # The tap's window of the input: a box of TILE_B images x TILE_H x TILE_W pixels x
        # BLOCK_K channels, shifted by the tap; TMA zero-fills what lies outside the input
        # (the padding, negative coordinates included, and channels past ICG).
        a = x_desc.load([n0, oh0 + fh * DH - PH, ow0 + fw * DW - PW, c0])
        a = tl.reshape(a, (BLOCK_M, BLOCK_K))
        # The filters as an O x (KH·KW·ICG) matrix: a block of channels past ICG reads the
        # next tap's filters, multiplied by the zeros loaded for them.
        b = w_desc.load([oc0, tap * ICG + c0])
        acc = _mma(acc, a, b.T, IEEE)
    i = tl.arange(0, BLOCK_M)
    img = n0 + i // (TILE_H * TILE_W)
    oh = oh0 + i // TILE_W % TILE_H
    ow = ow0 + i % TILE_W
    rn = oc0 + tl.arange(0, BLOCK_N)
    ok = (img < BATCH) & (oh < OH) & (ow < OW)
    _store_pixels(y, acc, img, oh, ow, rn, syn, syo, syh, syw, ok[:, None] & (rn < OCG)[None, :])


@triton.jit
def _depthwise_kernel(
    x, w, y,
    CHANNELS, H, W, OH, OW, OCG, TILES_H, TILES_W,
    SH, SW, PH, PW, DH, DW,
    KH, sxn, sxc, sxh, sxw, swo, swh, sww, syn, syo, syh, syw,
    KW: tl.constexpr, TILE_W: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    img = pid // (TILES_H * TILES_W)
    tile = pid % (TILES_H * TILES_W)
    i = tl.arange(0, BLOCK_M)
    oh = tile // TILES_W * (BLOCK_M // TILE_W) + i // TILE_W
    ow = tile % TILES_W * TILE_W + i % TILE_W
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_in = rn < CHANNELS
    ih0 = oh * SH - PH
    iw0 = ow * SW - PW
    rows = (oh < OH) & (ow < OW)
    x_tile = (
        x + img.to(tl.int64) * sxn + (ih0 * sxh + iw0 * sxw)[:, None] + ((rn // OCG) * sxc)[None, :]
    )
    w_col = w + rn * swo
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for fh in range(KH):
        ih = ih0 + fh * DH
        h_in = rows & (ih >= 0) & (ih < H)
        for fw in tl.static_range(KW):
            iw = iw0 + fw * DW
            ok = h_in & (iw >= 0) & (iw < W)
            a = tl.load(
                x_tile + (fh * DH * sxh + fw * DW * sxw),
                mask=ok[:, None] & col_in[None, :],
                other=0.0,
            )
            f = tl.load(w_col + fh * swh + fw * sww, mask=col_in, other=0.0)
            acc += a.to(tl.float32) * f.to(tl.float32)[None, :]
    _store_pixels(y, acc, img, oh, ow, rn, syn, syo, syh, syw, rows[:, None] & col_in[None, :])


@triton.jit
def _strip_add(accs, T: tl.constexpr, v):
    # accs[T] += v for a constexpr T (a tuple's entries are values, not places). Triton's
    # language has no starred expressions, hence the concatenations here and below.
    return accs[:T] + (accs[T] + v,) + accs[T + 1 :]  # noqa: RUF005


@triton.jit
def _depthwise_strip_kernel(
    x, w, y,
    CHANNELS, H, W, OH, OW, OCG, STRIPS_W, STRIPS, SH, PH, PW, DH,
    KH, sxn, sxc, sxh, sxw, swo, swh, sww, syn, syo, syh, syw,
    KW: tl.constexpr, STRIP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    # Each of the tile's BLOCK_M rows is a strip of STRIP consecutive output pixels of one
    # output row (stride and dilation 1 along W), numbered over (image, row, strip): a filter
    # row loads the STRIP + KW - 1 input pixels its strips reach once each, converts them to
    # float32 once, and adds each into every accumulator of the strip it reaches.
    s = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    valid = s < STRIPS
    img = s // (OH * STRIPS_W)
    r = s % (OH * STRIPS_W)
    oh = r // STRIPS_W
    ow0 = r % STRIPS_W * STRIP
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_in = rn < CHANNELS
    ih0 = oh * SH - PH
    iw0 = ow0 - PW
    x_strip = (
        x + (img.to(tl.int64) * sxn + ih0 * sxh + iw0 * sxw)[:, None] + ((rn // OCG) * sxc)[None, :]
    )
    w_col = w + rn * swo
    accs = ()
    for _ in tl.static_range(STRIP):
        accs = accs + (tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32),)  # type: ignore[assignment]  # noqa: RUF005
    for fh in range(KH):
        ih = ih0 + fh * DH
        h_in = valid & (ih >= 0) & (ih < H)
        taps = ()
        for fw in tl.static_range(KW):
            f = tl.load(w_col + fh * swh + fw * sww, mask=col_in, other=0.0)
            taps = taps + (f.to(tl.float32)[None, :],)  # type: ignore[assignment]  # noqa: RUF005
        for j in tl.static_range(STRIP + KW - 1):
            iw = iw0 + j
            ok = h_in & (iw >= 0) & (iw < W)
            a = tl.load(
                x_strip + (fh * DH * sxh + j * sxw), mask=ok[:, None] & col_in[None, :], other=0.0
            ).to(tl.float32)
            for fw in tl.static_range(KW):
                if j - fw >= 0 and j - fw < STRIP:
                    accs = _strip_add(accs, j - fw, a * taps[fw])
    out = valid[:, None] & col_in[None, :]
    for t in tl.static_range(STRIP):
        ow = ow0 + t
        _store_pixels(y, accs[t], img, oh, ow, rn, syn, syo, syh, syw, out & (ow < OW)[:, None])


@triton.jit
def _to_channels_last(src, dst, C, HW, BLOCK_C: tl.constexpr, BLOCK_P: tl.constexpr):
    """dst[n, p, c] = src[n, c, p] for contiguous (N, C, H·W) ``src``: a tile read along the
    pixels and written along the channels (Triton moves it through shared memory between)."""
    n = tl.program_id(2).to(tl.int64)
    rc = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    rp = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    mask = (rc[:, None] < C) & (rp[None, :] < HW)
    tile = tl.load(src + n * C * HW + rc[:, None] * HW + rp[None, :], mask=mask)
    tl.store(dst + n * C * HW + rp[None, :] * C + rc[:, None], tile, mask=mask)


def channels_last_copy(src: torch.Tensor) -> tuple[torch.Tensor, Launch | None]:
    """A channels-last buffer shaped as the contiguous 4-D ``src`` and the launch that copies
    ``src`` into it (one Triton transpose); ``src`` itself and no launch where it is already
    channels-last as stored (one channel, as a depthwise filter, or one pixel). Inductor's
    scheduler failed on the pointless copy of a depthwise filter inside
    ``tunehub::triton_conv2d`` (KeyError in ``compute_ancestors``, torch 2.11, H200)."""
    if src.is_contiguous(memory_format=torch.channels_last):
        return src, None
    dst = torch.empty_like(src, memory_format=torch.channels_last)
    n, c = src.shape[0], src.shape[1]
    hw = src.shape[2] * src.shape[3]
    block_c, block_p = min(64, triton.next_power_of_2(c)), min(64, triton.next_power_of_2(hw))
    grid = (triton.cdiv(hw, block_p), triton.cdiv(c, block_c), n)
    return dst, Launch(
        _to_channels_last, grid, (src, dst, c, hw),
        {"BLOCK_C": block_c, "BLOCK_P": block_p, "num_warps": 4},
    )  # fmt: skip


@dataclass
class ConvOperands:
    x: torch.Tensor
    w: torch.Tensor
    out: torch.Tensor
    workload: Workload


def _layout(t: torch.Tensor, nhwc: bool) -> torch.Tensor:
    return t.contiguous(memory_format=torch.channels_last) if nhwc else t.contiguous()


def _shapes(workload: Workload) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    # The input, filters and output as logical NCHW / OIHW shapes.
    d = conv_dims(workload)
    return (
        (d["batch"], d["in_channels"], d["height"], d["width"]),
        (d["out_channels"], d["icg"], d["kernel_h"], d["kernel_w"]),
        (d["batch"], d["out_channels"], d["oh"], d["ow"]),
    )


def operands(workload: Workload, device: torch.device, seed: int) -> ConvOperands:
    """Fresh input and filters uniform in [-1, 1) and a NaN-poisoned output, logically
    NCHW / OIHW tensors stored as the workload's layout says (channels_last for nhwc)."""
    nhwc = is_nhwc(workload)
    dtype = TORCH_DTYPES[workload.dtype]
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    x_shape, w_shape, out_shape = _shapes(workload)
    x = torch.empty(x_shape, dtype=dtype, device=device).uniform_(-1.0, 1.0, generator=g)
    w = torch.empty(w_shape, dtype=dtype, device=device).uniform_(-1.0, 1.0, generator=g)
    out = torch.full(out_shape, math.nan, dtype=dtype, device=device)
    return ConvOperands(_layout(x, nhwc), _layout(w, nhwc), _layout(out, nhwc), workload)


@dataclass(frozen=True)
class Precompiled:
    """What compiling one config's launches ahead made: their kernels' cache keys, the
    largest shared memory one of them takes, and the seconds it took."""

    keys: tuple[str, ...]
    shared_bytes: int
    compile_secs: float


def precompile(
    workload: Workload, config: dict[str, Any], capability: int, num_sms: int
) -> Precompiled:
    """Compile, without a GPU, every kernel ``bind`` launches for ``config`` (the copies a
    REPACK or ``rows`` config makes first included; a pointwise workload's ``triton.gemm``
    or ``triton.bmm`` kernels) for a GPU of compute ``capability`` with ``num_sms`` SMs into
    TRITON_CACHE_DIR, with their C launchers where the host has the CUDA driver. The launches
    are made on tensors of the "meta" device laid out as ``operands`` lays them (the GEMM
    route through ``triton_gemm_kernels.precompile`` with the launch's rows), so their
    specialisation, hence the cache keys, is the run's (operands 16-byte aligned, the same
    strides). Raises the compiler's error."""
    if triton.knobs.runtime.interpret:
        raise RuntimeError("precompile needs Triton's compiler; TRITON_INTERPRET=1 is set")
    from triton.backends.compiler import GPUTarget

    start = time.perf_counter()
    if "variant" in config:
        return _precompile_gemm(workload, config, capability, num_sms, start)
    nhwc = is_nhwc(workload)
    dtype = TORCH_DTYPES[workload.dtype]
    meta = torch.device("meta")
    x, w, out = (
        _layout(torch.empty(shape, dtype=dtype, device=meta), nhwc) for shape in _shapes(workload)
    )
    if "BATCH_MAJOR" in config:
        launches = [_bmm_route(x, w, out, workload, config, num_sms)]
    else:
        launches = conv_launches(x, w, out, workload, config)
    target = GPUTarget("cuda", capability, 32)
    keys: list[str] = []
    shared = 0
    for launch in launches:
        compiled, _ = _compile_like_jit(launch.kernel, target, launch.args, launch.kwargs)
        keys.append(str(compiled.hash))
        shared = max(shared, int(compiled.metadata.shared))
    return Precompiled(tuple(keys), shared, time.perf_counter() - start)


def _precompile_gemm(
    workload: Workload, config: dict[str, Any], capability: int, num_sms: int, start: float
) -> Precompiled:
    # triton.gemm's own recipe, for the GEMM _gemm_launch runs: all N·H·W rows (the view's M
    # is capped for its space), the input row-major, the filters' transpose column-major.
    from tunehub.kernels import triton_gemm_kernels as gemm
    from tunehub.kernels.triton_gemm import kernel_config

    view = _gemm_view(workload)
    d = conv_dims(workload)
    built = gemm.precompile(
        config=kernel_config(Config(config)), dtype=workload.dtype, epilogue="none",
        allow_tf32=view.allow_tf32, m=d["batch"] * d["height"] * d["width"], n=view.n,
        k=view.k, a_layout="row", b_layout="col", capability=capability, num_sms=num_sms,
    )  # fmt: skip
    return Precompiled(
        tuple(kernel.cache_key for kernel in built),
        max((kernel.shared_bytes for kernel in built), default=0),
        time.perf_counter() - start,
    )


def torch_args(workload: Workload) -> dict[str, Any]:
    """``torch.nn.functional.conv2d``'s keyword arguments for the workload."""
    d = conv_dims(workload)
    return {
        "stride": (d["stride_h"], d["stride_w"]),
        "padding": (d["pad_h"], d["pad_w"]),
        "dilation": (d["dilation_h"], d["dilation_w"]),
        "groups": d["groups"],
    }


def bind(ops: ConvOperands, config: dict[str, Any]) -> Callable[[], Any]:
    """The launch of ``config`` on ``ops`` (arguments computed once, ``conv_launches``; a
    pointwise NHWC workload's config with a ``variant`` on triton.gemm's kernels, a pointwise
    NCHW one's with ``BATCH_MAJOR`` on triton.bmm's)."""
    if "variant" in config:
        return _gemm_launch(ops, config)
    if "BATCH_MAJOR" in config:
        return _bmm_launch(ops, config)
    calls = [launch.bind() for launch in conv_launches(ops.x, ops.w, ops.out, ops.workload, config)]

    def launch() -> None:
        for call in calls:
            call()

    return launch


def conv_launches(
    x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, workload: Workload,
    config: dict[str, Any],
) -> list[Launch]:  # fmt: skip
    """The launches computing ``out`` (as ``workload`` lays it out) from ``x`` and ``w`` with
    an implicit-GEMM or depthwise ``config``: the direct kernel for a depthwise workload
    (BLOCK_M output pixels in rows of TILE_W x BLOCK_N channels a program), else implicit
    GEMM. Every operand is read and written through its strides.

    ``REPACK`` (NCHW workloads): each call first copies the input and the filters into
    channels-last buffers (allocated here) and the kernel reads those (channels contiguous
    in a tap: whole vectors a row), writing the NCHW output through its strides. The copies
    are part of the call, and of its time."""
    d = conv_dims(workload)
    launches: list[Launch] = []
    if config.get("REPACK", False) and not is_nhwc(workload):
        (x, copy_x), (w, copy_w) = channels_last_copy(x), channels_last_copy(w)
        launches = [launch for launch in (copy_x, copy_w) if launch is not None]
    bm, bn = int(config["BLOCK_M"]), int(config["BLOCK_N"])
    conv = (
        d["stride_h"], d["stride_w"], d["pad_h"], d["pad_w"], d["dilation_h"], d["dilation_w"],
    )  # fmt: skip
    launch_options = {
        "num_warps": int(config["num_warps"]),
        "num_stages": int(config["num_stages"]),
    }
    if is_depthwise(workload) and int(config.get("STRIP", 1)) > 1:
        return [*launches, _strip_launch(x, w, out, d, config, launch_options)]
    if is_depthwise(workload):
        sw = w.stride()
        tile_w = int(config["TILE_W"])
        tiles_h, tiles_w = triton.cdiv(d["oh"], bm // tile_w), triton.cdiv(d["ow"], tile_w)
        grid = (d["batch"] * tiles_h * tiles_w, triton.cdiv(d["out_channels"], bn))
        args: tuple[Any, ...] = (
            x, w, out,
            d["out_channels"], d["height"], d["width"], d["oh"], d["ow"], d["ocg"], tiles_h,
            tiles_w, *conv, d["kernel_h"], *x.stride(), sw[0], sw[2], sw[3], *out.stride(),
        )  # fmt: skip
        constants: dict[str, Any] = {
            "KW": d["kernel_w"], "TILE_W": tile_w, "BLOCK_M": bm, "BLOCK_N": bn,
            **launch_options,
        }  # fmt: skip
        return [*launches, Launch(_depthwise_kernel, grid, args, constants)]
    if config.get("TMA", False):
        return [*launches, *_tma_launches(x, w, out, d, config, launch_options)]
    rows = d["batch"] * d["oh"] * d["ow"]
    bk = int(config["BLOCK_K"])
    patch_order = config.get("PATCH", "tap")
    if patch_order == "rows":
        return [*launches, *_rows_launches(x, w, out, d, config, launch_options)]
    flat = patch_order == "flat"
    channel_blocks = triton.cdiv(d["icg"], bk)
    patch = d["kernel_h"] * d["kernel_w"] * d["icg"]
    steps = triton.cdiv(patch, bk) if flat else d["kernel_h"] * d["kernel_w"] * channel_blocks
    grid = (triton.cdiv(rows, bm) * triton.cdiv(d["ocg"], bn), d["groups"])
    args = (
        x, w, out,
        rows, d["height"], d["width"], d["oh"], d["ow"], d["kernel_w"], d["icg"], d["ocg"],
        steps, channel_blocks, patch, *conv,
        *x.stride(), *w.stride(), *out.stride(),
    )  # fmt: skip
    constants = {
        "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": int(config["GROUP_M"]),
        "FLAT": flat, "IEEE": workload.dtype == "float32", **launch_options,
    }  # fmt: skip
    return [*launches, Launch(_conv2d_kernel, grid, args, constants)]


@triton.jit
def _conv2d_rows_kernel(
    xp, w, y,
    M, OH, OW, HP, WP, KH, ICG, OCG, ROW_STEPS, SH, SW, DH,
    swo, swc, swh, sww, syn, syo, syh, syw,
    KW: tl.constexpr, CP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, IEEE: tl.constexpr,
):  # fmt: skip
    rm, rn, img, oh, ow = _pixel_tile(M, OCG, OH, OW, BLOCK_M, BLOCK_N, GROUP_M)
    row_in = rm < M
    col_in = rn < OCG
    # Each output pixel's first input pixel in the padded buffer (the padding is in it): a
    # filter row's KW taps are then KW·CP consecutive elements, read as whole vectors.
    start = ((img * HP + oh * SH) * WP + ow * SW).to(tl.int64) * CP
    w_col = w + rn.to(tl.int64) * swo
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step in range(KH * ROW_STEPS):
        fh = step // ROW_STEPS
        rj = (step % ROW_STEPS) * BLOCK_K + tl.arange(0, BLOCK_K)
        a_ptr = xp + (start + fh * DH * WP * CP)[:, None] + rj[None, :]
        # The block's columns past the filter row (KW·CP, a multiple of CP: whole vectors
        # stay whole) are not read: the next pixels' values, an infinity among them, must not
        # meet the zero filters there.
        a = tl.load(a_ptr, mask=row_in[:, None] & (rj < KW * CP)[None, :], other=0.0)
        fw = rj // CP
        rc = rj % CP
        b_ptr = w_col[None, :] + (fh * swh + fw * sww + rc * swc)[:, None]
        b_in = (rc < ICG) & (fw < KW)
        b = tl.load(b_ptr, mask=b_in[:, None] & col_in[None, :], other=0.0)
        acc = _mma(acc, a, b, IEEE)
    _store_pixels(y, acc, img, oh, ow, rn, syn, syo, syh, syw, row_in[:, None] & col_in[None, :])


@triton.jit
def _pad_channels_last(
    src, dst, C, H, W, HP, WP, PH, PW, PIXELS, ssn, ssc, ssh, ssw,
    CP: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """dst[n, hp, wp, c] (flat, CP channels a pixel, the padding around each image and the
    channels past C zeros) = src[n, c, hp - PH, wp - PW]: BLOCK padded pixels a program, a
    pixel's CP channels one vector."""
    p = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    c = tl.arange(0, CP)
    wp = p % WP
    hp = p // WP % HP
    n = p // (WP * HP)
    h = hp - PH
    wi = wp - PW
    ok = (p < PIXELS) & (h >= 0) & (h < H) & (wi >= 0) & (wi < W)
    src_ptr = src + (n.to(tl.int64) * ssn + h * ssh + wi * ssw)[:, None] + (c * ssc)[None, :]
    v = tl.load(src_ptr, mask=ok[:, None] & (c < C)[None, :], other=0.0)
    e = p.to(tl.int64)[:, None] * CP + c[None, :]
    tl.store(dst + e, v, mask=(p < PIXELS)[:, None])


def _rows_launches(
    x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, d: dict[str, int],
    config: dict[str, Any], launch_options: dict[str, int],
) -> list[Launch]:  # fmt: skip
    """``PATCH="rows"`` (one group, no dilation along W): the input copied into a zero-padded
    channels-last buffer of ``rows_channels`` (C rounded up to a power of two) a pixel, made
    in the call and timed with it, then ``_conv2d_rows_kernel``, whose K loop reads one
    filter row's KW taps a step as consecutive elements (whole vectors)."""
    if d["groups"] != 1 or d["dilation_w"] != 1:
        raise ValueError("PATCH='rows' runs one group without dilation along the width")
    bm, bn, bk = int(config["BLOCK_M"]), int(config["BLOCK_N"]), int(config["BLOCK_K"])
    cp = rows_channels(d["icg"])
    hp, wp = d["height"] + 2 * d["pad_h"], d["width"] + 2 * d["pad_w"]
    row_steps = triton.cdiv(d["kernel_w"] * cp, bk)
    pixels = d["batch"] * hp * wp
    if pixels * cp >= 2**31:
        raise ValueError(f"the padded input ({pixels * cp} elements) is past 2**31")
    xp = torch.empty(pixels * cp, dtype=x.dtype, device=x.device)
    block = max(1, 1024 // cp)
    pad = Launch(
        _pad_channels_last, (triton.cdiv(pixels, block),),
        (x, xp, d["icg"], d["height"], d["width"], hp, wp, d["pad_h"], d["pad_w"], pixels,
         *x.stride()),
        {"CP": cp, "BLOCK": block, "num_warps": 4},
    )  # fmt: skip
    rows = d["batch"] * d["oh"] * d["ow"]
    grid = (triton.cdiv(rows, bm) * triton.cdiv(d["ocg"], bn),)
    args = (
        xp, w, out,
        rows, d["oh"], d["ow"], hp, wp, d["kernel_h"], d["icg"], d["ocg"], row_steps,
        d["stride_h"], d["stride_w"], d["dilation_h"], *w.stride(), *out.stride(),
    )  # fmt: skip
    constants = {
        "KW": d["kernel_w"], "CP": cp, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk,
        "GROUP_M": int(config["GROUP_M"]), "IEEE": x.dtype == torch.float32, **launch_options,
    }  # fmt: skip
    return [pad, Launch(_conv2d_rows_kernel, grid, args, constants)]


def _strip_launch(
    x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, d: dict[str, int],
    config: dict[str, Any], launch_options: dict[str, int],
) -> Launch:  # fmt: skip
    """``_depthwise_strip_kernel``'s launch: BLOCK_M strips of STRIP output pixels x BLOCK_N
    channels a program (stride and dilation 1 along W)."""
    if d["stride_w"] != 1 or d["dilation_w"] != 1:
        raise ValueError("a STRIP of output pixels needs stride_w and dilation_w 1")
    strip, bm, bn = int(config["STRIP"]), int(config["BLOCK_M"]), int(config["BLOCK_N"])
    strips_w = triton.cdiv(d["ow"], strip)
    strips = d["batch"] * d["oh"] * strips_w
    sw = w.stride()
    args = (
        x, w, out,
        d["out_channels"], d["height"], d["width"], d["oh"], d["ow"], d["ocg"], strips_w, strips,
        d["stride_h"], d["pad_h"], d["pad_w"], d["dilation_h"], d["kernel_h"], *x.stride(),
        sw[0], sw[2], sw[3], *out.stride(),
    )  # fmt: skip
    constants = {"KW": d["kernel_w"], "STRIP": strip, "BLOCK_M": bm, "BLOCK_N": bn,
                 **launch_options}  # fmt: skip
    grid = (triton.cdiv(strips, bm), triton.cdiv(d["out_channels"], bn))
    return Launch(_depthwise_strip_kernel, grid, args, constants)


def tma_tile(block_m: int, tile_h: int, tile_w: int) -> tuple[int, int, int]:
    """The (images, rows, columns) box of output pixels that ``_conv2d_tma_kernel``'s
    BLOCK_M rows cover: TILE_H rows of TILE_W pixels, of BLOCK_M / (TILE_H·TILE_W) images."""
    if block_m % (tile_h * tile_w):
        raise ValueError(f"BLOCK_M {block_m} is no multiple of TILE_H x TILE_W {tile_h}x{tile_w}")
    return block_m // (tile_w * tile_h), tile_h, tile_w


def _tma_launches(
    x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, d: dict[str, int],
    config: dict[str, Any], launch_options: dict[str, int],
) -> list[Launch]:  # fmt: skip
    """``_conv2d_tma_kernel``'s launch (stride 1, one group, channels-last input): the
    input a 4-D TMA descriptor (N, H, W, C) whose box is the tile's pixels, the filters one of
    their O x (KH·KW·C) matrix, copied channels-last first where they are not."""
    from tunehub.kernels.triton_gemm_kernels import _descriptor

    if x.stride(1) != 1:
        raise ValueError("the TMA kernel reads a channels-last input (NHWC, or NCHW with REPACK)")
    launches = []
    if not w.is_contiguous(memory_format=torch.channels_last):
        w, copy_w = channels_last_copy(w)
        launches = [copy_w] if copy_w is not None else []
    bn, bk = int(config["BLOCK_N"]), int(config["BLOCK_K"])
    tile_b, tile_h, tile_w = tma_tile(
        int(config["BLOCK_M"]), int(config["TILE_H"]), int(config["TILE_W"])
    )
    n, c, h, wd = x.shape
    sx = x.stride()
    x_desc = _descriptor(x, [n, h, wd, c], [sx[0], sx[2], sx[3], 1], [tile_b, tile_h, tile_w, bk])
    taps = d["kernel_h"] * d["kernel_w"]
    w_desc = _descriptor(w, [d["out_channels"], taps * c], [w.stride(0), 1], [bn, bk])
    tiles = (
        triton.cdiv(d["batch"], tile_b), triton.cdiv(d["oh"], tile_h), triton.cdiv(d["ow"], tile_w)
    )  # fmt: skip
    channel_blocks = triton.cdiv(c, bk)
    grid = (tiles[0] * tiles[1] * tiles[2] * triton.cdiv(d["out_channels"], bn),)
    args = (
        x_desc, w_desc, out,
        d["batch"], d["oh"], d["ow"], c, d["out_channels"], d["kernel_w"], taps * channel_blocks,
        channel_blocks, *tiles, d["pad_h"], d["pad_w"], d["dilation_h"], d["dilation_w"],
        *out.stride(),
    )  # fmt: skip
    constants = {
        "TILE_B": tile_b, "TILE_H": tile_h, "TILE_W": tile_w, "BLOCK_N": bn, "BLOCK_K": bk,
        "GROUP_M": int(config["GROUP_M"]), "IEEE": x.dtype == torch.float32, **launch_options,
    }  # fmt: skip
    return [*launches, Launch(_conv2d_tma_kernel, grid, args, constants)]


def _gemm_launch(ops: ConvOperands, config: dict[str, Any]) -> Callable[[], Any]:
    """``triton.gemm``'s launch of ``config`` on a pointwise NHWC workload's tensors as
    stored: the input an (N·H·W) x C row-major matrix, the filters (O x C row-major) read as
    their C x O column-major transpose, the output (N·H·W) x O row-major."""
    from tunehub.kernels import triton_gemm_kernels as gemm
    from tunehub.kernels.triton_gemm import kernel_config

    gemm_view = _gemm_view(ops.workload)
    d = conv_dims(ops.workload)
    rows, n, k = d["batch"] * d["height"] * d["width"], gemm_view.n, gemm_view.k
    a = ops.x.permute(0, 2, 3, 1).view(rows, k)
    b = ops.w.view(n, k).t()
    out = ops.out.permute(0, 2, 3, 1).view(rows, n)
    return gemm.bind(
        a, b, None, out, allow_tf32=gemm_view.allow_tf32, config=kernel_config(Config(config))
    )


def _gemm_view(workload: Workload) -> Workload:
    view = pointwise_gemm(workload)
    if view is None:
        raise ValueError(
            f"{workload.label} is no plain GEMM: configs with a variant are not for it"
        )
    return view


def _bmm_launch(ops: ConvOperands, config: dict[str, Any]) -> Callable[[], Any]:
    return _bmm_route(ops.x, ops.w, ops.out, ops.workload, config).bind()


def _bmm_route(
    x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, workload: Workload,
    config: dict[str, Any], num_sms: int = 0,
) -> Launch:  # fmt: skip
    """``triton.bmm``'s launch of ``config`` on a pointwise NCHW workload's tensors as stored:
    each image's output (O x H·W) is the filters (O x C, batch stride 0) times its input
    (C x H·W); ``num_sms`` as ``bmm_launch`` takes it."""
    from tunehub.kernels.triton_bmm_kernels import bmm_launch

    if pointwise_bmm(workload) is None:
        raise ValueError(
            f"{workload.label} is no batched GEMM: configs with BATCH_MAJOR are not for it"
        )
    n, c, h, wd = x.shape
    o = w.shape[0]
    a = w.view(1, o, c).expand(n, o, c)
    b, y = x.view(n, c, h * wd), out.view(n, o, h * wd)
    return bmm_launch(a, b, y, config, workload.allow_tf32, num_sms=num_sms)


def reference(ops: ConvOperands) -> torch.Tensor:
    """The output in float64 on the operands' device (logically NCHW)."""
    return torch.nn.functional.conv2d(
        ops.x.to(torch.float64), ops.w.to(torch.float64), **torch_args(ops.workload)
    )


@dataclass(frozen=True)
class ConvCheck:
    ok: bool
    relative_error: float
    tolerance: float
    message: str


def check(out: torch.Tensor, ref: torch.Tensor, dtype: str) -> ConvCheck:
    """Every output finite, and ``||out - ref|| / ||ref||`` within the dtype's tolerance."""
    tol = TOLERANCE[dtype]
    finite = torch.isfinite(out)
    bad = int((~finite).sum())
    if bad:
        where = tuple(torch.nonzero(~finite)[0].tolist())
        return ConvCheck(
            False, math.inf, tol, f"{bad} of {out.numel()} outputs not finite, first at {where}"
        )
    diff = float(torch.linalg.vector_norm(out.to(torch.float64) - ref))
    norm = float(torch.linalg.vector_norm(ref)) or 1.0
    rel = diff / norm
    if rel <= tol:
        return ConvCheck(True, rel, tol, "")
    return ConvCheck(False, rel, tol, f"relative error {rel:.3g} above {tol:g}")
