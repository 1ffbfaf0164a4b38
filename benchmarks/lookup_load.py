"""Benchmark: lookups under load, from wrk in a second process on loopback, on SQLite and on
PostgreSQL each holding ``--count`` (10^6) seeded Schedules.

For each database: seed it (scripts/seed_schedules.py), start ``tunehub serve --no-runner
--workers W`` on it (no trainer: seeded records would train a model on made-up times), then
drive it with ``wrk -t1`` (one generator thread: the machine has 2 cores and the generator
counts) for ``--secs`` per run:

- ``rotating``: a Lua script cycling through ``--shapes`` seeded shapes spread over the whole
  grid, after one warm-up pass over them (the working set a fleet of compilers asks for), at
  1, 4 and 16 connections;
- ``hit``: one shape again and again (the cache's best case);
- ``paced``: ``rotating`` offered at about ``--paced-rate`` (1,000) requests/s by 11
  connections that each wait between requests: the latency at the target's rate, where the
  runs above measure it at saturation (wrk and the server sharing the 2 cores flat out);
- ``miss``: every request a seeded shape not asked before (each one reads the database);
- ``full path``: ``rotating`` on a server with the lookup cache off (the path before the cache,
  the baseline the ratios are taken against);
- ``/healthz`` through the same server (the floor under every answer);
- ``batch``: ``POST /api/v1/schedules/lookup`` with ``--batch`` (1,000) items, one client, one
  request at a time, ``--batch-rounds`` rounds of each: the same tuned shapes every time (the
  working set, from the lookup cache), tuned shapes never asked before (every item read from
  the database), and a mix of fresh tuned, untuned, unsupported and malformed items; p50, p90,
  p99 and max; skipped with a message when the route is not there (404/405).

Printed, and written as JSON and text to benchmarks/results/lookup_load-<host>-<UTC time>.*
with the CPU model and the load average around each run (the machine is shared: runs wait up
to 20 s for the 1-minute load to fall below ``--max-load`` and say when it did not).

    PYTHONPATH=. .venv/bin/python benchmarks/lookup_load.py
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import socket
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
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.pool import NullPool

ROOT = Path(__file__).resolve().parent
REPO = ROOT.parent
sys.path.insert(0, str(REPO / "scripts"))

from seed_schedules import SIDE, shape_of  # noqa: E402

from tunehub.db import make_engine, upgrade  # noqa: E402
from tunehub.db.tables import ScheduleRow  # noqa: E402

BEST = "/api/v1/schedules/best"
BATCH = "/api/v1/schedules/lookup"

LUA = """
local paths = {}
for line in io.lines("%(paths)s") do paths[#paths + 1] = line end
local i = 0
local start = %(start)d
request = function()
  i = i + 1
  local p = paths[((start + i) %% #paths) + 1]
  return wrk.format("GET", p)
end
if %(delay_ms)d > 0 then
  delay = function() return %(delay_ms)d end
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests":%%d,"duration_us":%%d,"connect_errors":%%d,"read_errors":%%d,' ..
    '"write_errors":%%d,"timeouts":%%d,"non_2xx":%%d,"p50_us":%%d,"p90_us":%%d,' ..
    '"p99_us":%%d,"max_us":%%d,"mean_us":%%.1f}\\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.timeout, e.status,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max,
    latency.mean))
end
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def wait_for_quiet(max_load: float, secs: float = 20.0) -> tuple[float, bool]:
    """Wait up to ``secs`` for the 1-minute load average to fall below ``max_load``."""
    deadline = time.monotonic() + secs
    while True:
        load = load_average()
        if load < max_load or time.monotonic() > deadline:
            return load, load < max_load
        time.sleep(2)


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or "unknown"
    found = re.search(r"Model name:\s*(.+)", out)
    return found.group(1).strip() if found else "unknown"


def git_commit() -> str:
    """The checkout's commit, ``+dirty`` when tracked files differ from it."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty.strip() else "")


def server_stack(env: dict[str, str]) -> dict[str, str]:
    """Which HTTP parser and event loop uvicorn will take in the server's environment."""
    probe = (
        "import importlib.util as u, json, uvicorn; print(json.dumps({"
        "'uvicorn': uvicorn.__version__, "
        "'http': 'httptools' if u.find_spec('httptools') else 'h11', "
        "'loop': 'uvloop' if u.find_spec('uvloop') else 'asyncio'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    )
    return dict(json.loads(out.stdout))


@contextmanager
def serving(url: str, home: Path, *, workers: int, cache: bool) -> Iterator[str]:
    port = free_port()
    env = server_env(url, home)
    if not cache:
        env["TUNEHUB_LOOKUP_CACHE_ENTRIES"] = "0"
    log = (home / f"serve-{port}.log").open("w")
    child = subprocess.Popen(
        [sys.executable, "-m", "tunehub.cli", "serve", "--no-runner", "--port", str(port),
         "--workers", str(workers)],
        env=env, stdout=subprocess.DEVNULL, stderr=log,
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
        time.sleep(1.0 if workers > 1 else 0.2)  # every worker up
        yield base
    finally:
        child.terminate()
        try:
            child.wait(30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        log.close()


def server_env(url: str, home: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p
        ),
        "TUNEHUB_HOME": str(home),
        "TUNEHUB_DATABASE_URL": url,
        "TUNEHUB_TRAIN_MODELS": "false",
        "TUNEHUB_RUN_JOBS": "false",
    }


def query(m: int, n: int, k: int) -> str:
    return f"{BEST}?m={m}&n={n}&k={k}"


def wrk(
    base: str,
    paths: list[str],
    *,
    connections: int,
    secs: float,
    work: Path,
    max_load: float,
    delay_ms: int = 0,
) -> dict[str, Any]:
    """One wrk run cycling through ``paths``; latency percentiles in ms, throughput, load.
    ``delay_ms``: each connection waits this long before each request (a paced load)."""
    listing = work / f"paths-{len(paths)}-{hash(tuple(paths[:3])) & 0xFFFF}.txt"
    listing.write_text("\n".join(paths) + "\n")
    script = work / "rotate.lua"
    script.write_text(LUA % {"paths": listing, "start": 0, "delay_ms": delay_ms})
    load_before, quiet = wait_for_quiet(max_load)
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(secs))}s", "--timeout", "5s",
         "-s", str(script), base],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    load_after = load_average()
    line = next(x for x in out.stdout.splitlines() if x.startswith("WRKJSON "))
    raw = json.loads(line.removeprefix("WRKJSON "))
    return {
        "connections": connections,
        "delay_ms": delay_ms,
        "requests": raw["requests"],
        "requests_per_sec": raw["requests"] / (raw["duration_us"] / 1e6),
        "p50_ms": raw["p50_us"] / 1e3,
        "p90_ms": raw["p90_us"] / 1e3,
        "p99_ms": raw["p99_us"] / 1e3,
        "max_ms": raw["max_us"] / 1e3,
        "mean_ms": raw["mean_us"] / 1e3,
        "errors": raw["connect_errors"] + raw["read_errors"] + raw["write_errors"]
        + raw["timeouts"],
        "non_2xx": raw["non_2xx"],
        "load_before": load_before,
        "load_after": load_after,
        "quiet": quiet,
    }  # fmt: skip


