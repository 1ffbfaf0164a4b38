"""The Triton drop-ins on the CPU through Triton's interpreter: ``tunehub.triton.matmul`` against
torch, and ``tunehub.triton.autotune`` sharing results through a real ``tunehub serve`` on
loopback (a second process benchmarks nothing)."""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the gpu extra)")
triton = pytest.importorskip("triton", reason="triton is not installed (the gpu extra)")

import torch.nn.functional as F  # noqa: E402
import triton.language as tl  # noqa: E402

import tunehub.triton as tt  # noqa: E402
from tests.live import REPO, LiveServer, free_port, run_script  # noqa: E402
from tunehub.client import (  # noqa: E402
    ScheduleClient,
    set_default_client,
    triton_autotune,
)
from tunehub.client import triton as client_triton  # noqa: E402
from tunehub.client.gemm_choice import CALLS, CHOOSER, GemmChoice, choice_key  # noqa: E402
from tunehub.core import Config, Workload, local_cpu_target  # noqa: E402

pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim:DeprecationWarning"
)


@pytest.fixture(autouse=True)
def fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TUNEHUB_CACHE_DIR", str(tmp_path / "cache"))
    # No service: the client answers from defaults (each test gets a client made afresh).
    monkeypatch.setenv("TUNEHUB_URL", "")
    set_default_client(None)
    monkeypatch.delenv("TUNEHUB_API_KEY", raising=False)
    CHOOSER.clear()
    CALLS.clear()
    client_triton.clear_plans()
    triton_autotune._MEMORY.clear()
    yield
    CHOOSER.clear()
    set_default_client(None)


def reference(a: Any, b: Any, bias: Any, activation: str | None) -> Any:
    out = a.double() @ b.double()
    if bias is not None:
        out = out + bias.double()
    if activation == "relu":
        out = out.relu()
    elif activation == "gelu":
        out = F.gelu(out)
    return out


# --------------------------------------------------------------------------------------------
# matmul
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("m", "n", "k", "dtype", "activation", "with_bias", "b_transposed"),
    [
        pytest.param(37, 45, 70, "float32", None, False, False, id="fp32-plain"),
        pytest.param(33, 40, 48, "float32", "gelu", False, True, id="fp32-gelu-Bcol"),
        pytest.param(64, 48, 32, "float16", "relu", True, False, id="fp16-bias-relu"),
        pytest.param(1, 64, 80, "float16", None, True, True, id="fp16-M1-bias-linear"),
    ],
)
def test_matmul_equals_torch(
    m: int, n: int, k: int, dtype: str, activation: str | None, with_bias: bool, b_transposed: bool
) -> None:
    gen = torch.Generator().manual_seed(m + n + k)
    torch_dtype = getattr(torch, dtype)
    a = torch.randn(m, k, generator=gen).to(torch_dtype)
    # A transposed B is an nn.Linear weight (N x K row-major): F.linear(x, w) = x @ w.t().
    b = torch.randn(n, k, generator=gen).t() if b_transposed else torch.randn(k, n, generator=gen)
    b = b.to(torch_dtype)
    bias = torch.randn(n, generator=gen).to(torch_dtype) if with_bias else None
    out = tt.matmul(a, b, bias, activation=activation)
    assert out.dtype == torch_dtype and out.shape == (m, n)
    tol = 1e-4 if dtype == "float32" else 2e-2
    torch.testing.assert_close(out.double(), reference(a, b, bias, activation), rtol=tol, atol=tol)
    assert CALLS == {"triton.gemm": 1}
    assert CHOOSER.lookups["triton.gemm"] == 1
    tt.matmul(a, b, bias, activation=activation)  # the same shape: no second lookup
    assert CHOOSER.lookups["triton.gemm"] == 1 and CALLS["triton.gemm"] == 2


