"""Benchmark: records per minute for one CPU job through the local measurer and through Ray.

The same job (``blis.gemm`` on one workload, the same configs in the same order: random
strategy, one seed, a fresh build dir each time so no run finds another's kernels cached) is
tuned by a Session three ways: with a LocalMeasurer in this process, and through a real local
Ray cluster (``ray.cluster_utils.Cluster``: a head and worker nodes, each its own processes)
with one and with two worker nodes, each node with its tunehub actor. Then the overhead Ray
adds per trial: ``bench.noop`` (builds and runs that cost nothing, see overhead_template.py)
through the local measurer and through one Ray actor; the difference of the median intervals
between stored results is what Ray adds.

    .venv/bin/python benchmarks/measure_throughput.py                 # 24 blis trials, 300 noop
    .venv/bin/python benchmarks/measure_throughput.py --trials 48 --noop-trials 500

On one machine the worker nodes share its cores (and the host-wide device lock), so a second
node adds actors but no cores: its figure shows what the extra hop costs, not a speed-up.
Goal (issue 13): Ray adds at most 10 ms per trial (median) to the local measurer.
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
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
# The sandboxes (here and on the Ray nodes, which inherit this environment) load bench.noop.
os.environ["TUNEHUB_TEMPLATE_MODULES"] = ",".join(
    filter(None, [os.environ.get("TUNEHUB_TEMPLATE_MODULES", ""), "overhead_template"])
)
os.environ["PYTHONPATH"] = os.pathsep.join(
    filter(None, [str(HERE), str(REPO), os.environ.get("PYTHONPATH", "")])
)

import overhead_template  # noqa: E402, F401 - registers bench.noop here
import ray  # noqa: E402
from cpu_gemm import git_commit  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from tunehub.core import Budget, JobSpec, Workload, local_cpu_target  # noqa: E402
from tunehub.db import MemoryScheduleStore  # noqa: E402
from tunehub.kernels.base import TimingPolicy  # noqa: E402
from tunehub.kernels.registry import get_template  # noqa: E402
from tunehub.tuner import Progress, Session, StrategyContext, make_strategy  # noqa: E402
from tunehub.workers.base import Measurer  # noqa: E402
from tunehub.workers.local import LocalMeasurer  # noqa: E402
from tunehub.workers.ray_measurer import RayCluster, node_resources  # noqa: E402

RESULTS = HERE / "results"
TIMING = TimingPolicy(min_secs=0.02, max_repeats=10)


def run_job(
    measurer: Measurer, template_name: str, workload: Workload, trials: int
) -> dict[str, Any]:
    """Tune ``trials`` configs with a Session on ``measurer``; wall time and result intervals."""
    template = get_template(template_name)
    target = local_cpu_target()
    store = MemoryScheduleStore()
    store.put_target(target)
    spec = JobSpec(
        workload=workload,
        target_key=target.target_key,
        template=template.name,
        strategy="random",
        budget=Budget(max_trials=trials, max_secs=3600),
    )
    job = store.create_job(spec, claimed=True, owner="measure-throughput")
    context = StrategyContext(
        space=template.space(workload, target), workload=workload, target=target,
        template=template, seed=0,
    )  # fmt: skip
    stamps: list[float] = []

    def progress(_: Progress) -> None:
        stamps.append(time.perf_counter())

    session = Session(
        store=store, measurer=measurer, template=template,
        strategy=make_strategy("random", context), workload=workload, target=target,
        budget=spec.budget, job_id=job.id, on_progress=progress, confirm_top=0,
    )  # fmt: skip
    start = time.perf_counter()
    result = session.run()
    wall = time.perf_counter() - start
    records = store.job_records(job.id)
    gaps = [b - a for a, b in pairwise(stamps)]  # the first one waits for sandboxes to start
    return {
        "trials": result.trials_done,
        "records": len(records),
        "ok": sum(1 for r in records if r.status.value == "ok"),
        "wall_secs": round(wall, 3),
        "records_per_min": round(60 * len(records) / wall, 2),
        "median_gap_ms": round(1e3 * statistics.median(gaps), 3) if gaps else None,
    }


def local(work: Path, name: str) -> LocalMeasurer:
    return LocalMeasurer(workdir=work / name, build_dir=work / name / "build", timing=TIMING)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=24, help="blis.gemm trials per run")
    parser.add_argument("--noop-trials", type=int, default=300, help="bench.noop trials per run")
    parser.add_argument("--size", type=int, default=96, help="m = n = k of the blis workload")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each, alternating")
    parser.add_argument("--note", default="", help="said in the results (e.g. machine load)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tunehub-throughput-"))
    workload = Workload(m=args.size, n=args.size, k=args.size)
    noop = Workload(m=64, n=64, k=64)
    target = local_cpu_target()
    print(f"# {target.label}; blis.gemm {workload.label}: {args.trials} trials per run; "
          f"bench.noop: {args.noop_trials}")  # fmt: skip
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, Any]]] = {}

    def show(name: str, r: dict[str, Any]) -> None:
        runs.setdefault(name, []).append(r)
        print(f"{name:>16} {r['records_per_min']:9.1f} rec/min  wall {r['wall_secs']:7.2f}s  "
              f"median gap {r['median_gap_ms']:8.2f} ms  ok {r['ok']}/{r['records']}",
              flush=True)  # fmt: skip

    jobs = {
        "blis": ("blis.gemm", workload, args.trials),
        "noop": ("bench.noop", noop, args.noop_trials),
    }

    def on_local(kind: str, tag: str) -> None:
        name, wl, trials = jobs[kind]
        with local(work, tag) as measurer:
            show(f"local {kind}", run_job(measurer, name, wl, trials))

    def on_ray(kind: str, nodes: int, tag: str) -> None:
        name, wl, trials = jobs[kind]
        build = work / tag / "build"  # fresh: no run finds another's kernels built
        rc = RayCluster(cluster.address, options={"timing": TIMING, "build_dir": build})
        try:
            rc.refresh()
            (pool,) = rc.pools.values()
            assert len(pool.slots) == nodes, f"{len(pool.slots)} actors for {nodes} nodes"
            show(f"ray x{nodes} {kind}", run_job(rc.measurer(target.target_key), name, wl, trials))
        finally:
            rc.close()

    # The cluster stays up through the local runs too (its idle processes cost both sides the
    # same), and the two alternate, which comes first changing each round: on a shared
    # machine the load drifts, and this keeps the drift out of the ratios.
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False}
    )
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        resources = node_resources(cpu=True, gpus=())
        cluster.add_node(num_cpus=1, resources=resources)
        cluster.wait_for_nodes()
        for rnd in range(args.rounds):
            for kind in ("blis", "noop"):
                order = [on_local, on_ray] if rnd % 2 == 0 else [on_ray, on_local]
                for how in order:
                    if how is on_local:
                        on_local(kind, f"local-{kind}-{rnd}")
                    else:
                        on_ray(kind, 1, f"ray1-{kind}-{rnd}")
        cluster.add_node(num_cpus=1, resources=resources)
        cluster.wait_for_nodes()
        for rnd in range(args.rounds):
            on_ray("blis", 2, f"ray2-blis-{rnd}")
    finally:
        ray.shutdown()
        cluster.shutdown()

    results = {
        name: {
            "records_per_min": statistics.median(r["records_per_min"] for r in found),
            "median_gap_ms": statistics.median(r["median_gap_ms"] for r in found),
            "runs": found,
        }
        for name, found in runs.items()
    }
    local_rate = results["local blis"]["records_per_min"]
    overhead_ms = results["ray x1 noop"]["median_gap_ms"] - results["local noop"]["median_gap_ms"]
    ratios = {
        "ray_x1_vs_local_records": round(results["ray x1 blis"]["records_per_min"] / local_rate, 3),
        "ray_x2_vs_local_records": round(results["ray x2 blis"]["records_per_min"] / local_rate, 3),
        "ray_overhead_ms_per_trial": round(overhead_ms, 3),
    }
    load_after = os.getloadavg()
    lines = [
        f"records/min, ray x1 / local: {ratios['ray_x1_vs_local_records']:.2f}",
        f"records/min, ray x2 / local: {ratios['ray_x2_vs_local_records']:.2f}",
        f"overhead Ray adds per trial (median gap, noop): {overhead_ms:.2f} ms (goal <= 10 ms)",
        f"load average before/after: {load_before[0]:.2f} / {load_after[0]:.2f}",
    ]
    for line in lines:
        print(f"# {line}")
    stamp = datetime.now(UTC)
    base = RESULTS / f"measure_throughput-{platform.node()}-{stamp:%Y%m%dT%H%M}"
    base.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": "measure_throughput",
        "date": stamp.isoformat(),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "commit": git_commit(),
        "machine": {"cpu": target.name, "cores": target.cores, "host": platform.node()},
        "ray": ray.__version__,
        "workload": workload.label,
        "trials": args.trials,
        "noop_trials": args.noop_trials,
        "rounds": args.rounds,
        "load_average": {"before": load_before, "after": load_after},
        "note": args.note,
        "results": results,
        "ratios": ratios,
        "goal_overhead_ms": 10.0,
    }
    base.with_suffix(".json").write_text(json.dumps(payload, indent=2))
    table = [
        f"{k:>16}: median of {len(v['runs'])} runs: {v['records_per_min']:.1f} records/min, "
        f"median gap {v['median_gap_ms']:.2f} ms; each: "
        + ", ".join(f"{r['records_per_min']:.0f}" for r in v["runs"])
        for k, v in results.items()
    ]
    head = f"# {target.label} ({target.cores} cores); {args.note}"
    text = "\n".join([head, *table, *(f"# {line}" for line in lines)])
    base.with_suffix(".txt").write_text(text + "\n")
    print(f"# wrote {base}.json and .txt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
