"""Benchmark: how long ``GET /api/v1/schedules/best`` takes when the cost model answers.

A SQLite database (as ``tunehub serve`` uses) gets the replay datasets' records as if measured
on this machine's CPU, and a global model trained on them is registered. Then ``tunehub serve
--no-runner`` on that database, in its own process on a loopback port (``--server thread``:
uvicorn in a thread of this process instead, sharing its interpreter lock with the client), is
asked by one keep-alive HTTP client (TCP_NODELAY) for ``--shapes`` shapes nobody tuned: once
each cold (the space is enumerated and scored, then cached), then ``--lookups`` times warm,
round robin; and, for comparison, for a tuned shape (the ``exact`` tier) and ``/healthz``.
Printed and written to benchmarks/results/: latency quantiles of each, of the lookup function
alone (no HTTP) and of its schedule read.

    .venv/bin/python benchmarks/lookup_latency.py
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import uvicorn

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


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def serve_process(home: Path) -> Iterator[str]:
    """Run ``tunehub serve --no-runner`` on ``home``'s database in a child process, as a
    deployment runs it; yield its base URL once it answers."""
    port = free_port()
    env = {
        **os.environ,
        "TUNEHUB_HOME": str(home),
        "TUNEHUB_TRAIN_MODELS": "false",
        "TUNEHUB_RUN_JOBS": "false",
    }
    child = subprocess.Popen(
        [sys.executable, "-m", "tunehub.cli", "serve", "--no-runner", "--host", "127.0.0.1",
         "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if child.poll() is not None:
                err = child.stderr.read().decode() if child.stderr else ""
                raise RuntimeError(f"tunehub serve exited with {child.returncode}: {err[-2000:]}")
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code < 500:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("tunehub serve did not answer within 60 s")
            time.sleep(0.1)
        yield base
    finally:
        child.terminate()
        try:
            child.wait(15)
        except subprocess.TimeoutExpired:
            child.kill()


@contextmanager
def serve(app: Any) -> Iterator[str]:
    """Serve ``app`` with uvicorn in a thread on a free loopback port; yield its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # accepted sockets inherit it
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)
        sock.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", type=int, default=20)
    parser.add_argument("--lookups", type=int, default=2000)
    parser.add_argument(
        "--server",
        choices=["process", "thread"],
        default="process",
        help="tunehub serve in its own process (default), or uvicorn in a thread of this one",
    )
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
    if not info.accepted:  # then unseen shapes answer from the default tier, not the model
        print(f"the model gate {info.reason}: no predicted tier to time", file=sys.stderr)
        return 1
    rng = random.Random(0)
    shapes = [
        (rng.randrange(16, 4097), rng.randrange(16, 4097), rng.randrange(16, 4097))
        for _ in range(args.shapes)
    ]
    settings = Settings(home=home, run_jobs=False, train_models=False)
    cold: list[float] = []
    warm: list[float] = []
    exact: list[float] = []
    health: list[float] = []
    tuned = records[0].request.workload
    # TCP_NODELAY, as HTTP clients that care about latency set it: without it, a request's
    # segments wait on the server's delayed ACK (about 40 ms on Linux loopback)
    transport = httpx.HTTPTransport(socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
    server = (
        serve_process(home)
        if args.server == "process"
        else serve(create_app(settings, store=store))
    )
    with (
        server as base,
        httpx.Client(base_url=base, transport=transport) as client,
    ):
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
        params = {"m": tuned.m, "n": tuned.n, "k": tuned.k, "epilogue": tuned.epilogue}
        assert client.get("/api/v1/schedules/best", params=params).json()["source"] == "exact"
        for _ in range(args.lookups):
            start = time.perf_counter()
            client.get("/api/v1/schedules/best", params=params)
            exact.append(time.perf_counter() - start)
        # The floor under every answer: a round trip through the same server and middleware.
        for _ in range(args.lookups):
            start = time.perf_counter()
            client.get("/healthz")
            health.append(time.perf_counter() - start)
    # The read every lookup makes before the model answers: this workload's schedules on the
    # target's family (this target's among them).
    reads: list[float] = []
    for i in range(args.lookups):
        m, n, k = shapes[i % len(shapes)]
        key = Workload(m=m, n=n, k=k).key
        start = time.perf_counter()
        store.family_schedules(workload_key=key, family_key=target.family_key)
        reads.append(time.perf_counter() - start)
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
        "http": "uvicorn on 127.0.0.1, one keep-alive httpx client with TCP_NODELAY",
        "server": (
            "tunehub serve --no-runner, its own process"
            if args.server == "process"
            else "uvicorn in a thread of the benchmark's process"
        ),
        "cold_http": quantiles_ms(cold),
        "warm_http": quantiles_ms(warm),
        "exact_http": quantiles_ms(exact),
        "warm_function": quantiles_ms(direct),
        "healthz_http": quantiles_ms(health),
        "schedule_reads": quantiles_ms(reads),
    }
    names = ("cold_http", "warm_http", "exact_http", "healthz_http", "warm_function")
    for name in (*names, "schedule_reads"):
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
