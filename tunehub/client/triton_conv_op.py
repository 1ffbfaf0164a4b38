"""tunehub's conv2d kernels as a ``torch.library.triton_op``: ``tunehub::triton_conv2d``.

``triton_conv2d(x, w, stride, padding, dilation, groups, config)`` computes
``F.conv2d(x, w, None, stride, padding, dilation, groups)`` with a ``triton.conv2d`` config
(JSON) of its own kernels: the implicit GEMM (NCHW, optionally repacked to channels-last in
the call, or NHWC; pointer loads or TMA) and the direct depthwise kernel. Its output has the
input's memory format (channels-last for an NHWC input). Its body launches the kernels through
``torch.library.wrap_triton``, so Inductor traces it and its generated code calls each kernel
like one of its own. Called outside a compile it runs the kernels (on CPU tensors under
``TRITON_INTERPRET=1``). A pointwise workload's configs (``triton.gemm``'s, with a
``variant``, or ``triton.bmm``'s, with ``BATCH_MAJOR``) are not this op's: the backend leaves
such convolutions to Inductor.

The ``tunehub`` torch.compile backend puts it in a graph where tunehub measured such a kernel
faster than cuDNN and no gradient flows through the convolution. Importing this module imports
torch and triton and registers the op.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Sequence
from typing import Any

import torch
from torch.library import triton_op

from tunehub.client.triton_op import launch_traced
from tunehub.core import Workload
from tunehub.kernels.triton_gemm_limits import dtype_name

OP = "tunehub::triton_conv2d"


def is_nhwc(x: Any) -> bool:
    """Whether a 4-D tensor (or its fake) is stored channels-last and not also contiguous
    (a tensor of one channel or one pixel is both: NCHW then)."""
    return bool(x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous())


def conv_workload(
    x_shape: Sequence[int],
    w_shape: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    groups: int,
    dtype: torch.dtype,
    nhwc: bool,
) -> Workload:
    """The ``conv2d`` Workload of a call (raises ``InvalidSpec`` for one no Workload
    describes, ``ValueError`` for a dtype no template takes)."""
    n, c, h, w = (int(v) for v in x_shape)
    o, _, kh, kw = (int(v) for v in w_shape)
    return Workload.from_dict(
        {
            "op": "conv2d", "dtype": dtype_name(dtype), "batch": n, "in_channels": c,
            "out_channels": o, "height": h, "width": w, "kernel_h": kh, "kernel_w": kw,
            "stride_h": int(stride[0]), "stride_w": int(stride[1]),
            "pad_h": int(padding[0]), "pad_w": int(padding[1]),
            "dilation_h": int(dilation[0]), "dilation_w": int(dilation[1]),
            "groups": int(groups), "data_layout": "nhwc" if nhwc else "nchw",
        }
    )  # fmt: skip


def runs(config: dict[str, Any]) -> bool:
    """Whether the op runs this ``triton.conv2d`` config (its own kernels, not triton.gemm's
    or triton.bmm's)."""
    return "variant" not in config and "BATCH_MAJOR" not in config


@triton_op(OP, mutates_args=())
def triton_conv2d(
    x: torch.Tensor,
    w: torch.Tensor,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
    config: str,
) -> torch.Tensor:
    """``F.conv2d(x, w, None, stride, padding, dilation, groups)`` with ``triton.conv2d``'s
    kernels of ``config`` (JSON)."""
    # Looked up per call (and per trace): the tests reload the kernels under the interpreter.
    kernels = importlib.import_module("tunehub.kernels.triton_conv_kernels")
    cfg = json.loads(config)
    if not runs(cfg):
        raise ValueError(f"{OP} runs triton.conv2d's own kernels, not {config}")
    nhwc = is_nhwc(x)
    workload = conv_workload(x.shape, w.shape, stride, padding, dilation, groups, x.dtype, nhwc)
    d = kernels.conv_dims(workload)
    out = torch.empty(
        (d["batch"], d["out_channels"], d["oh"], d["ow"]),
        dtype=x.dtype,
        device=x.device,
        memory_format=torch.channels_last if nhwc else torch.contiguous_format,
    )
    # NCHW's kernels (and REPACK's transpose) read the dense tensors the lookup measured.
    if not nhwc:
        x, w = x.contiguous(), w.contiguous()
    for launch in kernels.conv_launches(x, w, out, workload, cfg):
        launch_traced(launch)
    return out
