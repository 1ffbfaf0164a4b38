"""``tunehub::triton_bmm`` (triton.bmm's kernels as a ``torch.library.triton_op``) on the CPU
through Triton's interpreter, against ``torch.bmm``; which answers the backend puts on it, and
its rewrite of a graph's bmm node. That Inductor's generated code launches the kernels itself
is checked on a GPU (benchmarks/inductor_route.py, step ``own``)."""

from __future__ import annotations

import operator

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the gpu extra)")
triton = pytest.importorskip("triton", reason="triton is not installed (the gpu extra)")

from tunehub.client import inductor_gemm as ig  # noqa: E402
from tunehub.client.gemm_choice import GemmChoice  # noqa: E402
from tunehub.client.torch_backend import _to_triton_bmm  # noqa: E402
from tunehub.client.triton_bmm_op import OP, runs, triton_bmm  # noqa: E402
from tunehub.client.triton_op import config_json  # noqa: E402
from tunehub.core import Config  # noqa: E402

pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim:DeprecationWarning"
)

TILE = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 4, "num_warps": 4,
        "num_stages": 2}  # fmt: skip


@pytest.mark.parametrize(
    ("config", "dtype", "shape"),
    [
        ({**TILE, "BATCH_MAJOR": False, "TMA": False}, torch.float32, (3, 37, 45, 29)),
        ({**TILE, "BATCH_MAJOR": True, "TMA": True}, torch.float16, (3, 40, 48, 40)),
        ({**TILE, "BATCH_MAJOR": False, "TMA": True}, torch.float32, (2, 20, 12, 36)),
    ],
    ids=["pointer, interleaved", "tma fp16", "tma fp32"],
)
def test_the_op_matches_torch_bmm_in_every_layout(
    config: dict[str, object], dtype: torch.dtype, shape: tuple[int, int, int, int]
) -> None:
    batch, m, n, k = shape
    g = torch.Generator().manual_seed(m + n)
    a = torch.rand(batch, m, k, generator=g).to(dtype)
    b = torch.rand(batch, k, n, generator=g).to(dtype)
    shared = torch.rand(1, k, n, generator=g).to(dtype)
    operands = {
        "row-major": (a, b),
        "B a transposed view (column-major), as K^T": (a, b.transpose(1, 2).contiguous().mT),
        "A column-major": (a.transpose(1, 2).contiguous().mT, b),
        "one B expanded along the batch": (a, shared.expand(batch, k, n)),
    }
    for what, (x, y) in operands.items():
        out = triton_bmm(x, y, config_json(config))
        want = x.double() @ y.double()
        assert out.shape == (batch, m, n) and out.dtype == dtype, what
        torch.testing.assert_close(out.double(), want, rtol=2e-3, atol=2e-3, msg=what)
    again = torch.ops.tunehub.triton_bmm(a, b, config_json(config))
    torch.testing.assert_close(again.double(), a.double() @ b.double(), rtol=2e-3, atol=2e-3)


def test_the_op_is_registered_and_refuses_a_config_not_triton_bmms() -> None:
    assert OP == "tunehub::triton_bmm" and hasattr(torch.ops.tunehub, "triton_bmm")
    assert runs({**TILE, "BATCH_MAJOR": True, "TMA": True})
    assert not runs({**TILE, "variant": "tma", "SPLIT_K": 1})
    with pytest.raises(ValueError, match=r"triton\.bmm's configs"):
        triton_bmm(torch.rand(1, 4, 4), torch.rand(1, 4, 4), config_json({"variant": "tma"}))


def test_only_a_measured_winner_inductors_bmm_template_cannot_run_goes_to_the_op() -> None:
    site = ig.GemmSite("bmm", 128, 128, 64, "float16", "row_major", "col_major", 12)
    tma = {**TILE, "BATCH_MAJOR": True, "TMA": True}
    interleaved = {**TILE, "BATCH_MAJOR": False, "TMA": False}
    template = {**TILE, "BATCH_MAJOR": True, "TMA": False}
    for config, want in ((tma, tma), (interleaved, interleaved), (template, None)):
        choice = GemmChoice("triton.bmm", Config(config), "exact")
        assert ig.kernel_config(choice, site) == want, config
    for choice in (
        GemmChoice("triton.bmm", Config(tma), "exact", use_library=True),
        GemmChoice("triton.bmm", Config(tma), "predicted"),
        None,
    ):
        assert ig.kernel_config(choice, site) is None


def test_a_graphs_bmm_node_becomes_the_op_with_its_operands() -> None:
    class Scores(torch.nn.Module):
        def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
            return torch.softmax(torch.bmm(q, k.transpose(1, 2)) * 0.5, dim=-1)

    gm = torch.fx.symbolic_trace(Scores())
    (node,) = [n for n in gm.graph.nodes if n.target is torch.bmm]
    config = {**TILE, "BATCH_MAJOR": True, "TMA": True}
    _to_triton_bmm(gm.graph, node, config)
    gm.graph.lint()
    gm.recompile()
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert torch.ops.tunehub.triton_bmm.default in targets and torch.bmm not in targets
    assert operator.mul in targets  # what follows the product is left as it was
    g = torch.Generator().manual_seed(3)
    q, k = torch.rand(2, 24, 32, generator=g), torch.rand(2, 40, 32, generator=g)
    torch.testing.assert_close(gm(q, k), Scores()(q, k), rtol=1e-4, atol=1e-4)
