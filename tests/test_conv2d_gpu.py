"""triton.conv2d under the Triton interpreter (no GPU here): the implicit-GEMM kernel against
the float64 reference on small shapes (padding, stride, dilation, groups, depthwise, both
layouts), its space, and its measurement and cuDNN baseline's through the template path."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from tunehub.core import MeasureRequest, MeasureStatus, Target, Workload
from tunehub.cost_model.features import feature_set
from tunehub.kernels import triton_conv_kernels as ck
from tunehub.kernels.base import TimingPolicy
from tunehub.kernels.registry import get_template

pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim:DeprecationWarning"
)

H100 = Target(
    kind="cuda",
    name="H100",
    arch=("sm_90",),
    cores=132,
    vendor="nvidia",
    properties={"compute_capability": 90, "smem_per_block_bytes": 232448, "regs_per_sm": 65536},
)
SMALL = {"op": "conv2d", "in_channels": 4, "out_channels": 6, "height": 7, "width": 6,
         "kernel_h": 3, "kernel_w": 3}  # fmt: skip
TILE = {"BLOCK_M": 32, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 8, "num_warps": 2, "num_stages": 1,
        "REPACK": False}  # fmt: skip


def conv(**changes: Any) -> Workload:
    return Workload.from_dict({**SMALL, **changes})


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize(
    "changes",
    [
        {"pad_h": 1, "pad_w": 1, "batch": 2},
        {"stride_h": 2, "stride_w": 3, "pad_h": 2, "dilation_w": 2, "kernel_w": 2},
        {"groups": 2, "in_channels": 6, "out_channels": 4, "pad_w": 1},
        {"groups": 4, "out_channels": 4, "pad_h": 1, "pad_w": 1},  # depthwise
        {"groups": 4, "out_channels": 8, "stride_h": 2, "pad_w": 2, "dilation_w": 2},  # x2
        {"in_channels": 20, "out_channels": 18, "kernel_h": 1, "kernel_w": 1},  # K over tiles
    ],
)
def test_the_triton_kernel_matches_the_float64_reference(
    layout: str, changes: dict[str, Any]
) -> None:
    w = conv(data_layout=layout, dtype="float32", **changes)
    ops = ck.operands(w, torch.device("cpu"), seed=3)
    ck.bind(ops, {**TILE, "TILE_W": 4})()  # TILE_W: the depthwise kernel's rows of 4 pixels
    check = ck.check(ops.out, ck.reference(ops), "float32")
    assert check.ok, check.message
    assert ops.out.is_contiguous(
        memory_format=torch.channels_last if layout == "nhwc" else torch.contiguous_format
    )


@pytest.mark.parametrize(
    ("layout", "strip", "changes"),
    [
        # ConvNeXt-like 7x7 (a width no multiple of the strip: its last strip overhangs),
        # strips of 2, 4 and 8 pixels; stride, dilation and uneven padding along H; two
        # output channels per input channel; NCHW read in place and repacked.
        ("nhwc", 4, {"kernel_h": 7, "kernel_w": 7, "pad_h": 3, "pad_w": 3, "width": 9}),
        ("nhwc", 8, {"kernel_h": 7, "kernel_w": 7, "pad_h": 3, "pad_w": 3, "width": 13}),
        ("nhwc", 2, {"stride_h": 2, "dilation_h": 2, "pad_h": 2, "pad_w": 1, "width": 5}),
        ("nhwc", 4, {"out_channels": 8, "pad_w": 2, "kernel_w": 5}),
        ("nchw", 4, {"pad_h": 1, "pad_w": 1, "batch": 2}),
        ("nchw-repack", 2, {"out_channels": 8, "pad_h": 1, "pad_w": 1}),
    ],
)
def test_the_depthwise_strip_kernel_matches_the_float64_reference(
    layout: str, strip: int, changes: dict[str, Any]
) -> None:
    # STRIP: each program row is a strip of output pixels along W whose filter rows load
    # each input pixel once and add it into every output pixel of the strip it reaches.
    fields = {"groups": 4, "out_channels": 4, **changes}
    w = conv(data_layout=layout.split("-")[0], dtype="float32", **fields)
    ops = ck.operands(w, torch.device("cpu"), seed=7)
    config = {**TILE, "TILE_W": 4, "STRIP": strip, "REPACK": layout.endswith("repack")}
    (launch,) = [
        x for x in ck.conv_launches(ops.x, ops.w, ops.out, w, config) if x.kernel.__name__
        != "_to_channels_last"
    ]  # fmt: skip
    assert launch.kernel is ck._depthwise_strip_kernel
    ck.bind(ops, config)()
    check = ck.check(ops.out, ck.reference(ops), "float32")
    assert check.ok, check.message
    strided = conv(groups=4, out_channels=4, stride_w=2, pad_w=1, dtype="float32")
    with pytest.raises(ValueError, match="stride_w and dilation_w 1"):
        ops = ck.operands(strided, torch.device("cpu"), seed=7)
        ck.bind(ops, config)


@pytest.mark.parametrize(
    "changes",
    [{"pad_h": 1, "pad_w": 1, "batch": 2}, {"groups": 4, "out_channels": 8, "pad_w": 1}],
)
def test_nchw_repacked_to_channels_last_in_the_call_matches_the_reference(
    changes: dict[str, Any],
) -> None:
    w = conv(data_layout="nchw", dtype="float32", **changes)
    ops = ck.operands(w, torch.device("cpu"), seed=5)
    x_before = ops.x.clone()
    launch = ck.bind(ops, {**TILE, "REPACK": True, "TILE_W": 2})
    launch()
    check = ck.check(ops.out, ck.reference(ops), "float32")
    assert check.ok, check.message
    assert torch.equal(ops.x, x_before) and ops.out.is_contiguous()
    ops.x.uniform_(-1.0, 1.0)  # a later call reads the input as it is then
    launch()
    assert ck.check(ops.out, ck.reference(ops), "float32").ok


STEM_LIKE = {"in_channels": 3, "kernel_h": 7, "kernel_w": 7, "stride_h": 2, "stride_w": 2,
             "pad_h": 3, "pad_w": 3, "height": 11, "width": 9}  # fmt: skip


@pytest.mark.parametrize(
    ("layout", "patch", "repack", "changes"),
    [
        # A stem-like 7x7/2 on 3 channels (147 deep: blocks of 16 past the patch; rows of 7
        # pixels of 4 channels, 28 of a block of 32), NCHW in place and repacked, dilation
        # along H, groups of 3 channels (flat only).
        ("nhwc", "flat", False, STEM_LIKE),
        ("nchw", "flat", False, STEM_LIKE),
        ("nchw", "flat", True, {"pad_h": 1, "dilation_w": 2, "batch": 2}),
        ("nhwc", "flat", False, {"groups": 2, "in_channels": 6, "out_channels": 4, "pad_w": 1}),
        ("nhwc", "rows", False, STEM_LIKE),
        ("nchw", "rows", False, STEM_LIKE),
        ("nchw", "rows", False, {"pad_h": 2, "dilation_h": 2, "batch": 3, "in_channels": 5}),
        ("nhwc", "rows", False, {"kernel_h": 1, "kernel_w": 5, "pad_w": 2, "stride_h": 3}),
    ],
)  # fmt: skip
def test_patch_orders_match_the_float64_reference(
    layout: str, patch: str, repack: bool, changes: dict[str, Any]
) -> None:
    w = conv(data_layout=layout, dtype="float32", **changes)
    ops = ck.operands(w, torch.device("cpu"), seed=11)
    ck.bind(ops, {**TILE, "REPACK": repack, "PATCH": patch})()
    check = ck.check(ops.out, ck.reference(ops), "float32")
    assert check.ok, check.message


def test_the_rows_order_refuses_groups_and_dilation_along_w() -> None:
    for changes in ({"groups": 2, "in_channels": 6, "out_channels": 4}, {"dilation_w": 2}):
        ops = ck.operands(conv(dtype="float32", **changes), torch.device("cpu"), seed=1)
        with pytest.raises(ValueError, match="rows"):
            ck.bind(ops, {**TILE, "PATCH": "rows"})


def test_patch_orders_are_in_the_space_where_a_tap_pads() -> None:
    t = get_template("triton.conv2d")
    stem = conv(in_channels=3, out_channels=64, height=224, width=224, batch=32, kernel_h=7,
                kernel_w=7, stride_h=2, stride_w=2, pad_h=3, pad_w=3, dtype="float16",
                data_layout="nchw")  # fmt: skip
    points = t.space(stem, H100).points
    by_order = {o: [c for c in points if c["PATCH"] == o] for o in ("tap", "flat", "rows")}
    assert all(by_order.values()) and not any(c["TMA"] for c in points)
    # A flat block up to the patch (147, so every BLOCK_K), a row block up to a filter row (7
    # pixels of 4 channels), a tap's block up to its 3 channels; no copy before rows.
    assert {int(c["BLOCK_K"]) for c in by_order["flat"]} == {16, 32, 64, 128}
    assert {int(c["BLOCK_K"]) for c in by_order["rows"]} == {16, 32}
    assert {int(c["BLOCK_K"]) for c in by_order["tap"]} == {16}
    assert not any(c["REPACK"] for c in by_order["rows"])
    assert t.default_config(stem, H100)["PATCH"] == "rows"
    m = feature_set("triton.conv2d").matrix(stem, H100, [points[0], *by_order["rows"][:1]])
    assert m.shape[0] == 2
    grouped = conv(groups=2, in_channels=6, out_channels=4, dtype="float16")
    assert {c["PATCH"] for c in t.space(grouped, H100).points} == {"tap", "flat"}
    # 65,535 images padded to 100 x 100 pixels of 4 channels are past 2**31 elements.
    huge = conv(in_channels=3, out_channels=1, height=40, width=40, batch=65_535, kernel_h=7,
                kernel_w=7, pad_h=30, pad_w=30, dtype="float32")  # fmt: skip
    assert {c["PATCH"] for c in t.space(huge, H100).points} == {"tap", "flat"}
    for workload in (
        conv(in_channels=64, out_channels=64, dtype="float16"),  # whole blocks of channels
        conv(groups=4, out_channels=4, dtype="float16"),  # depthwise: the direct kernel
    ):
        assert {c.get("PATCH", "tap") for c in t.space(workload, H100).points} == {"tap"}


@pytest.mark.parametrize(
    ("layout", "changes", "box"),
    [
        # (TILE_B, TILE_H, TILE_W) boxes: images x rows x pixels, one row, rows over the edge
        ("nhwc", {"pad_h": 1, "pad_w": 1, "batch": 3}, (2, 2, 8)),
        ("nhwc", {"pad_h": 2, "dilation_h": 2, "batch": 2}, (1, 1, 32)),
        ("nchw", {"pad_h": 1, "pad_w": 1, "batch": 2}, (1, 8, 4)),
        ("nhwc", {"kernel_h": 1, "kernel_w": 5, "pad_w": 2, "height": 5, "width": 12}, (1, 4, 8)),
    ],
)
def test_the_tma_kernel_matches_the_float64_reference(
    layout: str, changes: dict[str, Any], box: tuple[int, int, int]
) -> None:
    # 20 channels: a block of 16 reads the next tap's filters for the 12 past the last,
    # against zeros TMA loads for the input's.
    w = conv(data_layout=layout, dtype="float32", in_channels=20, out_channels=24, **changes)
    ops = ck.operands(w, torch.device("cpu"), seed=7)
    tile_b, tile_h, tile_w = box
    config = {**TILE, "BLOCK_M": tile_b * tile_h * tile_w, "REPACK": layout == "nchw",
              "TMA": True, "TILE_H": tile_h, "TILE_W": tile_w}  # fmt: skip
    ck.bind(ops, config)()
    check = ck.check(ops.out, ck.reference(ops), "float32")
    assert check.ok, check.message


def test_the_tma_kernel_refuses_an_input_that_is_not_channels_last() -> None:
    w = conv(data_layout="nchw", dtype="float32", in_channels=20, out_channels=24, pad_h=1)
    ops = ck.operands(w, torch.device("cpu"), seed=7)
    config = {**TILE, "TMA": True, "TILE_H": 4, "TILE_W": 8}  # NCHW read in place: no
    with pytest.raises(ValueError, match="channels-last"):
        ck.bind(ops, config)


def test_the_tma_kernel_is_in_the_space_where_it_can_run() -> None:
    t = get_template("triton.conv2d")
    w = conv(in_channels=64, out_channels=64, height=28, width=28, batch=8, pad_h=1, pad_w=1,
             dtype="float16", data_layout="nchw")  # fmt: skip
    points = t.space(w, H100).points
    tma = [c for c in points if c["TMA"]]
    assert tma and all(c["REPACK"] for c in tma)  # NCHW: read from channels-last copies
    assert all(c["TILE_H"] == c["TILE_W"] == 1 for c in points if not c["TMA"])
    for c in tma:  # every box a whole number of images of TILE_H x TILE_W, fitting the output
        assert int(c["BLOCK_M"]) % (int(c["TILE_H"]) * int(c["TILE_W"])) == 0
        assert int(c["TILE_W"]) <= 32 and int(c["TILE_H"]) <= 32
    assert t.default_config(w, H100)["TMA"] is True
    assert feature_set("triton.conv2d").matrix(w, H100, tma[:2] + points[:2]).shape[0] == 4
    a100 = Target(kind="cuda", name="A100", arch=("sm_80",), cores=108,
                  properties={"compute_capability": 80})  # fmt: skip
    for workload, target in (
        (w, a100),  # no TMA before Hopper
        (conv(in_channels=64, out_channels=64, stride_h=2, dtype="float16"), H100),
        (conv(in_channels=64, out_channels=64, groups=2, dtype="float16"), H100),
        (conv(in_channels=4, out_channels=64, dtype="float16"), H100),  # 8-byte rows
    ):
        assert not any(c["TMA"] for c in t.space(workload, target).points)


def test_a_pointwise_nhwc_conv_is_a_plain_gemm_on_triton_gemms_kernels(tmp_path: Path) -> None:
    t = get_template("triton.conv2d")
    pointwise = {"dtype": "float32", "in_channels": 20, "out_channels": 24, "kernel_h": 1,
                 "kernel_w": 1, "batch": 2}  # fmt: skip
    w = conv(data_layout="nhwc", **pointwise)
    gemm = get_template("triton.gemm")
    view = Workload.from_dict({"op": "matmul", "m": 2 * 7 * 6, "n": 24, "k": 20,
                               "dtype": "float32", "b_layout": "col_major"})  # fmt: skip
    assert t.space(w, H100).points == gemm.space(view, H100).points
    assert t.default_config(w, H100) == gemm.default_config(view, H100)
    points = t.space(w, H100).points
    assert feature_set("triton.conv2d").matrix(w, H100, points[:3]).shape[0] == 3
    for config in (t.default_config(w, H100), {**gemm.space(view, H100).points[0].to_dict()}):
        ops = ck.operands(w, torch.device("cpu"), seed=11)
        ck.bind(ops, dict(config))()
        check = ck.check(ops.out, ck.reference(ops), "float32")
        assert check.ok, check.message
    big = conv(data_layout="nhwc", **{**pointwise, "batch": 32, "height": 56, "width": 56})
    assert t.space(big, H100).points  # 100,352 rows: the space sees 65,536
    # Padded, strided, grouped or NCHW 1x1s keep the implicit-GEMM kernel and its space.
    for changes in ({"pad_h": 1}, {"stride_h": 2}, {"groups": 2}, {"data_layout": "nchw"}):
        other = conv(**{"data_layout": "nhwc", **pointwise, **changes})
        assert all("variant" not in c for c in t.space(other, H100).points)
    request = MeasureRequest(w, H100, t.name, t.version, t.default_config(w, H100))
    result = t.measure(
        request, build_dir=tmp_path, timing=TimingPolicy(min_secs=0.001, max_repeats=2)
    )
    assert result.status is MeasureStatus.OK, result.error


def test_a_pointwise_nchw_conv_is_a_batched_gemm_on_triton_bmms_kernels(tmp_path: Path) -> None:
    """Each image's output (O x H·W) is the filters (O x C) times its input (C x H·W), all
    as stored: triton.bmm's space and kernels (the TMA one included) where it can run."""
    t = get_template("triton.conv2d")
    pointwise = {"dtype": "float16", "in_channels": 16, "out_channels": 24, "kernel_h": 1,
                 "kernel_w": 1, "batch": 3, "height": 4, "width": 8}  # fmt: skip
    w = conv(**pointwise)
    bmm = get_template("triton.bmm")
    view = Workload.from_dict({"op": "bmm", "batch": 3, "m": 24, "n": 32, "k": 16,
                               "dtype": "float16"})  # fmt: skip
    assert t.space(w, H100).points == bmm.space(view, H100).points
    default = t.default_config(w, H100)
    assert default == bmm.default_config(view, H100) and default["TMA"] is True
    points = t.space(w, H100).points
    x = feature_set("triton.conv2d").matrix(w, H100, points[:3])
    assert x[:, feature_set("triton.conv2d").names.index("bmm_route")].tolist() == [1.0] * 3
    tile = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 4, "num_warps": 4,
            "num_stages": 2}  # fmt: skip
    for config in (
        {**tile, "TMA": True, "BATCH_MAJOR": False},
        {**tile, "TMA": False, "BATCH_MAJOR": True},
    ):
        assert t.space(w, H100).is_valid(config)
        ops = ck.operands(w, torch.device("cpu"), seed=5)
        ck.bind(ops, config)()
        check = ck.check(ops.out, ck.reference(ops), "float16")
        assert check.ok, (config, check.message)
    # Rows of H·W that TMA cannot address (4 x 5 pixels: 40 bytes), a GPU before Hopper, a
    # padded 1x1: the implicit-GEMM kernels and their space.
    a100 = Target.from_dict({**H100.to_dict(), "properties": {
        **H100.properties, "compute_capability": 80}})  # fmt: skip
    for other, target in (
        (conv(**{**pointwise, "width": 5}), H100),
        (w, a100),
        (conv(**{**pointwise, "pad_h": 1}), H100),
    ):
        assert all("BATCH_MAJOR" not in c for c in t.space(other, target).points)
    with pytest.raises(ValueError, match="no batched GEMM"):
        ck.bind(ck.operands(conv(**{**pointwise, "pad_h": 1}), torch.device("cpu"), 1), default)
    request = MeasureRequest(w, H100, t.name, t.version, default)
    result = t.measure(
        request, build_dir=tmp_path, timing=TimingPolicy(min_secs=0.001, max_repeats=2)
    )
    assert result.status is MeasureStatus.OK, result.error


