"""The GPU benchmark scripts' CPU-side logic, through their ``--dry-run`` modes: their own
``tunehub serve``, tuning and lookups, the worker processes, the tables and the JSON."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# find_spec, not an import: Triton imported in this process before the interpreter tests set
# TRITON_INTERPRET would leave their kernels compiled for a GPU (the scripts run in children).
if importlib.util.find_spec("torch") is None or importlib.util.find_spec("triton") is None:
    pytest.skip("torch and triton are not installed (the gpu extra)", allow_module_level=True)

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def run(script: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    # The services the dry runs start time each candidate for 0.02 s, not 0.2 s, as the tests'
    # own servers do (tests/live.py): no test here reads a time for what it is.
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "TUNEHUB_GPUS": "none",
        "TUNEHUB_MIN_REPEAT_SECS": "0.02",
    }
    return subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / script), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_autotune_share_dry_run_shows_a_second_process_benchmarking_nothing(
    tmp_path: Path,
) -> None:
    out = tmp_path / "autotune_share.json"
    done = run("autotune_share.py", "--dry-run", "--shape", "24x40x16", "--out", str(out))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "second process 0" in done.stdout
    result = json.loads(out.read_text())
    assert result["summary"] == {
        "first_bench_calls": 2,
        "second_bench_calls": 0,
        "same_configs": True,
    }
    second = next(p for p in result["processes"] if p["label"] == "tunehub second")
    assert second["rows"][0]["sources"] == {"service": 1}
    assert second["rows"][0]["rel_err"] < 1e-5


COMPILE_MODELS = ("--dry-run", "--models", "llama", "--cases", "decode")


@pytest.fixture(scope="module")
def tuned_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A benchmark home whose service tuned the dry run's GEMM shapes (``--tune-only``). The
    serial test below asks for it first, so its blis.gemm jobs time with the machine to
    themselves; the compiles that follow need no such quiet and run beside other tests."""
    home = tmp_path_factory.mktemp("compile-models-home")
    out = home / "tune.json"
    done = run("compile_models.py", *COMPILE_MODELS, "--home", str(home), "--tune-only",
               "--out", str(out))  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return home


def test_compile_models_dry_run_tunes_and_looks_up(tuned_home: Path) -> None:
    result = json.loads((tuned_home / "tune.json").read_text())
    assert [j["state"] for j in result["jobs"]] == ["succeeded"] * 4
    assert {a["answer"]["source"] for a in result["lookups"]} == {"exact"}
    assert result["runs"] == []


def test_compile_models_dry_run_times_with_the_tuned_answers(
    tuned_home: Path, tmp_path: Path
) -> None:
    out = tmp_path / "compile_models.json"
    done = run(
        "compile_models.py", *COMPILE_MODELS, "--home", str(tuned_home), "--skip-tune",
        "--contenders", "default,tunehub", "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert "jobs" not in result  # nothing tuned again
    runs = {r["contender"]: r for r in result["runs"]}
    assert runs["tunehub"]["tunehub"]["calls"]["blis.gemm"] > 0
    assert {v["source"] for v in runs["tunehub"]["tunehub"]["lookups"].values()} == {"exact"}
    assert runs["tunehub"]["rel_err"] < 1e-5 and runs["default"]["rel_err"] < 1e-5
    assert runs["default"]["kernels"]["library_mm"] > 0
    for contender in ("default", "tunehub"):  # each compile split at Inductor's compile_fx
        phases = runs[contender]["compile_phases"]
        assert phases["inductor"] > 0 and phases["to_inductor"] > 0
        assert sum(phases.values()) == pytest.approx(runs[contender]["compile_secs"], abs=0.01)
    row = result["summary"]["rows"]["llama/decode/launch"]
    assert row["tunehub_over_best_inductor"] > 0 and "compile_over_default" in row
    assert "geomean tunehub over the faster Inductor" in done.stdout


# What the GPU machine may lack: the benchmark must run with torch and triton alone.
BLOCK_SERVICE_PACKAGES = """
import importlib.abc, sys
BLOCKED = {"httpx", "httpcore", "pydantic", "pydantic_core", "sqlalchemy", "fastapi",
           "starlette", "uvicorn", "platformdirs", "alembic", "xgboost", "ray", "certifi"}
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is not installed here (blocked by the test)")
        return None
sys.meta_path.insert(0, Blocker())
"""


def test_matmul_overhead_runs_every_contender_with_torch_and_triton_only(tmp_path: Path) -> None:
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(BLOCK_SERVICE_PACKAGES)
    out = tmp_path / "matmul_overhead.json"
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}  # the script adds the repo
    blocked = subprocess.run([sys.executable, "-c", "import httpx"], env=env, capture_output=True)
    assert b"blocked by the test" in blocked.stderr
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "matmul_overhead.py"), "--interpret",
         "--sizes", "16x16x16,16x32x48", "--batch", "2", "--rounds", "1", "--calls", "2",
         "--out", str(out)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["all_correct"] and result["meets_target"] is None  # no verdict: interpreter
    for row in result["rows"]:
        assert row["config"]["variant"] and row["bitwise_equal_to_jit"]
        for name in ("tunehub", "launcher", "triton", "bind", "torch"):
            assert row[f"{name}_us"] > 0
        assert row["calls"] == {"triton.gemm": row["calls"]["triton.gemm"]}  # never the library


