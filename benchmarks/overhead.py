"""Benchmark: tunehub's own time per trial, on a template whose build and run cost nothing.

A Session tunes ``bench.noop`` (see overhead_template.py) through the real pipeline: the
LocalMeasurer's build and run sandboxes, the host-wide locks, a store and a strategy. With
nothing to build or time, the interval between two stored results is the tuner's overhead
per trial (sandbox round trips, locking, the store's commit, ask/tell, bookkeeping). It
prints the median and 90th percentile over the trials of each store, and where the time goes
(the store's commits and the strategy's ask/tell, timed in place).

    .venv/bin/python benchmarks/overhead.py                  # 300 trials per store
    .venv/bin/python benchmarks/overhead.py --trials 1000 --strategy random

Goal (the pipeline issue): median at most 20 ms per trial.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the sandboxes import overhead_template from here too
os.environ["TUNEHUB_TEMPLATE_MODULES"] = ",".join(
    filter(None, [os.environ.get("TUNEHUB_TEMPLATE_MODULES", ""), "overhead_template"])
)

from cpu_gemm import git_commit  # noqa: E402

from tunehub.core import (  # noqa: E402
    Budget,
    JobSpec,
    MeasureRecord,
    Workload,
    local_cpu_target,
)
from tunehub.db import MemoryScheduleStore, ScheduleStore, SqlScheduleStore, upgrade  # noqa: E402
from tunehub.kernels.base import TimingPolicy  # noqa: E402
from tunehub.kernels.registry import get_template  # noqa: E402
from tunehub.tuner import Progress, Session, StrategyContext, make_strategy  # noqa: E402
from tunehub.workers.local import LocalMeasurer  # noqa: E402

RESULTS = HERE / "results"
WORKLOAD = Workload(m=64, n=64, k=64)


class Timed:
    """Accumulates the time spent in wrapped calls."""

    def __init__(self) -> None:
        self.secs = 0.0
        self.calls = 0

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.secs += time.perf_counter() - start
                self.calls += 1

        return timed


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(
    store: ScheduleStore, measurer: LocalMeasurer, trials: int, strategy: str
) -> dict[str, Any]:
    template = get_template("bench.noop")
    target = local_cpu_target()
    store.put_target(target)
    spec = JobSpec(
        workload=WORKLOAD,
        target_key=target.target_key,
        template=template.name,
        strategy=strategy,
        budget=Budget(max_trials=trials, max_secs=3600),
    )
    job = store.create_job(spec, claimed=True, owner="overhead-benchmark")
    context = StrategyContext(
        space=template.space(WORKLOAD, target),
        workload=WORKLOAD,
        target=target,
        template=template,
        seed=0,
        prior=template.seed_configs(WORKLOAD, target),
    )
    chosen = make_strategy(strategy, context)
    commits, asks, tells = Timed(), Timed(), Timed()
    store.commit_records = commits.wrap(store.commit_records)  # type: ignore[method-assign]
    chosen.ask = asks.wrap(chosen.ask)  # type: ignore[method-assign]
    chosen.tell = tells.wrap(chosen.tell)  # type: ignore[method-assign]
    stamps: list[float] = []

    def progress(_: Progress) -> None:
        stamps.append(time.perf_counter())

    session = Session(
        store=store,
        measurer=measurer,
        template=template,
        strategy=chosen,
        workload=WORKLOAD,
        target=target,
        budget=spec.budget,
        job_id=job.id,
        on_progress=progress,
        confirm_top=0,
    )
    start = time.perf_counter()
    result = session.run()
    wall = time.perf_counter() - start
    # The first interval includes starting the sandboxes: leave it out.
    gaps = [b - a for a, b in pairwise(stamps)]
    records: list[MeasureRecord] = store.job_records(job.id)
    return {
        "trials": result.trials_done,
        "records": len(records),
        "wall_secs": wall,
        "median_ms": 1e3 * statistics.median(gaps),
        "p90_ms": 1e3 * percentile(gaps, 0.9),
        "mean_ms": 1e3 * statistics.fmean(gaps),
        "per_trial_ms": {
            "store_commit": 1e3 * commits.secs / max(1, result.trials_done),
            "strategy_ask": 1e3 * asks.secs / max(1, result.trials_done),
            "strategy_tell": 1e3 * tells.secs / max(1, result.trials_done),
        },
    }


def stores(work: Path, pg_url: str | None) -> list[tuple[str, Callable[[], ScheduleStore]]]:
    def sqlite() -> ScheduleStore:
        url = f"sqlite:///{work / 'overhead.db'}"
        upgrade(url)
        return SqlScheduleStore(url)

    found: list[tuple[str, Callable[[], ScheduleStore]]] = [
        ("memory", MemoryScheduleStore),
        ("sqlite", sqlite),
    ]
    if pg_url:

        def postgres() -> ScheduleStore:
            upgrade(pg_url)
            return SqlScheduleStore(pg_url)

        found.append(("postgresql", postgres))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--strategy", default="random")
    parser.add_argument(
        "--pg-url", default=None, help="also a PostgreSQL database (it gets tunehub's tables)"
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tunehub-overhead-"))
    target = local_cpu_target()
    print(f"# {target.label}; {args.trials} trials of bench.noop per store, {args.strategy}")
    print(f"{'store':>11} {'median ms':>10} {'p90 ms':>8} {'commit':>8} {'ask':>6} {'tell':>6}")
    results = {}
    for name, make in stores(work, args.pg_url):
        store = make()
        with LocalMeasurer(
            workdir=work / name, timing=TimingPolicy(min_secs=0.001, max_repeats=3)
        ) as measurer:
            r = run(store, measurer, args.trials, args.strategy)
        store.close()
        results[name] = r
        p = r["per_trial_ms"]
        print(
            f"{name:>11} {r['median_ms']:10.2f} {r['p90_ms']:8.2f} {p['store_commit']:8.2f}"
            f" {p['strategy_ask']:6.2f} {p['strategy_tell']:6.2f}",
            flush=True,
        )
    stamp = datetime.now(UTC)
    out = args.out or RESULTS / f"overhead-{platform.node()}-{stamp:%Y%m%dT%H%M}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "benchmark": "overhead",
                "date": stamp.isoformat(),
                "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
                "commit": git_commit(),
                "machine": {"cpu": target.name, "cores": target.cores, "host": platform.node()},
                "trials": args.trials,
                "strategy": args.strategy,
                "goal_ms": 20.0,
                "results": results,
            },
            indent=2,
        )
    )
    print(f"# goal: median <= 20 ms per trial; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
