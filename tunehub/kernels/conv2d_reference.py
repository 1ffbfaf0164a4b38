"""conv2d's operands, poisoned output and float64 reference check (numpy only), for every template.

Arrays are held as the workload's ``data_layout`` stores them, in PyTorch's memory orders:
``nchw``: input (N, C, H, W), filters (O, C/groups, KH, KW), output (N, O, OH, OW);
``nhwc``: input (N, H, W, C), filters (O, KH, KW, C/groups), output (N, OH, OW, O) (the
``channels_last`` tensors' storage). The check compares, for each image and group (all of
them, or a sample where there are many), the output's GEMM view C[out_h·out_w, O/groups]
with the float64 product of the input's patches and the group's filters (``check_gemm``'s
tolerance, on a row sample where a product is large).

>>> from tunehub.core import Workload
>>> w = Workload.from_dict({"op": "conv2d", "in_channels": 4, "out_channels": 6, "height": 5,
...     "width": 5, "kernel_h": 3, "kernel_w": 3, "pad_h": 1, "pad_w": 1, "groups": 2})
>>> x, f = conv_operands(w, np.random.default_rng(0))
>>> x.shape, f.shape, conv_output(w).shape
((1, 4, 5, 5), (6, 2, 3, 3), (1, 6, 5, 5))
>>> ok, *_ = check_conv(reference_conv(x, f, w).astype(x.dtype), x, f, w, np.random.default_rng(1))
>>> ok
True
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from tunehub.core import Workload
from tunehub.core.operators import Conv2d
from tunehub.core.workload import MAX_DIM
from tunehub.kernels.reference import check_gemm, sample_rows

Array = npt.NDArray[np.floating]

# Images x groups checked in full; beyond it, the first, the last and a random sample.
CHECK_PROBLEMS = 16


def conv_dims(workload: Workload) -> dict[str, int]:
    """The workload's fields as integers, with the output's ``oh``, ``ow`` and the per-group
    ``icg``, ``ocg``."""
    p: dict[str, Any] = {n: value for n, value in workload.params if n != "data_layout"}
    dims = {name: int(value) for name, value in p.items()}
    dims["oh"], dims["ow"] = Conv2d.output_hw(workload)
    dims["icg"] = dims["in_channels"] // dims["groups"]
    dims["ocg"] = dims["out_channels"] // dims["groups"]
    return dims


def is_nhwc(workload: Workload) -> bool:
    return bool(workload.param("data_layout") == "nhwc")


def pointwise_gemm(workload: Workload) -> Workload | None:
    """The plain GEMM a pointwise NHWC conv2d is, else None: a 1x1 filter, stride 1, no
    padding, one group and channels-last tensors make the input an (N·H·W) x C row-major
    matrix, the filters' transpose a C x O column-major one and the output an (N·H·W) x O
    row-major one, all three as stored. Its M is capped at a Workload's limit (65,536) for
    the GEMM space it names: the tiles' caps and split-K's test of idle SMs see no more
    rows than that (a launch takes its rows from the tensors)."""
    d = conv_dims(workload)
    plain = (
        is_nhwc(workload)
        and d["groups"] == 1
        and d["kernel_h"] == d["kernel_w"] == 1
        and d["stride_h"] == d["stride_w"] == 1
        and d["pad_h"] == d["pad_w"] == 0
    )
    if not plain:
        return None
    return Workload(
        m=min(MAX_DIM, d["batch"] * d["height"] * d["width"]),
        n=d["out_channels"],
        k=d["in_channels"],
        dtype=workload.dtype,
        b_layout="col_major",
        allow_tf32=workload.allow_tf32,
    )


def pointwise_bmm(workload: Workload) -> Workload | None:
    """The batched GEMM a pointwise NCHW conv2d is, else None: with a 1x1 filter, stride 1,
    no padding and one group, image n's output (O x H·W, row-major as stored) is the filters
    (O x C, one matrix for every image) times its input (C x H·W, row-major as stored): a
    ``bmm`` of N entries, m = O, n = H·W, k = C, its A shared. None where H·W passes a
    Workload's limit (65,536)."""
    d = conv_dims(workload)
    plain = (
        not is_nhwc(workload)
        and d["groups"] == 1
        and d["kernel_h"] == d["kernel_w"] == 1
        and d["stride_h"] == d["stride_w"] == 1
        and d["pad_h"] == d["pad_w"] == 0
    )
    if not plain or d["height"] * d["width"] > MAX_DIM:
        return None
    return Workload(
        op="bmm",
        m=d["out_channels"],
        n=d["height"] * d["width"],
        k=d["in_channels"],
        dtype=workload.dtype,
        allow_tf32=workload.allow_tf32,
        params=(("batch", d["batch"]),),
    )


def is_depthwise(workload: Workload) -> bool:
    """One input channel per group, more than one group: the templates' direct path."""
    d = conv_dims(workload)
    return d["groups"] > 1 and d["icg"] == 1