def test_compile_models_merges_a_runs_steps_into_one_summary(tmp_path: Path) -> None:
    def part(name: str, gpu: str, runs: list[dict[str, object]], **extra: object) -> Path:
        path = tmp_path / name
        path.write_text(json.dumps({"machine": {"gpu": gpu}, "runs": runs, **extra}))
        return path

    def timed(model: str, contender: str, ms: float, warm: float = 0.0) -> dict[str, object]:
        return {"model": model, "case": "b1", "contender": contender, "launch_ms": ms,
                "graph_ms": None, "compile_secs": 2.0, "warm_compile_secs": warm}  # fmt: skip

    tune = part("tune.json", "H200", [], lookups=[{"answer": "tuned"}], tuning_secs=9.0)
    gpt2 = part("gpt2.json", "H200",
                [timed("gpt2", "default", 1.0, 1.0), timed("gpt2", "tunehub", 0.8, 1.2)],
                lookups=[{"answer": "repeated"}])  # fmt: skip
    vit = part("vit.json", "H200", [timed("vit", "default", 2.0), timed("vit", "tunehub", 2.5)])
    out = tmp_path / "merged.json"
    done = run("compile_models.py", "--merge", str(tune), str(gpt2), str(vit), "--out", str(out))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    merged = json.loads(out.read_text())
    assert merged["lookups"] == [{"answer": "tuned"}] and merged["tuning_secs"] == 9.0
    assert [r["from"] for r in merged["runs"]] == ["gpt2.json"] * 2 + ["vit.json"] * 2
    rows = merged["summary"]["rows"]
    assert rows["gpt2/b1/launch"]["tunehub_over_best_inductor"] == pytest.approx(1.25)
    assert rows["vit/b1/launch"]["tunehub_over_best_inductor"] == pytest.approx(0.8)
    assert merged["summary"]["geomean_tunehub_over_best_inductor"] == pytest.approx(1.0)
    # The second runs' compiles (--warm) where both contenders have one: gpt2's only.
    assert rows["gpt2/b1/launch"]["warm_compile_over_default"] == pytest.approx(1.2)
    assert "warm_compile_over_default" not in rows["vit/b1/launch"]
    assert merged["summary"]["geomean_warm_compile_over_default"] == pytest.approx(1.2)

    other = part("h100.json", "H100", [timed("gpt2", "default", 1.0)])
    refused = run("compile_models.py", "--merge", str(gpt2), str(other), "--out", str(out))
    assert refused.returncode != 0 and "different GPUs" in refused.stderr


