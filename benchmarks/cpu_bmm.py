"""Benchmark: blis.bmm tuned by tunehub against torch.bmm on this CPU, side by side (issue 24).

For each case (batched GEMMs of attention scores and values, a shared-weight broadcast B and
an odd shape) it tunes blis.bmm with a stated budget (the jobs' default strategy, no history),
then re-times the best config and ``torch.bmm`` alternately in the same sandbox worker, the
same way (fresh checked inputs, warm caches, one thread pinned, repeats until a minimum time),
``--rounds`` times each, and prints both medians, their ratio (torch time / tunehub time: above
1 is tunehub faster) and the geomean. JSON goes to benchmarks/results/.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/cpu_bmm.py
    .venv/bin/python benchmarks/cpu_bmm.py --quick   # two small cases, smoke test

The CPU is named in the output and the JSON (with torch's version and its MKL / oneDNN build
flags); OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are cleared in the command above so no library
runs a pinned older kernel, and the script warns when they are set.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tunehub.core import Budget, Config, MeasureRequest, MeasureStatus, Workload, local_cpu_target
from tunehub.core.job import DEFAULT_STRATEGY
from tunehub.db import MemoryScheduleStore
from tunehub.kernels.base import TimingPolicy
from tunehub.kernels.registry import get_template
from tunehub.tuner import Session, StaticHistory, StrategyContext, make_strategy
from tunehub.workers.local import LocalMeasurer

RESULTS = Path(__file__).resolve().parent / "results"
# (batch, m, n, k, b_broadcast, what)
CASES = [
    (16, 128, 128, 64, False, "scores Q.K^T, 16 heads x 128 tokens, head dim 64"),
    (16, 128, 64, 128, False, "values P.V, 16 heads x 128 tokens"),
    (8, 256, 256, 64, False, "scores, 8 heads x 256 tokens"),
    (8, 256, 64, 256, False, "values, 8 heads x 256 tokens"),
    (32, 64, 64, 64, False, "many small products"),
    (8, 64, 512, 512, True, "one shared weight (broadcast B)"),
    (6, 97, 80, 71, False, "odd shape"),
]
QUICK = [CASES[4], CASES[6]]


def side_by_side(
    measurer: LocalMeasurer, ours: MeasureRequest, theirs: MeasureRequest, rounds: int
) -> tuple[list[float], list[float], dict[str, Any]]:
    a: list[float] = []
    b: list[float] = []
    env: dict[str, Any] = {}
    for _ in range(rounds):
        for req, out in ((ours, a), (theirs, b)):
            (res,) = measurer.measure([req])
            if res.status is not MeasureStatus.OK or res.median_secs is None:
                raise RuntimeError(f"{req.template} {dict(req.config)}: {res.status} {res.error}")
            out.append(res.median_secs)
            if req is theirs:
                env = {k: v for k, v in res.environment.items() if k.startswith("torch")}
    return a, b, env


def run_case(
    case: tuple[int, int, int, int, bool, str],
    threads: int,
    args: argparse.Namespace,
    measurer: LocalMeasurer,
    confirm: LocalMeasurer,
) -> dict[str, Any]:
    batch, m, n, k, broadcast, what = case
    workload = Workload.from_dict(
        {"op": "bmm", "batch": batch, "m": m, "n": n, "k": k, "b_broadcast": broadcast}
    )
    return tune_and_compare(
        workload, what, "blis.bmm", "torch.bmm", threads, args, measurer, confirm
    )


def tune_and_compare(
    workload: Workload,
    what: str,
    template_name: str,
    baseline_name: str,
    threads: int,
    args: argparse.Namespace,
    measurer: LocalMeasurer,
    confirm: LocalMeasurer,
) -> dict[str, Any]:
    """Tune ``template_name`` for the workload at ``threads`` (``args``: trials, tune_secs,
    strategy, seed), then time its best and ``baseline_name`` alternately (``args.rounds``)."""
    target = local_cpu_target()
    template = get_template(template_name)
    baseline = get_template(baseline_name)
    space = template.space(workload, target).fix(threads=threads)
    prior = [c for c in template.seed_configs(workload, target) if space.is_valid(c)]
    history = StaticHistory([], workload, target, template.name, template.version)
    context = StrategyContext(
        space=space,
        workload=workload,
        target=target,
        template=template,
        history=history,
        seed=args.seed,
        prior=prior,
    )
    start = time.monotonic()
    session = Session(
        store=MemoryScheduleStore(),
        measurer=measurer,
        template=template,
        strategy=make_strategy(args.strategy, context),
        workload=workload,
        target=target,
        budget=Budget(max_trials=args.trials, max_secs=args.tune_secs),
        history=history,
        confirm_top=0,
    )
    result = session.run()
    tuning_secs = time.monotonic() - start
    if result.best is None:
        raise RuntimeError(f"{workload.label}: nothing measured ok")
    ours = MeasureRequest(workload, target, template.name, template.version, result.best.config)
    theirs = MeasureRequest(
        workload, target, baseline.name, baseline.version, Config({"threads": threads})
    )
    a, b, env = side_by_side(confirm, ours, theirs, args.rounds)
    ours_secs, theirs_secs = statistics.median(a), statistics.median(b)
    return {
        "case": workload.label,
        "what": what,
        "threads": threads,
        "tunehub_gflops": workload.gflops(ours_secs),
        "torch_gflops": workload.gflops(theirs_secs),
        "ratio": theirs_secs / ours_secs,
        "tunehub_medians": a,
        "torch_medians": b,
        "trials": result.trials_done,
        "tuning_secs": tuning_secs,
        "config": result.best.config.to_dict(),
        "torch": env,
    }


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def git_commit() -> str:
    repo = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        return ""
    return head


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=24)
    parser.add_argument("--tune-secs", type=float, default=120.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, nargs="*", default=[1])
    parser.add_argument("--strategy", default=DEFAULT_STRATEGY)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tune-min-secs", type=float, default=0.05)
    parser.add_argument("--confirm-min-secs", type=float, default=0.2)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    forced = {
        k: os.environ[k] for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE") if k in os.environ
    }
    if forced:
        print(f"# warning: {forced} set; run under `env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE`")
    target = local_cpu_target()
    print(f"# CPU: {target.name}, {target.cores} cores, flags {' '.join(target.arch)}")
    print(f"# {'case':<34} {'thr':>3} {'tunehub':>9} {'torch':>9} {'ratio':>6}  config")
    results = []
    with tempfile.TemporaryDirectory(prefix="tunehub-bmm-") as tmp:
        work = Path(tmp)
        with (
            LocalMeasurer(
                build_dir=work / "build", timing=TimingPolicy(min_secs=args.tune_min_secs)
            ) as measurer,
            LocalMeasurer(
                build_dir=work / "build", timing=TimingPolicy(min_secs=args.confirm_min_secs)
            ) as confirm,
        ):
            for threads in args.threads:
                for case in QUICK if args.quick else CASES:
                    r = run_case(case, threads, args, measurer, confirm)
                    results.append(r)
                    knobs = " ".join(f"{k}={v}" for k, v in r["config"].items())
                    print(
                        f"  {r['case']:<34} {threads:>3} {r['tunehub_gflops']:9.1f}"
                        f" {r['torch_gflops']:9.1f} {r['ratio']:6.2f}  {knobs}",
                        flush=True,
                    )
    summary = {}
    for threads in args.threads:
        ratios = [r["ratio"] for r in results if r["threads"] == threads]
        summary[f"threads={threads}"] = {"geomean_vs_torch": geomean(ratios), "min": min(ratios)}
        print(f"# threads={threads}: geomean {geomean(ratios):.3f}, min {min(ratios):.3f}")
    stamp = datetime.now(UTC)
    out = args.out or RESULTS / f"cpu_bmm-{platform.node()}-{stamp:%Y%m%dT%H%M}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "benchmark": "cpu_bmm",
                "date": stamp.isoformat(),
                "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
                "commit": git_commit(),
                "machine": {
                    "cpu": target.name,
                    "cores": target.cores,
                    "flags": list(target.arch),
                    "l2_bytes": target.l2_bytes,
                    "l3_bytes": target.l3_bytes,
                    "host": platform.node(),
                    "openblas_env": forced,
                    "loadavg": list(os.getloadavg()),
                },
                "budget": {"trials": args.trials, "tune_secs": args.tune_secs},
                "strategy": args.strategy,
                "summary": summary,
                "results": results,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"# wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
