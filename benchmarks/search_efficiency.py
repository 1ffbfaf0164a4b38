"""Benchmark: how many trials each search strategy needs, replayed on measured spaces.

Every strategy runs the real tuning Session on every dataset of ``benchmarks/datasets/``
(the replay measurer answers from the dataset; the space is the template's space restricted
to the configs measured; the template's analytical default, which every dataset holds, is
each strategy's prior), with ``--seeds`` seeds. A run stops when it has measured the
dataset's best config (its best-so-far is then final) or at its trial cap. Printed per dataset
and overall: trials to reach 95% and 99% of the dataset's best (median and interquartile
range over seeds; runs that never got there count as "more than the cap"), a PNG of the
median best-so-far curves, and, for the global model (one per held-out workload, trained on
every other dataset of the same target family and template, as the registry would give a
job: ``model`` and ``transfer`` get it, ``model:online`` is ``model`` without it): its
Spearman correlation with
the measured throughput of the held-out workload, and the throughput of its zero-trial pick
(the config ``GET /api/v1/schedules/best`` would predict, among the configs the dataset
measured) as a fraction of the dataset's best. ``transfer`` sees the other datasets as the
fleet's history (never the held-out one).

    .venv/bin/python benchmarks/search_efficiency.py                   # everything, 20 seeds
    .venv/bin/python benchmarks/search_efficiency.py --seeds 3 --strategy random --strategy model
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # when loaded by path (the tests)
from cpu_gemm import git_commit

from tunehub.core import Budget, Config, MeasureRecord, Target, Workload
from tunehub.core.registry import UnknownName
from tunehub.cost_model.predict import pick_config
from tunehub.cost_model.registry import GLOBAL_ENSEMBLE
from tunehub.cost_model.xgb import XGBCostModel, group_records, normalised
from tunehub.db import MemoryScheduleStore
from tunehub.kernels.base import Template
from tunehub.kernels.registry import get_template
from tunehub.kernels.space import Knob, SearchSpace
from tunehub.tuner import Progress, Session, StaticHistory, StrategyContext, make_strategy
from tunehub.tuner.model_strategy import nearest_winners
from tunehub.workers.replay import ReplayDataset, ReplayMeasurer, load_datasets

ROOT = Path(__file__).resolve().parent
DATASETS = ROOT / "datasets"
RESULTS = ROOT / "results"
# "model:online" is ``model`` without the global model a job gets from the registry.
STRATEGIES = (
    "random", "exhaustive", "optuna.tpe", "optuna.cmaes", "model:online", "model", "transfer"
)  # fmt: skip
# Strategies that cost nothing per trial run until they find the best, others to the cap.
CHEAP = ("random", "exhaustive")
THRESHOLDS = (0.95, 0.99)


@dataclass(frozen=True)
class Run:
    dataset: str
    strategy: str
    seed: int
    curve: list[float]  # best-so-far GFLOP/s after each trial
    cap: int
    secs: float


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


# --- spaces ------------------------------------------------------------------------------
def template_of(dataset: ReplayDataset) -> Template | None:
    try:
        return get_template(dataset.request.template)
    except UnknownName:
        return None


# Each dataset's space, built once: every run of every strategy replays it, and enumerating a
# GPU template's space costs about 0.2 s of checks (most of the test's 36 s before).
_SPACES: dict[int, tuple[ReplayDataset, SearchSpace]] = {}


def dataset_space(dataset: ReplayDataset) -> SearchSpace:
    """The template's space restricted to the dataset's configs; a template this checkout
    does not have (a GPU dataset before its template lands) gets a space of the knob values
    the dataset holds, restricted the same way. Built once per dataset (read-only)."""
    kept = _SPACES.get(id(dataset))
    if kept is None or kept[0] is not dataset:
        kept = (dataset, _build_space(dataset))
        _SPACES[id(dataset)] = kept
    return kept[1]


def _build_space(dataset: ReplayDataset) -> SearchSpace:
    template = template_of(dataset)
    req = dataset.request
    if template is not None:
        return dataset.restricted(template.space(req.workload, req.target))
    names = sorted({name for r in dataset.records for name in r.config})
    knobs = []
    for name in names:
        values = {r.config[name] for r in dataset.records if name in r.config}
        knobs.append(Knob(name, tuple(sorted(values, key=lambda v: (str(type(v)), v)))))
    return dataset.restricted(SearchSpace(tuple(knobs)))


def dataset_prior(dataset: ReplayDataset, space: SearchSpace) -> list[Config]:
    template = template_of(dataset)
    if template is None:
        return []
    req = dataset.request
    default = template.default_config(req.workload, req.target)
    return [default] if space.is_valid(default) else []


def family(dataset: ReplayDataset) -> tuple[str, str]:
    req = dataset.request
    return (req.target.family_key, req.template)


def others(datasets: list[ReplayDataset], held_out: ReplayDataset) -> list[MeasureRecord]:
    """The fleet's history for ``held_out``: every other dataset of its family and template."""
    return [
        r
        for d in datasets
        if d.name != held_out.name and family(d) == family(held_out)
        for r in d.records
    ]


