"""The ``triton.conv2d`` template: conv2d in Triton, its space, build and run.

Kernels of its own (``triton_conv_kernels``). Implicit GEMM gathers the patch tile from the
input inside its K loop (nothing unfolded in memory) and reads NCHW and NHWC through strides.
Knobs: ``BLOCK_M`` (output pixels), ``BLOCK_N`` (output channels of a group), ``BLOCK_K`` (input
channels a step), ``GROUP_M`` (tile order), ``num_warps`` and ``num_stages``. The space keeps
tiles no larger than the GEMM view needs (BLOCK_N up to O/groups, BLOCK_K up to C/groups, each
at least 16 for ``tl.dot``) and leaves out configs whose pipelined tiles do not fit shared
memory or whose accumulator is far past what a thread holds. ``PATCH`` orders the K loop:
``tap`` takes one filter tap's block of channels a step, padding every tap to 16 where C/groups
is no multiple of it; where it is not, ``flat`` steps over the whole (tap, channel) patch in
blocks of BLOCK_K, and ``rows`` (one group, no dilation along W) first copies the input into a
zero-padded channels-last buffer of C rounded up to a power of two, then reads a filter row's
taps a step as consecutive elements, whole vectors. ResNet-50's stem (3 channels, 7x7)
is 147 deep: 784 a tap at a time, 160 flat, 7 x 32 by rows (on an H200, NHWC: 374, 166 and 94
us; cuDNN 90 us). A depthwise workload (one input channel a group) runs the direct kernel
instead, whose knobs are ``BLOCK_M`` (output pixels, in rows of ``TILE_W``), ``BLOCK_N``
(channels, up to all of them), ``num_warps`` and ``STRIP``; its space holds one value of the
others. With ``STRIP`` > 1 (stride and dilation 1 along W) each of the BLOCK_M rows is a strip
of that many output pixels held in registers, so a filter row loads each input pixel once for
the whole strip instead of once per tap: tuned at 64 trials on an H200, ConvNeXt-T's NHWC 7x7
depthwise layers ran 1.45x and 1.21x cuDNN on strips of 8, 0.89x and 0.84x before. A pointwise
NHWC workload (1x1, stride 1, no padding, one group) is a plain GEMM of the tensors as stored
(``pointwise_gemm``): it runs ``triton.gemm``'s kernels (TMA, warp-specialised, split-K) in
that template's space, where the implicit-GEMM kernel ran ResNet-50's 1x1 at 14x14 at 0.32x
cuDNN on an H200. A pointwise NCHW workload is a batched GEMM of the tensors as stored, each
image's output the filters times its input (``pointwise_bmm``): where ``triton.bmm``'s
persistent TMA kernel can run it (Hopper, 16-byte rows) it takes that template's space and
kernels, whose flattened loop overlaps a tile's store with the next tile's loads (its output is
4x the input at ResNet-50's 1x1 expand, where the implicit GEMM ran 0.70x cuDNN on an H200).
For NCHW workloads ``REPACK`` copies the input and filters into channels-last buffers in each
call (their time counted) and runs the kernels on those, as Inductor's layout optimisation
does for a graph.

On Hopper and newer GPUs a stride-1, one-group workload (NHWC, or NCHW repacked) may also run
the TMA kernel (``TMA``): each filter tap's input window is one TMA box of the (N, H, W, C)
input, zero-filled where it crosses the padding, so no index math or masks run per element.
Its BLOCK_M pixels are a box of TILE_H rows of TILE_W pixels over BLOCK_M / (TILE_H·TILE_W)
images; the space offers the ``TMA_BOXES`` boxes per BLOCK_M that waste least on the output's
size. On an H200 it ran ResNet-50's 3x3s at 56x56, 28x28 and 14x14 6-30% faster than the
pointer-load kernel's tuned configs, and the one at 7x7 slower (conv_tma-h200-20261127.json).

This module imports neither torch nor Triton at import time; ``run`` does, in the GPU's run
sandbox (or on the CPU under TRITON_INTERPRET=1).

>>> from tunehub.core import Target, Workload
>>> h100 = Target(kind="cuda", name="H100", arch=("sm_90",), cores=132, properties={
...     "compute_capability": 90, "smem_per_block_bytes": 232448, "regs_per_sm": 65536})
>>> w = Workload.from_dict({"op": "conv2d", "dtype": "float16", "batch": 32, "in_channels": 64,
...     "out_channels": 64, "height": 56, "width": 56, "kernel_h": 3, "kernel_w": 3,
...     "pad_h": 1, "pad_w": 1, "data_layout": "nhwc"})
>>> t = TritonConv2dTemplate()
>>> c = t.default_config(w, h100)
>>> c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"], c["TMA"], c["TILE_H"], c["TILE_W"]
(128, 64, 64, True, 8, 8)
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

from tunehub.core import (
    Capabilities,
    Config,
    MeasureRequest,
    MeasureResult,
    MeasureStatus,
    Target,
    Workload,
)
from tunehub.kernels.base import (
    Artifact,
    BuildFailed,
    Template,
    TimingPolicy,
    compile_errors,
)
from tunehub.kernels.conv2d_reference import (
    conv_dims,
    is_depthwise,
    is_nhwc,
    pointwise_bmm,
    pointwise_gemm,
)
from tunehub.kernels.space import Knob, KnobConstraint, SearchSpace
from tunehub.kernels.triton_bmm import TritonBmmTemplate, bmm_tma_runs
from tunehub.kernels.triton_gemm import (
    TritonGemmTemplate,
    _device,
    _interpreting,
    capability_of,
    device_props,
)

BLOCK_MS = (32, 64, 128, 256)
BLOCK_NS = (16, 32, 64, 128, 256)
BLOCK_KS = (16, 32, 64, 128)
GROUP_MS = (1, 8)
WARPS = (2, 4, 8)
STAGES = (1, 2, 3, 4, 5)
# The direct (depthwise) kernel's tiles: pixels and channels a program.
DEPTHWISE_MS = (16, 32, 64, 128, 256, 512)
DEPTHWISE_NS = (8, 16, 32, 64, 128)
DEPTHWISE_WARPS = (1, 2, 4, 8)
DEPTHWISE_TILE_WS = (4, 8, 16, 32, 64)
# Its strips (``STRIP``): 1 is a block of pixel rows; more, each row of the tile a strip of
# that many output pixels along W, held in registers (stride and dilation 1 along W). A
# strip's accumulators (STRIP x a thread's share of the tile) stay within STRIP_ACCUMULATORS.
DEPTHWISE_STRIPS = (1, 2, 4, 8)
STRIP_ACCUMULATORS = 64
# The TMA kernel's boxes of output pixels: TILE_H rows of TILE_W (1 x 1 for the pointer-load
# kernel's configs, whose BLOCK_M is a flat range of pixels), and the least share of a box's
# pixels that must be real output for a box to be in the space.
TILE_HS = (1, 2, 4, 8, 16, 32)
TILE_WS = (1, 4, 8, 16, 32, 64, 128)
MIN_USEFUL = 0.6
TMA_BOXES = 3
POINTER_BOX = {"TMA": False, "TILE_H": 1, "TILE_W": 1}
# The K loop's orders (``PATCH``) and seed tiles (BLOCK_M, BLOCK_N, BLOCK_K, num_warps,
# num_stages) for ``flat`` patch blocks: the fastest on ResNet-50's stem (batch 32, fp16) of
# 26-50 configs a layout on an H200 (conv_flat-h200-20261127T0319.json): 256 x 16 NHWC, 128 x
# 64 NCHW in place; then tiles around them.
PATCHES = ("tap", "flat", "rows")
FLAT_SEEDS = (
    (256, 64, 16, 4, 3), (128, 64, 64, 4, 2), (128, 64, 16, 4, 2), (128, 64, 32, 4, 3),
    (256, 64, 64, 8, 2),
)  # fmt: skip
# ``rows`` seeds: the fastest of 36 configs a layout on the stem (conv_rows-h200-20261127T0328
# .json): 256 x 32 with 2 stages (NCHW 84.8 us, NHWC 94.9 us), 256 x 16 with 4 (NHWC 94.9 us);
# then 128-row tiles.
ROWS_SEEDS = (
    (256, 64, 32, 4, 2), (256, 64, 16, 4, 4), (128, 64, 32, 4, 3), (128, 64, 16, 4, 3),
    (128, 128, 32, 8, 3),
)  # fmt: skip
DEFAULT_SMEM = 166912
MAX_ACC_PER_THREAD = 256
KNOB_NAMES = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages")
# The TMA kernel's seed tiles (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages), each with the
# box of BLOCK_M pixels that wastes least on the workload's output (``tma_boxes``): the fastest
# of 16-23 configs a shape on ResNet-50's 3x3s (batch 32, NHWC) at 56x56, 28x28 and 14x14 on
# an H200 (conv_tma-h200-20261127.json), then triton.gemm's usual points.
TMA_SEEDS = (
    (128, 64, 64, 8, 3), (256, 128, 64, 8, 3), (128, 128, 64, 4, 4), (64, 128, 64, 4, 4),
    (128, 128, 32, 8, 3), (64, 64, 32, 4, 3),
)  # fmt: skip
ELEMENT_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
# Known-good tiles (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages), the first that fits
# being the default: triton.gemm's usual points, then narrower ones for few channels a group.
SEEDS = (
    (128, 128, 32, 8, 3), (128, 64, 32, 4, 4), (64, 128, 32, 4, 4), (128, 64, 64, 8, 3),
    (64, 64, 32, 4, 3), (128, 32, 32, 4, 3), (64, 32, 32, 4, 2), (64, 16, 16, 2, 2),
    (32, 16, 16, 2, 1),
)  # fmt: skip
# The direct kernel's seed tiles (BLOCK_M, BLOCK_N, num_warps, TILE_W, STRIP) per layout, the
# first that fits the default. Strips first: of 8 pixels, 16 or 32 of them x 32 or 16
# channels on four warps, what the suite's 64 trials picked for ConvNeXt-T's 7x7 depthwise
# layers (batch 32, an H200: 1.45x cuDNN at 56x56 NHWC, 1.21x at 14x14, 4.19x at 56x56 NCHW
# repacked; operators-conv2d-strip-*-h200-20261127T120*.json); of 4, 32 x 32 on two warps,
# 0.99-1.24x cuDNN on the four NHWC ones where the best blocks of rows ran 0.82-0.99x
# (depthwise_acc-strip-h200-20261127T1153.json). Then blocks of rows: 32 pixels in 4 rows of
# 8 x 32 channels with one warp, the fastest of 28-35 such configs in 3 of 4 of those cases
# (56x56 and 14x14, both layouts; dw_probe-h200-20261126.json; 64 x 64 with 2 warps at 14x14
# NHWC), then tiles wide along the contiguous dimension, the channels of NHWC or the pixels
# of NCHW.
DEPTHWISE_SEEDS = {
    "nhwc": (
        (16, 32, 4, 4, 8), (32, 16, 4, 4, 8), (32, 32, 2, 4, 4), (32, 32, 1, 8, 1),
        (64, 64, 2, 8, 1), (32, 32, 1, 32, 1), (64, 32, 2, 16, 1), (32, 128, 4, 16, 1),
        (128, 32, 4, 32, 1),
    ),
    "nchw": (
        (32, 32, 1, 8, 1), (256, 16, 4, 32, 1), (128, 16, 4, 32, 1), (512, 8, 4, 64, 1),
        (128, 32, 4, 16, 1),
    ),
}  # fmt: skip


def _gemm_template() -> TritonGemmTemplate:
    return TritonGemmTemplate()


def bmm_view(workload: Workload, target: Target) -> Workload | None:
    """The batched GEMM whose ``triton.bmm`` space and kernels run a pointwise NCHW workload
    (``pointwise_bmm``) where its persistent TMA kernel can (Hopper, 16-byte rows), else
    None: elsewhere the implicit-GEMM kernels, REPACK included, keep it."""
    bmm = pointwise_bmm(workload)
    return bmm if bmm is not None and bmm_tma_runs(bmm, target) else None


def _routed(workload: Workload, target: Target) -> tuple[Template, Workload] | None:
    """The template and workload whose space a plain-GEMM conv2d takes: triton.gemm's for a
    pointwise NHWC workload, triton.bmm's for a pointwise NCHW one (``bmm_view``)."""
    gemm = pointwise_gemm(workload)
    if gemm is not None:
        return _gemm_template(), gemm
    bmm = bmm_view(workload, target)
    return (TritonBmmTemplate(), bmm) if bmm is not None else None


