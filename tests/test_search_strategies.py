"""The model-guided and Optuna strategies, replayed on the committed CPU datasets."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tunehub.core import Budget, MeasureRecord, MeasureResult, MeasureStatus
from tunehub.cost_model.xgb import XGBCostModel
from tunehub.db import MemoryScheduleStore
from tunehub.kernels.registry import get_template
from tunehub.kernels.space import SearchSpace
from tunehub.tuner import Session, StaticHistory, StrategyContext, make_strategy, strategy_names
from tunehub.tuner.model_strategy import (
    ModelStrategy,
    SpaceIndex,
    TransferStrategy,
    nearest_winners,
    workload_distance,
)
from tunehub.workers.replay import ReplayDataset, ReplayMeasurer, load_datasets

DATASETS = Path(__file__).resolve().parent.parent / "benchmarks" / "datasets" / "cpu"
TEMPLATE = get_template("blis.gemm")


@pytest.fixture(scope="module")
def datasets() -> dict[str, ReplayDataset]:
    return {d.name: d for d in load_datasets(DATASETS)}


def context(
    dataset: ReplayDataset, others: list[ReplayDataset] = (), seed: int = 0, **kw: object
) -> StrategyContext:
    req = dataset.request
    space = dataset.restricted(TEMPLATE.space(req.workload, req.target))
    history = StaticHistory(
        [r for d in others for r in d.records],
        req.workload,
        req.target,
        req.template,
        req.template_version,
    )
    return StrategyContext(
        space=space,
        workload=req.workload,
        target=req.target,
        template=TEMPLATE,
        history=history,
        seed=seed,
        prior=[TEMPLATE.default_config(req.workload, req.target)],
        **kw,  # type: ignore[arg-type]
    )


def replay(dataset: ReplayDataset, strategy: str, trials: int, **kw: object) -> list[MeasureRecord]:
    ctx = context(dataset, **kw)  # type: ignore[arg-type]
    measurer = ReplayMeasurer(dataset.records)
    store = MemoryScheduleStore()
    Session(
        store=store,
        measurer=measurer,
        template=TEMPLATE,
        strategy=make_strategy(strategy, ctx),
        workload=ctx.workload,
        target=ctx.target,
        budget=Budget(max_trials=trials),
        confirm_top=0,
    ).run()
    keys = [r.config.key for r in measurer.requests]
    assert len(keys) == len(set(keys)), "a config was measured twice"
    assert all(ctx.space.is_valid(r.config) for r in measurer.requests), "an invalid point"
    return store.records_for(workload_key=ctx.workload.key, target_key=ctx.target.target_key)


def test_the_new_strategies_are_registered() -> None:
    assert {"model", "transfer", "optuna.tpe", "optuna.cmaes"} <= set(strategy_names())


@pytest.mark.parametrize("strategy", ["model", "transfer", "optuna.tpe", "optuna.cmaes"])
def test_strategies_measure_only_valid_unseen_points_and_improve(
    datasets: dict[str, ReplayDataset], strategy: str
) -> None:
    dataset = datasets["skinny_n"]
    others = [d for name, d in datasets.items() if name != "skinny_n"]
    records = replay(dataset, strategy, 40, others=others)
    assert len(records) == 40
    best = dataset.best.gflops or 0
    found = max(r.gflops or 0 for r in records)
    assert found >= 0.8 * best


def test_model_beats_random_on_a_hard_space(datasets: dict[str, ReplayDataset]) -> None:
    """skinny_m has one config within 95% of its best among 801: the model should get far
    closer in 60 trials than random does, on average over a few seeds."""
    dataset = datasets["skinny_m"]
    best = dataset.best.gflops or 1.0

    def mean_best(strategy: str) -> float:
        found = [
            max(r.gflops or 0 for r in replay(dataset, strategy, 60, seed=seed)) / best
            for seed in range(3)
        ]
        return sum(found) / len(found)

    assert mean_best("model") > mean_best("random") + 0.05


def test_transfer_starts_from_the_global_pick_the_default_and_the_nearest_winners(
    datasets: dict[str, ReplayDataset],
) -> None:
    held_out = datasets["square_512"]
    others = [d for name, d in datasets.items() if name != "square_512"]
    ctx = context(held_out, others)
    strategy = TransferStrategy(ctx)
    assert strategy.base is not None and strategy.base.trained
    winners = nearest_winners(ctx.history.similar(), ctx.workload)
    nearest = min(others, key=lambda d: workload_distance(d.request.workload, ctx.workload))
    assert winners[0] == nearest.best.config
    first = strategy.ask(5)
    assert all(ctx.space.is_valid(c) for c in first)
    # the global model's pick, then the template's analytical default, then the winners
    pick, _ = TransferStrategy(ctx)._transfer_seeds()
    assert pick is not None and first[0] == pick
    default = TEMPLATE.default_config(held_out.request.workload, held_out.request.target)
    assert first[1] == default or first[0] == default
    # the nearest winner is a point of another space: it is measured, or its nearest point
    index = SpaceIndex(ctx.space)
    moved = (
        winners[0] if ctx.space.is_valid(winners[0]) else index.points[index.nearest(winners[0])]
    )
    assert moved in first


def test_a_given_global_model_is_the_base_of_model(datasets: dict[str, ReplayDataset]) -> None:
    held_out = datasets["square_1024"]
    global_model = XGBCostModel("blis.gemm", rounds=30)
    global_model.fit([r for n, d in datasets.items() if n != "square_1024" for r in d.records])
    strategy = ModelStrategy(context(held_out, cost_model=global_model))
    assert strategy.base is global_model
    batch = strategy.ask(9)
    # the prior first, then the global model's ranking (no records yet)
    assert batch[0] == TEMPLATE.default_config(held_out.request.workload, held_out.request.target)
    assert len(batch) == 9


def test_batches_are_diverse_and_epsilon_explores(datasets: dict[str, ReplayDataset]) -> None:
    dataset = datasets["square_512"]
    global_model = XGBCostModel("blis.gemm", rounds=30)
    global_model.fit([r for n, d in datasets.items() if n != "square_512" for r in d.records])
    strategy = ModelStrategy(context(dataset, cost_model=global_model), epsilon=0.0)
    strategy.prior = []
    batch = strategy.ask(8)
    for i, a in enumerate(batch):
        for b in batch[:i]:
            assert sum(a[k] != b[k] for k in a) >= 2


def test_evolutionary_search_on_spaces_too_large_to_score_whole(
    datasets: dict[str, ReplayDataset],
) -> None:
    dataset = datasets["square_1024"]
    req = dataset.request
    full = TEMPLATE.space(req.workload, req.target).fix(threads=1)
    global_model = XGBCostModel("blis.gemm", rounds=30)
    global_model.fit([r for n, d in datasets.items() if n != "square_1024" for r in d.records])
    ctx = StrategyContext(
        space=full, workload=req.workload, target=req.target, template=TEMPLATE,
        cost_model=global_model, seed=1,
    )  # fmt: skip
    strategy = ModelStrategy(ctx, score_all_limit=100, epsilon=0.0)
    batch = strategy.ask(8)
    assert len(batch) == 8 and all(full.is_valid(c) for c in batch)
    # evolution climbs: its picks score above the space's median
    scores = global_model.predict(req.workload, req.target, batch)
    sample = full.sample(random.Random(0), 300)
    typical = sorted(global_model.predict(req.workload, req.target, sample))[150]
    assert min(scores) > typical


@pytest.mark.parametrize("strategy", ["model", "optuna.tpe"])
def test_machine_failures_release_configs(
    datasets: dict[str, ReplayDataset], strategy: str
) -> None:
    dataset = datasets["square_512"]
    made = make_strategy(strategy, context(dataset))
    (config,) = made.ask(1)
    failed = MeasureRecord(
        dataset.records[0].request.__class__(
            dataset.request.workload, dataset.request.target, "blis.gemm", 2, config
        ),
        MeasureResult(MeasureStatus.WORKER_ERROR, error="lost"),
    )
    made.tell([failed])
    assert not made.seen(config)


def test_optuna_suggestions_outside_the_space_never_reach_a_worker(
    datasets: dict[str, ReplayDataset],
) -> None:
    """In a space of a few hundred points among a product of thousands most of TPE's first
    suggestions are invalid: each becomes the nearest valid point instead."""
    dataset = datasets["long_k"] if "long_k" in datasets else datasets["square_512"]
    records = replay(dataset, "optuna.tpe", 30, seed=3)
    assert len(records) == 30


def test_space_index_finds_the_nearest_point() -> None:
    from tunehub.core import Config
    from tunehub.kernels.space import Knob

    space = SearchSpace(
        (Knob("MR", (2, 4, 8)), Knob("NR", (4, 8))),
        (lambda c: not (c["MR"] == 8 and c["NR"] == 8),),
    )
    index = SpaceIndex(space)
    assert index.points[index.nearest(Config({"MR": 8, "NR": 8}))] in (
        Config({"MR": 8, "NR": 4}),
        Config({"MR": 4, "NR": 8}),
    )
    assert index.points[index.nearest(Config({"MR": 64, "NR": 4}))] == Config({"MR": 8, "NR": 4})
    everything = {c.key for c in space.points}
    assert index.nearest(Config({"MR": 2, "NR": 4}), exclude=everything) == -1
