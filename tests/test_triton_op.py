"""``tunehub::triton_gemm`` (tunehub's own kernels as a ``torch.library.triton_op``) on the CPU
through Triton's interpreter: every variant it runs, against torch, on fresh inputs and odd
shapes. That Inductor's generated code launches these kernels itself is checked on a GPU
(benchmarks/inductor_route.py, step ``op``)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the gpu extra)")
triton = pytest.importorskip("triton", reason="triton is not installed (the gpu extra)")


from tunehub.client.triton_op import OP, VARIANTS, config_json, runs, triton_gemm  # noqa: E402

pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim:DeprecationWarning"
)

BASE = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 4, "num_warps": 4, "num_stages": 2}
CONFIGS = {
    "tiled": {**BASE, "variant": "tiled", "SPLIT_K": 1},
    "tiled split-K": {**BASE, "variant": "tiled", "SPLIT_K": 3},
    "splitk": {**BASE, "variant": "splitk", "SPLIT_K": 2},
    "splitk_atomic": {**BASE, "variant": "splitk_atomic", "SPLIT_K": 2},
    "persistent": {**BASE, "variant": "persistent", "SPLIT_K": 1},
    "tiled PAD_K": {**BASE, "variant": "tiled", "SPLIT_K": 1, "PAD_K": True},
    "tma": {**BASE, "variant": "tma", "SPLIT_K": 1},
    "tma composite": {**BASE, "variant": "tma", "SPLIT_K": 1, "BLOCK_N": 80, "BLOCK_K": 32},
}
EPILOGUES = {
    "none": lambda y, bias: y,
    "bias": lambda y, bias: y + bias,
    "bias_relu": lambda y, bias: torch.relu(y + bias),
    "bias_gelu": lambda y, bias: torch.nn.functional.gelu(y + bias),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_each_variant_matches_torch_on_fresh_inputs(name: str) -> None:
    config = CONFIGS[name]
    gen = torch.Generator().manual_seed(len(name))
    # TMA descriptors need 16-byte aligned rows: N and K multiples of 4 for float32.
    shapes = ((37, 44, 28), (64, 16, 52)) if "tma" in name else ((37, 45, 27), (64, 16, 50))
    for (m, n, k), epilogue in zip(shapes, ("bias_gelu", "none"), strict=True):
        a = torch.randn(m, k, generator=gen)
        weight = torch.randn(n, k, generator=gen)  # B column-major, as nn.Linear's
        bias = torch.randn(n, generator=gen) if epilogue != "none" else None
        out = triton_gemm(a, weight.t(), bias, epilogue, config_json(config))
        want = EPILOGUES[epilogue](a.double() @ weight.double().t(), bias)
        assert out.shape == (m, n) and out.dtype == torch.float32
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out.double(), want, rtol=1e-4, atol=1e-4)
        # A row-major B through the registered op: the same answer.
        again = torch.ops.tunehub.triton_gemm(
            a, weight.t().contiguous(), bias, epilogue, config_json(config)
        )
        torch.testing.assert_close(again, out, rtol=1e-5, atol=1e-5)


def test_the_op_is_registered_and_says_which_variants_it_runs() -> None:
    assert OP == "tunehub::triton_gemm"
    assert hasattr(torch.ops.tunehub, "triton_gemm")
    assert set(VARIANTS) == {"tiled", "splitk", "splitk_atomic", "persistent", "tma"}
    assert runs(CONFIGS["splitk_atomic"]) and runs(CONFIGS["tma"])
    assert not runs({**BASE, "variant": "ws"})
    # One config, one spelling: the op's argument is canonical JSON.
    shuffled = dict(reversed(list(CONFIGS["tiled"].items())))
    assert config_json(shuffled) == config_json(CONFIGS["tiled"])


def test_a_config_the_kernels_cannot_take_is_refused_with_its_reason() -> None:
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    with pytest.raises(ValueError, match="invalid config"):
        triton_gemm(a, b, None, "none", config_json({**BASE, "variant": "tiled", "SPLIT_K": 0}))
    # A shape tma cannot describe (float32 rows of 7 elements, 28 bytes): why, not an assert.
    a7, b7 = torch.randn(8, 7), torch.randn(7, 8)
    with pytest.raises(ValueError, match=r"tma: .*16"):
        triton_gemm(a7, b7, None, "none", config_json(CONFIGS["tma"]))


def test_a_compile_analyses_each_tunehub_kernel_once_per_signature(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Inductor analyses each call site of a user-defined kernel (TTIR generated each time);
    within ``one_analysis_per_kernel`` a tunehub kernel's analysis is made once per argument
    signature (whichever copy of the kernel a call site holds) and handed out as copies;
    other kernels are analysed every time, and torch's
    function is back afterwards. (torch's analysis is replaced by a counting double: it needs
    a GPU to generate TTIR.)"""
    import copy

    from torch._higher_order_ops import triton_kernel_wrap as wrap

    from tunehub.client.triton_op import one_analysis_per_kernel
    from tunehub.kernels import triton_gemm_kernels as kernels

    calls: list[str] = []

    def analyse(kernel: object, kwargs: dict[str, object], metadata: object) -> dict[str, list]:
        calls.append(getattr(kernel, "__name__", "?"))
        return {"writes": ["c_ptr"]}

    name = next(
        n for n in ("identify_accessed_tensors", "identify_mutated_tensors") if hasattr(wrap, n)
    )
    monkeypatch.setattr(wrap, name, analyse)

    @triton.jit
    def someone_elses(x_ptr):  # type: ignore[no-untyped-def]
        pass

    kernel = kernels._gemm_tma_kernel
    half = {"a": torch.empty(4, dtype=torch.float16), "M": 64, "ACC": None}
    with one_analysis_per_kernel():
        analysis = getattr(wrap, name)
        first = analysis(kernel, half, {})
        first["writes"].append("changed by its caller")
        analysis(copy.copy(kernel), half, {})  # another call site's copy of the kernel
        assert analysis(kernel, dict(half, a=torch.empty(9, dtype=torch.float16)), {}) == {
            "writes": ["c_ptr"]
        }  # another tensor of the same dtype: the same analysis, a fresh copy
        analysis(kernel, dict(half, a=torch.empty(4, dtype=torch.float32)), {})  # another dtype
        analysis(kernel, dict(half, M=128), {})  # another value
        analysis(kernel, half, {"a": ("stable", ([64, 32],))})  # another TMA block
        analysis(someone_elses, {"x_ptr": half["a"]}, {})
        analysis(someone_elses, {"x_ptr": half["a"]}, {})
    assert calls == ["_gemm_tma_kernel"] * 4 + ["someone_elses"] * 2
    assert getattr(wrap, name) is analyse
