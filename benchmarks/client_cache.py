"""Benchmark: what a compiler pays per schedule lookup through ``tunehub.client``.

``tunehub serve --no-runner`` runs in its own process on a loopback port, on a SQLite database
holding one tuned schedule. In this process a ScheduleClient looks shapes up: a cache hit in
memory (a mapping, and a core Workload), a hit from the disk cache (memory emptied first, as
in a new compiler process), a revalidation that goes to the service (ttl 0), and, as the
baseline, the same lookup as a plain keep-alive HTTP GET without the client. Each call is timed
alone (perf_counter_ns); medians and p99 are printed with the ratio to the baseline, and
written to benchmarks/results/client_cache-<host>-<UTC time>.json with the CPU's model and the
load average (the machine is shared).

    .venv/bin/python benchmarks/client_cache.py
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from tunehub.client import ScheduleClient
from tunehub.core import (
    Config,
    MeasureRecord,
    MeasureRequest,
    MeasureResult,
    MeasureStatus,
    Workload,
    local_cpu_target,
)
from tunehub.db import SqlScheduleStore, upgrade

ROOT = Path(__file__).resolve().parent
TUNED = {"m": 256, "n": 256, "k": 256, "dtype": "float32"}


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return platform.processor()
    for line in out.splitlines():
        if line.startswith("Model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def serve_process(home: Path) -> Iterator[str]:
    """``tunehub serve --no-runner`` on ``home``'s database, in a child process."""
    port = free_port()
    env = {**os.environ, "TUNEHUB_HOME": str(home), "TUNEHUB_TRAIN_MODELS": "false",
           "TUNEHUB_RUN_JOBS": "false", "TUNEHUB_GPUS": "none"}  # fmt: skip
    child = subprocess.Popen(
        [sys.executable, "-m", "tunehub.cli", "serve", "--no-runner", "--host", "127.0.0.1",
         "--port", str(port)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
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


def timings_us(call: Callable[[], Any], n: int, before: Callable[[], None] | None = None) -> Any:
    """Median, p99 and mean of ``n`` calls of ``call``, each timed alone (``before`` runs
    untimed before each)."""
    out = []
    for _ in range(n):
        if before is not None:
            before()
        start = time.perf_counter_ns()
        call()
        out.append(time.perf_counter_ns() - start)
    out.sort()
    return {
        "n": n,
        "p50_us": out[n // 2] / 1e3,
        "p99_us": out[min(n - 1, int(n * 0.99))] / 1e3,
        "mean_us": sum(out) / n / 1e3,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hits", type=int, default=200_000)
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="tunehub-client-bench-"))
    upgrade(f"sqlite:///{home / 'tunehub.db'}")
    store = SqlScheduleStore(f"sqlite:///{home / 'tunehub.db'}")
    workload = Workload(**TUNED)
    request = MeasureRequest(workload, local_cpu_target(), "blis.gemm", 2, Config({"MR": 6}))
    result = MeasureResult(MeasureStatus.OK, repeat_secs=(1e-3, 1e-3))
    store.commit_records([MeasureRecord(request=request, result=result)])
    store.close()
    load_before = os.getloadavg()
    results: dict[str, Any] = {}
    with serve_process(home) as base:
        cache = home / "cache"
        client = ScheduleClient(base, cache_dir=cache, deadline_secs=5.0)
        first = client.best(TUNED)
        assert first.source == "exact" and not first.fallback, first
        results["memory_hit_mapping"] = timings_us(lambda: client.best(TUNED), args.hits)
        results["memory_hit_workload"] = timings_us(lambda: client.best(workload), args.hits)
        results["disk_hit"] = timings_us(
            lambda: client.best(TUNED), args.requests * 4, before=client._memory.clear
        )
        fresh = ScheduleClient(base, cache_dir=cache, deadline_secs=5.0, ttl_secs=0)
        fresh.best(TUNED)
        results["revalidate_via_service"] = timings_us(lambda: fresh.best(TUNED), args.requests)
        transport = httpx.HTTPTransport(
            socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
        )
        with httpx.Client(base_url=base, transport=transport) as http:
            http.get("/api/v1/schedules/best", params=TUNED)
            results["baseline_http_get"] = timings_us(
                lambda: http.get("/api/v1/schedules/best", params=TUNED).json(), args.requests
            )
        shapes = [{"m": 64 + i, "n": 128, "k": 96} for i in range(1000)]
        batch = ScheduleClient(base, cache_dir=home / "cache-batch", deadline_secs=30.0)
        start = time.perf_counter()
        answers = batch.best_many(shapes)
        results["best_many_1000_misses_ms"] = (time.perf_counter() - start) * 1e3
        assert not any(a.fallback for a in answers)
        start = time.perf_counter()
        batch.best_many(shapes)
        results["best_many_1000_hits_ms"] = (time.perf_counter() - start) * 1e3
        for c in (client, fresh, batch):
            c.close()
    baseline = results["baseline_http_get"]["p50_us"]
    report = {
        "benchmark": "client_cache",
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "host": platform.node(),
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "results": results,
        "ratios_vs_http_get_p50": {
            name: baseline / r["p50_us"]
            for name, r in results.items()
            if isinstance(r, dict) and name != "baseline_http_get"
        },
    }
    print(f"CPU: {report['cpu']} ({report['cores']} cores), load {load_before} -> "
          f"{report['loadavg_after']}")  # fmt: skip
    for name, r in results.items():
        if isinstance(r, dict):
            ratio = baseline / r["p50_us"]
            print(f"{name:28s} p50 {r['p50_us']:10.2f} us  p99 {r['p99_us']:10.2f} us  "
                  f"({ratio:8.1f}x faster than an HTTP GET)")  # fmt: skip
        else:
            print(f"{name:28s} {r:10.1f} ms")
    out = args.out or ROOT / "results" / (
        f"client_cache-vm-{datetime.now(UTC).strftime('%Y%m%dT%H%M')}.json"
    )
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
