"""Features, the XGBoost cost model and zero-trial picks, on the committed replay datasets."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import spearmanr

from tunehub.core import Config, Target, Workload
from tunehub.cost_model.base import CostModel
from tunehub.cost_model.features import (
    BLIS_NAMES,
    TRITON_NAMES,
    feature_set,
    generic_feature_set,
)
from tunehub.cost_model.predict import pick_config
from tunehub.cost_model.xgb import FeatureMismatch, XGBCostModel, group_records, normalised
from tunehub.kernels.registry import get_template
from tunehub.workers.replay import ReplayDataset, load_datasets

DATASETS = Path(__file__).resolve().parent.parent / "benchmarks" / "datasets" / "cpu"

H100 = Target(
    kind="cuda",
    name="NVIDIA H100 80GB HBM3",
    arch=("sm_90",),
    cores=132,
    properties={"smem_per_block_bytes": 232448},
)
CPU = Target(
    kind="cpu",
    name="x",
    arch=("avx2", "fma", "avx512f"),
    cores=2,
    l1d_bytes=32 << 10,
    l2_bytes=1 << 20,
    l3_bytes=32 << 20,
    machine="x86_64",
)


@pytest.fixture(scope="module")
def datasets() -> list[ReplayDataset]:
    found = load_datasets(DATASETS)
    assert len(found) >= 4, "the CPU replay datasets are committed under benchmarks/datasets"
    return found


def test_blis_features_cover_the_space_and_say_what_the_shape_wastes() -> None:
    template = get_template("blis.gemm")
    workload = Workload(m=127, n=5000, k=2048)
    points = list(template.space(workload, CPU).points)[:500]
    fs = feature_set("blis.gemm")
    x = fs.matrix(workload, CPU, points)
    assert x.shape == (len(points), len(BLIS_NAMES))
    assert np.isfinite(x).all()
    edge_m = x[:, fs.names.index("edge_m")]
    for config, waste in zip(points, edge_m, strict=True):
        mr = int(config["MR"])
        padded = -(-127 // mr) * mr
        assert waste == pytest.approx((padded - 127) / padded)
    # the shape's columns are the same on every row
    assert len(set(x[:, fs.names.index("log2_m")])) == 1


def test_triton_features_count_tiles_waves_and_shared_memory() -> None:
    fs = feature_set("triton.gemm")
    workload = Workload(m=1000, n=1000, k=4096, dtype="float16")
    configs = [
        Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8,
                "num_stages": 3, "SPLIT_K": 1, "variant": "tiled"}),
        Config({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 4,
                "num_stages": 4, "SPLIT_K": 4, "variant": "persistent"}),
    ]  # fmt: skip
    x = fs.matrix(workload, H100, configs)
    assert x.shape == (2, len(TRITON_NAMES)) and np.isfinite(x).all()
    col = {name: x[:, i] for i, name in enumerate(fs.names)}
    assert col["tiles"][0] == 8 * 8  # ceil(1000/128)^2
    assert col["tiles"][1] == 16 * 16 * 4
    assert col["pad_m"][0] == pytest.approx((1024 - 1000) / 1024)
    assert col["smem_per_block"][0] == pytest.approx(3 * (128 * 64 + 64 * 128) * 2 / 232448)
    assert col["k_iters"][1] == 4096 / 4 / 32
    assert col["variant_persistent"].tolist() == [0.0, 1.0]
    assert col["split_k_bytes_per_flop"][0] == 0 < col["split_k_bytes_per_flop"][1]


def test_triton_features_tell_one_kernel_split_k_from_two() -> None:
    fs = feature_set("triton.gemm")
    assert fs.version == 6
    workload = Workload(m=250, n=250, k=65536, dtype="float16")
    base = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 128, "GROUP_M": 1, "num_warps": 4,
            "num_stages": 5}  # fmt: skip
    configs = [
        Config({**base, "variant": "tiled", "SPLIT_K": 8}),
        Config({**base, "variant": "splitk", "SPLIT_K": 8}),
        Config({**base, "variant": "tiled", "SPLIT_K": 1}),
        Config({**base, "variant": "splitk_atomic", "SPLIT_K": 8}),
    ]
    x = fs.matrix(workload, H100, configs)
    col = {name: x[:, i] for i, name in enumerate(fs.names)}
    assert col["variant_splitk"].tolist() == [0.0, 1.0, 0.0, 0.0]
    assert col["variant_splitk_atomic"].tolist() == [0.0, 0.0, 0.0, 1.0]
    # The two-kernel split adds its reduce launch; the one-kernel splits reduce in their own.
    assert col["kernel_launches"].tolist() == [2.0, 1.0, 1.0, 1.0]
    # Both write 8 fp32 partials and read them back: the two-kernel split's workspace is
    # M x N, the one-kernel split's slots are whole tiles (250 padded to 256).
    flops = 2.0 * 250 * 250 * 65536
    assert col["split_k_bytes_per_flop"][1] == pytest.approx(8 * 256 * 256 * 8 / flops)
    assert col["split_k_bytes_per_flop"][0] == pytest.approx(8 * 250 * 250 * 8 / flops)
    assert col["split_k_bytes_per_flop"][2] == 0.0
    # The atomic split adds 8 partials into one C in L2, then reads and zeroes it once.
    assert col["split_k_bytes_per_flop"][3] == pytest.approx(10 * 250 * 250 * 4 / flops)
    # PAD_K adds one launch (its padding copy of A and B) where K's rows are unaligned.
    odd = Workload(m=100, n=300, k=777, dtype="float16", b_layout="col_major")
    plain = {**base, "variant": "tma", "SPLIT_K": 1, "FLATTEN": False}
    padded = fs.matrix(odd, H100, [Config({**plain, "PAD_K": p}) for p in (False, True)])
    launches = padded[:, fs.names.index("kernel_launches")].tolist()
    assert launches == [1.0, 2.0]


class _TimedModel(CostModel):
    """Predicts the times it is given: a config's ``us`` knob, in microseconds."""

    name = "timed"

    @property
    def trained(self) -> bool:
        return True

    def fit(self, records: object) -> None:
        return None

    def predict(self, workload: Workload, target: Target, configs: Sequence[Config]) -> list[float]:
        return [-float(c["us"]) for c in configs]

    def predict_secs(
        self, workload: Workload, target: Target, configs: Sequence[Config]
    ) -> list[float] | None:
        return [float(c["us"]) * 1e-6 for c in configs]