def _pow2_at_least(n: int, floor: int) -> int:
    return max(floor, 1 << max(0, math.ceil(math.log2(max(1, n)))))


def _repacks(workload: Workload) -> tuple[bool, ...]:
    """REPACK's values: an NCHW workload may be read from channels-last copies."""
    return (False,) if is_nhwc(workload) else (False, True)


def tma_eligible(workload: Workload, target: Target) -> bool:
    """Whether the TMA kernel may run the workload: a Hopper or newer GPU, stride 1, one group
    and rows of channels that TMA can address (16-byte multiples)."""
    d = conv_dims(workload)
    return (
        capability_of(target) >= 90
        and d["groups"] == 1
        and d["stride_h"] == d["stride_w"] == 1
        and d["icg"] * ELEMENT_BYTES.get(workload.dtype, 2) % 16 == 0
    )


def rows_channels(icg: int) -> int:
    """The channels a pixel of the ``rows`` order's padded buffer: C/groups rounded up to a
    power of two, so that every pixel starts on a whole vector."""
    return 1 << max(0, (icg - 1).bit_length())


def patches(workload: Workload) -> tuple[str, ...]:
    """The implicit GEMM's K orders (``PATCH``) for the workload: ``tap`` always; ``flat``
    where C/groups is no multiple of 16 (a tap's block of channels pads with zeros); ``rows``
    there too for one group without dilation along W, if a filter row (KW x C rounded up to a
    power of two) is at most 128 elements and the padded copy of the input is addressable in
    32 bits."""
    d = conv_dims(workload)
    if is_depthwise(workload) or d["icg"] % 16 == 0:
        return ("tap",)
    cp = rows_channels(d["icg"])
    padded = d["batch"] * (d["height"] + 2 * d["pad_h"]) * (d["width"] + 2 * d["pad_w"]) * cp
    rows = (
        d["groups"] == 1
        and d["dilation_w"] == 1
        and d["kernel_w"] * cp <= max(BLOCK_KS)
        and padded < 2**31
    )
    return PATCHES if rows else PATCHES[:2]


