"""The ``tunehub`` torch.compile backend on the CPU: GEMMs rewritten into tunehub ops that run
the generated blis.gemm kernel (built with a real C compiler), the rest through Inductor."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the gpu extra)")

import torch.nn.functional as F  # noqa: E402

from tests.live import run_script  # noqa: E402
from tunehub.client import set_default_client, torch_ops  # noqa: E402
from tunehub.client.gemm_choice import CHOOSER  # noqa: E402
from tunehub.client.torch_backend import REWRITES, tunehub_backend  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def isolated(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    # One build dir for the module's tests (kernels are built once), no service to ask.
    monkeypatch.setenv("TUNEHUB_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "th-cache"))
    # No service: the client answers from defaults (each test gets a client made afresh).
    monkeypatch.setenv("TUNEHUB_URL", "")
    set_default_client(None)
    torch._dynamo.reset()
    torch_ops.CALLS.clear()
    CHOOSER.clear()
    yield
    torch._dynamo.reset()
    CHOOSER.clear()
    set_default_client(None)


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(48, 96)
        self.fc2 = torch.nn.Linear(96, 64)
        self.fc3 = torch.nn.Linear(64, 10, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(x))
        h = F.gelu(self.fc2(h))
        return self.fc3(h).softmax(-1)


def test_mlp_equals_eager_and_runs_tunehubs_cpu_kernel() -> None:
    torch.manual_seed(0)
    model = MLP().eval()
    x = torch.randn(4, 9, 48)  # 3-D: nn.Linear over a batch of sequences (M = 36)
    with torch.no_grad():
        expected = model(x)
        compiled = torch.compile(model, backend=tunehub_backend)
        got = compiled(x)
        assert dict(REWRITES) == {"linear+relu": 1, "linear+gelu": 1, "linear": 1}
        assert torch_ops.CALLS["blis.gemm"] == 3 and torch_ops.CALLS["library"] == 0
        # The three shapes were looked up at compile time in one batch; the run asked nothing.
        assert CHOOSER.prefetched == 3 and CHOOSER.lookups["blis.gemm"] == 3
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
        got_again = compiled(x)
    assert torch_ops.CALLS["blis.gemm"] == 6  # every call runs the kernels, looked up once
    torch.testing.assert_close(got_again, expected, rtol=1e-5, atol=1e-6)
    assert CHOOSER.choose.__self__ is CHOOSER  # the process-wide memo the ops share


def test_mm_addmm_matmul_and_bmm_are_rewritten() -> None:
    def f(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        x = torch.addmm(bias, a, b)  # (20, 30)
        y = torch.relu(torch.mm(a, b))
        z = a @ b
        attn = torch.bmm(q, q.transpose(1, 2))  # (3, 7, 7)
        return x.sum() + y.sum() + z.sum() + attn.sum() + torch.addmm(bias, a, b, beta=2).sum()

    gen = torch.Generator().manual_seed(1)
    args = (
        torch.randn(20, 40, generator=gen),
        torch.randn(40, 30, generator=gen),
        torch.randn(30, generator=gen),
        torch.randn(3, 7, 16, generator=gen),
    )
    compiled = torch.compile(f, backend=tunehub_backend, options={"inductor": False})
    torch.testing.assert_close(compiled(*args), f(*args), rtol=1e-5, atol=1e-3)
    # beta=2 stays torch's: the kernel's epilogue adds the bias once.
    assert dict(REWRITES) == {"addmm": 1, "mm+relu": 1, "mm": 1, "bmm": 1}
    assert torch_ops.CALLS["blis.gemm"] == 3 + 3


def test_float64_runs_and_other_dtypes_are_left_to_torch() -> None:
    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ b

    a, b = torch.randn(9, 17, dtype=torch.float64), torch.randn(17, 5, dtype=torch.float64)
    compiled = torch.compile(f, backend=tunehub_backend, options={"inductor": False})
    torch.testing.assert_close(compiled(a, b), a @ b)
    assert torch_ops.CALLS["blis.gemm"] == 1
    torch._dynamo.reset()
    h = a.to(torch.bfloat16), b.to(torch.bfloat16)
    assert torch.equal(compiled(*h), f(*h))
    assert REWRITES == {}  # bf16 on CPU: no tunehub kernel, Inductor's graph as it was


def test_dynamic_shapes_compile_once_and_look_up_each_shape() -> None:
    compiles = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> object:
        compiles.append(1)
        return tunehub_backend(gm, example_inputs, options={"inductor": False})

    layer = torch.nn.Linear(24, 40)
    compiled = torch.compile(layer, backend=backend, dynamic=True)
    with torch.no_grad():
        for rows in (5, 11, 29):
            x = torch.randn(rows, 24)
            torch.testing.assert_close(compiled(x), layer(x), rtol=1e-5, atol=1e-5)
    assert len(compiles) == 1
    assert torch_ops.CALLS["blis.gemm"] == 3
    # Symbolic sizes: nothing to look up at compile time; each size once when it ran.
    assert CHOOSER.prefetched == 0 and CHOOSER.lookups["blis.gemm"] == 3


def test_training_graph_has_the_same_gradients() -> None:
    torch.manual_seed(2)
    model = MLP()
    x = torch.randn(6, 48)
    model(x).pow(2).sum().backward()
    expected = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad()
    compiled = torch.compile(model, backend=tunehub_backend, options={"inductor": False})
    compiled(x).pow(2).sum().backward()
    got = [p.grad for p in model.parameters() if p.grad is not None]
    assert torch_ops.CALLS["blis.gemm"] == 3
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)


def test_a_dead_service_costs_at_most_the_deadline_and_the_default_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import socket
    import time

    from tunehub.core import Workload, local_cpu_target

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    monkeypatch.setenv("TUNEHUB_URL", f"http://127.0.0.1:{port}")
    set_default_client(None)
    layer = torch.nn.Linear(20, 12)
    x = torch.randn(3, 20)
    compiled = torch.compile(layer, backend=tunehub_backend, options={"inductor": False})
    with torch.no_grad():
        got = compiled(x)
    torch.testing.assert_close(got, layer(x).detach(), rtol=1e-5, atol=1e-5)
    assert torch_ops.CALLS == {"blis.gemm": 1}
    (choice,) = CHOOSER._answers.values()
    assert choice.source == "default" and choice.detail["fallback"] is True
    # The lookup itself is bound by the client's deadline (50 ms; generous bound here for a
    # loaded machine), whatever the service does.
    start = time.monotonic()
    other = CHOOSER.choose(Workload(m=7, n=9, k=11), local_cpu_target(), "blis.gemm")
    assert time.monotonic() - start < 2.0
    assert other.detail["fallback"] is True and not other.use_library
    CHOOSER.clear()


def test_a_config_that_does_not_build_falls_back_to_the_default_then_runs() -> None:
    from tunehub.client.gemm_choice import GemmChoice, choice_key
    from tunehub.core import Config, Workload, local_cpu_target

    workload = Workload(m=7, n=13, k=11)
    target = local_cpu_target()
    bad = GemmChoice("blis.gemm", Config({"ISA": "avx9000"}), "exact")
    CHOOSER._answers[choice_key(workload, target, "blis.gemm")] = bad
    a, b = torch.randn(7, 11), torch.randn(11, 13)
    try:
        torch.testing.assert_close(torch.ops.tunehub.mm(a, b, None, "none"), a @ b)
        assert CHOOSER.choose(workload, target, "blis.gemm").source == "local-default"
        assert torch_ops.CALLS["blis.gemm"] == 1
    finally:
        CHOOSER.clear()


def test_the_backend_is_found_by_name_through_its_entry_point(tmp_path: Path) -> None:
    # The installed tunehub may predate the entry point: a distribution carrying exactly the
    # line pyproject.toml declares is put on the path of a fresh interpreter.
    import tomllib

    groups = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]
    value = groups["torch_dynamo_backends"]["tunehub"]
    dist = tmp_path / "tunehub_backend_probe-0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: tunehub-backend-probe\nVersion: 0\n"
    )
    (dist / "entry_points.txt").write_text(f"[torch_dynamo_backends]\ntunehub = {value}\n")
    script = textwrap.dedent(
        """
        import json, sys, torch
        sys.path.insert(0, sys.argv[1])
        layer = torch.nn.Linear(16, 8)
        x = torch.randn(5, 16)
        with torch.no_grad():
            out = torch.compile(layer, backend="tunehub")(x)
        from tunehub.client import torch_ops
        print(json.dumps({"calls": dict(torch_ops.CALLS),
                          "err": float((out - layer(x)).abs().max())}))
        """
    )
    result = _run_fresh(script, tmp_path, str(tmp_path))
    assert result["calls"] == {"blis.gemm": 1}
    assert result["err"] < 1e-5


def test_a_workload_the_template_does_not_run_gets_the_library_not_an_error() -> None:
    from tunehub.core import Workload, local_cpu_target

    # blis.gemm has no GELU epilogue: no default config either, so the library serves.
    choice = CHOOSER.choose(
        Workload(m=4, n=4, k=4, epilogue="bias_gelu"), local_cpu_target(), "blis.gemm"
    )
    assert choice.use_library and choice.source == "library-fallback"


def test_a_compile_records_where_its_time_went() -> None:
    from tunehub.client.torch_backend import COMPILE_SECS

    layer = torch.nn.Linear(16, 8)
    x = torch.randn(5, 16)
    with torch.no_grad():
        torch.compile(layer, backend=tunehub_backend)(x)
    assert set(COMPILE_SECS) == {"tunehub", "inductor"}
    assert all(secs > 0 for secs in COMPILE_SECS.values())


def test_a_graph_without_a_cpu_gemm_registers_no_cpu_ops(tmp_path: Path) -> None:
    # The CPU ops' registration is paid by the compiles that put them in a graph only.
    script = textwrap.dedent(
        """
        import json, torch
        from tunehub.client.torch_backend import tunehub_backend
        f = torch.compile(lambda x: torch.relu(x) * 2 + 1, backend=tunehub_backend)
        f(torch.randn(8, 8))
        registered = [name for name in ("linear", "mm", "bmm")
                      if hasattr(torch.ops.tunehub, name)]
        layer = torch.nn.Linear(16, 8)
        with torch.no_grad():
            torch.compile(layer, backend=tunehub_backend)(torch.randn(5, 16))
        print(json.dumps({"before": registered,
                          "after": hasattr(torch.ops.tunehub, "linear")}))
        """
    )
    assert _run_fresh(script, tmp_path) == {"before": [], "after": True}


def _run_fresh(script: str, tmp_path: Path, *args: str) -> dict[str, object]:
    """What ``script`` prints last (JSON), run in a fresh interpreter with no service."""
    import os

    env = {"TUNEHUB_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(REPO), "TUNEHUB_URL": ""}
    result: dict[str, object] = run_script(script, *args, env={**os.environ, **env})
    return result