def test_matmul_batches_and_falls_back_where_the_kernel_does_not_apply() -> None:
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, 24, generator=gen)
    w = torch.randn(24, 16, generator=gen)
    torch.testing.assert_close(tt.matmul(x, w), x @ w, rtol=1e-4, atol=1e-4)
    a3, b3 = torch.randn(2, 5, 8, generator=gen), torch.randn(2, 8, 7, generator=gen)
    torch.testing.assert_close(tt.matmul(a3, b3), a3 @ b3, rtol=1e-4, atol=1e-4)
    assert CALLS == {"triton.gemm": 3}
    # float64 has no Triton kernel; gradients need torch's graph: both run torch.
    d = torch.randn(4, 4, dtype=torch.float64)
    torch.testing.assert_close(tt.matmul(d, d), d @ d)
    g = torch.randn(4, 4, requires_grad=True)
    tt.matmul(g, g).sum().backward()
    assert g.grad is not None
    assert CALLS["library"] == 2
    with pytest.raises(ValueError, match="activation"):
        tt.matmul(g, g, activation="swish")


def test_matmul_runs_the_library_where_the_lookup_says_it_is_faster() -> None:
    a, b = torch.randn(16, 32), torch.randn(32, 8)
    workload = Workload(m=16, n=8, k=32)
    target = tt.matmul.__globals__["device_target"](a.device)
    key = choice_key(workload, target, "triton.gemm")
    CHOOSER._answers[key] = GemmChoice("triton.gemm", Config({}), "exact", use_library=True)
    torch.testing.assert_close(tt.matmul(a, b), a @ b)
    assert CALLS == {"library": 1}


def test_deterministic_mode_takes_no_kernel_summed_by_atomics() -> None:
    a, b = torch.randn(16, 256), torch.randn(256, 8)
    workload = Workload(m=16, n=8, k=256)
    target = tt.matmul.__globals__["device_target"](a.device)
    atomic = Config({"variant": "splitk_atomic", "BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 32,
                     "GROUP_M": 1, "num_warps": 4, "num_stages": 2, "SPLIT_K": 4})  # fmt: skip
    CHOOSER._answers[choice_key(workload, target, "triton.gemm")] = GemmChoice(
        "triton.gemm", atomic, "exact"
    )
    torch.testing.assert_close(tt.matmul(a, b), a @ b, rtol=1e-4, atol=1e-4)
    assert CALLS == {"triton.gemm": 1}
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        torch.testing.assert_close(tt.matmul(a, b), a @ b)
    finally:
        torch.use_deterministic_algorithms(was)
    assert CALLS == {"triton.gemm": 1, "library": 1}


def test_a_config_that_cannot_run_falls_back_to_the_default() -> None:
    a, b = torch.randn(16, 32), torch.randn(32, 8)
    workload = Workload(m=16, n=8, k=32)
    target = tt.matmul.__globals__["device_target"](a.device)
    bad = Config({"variant": "tiled", "BLOCK_M": 7})  # not a config the kernels take
    CHOOSER._answers[choice_key(workload, target, "triton.gemm")] = GemmChoice(
        "triton.gemm", bad, "exact"
    )
    torch.testing.assert_close(tt.matmul(a, b), a @ b, rtol=1e-4, atol=1e-4)
    assert CALLS == {"triton.gemm": 1}
    assert CHOOSER.choose(workload, target, "triton.gemm").source == "local-default"