def test_the_check_catches_an_unwritten_output() -> None:
    ops = ck.operands(conv(pad_h=1), torch.device("cpu"), seed=1)
    check = ck.check(ops.out, ck.reference(ops), "float32")
    assert not check.ok and "not finite" in check.message
    ops.out.zero_()
    assert not ck.check(ops.out, ck.reference(ops), "float32").ok


def test_the_space_fits_the_gemm_view_and_the_device() -> None:
    t = get_template("triton.conv2d")
    depthwise = conv(groups=4, out_channels=4, dtype="float16")  # the direct kernel's space
    points = t.space(depthwise, H100).points
    assert {int(c["BLOCK_N"]) for c in points} == {8}  # channels a program, up to all
    assert {(c["BLOCK_K"], c["GROUP_M"], c["num_stages"]) for c in points} == {(16, 1, 1)}
    assert t.default_config(depthwise, H100) in points
    # Strips of pixels along W (up to the output's width rounded up), their TILE_W pinned and
    # their accumulators bounded; none where the W stride or dilation is not 1.
    wide = conv(groups=32, in_channels=32, out_channels=32, width=12, dtype="float16")
    points = t.space(wide, H100).points
    assert {int(c["STRIP"]) for c in points} == {1, 2, 4, 8}  # 10 pixels wide
    assert t.default_config(wide, H100)["STRIP"] == 8
    for c in points:
        share = int(c["BLOCK_M"]) * int(c["BLOCK_N"]) / (32 * int(c["num_warps"]))
        if int(c["STRIP"]) > 1:
            assert int(c["TILE_W"]) == 4 and int(c["STRIP"]) * share <= 64, c
    narrow_w = conv(groups=4, out_channels=4, width=3, dtype="float16")  # 1 pixel wide
    assert {int(c["STRIP"]) for c in t.space(narrow_w, H100).points} == {1, 2, 4}
    for changes in ({"stride_w": 2}, {"dilation_w": 2, "pad_w": 2}):
        strided = conv(groups=4, out_channels=4, dtype="float16", **changes)
        assert {int(c["STRIP"]) for c in t.space(strided, H100).points} == {1}
        assert t.default_config(strided, H100)["STRIP"] == 1
    narrow = conv(in_channels=4, out_channels=6, dtype="float16")  # 4 channels a tap
    assert {c["REPACK"] for c in t.space(narrow, H100).points} == {False, True}
    assert t.default_config(narrow, H100)["REPACK"] is True  # nchw read from channels-last
    nhwc = conv(in_channels=4, out_channels=6, dtype="float16", data_layout="nhwc")
    assert {c["REPACK"] for c in t.space(nhwc, H100).points} == {False}
    points = t.space(narrow, H100).points
    assert {int(c["BLOCK_K"]) for c in points if c["PATCH"] == "tap"} == {16}
    big = conv(in_channels=256, out_channels=256, height=56, width=56, batch=8, dtype="float16")
    points = t.space(big, H100).points
    assert max(int(c["BLOCK_N"]) for c in points) == 256
    assert all(int(c["BLOCK_M"]) * int(c["BLOCK_N"]) / (32 * int(c["num_warps"])) <= 256
               for c in points)  # fmt: skip
    assert t.default_config(big, H100) in points
    assert t.baseline_template == "torch.conv2d_gpu"
    x = feature_set("triton.conv2d").matrix(big, H100, points[:3])
    assert x.shape[0] == 3


