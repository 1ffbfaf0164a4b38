"""``benchmarks/attention_gpu.py``'s pieces on the CPU under Triton's interpreter: its candidate
configs are ones the template's space holds on an H100 for the shapes they are meant for, the
plan puts the warp-specialised ones last, and a tiny shape is checked, "timed" (wall clock)
and summarised end to end into its JSON. The GPU timings themselves are the lead's to run."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the gpu extra)")
triton = pytest.importorskip("triton", reason="triton is not installed (the gpu extra)")

from tunehub.core import Config, Target, Workload  # noqa: E402
from tunehub.kernels import triton_attention_kernels as ak  # noqa: E402
from tunehub.kernels.registry import get_template  # noqa: E402

pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim:DeprecationWarning"
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import attention_gpu as bench  # noqa: E402

H100 = Target(
    kind="cuda",
    name="H100",
    arch=("sm_90",),
    cores=132,
    vendor="nvidia",
    properties={"compute_capability": 90, "smem_per_block_bytes": 232448, "regs_per_sm": 65536},
)


def test_every_candidate_is_in_the_templates_space_for_its_shapes() -> None:
    tmpl = get_template("triton.attention")
    for shape in bench.SHAPES:
        workload = Workload.from_dict(shape.workload_dict())
        names = bench.candidates_for(shape)
        for name in names:
            config = Config(bench.CONFIGS[name])
            assert tmpl.invalid_reason(workload, H100, config) is None, (shape.name, name)
            assert ak.config_problem(bench.CONFIGS[name]) is None
        assert len(names) >= (4 if shape.q_len <= 16 else 6), shape.name
    # Both head_dims, both masks and both dtypes are among the shapes.
    assert {(s.head_dim, s.causal) for s in bench.SHAPES} == {
        (64, False), (64, True), (128, False), (128, True)
    }  # fmt: skip
    assert {s.dtype for s in bench.SHAPES} == {"float16", "bfloat16"}


def test_the_plan_measures_sdpa_first_and_warp_specialised_kernels_last() -> None:
    shapes = bench.SHAPES[:2]
    skip = {(shapes[0].name, "tma-128x64-w8-s3")}
    plan = bench.plan(shapes, None, skip)
    items = [item for _, item in plan]
    assert plan[:4] == [(shapes[0].name, f"sdpa:{b}") for b in bench.SDPA_BACKENDS]
    first_ws = next(i for i, item in enumerate(items) if item.startswith("ws-"))
    assert all(item.startswith("ws-") for item in items[first_ws:])
    assert (shapes[0].name, "tma-128x64-w8-s3") not in plan
    assert (shapes[1].name, "tma-128x64-w8-s3") in plan


def test_a_tiny_shape_runs_end_to_end_under_the_interpreter(tmp_path: Path) -> None:
    out = tmp_path / "attention.json"
    names = "ptr-64x64-w4-s3,tma-128x64-w8-s3,ws-128x64-w4-s2"
    assert bench.main(["--interpret", "--candidates", names, "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    rows = {(r["shape"], r["item"]): r for r in report["results"]}
    for shape in bench.TINY_SHAPES:
        for name in bench.candidates_for(shape, names.split(",")):
            row = rows[(shape.name, name)]
            assert row["status"] == "ok", row
            assert 0 < row["relative_error"] < 3e-3 and row["median_ms"] > 0
        # cuDNN's attention has no CPU kernel: PyTorch's refusal, recorded, not a time.
        assert rows[(shape.name, "sdpa:cudnn")]["status"] == "invalid"
        assert rows[(shape.name, "sdpa:auto")]["status"] == "ok"
    summary = report["summary"]
    # A geomean for each candidate measured on every shape.
    assert set(summary["candidate_geomean_vs_best_sdpa"]) == set(names.split(","))
    assert summary["geomean_best_candidate_vs_best_sdpa"] > 0
    shape = summary["shapes"][bench.TINY_SHAPES[0].name]
    best = shape["best_candidate"]
    want = min(shape["sdpa_ms"].values()) / shape["candidates_ms"][best]
    assert math.isclose(shape["best_ratio"], want, abs_tol=5e-5)  # the JSON keeps 4 decimals


def test_a_wrong_kernel_is_a_wrong_answer_not_a_time() -> None:
    shape = bench.TINY_SHAPES[0]
    runner = bench.ShapeRunner(shape, torch.device("cpu"), bench.wall_timer)
    runner.ops.causal = not runner.ops.causal  # the kernel now masks what the reference does not
    row = runner.candidate("ptr-64x64-w4-s3")
    assert row["status"] == "wrong_answer" and "median_ms" not in row
    assert "relative error" in row["error"]
