"""benchmarks/search_efficiency.py end to end, on small synthetic GPU datasets (``triton.gemm``
knobs, a template this checkout does not register): the path GPU datasets will take."""

from __future__ import annotations

import importlib.util
import itertools
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

from tunehub.core import (
    Config,
    MeasureRecord,
    MeasureRequest,
    MeasureResult,
    MeasureStatus,
    Target,
    Workload,
)
from tunehub.workers.replay import load_datasets, write_records

BENCHMARK = Path(__file__).resolve().parent.parent / "benchmarks" / "search_efficiency.py"
GPU = Target(kind="cuda", name="NVIDIA H100 80GB HBM3", arch=("sm_90",), cores=132)


def load_benchmark() -> Any:
    spec = importlib.util.spec_from_file_location("search_efficiency", BENCHMARK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["search_efficiency"] = module
    spec.loader.exec_module(module)
    return module


def synthetic(workload: Workload) -> list[MeasureRecord]:
    """A made-up but structured landscape: big tiles are fast until the grid under-fills
    the SMs; stages help; SPLIT_K helps only long K; some configs fail to compile."""
    out = []
    for bm, bn, bk, warps, stages, split in itertools.product(
        (64, 128, 256), (64, 128, 256), (32, 64), (4, 8), (2, 3, 4), (1, 2)
    ):
        config = Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8,
                         "num_warps": warps, "num_stages": stages, "SPLIT_K": split,
                         "variant": "tiled"})  # fmt: skip
        request = MeasureRequest(workload, GPU, "triton.gemm", 1, config)
        if bm * bn * stages >= 256 * 256 * 4:
            result = MeasureResult(MeasureStatus.BUILD_ERROR, error="out of shared memory")
        else:
            tiles = math.ceil(workload.m / bm) * math.ceil(workload.n / bn) * split
            fill = min(1.0, tiles / 132)
            eff = fill * (bm * bn) ** 0.25 / 16 * (1 + 0.1 * stages) * (1.2 if warps == 8 else 1)
            eff *= 1.3 if split > 1 and workload.k > 4 * workload.m else 1.0
            secs = workload.flops / (eff * 4e14)
            result = MeasureResult(MeasureStatus.OK, repeat_secs=(secs, secs * 1.01))
        out.append(MeasureRecord(request, result))
    return out


@pytest.fixture
def gpu_datasets(tmp_path: Path) -> Path:
    root = tmp_path / "datasets" / "gpu"
    root.mkdir(parents=True)
    for name, (m, n, k) in {
        "square": (2048, 2048, 2048),
        "small": (512, 512, 512),
        "long_k": (256, 256, 8192),
    }.items():
        write_records(
            root / f"{name}.jsonl.gz", synthetic(Workload(m=m, n=n, k=k, dtype="float16"))
        )
    return tmp_path / "datasets"


def test_the_benchmark_replays_gpu_datasets_before_their_template_lands(
    gpu_datasets: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert [d.name for d in load_datasets(gpu_datasets)] == ["long_k", "small", "square"]
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
    assert set(report["datasets"]) == {"long_k", "small", "square"}
    for entry in report["datasets"].values():
        assert set(entry["strategies"]) == {"random", "model", "transfer", "optuna.tpe"}
        assert entry["strategies"]["random"]["runs"] == 2
    assert set(report["global_model"]) == {"long_k", "small", "square"}
    for figures in report["global_model"].values():
        assert -1 <= figures["spearman"] <= 1 and 0 < figures["predicted_fraction_of_best"] <= 1
    assert report["overall"]["random"]["median_to_95_vs_random"] == 1.0
    assert report["machine"] and report["command"].startswith("python")