@pytest.mark.parametrize("name", ["triton.conv2d", "torch.conv2d_gpu"])
def test_triton_conv2d_and_cudnn_measure_checked_times(name: str, tmp_path: Path) -> None:
    w = conv(pad_h=1, pad_w=1, data_layout="nhwc", dtype="float32")
    t = get_template(name)
    pointer = {**TILE, "TMA": False, "TILE_H": 1, "TILE_W": 1, "PATCH": "tap"}  # pointer loads
    config = pointer if name == "triton.conv2d" else {"benchmark": False}
    from tunehub.core import Config

    request = MeasureRequest(w, H100, name, t.version, Config(config))
    result = t.measure(
        request, build_dir=tmp_path, timing=TimingPolicy(min_secs=0.001, max_repeats=2)
    )
    assert result.status is MeasureStatus.OK, result.error
    assert result.environment["relative_error"] <= result.environment["tolerance"]


@pytest.mark.parametrize("patch", ["flat", "rows"])
def test_a_non_finite_input_reaches_only_the_outputs_whose_window_holds_it(patch: str) -> None:
    # The rows order reads past a filter row into the next pixels (their filters are zeros):
    # an infinity there must not reach outputs whose window does not hold it (inf x 0 = nan).
    w = conv(data_layout="nhwc", dtype="float32", **STEM_LIKE)
    ops = ck.operands(w, torch.device("cpu"), seed=13)
    ops.x[0, 1, 5, 4] = math.inf
    ck.bind(ops, {**TILE, "PATCH": patch})()
    expected = torch.nn.functional.conv2d(ops.x, ops.w, **ck.torch_args(w))
    assert torch.equal(torch.isfinite(ops.out), torch.isfinite(expected))