# --- one run -----------------------------------------------------------------------------
_DATASETS: list[ReplayDataset] = []
_GLOBAL: dict[str, XGBCostModel | None] = {}


def _init(datasets: list[ReplayDataset]) -> None:
    global _DATASETS
    _DATASETS = datasets


def global_model(dataset: ReplayDataset) -> XGBCostModel | None:
    """What the registry would give a job for ``dataset``'s workload: the family's global
    model trained on every other dataset (cached per process)."""
    if dataset.name not in _GLOBAL:
        train = others(_DATASETS, dataset)
        model = XGBCostModel(
            dataset.request.template,
            knob_names=dataset_space(dataset).names,
            ensemble=GLOBAL_ENSEMBLE,
        )
        if train:
            model.fit(train)
        _GLOBAL[dataset.name] = model if model.trained else None
    return _GLOBAL[dataset.name]


def run_one(task: tuple[str, str, int, int]) -> Run:
    name, label, seed, cap = task
    strategy, _, variant = label.partition(":")
    dataset = next(d for d in _DATASETS if d.name == name)
    req = dataset.request
    template = template_of(dataset)
    space = dataset_space(dataset)
    history = StaticHistory(
        others(_DATASETS, dataset), req.workload, req.target, req.template, req.template_version
    )
    context = StrategyContext(
        space=space,
        workload=req.workload,
        target=req.target,
        template=template or _ReplayOnlyTemplate(req.template, req.template_version),
        history=history,
        seed=seed,
        prior=dataset_prior(dataset, space),
        cost_model=None if variant == "online" else global_model(dataset),
    )
    best = dataset.best.gflops or 0.0
    curve: list[float] = []

    def progress(p: Progress) -> None:
        for record in p.last:
            if record.verdict:
                top = curve[-1] if curve else 0.0
                curve.append(max(top, record.gflops or 0.0))

    start = time.perf_counter()
    session = Session(
        store=MemoryScheduleStore(),
        measurer=ReplayMeasurer(dataset.records),
        template=context.template,
        strategy=make_strategy(strategy, context),
        workload=req.workload,
        target=req.target,
        budget=Budget(max_trials=cap, max_secs=3600.0),
        history=history,
        on_progress=progress,
        should_stop=lambda: bool(curve) and curve[-1] >= best,
        confirm_top=0,
    )
    session.run()
    return Run(name, label, seed, curve, cap, time.perf_counter() - start)


class _ReplayOnlyTemplate(Template):
    """Stands in for a template this checkout lacks: replay never builds or runs."""

    def __init__(self, name: str, version: int) -> None:
        self.name = name
        self.version = version

    def capabilities(self, target: Target) -> Any:
        raise NotImplementedError

    def space(self, workload: Workload, target: Target) -> SearchSpace:
        raise NotImplementedError

    def default_config(self, workload: Workload, target: Target) -> Config:
        raise NotImplementedError

    def build(self, request: Any, *, build_dir: Path) -> Any:
        raise NotImplementedError

    def run(self, request: Any, artifact: Any, *, timing: Any) -> Any:
        raise NotImplementedError