def test_compile_models_summary_sets_the_inline_compile_beside_the_route() -> None:
    """``tunehub-inline`` (the backend with ``compile_aside`` off) is summarised beside
    tunehub: its compile over the default's (medians), never in tunehub's place."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import compile_models

    def run_of(contender: str, compile_secs: float) -> dict[str, object]:
        return {"model": "vit", "case": "b64", "contender": contender,
                "compile_secs": compile_secs, "launch_ms": 2.0}  # fmt: skip

    runs = [run_of("default", 5.0), run_of("tunehub", 5.5)]
    summary = compile_models.summarize(
        [*runs, run_of("tunehub-inline", 7.0), run_of("tunehub-inline", 6.0)]
    )
    row = summary["rows"]["vit/b64/launch"]
    assert row["compile_over_default"] == pytest.approx(1.1)
    assert row["inline_compile_over_default"] == pytest.approx(1.3)
    assert summary["geomean_compile_over_default"] == pytest.approx(1.1)


def test_compile_models_kernel_times_are_one_steps_in_launch_order() -> None:
    """``--kernel-times``: the profiled steps' kernels as one step's, each position's median
    time, in launch order; steps that launched other kernels are said so, not averaged."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import compile_models

    # Three steps of (mm, add), listed out of order as a profiler may give them.
    kernels = [("add", 15.0, 2.0), ("mm", 0.0, 10.0), ("mm", 20.0, 12.0), ("add", 5.0, 3.0),
               ("mm", 10.0, 11.0), ("add", 25.0, 9.0)]  # fmt: skip
    assert compile_models.kernels_per_step(kernels, 3) == [["mm", 11.0], ["add", 3.0]]
    assert "not the same kernels" in str(compile_models.kernels_per_step(kernels[:5], 3))
    swapped = [*kernels[:5], ("copy", 25.0, 1.0)]
    assert "step 2 launched other kernels" in str(compile_models.kernels_per_step(swapped, 3))
    # The summary sets the steps' GPU time beside their plain-launch time (medians).
    steps = (("default", 1000.0), ("default", 1200.0), ("tunehub", 1000.0))
    runs = [{"model": "gpt2", "case": "b8", "contender": c, "launch_ms": 1.5,
             "compile_secs": 5.0, "kernel_us": [["mm", us], ["add", 100.0]]}
            for c, us in steps]  # fmt: skip
    row = compile_models.summarize(runs)["rows"]["gpt2/b8/launch"]
    assert row["gpu_ms"] == {"default": pytest.approx(1.2), "tunehub": pytest.approx(1.1)}
    assert row["tunehub_gpu_over_default"] == pytest.approx(1.2 / 1.1)


ATTENTION_SITES = r"""
import argparse, json, sys
import torch
sys.path.insert(0, "benchmarks")
import compile_models as cm
import tunehub.client.torch_backend as tb
from tunehub.client.torch_backend import attention_site

tb._DTYPES["cpu"] = ("float16",)  # the models in fp16 on this CPU, as on a GPU

args = argparse.Namespace(dry_run=True, layers=1, hidden=128, vocab=96, llama_hidden=256,
                          llama_mlp=64, llama_heads=2, llama_context=8, dtype="float16")
out = {}
for model, cases in cm.CASES.items():
    for case in cases:
        batch, seq = cm.case_shape(args, model, case)
        dims = cm.model_dims(args, model, case)
        dims.update({"hidden": args.llama_hidden} if model == "llama"
                    else {"hidden": args.hidden, "vocab": args.vocab})
        net = cm.make_model(model, dims, batch).eval().half()
        found = []

        def capture(gm, example_inputs):
            found.extend(s[0].key for n in gm.graph.nodes if (s := attention_site(n)))
            return gm.forward

        torch._dynamo.reset()
        with torch.no_grad():
            torch.compile(net, backend=capture)(torch.randn(batch, seq, dims["hidden"]).half())
        from tunehub.core import Workload
        planned = [Workload.from_dict(w).key for w in cm.attention_workloads(args, model, case)]
        out[f"{model}/{case}"] = [found, planned]
print(json.dumps(out))
"""


def test_compile_models_tunes_the_attention_the_backend_looks_up() -> None:
    """Each case's attention workload, as the benchmark tunes it, is the one the backend
    finds in that model's compiled graph (GPT-2 causal, ViT not, LLaMA's decode over its
    cache); the extras tune none."""
    done = subprocess.run(
        [sys.executable, "-c", ATTENTION_SITES], cwd=REPO, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    sites = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(sites) == 6
    for case, (found, planned) in sites.items():
        assert found and planned == found[:1], case  # one shape per case, every layer alike
    sys.path.insert(0, str(REPO / "benchmarks"))
    import compile_models

    assert compile_models.attention_workloads(None, "gpt2", "train-bf16") == []  # type: ignore[arg-type]