def tma_useful(workload: Workload, tile_b: int, tile_h: int, tile_w: int) -> float:
    """The share of the pixels of the boxes covering the output (batch x OH x OW) that are
    real output."""
    d = conv_dims(workload)
    dims = ((d["batch"], tile_b), (d["oh"], tile_h), (d["ow"], tile_w))
    covered = math.prod(math.ceil(n / t) * t for n, t in dims)
    return math.prod(n for n, _ in dims) / covered


def tma_boxes(workload: Workload, block_m: int) -> list[tuple[int, int]]:
    """The (TILE_H, TILE_W) boxes of ``block_m`` pixels that waste least on the workload's
    output, best first (the fewest images, then the widest rows, among the equally good), at
    most ``TMA_BOXES`` of them and none with less than ``MIN_USEFUL`` real output, then one
    row of ``block_m`` pixels where that is no worse than ``MIN_USEFUL``."""
    d = conv_dims(workload)
    ranked = []
    for th in TILE_HS:
        for tw in TILE_WS[1:]:
            if block_m % (th * tw) or not _box_fits(d, block_m, th, tw):
                continue
            tb = block_m // (th * tw)
            useful = tma_useful(workload, tb, th, tw)
            if useful >= MIN_USEFUL:
                ranked.append((-useful, tb, -tw, th))
    boxes = [(th, -tw) for _, _, tw, th in sorted(ranked)[:TMA_BOXES]]
    # One row of BLOCK_M pixels, the box a wide output wastes least in: its loads feed the
    # tensor cores from shared memory, where a box of several rows or images is first
    # reshaped in registers (Triton 3.6).
    row = (1, block_m)
    if (
        row not in boxes
        and block_m in TILE_WS
        and _box_fits(d, block_m, *row)
        and tma_useful(workload, 1, *row) >= MIN_USEFUL
    ):
        boxes.append(row)
    return boxes


