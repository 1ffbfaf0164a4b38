"""Correctness of the Triton GEMM kernels, run on the CPU through Triton's interpreter.

Every variant, dtype, epilogue and layout is covered (pairwise, not the full product, to stay
fast), plus edge shapes, split-K, the resource checks and the precompile recipe. The GPU side
(tf32 and fp8 tensor cores, TMA, warp specialisation, timings) is
``benchmarks/triton_kernel_check.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the gpu extra)")
triton = pytest.importorskip("triton", reason="triton is not installed (the gpu extra)")

import triton.language as tl  # noqa: E402

from tunehub.kernels import triton_gemm_kernels as tg  # noqa: E402
from tunehub.kernels.triton_gemm_limits import bit_reproducible  # noqa: E402

# Triton 3.6's interpreter converts 1-element arrays to int the deprecated way, per access.
pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim:DeprecationWarning"
)

ROOT = Path(__file__).resolve().parents[1]
H100 = {
    "smem_per_block_bytes": 232448,
    "regs_per_sm": 65536,
    "compute_capability": 90,
    "sm_count": 132,
}


def _bf16_dot_broken() -> bool:
    @triton.jit
    def probe(a_ptr, b_ptr, c_ptr):
        r = tl.arange(0, 16)
        a = tl.load(a_ptr + r[:, None] * 16 + r[None, :])
        b = tl.load(b_ptr + r[:, None] * 16 + r[None, :])
        tl.store(c_ptr + r[:, None] * 16 + r[None, :], tl.dot(a, b))

    a = torch.eye(16, dtype=torch.bfloat16)
    c = torch.zeros(16, 16)
    probe[(1,)](a, a, c)
    return not torch.equal(c, torch.eye(16))


@pytest.fixture(scope="module", autouse=True)
def interpreter_bf16_dot() -> Iterator[None]:
    """Triton 3.6's interpreter multiplies bf16 tiles as their raw uint16 storage (its
    create_dot widens only fp8), so a bf16 tl.dot returns garbage there. Widening bf16 to fp32
    first is exact, so with this shim the interpreter computes what the tensor cores do (fp32
    accumulation of exact products) and the bf16 loads, bias, epilogue and stores are tested;
    the bf16 MMA itself is checked on the GPU. The shim is applied only while the bug is there.
    """
    from triton.runtime.interpreter import InterpreterBuilder

    if not _bf16_dot_broken():
        yield
        return
    original = InterpreterBuilder.create_dot

    def create_dot(self: Any, a: Any, b: Any, d: Any, *args: Any) -> Any:
        if a.dtype == tl.bfloat16:
            a, b = self.cast_impl(a, tl.float32), self.cast_impl(b, tl.float32)
        return original(self, a, b, d, *args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(InterpreterBuilder, "create_dot", create_dot)
        yield


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def operand(rows: int, cols: int, layout: str, dtype: str, gen: Any) -> Any:
    """A rows x cols tensor of ``dtype`` stored row- or column-major, with random values."""
    shape = (rows, cols) if layout == "row" else (cols, rows)
    x = torch.randn(shape, generator=gen)
    x = x if layout == "row" else x.t()
    return x.to(getattr(torch, dtype))


def config(variant: str, bm: int = 32, bn: int = 32, bk: int = 32, **extra: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "variant": variant,
        "BLOCK_M": bm,
        "BLOCK_N": bn,
        "BLOCK_K": bk,
        "GROUP_M": 2,
        "num_warps": 4,
        "num_stages": 2,
        "SPLIT_K": 1,
    }
    cfg.update(extra)
    return cfg


def run(
    m: int,
    n: int,
    k: int,
    cfg: dict[str, Any],
    dtype: str = "float16",
    epilogue: str = "bias",
    layouts: tuple[str, str] = ("row", "row"),
    allow_tf32: bool = False,
    seed: int = 0,
    num_sms: int | None = None,
) -> float:
    """``relative_error`` of one GEMM on fresh random operands, into a NaN-poisoned output."""
    gen = torch.Generator().manual_seed(seed)
    a = operand(m, k, layouts[0], dtype, gen)
    b = operand(k, n, layouts[1], dtype, gen)
    out_dtype = getattr(torch, tg.OUT_DTYPE[dtype])
    bias = None if epilogue == "none" else torch.randn(n, generator=gen).to(out_dtype)
    out = torch.full((m, n), float("nan"), dtype=out_dtype)
    tg.gemm(a, b, bias, out, epilogue=epilogue, allow_tf32=allow_tf32, config=cfg, num_sms=num_sms)
    return tg.relative_error(out, tg.reference(a, b, bias, epilogue))


def assert_close(err: float, dtype: str, allow_tf32: bool = False) -> None:
    tol = tg.tolerance(dtype, allow_tf32)
    assert err <= tol, f"relative error {err:.3g} > {tol:.3g}"


# --------------------------------------------------------------------------------------------
# Correctness
# --------------------------------------------------------------------------------------------

LAYOUT_PAIRS = (("row", "row"), ("row", "col"), ("col", "row"), ("col", "col"))


def _matrix() -> list[Any]:
    """Two cases per (variant, dtype), their layouts and epilogues rotated so that every pair of
    (variant, dtype, layouts, epilogue) values meets at least once."""
    cases = []
    for v, variant in enumerate(tg.VARIANTS):
        for d, dtype in enumerate(tg.DTYPES):
            for j in range(2):
                layouts = LAYOUT_PAIRS[(d + 2 * j + v) % 4]
                if tg.workload_problem(variant, 64, 64, 64, dtype, *layouts):
                    layouts = ("row", "col")  # ws with fp32/fp8 takes K-major operands only
                epilogue = tg.EPILOGUES[(d + j + v) % 4]
                tf32 = dtype == "float32" and j == 1
                label = f"{variant}-{dtype}{'-tf32' if tf32 else ''}-{'x'.join(layouts)}-{epilogue}"
                cases.append(pytest.param(variant, dtype, layouts, epilogue, tf32, id=label))
    return cases


@pytest.mark.parametrize(("variant", "dtype", "layouts", "epilogue", "tf32"), _matrix())
def test_gemm_matches_reference(
    variant: str, dtype: str, layouts: tuple[str, str], epilogue: str, tf32: bool
) -> None:
    if variant in ("tma", "ws"):
        # TMA wants 16-byte leading dimensions: multiples of 16 elements suit every dtype;
        # none is a multiple of the block, so edge tiles are still partial.
        m, n, k = 48, 80, 112
        cfg = config(variant, bm=64, bn=32, bk=32)
    elif variant in ("splitk", "splitk_atomic"):
        # 5 K tiles over 3 splits (2, 2, 1), the last one ragged (fp8: 3 over 2, 32-wide).
        m, n, k = 37, 45, 70
        bk = 32 if dtype == "float8_e4m3fn" else 16
        cfg = config(variant, bm=16, bn=32, bk=bk, SPLIT_K=2 if bk == 32 else 3)
    else:
        # Odd sizes: partial tiles in M, N and K, and no % 16 specialisation.
        m, n, k = 37, 45, 70
        cfg = config(variant, bm=16, bn=32, bk=32)
    assert tg.workload_problem(variant, m, n, k, dtype, *layouts) is None
    err = run(m, n, k, cfg, dtype, epilogue, layouts, allow_tf32=tf32, seed=len(variant))
    assert_close(err, dtype, tf32)


@pytest.mark.parametrize(
    ("m", "n", "k", "bk"),
    [
        pytest.param(1, 40, 64, 32, id="M=1"),
        pytest.param(33, 1, 50, 16, id="N=1"),
        pytest.param(20, 33, 9, 32, id="K<BLOCK_K"),
        pytest.param(17, 19, 1, 16, id="K=1"),
        pytest.param(100, 100, 100, 16, id="100^3"),
    ],
)
@pytest.mark.parametrize("variant", ["tiled", "persistent"])
def test_edge_shapes(variant: str, m: int, n: int, k: int, bk: int) -> None:
    for layouts in (("row", "row"), ("col", "col")):
        err = run(m, n, k, config(variant, bm=16, bn=16, bk=bk), "float32", "bias_gelu", layouts)
        assert_close(err, "float32")


def test_tma_edge_shapes() -> None:
    # M=1, and K below BLOCK_K (the descriptor zero-fills the missing part of the box).
    assert_close(run(1, 64, 48, config("tma", bm=16, bn=32, bk=32), "float16"), "float16")
    assert_close(run(40, 24, 8, config("tma", bm=16, bn=16, bk=32), "float16"), "float16")


@pytest.mark.parametrize(
    ("m", "n", "k"),
    [
        pytest.param(100, 45, 70, id="wrapped-rows"),  # 96-row tiles: the second wraps
        pytest.param(192, 40, 64, id="whole-tiles"),  # M divides: contiguity hints, no wrap
        pytest.param(7, 33, 40, id="M-below-one-block"),
    ],
)
@pytest.mark.parametrize("layouts", LAYOUT_PAIRS, ids="x".join)
def test_composite_tile(m: int, n: int, k: int, layouts: tuple[str, str]) -> None:
    # BLOCK_M=96: a 64-row and a 32-row block sharing each B tile (192 = 128 + 64 on a GPU).
    cfg = config("tiled", bm=96, bn=32, bk=32)
    for dtype, epilogue in (("float16", "bias"), ("bfloat16", "bias_relu"), ("float32", "none")):
        assert_close(run(m, n, k, cfg, dtype, epilogue, layouts), dtype)


@pytest.mark.parametrize(
    ("m", "n", "k"),
    [
        pytest.param(40, 200, 64, id="partial-second-block"),  # columns 192..199: the 16 box
        pytest.param(24, 160, 48, id="whole-tiles"),
        pytest.param(16, 8, 32, id="N-below-one-block"),  # the second box wholly out of bounds
    ],
)
@pytest.mark.parametrize("layouts", LAYOUT_PAIRS, ids="x".join)
def test_composite_columns_through_descriptors(
    m: int, n: int, k: int, layouts: tuple[str, str]
) -> None:
    # ``tma`` with BLOCK_N=80: two descriptors of B (64- and 16-column boxes) sharing each A
    # tile; the bias and epilogue apply to both blocks' columns.
    for flat in (False, True):
        cfg = config("tma", bm=16, bn=80, bk=32, FLATTEN=flat)
        for dtype, epilogue in (("float16", "bias_gelu"), ("float32", "bias")):
            err = run(m, n, k, cfg, dtype, epilogue, layouts, num_sms=2)
            assert_close(err, dtype)


@pytest.mark.parametrize("bn", [144, 192])
@pytest.mark.parametrize("layouts", [("row", "col"), ("col", "row")], ids="x".join)
def test_composite_columns_of_a_128_block(bn: int, layouts: tuple[str, str]) -> None:
    # 144 = 128 + 16 and 192 = 128 + 64 columns: of 304, the last tile's first block holds 16
    # (144) or 112 (192) columns and its second block none.
    cfg = config("tma", bm=16, bn=bn, bk=32)
    for dtype, epilogue in (("float16", "bias_gelu"), ("bfloat16", "none")):
        assert_close(run(24, 304, 48, cfg, dtype, epilogue, layouts, num_sms=2), dtype)


@pytest.mark.parametrize(
    ("m", "n", "k"),
    [
        pytest.param(104, 48, 64, id="partial-second-block"),  # rows 96..103: the 32-row box
        pytest.param(192, 40, 64, id="whole-tiles"),
        pytest.param(8, 32, 48, id="M-below-one-block"),  # the second box wholly out of bounds
    ],
)
@pytest.mark.parametrize("layouts", LAYOUT_PAIRS, ids="x".join)
def test_composite_tile_through_descriptors(
    m: int, n: int, k: int, layouts: tuple[str, str]
) -> None:
    # ``tma`` with BLOCK_M=96: two descriptors of A (64- and 32-row boxes); rows past M are
    # zero-filled by the descriptor, not wrapped. Persistent: 2 programs loop over the tiles.
    for flat in (False, True):
        cfg = config("tma", bm=96, bn=32, bk=32, FLATTEN=flat)
        for dtype, epilogue in (("float16", "bias_gelu"), ("float32", "none")):
            err = run(m, n, k, cfg, dtype, epilogue, layouts, num_sms=2)
            assert_close(err, dtype)


@pytest.mark.parametrize("layouts", LAYOUT_PAIRS, ids="x".join)
def test_pad_k_copies_the_operands_in_one_launch(layouts: tuple[str, str]) -> None:
    # K = 37 leaves every dtype's rows along K unaligned. PAD_K: one launch copies A and B into
    # buffers with K padded (whole rows, zeros past K), then the GEMM runs on them.
    m, n, k = 40, 48, 37
    gen = torch.Generator().manual_seed(11)
    for variant in ("tma", "tiled", "persistent"):
        cfg = config(variant, PAD_K=True)
        for dtype, epilogue in (
            ("float16", "bias"),
            ("bfloat16", "bias_relu"),
            ("float32", "none"),
        ):
            kp = tg.padded_k(k, dtype)
            if tg.workload_problem(variant, m, n, kp, dtype, *layouts):
                continue
            a, b = operand(m, k, layouts[0], dtype, gen), operand(k, n, layouts[1], dtype, gen)
            out_dtype = getattr(torch, tg.OUT_DTYPE[dtype])
            bias = None if epilogue == "none" else torch.randn(n, generator=gen).to(out_dtype)
            out = torch.full((m, n), float("nan"), dtype=out_dtype)
            bound = tg.bind(a, b, bias, out, epilogue=epilogue, config=cfg, num_sms=2)
            assert [x.kernel for x in bound.launches[:1]] == [tg._pad_k_kernel]
            a_pad, b_pad = bound.launches[0].args[1], bound.launches[0].args[3]
            a_pad.fill_(float("nan"))  # every element must be written, zeros included
            b_pad.fill_(float("nan"))
            bound()
            assert tuple(a_pad.shape) == (m, kp) and tuple(b_pad.shape) == (kp, n)
            assert torch.equal(a_pad[:, :k], a) and not a_pad[:, k:].any()
            assert torch.equal(b_pad[:k], b) and not b_pad[k:].any()
            err = tg.relative_error(out, tg.reference(a, b, bias, epilogue))
            assert_close(err, dtype)


def test_pad_k_where_k_is_aligned_pads_nothing() -> None:
    a, b = torch.randn(8, 32).half(), torch.randn(32, 16).half()
    out = torch.empty(8, 16, dtype=torch.half)
    bound = tg.bind(a, b, None, out, config=config("tiled", bm=16, PAD_K=True))
    assert [x.kernel for x in bound.launches] == [tg._gemm_tiled_kernel]
    assert "PAD_K=2" in (tg.config_problem(config("tiled", PAD_K=2), "float16", H100) or "")


@pytest.mark.parametrize(
    ("k", "split_k"),
    [
        pytest.param(200, 4, id="even-splits"),
        pytest.param(70, 3, id="ragged-K"),
        # 3 K tiles over 5 splits: two programs find no work and must still write zeros.
        pytest.param(40, 5, id="empty-splits"),
    ],
)
def test_split_k(k: int, split_k: int) -> None:
    for epilogue in ("none", "bias_gelu"):
        cfg = config("tiled", bm=16, bn=16, bk=16, SPLIT_K=split_k)
        assert_close(run(21, 35, k, cfg, "float32", epilogue, ("col", "row")), "float32")


@pytest.mark.parametrize(
    ("k", "split_k", "dtype"),
    [
        pytest.param(200, 4, "float16", id="uneven-splits-fp16"),  # 13 K tiles: 4, 4, 4, 1
        pytest.param(70, 3, "bfloat16", id="ragged-K-bf16"),
        # 3 K tiles over 5 splits: two programs find no work, yet must count in.
        pytest.param(40, 5, "float16", id="empty-splits"),
        pytest.param(250, 2, "float32", id="two-splits-fp32"),
    ],
)
@pytest.mark.parametrize("variant", ["splitk", "splitk_atomic"])
def test_one_kernel_split_k(variant: str, k: int, split_k: int, dtype: str) -> None:
    for epilogue in ("none", "bias_gelu"):
        cfg = config(variant, bm=16, bn=16, bk=16, SPLIT_K=split_k)
        assert_close(run(21, 35, k, cfg, dtype, epilogue, ("col", "row")), dtype)


def test_one_kernel_split_k_launches_once_and_leaves_its_counters_at_zero() -> None:
    gen = torch.Generator().manual_seed(5)
    a = operand(40, 150, "row", "float16", gen)
    b = operand(150, 50, "col", "float16", gen)
    bias = torch.randn(50, generator=gen).half()
    cfg = config("splitk", bm=16, bn=32, bk=16, SPLIT_K=4)
    outs = []
    for _ in range(3):
        out = torch.full((40, 50), float("nan"), dtype=torch.float16)
        bound = tg.bind(a, b, bias, out, epilogue="bias_relu", config=cfg)
        assert len(bound.launches) == 1  # no reduce kernel, no memset
        bound()
        assert bound.counts is not None and not bool(bound.counts.any())
        outs.append(out)
    # The sum runs in slot order whichever program reduces: the same bits every call.
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[1], outs[2])
    assert_close(tg.relative_error(outs[0], tg.reference(a, b, bias, "bias_relu")), "float16")
    # Later calls of the shape (and smaller ones) reuse the cached buffers.
    again = tg.bind(a, b, bias, torch.empty(40, 50, dtype=torch.float16), epilogue="bias_relu",
                    config=cfg)  # fmt: skip
    assert again.workspace is bound.workspace and again.counts is bound.counts
    # A larger problem grows them; the outgrown ones stay allocated (a captured CUDA graph may
    # still launch on them), and the new counters start at zero.
    big_a, big_b = (
        operand(200, 150, "row", "float16", gen),
        operand(150, 300, "col", "float16", gen),
    )
    big = tg.bind(big_a, big_b, None, torch.empty(200, 300, dtype=torch.float16), config=cfg)
    assert big.workspace is not None and big.counts is not None
    assert big.workspace.numel() >= tg.workspace_bytes(200, 300, cfg) // 4
    assert not bool(big.counts.any())
    assert any(w is bound.workspace for w, _ in tg._SPLITK_OUTGROWN)
    # A given workspace is used, and must be big enough: 3 x 2 tiles x 4 slots of 16 x 32.
    need = tg.workspace_bytes(40, 50, cfg) // 4
    assert need == 3 * 2 * 4 * 16 * 32
    workspace = torch.full((need,), float("nan"))
    out = torch.empty(40, 50, dtype=torch.float16)
    tg.gemm(a, b, bias, out, epilogue="bias_relu", config=cfg, workspace=workspace)
    assert torch.equal(out, outs[0]) and not bool(torch.isnan(workspace).any())
    with pytest.raises(ValueError, match="workspace must hold"):
        tg.bind(a, b, bias, out, epilogue="bias_relu", config=cfg, workspace=workspace[:-1])


def test_atomic_split_k_leaves_its_sum_and_counters_at_zero() -> None:
    gen = torch.Generator().manual_seed(6)
    a = operand(40, 150, "row", "float16", gen)
    b = operand(150, 50, "col", "float16", gen)
    bias = torch.randn(50, generator=gen).half()
    cfg = config("splitk_atomic", bm=16, bn=32, bk=16, SPLIT_K=4)
    expected = tg.reference(a, b, bias, "bias_gelu")
    for _ in range(3):
        out = torch.full((40, 50), float("nan"), dtype=torch.float16)
        bound = tg.bind(a, b, bias, out, epilogue="bias_gelu", config=cfg)
        assert len(bound.launches) == 1  # no reduce kernel, no memset
        bound()
        assert_close(tg.relative_error(out, expected), "float16")
        # The next call starts from a zero sum and zero counters, with nothing cleared.
        assert bound.workspace is not None and bound.counts is not None
        assert not bool(bound.workspace.any()) and not bool(bound.counts.any())
    # Its sum is one C (not SPLIT_K tile slots), and not the slots of 'splitk' on the same
    # stream, whose leftovers are not zero.
    assert tg.workspace_bytes(40, 50, cfg) == 40 * 50 * 4
    slots = tg.bind(a, b, bias, torch.empty(40, 50, dtype=torch.float16), epilogue="bias_gelu",
                    config={**cfg, "variant": "splitk"})  # fmt: skip
    slots()
    assert slots.workspace is not bound.workspace and bool(slots.workspace.any())
    again = tg.bind(a, b, bias, torch.empty(40, 50, dtype=torch.float16), epilogue="bias_gelu",
                    config=cfg)  # fmt: skip
    assert again.workspace is bound.workspace and not bool(again.workspace.any())
    # A workspace of one's own is taken as the sum: it must hold zeros, and is left so.
    own = torch.zeros(40 * 50, dtype=torch.float32)
    out = torch.empty(40, 50, dtype=torch.float16)
    tg.gemm(a, b, bias, out, epilogue="bias_gelu", config=cfg, workspace=own)
    assert_close(tg.relative_error(out, expected), "float16")
    assert not bool(own.any())
    assert not bit_reproducible(cfg) and bit_reproducible({**cfg, "variant": "splitk"})


def test_split_k_is_deterministic_and_uses_the_given_workspace() -> None:
    gen = torch.Generator().manual_seed(3)
    a, b = operand(19, 23, "row", "float32", gen), operand(23, 29, "row", "float32", gen)
    a = a.repeat(1, 9)
    b = b.repeat(9, 1)
    cfg = config("tiled", bm=16, bn=16, bk=16, SPLIT_K=4)
    workspace = torch.full((4, 19, 29), float("nan"))
    first = tg.gemm(a, b, None, torch.empty(19, 29), config=cfg, workspace=workspace)
    second = tg.gemm(a, b, None, torch.empty(19, 29), config=cfg)
    assert torch.equal(first, second)
    assert not bool(torch.isnan(workspace).any())
    assert tg.workspace_bytes(19, 29, cfg) == workspace.numel() * 4


@pytest.mark.parametrize("num_sms", [1, 2, 50])
def test_persistent_programs_cover_every_tile(num_sms: int) -> None:
    # 1 program does all 12 tiles; 50 > 12 tiles leaves the grid at 12.
    for variant in ("persistent", "tma"):
        cfg = config(variant, bm=16, bn=16, bk=16, GROUP_M=3)
        err = run(48, 64, 32, cfg, "float16", "bias_relu", ("row", "col"), num_sms=num_sms)
        assert_close(err, "float16")


@pytest.mark.parametrize("flatten", [False, True])
def test_flatten_knob(flatten: bool) -> None:
    for variant in ("persistent", "tma"):
        cfg = config(variant, bm=16, bn=16, bk=16, FLATTEN=flatten)
        assert_close(run(40, 48, 64, cfg, "float16", "none", ("col", "row")), "float16")


def test_group_m_larger_than_the_grid() -> None:
    cfg = config("tiled", bm=16, bn=16, bk=16, GROUP_M=64)
    assert_close(run(50, 70, 30, cfg, "float16"), "float16")


def test_padded_leading_dimensions() -> None:
    # Operands that are slices of wider buffers: leading dimension > the logical one.
    gen = torch.Generator().manual_seed(5)
    a = torch.randn(30, 64, generator=gen)[:, :41]
    b = torch.randn(50, 48, generator=gen).t()[:41, :27]
    for variant in ("tiled", "persistent"):
        out = torch.full((30, 27), float("nan"))
        tg.gemm(a, b, None, out, config=config(variant, bm=16, bn=16, bk=16))
        assert_close(tg.relative_error(out, tg.reference(a, b, None, "none")), "float32")


# --------------------------------------------------------------------------------------------
# The comparison catches wrong answers
# --------------------------------------------------------------------------------------------


def test_comparison_catches_a_wrong_bias() -> None:
    gen = torch.Generator().manual_seed(7)
    a, b = operand(24, 40, "row", "float16", gen), operand(40, 32, "col", "float16", gen)
    bias = torch.randn(32, generator=gen).half()
    out = torch.empty(24, 32, dtype=torch.float16)
    tg.gemm(a, b, bias, out, epilogue="bias_relu", config=config("tiled", bm=16, bn=16, bk=16))
    assert tg.relative_error(out, tg.reference(a, b, bias, "bias_relu")) <= 2e-3
    wrong_bias = bias.clone()
    wrong_bias[5] += 1.0
    assert tg.relative_error(out, tg.reference(a, b, wrong_bias, "bias_relu")) > 2e-3
    assert tg.relative_error(out, tg.reference(a, b, bias, "bias_gelu")) > 2e-3


def test_comparison_catches_a_skipped_k_tile() -> None:
    # The result of a kernel that stopped one BLOCK_K tile early must fail the check.
    gen = torch.Generator().manual_seed(8)
    a, b = operand(32, 64, "row", "bfloat16", gen), operand(64, 32, "row", "bfloat16", gen)
    cfg = config("tiled", bm=16, bn=16, bk=16)
    short = tg.gemm(a[:, :48], b[:48], None, torch.empty(32, 32, dtype=torch.bfloat16), config=cfg)
    full = tg.gemm(a, b, None, torch.empty(32, 32, dtype=torch.bfloat16), config=cfg)
    ref = tg.reference(a, b, None, "none")
    assert tg.relative_error(full, ref) <= tg.tolerance("bfloat16")
    assert tg.relative_error(short, ref) > tg.tolerance("bfloat16")


def test_comparison_catches_an_unwritten_element() -> None:
    ref = torch.randn(8, 8, dtype=torch.float64)
    out = ref.clone()
    out[3, 4] = float("nan")
    assert tg.relative_error(out, ref) == float("inf")
    assert tg.relative_error(ref, ref) == 0.0


# --------------------------------------------------------------------------------------------
# Launch checks
# --------------------------------------------------------------------------------------------


def test_bind_rejects_what_the_kernels_cannot_take() -> None:
    a = torch.randn(8, 16, dtype=torch.float16)
    b = torch.randn(16, 4, dtype=torch.float16)
    out = torch.empty(8, 4, dtype=torch.float16)
    bias = torch.randn(4, dtype=torch.float16)
    cfg = config("tiled", bm=16, bn=16, bk=16)
    bad: list[tuple[str, dict[str, Any]]] = [
        ("is torch.float16 but b", {"b": b.float()}),
        ("out must be float16", {"out": out.float()}),
        ("shapes", {"b": torch.randn(15, 4, dtype=torch.float16)}),
        ("needs a bias", {"epilogue": "bias"}),
        ("takes no bias", {"bias": bias}),
        ("unknown epilogue", {"epilogue": "silu", "bias": bias}),
        ("row-major contiguous", {"out": torch.empty(4, 8, dtype=torch.float16).t()}),
        ("neither row- nor column-major", {"a": torch.randn(8, 32, dtype=torch.float16)[:, ::2]}),
        ("only tiled, splitk, splitk_atomic split", {"config": config("persistent", SPLIT_K=2)}),
        ("'splitk' needs SPLIT_K >= 2", {"config": config("splitk", SPLIT_K=1)}),
        ("'splitk_atomic' needs SPLIT_K >= 2", {"config": config("splitk_atomic", SPLIT_K=1)}),
        ("config lacks GROUP_M", {"config": {k: v for k, v in cfg.items() if k != "GROUP_M"}}),
        ("unsupported dtype", {"a": a.double(), "b": b.double()}),
        ("TMA needs", {"config": config("tma", bm=16, bn=16, bk=16), "a": a[:, :15].contiguous()}),
        (
            "K-major",
            {"config": config("ws", bm=64), "a": a.float(), "b": b.float(), "out": out.float()},
        ),
    ]
    for message, change in bad:
        kwargs: dict[str, Any] = {"a": a, "b": b, "bias": None, "out": out, "config": cfg}
        kwargs.update(change)
        if "TMA" in message:
            kwargs["b"] = torch.randn(15, 4, dtype=torch.float16)
        with pytest.raises(ValueError, match=message):
            tg.bind(
                kwargs.pop("a"), kwargs.pop("b"), kwargs.pop("bias"), kwargs.pop("out"), **kwargs
            )


def test_size_one_strides_are_canonical() -> None:
    # A 1 x K operand made row- or column-major must launch (and specialise) the same way.
    row = torch.randn(1, 64)
    col = torch.randn(64, 1).t()
    b = torch.randn(64, 32)
    cfg = config("tiled", bm=16, bn=16, bk=16)
    launches = [tg.bind(x, b, None, torch.empty(1, 32), config=cfg).launches[0] for x in (row, col)]
    assert launches[0].args[5:] == launches[1].args[5:]
    assert launches[0].kwargs == launches[1].kwargs


def test_precompile_needs_the_compiler() -> None:
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        tg.precompile(
            config=config("tiled"),
            dtype="float16",
            epilogue="none",
            allow_tf32=False,
            m=64,
            n=64,
            k=64,
            capability=90,
        )


# --------------------------------------------------------------------------------------------
# What can run where
# --------------------------------------------------------------------------------------------


def test_variant_problem() -> None:
    assert tg.variants() == ("tiled", "persistent", "tma", "ws", "splitk", "splitk_atomic")
    assert all(tg.variant_problem(v, 90) is None for v in tg.variants())
    assert all(tg.variant_problem(v, None, interpreter=True) is None for v in tg.variants())
    assert "sm_90" in (tg.variant_problem("tma", 80) or "")
    assert "sm_90" in (tg.variant_problem("ws", 100) or "")
    assert tg.variant_problem("tiled", 80) is None
    assert "unknown variant" in (tg.variant_problem("wgmma", 90) or "")
    assert "sm_89" in (tg.dtype_problem("float8_e4m3fn", 80) or "")
    assert tg.dtype_problem(torch.float8_e4m3fn, 89) is None


def test_workload_problem() -> None:
    assert "multiple of 16" in (tg.workload_problem("tma", 1000, 3000, 777, "float16") or "")
    assert tg.workload_problem("tiled", 1000, 3000, 777, "float16") is None
    assert tg.workload_problem("tma", 1000, 3000, 776, "float16", "row", "col") is None
    # A 1 x K column-major A is also row-major: its leading dimension is K, not 1.
    assert tg.workload_problem("tma", 1, 64, 48, "float16", "col", "col") is None
    assert "column-major B" in (tg.workload_problem("ws", 64, 64, 64, "float32") or "")
    assert tg.workload_problem("ws", 64, 64, 64, "float32", "row", "col") is None
    assert tg.workload_problem("ws", 64, 64, 64, "bfloat16", "col", "row") is None
    assert "int32" in (tg.workload_problem("tiled", 65536, 65536, 16, "float16") or "")


def test_resource_estimates_match_the_sm90_compiler() -> None:
    # Values read off Triton 3.6 compiles for sm_90 (metadata.shared), see the notes.
    cfg = config("tiled", bm=128, bn=128, bk=64, num_stages=3, num_warps=4)
    assert tg.smem_bytes(cfg, "float16") == 98304
    assert tg.smem_bytes({**cfg, "variant": "persistent"}, torch.float16) == 98304
    tma = config("tma", bm=128, bn=256, bk=32, num_stages=3, num_warps=8)
    assert tg.smem_bytes(tma, "float32") >= 278552
    assert tg.smem_bytes(config("ws", bm=128, bn=128, bk=64, num_stages=3), "float16") >= 115040
    # The accumulator dominates: 128x128 fp32 over 4 warps is 128 registers a thread.
    assert 128 < tg.regs_per_thread(cfg, "float16") <= 255


def test_config_problem() -> None:
    ok = config("tiled", bm=128, bn=128, bk=64, num_stages=3, num_warps=4)
    assert tg.config_problem(ok, "float16", H100) is None
    # A composite tile: 192 rows as a 128- and a 64-row block (tiled, no split-K).
    assert tg.config_problem({**ok, "BLOCK_M": 192, "num_stages": 4}, "float16", H100) is None
    composite_tma = {**ok, "variant": "tma", "BLOCK_M": 192, "num_stages": 4}
    assert tg.config_problem(composite_tma, "float16", H100) is None
    # ... and along N (80 = 64 + 16), through descriptors only, one composite edge at most.
    wide = {**ok, "variant": "tma", "BLOCK_M": 64, "BLOCK_N": 80, "BLOCK_K": 128, "num_stages": 6}
    assert tg.config_problem(wide, "float16", H100) is None
    assert "'tma' with a power-of-two" in (
        tg.config_problem({**wide, "variant": "tiled"}, "float16", H100) or ""
    )
    assert "'tma' with a power-of-two" in (
        tg.config_problem({**composite_tma, "BLOCK_N": 80}, "float16", H100) or ""
    )
    assert tg.config_problem(config("ws", bm=128, bn=256, bk=64), "float16", H100) is None
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({**ok, "num_stages": 6, "BLOCK_N": 256}, "float16", "shared memory"),
        ({**ok, "BLOCK_M": 256, "BLOCK_N": 256}, "float16", "registers"),
        ({**ok, "BLOCK_K": 16}, "float8_e4m3fn", "MMA's K of 32"),
        ({**ok, "BLOCK_M": 48}, "float16", "power of two"),
        ({**ok, "BLOCK_N": 96}, "float16", "power of two"),
        ({**ok, "BLOCK_N": 192}, "float16", "is for 'tma'"),  # a composite of 128 + 64 columns
        ({**ok, "BLOCK_M": 192, "variant": "persistent"}, "float16", "'tma' without split-K"),
        ({**ok, "BLOCK_M": 192, "variant": "ws"}, "float16", "'tma' without split-K"),
        ({**ok, "BLOCK_M": 192, "SPLIT_K": 2}, "float16", "without split-K"),
        ({**ok, "variant": "persistent", "SPLIT_K": 4}, "float16", "only tiled"),
        ({**ok, "variant": "splitk"}, "float16", "SPLIT_K >= 2"),
        ({**ok, "variant": "splitk", "SPLIT_K": 2, "FLATTEN": False}, "float16", "persistent"),
        ({**ok, "variant": "tma", "num_warps": 2}, "float16", "use 4 or 8"),
        ({**ok, "variant": "ws", "num_warps": 8}, "float16", "num_warps=4"),
        ({**ok, "variant": "ws", "FLATTEN": True}, "float16", "FLATTEN off"),
        ({**ok, "variant": "ws", "BLOCK_M": 64, "BLOCK_N": 256}, "float16", "assertion"),
        ({**ok, "variant": "ws", "num_stages": 5}, "float16", "NaN"),
        ({**ok, "FLATTEN": True}, "float16", "persistent variants"),
        ({**ok, "num_warps": "4"}, "float16", "must be an int"),
        ({**ok, "BLOCK_Q": 1}, "float16", "unknown config keys"),
        (ok, "float64", "unsupported dtype"),
    ]
    for cfg, dtype, message in cases:
        assert message in (tg.config_problem(cfg, dtype, H100) or ""), (cfg, dtype)
    assert "sm_90" in (
        tg.config_problem(config("tma"), "float16", {"compute_capability": 80}) or ""
    )
    # Limits missing from device_props are not checked.
    too_big = {**ok, "BLOCK_N": 256, "num_stages": 6, "num_warps": 8}
    assert tg.config_problem(too_big, "float16", {"compute_capability": 90}) is None
    assert "compute capability" in (tg.config_problem(ok, "float16", {}) or "")


# --------------------------------------------------------------------------------------------
# Precompile (the real compiler, for an sm_90 target, in a process without the interpreter)
# --------------------------------------------------------------------------------------------

PRECOMPILE_SCRIPT = textwrap.dedent(
    """
    import hashlib, json, sys
    import torch
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.runtime.cache import get_cache_key
    from tunehub.kernels import triton_gemm_kernels as tg

    assert not tg._interpreting()
    cfg = json.loads(sys.argv[1])
    m, n, k = json.loads(sys.argv[2])
    kwargs = dict(config=cfg, dtype="float16", epilogue="bias", allow_tf32=False, m=m, n=n, k=k,
                  a_layout="col", b_layout="row", capability=90, num_sms=132)
    first = tg.precompile(**kwargs)
    second = tg.precompile(**kwargs)
    # The cache keys a launch on real tensors computes (JITFunction.run -> compile); bind
    # packs the launch without running it.
    a = torch.randn(k, m).t().half()
    b = torch.randn(k, n).half()
    bias = torch.randn(n).half()
    bound = tg.bind(a, b, bias, torch.empty(m, n, dtype=torch.half), epilogue="bias", config=cfg,
                    num_sms=132)
    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    launch_keys = []
    for x in bound.launches:
        src, opts = tg._specialize(x.kernel, target, x.args, x.kwargs)
        opts = backend.parse_options(dict(opts.__dict__))
        key = get_cache_key(src, backend, opts, get_cache_invalidating_env_vars())
        launch_keys.append(hashlib.sha256(key.encode("utf-8")).hexdigest())
    json.dump({
        "first": [[p.cache_hit, p.shared_bytes, p.cache_key] for p in first],
        "second": [[p.cache_hit, p.cache_key] for p in second],
        "launch_keys": launch_keys,
    }, sys.stdout)
    """
)


def _precompile_in_a_process(
    tmp_path: Path, config: dict[str, Any], shape: tuple[int, int, int]
) -> dict[str, Any]:
    import json

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-c", PRECOMPILE_SCRIPT, json.dumps(config), json.dumps(shape)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    if proc.returncode and "ptxas" in proc.stderr:
        pytest.skip(f"Triton's CUDA toolchain cannot run here: {proc.stderr[-300:]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def test_precompile_fills_the_cache_with_what_the_launch_asks_for(tmp_path: Path) -> None:
    config = dict(variant="tiled", BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=4, num_warps=4,
                  num_stages=3, SPLIT_K=2)  # fmt: skip
    result = _precompile_in_a_process(tmp_path, config, (1, 100, 96))
    # GEMM and split-K reduce: compiled once, then found in the cache.
    assert [hit for hit, _, _ in result["first"]] == [False, False]
    assert [hit for hit, _ in result["second"]] == [True, True]
    assert [key for _, _, key in result["first"]] == [key for _, key in result["second"]]
    # The estimate bounds what the compiler allocated: a ring of 64x32 and 32x64 fp16 tiles.
    assert 0 < result["first"][0][1] <= 3 * (64 * 32 + 32 * 64) * 2
    # The launch on real tensors looks up exactly the entries precompile wrote.
    assert result["launch_keys"] == [key for _, _, key in result["first"]]


def test_precompile_takes_host_side_tma_descriptors(tmp_path: Path) -> None:
    # The tma kernel gets its descriptors as arguments: precompile builds them around a
    # stand-in tensor, and the launch's specialisation must match it.
    config = dict(variant="tma", BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=4, num_warps=4,
                  num_stages=3, SPLIT_K=1, FLATTEN=True)  # fmt: skip
    result = _precompile_in_a_process(tmp_path, config, (64, 96, 96))
    assert [hit for hit, _, _ in result["first"]] == [False]
    assert [hit for hit, _ in result["second"]] == [True]
    assert result["launch_keys"] == [key for _, _, key in result["first"]]


def test_precompile_of_pad_k(tmp_path: Path) -> None:
    # The padding launch, then the GEMM at the padded K (77 -> 80): both compiled, and the
    # launch on real tensors asks for exactly those binaries.
    config = dict(variant="tma", BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=4, num_warps=4,
                  num_stages=3, SPLIT_K=1, FLATTEN=True, PAD_K=True)  # fmt: skip
    result = _precompile_in_a_process(tmp_path, config, (64, 96, 77))
    assert [hit for hit, _, _ in result["first"]] == [False, False]
    assert [hit for hit, _ in result["second"]] == [True, True]
    assert result["launch_keys"] == [key for _, _, key in result["first"]]


@pytest.mark.parametrize("variant", ["splitk", "splitk_atomic"])
def test_precompile_of_the_one_kernel_split_k(tmp_path: Path, variant: str) -> None:
    config = dict(variant=variant, BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=4, num_warps=4,
                  num_stages=3, SPLIT_K=3)  # fmt: skip
    result = _precompile_in_a_process(tmp_path, config, (100, 96, 224))
    # One kernel (no reduce), its workspace and counters specialised as the launch's.
    assert [hit for hit, _, _ in result["first"]] == [False]
    assert [hit for hit, _ in result["second"]] == [True]
    assert result["launch_keys"] == [key for _, _, key in result["first"]]
