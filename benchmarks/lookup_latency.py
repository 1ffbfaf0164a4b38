"""Benchmark: how long ``GET /api/v1/schedules/best`` takes when the cost model answers.

A SQLite database (as ``tunehub serve`` uses) gets the replay datasets' records as if measured
on this machine's CPU, and a global model trained on them is registered. Then the app
(through FastAPI's TestClient, in process: no network) is asked for ``--shapes`` shapes nobody
tuned: once each cold (the space is enumerated and scored, then cached), then ``--lookups``
times warm, round robin. Printed and written to benchmarks/results/: cold and warm latency
quantiles, and the warm ones of the lookup function alone (no HTTP).

    .venv/bin/python benchmarks/lookup_latency.py
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import random
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from fastapi.testclient import TestClient

from tunehub.core import Workload, local_cpu_target
from tunehub.cost_model.registry import ModelCache, train_global_model
from tunehub.db import SqlScheduleStore, upgrade
from tunehub.service.app import create_app
from tunehub.service.settings import Settings
from tunehub.tuner.lookup import find_schedule, predict_schedule
from tunehub.workers.replay import load_datasets

ROOT = Path(__file__).resolve().parent


def quantiles_ms(values: list[float]) -> dict[str, float]:
    data = np.array(values) * 1e3
    return {
        "p50_ms": float(np.quantile(data, 0.5)),
        "p90_ms": float(np.quantile(data, 0.9)),
        "p99_ms": float(np.quantile(data, 0.99)),
        "max_ms": float(data.max()),
        "mean_ms": float(data.mean()),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", type=int, default=20)
    parser.add_argument("--lookups", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    target = local_cpu_target()
    home = Path(tempfile.mkdtemp(prefix="tunehub-lookup-"))
    url = f"sqlite:///{home / 'tunehub.db'}"
    upgrade(url)
    store = SqlScheduleStore(url)
    records = [
        dataclasses.replace(r, request=dataclasses.replace(r.request, target=target))
        for d in load_datasets(ROOT / "datasets")
        for r in d.records
    ]
    store.commit_records(records)
    info = train_global_model(
        store, family_key=target.family_key, template="blis.gemm", template_version=2
    )
    if info is None:
        print("no model could be trained", file=sys.stderr)
        return 1
    rng = random.Random(0)
    shapes = [
        (rng.randrange(16, 4097), rng.randrange(16, 4097), rng.randrange(16, 4097))
        for _ in range(args.shapes)
    ]
    settings = Settings(home=home, run_jobs=False, train_models=False)
    cold: list[float] = []
    warm: list[float] = []
    with TestClient(create_app(settings, store=store)) as client:
        for m, n, k in shapes:
            start = time.perf_counter()
            answer = client.get("/api/v1/schedules/best", params={"m": m, "n": n, "k": k})
            cold.append(time.perf_counter() - start)
            assert answer.json()["source"] == "predicted", answer.text
        for i in range(args.lookups):
            m, n, k = shapes[i % len(shapes)]
            start = time.perf_counter()
            client.get("/api/v1/schedules/best", params={"m": m, "n": n, "k": k})
            warm.append(time.perf_counter() - start)
    models = ModelCache(store)
    direct: list[float] = []
    for m, n, k in shapes:  # warm the cache
        predict_schedule(store, Workload(m=m, n=n, k=k), target, models)
    for i in range(args.lookups):
        m, n, k = shapes[i % len(shapes)]
        workload = Workload(m=m, n=n, k=k)
        start = time.perf_counter()
        if find_schedule(store, workload, target) is None:
            predict_schedule(store, workload, target, models)
        direct.append(time.perf_counter() - start)
    machine = platform.processor() or platform.machine()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            machine = line.split(":", 1)[1].strip()
            break
    report = {
        "machine": machine,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "created_at": datetime.now(UTC).isoformat(),
        "store": "SqlScheduleStore on SQLite",
        "model": info.label,
        "model_records": info.records_used,
        "shapes": args.shapes,
        "lookups": args.lookups,
        "cold_http": quantiles_ms(cold),
        "warm_http": quantiles_ms(warm),
        "warm_function": quantiles_ms(direct),
    }
    for name in ("cold_http", "warm_http", "warm_function"):
        q = report[name]
        print(
            f"{name:>14}: p50 {q['p50_ms']:.2f} ms  p90 {q['p90_ms']:.2f} ms  "
            f"p99 {q['p99_ms']:.2f} ms  max {q['max_ms']:.2f} ms"
        )
    print(f"# {machine}; {report['store']}; model {info.label}; mean cold "
          f"{statistics.mean(cold) * 1e3:.0f} ms")  # fmt: skip
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M")
    out = args.out or ROOT / "results" / f"lookup_latency-{platform.node() or 'host'}-{stamp}.json"
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"# wrote {out}")
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