def percentiles(times_secs: list[float]) -> dict[str, float]:
    """p50/p90/p99/max in ms of one sequence of timings (p99 of a few dozen rounds is close
    to their max: say how many rounds)."""
    ms = sorted(t * 1e3 for t in times_secs)

    def at(q: float) -> float:
        return ms[min(len(ms) - 1, round(q * (len(ms) - 1)))]

    return {"p50_ms": statistics.median(ms), "p90_ms": at(0.9), "p99_ms": at(0.99),
            "max_ms": ms[-1]}  # fmt: skip


def workload_item(m: int, n: int, k: int, **extra: Any) -> dict[str, Any]:
    return {"workload": {"op": "matmul", "m": m, "n": n, "k": k}, **extra}


def mixed_items(tuned: list[tuple[int, int, int]], round_no: int, n: int) -> list[Any]:
    """``n`` items like a compiler's mixed batch: half seeded (tuned) shapes, three tenths
    shapes nobody tuned (off the seeded grid: the ``default`` tier, no model in this run),
    a tenth no template runs here (``triton.gemm`` on the CPU: 404), a tenth malformed (422);
    in a fixed shuffled order. The untuned shapes are new in every round."""
    half, untuned, absent = n // 2, 3 * n // 10, n // 10
    items: list[Any] = [workload_item(*shape) for shape in tuned[:half]]
    base = 17 + 3 * round_no * untuned
    items += [workload_item(base + 3 * i, 40, 24) for i in range(untuned)]
    items += [workload_item(8 + i, 8, 8, template="triton.gemm") for i in range(absent)]
    bad = [workload_item(0, 8, 8), {"workload": {"m": 8, "n": 8, "k": 8, "dtype": "f128"}}]
    items += [bad[i % 2] for i in range(n - len(items))]
    random.Random(round_no).shuffle(items)
    return items