# --- figures -----------------------------------------------------------------------------
def trials_to(run: Run, fraction: float, best: float) -> float:
    """1-based trial at which best-so-far reached ``fraction`` of ``best``; inf if never."""
    for i, value in enumerate(run.curve):
        if value >= fraction * best:
            return float(i + 1)
    return math.inf


def quantiles(values: list[float]) -> tuple[float, float, float]:
    data = sorted(values)
    if not data:
        return (math.nan, math.nan, math.nan)
    q = np.quantile(np.array(data), [0.25, 0.5, 0.75], method="lower")
    return (float(q[0]), float(q[1]), float(q[2]))


def fmt(value: float, cap: int) -> str:
    return f">{cap}" if math.isinf(value) else f"{value:.0f}"


def global_model_figures(datasets: list[ReplayDataset]) -> dict[str, dict[str, float]]:
    """Leave-one-workload-out: Spearman and the zero-trial pick's share of the best."""
    from scipy.stats import spearmanr

    out: dict[str, dict[str, float]] = {}
    for dataset in datasets:
        train = others(datasets, dataset)
        if not train:
            continue
        req = dataset.request
        space = dataset_space(dataset)
        model = XGBCostModel(
            req.template, knob_names=space.names, learn_secs=True, ensemble=GLOBAL_ENSEMBLE
        )
        start = time.perf_counter()
        model.fit(train)
        fit_secs = time.perf_counter() - start
        (group,) = group_records(list(dataset.records))
        measured = normalised(group.gflops)
        predicted = model.predict(group.workload, group.target, group.configs)
        rho = float(spearmanr(predicted, measured).statistic)
        winners = nearest_winners(train, req.workload)
        # The analytical default, when the dataset measured it (the collectors measure every
        # seed config): the pick has to beat it to be worth a model. The pick weighs it as
        # the lookup does.
        template = template_of(dataset)
        default = template.default_config(req.workload, req.target) if template else None
        pick = pick_config(
            model,
            req.workload,
            req.target,
            list(space.points),
            winners,
            consensus=model.features.consensus,
            default=default,
            default_margin=model.features.default_margin,
        )
        measured_gflops = dataset.gflops()
        gflops = measured_gflops[pick.config.key]
        best = dataset.best.gflops or 1.0
        default_gflops = measured_gflops.get(default.key, math.nan) if default else math.nan
        secs = pick.predicted_secs
        out[dataset.name] = {
            "spearman": rho,
            "predicted_fraction_of_best": gflops / best,
            "default_fraction_of_best": default_gflops / best,
            "predicted_gflops": gflops,
            "predicted_secs": secs if secs is not None else math.nan,
            "measured_secs_of_pick": req.workload.flops / (gflops * 1e9) if gflops else math.nan,
            "fit_secs": fit_secs,
            "train_records": float(model.records_used),
        }
    return out


