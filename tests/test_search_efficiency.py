"""benchmarks/search_efficiency.py end to end, on small synthetic GPU datasets (``triton.gemm``
knobs, a template this checkout does not register): the path GPU datasets will take."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from tunehub.core import (
    Target,
)
from tunehub.workers.replay import load_datasets

REPO = Path(__file__).resolve().parents[1]

BENCHMARK = Path(__file__).resolve().parent.parent / "benchmarks" / "search_efficiency.py"
GPU = Target(kind="cuda", name="NVIDIA H100 80GB HBM3", arch=("sm_90",), cores=132)


def load_benchmark() -> Any:
    spec = importlib.util.spec_from_file_location("search_efficiency", BENCHMARK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["search_efficiency"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def gpu_datasets(tmp_path: Path) -> Path:
    """Three of the GPU replay datasets measured on the H100 (benchmarks/datasets/gpu)."""
    root = tmp_path / "datasets" / "gpu"
    root.mkdir(parents=True)
    for name in ("decode_16x4096x4096", "long_k_256x256x65536", "square_4096"):
        shutil.copyfile(REPO / "benchmarks" / "datasets" / "gpu" / f"{name}.jsonl.gz",
                        root / f"{name}.jsonl.gz")  # fmt: skip
    return tmp_path / "datasets"


def test_the_benchmark_replays_the_gpu_datasets(
    gpu_datasets: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = {"decode_16x4096x4096", "long_k_256x256x65536", "square_4096"}
    assert {d.name for d in load_datasets(gpu_datasets)} == names
    bench = load_benchmark()
    out = tmp_path / "results" / "se.json"
    argv = ["search_efficiency.py", "--datasets", str(gpu_datasets), "--seeds", "2",
            "--cap", "30", "--jobs", "1", "--out", str(out)]  # fmt: skip
    for strategy in ("random", "model", "transfer", "optuna.tpe"):
        argv += ["--strategy", strategy]
    monkeypatch.setattr(sys, "argv", argv)
    assert bench.main() == 0
    report = json.loads(out.read_text())
    assert out.with_suffix(".png").is_file()
    assert set(report["datasets"]) == names
    for entry in report["datasets"].values():
        assert set(entry["strategies"]) == {"random", "model", "transfer", "optuna.tpe"}
        assert entry["strategies"]["random"]["runs"] == 2
    assert set(report["global_model"]) == names
    for figures in report["global_model"].values():
        assert -1 <= figures["spearman"] <= 1 and 0 < figures["predicted_fraction_of_best"] <= 1
        # every collected dataset measured the template's default (a seed config)
        assert 0 < figures["default_fraction_of_best"] <= 1
    summary = report["global_model_summary"]
    assert summary["datasets_with_default"] == len(names)
    assert set(summary["pick_below_default"]) <= names
    assert report["overall"]["random"]["median_to_95_vs_random"] == 1.0
    assert report["machine"] and report["command"].startswith("python")