def test_the_default_is_taken_within_the_margin_of_the_models_choice() -> None:
    points = [Config({"us": us}) for us in (100, 104, 106)]
    workload = Workload(m=8, n=8, k=8)
    assert feature_set("triton.gemm").default_margin == 0.05
    assert feature_set("blis.gemm").default_margin == 0.0

    def pick(default_us: int, margin: float) -> Config:
        default = Config({"us": default_us})
        model = _TimedModel()
        found = pick_config(
            model, workload, CPU, points, consensus=1, default=default, default_margin=margin
        )
        return found.config

    # The argmax is the 100 us point; a default predicted 4% slower is taken with a 5% margin,
    # not without one, and one predicted 6% slower is not taken with it.
    assert pick(104, 0.05)["us"] == 104
    assert pick(104, 0.0)["us"] == 100
    assert pick(106, 0.05)["us"] == 100


def test_a_template_without_features_gets_generic_ones() -> None:
    fs = feature_set("toy.gemm", ["NR", "MR", "LOOP"])
    x = fs.matrix(Workload(m=8, n=8, k=8), CPU, [Config({"MR": 2, "NR": 4, "LOOP": "a"})])
    assert fs.names[-3:] == ("knob_LOOP", "knob_MR", "knob_NR")
    assert x[0, -2:].tolist() == [2.0, 4.0] and 0 <= x[0, -3] < 1
    assert fs.key == generic_feature_set("toy.gemm", ["MR"]).key


def test_targets_are_normalised_within_each_workload(datasets: list[ReplayDataset]) -> None:
    records = [r for d in datasets[:2] for r in d.records]
    groups = group_records(records)
    assert len(groups) == 2
    for group in groups:
        y = normalised(group.gflops)
        assert y.max() == pytest.approx(1.0) and (y >= 0).all()


def test_the_model_ranks_a_held_out_half_of_a_workload(datasets: list[ReplayDataset]) -> None:
    dataset = next(d for d in datasets if d.name == "skinny_m")
    train, test = dataset.records[::2], dataset.records[1::2]
    model = XGBCostModel("blis.gemm", objective="regression")
    assert not model.trained
    model.fit(train)
    assert model.trained and model.records_used == len(train) and model.workloads_used == 1
    (group,) = group_records(list(test))
    rho = spearmanr(model.predict(group.workload, group.target, group.configs),
                    normalised(group.gflops)).statistic  # fmt: skip
    assert rho > 0.6


def test_artifacts_round_trip_and_refuse_other_features(datasets: list[ReplayDataset]) -> None:
    model = XGBCostModel("blis.gemm", learn_secs=True, rounds=20, ensemble=2)
    model.fit([r for d in datasets for r in d.records])
    blob = model.to_bytes()
    loaded = XGBCostModel.from_bytes(blob, version="7")
    req = datasets[0].request
    configs = [r.config for r in datasets[0].records[:50]]
    assert loaded.version == "7"
    assert loaded.predict(req.workload, req.target, configs) == pytest.approx(
        model.predict(req.workload, req.target, configs)
    )
    secs = loaded.predict_secs(req.workload, req.target, configs)
    assert secs is not None and all(0 < s < 10 for s in secs)
    broken = blob.replace(b'"blis.gemm/1"', b'"blis.gemm/0"')
    with pytest.raises(FeatureMismatch):
        XGBCostModel.from_bytes(broken)


def test_pick_config_prefers_a_neighbour_winner_the_model_scores_as_high(
    datasets: list[ReplayDataset],
) -> None:
    model = XGBCostModel("blis.gemm", rounds=30)
    held_out, *rest = datasets
    model.fit([r for d in rest for r in d.records])
    req = held_out.request
    points = [r.config for r in held_out.records]
    consensus = model.features.consensus
    pick = pick_config(model, req.workload, req.target, points, consensus=consensus)
    assert pick.config in points and not pick.from_neighbour
    # a "winner" identical to the model's own choice keeps it; a worse one is not taken
    worst = min(points, key=lambda c: model.predict(req.workload, req.target, [c])[0])
    again = pick_config(
        model, req.workload, req.target, points, [worst, pick.config], consensus=consensus
    )
    assert again.config == pick.config
    # a consensus of one is the model's argmax
    scores = model.predict(req.workload, req.target, points)
    top = pick_config(model, req.workload, req.target, points, consensus=1)
    assert top.config == points[max(range(len(points)), key=lambda i: scores[i])]
    # the template's default is taken where the model scores it at least as high as the
    # consensus's medoid, and not where it scores it lower
    ranked = sorted(range(len(points)), key=lambda i: -scores[i])
    above = next(points[i] for i in ranked if scores[i] >= pick.score and points[i] != pick.config)
    below = points[ranked[-1]]
    assert (
        pick_config(
            model, req.workload, req.target, points, consensus=consensus, default=above
        ).config
        == above
    )
    assert (
        pick_config(
            model, req.workload, req.target, points, consensus=consensus, default=below
        ).config
        == pick.config
    )
