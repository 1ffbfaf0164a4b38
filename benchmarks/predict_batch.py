"""Benchmark: the ``predicted`` tier's cost and quality (issue 27's target: a batch lookup of
1,000 never-seen shapes with a trained model in at most about a second on the 2-core VM).

The committed CPU datasets (``benchmarks/datasets/cpu``) go into an in-memory store and the
family's global model is trained as the service's trainer does. Then, on the datasets'
target:

- ``batch``: ``predict_schedules`` for 1,000 random never-seen shapes at once (the model
  loaded and the tuned set read first, as a running service has them), wall time;
- ``single``: 200 more shapes, one ``predict_schedule`` each, the time of each;
- ``quality``: on a sample of shapes, the model's predicted time of the cheap pick (a few
  candidates: ``tunehub.cost_model.predict.pick_many``) against that of the pick over the
  whole space (``pick_config`` on every point, what the tier did before) and against the best
  predicted time over the whole space. Predicted, not measured: what the model would answer.

    .venv/bin/python benchmarks/predict_batch.py                 # prints and writes results/
    .venv/bin/python benchmarks/predict_batch.py --shapes 100 --sample 5 --out /tmp/p.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # when loaded by path (the tests)
from cpu_gemm import git_commit

from tunehub.core import Workload
from tunehub.cost_model.predict import pick_config
from tunehub.cost_model.registry import ModelCache, train_global_model
from tunehub.db import MemoryScheduleStore
from tunehub.kernels.registry import get_template
from tunehub.tuner.lookup import LookupQuery, NeighbourIndex, predict_schedule, predict_schedules
from tunehub.workers.replay import load_datasets

ROOT = Path(__file__).resolve().parent
DATASETS = ROOT / "datasets" / "cpu"
RESULTS = ROOT / "results"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def shapes(rng: random.Random, count: int, seen: set[str]) -> list[Workload]:
    out: list[Workload] = []
    while len(out) < count:
        w = Workload(m=rng.randint(8, 8192), n=rng.randint(8, 8192), k=rng.randint(8, 8192))
        if w.key not in seen:
            seen.add(w.key)
            out.append(w)
    return out


def run(count: int, singles: int, sample: int, seed: int) -> dict[str, Any]:
    records = [r for d in load_datasets(DATASETS) for r in d.records]
    target = records[0].request.target
    template = get_template("blis.gemm")
    store = MemoryScheduleStore()
    store.commit_records(records)
    start = time.perf_counter()
    info = train_global_model(
        store,
        family_key=target.family_key,
        template=template.name,
        template_version=template.version,
    )
    train_secs = time.perf_counter() - start
    if info is None or not info.accepted:
        raise SystemExit(f"no accepted model: {info}")
    models, neighbours = ModelCache(store), NeighbourIndex(store)
    rng = random.Random(seed)
    seen = {r.request.workload.key for r in records}
    # The model loaded and the tuned set read, as a running service has them.
    predict_schedule(store, shapes(rng, 1, seen)[0], target, models, neighbours=neighbours)
    batch = [LookupQuery(w, target) for w in shapes(rng, count, seen)]
    start = time.perf_counter()
    answers = predict_schedules(store, batch, models, neighbours=neighbours)
    batch_secs = time.perf_counter() - start
    assert all(a is not None and a.source == "predicted" for a in answers)
    single_secs = []
    for w in shapes(rng, singles, seen):
        start = time.perf_counter()
        predict_schedule(store, w, target, models, neighbours=neighbours)
        single_secs.append(time.perf_counter() - start)
    single_secs.sort()
    model = models.model(info)
    assert model is not None
    rows: list[dict[str, Any]] = []
    for query, answer in list(zip(batch, answers, strict=True))[:sample]:
        assert answer is not None
        w = query.workload
        points = template.space(w, target).points
        start = time.perf_counter()
        full = pick_config(
            model,
            w,
            target,
            points,
            neighbours.winners(w, target, template),
            consensus=model.features.consensus,
            default=template.default_config(w, target),
            default_margin=model.features.default_margin,
        )
        full_secs = time.perf_counter() - start
        every = model.predict_secs(w, target, points)
        assert every is not None and full.predicted_secs and answer.predicted_secs
        rows.append(
            {
                "workload": w.label,
                "space_points": len(points),
                "full_space_secs": full_secs,
                "cheap_predicted_secs": answer.predicted_secs,
                "full_predicted_secs": full.predicted_secs,
                "best_predicted_secs": min(every),
                # Above 1: the cheap pick is predicted faster than the full-space pick.
                "cheap_vs_full": full.predicted_secs / answer.predicted_secs,
                "cheap_share_of_best": min(every) / answer.predicted_secs,
                "full_share_of_best": min(every) / full.predicted_secs,
                "same_config": full.config.key == answer.config.key,
            }
        )

    def geo(key: str) -> float:
        return math.exp(statistics.fmean(math.log(r[key]) for r in rows))

    return {
        "benchmark": "predict_batch",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "load_average_before": os.getloadavg(),
        "model": info.label,
        "train_secs": train_secs,
        "batch": {"shapes": count, "secs": batch_secs, "per_shape_ms": 1e3 * batch_secs / count},
        "single": {
            "shapes": singles,
            "median_ms": 1e3 * statistics.median(single_secs),
            "p99_ms": 1e3 * single_secs[min(len(single_secs) - 1, int(0.99 * len(single_secs)))],
        },
        "quality": {
            "sample": len(rows),
            "cheap_vs_full_geomean": geo("cheap_vs_full"),
            "cheap_vs_full_min": min(r["cheap_vs_full"] for r in rows),
            "cheap_within_5pct_of_full": sum(r["cheap_vs_full"] >= 0.95 for r in rows) / len(rows),
            "cheap_share_of_best_geomean": geo("cheap_share_of_best"),
            "full_share_of_best_geomean": geo("full_share_of_best"),
            "same_config": sum(r["same_config"] for r in rows) / len(rows),
            "full_space_secs_median": statistics.median(r["full_space_secs"] for r in rows),
            "rows": rows,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", type=int, default=1000)
    parser.add_argument("--singles", type=int, default=200)
    parser.add_argument("--sample", type=int, default=40)
    parser.add_argument("--seed", type=int, default=27)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = run(args.shapes, args.singles, args.sample, args.seed)
    q = out["quality"]
    print(
        f"{out['cpu']} ({out['cores']} cores, load {out['load_average_before'][0]:.1f}): "
        f"{out['batch']['shapes']} new shapes in {out['batch']['secs']:.3f} s "
        f"({out['batch']['per_shape_ms']:.2f} ms each); one at a time: median "
        f"{out['single']['median_ms']:.2f} ms, p99 {out['single']['p99_ms']:.2f} ms"
    )
    print(
        f"quality over {q['sample']} shapes (model-predicted times): cheap pick vs whole-space "
        f"pick {q['cheap_vs_full_geomean']:.3f} geomean (min {q['cheap_vs_full_min']:.3f}, "
        f"{100 * q['cheap_within_5pct_of_full']:.0f}% within 5%); share of the best predicted: "
        f"cheap {q['cheap_share_of_best_geomean']:.3f}, whole space "
        f"{q['full_share_of_best_geomean']:.3f}; the whole space took "
        f"{q['full_space_secs_median']:.3f} s a shape"
    )
    path = args.out or RESULTS / (
        f"predict_batch-vm-{datetime.now(UTC).strftime('%Y%m%dT%H%M')}.json"
    )
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
