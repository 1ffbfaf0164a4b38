"""Benchmark: uncached single lookups under load (issue 27's target: wrk, 4 connections, on
the 2-core VM, random shapes among 10^6 seeded schedules on PostgreSQL, at least 1,000
answers/s with p99 at most 10 ms).

The database must hold the seeded schedules already (``scripts/seed_schedules.py``; the
target is this machine's CPU, so every answer is ``exact``). For each source tree named by
``--tree`` (default: this checkout; name an exported older commit to compare, e.g.
``git archive HEAD | tar -x -C /tmp/before``) a ``tunehub serve --no-runner --workers W``
is started on it, and ``wrk -t1 -c4`` asks GETs of ``/api/v1/schedules/best`` for seeded
shapes in a random order, each shape once (the lookup cache stays on, as in production, but
never hits): the path behind the cache, after a 2 s warm-up on other shapes (every worker
process up, statements prepared). ``--rounds`` rounds, the trees interleaved in each round so
that the machine's load of the moment weighs on them alike; medians over rounds.
Before the runs, one request per tree is compared: the trees must answer the same body.

Latency is wrk's, corrected by wrk for coordinated omission: a request that took T ms
counts as if the requests that connection could not send meanwhile had waited too (about
T / interval more samples, the interval being a connection's mean time per request), so one
pause of the server weighs on p99 in proportion to its length: in an 8 s run at 4
connections, requests' waits beyond 10 ms adding up to about 0.3 s make p99 exceed 10 ms.

Printed, and written as JSON to benchmarks/results/lookup_uncached-<host>-<UTC time>.json
with the CPU model and the load average around each run (the machine is shared: say so).

    PYTHONPATH=. .venv/bin/python benchmarks/lookup_uncached.py \\
        --database-url postgresql+psycopg://postgres@127.0.0.1:5432/lookload \\
        --tree before=/tmp/before --tree after=.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent
REPO = ROOT.parent
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(ROOT))

from lookup_load import LUA, cpu_model, free_port, git_commit, load_average  # noqa: E402
from seed_schedules import SIDE, shape_of  # noqa: E402

BEST = "/api/v1/schedules/best"


def cpu_secs(pid: int) -> float:
    """User plus system CPU seconds so far of process ``pid`` and its children (the worker
    processes of ``serve --workers N``), all threads."""
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(stat.parent.name) == pid or int(fields[1]) == pid:
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


@contextmanager
def serving(tree: Path, url: str, home: Path, workers: int) -> Iterator[tuple[str, int]]:
    """``tunehub serve`` of the source tree ``tree`` on ``url``, no runner."""
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(tree),
        "TUNEHUB_HOME": str(home),
        "TUNEHUB_DATABASE_URL": url,
        "TUNEHUB_TRAIN_MODELS": "false",
        "TUNEHUB_RUN_JOBS": "false",
    }
    log = (home / f"serve-{port}.log").open("w")
    child = subprocess.Popen(
        [sys.executable, "-m", "tunehub.cli", "serve", "--no-runner", "--port", str(port),
         "--workers", str(workers)],
        env=env, cwd=tree, stdout=subprocess.DEVNULL, stderr=log,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if child.poll() is not None:
                raise RuntimeError(f"tunehub serve exited: {log.name}")
            try:
                if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("tunehub serve did not answer within 120 s")
            time.sleep(0.2)
        time.sleep(1.0 if workers > 1 else 0.0)  # every worker up
        yield base, child.pid
    finally:
        child.terminate()
        try:
            child.wait(30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        log.close()


def wrk_run(
    base: str, pid: int, paths: list[str], *, connections: int, secs: int, work: Path
) -> dict[str, Any]:
    """One wrk run over ``paths`` in order; throughput, latency in ms, the server's own CPU
    time per answer (less noisy than latency on a shared machine) and wrk's (the generator
    shares the 2 cores with the server)."""
    listing = work / "paths.txt"
    listing.write_text("\n".join(paths) + "\n")
    script = work / "uncached.lua"
    script.write_text(LUA % {"paths": listing, "start": 0, "delay_ms": 0})
    load_before = load_average()
    cpu_before = cpu_secs(pid)
    wrk_before = resource.getrusage(resource.RUSAGE_CHILDREN)  # wrk: the only child to end
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{secs}s", "--timeout", "5s", "-s", str(script),
         base],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    cpu = cpu_secs(pid) - cpu_before
    wrk_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    wrk_cpu = sum(getattr(wrk_after, f) - getattr(wrk_before, f) for f in ("ru_utime", "ru_stime"))
    raw = json.loads(
        next(x for x in out.stdout.splitlines() if x.startswith("WRKJSON ")).split(" ", 1)[1]
    )
    return {
        "requests": raw["requests"],
        "requests_per_sec": raw["requests"] / (raw["duration_us"] / 1e6),
        "p50_ms": raw["p50_us"] / 1e3,
        "p90_ms": raw["p90_us"] / 1e3,
        "p99_ms": raw["p99_us"] / 1e3,
        "max_ms": raw["max_us"] / 1e3,
        "errors": raw["connect_errors"] + raw["read_errors"] + raw["write_errors"]
        + raw["timeouts"],
        "non_2xx": raw["non_2xx"],
        "server_cpu_ms_per_answer": 1e3 * cpu / max(1, raw["requests"]),
        "wrk_cpu_ms_per_answer": 1e3 * wrk_cpu / max(1, raw["requests"]),
        "load_before": load_before,
        "load_after": load_average(),
    }  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", required=True, help="A seeded database's URL.")
    parser.add_argument("--count", type=int, default=SIDE**3, help="Seeded schedules.")
    parser.add_argument(
        "--tree",
        action="append",
        default=[],
        help="NAME=PATH of a source tree to serve (repeatable; default: after=this checkout).",
    )
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--workers", type=int, default=1, help="serve --workers")
    parser.add_argument("--secs", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    trees = dict(t.split("=", 1) for t in args.tree) or {"after": str(REPO)}
    rng = random.Random(27)
    # Every request of every run a shape not asked before in that server (fresh indices).
    per_run = 40_000 * args.secs // 8
    picked = rng.sample(range(args.count), min(args.count, per_run * args.rounds + 20_000))
    # A warm-up run of 2 s before each measured one, on shapes never measured: every worker
    # process up and connected, the statements prepared.
    warm_paths = [f"{BEST}?m=%d&n=%d&k=%d" % shape_of(i) for i in picked[:20_000]]
    indices = picked[20_000:]
    work = Path(tempfile.mkdtemp(prefix="lookup_uncached-"))
    report: dict[str, Any] = {
        "benchmark": "lookup_uncached",
        "started_at": datetime.now(UTC).isoformat(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "host": platform.node(),
        "commit": git_commit(),
        "generator": f"wrk -t1 -c{args.connections} -d{args.secs}s",
        "workers": args.workers,
        "count": args.count,
        "trees": trees,
        "load_at_start": load_average(),
        "runs": {name: [] for name in trees},
    }
    print(f"{report['cpu']}, {report['cores']} cores; trees {trees}", flush=True)
    bodies: dict[str, Any] = {}
    probe = f"{BEST}?m=%d&n=%d&k=%d" % shape_of(123_456)
    for round_no in range(args.rounds):
        chunk = indices[round_no * per_run : (round_no + 1) * per_run]
        paths = [f"{BEST}?m=%d&n=%d&k=%d" % shape_of(i) for i in chunk]
        for name, tree in trees.items():
            home = work / f"{name}-{round_no}"
            home.mkdir()
            with serving(Path(tree).resolve(), args.database_url, home, args.workers) as (
                base,
                pid,
            ):
                if round_no == 0:
                    bodies[name] = httpx.get(base + probe, timeout=10).json()
                wrk_run(base, pid, warm_paths, connections=args.connections, secs=2, work=work)
                run = wrk_run(
                    base, pid, paths, connections=args.connections, secs=args.secs, work=work
                )
            report["runs"][name].append(run)
            print(
                f"round {round_no} {name:8}: {run['requests_per_sec']:7.0f}/s p50 "
                f"{run['p50_ms']:.2f} p90 {run['p90_ms']:.2f} p99 {run['p99_ms']:.2f} ms, "
                f"server CPU {run['server_cpu_ms_per_answer']:.2f} ms/answer, wrk "
                f"{run['wrk_cpu_ms_per_answer']:.2f} (non-2xx {run['non_2xx']}, errors "
                f"{run['errors']}, load "
                f"{run['load_before']:.1f}->{run['load_after']:.1f})",
                flush=True,
            )
    first = next(iter(bodies.values()))
    report["same_answer"] = all(b == first for b in bodies.values())
    report["probe_answer"] = first
    report["median"] = {
        name: {
            key: statistics.median(r[key] for r in runs)
            for key in (
                "requests_per_sec",
                "p50_ms",
                "p90_ms",
                "p99_ms",
                "server_cpu_ms_per_answer",
                "wrk_cpu_ms_per_answer",
            )
        }
        for name, runs in report["runs"].items()
    }
    report["load_at_end"] = load_average()
    for name, m in report["median"].items():
        print(
            f"median {name:8}: {m['requests_per_sec']:7.0f}/s p50 {m['p50_ms']:.2f} "
            f"p90 {m['p90_ms']:.2f} p99 {m['p99_ms']:.2f} ms, server CPU "
            f"{m['server_cpu_ms_per_answer']:.2f} ms/answer"
        )
    print(f"same answer from every tree: {report['same_answer']}")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M")
    out = args.out or ROOT / "results" / f"lookup_uncached-{platform.node() or 'host'}-{stamp}.json"
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
