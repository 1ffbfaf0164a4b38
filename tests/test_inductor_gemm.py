"""tunehub's answers inside Inductor's generated code (``tunehub.client.inductor_gemm``), on the
CPU: what each answer becomes, how Inductor's own lowering keys its GEMM sites (a real
Inductor compile with tunehub's choices handler installed), that the backend leaves what it
has no answer for exactly as Inductor compiles it, and an autocast training step through the
backend. The GPU side (the template and library candidates in generated code, the
``triton_op`` route) is checked on a GPU by benchmarks/inductor_route.py."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the gpu extra)")

import torch.nn.functional as F  # noqa: E402
from torch._inductor.compile_fx import compile_fx, compile_fx_inner  # noqa: E402
from torch._inductor.utils import run_and_get_code  # noqa: E402

from tunehub.client import inductor_gemm as ig  # noqa: E402
from tunehub.client import set_default_client  # noqa: E402
from tunehub.client.gemm_choice import CHOOSER, GemmChoice, choice_key  # noqa: E402
from tunehub.client.torch_backend import REWRITES, gemm_site, tunehub_backend  # noqa: E402
from tunehub.core import Config  # noqa: E402

TILED = {
    "variant": "tiled",
    "BLOCK_M": 128,
    "BLOCK_N": 64,
    "BLOCK_K": 32,
    "GROUP_M": 8,
    "SPLIT_K": 1,
    "num_warps": 4,
    "num_stages": 3,
}


@pytest.fixture(autouse=True)
def isolated(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    monkeypatch.setenv("TUNEHUB_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "th-cache"))
    monkeypatch.setenv("TUNEHUB_URL", "")
    set_default_client(None)
    torch._dynamo.reset()
    CHOOSER.clear()
    ig.SITES.clear()
    ig.DECISIONS.clear()
    yield
    torch._dynamo.reset()
    CHOOSER.clear()
    set_default_client(None)


def choice(config: dict[str, Any], source: str = "exact", library: bool = False) -> GemmChoice:
    return GemmChoice("triton.gemm", Config(config), source, use_library=library)


# --------------------------------------------------------------------------------------------
# What an answer becomes
# --------------------------------------------------------------------------------------------


def test_layouts_are_read_off_the_strides() -> None:
    assert ig.layout_of(64, 32, (32, 1)) == "row_major"
    assert ig.layout_of(64, 32, (1, 64)) == "col_major"  # an nn.Linear weight, transposed
    assert ig.layout_of(1, 32, (7, 1)) == "row_major"  # a size-1 dim's stride is free
    assert ig.layout_of(64, 32, (64, 1)) is None  # padded rows: not what was measured
    assert ig.layout_of(64, 32, (2, 128)) is None


def test_a_site_names_op_sizes_dtype_and_layouts_and_nothing_else_matches_it() -> None:
    site = ig.site_of(
        "addmm",
        (torch.float16, torch.float16, torch.float16),
        ((256,), (64, 32), (32, 256)),
        ((1,), (32, 1), (1, 32)),
    )
    assert site == ig.GemmSite("addmm", 64, 256, 32, "float16", "row_major", "col_major")
    assert site.key == "tunehub:addmm:64x256x32:float16:row_major:col_major"
    assert site.epilogue == "bias"
    others = {
        ig.site_of("mm", (torch.float16,) * 2, ((64, 32), (32, 256)), ((32, 1), (1, 32))),
        ig.site_of("addmm", (torch.bfloat16,) * 3, ((256,), (64, 32), (32, 256)),
                   ((1,), (32, 1), (1, 32))),
        ig.site_of("addmm", (torch.float16,) * 3, ((256,), (64, 32), (32, 256)),
                   ((1,), (32, 1), (256, 1))),
        ig.site_of("addmm", (torch.float16,) * 3, ((256,), (65, 32), (32, 256)),
                   ((1,), (32, 1), (1, 32))),
    }  # fmt: skip
    assert site.key not in {o.key for o in others if o is not None}
    assert len(others) == 4
    assert ig.site_of("baddbmm", (torch.float16,) * 2, ((2, 4, 8), (2, 8, 4)),
                      ((32, 8, 1),) * 2) is None  # fmt: skip
    assert ig.site_of("mm", (torch.int8,) * 2, ((4, 8), (8, 4)), ((8, 1), (4, 1))) is None
    assert ig.site_of("mm", (torch.float16, torch.float32), ((4, 8), (8, 4)),
                      ((8, 1), (4, 1))) is None  # fmt: skip


def test_a_bmm_site_names_its_batch_and_a_shared_b_and_takes_dense_entries_only() -> None:
    f16 = (torch.float16,) * 2
    site = ig.site_of("bmm", f16, ((12, 128, 64), (12, 64, 128)), ((8192, 64, 1), (8192, 1, 64)))
    assert site == ig.GemmSite("bmm", 128, 128, 64, "float16", "row_major", "col_major", 12)
    assert site.key == "tunehub:bmm:12x128x128x64:float16:row_major:col_major"
    shared = ig.site_of("bmm", f16, ((12, 128, 64), (12, 64, 32)), ((8192, 64, 1), (0, 32, 1)))
    assert shared is not None and shared.b_broadcast
    assert shared.key == "tunehub:bmm:12bx128x32x64:float16:row_major:row_major"
    workload = shared.workload(allow_tf32=False)
    assert (workload.op, workload.param("batch")) == ("bmm", 12)
    assert workload.param("b_broadcast") is True
    # Entries apart (a slice of a bigger batch), or a 2-D operand: not what triton.bmm measured.
    assert ig.site_of("bmm", f16, ((12, 128, 64), (12, 64, 32)),
                      ((16384, 64, 1), (2048, 32, 1))) is None  # fmt: skip
    assert ig.site_of("bmm", f16, ((128, 64), (64, 32)), ((64, 1), (32, 1))) is None


def test_the_memo_keeps_a_bmms_batch_apart_from_another_batch_and_from_a_matmul() -> None:
    from tunehub.client.gemm_choice import choice_key
    from tunehub.core import Target

    target = Target(kind="cuda", name="H100", arch=("sm_90",), cores=132)
    sites = [ig.GemmSite("bmm", 64, 64, 32, "float16", "row_major", "row_major", batch)
             for batch in (4, 8)]  # fmt: skip
    keys = {choice_key(site.workload(False), target, "triton.bmm") for site in sites}
    plain = ig.GemmSite("mm", 64, 64, 32, "float16", "row_major", "row_major")
    keys.add(choice_key(plain.workload(False), target, "triton.bmm"))
    assert len(keys) == 3


def test_a_bmm_config_becomes_inductors_bmm_template_only_with_the_batch_outermost() -> None:
    bmm = {k: v for k, v in TILED.items() if k not in ("variant", "SPLIT_K")}
    site = ig.GemmSite("bmm", 128, 128, 64, "float16", "row_major", "col_major", 12)
    found = GemmChoice("triton.bmm", Config({**bmm, "BATCH_MAJOR": True}), "exact")
    decision = ig.decide(site, found)
    assert decision.kind == "template" and decision.kwargs["BLOCK_M"] == 128
    assert decision.kwargs["EVEN_K"] is True
    interleaved = GemmChoice("triton.bmm", Config({**bmm, "BATCH_MAJOR": False}), "exact")
    assert ig.decide(site, interleaved).kind == "inductor"
    tma = GemmChoice("triton.bmm", Config({**bmm, "BATCH_MAJOR": True, "TMA": True}), "exact")
    assert ig.decide(site, tma).kind == "inductor"  # persistent, TMA: not that template
    library = GemmChoice("triton.bmm", Config({}), "exact", use_library=True)
    assert ig.decide(site, library).kind == "aten"


def test_only_a_tiled_config_inductors_template_runs_becomes_its_kwargs() -> None:
    kwargs = ig.template_kwargs(TILED, k=96)
    assert kwargs == {
        "BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8,
        "num_warps": 4, "num_stages": 3, "EVEN_K": True,
    }  # fmt: skip
    assert ig.template_kwargs(TILED, k=100)["EVEN_K"] is False  # masked K loop
    for other in (
        {**TILED, "variant": "tma"},
        {**TILED, "variant": "persistent"},
        {**TILED, "SPLIT_K": 4},
        {**TILED, "BLOCK_M": 192},  # a composite tile (128 + 64 rows)
        {**TILED, "PAD_K": True},
        {k: v for k, v in TILED.items() if k != "num_stages"},
    ):
        assert ig.template_kwargs(other, k=96) is None, other


def test_each_answer_becomes_a_decision() -> None:
    site = ig.GemmSite("mm", 64, 256, 96, "float16", "row_major", "col_major")
    assert ig.decide(site, None).kind == "inductor"
    assert ig.decide(site, choice(TILED)).kind == "template"
    assert ig.decide(site, choice(TILED, "family")).kind == "template"
    assert ig.decide(site, choice(TILED, library=True)).kind == "aten"
    # A template's default or a model's guess is not something a compiler should take blindly.
    for source in ("predicted", "default", "local-default", "library-fallback"):
        assert ig.decide(site, choice(TILED, source)).kind == "inductor"
    assert ig.decide(site, choice({**TILED, "variant": "tma"})).kind == "inductor"
    decision = ig.decide(site, choice(TILED))
    assert ig.Decision.from_entry(decision.entry()) == decision


def test_tunehubs_own_kernels_are_offered_only_for_measured_wins_the_op_runs() -> None:
    site = ig.GemmSite("mm", 64, 64, 96, "float32", "row_major", "row_major")
    split = {**TILED, "SPLIT_K": 4}
    assert ig.kernel_config(choice(split), site) == split
    assert ig.kernel_config(choice({**TILED, "variant": "persistent"}), site) is not None
    assert ig.kernel_config(choice(TILED), site) is None  # Inductor's template runs it
    assert ig.kernel_config(choice(split, library=True), site) is None
    assert ig.kernel_config(choice(split, "predicted"), site) is None
    tma = {**TILED, "variant": "tma"}
    assert ig.kernel_config(choice(tma), site) == tma  # host descriptors, traced as metadata
    assert ig.kernel_config(choice({**TILED, "variant": "ws"}), site) is None
    assert ig.kernel_config(None, site) is None


def timed(config: dict[str, Any], secs: float | None) -> GemmChoice:
    """A measured win whose kernel ran ``secs`` (the schedule's time)."""
    return GemmChoice("triton.gemm", Config(config), "exact", detail={"median_secs": secs})


def test_an_answer_carries_its_kernels_time_confirmed_where_confirmed() -> None:
    from tunehub.client.gemm_choice import _from_answer
    from tunehub.client.schedules import ScheduleAnswer

    def answer(**schedule: Any) -> ScheduleAnswer:
        return ScheduleAnswer(config=TILED, template="triton.gemm", source="exact",
                              use_library=False, workload=(), target="t",
                              schedule=schedule)  # fmt: skip

    confirmed = answer(median_secs=2e-5, confirmed_median_secs=3e-5)
    assert _from_answer(confirmed, "triton.gemm").detail["median_secs"] == 3e-5
    assert _from_answer(answer(median_secs=2e-5), "triton.gemm").detail["median_secs"] == 2e-5
    service = {"config": TILED, "source": "exact", "median_secs": 4e-5}  # the API's JSON
    assert _from_answer(service, "triton.gemm").detail["median_secs"] == 4e-5


def test_plain_launch_takes_a_kernel_only_where_it_was_measured_to_hide_its_launch() -> None:
    site = ig.GemmSite("mm", 4096, 3072, 768, "float16", "row_major", "col_major")
    tma = {**TILED, "variant": "tma"}
    long_enough = ig.PLAIN_LAUNCH_MIN_SECS
    assert ig.kernel_config(timed(tma, long_enough), site, graphs=False) == tma
    assert ig.kernel_config(timed(tma, long_enough * 0.9), site, graphs=False) is None
    assert ig.kernel_config(timed(tma, None), site, graphs=False) is None  # no time: not known
    # Replayed as CUDA graphs, the launch costs nothing per step: any measured win.
    assert ig.kernel_config(timed(tma, long_enough * 0.1), site) == tma
    assert ig.kernel_config(timed(TILED, 1.0), site, graphs=False) is None  # the template's


def test_an_activation_after_an_addmm_is_in_its_measured_workload_not_in_its_key() -> None:
    plain = ig.GemmSite("addmm", 64, 96, 48, "float16", "row_major", "col_major")
    gelu = dataclasses.replace(plain, activation="gelu")
    relu = dataclasses.replace(plain, activation="relu")
    assert (plain.epilogue, gelu.epilogue, relu.epilogue) == ("bias", "bias_gelu", "bias_relu")
    assert gelu.workload(False).epilogue == "bias_gelu"
    # Inductor's lowering sees the addmm only: one key for all three.
    assert plain.key == gelu.key == relu.key


def test_sites_of_one_key_answered_apart_compile_as_inductor_would(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plain = ig.GemmSite("addmm", 64, 96, 48, "float16", "row_major", "col_major")
    gelu = dataclasses.replace(plain, activation="gelu")
    answers = {plain: choice(TILED, library=True), gelu: choice(TILED)}
    monkeypatch.setattr(ig, "lookup", lambda site, device: answers[site])
    monkeypatch.setattr(CHOOSER, "prefetch", lambda *args, **kwargs: 0)
    cpu = torch.device("cpu")
    assert ig.plan_table([gelu, gelu], cpu)[gelu.key][0]["template_id"] == "template"
    assert ig.plan_table([plain], cpu)[plain.key][0]["template_id"] == "aten"
    # The lowering cannot tell a GELU's addmm from a plain one of that shape: neither answer.
    (row,) = ig.plan_table([plain, gelu], cpu)[plain.key]
    assert row["template_id"] == "inductor" and "differently" in row["why"]


class GeluMLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(40, 48)
        self.down = torch.nn.Linear(48, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


def test_a_long_measured_kernel_runs_with_its_gelu_fused_in_plain_launch() -> None:
    from tunehub.client.gemm_choice import allow_tf32, device_target
    from tunehub.client.torch_backend import PLANNED, plan_cuda_gemms

    torch.manual_seed(5)
    model = GeluMLP().eval()
    x = torch.randn(4, 9, 40)
    target = device_target(x.device)
    persistent = {**TILED, "variant": "persistent", "BLOCK_M": 16, "BLOCK_N": 32}
    up = ig.GemmSite("addmm", 36, 48, 40, "float32", "row_major", "col_major", activation="gelu")
    down = ig.GemmSite("addmm", 36, 32, 48, "float32", "row_major", "col_major")
    for site, secs in ((up, 1e-3), (down, ig.PLAIN_LAUNCH_MIN_SECS / 4)):
        key = choice_key(site.workload(allow_tf32("float32", "cpu")), target, "triton.gemm")
        CHOOSER._answers[key] = timed(persistent, secs)

    def planned(kernels: str) -> tuple[torch.Tensor, list[Any]]:
        graphs: list[torch.fx.GraphModule] = []

        def backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
            plan_cuda_gemms(gm, kernels=kernels, devices=("cpu",))
            graphs.append(gm)
            return gm.forward  # the rewritten graph, run as is (the kernels interpreted)

        torch._dynamo.reset()
        with torch.no_grad():
            out = torch.compile(model, backend=backend)(x)
        return out, [n.target for n in graphs[0].graph.nodes]

    with torch.no_grad():
        expected = model(x)
    op = torch.ops.tunehub.triton_gemm.default
    out, targets = planned("long")  # plain launch: no CUDA graphs
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
    # The up projection and its GELU became one kernel call; the short down projection did
    # not (it stays Inductor's).
    assert targets.count(op) == 1 and F.gelu not in targets
    assert PLANNED[up.key] == "kernel" and PLANNED[down.key] == "inductor"
    out, targets = planned("all")  # replayed as CUDA graphs: every measured win
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
    assert targets.count(op) == 2 and F.gelu not in targets
    out, targets = planned("none")  # options={"tunehub_kernels": False}
    assert op not in targets and F.gelu in targets
    with pytest.raises(ValueError, match="kernels must be one of all, long, none"):
        plan_cuda_gemms(torch.fx.symbolic_trace(model), kernels="some")


def test_a_training_graph_measures_and_keeps_the_gemm_apart_from_its_activation() -> None:
    model = GeluMLP()
    x = torch.randn(4, 9, 40)
    sites: list[ig.GemmSite] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
        sites.extend(found[0] for n in gm.graph.nodes if (found := gemm_site(n)) is not None)
        return gm.forward

    torch.compile(model, backend=backend)(x).sum().backward()
    assert [s.epilogue for s in sites] == ["bias", "bias"]
    torch._dynamo.reset()
    sites.clear()
    with torch.no_grad():
        torch.compile(model, backend=backend)(x)
    assert [s.epilogue for s in sites] == ["bias_gelu", "bias"]


# --------------------------------------------------------------------------------------------
# A real Inductor compile with the handler
# --------------------------------------------------------------------------------------------


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(48, 96)
        self.fc2 = torch.nn.Linear(96, 64, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.fc1(x))
        y = self.fc2(h)
        return y + torch.mm(h.reshape(-1, 96), self.fc2.weight.t()).view_as(y)


def test_inductors_lowering_keys_its_sites_as_the_backend_plans_them() -> None:
    torch.manual_seed(0)
    model = MLP().eval()
    x = torch.randn(4, 9, 48)
    planned: set[str] = set()

    def backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
        for node in gm.graph.nodes:
            found = gemm_site(node)
            if found is not None:
                planned.add(found[0].key)
        return compile_fx(
            gm,
            list(example_inputs),
            inner_compile=ig.with_choices(compile_fx_inner, autotune_rest=False),
            # A cached graph is not lowered again: the handler would not be asked.
            config_patches={"fx_graph_cache": False},
        )

    with torch.no_grad():
        expected = model(x)
        out, codes = run_and_get_code(torch.compile(model, backend=backend), x)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    assert planned == {
        "tunehub:addmm:36x96x48:float32:row_major:col_major",
        "tunehub:mm:36x64x96:float32:row_major:col_major",
    }
    # Inductor's lowering met exactly those sites (the linear and the explicit mm of the same
    # shape are one site), and on a CPU kept what its default does.
    assert set(ig.SITES) == planned
    assert set(ig.SITES.values()) == {"inductor"}
    code = "\n".join(codes)
    assert "extern_kernels.addmm(" in code and "extern_kernels.mm(" in code


def test_inductors_bmm_lowering_keys_its_site_as_the_backend_plans_it() -> None:
    def f(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return torch.softmax(torch.bmm(q, k.transpose(1, 2)), -1)

    q, k = torch.randn(6, 40, 32), torch.randn(6, 24, 32)
    planned: set[str] = set()

    def backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
        for node in gm.graph.nodes:
            found = gemm_site(node)
            if found is not None:
                planned.add(found[0].key)
        return compile_fx(
            gm,
            list(example_inputs),
            inner_compile=ig.with_choices(compile_fx_inner, autotune_rest=False),
            config_patches={"fx_graph_cache": False},
        )

    out = torch.compile(f, backend=backend)(q, k)
    torch.testing.assert_close(out, f(q, k), rtol=1e-5, atol=1e-5)
    assert planned == {"tunehub:bmm:6x40x24x32:float32:row_major:col_major"}
    assert dict(ig.SITES) == dict.fromkeys(planned, "inductor")


def test_the_handler_outside_a_plan_leaves_inductors_candidates_alone() -> None:
    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.relu(a @ b)

    a, b = torch.randn(30, 20), torch.randn(20, 10)

    def backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
        return compile_fx(
            gm,
            list(example_inputs),
            inner_compile=ig.with_choices(compile_fx_inner, autotune_rest=False),
            # A cached graph is not lowered again: the handler would not be asked.
            config_patches={"fx_graph_cache": False},
        )

    _, plain = run_and_get_code(torch.compile(f), a, b)
    torch._dynamo.reset()
    got, handled = run_and_get_code(torch.compile(f, backend=backend), a, b)
    torch.testing.assert_close(got, f(a, b))

    def calls(code: str) -> list[str]:
        return sorted(line.strip().split("(")[0] for line in code.splitlines()
                      if "extern_kernels." in line and "import" not in line)  # fmt: skip

    assert calls("\n".join(handled)) == calls("\n".join(plain)) == ["extern_kernels.mm"]


# --------------------------------------------------------------------------------------------
# The backend
# --------------------------------------------------------------------------------------------


def test_gemms_the_backend_has_no_kernel_for_compile_as_inductor_does() -> None:
    def f(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return F.gelu(torch.addmm(bias, a, b)) @ b.t()

    args = (
        torch.randn(24, 40, dtype=torch.bfloat16),
        torch.randn(40, 40, dtype=torch.bfloat16),
        torch.randn(40, dtype=torch.bfloat16),
    )
    _, plain = run_and_get_code(torch.compile(f), *args)
    torch._dynamo.reset()
    got, ours = run_and_get_code(torch.compile(f, backend=tunehub_backend), *args)
    assert REWRITES == {}
    torch.testing.assert_close(got, f(*args), rtol=2e-2, atol=2e-2)

    def kernel_calls(code: str) -> list[str]:
        return [line.strip() for line in code.splitlines() if ".run(" in line or "extern_" in line]

    # Same kernels and calls; only the generated names may differ.
    assert len(kernel_calls("\n".join(ours))) == len(kernel_calls("\n".join(plain)))
    assert "tunehub" not in "\n".join(ours)


def test_an_autocast_training_step_through_the_backend_matches_eager() -> None:
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 16))
    x = torch.randn(8, 32)

    def step(fn: Any) -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = fn(x).float().pow(2).mean()
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    expected_loss, expected_grads = step(model)
    loss, grads = step(torch.compile(model, backend=tunehub_backend))
    # Under autocast the GEMMs run in bf16: Inductor's, not rewritten into fp32 kernels.
    assert REWRITES == {}
    torch.testing.assert_close(loss, expected_loss, rtol=2e-2, atol=2e-3)
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=5e-2, atol=5e-3)


def test_a_graph_that_convolves_is_seen_as_one() -> None:
    from tunehub.client.torch_backend import _has_convolution

    def conv(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, w).flatten(1) @ w.flatten(1).t()

    def plain(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x.flatten(1) @ w.flatten(1).t()

    assert _has_convolution(torch.fx.symbolic_trace(conv))
    assert not _has_convolution(torch.fx.symbolic_trace(plain))


def test_a_gemm_of_symbolic_sizes_gets_no_site_and_compiles_as_inductor_does() -> None:
    layer = torch.nn.Linear(24, 40)

    def backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
        return compile_fx(
            gm,
            list(example_inputs),
            inner_compile=ig.with_choices(compile_fx_inner, autotune_rest=False),
            # A cached graph is not lowered again: the handler would not be asked.
            config_patches={"fx_graph_cache": False},
        )

    compiled = torch.compile(layer, backend=backend, dynamic=True)
    with torch.no_grad():
        for rows in (5, 9, 13):
            x = torch.randn(rows, 24)
            torch.testing.assert_close(compiled(x), layer(x), rtol=1e-5, atol=1e-5)
    # One kernel serves every M: no config measured for one M is planned onto it.
    assert ig.SITES == {}