def plot(runs: list[Run], datasets: list[ReplayDataset], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 3
    rows = math.ceil(len(datasets) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    strategies = sorted({r.strategy for r in runs}, key=lambda s: STRATEGIES.index(s)
                        if s in STRATEGIES else 99)  # fmt: skip
    for ax, dataset in zip(axes.flat, datasets, strict=False):
        best = dataset.best.gflops or 1.0
        for strategy in strategies:
            mine = [r for r in runs if r.dataset == dataset.name and r.strategy == strategy]
            if not mine:
                continue
            horizon = max(r.cap for r in mine)
            curves = np.array(
                [[_at(r.curve, t) / best for t in range(horizon)] for r in mine], dtype=float
            )
            median = np.nanmedian(curves, axis=0)
            ax.plot(np.arange(1, horizon + 1), median, label=strategy)
        ax.set_xscale("log")
        ax.set_ylim(0.5, 1.01)
        ax.axhline(0.95, color="grey", lw=0.5, ls="--")
        ax.set_title(f"{dataset.name}: {dataset.request.workload.label}", fontsize=9)
        ax.set_xlabel("trials")
        ax.set_ylabel("best so far / dataset best")
    for ax in list(axes.flat)[len(datasets) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _at(curve: list[float], t: int) -> float:
    """Best-so-far after trial t+1; a run that stopped having found the best stays there."""
    if not curve:
        return math.nan
    return curve[t] if t < len(curve) else curve[-1]


# --- main --------------------------------------------------------------------------------
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", type=Path, default=DATASETS)
    parser.add_argument("--strategy", action="append", default=[], help="repeatable")
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--cap", type=int, default=200, help="trial cap of the costly ones")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes")
    parser.add_argument("--out", type=Path, default=None, help="JSON path")
    args = parser.parse_args()

    datasets = load_datasets(args.datasets)
    if not datasets:
        print(f"no datasets under {args.datasets}", file=sys.stderr)
        return 1
    strategies = args.strategy or list(STRATEGIES)
    tasks = []
    for dataset in datasets:
        size = len(dataset.records)
        for strategy in strategies:
            seeds = 1 if strategy == "exhaustive" else args.seeds
            cap = size if strategy in CHEAP else min(args.cap, size)
            tasks += [(dataset.name, strategy, seed, cap) for seed in range(seeds)]
    machine = cpu_model()
    command = " ".join([Path(sys.executable).name, *sys.argv])
    print(f"# {machine}; {len(datasets)} datasets, {len(tasks)} runs; {command}")
    start = time.time()
    if args.jobs <= 1:
        _init(datasets)
        runs = [run_one(task) for task in tasks]
    else:
        # fork before this process has started XGBoost's OpenMP threads (a forked child of a
        # process that has them can deadlock in libgomp)
        with multiprocessing.get_context("fork").Pool(
            args.jobs, initializer=_init, initargs=(datasets,)
        ) as pool:
            runs = list(pool.imap_unordered(run_one, tasks, chunksize=1))
    print(f"# replayed in {time.time() - start:.0f}s")

    report: dict[str, Any] = {
        "machine": machine,
        "command": command,
        "commit": git_commit(),
        "created_at": datetime.now(UTC).isoformat(),
        "seeds": args.seeds,
        "cap": args.cap,
        "datasets": {},
        "overall": {},
    }
    header = (
        f"{'dataset':>12} {'strategy':>13} "
        + " ".join(f"{'to ' + str(int(100 * f)) + '% (IQR)':>18}" for f in THRESHOLDS)
        + f" {'secs/run':>8}"
    )
    print(header)
    pooled: dict[str, dict[float, list[float]]] = {}
    for dataset in datasets:
        best = dataset.best.gflops or 1.0
        entry: dict[str, Any] = {
            "workload": dataset.request.workload.label,
            "target": dataset.request.target.label,
            "configs": len(dataset.records),
            "best_gflops": best,
            "strategies": {},
        }
        for strategy in strategies:
            mine = [r for r in runs if r.dataset == dataset.name and r.strategy == strategy]
            if not mine:
                continue
            cap = mine[0].cap
            stats: dict[str, Any] = {"runs": len(mine), "cap": cap}
            cells = []
            for f in THRESHOLDS:
                values = [trials_to(r, f, best) for r in mine]
                pooled.setdefault(strategy, {}).setdefault(f, []).extend(values)
                q1, med, q3 = quantiles(values)
                stats[f"to_{int(100 * f)}"] = {"median": med, "q1": q1, "q3": q3}
                cells.append(f"{fmt(med, cap)} ({fmt(q1, cap)}-{fmt(q3, cap)})")
            stats["secs_per_run"] = statistics.mean(r.secs for r in mine)
            entry["strategies"][strategy] = stats
            print(
                f"{dataset.name:>12} {strategy:>13} "
                + " ".join(f"{c:>18}" for c in cells)
                + f" {stats['secs_per_run']:8.2f}"
            )
        report["datasets"][dataset.name] = entry
    print("overall (every run of every dataset pooled):")
    for strategy, by_fraction in pooled.items():
        cells = []
        report["overall"][strategy] = {}
        for f in THRESHOLDS:
            q1, med, q3 = quantiles(by_fraction[f])
            report["overall"][strategy][f"to_{int(100 * f)}"] = {"median": med, "q1": q1, "q3": q3}
            cells.append(f"{fmt(med, args.cap)} ({fmt(q1, args.cap)}-{fmt(q3, args.cap)})")
        print(f"{'all':>12} {strategy:>13} " + " ".join(f"{c:>18}" for c in cells))
    if "random" in pooled:
        r95 = quantiles(pooled["random"][0.95])[1]
        for strategy in pooled:
            m95 = quantiles(pooled[strategy][0.95])[1]
            ratio = m95 / r95 if r95 and not math.isinf(r95) else math.nan
            report["overall"][strategy]["median_to_95_vs_random"] = ratio
        per_dataset = {
            s: [
                report["datasets"][d.name]["strategies"][s]["to_95"]["median"]
                / report["datasets"][d.name]["strategies"]["random"]["to_95"]["median"]
                for d in datasets
                if s in report["datasets"][d.name]["strategies"]
            ]
            for s in pooled
        }
        print("median trials to 95%, as a share of random's (per dataset; overall):")
        for s, ratios in per_dataset.items():
            overall = report["overall"][s]["median_to_95_vs_random"]
            print(f"  {s:>13}: " + " ".join(f"{x:.2f}" for x in ratios) + f"; {overall:.2f}")
            report["overall"][s]["to_95_vs_random_per_dataset"] = ratios

    figures = global_model_figures(datasets)
    report["global_model"] = figures
    if figures:
        print("global model, leave-one-workload-out:")
        for name, fig in figures.items():
            share = 100 * fig["predicted_fraction_of_best"]
            print(
                f"  {name:>12}: Spearman {fig['spearman']:.3f}; zero-trial pick "
                f"{fig['predicted_gflops']:.1f} GFLOP/s = {share:.1f}%"
                f" of best, default {100 * fig['default_fraction_of_best']:.1f}%"
                f" (predicted {fig['predicted_secs'] * 1e3:.3f} ms, measured "
                f"{fig['measured_secs_of_pick'] * 1e3:.3f} ms)"
            )
        rhos = [f["spearman"] for f in figures.values()]
        fractions = [f["predicted_fraction_of_best"] for f in figures.values()]
        with_default = [
            f for f in figures.values() if not math.isnan(f["default_fraction_of_best"])
        ]
        below = [
            name
            for name, f in figures.items()
            if f["predicted_fraction_of_best"] < f["default_fraction_of_best"]
        ]
        geomean = math.exp(statistics.fmean(math.log(f) for f in fractions if f > 0))
        report["global_model_summary"] = {
            "median_spearman": statistics.median(rhos),
            "median_predicted_fraction_of_best": statistics.median(fractions),
            "geomean_predicted_fraction_of_best": geomean,
            "min_predicted_fraction_of_best": min(fractions),
            "datasets_with_default": len(with_default),
            "pick_below_default": below,
        }
        print(
            f"  zero-trial pick: geomean {100 * geomean:.1f}% of best, min "
            f"{100 * min(fractions):.1f}%; below the default on {len(below)} of "
            f"{len(with_default)} datasets that measured it {below or ''}"
        )
        print(
            f"  median Spearman {statistics.median(rhos):.3f}; median zero-trial pick "
            f"{100 * statistics.median(fractions):.1f}% of best"
        )

    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M")
    host = platform.node() or "host"
    out = args.out or RESULTS / f"search_efficiency-{host}-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    png = out.with_suffix(".png")
    plot(runs, datasets, png, f"{machine}: median best-so-far over {args.seeds} seeds")
    report["png"] = png.name
    report["runs"] = [
        {"dataset": r.dataset, "strategy": r.strategy, "seed": r.seed, "curve": r.curve}
        for r in runs
    ]
    out.write_text(json.dumps(report, indent=1, allow_nan=True) + "\n")
    print(f"# wrote {out} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
