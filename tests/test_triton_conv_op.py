"""``tunehub::triton_conv2d`` (triton.conv2d's kernels as a ``torch.library.triton_op``) on the
CPU through Triton's interpreter, against ``F.conv2d``; and the backend's rewrite of a graph's
convolutions into it exactly where a measured answer names one of those kernels."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the gpu extra)")
triton = pytest.importorskip("triton", reason="triton is not installed (the gpu extra)")

import torch.nn.functional as F  # noqa: E402

from tunehub.client.gemm_choice import (  # noqa: E402
    CHOOSER,
    GemmChoice,
    choice_key,
    device_target,
)
from tunehub.client.torch_backend import PLANNED, conv_site, plan_convs  # noqa: E402
from tunehub.client.triton_conv_op import conv_workload, triton_conv2d  # noqa: E402
from tunehub.client.triton_op import config_json  # noqa: E402
from tunehub.core import Config  # noqa: E402
from tunehub.kernels import triton_conv_kernels as ck  # noqa: E402

pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim:DeprecationWarning"
)

TILE = {"BLOCK_M": 32, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 8, "num_warps": 2,
        "num_stages": 1, "REPACK": False}  # fmt: skip
CASES = {
    "nchw 3x3 padded": ((2, 6, 7, 6), (8, 6, 3, 3), dict(padding=1), TILE),
    "nchw repacked, strided": (
        (1, 6, 9, 8),
        (4, 6, 3, 2),
        dict(stride=2, padding=(1, 0)),
        {**TILE, "REPACK": True},
    ),
    "nhwc dilated, grouped": (
        (2, 8, 7, 7),
        (6, 4, 3, 3),
        dict(dilation=2, padding=2, groups=2),
        TILE,
    ),
    "nhwc tma, filters copied channels-last": (
        (2, 16, 7, 7),
        (8, 16, 3, 3),
        dict(padding=1),
        {**TILE, "TMA": True, "TILE_H": 2, "TILE_W": 8, "BLOCK_M": 32},
    ),
    "nchw tma repacked": (
        (1, 8, 6, 9),
        (8, 8, 3, 3),
        dict(padding=(0, 1), dilation=(1, 2)),
        {**TILE, "TMA": True, "TILE_H": 1, "TILE_W": 16, "BLOCK_M": 16, "REPACK": True},
    ),
    "nchw stem-like rows, padded copy": (
        (2, 3, 11, 9),
        (8, 3, 7, 7),
        dict(stride=2, padding=3),
        {**TILE, "PATCH": "rows"},
    ),
    "nhwc flat patch blocks": (
        (2, 3, 7, 6),
        (8, 3, 3, 3),
        dict(padding=1, dilation=(2, 1)),
        {**TILE, "PATCH": "flat"},
    ),
    "nchw depthwise": (
        (2, 4, 6, 6),
        (4, 1, 3, 3),
        dict(padding=1, groups=4),
        {**TILE, "TILE_W": 4},
    ),
    "nchw depthwise repacked": (
        (2, 4, 6, 6),
        (4, 1, 3, 3),
        dict(padding=1, groups=4),
        {**TILE, "TILE_W": 4, "REPACK": True},
    ),
    "nhwc depthwise strips": (
        (2, 4, 9, 11),
        (4, 1, 7, 7),
        dict(padding=3, groups=4),
        {**TILE, "TILE_W": 4, "STRIP": 8},
    ),
}


def _pairs(value: Any) -> list[int]:
    return list(value) if isinstance(value, tuple) else [value, value]


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_op_matches_torch_in_the_inputs_layout(name: str) -> None:
    x_shape, w_shape, conv, config = CASES[name]
    g = torch.Generator().manual_seed(3)
    x = torch.randn(x_shape, generator=g)
    w = torch.randn(w_shape, generator=g)
    if name.startswith("nhwc"):
        x = x.contiguous(memory_format=torch.channels_last)
    expected = F.conv2d(x, w, **conv)
    out = triton_conv2d(
        x, w, _pairs(conv.get("stride", 1)), _pairs(conv.get("padding", 0)),
        _pairs(conv.get("dilation", 1)), conv.get("groups", 1), config_json(config),
    )  # fmt: skip
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
    channels_last = name.startswith("nhwc")
    assert out.is_contiguous(
        memory_format=torch.channels_last if channels_last else torch.contiguous_format
    )


def test_repacking_copies_only_what_is_not_channels_last_already() -> None:
    # A depthwise filter (one channel a group) is channels-last as stored: no copy of it
    # (Inductor's scheduler failed on that pointless copy inside the op, torch 2.11).
    x, w = torch.randn(2, 4, 6, 6), torch.randn(4, 1, 3, 3)
    workload = conv_workload(x.shape, w.shape, (1, 1), (1, 1), (1, 1), 4, torch.float32, False)
    out = torch.empty(2, 4, 6, 6)
    launches = ck.conv_launches(x, w, out, workload, {**TILE, "TILE_W": 4, "REPACK": True})
    assert [launch.kernel for launch in launches] == [ck._to_channels_last, ck._depthwise_kernel]
    copied, launch = ck.channels_last_copy(w)
    assert copied is w and launch is None


def test_the_op_refuses_triton_gemms_and_triton_bmms_configs() -> None:
    x, w = torch.randn(1, 4, 3, 3), torch.randn(4, 4, 1, 1)
    for config in ({"variant": "tma"}, {**TILE, "BATCH_MAJOR": True, "TMA": True}):
        with pytest.raises(ValueError, match="own kernels"):
            triton_conv2d(x, w, [1, 1], [0, 0], [1, 1], 1, config_json(config))


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Conv2d(6, 8, 3, padding=1)
        self.b = torch.nn.Conv2d(8, 8, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def _answer(workload: Any, choice: GemmChoice) -> None:
    target = device_target(torch.device("cpu"))
    CHOOSER._answers[choice_key(workload, target, "triton.conv2d")] = choice


def test_the_backend_puts_a_convolution_on_the_op_only_where_a_measured_answer_names_it() -> None:
    from tunehub.client.inductor_gemm import PLAIN_LAUNCH_MIN_SECS

    torch.manual_seed(0)
    model = Net().eval()
    x = torch.randn(2, 6, 7, 6)
    first = conv_workload((2, 6, 7, 6), (8, 6, 3, 3), (1, 1), (1, 1), (1, 1), 1,
                          torch.float32, False)  # fmt: skip
    second = conv_workload((2, 8, 7, 6), (8, 8, 1, 1), (1, 1), (0, 0), (1, 1), 1,
                           torch.float32, False)  # fmt: skip
    rewritten: list[int] = []
    sites: list[Any] = []
    route = ["all"]  # replayed as CUDA graphs: any measured win

    def backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
        sites.extend(s[0].key for n in gm.graph.nodes if (s := conv_site(n)) is not None)
        rewritten.append(plan_convs(gm, kernels=route[0], devices=("cpu",)))
        return gm.forward

    CHOOSER.clear()
    try:
        _answer(first, GemmChoice("triton.conv2d", Config(TILE), "exact"))
        _answer(second, GemmChoice("triton.conv2d", Config(TILE), "exact", use_library=True))
        with torch.no_grad():
            expected = model(x)
            out = torch.compile(model, backend=backend)(x)
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
        assert sites == [first.key, second.key]
        assert rewritten == [1] and PLANNED[first.key] == "kernel"
        assert second.key not in PLANNED

        # A predicted answer is not a measurement; a training graph keeps Inductor's own.
        torch._dynamo.reset()
        rewritten.clear()
        _answer(first, GemmChoice("triton.conv2d", Config(TILE), "predicted"))
        with torch.no_grad():
            torch.compile(model, backend=backend)(x)
        _answer(first, GemmChoice("triton.conv2d", Config(TILE), "exact"))
        torch._dynamo.reset()
        torch.compile(model, backend=backend)(x).sum().backward()
        assert rewritten == [0, 0]

        # Plain launch: only a kernel measured long enough to hide its launch (no time known:
        # not); with tunehub's kernels off, none, and nothing is looked up.
        rewritten.clear()
        route[0] = "long"
        for secs in (None, PLAIN_LAUNCH_MIN_SECS / 2, PLAIN_LAUNCH_MIN_SECS):
            _answer(first, GemmChoice("triton.conv2d", Config(TILE), "exact",
                                      detail={"median_secs": secs}))  # fmt: skip
            torch._dynamo.reset()
            with torch.no_grad():
                out = torch.compile(model, backend=backend)(x)
            torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
        route[0] = "none"
        CHOOSER.clear()
        torch._dynamo.reset()
        with torch.no_grad():
            torch.compile(model, backend=backend)(x)
        assert rewritten == [0, 0, 1, 0] and not CHOOSER._answers
        with pytest.raises(ValueError, match="kernels must be one of"):
            plan_convs(torch.fx.symbolic_trace(model), kernels="some")
    finally:
        CHOOSER.clear()
        PLANNED.clear()
        torch._dynamo.reset()


def test_the_attention_op_matches_sdpa_and_replaces_it_where_a_measured_answer_names_it() -> None:
    from tunehub.client.torch_backend import plan_attention
    from tunehub.client.triton_attention_op import attention_workload, triton_attention

    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 20, 64, generator=g) for _ in range(3))
    config = {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1}
    for causal in (False, True):
        expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        out = triton_attention(q, k, v, causal, config_json(config))
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="TMA"):
        triton_attention(q, k, v, False, config_json({**config, "TMA": True}))

    # The graph's rewrite is plan_own_kernels, as for convolutions (above); on this CPU a
    # float32 attention has no Workload (the template takes float16 and bfloat16), so the
    # call stays SDPA's.
    rewritten: list[int] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
        rewritten.append(plan_attention(gm, devices=("cpu",)))
        return gm.forward

    def attend(q: Any, k: Any, v: Any) -> Any:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True) * 2

    out = torch.compile(attend, backend=backend)(q, k, v)
    torch.testing.assert_close(out, attend(q, k, v))
    assert rewritten == [0]
    torch._dynamo.reset()
    workload = attention_workload((1, 2, 20, 64), 30, True, torch.float16)
    assert (workload.m, workload.n, workload.k, workload.param("causal")) == (20, 30, 64, True)