def kernel_config(variant: str, **extra: Any) -> Config:
    data: dict[str, Any] = {"variant": variant, "BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32}
    data.update(GROUP_M=2, num_warps=4, num_stages=2, SPLIT_K=1)
    return Config({**data, **extra})


def answer(a: Any, b: Any, config: Config, epilogue: str = "none") -> None:
    """Make the lookup for a @ b's shape answer ``config`` (as a tuned schedule would)."""
    dtype = str(a.dtype).removeprefix("torch.")
    layout = "col_major" if b.stride(0) == 1 and b.shape[1] > 1 else "row_major"
    workload = Workload(m=a.shape[0], n=b.shape[1], k=a.shape[1], dtype=dtype,
                        b_layout=layout, epilogue=epilogue)  # fmt: skip
    target = client_triton.device_target(a.device)
    CHOOSER._answers[choice_key(workload, target, "triton.gemm")] = GemmChoice(
        "triton.gemm", config, "exact"
    )


@pytest.mark.parametrize(
    ("config", "dtype", "activation", "with_bias", "k"),
    [
        pytest.param(kernel_config("tiled"), "float32", "gelu", True, 40, id="tiled-bias-gelu"),
        pytest.param(kernel_config("tiled"), "float32", "relu", False, 40, id="tiled-zero-bias"),
        pytest.param(kernel_config("tiled", SPLIT_K=2), "float32", None, False, 64, id="split"),
        pytest.param(kernel_config("splitk", SPLIT_K=2), "float16", None, True, 64, id="splitk"),
        pytest.param(kernel_config("persistent"), "float16", None, False, 40, id="persistent"),
        pytest.param(kernel_config("tma"), "float16", "relu", True, 64, id="tma"),
        pytest.param(kernel_config("tma", PAD_K=True), "float16", None, False, 36, id="tma-padk"),
    ],
)
def test_a_cached_call_answers_as_a_first_call_does_on_fresh_inputs(
    config: Config, dtype: str, activation: str | None, with_bias: bool, k: int
) -> None:
    m, n = 24, 48
    torch_dtype = getattr(torch, dtype)

    def inputs(seed: int) -> tuple[Any, Any, Any]:
        gen = torch.Generator().manual_seed(seed)
        a = torch.randn(m, k, generator=gen).to(torch_dtype)
        b = torch.randn(k, n, generator=gen).to(torch_dtype)
        bias = torch.randn(n, generator=gen).to(torch_dtype) if with_bias else None
        return a, b, bias

    first = inputs(1)
    epilogue = client_triton.triton_epilogue(with_bias, client_triton._ACTIVATIONS[activation])
    answer(first[0], first[1], config, epilogue)
    tol = 1e-4 if dtype == "float32" else 2e-2
    out = tt.matmul(*first, activation=activation)
    torch.testing.assert_close(out.double(), reference(*first, activation), rtol=tol, atol=tol)
    (plan,) = client_triton._PLANS.values()
    assert isinstance(plan, client_triton._KernelPlan)
    later = inputs(2)
    cached = tt.matmul(*later, activation=activation)
    assert list(client_triton._PLANS.values()) == [plan]  # the same plan, no other
    torch.testing.assert_close(cached.double(), reference(*later, activation), rtol=tol, atol=tol)
    client_triton.clear_plans()  # a first call again, on the same inputs
    fresh = tt.matmul(*later, activation=activation)
    assert torch.equal(cached, fresh)
    assert CALLS == {"triton.gemm": 3} and CHOOSER.lookups["triton.gemm"] == 0  # answered


def test_the_memo_is_keyed_on_strides_dtype_and_alignment() -> None:
    m, n, k = 16, 32, 64
    gen = torch.Generator().manual_seed(3)
    a, b = torch.randn(m, k, generator=gen), torch.randn(k, n, generator=gen)
    torch.testing.assert_close(tt.matmul(a, b), a @ b, rtol=1e-4, atol=1e-4)
    b_col = torch.randn(n, k, generator=gen).t()  # the same shape, other strides
    torch.testing.assert_close(tt.matmul(a, b_col), a @ b_col, rtol=1e-4, atol=1e-4)
    assert CHOOSER.lookups["triton.gemm"] == 2 and len(client_triton._PLANS) == 2
    # An operand 4 bytes off a 16-byte boundary: the same shape and strides, another
    # specialisation of the kernel.
    shifted = torch.randn(m * k + 1, generator=gen)[1:].view(m, k)
    assert shifted.data_ptr() % 16 and shifted.stride() == a.stride()
    torch.testing.assert_close(tt.matmul(shifted, b), shifted @ b, rtol=1e-4, atol=1e-4)
    assert len(client_triton._PLANS) == 3 and CALLS == {"triton.gemm": 3}

    # Half precision, with a TMA config: an unaligned operand is not given to TMA (torch runs
    # it; the config stays), an aligned one is, from the memo after its first call.
    h, hb = a.half(), b.half()
    answer(h, hb, kernel_config("tma"))
    h_shifted = torch.randn(m * k + 1, generator=gen).half()[1:].view(m, k)
    for operand in (h, h_shifted, h, h_shifted):
        out = tt.matmul(operand, hb)
        torch.testing.assert_close(out, (operand.float() @ hb.float()).half(), rtol=2e-2, atol=2e-2)
    assert CALLS == {"triton.gemm": 5, "library": 2}
    assert len(client_triton._PLANS) == 5
    plans = [type(p).__name__ for p in client_triton._PLANS.values()]
    assert plans.count("_KernelPlan") == 4 and plans.count("_LibraryPlan") == 1
    target = client_triton.device_target(h.device)
    workload = Workload(m=m, n=n, k=k, dtype="float16")
    assert CHOOSER.choose(workload, target, "triton.gemm").config["variant"] == "tma"


def test_plans_holding_buffers_of_their_own_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    # PAD_K's padded copies of A and B belong to the binding a plan keeps: a dynamic M would
    # keep one pair per M. Past MAX_PLAN_BYTES the memo starts again.
    gen = torch.Generator().manual_seed(5)
    padded = kernel_config("tiled", PAD_K=True)
    b = torch.randn(36, 32, generator=gen).half()  # K = 36 halves: rows of 72 bytes, padded
    for m in (16, 32):
        answer(torch.empty(m, 36).half(), b, padded)
    a16 = torch.randn(16, 36, generator=gen).half()
    tt.matmul(a16, b)
    (plan,) = client_triton._PLANS.values()
    assert isinstance(plan, client_triton._KernelPlan)
    assert plan.own_bytes == (16 * 40 + 40 * 32) * 2  # K padded to 40
    monkeypatch.setattr(client_triton, "MAX_PLAN_BYTES", plan.own_bytes + 100)
    a32 = torch.randn(32, 36, generator=gen).half()
    out = tt.matmul(a32, b)
    torch.testing.assert_close(out.float(), a32.float() @ b.float(), rtol=2e-2, atol=2e-2)
    assert len(client_triton._PLANS) == 1  # the first plan was let go
    assert client_triton._plan_bytes == (32 * 40 + 40 * 32) * 2


def test_another_shape_never_takes_another_shapes_launch() -> None:
    shapes = [(16, 8, 32), (17, 8, 32), (16, 9, 32), (16, 8, 33), (8, 16, 32)]
    gen = torch.Generator().manual_seed(11)
    for _ in range(2):  # interleaved: first calls, then cached ones
        for m, n, k in shapes:
            a, b = torch.randn(m, k, generator=gen), torch.randn(k, n, generator=gen)
            bias = torch.randn(n, generator=gen)
            out = tt.matmul(a, b, bias, activation="relu")
            assert out.shape == (m, n)
            torch.testing.assert_close(out, torch.relu(a @ b + bias), rtol=1e-4, atol=1e-4)
    assert len(client_triton._PLANS) == len(shapes)
    assert CHOOSER.lookups["triton.gemm"] == len(shapes)
    # A key first seen as x @ x, later called with two tensors: each in its place.
    x = torch.randn(16, 16, generator=gen)
    torch.testing.assert_close(tt.matmul(x, x), x @ x, rtol=1e-4, atol=1e-4)
    y, z = torch.randn(16, 16, generator=gen), torch.randn(16, 16, generator=gen)
    torch.testing.assert_close(tt.matmul(y, z), y @ z, rtol=1e-4, atol=1e-4)
    shapes.append((16, 16, 16))
    assert set(CALLS) == {"triton.gemm"} and CALLS["triton.gemm"] == 2 * len(shapes)
    # New answers (here: forgotten ones) are never answered from plans made before them.
    CHOOSER.clear()
    a, b = torch.randn(16, 32, generator=gen), torch.randn(32, 8, generator=gen)
    tt.matmul(a, b)
    assert CHOOSER.lookups["triton.gemm"] == 1


# --------------------------------------------------------------------------------------------
# autotune
# --------------------------------------------------------------------------------------------

KERNEL_MODULE = '''
"""A user's kernel, tuned with tunehub.triton.autotune."""
import triton
import triton.language as tl

import tunehub.triton
from tunehub.client.triton_autotune import cpu_do_bench

BENCH_CALLS = [0]


def counting_bench(fn, quantiles=None):
    BENCH_CALLS[0] += 1
    return cpu_do_bench(fn, quantiles)


CONFIGS = [triton.Config({"BLOCK": 32}, num_warps=2), triton.Config({"BLOCK": 128}, num_warps=4)]


@tunehub.triton.autotune(configs=CONFIGS, key=["n"], do_bench=counting_bench)
@triton.jit
def add_one(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


def run(n):
    import torch

    x = torch.arange(n, dtype=torch.float32)
    y = torch.empty_like(x)
    add_one[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, n)
    assert torch.equal(y, x + 1)
    return add_one
'''

PROCESS = """
import json, sys
sys.path.insert(0, sys.argv[1])
import user_kernel
tuner = user_kernel.run(int(sys.argv[2]))
print(json.dumps({"bench_calls": user_kernel.BENCH_CALLS[0], "sources": dict(tuner.sources),
                  "best": tuner.best_config.kwargs, "cache_key": tuner.last_cache_key}))
"""


@pytest.fixture
def user_kernel(tmp_path: Path) -> Iterator[Any]:
    (tmp_path / "user_kernel.py").write_text(KERNEL_MODULE)
    sys.path.insert(0, str(tmp_path))
    try:
        sys.modules.pop("user_kernel", None)
        yield importlib.import_module("user_kernel")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("user_kernel", None)


def test_autotune_benchmarks_once_then_answers_from_memory_and_disk(user_kernel: Any) -> None:
    tuner = user_kernel.run(300)
    assert user_kernel.BENCH_CALLS[0] == 2 and tuner.bench_runs == 2
    assert tuner.sources == {"benchmark": 1}
    user_kernel.run(300)  # Triton's own per-key cache
    assert user_kernel.BENCH_CALLS[0] == 2
    path = Path(os.environ["TUNEHUB_CACHE_DIR"]) / "autotune" / f"{tuner.last_cache_key}.json"
    assert json.loads(path.read_text())["best_index"] in (0, 1)
    fresh = tt.autotune(configs=user_kernel.CONFIGS, key=["n"], do_bench=user_kernel.counting_bench)
    again = fresh(tuner.fn)
    call = again[lambda meta: (triton.cdiv(300, meta["BLOCK"]),)]
    x = torch.zeros(300)
    call(x, torch.empty(300), 300)
    assert again.sources == {"memory": 1}
    triton_autotune._MEMORY.clear()
    third = fresh(tuner.fn)
    third[lambda meta: (triton.cdiv(300, meta["BLOCK"]),)](x, torch.empty(300), 300)
    assert third.sources == {"disk": 1} and user_kernel.BENCH_CALLS[0] == 2
    assert third.best_config.kwargs == tuner.best_config.kwargs


def test_the_cache_key_changes_with_source_key_configs_and_triton_version(
    user_kernel: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    tuner = user_kernel.run(64)
    configs = user_kernel.CONFIGS

    def key(t: Any = tuner, n: int = 64, cfgs: list[Any] = configs) -> str:
        doc = t.key_document((n, "torch.float32", "torch.float32"), cfgs)
        return triton_autotune.sha256_key(doc)

    base = key()
    assert base == tuner.last_cache_key and key() == base
    assert key(n=65) != base
    assert key(cfgs=configs[:1]) != base
    assert key(cfgs=[configs[0], triton.Config({"BLOCK": 128}, num_warps=8)]) != base
    assert key(cfgs=[configs[0], triton.Config({"BLOCK": 128}, num_warps=4, maxnreg=128)]) != base

    @triton.jit
    def add_two(x_ptr, y_ptr, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 2, mask=mask)

    assert key(t=tt.autotune(configs=configs, key=["n"])(add_two)) != base
    monkeypatch.setattr(triton, "__version__", "9.9.9")
    assert key() != base


def test_autotune_tunes_locally_when_the_service_is_down(user_kernel: Any) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    fresh = tt.autotune(
        configs=user_kernel.CONFIGS,
        key=["n"],
        do_bench=user_kernel.counting_bench,
        url=dead,
        api_key="th_00000000_" + "x" * 43,
        timeout_secs=0.5,
    )(user_kernel.add_one.fn)
    start = time.monotonic()
    fresh[lambda meta: (triton.cdiv(50, meta["BLOCK"]),)](torch.zeros(50), torch.empty(50), 50)
    assert fresh.sources == {"benchmark": 1} and fresh.bench_runs == 2
    assert time.monotonic() - start < 30


@pytest.mark.slow
def test_a_second_process_gets_the_config_from_the_service_and_benchmarks_nothing(
    tmp_path: Path, user_kernel: Any
) -> None:
    kernel_dir = Path(user_kernel.__file__).parent
    with LiveServer(tmp_path / "server", TUNEHUB_RUN_JOBS="false") as server:

        def process(name: str, *, api_key: str = "") -> dict[str, Any]:
            env = {
                **os.environ,
                "PYTHONPATH": str(REPO),
                "TRITON_INTERPRET": "1",
                "TUNEHUB_URL": server.url,
                "TUNEHUB_API_KEY": api_key,
                # A cache directory of its own: only the service can tell it the answer.
                "TUNEHUB_CACHE_DIR": str(tmp_path / name),
            }
            result: dict[str, Any] = run_script(PROCESS, str(kernel_dir), "1000", env=env)
            return result

        first = process("first", api_key=server.key)
        assert first["bench_calls"] == 2 and first["sources"] == {"benchmark": 1}
        import httpx

        stored = httpx.get(f"{server.url}/api/v1/autotune/{first['cache_key']}").json()
        assert stored["best_config"]["kwargs"] == first["best"]
        second = process("second")
        assert second["bench_calls"] == 0 and second["sources"] == {"service": 1}
        assert second["best"] == first["best"] and second["cache_key"] == first["cache_key"]

        # The compiler integrations' lookups go through the same service: this host's CPU is
        # a target it knows, so the answer is the service's (untuned: its default tier).
        client = ScheduleClient(server.url, deadline_secs=10.0, cache_dir=tmp_path / "lookups")
        set_default_client(client)
        try:
            choice = CHOOSER.choose(Workload(m=48, n=40, k=24), local_cpu_target(), "blis.gemm")
        finally:
            set_default_client(None)
            client.close()
        assert choice.source in ("default", "predicted") and not choice.use_library
        assert choice.detail["fallback"] is False  # the service's answer, not the client's
        assert choice.detail["tuning_job_id"] is None

        # With tuning asked for (the backend's tune option) and a write key, the service
        # queues a job for the untuned shape; the answer does not wait for it.
        client = ScheduleClient(
            server.url, api_key=server.key, deadline_secs=10.0, cache_dir=tmp_path / "lk2"
        )
        set_default_client(client)
        CHOOSER.tune = True
        try:
            queued = CHOOSER.choose(Workload(m=50, n=40, k=24), local_cpu_target(), "blis.gemm")
        finally:
            CHOOSER.tune = False
            set_default_client(None)
            client.close()
        job_id = queued.detail["tuning_job_id"]
        assert job_id is not None
        job = httpx.get(f"{server.url}/api/v1/jobs/{job_id}").json()
        assert job["state"] == "queued" and job["workload"]["m"] == 50