def conv_shapes(
    workload: Workload,
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """The stored shapes of the input, the filters and the output."""
    d = conv_dims(workload)
    n, c, o = d["batch"], d["in_channels"], d["out_channels"]
    if is_nhwc(workload):
        return (
            (n, d["height"], d["width"], c),
            (o, d["kernel_h"], d["kernel_w"], d["icg"]),
            (n, d["oh"], d["ow"], o),
        )
    return (
        (n, c, d["height"], d["width"]),
        (o, d["icg"], d["kernel_h"], d["kernel_w"]),
        (n, o, d["oh"], d["ow"]),
    )


def conv_operands(workload: Workload, rng: np.random.Generator) -> tuple[Array, Array]:
    """Fresh input and filters, uniform in [-1, 1), in the workload's dtype (numpy has no
    bfloat16: GPU templates draw float32 and convert)."""
    x_shape, w_shape, _ = conv_shapes(workload)
    dtype = np.dtype("float32" if workload.dtype == "bfloat16" else workload.dtype)
    x = rng.uniform(-1.0, 1.0, x_shape).astype(dtype)
    w = rng.uniform(-1.0, 1.0, w_shape).astype(dtype)
    return x, w


def conv_output(workload: Workload) -> Array:
    """The output filled with NaN, so an element a kernel forgets to write fails the check."""
    dtype = np.dtype("float32" if workload.dtype == "bfloat16" else workload.dtype)
    return np.full(conv_shapes(workload)[2], np.nan, dtype=dtype)


def patches(workload: Workload, x: Array, image: int, group: int) -> Array:
    """The implicit GEMM's A for one image and group, in float64: row (oh, ow), column
    (c, kh, kw) (the filters' OIHW order)."""
    d = conv_dims(workload)
    xl = x.transpose(0, 3, 1, 2) if is_nhwc(workload) else x
    icg, ph, pw = d["icg"], d["pad_h"], d["pad_w"]
    plane = xl[image, group * icg : (group + 1) * icg].astype(np.float64)
    padded = np.pad(plane, ((0, 0), (ph, ph), (pw, pw)))
    oh, ow, sh, sw = d["oh"], d["ow"], d["stride_h"], d["stride_w"]
    cols = np.empty((icg, d["kernel_h"], d["kernel_w"], oh, ow))
    for i in range(d["kernel_h"]):
        for j in range(d["kernel_w"]):
            top, left = i * d["dilation_h"], j * d["dilation_w"]
            cols[:, i, j] = padded[
                :, top : top + sh * (oh - 1) + 1 : sh, left : left + sw * (ow - 1) + 1 : sw
            ]
    out: Array = cols.reshape(-1, oh * ow).T
    return out


def filters(workload: Workload, w: Array, group: int) -> Array:
    """The implicit GEMM's B for one group: K x O/groups, rows in (c, kh, kw) order."""
    d = conv_dims(workload)
    wl = w.transpose(0, 3, 1, 2) if is_nhwc(workload) else w
    ocg = d["ocg"]
    out: Array = wl[group * ocg : (group + 1) * ocg].reshape(ocg, -1).T
    return out


def output_gemm(workload: Workload, y: Array, image: int, group: int) -> Array:
    """The implicit GEMM's C for one image and group (a view of ``y``): out_h·out_w x O/groups."""
    d = conv_dims(workload)
    yl = y.transpose(0, 3, 1, 2) if is_nhwc(workload) else y
    ocg = d["ocg"]
    out: Array = yl[image, group * ocg : (group + 1) * ocg].reshape(ocg, -1).T
    return out


def reference_conv(x: Array, w: Array, workload: Workload) -> Array:
    """The whole output in float64, stored as the workload's layout says."""
    d = conv_dims(workload)
    y = np.empty(conv_shapes(workload)[2], dtype=np.float64)
    for image in range(d["batch"]):
        for group in range(d["groups"]):
            c = patches(workload, x, image, group) @ filters(workload, w, group).astype(np.float64)
            output_gemm(workload, y, image, group)[...] = c
    return y


def check_conv(
    y: Array, x: Array, w: Array, workload: Workload, rng: np.random.Generator
) -> tuple[bool, int, float, float, str]:
    """``y`` against the float64 reference: (ok, rows checked, max abs error, max error ratio,
    message). Every element must be finite; the products of every image and group (a sample
    of CHECK_PROBLEMS where there are more) are compared with ``check_gemm``'s tolerance."""
    d = conv_dims(workload)
    bad = int(np.count_nonzero(~np.isfinite(y)))
    if bad:
        where = tuple(int(i) for i in np.argwhere(~np.isfinite(y))[0])
        return False, 0, np.inf, np.inf, f"{bad} of {y.size} outputs not finite, first at {where}"
    problems = [(b, g) for b in range(d["batch"]) for g in range(d["groups"])]
    if len(problems) > CHECK_PROBLEMS:
        picks = rng.choice(np.arange(1, len(problems) - 1), CHECK_PROBLEMS - 2, replace=False)
        problems = [problems[0], *(problems[int(i)] for i in sorted(picks)), problems[-1]]
    rows_checked, max_abs, max_ratio = 0, 0.0, 0.0
    m, n, k = workload.m, workload.n, workload.k
    for image, group in problems:
        check = check_gemm(
            output_gemm(workload, y, image, group),
            patches(workload, x, image, group),
            filters(workload, w, group),
            None,
            "none",
            rows=sample_rows(m, n, k, rng),
        )
        rows_checked += check.checked_rows
        if not check.ok:
            return (
                False,
                rows_checked,
                check.max_abs_err,
                check.max_err_ratio,
                f"image {image} group {group} (C rows are output pixels): {check.message}",
            )
        max_abs = max(max_abs, check.max_abs_err)
        max_ratio = max(max_ratio, check.max_err_ratio)
    return True, rows_checked, max_abs, max_ratio, ""