def batch_run(
    base: str,
    pool: list[tuple[int, int, int]],
    n: int,
    rounds: int,
    workers: int,
    max_load: float,
) -> dict[str, Any]:
    """Sequential batch lookups of ``n`` items (one client, one request at a time), three ways:

    - ``tuned_working_set``: the same ``n`` seeded shapes every round, after warm-up requests
      (every serving process has answered them once): answered from the lookup cache;
    - ``tuned_fresh``: ``n`` seeded shapes never asked before in each round: every item read
      from the database (10^6 rows: most of them not in its page cache either);
    - ``mixed_fresh``: ``mixed_items`` with never-asked tuned shapes.

    ``pool``: seeded shapes no other run asks for, ``n * (2 * rounds + 2)`` of them at least.
    Skipped with a message when the route is not there (404/405)."""
    same = [workload_item(*shape) for shape in pool[:n]]
    fresh = iter(pool[n:])

    def take() -> list[tuple[int, int, int]]:
        return [next(fresh) for _ in range(n)]

    out: dict[str, Any] = {"items": n, "rounds": rounds}
    with httpx.Client(base_url=base, timeout=60) as client:
        probe = client.post(BATCH, json={"items": same})
        if probe.status_code in (404, 405):
            return {"skipped": f"{BATCH} answered {probe.status_code}: the batch route is not "
                    "in this build"}  # fmt: skip
        probe.raise_for_status()
        for _ in range(4 * workers):  # every process has the working set
            client.post(BATCH, json={"items": same}).raise_for_status()

        def timed(items: list[Any]) -> tuple[float, list[Any]]:
            start = time.perf_counter()
            answer = client.post(BATCH, json={"items": items})
            secs = time.perf_counter() - start
            answer.raise_for_status()
            return secs, answer.json()["results"]

        runs: dict[str, list[float]] = {"tuned_working_set": [], "tuned_fresh": [],
                                        "mixed_fresh": []}  # fmt: skip
        answered: dict[str, dict[str, int]] = {name: {} for name in runs}
        load_before, quiet = wait_for_quiet(max_load)
        for round_no in range(rounds):
            # Interleaved, so that the load of the moment weighs on the three alike.
            for name, items in (
                ("tuned_working_set", same),
                ("tuned_fresh", [workload_item(*shape) for shape in take()]),
                ("mixed_fresh", mixed_items(take(), round_no, n)),
            ):
                secs, results = timed(items)
                runs[name].append(secs)
                for r in results:
                    kind = r["schedule"]["source"] if r["ok"] else str(r["status"])
                    answered[name][kind] = answered[name].get(kind, 0) + 1
        for name, times in runs.items():
            out[name] = {
                **percentiles(times),
                "items_per_sec": n / statistics.median(times),
                "answers": {k: v // rounds for k, v in sorted(answered[name].items())},
            }
        out.update(load_before=load_before, load_after=load_average(), quiet=quiet)
    return out


def fmt_batch(batch: dict[str, Any]) -> str:
    if "skipped" in batch:
        return str(batch)
    return "; ".join(
        f"{name} p50 {r['p50_ms']:.1f} p90 {r['p90_ms']:.1f} p99 {r['p99_ms']:.1f} "
        f"max {r['max_ms']:.1f} ms {r['answers']}"
        for name in ("tuned_working_set", "tuned_fresh", "mixed_fresh")
        if (r := batch.get(name))
    ) + (f" ({batch['rounds']} rounds of {batch['items']} items each, load "
         f"{batch['load_before']:.1f}->{batch['load_after']:.1f})")  # fmt: skip


def middleware_costs(calls: int = 20_000) -> dict[str, float]:
    """Microseconds each of the service's ASGI middlewares adds to a GET (in process, no
    HTTP): each wraps an app that answers 200 at once; the bare app is the reference."""
    import asyncio

    from tunehub.service.security import BodyLimit, CrossSiteCheck, HostCheck, SecurityHeaders

    async def bare(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    apps: dict[str, Any] = {
        "bare app": bare,
        "SecurityHeaders": SecurityHeaders(bare),
        "HostCheck": HostCheck(bare, allowed=["127.0.0.1", "localhost", "::1"]),
        "CrossSiteCheck": CrossSiteCheck(bare),
        "BodyLimit": BodyLimit(bare, max_bytes=1 << 20, timeout_secs=10.0),
    }
    scope = {
        "type": "http", "method": "GET", "path": BEST, "query_string": b"m=16&n=16&k=16",
        "headers": [(b"host", b"127.0.0.1:8000"), (b"user-agent", b"wrk"), (b"accept", b"*/*")],
    }  # fmt: skip

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        return None

    async def timed(app: Any) -> float:
        for _ in range(1000):
            await app(scope, receive, send)
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(calls // 5):
                await app(scope, receive, send)
            best = min(best, (time.perf_counter() - start) / (calls // 5))
        return best * 1e6

    async def run() -> dict[str, float]:
        found = {name: await timed(app) for name, app in apps.items()}
        return {name: us - found["bare app"] if name != "bare app" else us
                for name, us in found.items()}  # fmt: skip

    return asyncio.run(run())


def seeded_count(url: str) -> int:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.scalar(select(func.count()).select_from(ScheduleRow)) or 0)
    finally:
        engine.dispose()


def seed(url: str, count: int, side: int) -> float:
    """Seed ``count`` schedules on a grid of ``side`` shapes a dimension (unless the database
    holds them already); seconds taken."""
    upgrade(url)
    if seeded_count(url) >= count:
        return 0.0
    start = time.monotonic()
    subprocess.run(
        [sys.executable, str(REPO / "scripts" / "seed_schedules.py"), "--database-url", url,
         "--count", str(count), "--side", str(side)],
        check=True, env=server_env(url, Path(tempfile.gettempdir())),
    )  # fmt: skip
    return time.monotonic() - start


def pg_database(admin_url: str, name: str, keep: bool) -> str:
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    with admin.connect() as conn:
        exists = conn.scalar(text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name})
        if not exists or not keep:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return admin_url.rsplit("/", 1)[0] + f"/{name}"


def drop_pg_database(admin_url: str, name: str) -> None:
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def bench_database(label: str, url: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    print(f"== {label}: seeding {args.count} schedules", flush=True)
    seed_secs = seed(url, args.count, args.side)
    rng = random.Random(1)
    picks = rng.sample(range(args.count), args.shapes + args.miss_shapes)
    # Shapes for the batch runs: none of the single lookups' (so "fresh" means unasked).
    taken = set(picks)
    wanted = batch_need(args) * len(args.workers)
    spare = rng.sample(range(args.count), len(taken) + 2 * wanted)
    batch_pool = [shape_of(i, side=args.side) for i in spare if i not in taken][:wanted]
    rotating = [query(*shape_of(i, side=args.side)) for i in picks[: args.shapes]]
    misses = [query(*shape_of(i, side=args.side)) for i in picks[args.shapes :]]
    hit = [rotating[0]]
    out: dict[str, Any] = {"url": re.sub(r"//[^@/]*@", "//", url), "seed_secs": seed_secs}
    home = work / label
    home.mkdir(exist_ok=True)
    with serving(url, home, workers=1, cache=False) as base:
        full = rotating[: args.full_path_shapes]
        with httpx.Client(base_url=base) as client:
            for path in full:  # one pass: every shape answers 200
                assert client.get(path).json()["source"] == "exact"
        out["full_path"] = [
            wrk(base, full, connections=c, secs=args.secs, work=work, max_load=args.max_load)
            for c in (4,)
        ]
        print(f"  full path (cache off): {fmt(out['full_path'])}", flush=True)
    for nth, workers in enumerate(args.workers):
        runs: dict[str, Any] = {}
        # Each server its own shapes: "fresh" ones were never read by an earlier server.
        pool = batch_pool[nth * batch_need(args) : (nth + 1) * batch_need(args)]
        with serving(url, home, workers=workers, cache=True) as base:
            # Warm-up: every rotating shape once on each connection (any worker process).
            # A miss costs a few ms: long enough for each process to see every shape.
            warm_secs = 3.0 + len(rotating) * workers / 300
            warm = wrk(base, rotating, connections=4 * workers, secs=warm_secs, work=work,
                       max_load=args.max_load)  # fmt: skip
            runs["warmup"] = warm
            for name, paths in (("rotating", rotating), ("hit", hit)):
                runs[name] = [
                    wrk(base, paths, connections=c, secs=args.secs, work=work,
                        max_load=args.max_load)
                    for c in args.connections
                ]  # fmt: skip
                print(f"  workers={workers} {name}: {fmt(runs[name])}", flush=True)
            # Paced: about --paced-rate requests/s offered (each of 11 connections waits
            # 10000/rate ms between its requests), the latency a fleet sees at that rate.
            runs["paced"] = [
                wrk(base, rotating, connections=11, secs=args.secs, work=work,
                    max_load=args.max_load, delay_ms=round(10_000 / args.paced_rate))
            ]  # fmt: skip
            print(f"  workers={workers} paced: {fmt(runs['paced'])}", flush=True)
            runs["miss"] = [
                wrk(base, misses, connections=4, secs=args.secs, work=work, max_load=args.max_load)
            ]
            print(f"  workers={workers} miss: {fmt(runs['miss'])}", flush=True)
            runs["healthz"] = [
                wrk(base, ["/healthz"], connections=c, secs=args.secs, work=work,
                    max_load=args.max_load)
                for c in args.connections
            ]  # fmt: skip
            print(f"  workers={workers} /healthz: {fmt(runs['healthz'])}", flush=True)
            runs["batch"] = batch_run(
                base, pool, args.batch, args.batch_rounds, workers, args.max_load
            )
            print(f"  workers={workers} batch: {fmt_batch(runs['batch'])}", flush=True)
        out[f"workers_{workers}"] = runs
    return out


def batch_need(args: argparse.Namespace) -> int:
    """Seeded shapes the batch runs of one server ask for."""
    return args.batch * (2 * args.batch_rounds + 2)


def fmt(runs: list[dict[str, Any]]) -> str:
    return "; ".join(
        f"c={r['connections']} {r['requests_per_sec']:.0f}/s p50 {r['p50_ms']:.2f} "
        f"p90 {r['p90_ms']:.2f} p99 {r['p99_ms']:.2f} ms"
        f"{' (' + str(r['non_2xx']) + ' non-2xx)' if r['non_2xx'] else ''}"
        f" load {r['load_before']:.1f}->{r['load_after']:.1f}"
        for r in runs
    )


def text_report(report: dict[str, Any]) -> str:
    lines = [
        f"lookup_load {report['started_at']}  {report['cpu']} ({report['cores']} cores), "
        f"commit {report.get('commit', '?')}",
        f"server: {report['server']}  generator: {report['generator']}",
        f"{report['count']} seeded schedules; rotating over {report['shapes']} shapes; "
        f"{report['secs']} s per run; load average {report['load_at_start']:.1f} at start, "
        f"{report.get('load_at_end', 0):.1f} at end",
        "middleware, microseconds added per GET (best of 5, in process): "
        + ", ".join(f"{k} {v:.1f}" for k, v in report.get("middleware_us", {}).items()),
        "",
    ]
    for db in ("sqlite", "postgresql"):
        data = report.get(db)
        if not data:
            continue
        lines.append(f"== {db}  (seeded in {data['seed_secs']:.0f} s; 0: reused)")
        lines.append(f"  full path, cache off : {fmt(data['full_path'])}")
        for key in sorted(k for k in data if k.startswith("workers_")):
            runs = data[key]
            for name in ("rotating", "hit", "paced", "miss", "healthz"):
                lines.append(f"  {key} {name:9}: {fmt(runs[name])}")
            lines.append(f"  {key} batch    : {fmt_batch(runs['batch'])}")
            full = data["full_path"][0]["requests_per_sec"]
            rot4 = next(r for r in runs["rotating"] if r["connections"] == 4)
            health4 = next(r for r in runs["healthz"] if r["connections"] == 4)
            lines.append(
                f"  {key} ratios at c=4: rotating/full path "
                f"{rot4['requests_per_sec'] / full:.1f}x, rotating/healthz "
                f"{rot4['requests_per_sec'] / health4['requests_per_sec']:.2f}x"
            )
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=SIDE**3)
    parser.add_argument("--side", type=int, default=SIDE)
    parser.add_argument("--shapes", type=int, default=1000)
    parser.add_argument("--miss-shapes", type=int, default=50_000)
    parser.add_argument("--full-path-shapes", type=int, default=500)
    parser.add_argument("--secs", type=float, default=8.0)
    parser.add_argument("--connections", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--paced-rate", type=float, default=1000.0)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--batch-rounds", type=int, default=40)
    parser.add_argument("--max-load", type=float, default=2.5)
    parser.add_argument("--databases", nargs="+", default=["sqlite", "postgresql"])
    parser.add_argument(
        "--pg-admin-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
    )
    parser.add_argument("--pg-database", default="tunehub_lookup_load")
    parser.add_argument(
        "--keep", action="store_true", help="Keep the seeded databases for the next run."
    )
    parser.add_argument("--sqlite-path", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M")
    work = Path(tempfile.mkdtemp(prefix="lookup_load-"))
    env = server_env("sqlite://", work)
    report: dict[str, Any] = {
        "benchmark": "lookup_load",
        "started_at": datetime.now(UTC).isoformat(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "host": platform.node(),
        "commit": git_commit(),
        "python": platform.python_version(),
        "server": server_stack(env),
        "generator": subprocess.run(["wrk", "-v"], capture_output=True, text=True).stdout.split(
            "\n"
        )[0] + " -t1",
        "count": args.count,
        "shapes": args.shapes,
        "secs": args.secs,
        "load_at_start": load_average(),
    }  # fmt: skip
    print(f"{report['cpu']}; server {report['server']}", flush=True)
    report["middleware_us"] = middleware_costs()
    print(f"middleware, microseconds added per GET: {report['middleware_us']}", flush=True)
    if "sqlite" in args.databases:
        path = args.sqlite_path or work / "lookup_load.db"
        report["sqlite"] = bench_database("sqlite", f"sqlite:///{path}", args, work)
        if not args.keep and args.sqlite_path is None:
            path.unlink(missing_ok=True)
    if "postgresql" in args.databases:
        url = pg_database(args.pg_admin_url, args.pg_database, args.keep)
        try:
            report["postgresql"] = bench_database("postgresql", url, args, work)
        finally:
            if not args.keep:
                drop_pg_database(args.pg_admin_url, args.pg_database)
    report["load_at_end"] = load_average()
    name = f"lookup_load-{platform.node() or 'host'}-{stamp}"
    out = args.out or ROOT / "results" / name
    out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    summary = text_report(report)
    out.with_suffix(".txt").write_text(summary + "\n")
    print(summary)
    print(f"written: {out}.json, {out}.txt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
