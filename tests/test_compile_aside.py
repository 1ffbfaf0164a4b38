"""``tunehub.client.compile_aside``: tunehub's kernels compiled on a thread beside a compile.

The route patches Inductor's real ``AsyncCompile.triton``. Compiling a CUDA kernel needs a GPU,
so here the thread's real compile fails (and the route's fallback to Inductor's own compile is
what is seen), and the success path takes a double of the compile. That a real compile goes
aside and its kernel runs is checked on a GPU (benchmarks/compile_models.py records the route's
counts per contender as ``compile_aside``)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the gpu extra)")
triton = pytest.importorskip("triton", reason="triton is not installed (the gpu extra)")

from torch._inductor import async_compile as inductor_async  # noqa: E402

from tunehub.client import compile_aside  # noqa: E402
from tunehub.kernels import triton_gemm_kernels as kernels  # noqa: E402


def inductor_source(fn: Any, name: str) -> str:
    """The source Inductor hands ``async_compile.triton`` for a user-defined kernel (as its
    wrapper codegen writes it: Triton imports, ``user_autotune``, the kernel renamed)."""
    from torch._inductor.codegen.triton import TritonKernel
    from torch._inductor.runtime.hints import DeviceProperties

    device = DeviceProperties(type="cuda", index=0, multi_processor_count=132, cc=90, major=9)
    meta = {"signature": {}, "device": device, "constants": {}, "configs": []}
    source = compile_aside.kernel_source(fn)
    assert source is not None
    body = source.replace(f"def {kernels_name(fn)}(", f"def {name}(")
    body = body.replace("\\", "\\\\").replace("'''", "\\'\\'\\'")
    return (
        TritonKernel.gen_common_triton_imports()
        + "\n@triton_heuristics.user_autotune(\n"
        + f"    configs=[], inductor_meta={{'kernel_name': {name!r}}}, triton_meta={meta!r},\n"
        + "    filename=__file__, custom_kernel=True,\n)\n@triton.jit\n"
        + body
    )


def kernels_name(fn: Any) -> str:
    function = compile_aside.kernel_function(fn)
    assert function is not None
    return function.__name__


def test_tunehub_kernels_are_told_from_other_kernels() -> None:
    """A kernel is tunehub's when it is a user-defined kernel named as one of tunehub's (with or
    without Inductor's suffix) holding that kernel's body; a user's kernel of the same name, or
    one of Inductor's own, is not."""
    fn = kernels._gemm_tma_kernel
    assert compile_aside.is_tunehub_kernel(
        "_gemm_tma_kernel", inductor_source(fn, kernels_name(fn))
    )
    assert compile_aside.is_tunehub_kernel(
        "_gemm_tma_kernel_3", inductor_source(fn, "_gemm_tma_kernel_3")
    )
    other = inductor_source(kernels._gemm_tiled_kernel, "_gemm_tma_kernel")
    assert not compile_aside.is_tunehub_kernel("_gemm_tma_kernel", other)
    assert not compile_aside.is_tunehub_kernel(
        "_gemm_tma_kernel", inductor_source(fn, kernels_name(fn)).replace("custom_kernel=True", "")
    )
    assert not compile_aside.is_tunehub_kernel("triton_poi_fused_0", "def triton_poi_fused_0(")


class DoubleKernel:
    """A compiled kernel as Inductor's ``CachingAutotuner``, as far as the route uses it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def set_compile_info(self, compile_id: Any, is_backward: bool) -> None:
        self.calls.append(("set_compile_info", is_backward))

    def precompile(self, **kwargs: Any) -> None:
        self.calls.append(("precompile", kwargs["warm_cache_only"]))


def double_compile(kernel: Any) -> Any:
    """A ``compile_warm`` double: hands back ``kernel``, or raises it if it is an error;
    records the kernels it was asked for in ``.compiled``."""

    def compile_kernel(kernel_name: str, source_code: str) -> Any:
        compile_kernel.compiled.append(kernel_name)  # type: ignore[attr-defined]
        if isinstance(kernel, Exception):
            raise kernel
        return kernel

    compile_kernel.compiled = []  # type: ignore[attr-defined]
    return compile_kernel


@pytest.fixture
def inductor(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Inductor compiling in this process (its workers not ready, several compile threads),
    with its own ``triton`` replaced by a recorder of the kernels it was asked for."""
    asked: list[str] = []

    def own_compile(self: Any, kernel_name: str, source_code: str, device_str: str = "cuda") -> str:
        asked.append(kernel_name)
        return f"compiled here: {kernel_name}"

    monkeypatch.setattr(inductor_async.AsyncCompile, "triton", own_compile)
    monkeypatch.setattr(
        inductor_async.AsyncCompile, "use_process_pool", classmethod(lambda c: False)
    )
    monkeypatch.setattr(inductor_async, "get_compile_threads", lambda: 4)
    monkeypatch.setattr(compile_aside, "STATS", compile_aside.Counter())
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the tests' kernels are interpreted
    return asked


def test_a_tunehub_kernel_goes_aside_and_inductor_keeps_the_rest(inductor: list[str]) -> None:
    """While the route is on, a tunehub kernel is compiled on the route's thread and comes back
    as a future of the kernel, readied for launch here as Inductor readies a kernel its workers
    compiled; another kernel compiles as Inductor would; Inductor's ``triton`` is back
    afterwards."""
    fn = kernels._gemm_tma_kernel
    kernel = DoubleKernel()
    compile_kernel = double_compile(kernel)
    own = inductor_async.AsyncCompile.triton
    with compile_aside.compiling_aside(compile_kernel):
        compiler = inductor_async.AsyncCompile()
        future = compiler.triton("_gemm_tma_kernel_0", inductor_source(fn, "_gemm_tma_kernel_0"))
        assert compiler.triton("triton_poi_fused_gelu_1", "def triton_poi_fused_gelu_1(") == (
            "compiled here: triton_poi_fused_gelu_1"
        )
        assert future.result() is kernel
    assert inductor_async.AsyncCompile.triton is own
    assert inductor == ["triton_poi_fused_gelu_1"]
    assert compile_kernel.compiled == ["_gemm_tma_kernel_0"]
    assert kernel.calls == [("set_compile_info", False), ("precompile", False)]
    assert compile_aside.STATS == {"aside": 1}


def test_a_kernel_the_thread_fails_compiles_as_inductor_would(
    inductor: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    """The route's real compile on a machine without a GPU fails on the thread; the kernel is
    then compiled here as Inductor would (so an error is Inductor's own)."""
    fn = kernels._gemm_tiled_kernel
    name = kernels_name(fn)
    caplog.set_level("INFO", logger="tunehub.client.compile_aside")
    with compile_aside.compiling_aside():
        future = inductor_async.AsyncCompile().triton(name, inductor_source(fn, name))
        assert future.result() == f"compiled here: {name}"
    assert inductor == [name]
    assert compile_aside.STATS == {"aside": 1, "failed": 1}
    assert "GPU" in caplog.text  # Triton found no GPU to compile for


def test_one_compile_thread_or_inductors_ready_workers_keep_inductors_route(
    inductor: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With one compile thread Inductor takes each kernel as compiled when asked (a future
    would never be waited for); with its workers ready, they compile it; under Triton's
    interpreter nothing compiles."""
    fn = kernels._gemm_tma_kernel
    source = inductor_source(fn, kernels_name(fn))
    compile_kernel = double_compile(DoubleKernel())
    with compile_aside.compiling_aside(compile_kernel):
        monkeypatch.setattr(inductor_async, "get_compile_threads", lambda: 1)
        inductor_async.AsyncCompile().triton(kernels_name(fn), source)
        monkeypatch.setattr(inductor_async, "get_compile_threads", lambda: 4)
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        inductor_async.AsyncCompile().triton(kernels_name(fn), source)
        monkeypatch.delenv("TRITON_INTERPRET")
        monkeypatch.setattr(
            inductor_async.AsyncCompile, "use_process_pool", classmethod(lambda c: True)
        )
        inductor_async.AsyncCompile().triton(kernels_name(fn), source)
    assert compile_kernel.compiled == []
    assert inductor == [kernels_name(fn)] * 3
    assert compile_aside.STATS == {"here": 3}