def _box_fits(d: dict[str, int], block_m: int, th: int, tw: int) -> bool:
    """A box no taller, wider or deeper in images than the output (rounded up to a power of
    two) needs."""
    tb = block_m // (th * tw)
    return (
        th <= _pow2_at_least(d["oh"], 1)
        and tw <= _pow2_at_least(d["ow"], 4)
        and tb <= _pow2_at_least(d["batch"], 1)
    )


def shared_bytes(config: Config, elem: int) -> int:
    """Shared memory of the pipelined A and B tiles."""
    bk = int(config["BLOCK_K"])
    tiles = (int(config["BLOCK_M"]) + int(config["BLOCK_N"])) * bk * elem
    return max(1, int(config["num_stages"])) * tiles


class TritonConv2dTemplate(Template):
    """``triton.conv2d``: see the module docstring."""

    name = "triton.conv2d"
    # 2: one flat (tap, channel block) K loop, and depthwise workloads on the direct kernel
    # (records of version 1 time other code). 3: pointwise NHWC workloads on triton.gemm's
    # kernels and space. 4: the TMA kernel (configs carry TMA, TILE_H and TILE_W). 5: the K
    # loop's order (PATCH: flat patch blocks, padded rows), a knob records of version 4 lack.
    # 6: pointwise NCHW workloads on triton.bmm's kernels and space (on Hopper). 7: the
    # depthwise kernel's strips (STRIP), a knob records of version 6 lack.
    version = 7
    device_kind = "cuda"
    baseline_template = "torch.conv2d_gpu"
    slowest_gflops = 20.0

    def capabilities(self, target: Target) -> Capabilities:
        return Capabilities(
            kinds=("cuda",),
            ops=("conv2d",),
            dtypes=tuple(ELEMENT_BYTES),
            a_layouts=("row_major",),
            b_layouts=("row_major",),
            epilogues=("none",),
        )

    def space(self, workload: Workload, target: Target) -> SearchSpace:
        if is_depthwise(workload):
            return self._depthwise_space(workload)
        routed = _routed(workload, target)
        if routed is not None:
            return routed[0].space(routed[1], target)
        cap_m = _pow2_at_least(workload.m * int(workload.param("batch")), 32)
        cap_n = _pow2_at_least(workload.n, 16)
        d = conv_dims(workload)
        caps_k = {
            "tap": _pow2_at_least(d["icg"], 16),
            "flat": _pow2_at_least(d["icg"] * d["kernel_h"] * d["kernel_w"], 16),
            "rows": _pow2_at_least(rows_channels(d["icg"]) * d["kernel_w"], 16),
        }
        elem = ELEMENT_BYTES.get(workload.dtype, 2)
        smem = int(device_props(target).get("smem_per_block_bytes") or DEFAULT_SMEM)
        knobs = (
            Knob("BLOCK_M", BLOCK_MS),
            Knob("BLOCK_N", BLOCK_NS),
            Knob("BLOCK_K", BLOCK_KS),
            Knob("GROUP_M", GROUP_MS),
            Knob("num_warps", WARPS),
            Knob("num_stages", STAGES),
            Knob("REPACK", _repacks(workload)),
            Knob("PATCH", patches(workload)),
            *self._tma_knobs(workload, target),
        )
        boxes = {bm: tma_boxes(workload, bm) for bm in BLOCK_MS}
        nhwc = is_nhwc(workload)
        constraints = (
            KnobConstraint(
                ("TMA", "TILE_H", "TILE_W", "BLOCK_M", "REPACK"),
                lambda c: (
                    (int(c["TILE_H"]), int(c["TILE_W"])) in boxes[int(c["BLOCK_M"])]
                    and (nhwc or bool(c["REPACK"]))
                    if c["TMA"]
                    else int(c["TILE_H"]) == int(c["TILE_W"]) == 1
                ),
            ),
            KnobConstraint(
                ("PATCH", "TMA", "REPACK"),
                lambda c: (
                    c["PATCH"] == "tap" or not (c["TMA"] or (c["PATCH"] == "rows" and c["REPACK"]))
                ),
            ),
            KnobConstraint(
                ("BLOCK_M", "BLOCK_N", "BLOCK_K", "PATCH"),
                lambda c: (
                    int(c["BLOCK_M"]) <= cap_m
                    and int(c["BLOCK_N"]) <= cap_n
                    and int(c["BLOCK_K"]) <= caps_k[str(c["PATCH"])]
                ),
            ),
            KnobConstraint(
                ("BLOCK_M", "BLOCK_N", "num_warps"),
                lambda c: (
                    int(c["BLOCK_M"]) * int(c["BLOCK_N"]) / (32 * int(c["num_warps"]))
                    <= MAX_ACC_PER_THREAD
                ),
            ),
            KnobConstraint(
                ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_stages"),
                lambda c: shared_bytes(c, elem) <= smem,
            ),
        )
        return SearchSpace(knobs=knobs, constraints=constraints)

    @staticmethod
    def _tma_knobs(workload: Workload, target: Target) -> tuple[Knob, ...]:
        """TMA (the TMA kernel or the pointer-load one) and its box of output pixels; one
        value each (pointer loads) where the TMA kernel cannot run the workload."""
        on = tma_eligible(workload, target)
        return (
            Knob("TMA", (False, True) if on else (False,)),
            Knob("TILE_H", TILE_HS if on else (1,)),
            Knob("TILE_W", TILE_WS if on else (1,)),
        )

    def _depthwise_space(self, workload: Workload) -> SearchSpace:
        """The direct kernel's: a block of output pixels (BLOCK_M, in rows of TILE_W, within
        one image) or, with stride and dilation 1 along W (where a strip's neighbours share
        their input pixels), BLOCK_M strips of STRIP pixels (TILE_W then has one value);
        channels a program and warps (each thread's accumulators bounded); BLOCK_K, GROUP_M
        and num_stages have one value."""
        d = conv_dims(workload)
        cap_w = _pow2_at_least(d["ow"], 4)
        cap_h = _pow2_at_least(d["oh"], 1)
        cap_n = _pow2_at_least(d["out_channels"], 8)
        strip_ok = d["stride_w"] == 1 and d["dilation_w"] == 1
        strips = tuple(s for s in DEPTHWISE_STRIPS if s <= cap_w) if strip_ok else (1,)
        knobs = (
            Knob("BLOCK_M", DEPTHWISE_MS),
            Knob("BLOCK_N", DEPTHWISE_NS),
            Knob("BLOCK_K", (16,)),
            Knob("GROUP_M", (1,)),
            Knob("num_warps", DEPTHWISE_WARPS),
            Knob("num_stages", (1,)),
            Knob("REPACK", _repacks(workload)),
            Knob("TILE_W", DEPTHWISE_TILE_WS),
            Knob("STRIP", strips),
        )

        def share(c: Config) -> float:  # a thread's share of the tile
            return int(c["BLOCK_M"]) * int(c["BLOCK_N"]) / (32 * int(c["num_warps"]))

        constraints = (
            KnobConstraint(
                ("BLOCK_M", "TILE_W", "STRIP"),
                lambda c: (
                    int(c["TILE_W"]) <= min(cap_w, int(c["BLOCK_M"]))
                    and int(c["BLOCK_M"]) // int(c["TILE_W"]) <= cap_h
                    if int(c["STRIP"]) == 1
                    else int(c["TILE_W"]) == DEPTHWISE_TILE_WS[0]
                ),
            ),
            KnobConstraint(("BLOCK_N",), lambda c: int(c["BLOCK_N"]) <= cap_n),
            KnobConstraint(
                ("BLOCK_M", "BLOCK_N", "num_warps", "STRIP"),
                lambda c: (
                    4 <= share(c) <= 128
                    if int(c["STRIP"]) == 1
                    else share(c) >= 4 and int(c["STRIP"]) * share(c) <= STRIP_ACCUMULATORS
                ),
            ),
        )
        return SearchSpace(knobs=knobs, constraints=constraints)

    def _seeds(self, workload: Workload, target: Target) -> list[Config]:
        """Known-good tiles: where a tap's channels pad, padded rows' and flat patch blocks'
        (NCHW's flat ones repacked first, then in place); the TMA kernel's where it runs the
        workload (repacked for NCHW); then the pointer-load kernel's, for NCHW the
        channels-last tiles repacked first, then the layout's own tiles read in place."""
        if is_depthwise(workload):
            return self._plain_seeds(workload)
        ordered = []
        orders = patches(workload)
        if "rows" in orders:
            ordered += [
                Config({**dict(zip(KNOB_NAMES, (bm, bn, bk, 8, w, s), strict=True)),
                        "REPACK": False, "PATCH": "rows", **POINTER_BOX})
                for bm, bn, bk, w, s in ROWS_SEEDS
            ]  # fmt: skip
        if "flat" in orders:
            for repack in dict.fromkeys((not is_nhwc(workload), False)):
                ordered += [
                    Config({**dict(zip(KNOB_NAMES, (bm, bn, bk, 8, w, s), strict=True)),
                            "REPACK": repack, "PATCH": "flat", **POINTER_BOX})
                    for bm, bn, bk, w, s in FLAT_SEEDS
                ]  # fmt: skip
        tma = []
        if tma_eligible(workload, target):
            for bm, bn, bk, w, s in TMA_SEEDS:
                for th, tw in tma_boxes(workload, bm)[:1]:
                    tile = dict(zip(KNOB_NAMES, (bm, bn, bk, 8, w, s), strict=True))
                    tma.append(
                        Config({**tile, "REPACK": not is_nhwc(workload), "PATCH": "tap",
                                "TMA": True, "TILE_H": th, "TILE_W": tw})
                    )  # fmt: skip
        plain = [
            Config({**c.to_dict(), "PATCH": "tap", **POINTER_BOX})
            for c in self._plain_seeds(workload)
        ]
        return ordered + tma + plain

    def _plain_seeds(self, workload: Workload) -> list[Config]:
        tiles: dict[str, list[dict[str, int]]] = {}
        for layout in ("nhwc", "nchw"):
            if is_depthwise(workload):
                tiles[layout] = [
                    {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 16, "GROUP_M": 1, "num_warps": w,
                     "num_stages": 1, "TILE_W": tw, "STRIP": strip}
                    for bm, bn, w, tw, strip in DEPTHWISE_SEEDS[layout]
                ]  # fmt: skip
            else:
                tiles[layout] = [
                    dict(zip(KNOB_NAMES, (bm, bn, bk, 8, w, s), strict=True))
                    for bm, bn, bk, w, s in SEEDS
                ]
        if is_nhwc(workload):
            return [Config({**t, "REPACK": False}) for t in tiles["nhwc"]]
        return [Config({**t, "REPACK": True}) for t in tiles["nhwc"]] + [
            Config({**t, "REPACK": False}) for t in tiles["nchw"]
        ]

    def default_config(self, workload: Workload, target: Target) -> Config:
        """The first known-good tile that fits the workload and device (triton.gemm's or
        triton.bmm's default for a pointwise workload's GEMM)."""
        routed = _routed(workload, target)
        if routed is not None:
            return routed[0].default_config(routed[1], target)
        space = self.space(workload, target)
        for config in self._seeds(workload, target):
            if space.is_valid(config):
                return config
        return space.points[0]

    def seed_configs(self, workload: Workload, target: Target) -> list[Config]:
        routed = _routed(workload, target)
        if routed is not None:
            return routed[0].seed_configs(routed[1], target)
        space = self.space(workload, target)
        seeds = [c for c in self._seeds(workload, target) if space.is_valid(c)]
        return seeds or [space.points[0]]

    def cores_used(self, config: Config) -> int:
        return 1  # the launching thread

    def baseline_config(self, config: Config, workload: Workload, target: Target) -> Config:
        """What a PyTorch user gets: cuDNN with its algorithm search on."""
        return Config({"benchmark": True})

    def build(self, request: MeasureRequest, *, build_dir: Path) -> Artifact:
        """Compile the kernels the run will launch (a pointwise workload's on
        ``triton.gemm``'s or ``triton.bmm``'s) into Triton's cache for the target's compute
        capability (no GPU needed), so builders compile while the GPU times another
        candidate and the run's first launch finds them; nothing compiles under the
        interpreter."""
        problem = self.request_problem(request)
        if problem:
            raise BuildFailed(MeasureStatus.INVALID, problem)
        if _interpreting():
            return Artifact(template=self.name, key="interpreter", environment={"build": "none"})
        from tunehub.kernels import triton_conv_kernels as kernels

        start = time.perf_counter()
        with compile_errors(start):
            built = kernels.precompile(
                request.workload,
                request.config.to_dict(),
                capability_of(request.target),
                request.target.cores,
            )
        return Artifact(
            template=self.name,
            key="+".join(built.keys),
            compile_secs=built.compile_secs,
            environment={
                "build": "ahead",
                "shared_bytes": built.shared_bytes,
                "triton_cache_dir": os.environ.get("TRITON_CACHE_DIR", ""),
            },
        )

    def run(
        self, request: MeasureRequest, artifact: Artifact, *, timing: TimingPolicy
    ) -> MeasureResult:
        """Check the kernel on fresh random inputs into a NaN-poisoned output against the
        float64 reference, then time it (``tunehub.kernels.gpu_timing``)."""
        from tunehub.kernels import triton_conv_kernels as kernels
        from tunehub.kernels.gpu_timing import FIRST_LAUNCH_FAILURES as failures
        from tunehub.kernels.gpu_timing import check_then_time, first_launch_secs, run_environment

        workload = request.workload
        device = _device()
        environment, seed = run_environment(device, artifact.environment)
        compile_secs = artifact.compile_secs
        try:
            ops = kernels.operands(workload, device, seed)
            launch = kernels.bind(ops, request.config.to_dict())
            # Compiled in the build (its first launch loads it from Triton's cache), or here.
            compile_secs += first_launch_secs(launch, device)
            return check_then_time(
                launch,
                lambda _: kernels.check(ops.out, kernels.reference(ops), workload.dtype),
                device=device,
                environment=environment,
                timing=timing,
                compile_secs=compile_secs,
                called=True,
            )
        except failures.catch as exc:  # a compile failure (out of resources), a CUDA error
            return failures.record(exc, environment, compile_secs)
