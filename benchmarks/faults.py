"""The fault benchmark of issue 27: 20 blis.gemm jobs from 3 keys on a PostgreSQL of its own,
through a 30 s database stop, a database stop longer than TUNEHUB_DB_OUTAGE_SECS (the result
journal replays), a SIGKILL of ``tunehub serve`` (restarted) and a SIGKILL of a Ray worker's
actor (when Ray is installed; else said so and skipped).

Meanwhile a poller asks every route the run exercises about once a second and counts the HTTP
statuses (a refused connection while ``serve`` is down is counted apart). At the end it reports
the HTTP 500s, each job's final state and whether its records hold every trial once (records
against ``trials_done`` and the budget, one verdict per config), the results replayed from the
journal, and for each key the delay from its first submission to its first job's start against
the time slice. The PostgreSQL server (initdb into a temporary directory, on a free port) and the
Ray head are its own, as tests/test_store_faults.py does; the machine's shared server is never
touched.

    .venv/bin/python benchmarks/faults.py            # the whole run, 5-8 minutes on the 2-core VM
    .venv/bin/python benchmarks/faults.py --quick    # shorter stops, a smoke run
    .venv/bin/python benchmarks/faults.py --no-ray   # without the Ray part
    .venv/bin/python benchmarks/faults.py --fairness-only   # no stops or kills: first-job delays

Writes benchmarks/results/faults-<machine>-<date>.json (``--out`` to choose).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.live import LiveServer, create_key, free_port  # noqa: E402
from tests.test_store_faults import OwnPostgres  # noqa: E402
from tunehub.db import SqlScheduleStore, upgrade  # noqa: E402

# 20 jobs from 3 keys: A queues most of them first, then B, then C (as in the probe).
KEYS = {"alice": 10, "bob": 6, "carol": 4}
QUICK_KEYS = {"alice": 3, "bob": 2, "carol": 1}
SHAPES = [(48 + 8 * (i % 5), 40 + 8 * (i // 5), 64) for i in range(20)]
FINAL = ("succeeded", "failed", "cancelled")
MACHINE_STATUSES = ("cancelled", "worker_error", "noisy")


def cpu_name() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    found = re.search(r"Model name:\s*(.+)", out)
    return found.group(1).strip() if found else platform.processor() or "unknown"


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this machine (the Ray actors are local here)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def now() -> float:
    return time.monotonic()


class Poller(threading.Thread):
    """Asks each route about once a second; counts statuses per route and per phase."""

    def __init__(self, bench: Bench) -> None:
        super().__init__(daemon=True)
        self.bench = bench
        self.stop = threading.Event()
        self.codes: dict[str, Counter[str]] = {}
        self.by_phase: dict[str, Counter[str]] = {}
        self.fivehundreds: list[dict[str, Any]] = []
        self.rounds = 0

    def routes(self) -> list[tuple[str, str, Any]]:
        ids = self.bench.job_ids or [1]
        job = ids[self.rounds % len(ids)]
        m = 100 + self.rounds % 4000  # a never-asked shape each round: behind the cache
        return [
            ("GET", "/healthz", None),
            ("GET", "/api/v1/jobs", None),
            ("GET", f"/api/v1/jobs/{job}", None),
            ("GET", f"/api/v1/jobs/{job}/records", None),
            ("GET", "/api/v1/workers", None),
            ("GET", "/api/v1/targets", None),
            ("GET", f"/api/v1/schedules/best?op=matmul&m={m}&n=64&k=64&target=local-cpu", None),
            ("GET", "/api/v1/schedules/best?op=matmul&m=48&n=40&k=64&target=local-cpu", None),
            ("POST", "/api/v1/schedules/lookup",
             {"items": [{"workload": {"m": m, "n": 72, "k": 64}}]}),
            ("GET", "/metrics", None),
        ]  # fmt: skip

    def count(self, route: str, code: str, detail: str = "") -> None:
        self.codes.setdefault(route, Counter())[code] += 1
        self.by_phase.setdefault(self.bench.phase, Counter())[code] += 1
        if code == "500":
            self.fivehundreds.append(
                {"route": route, "phase": self.bench.phase, "detail": detail[:300]}
            )

    def run(self) -> None:
        headers = {"X-API-Key": self.bench.keys["alice"]}
        with httpx.Client(base_url=self.bench.server.url, headers=headers, timeout=30) as http:
            while not self.stop.is_set():
                start = now()
                for method, path, body in self.routes():
                    route = f"{method} {re.sub(r'/[0-9]+', '/N', path.split('?')[0])}"
                    try:
                        response = http.request(method, path, json=body)
                    except httpx.ConnectError:
                        self.count(route, "refused")  # serve down (the kill)
                    except httpx.HTTPError as exc:
                        self.count(route, type(exc).__name__)  # a reset, a timeout
                    else:
                        self.count(route, str(response.status_code), response.text)
                self.rounds += 1
                self.stop.wait(max(0.0, 1.0 - (now() - start)))


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.t0 = now()
        self.phase = "setup"
        self.events: list[dict[str, Any]] = []
        self.job_ids: list[int] = []
        self.owner: dict[int, str] = {}
        self.first_submit: dict[str, float] = {}
        self.keys: dict[str, str] = {}
        self.ray_procs: list[subprocess.Popen[bytes]] = []
        self.ray_address: str | None = None
        self.ray_skipped: str | None = None
        self.submit_codes: Counter[str] = Counter()
        self.killed_worker: str | None = None
        self.outages: list[tuple[float, float]] = []  # wall-clock spans: no job could start

    def log(self, what: str, **info: Any) -> None:
        t = round(now() - self.t0, 1)
        self.events.append({"t": t, "phase": self.phase, "event": what, **info})
        extra = " ".join(f"{k}={v}" for k, v in info.items())
        print(f"[{t:7.1f} s] {what} {extra}".rstrip(), flush=True)

    # --- the parts ----------------------------------------------------------------------------
    def start_ray(self, env: dict[str, str]) -> None:
        try:
            import ray  # noqa: F401
        except ImportError:
            self.ray_skipped = "Ray is not installed in this venv: the Ray worker kill is skipped"
            print(self.ray_skipped, flush=True)
            return
        port = free_port()
        ray_env = {**env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
        env.update(ray_env)
        head = [
            sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
            f"--port={port}", "--num-cpus=0", "--include-dashboard=false",
            "--disable-usage-stats",
            f"--dashboard-agent-listen-port={free_port()}",
            f"--dashboard-agent-grpc-port={free_port()}", f"--metrics-export-port={free_port()}",
            f"--runtime-env-agent-port={free_port()}", f"--node-manager-port={free_port()}",
            f"--object-manager-port={free_port()}",
        ]  # fmt: skip
        proc = self.spawn(head, ray_env, "ray-head.log")
        self.ray_procs.append(proc)
        self.ray_address = f"127.0.0.1:{port}"
        deadline = now() + 120
        while True:
            if proc.poll() is not None or now() > deadline:
                log = (self.work / "ray-head.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"the Ray head did not start:\n{log}")
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            time.sleep(0.5)
        worker = [sys.executable, "-m", "tunehub.cli", "worker", "--address", self.ray_address,
                  "--gpus", "none"]  # fmt: skip
        self.ray_procs.append(self.spawn(worker, ray_env, "ray-worker.log"))
        self.log("ray head and a tunehub worker node started", address=self.ray_address)

    def spawn(self, command: list[str], env: dict[str, str], log: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            command,
            cwd=REPO,
            env=env,
            stdout=(self.work / log).open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def submit(self, key: str, shape: tuple[int, int, int]) -> None:
        m, n, k = shape
        body = {
            "workload": {"op": "matmul", "m": m, "n": n, "k": k, "dtype": "float32"},
            "template": "blis.gemm",
            "budget": {"max_trials": self.args.trials, "max_secs": 600},
        }
        self.first_submit.setdefault(key, time.time())
        response = httpx.post(f"{self.server.url}/api/v1/jobs", json=body,
                              headers={"X-API-Key": self.keys[key]}, timeout=30)  # fmt: skip
        self.submit_codes[str(response.status_code)] += 1
        if response.status_code != 202:
            raise RuntimeError(f"submission refused: {response.status_code} {response.text}")
        job_id = int(response.json()["id"])
        self.job_ids.append(job_id)
        self.owner[job_id] = key

    def get(self, path: str) -> Any:
        response = httpx.get(f"{self.server.url}{path}",
                             headers={"X-API-Key": self.keys["alice"]}, timeout=30)  # fmt: skip
        response.raise_for_status()
        return response.json()

    def jobs(self) -> dict[int, dict[str, Any]]:
        return {i: self.get(f"/api/v1/jobs/{i}") for i in self.job_ids}

    def wait(self, what: str, check: Any, secs: float) -> float:
        start = now()
        while now() - start < secs:
            with contextlib.suppress(httpx.HTTPError):
                if check():
                    return now() - start
            time.sleep(0.2)
        raise TimeoutError(f"not within {secs} s: {what}")

    def health(self) -> str:
        try:
            return str(httpx.get(f"{self.server.url}/healthz", timeout=5).json()["status"])
        except (httpx.HTTPError, ValueError):
            return "unreachable"

    def mid_trials(self) -> dict[str, Any] | None:
        """A running job between its first trial and its last, if any."""
        running = self.get("/api/v1/jobs?state=running")["items"]
        for job in running:
            if 1 <= job["trials_done"] < job["budget"]["max_trials"] - 1:
                return dict(job)
        return None

    def db_stop(self, secs: float, label: str) -> None:
        """Stop the database for ``secs`` while a job is mid-trials (a job still measuring its
        baseline is handed back, measuring nothing: the stop would test no buffer)."""
        job = None
        with contextlib.suppress(TimeoutError):
            self.wait("a job mid-trials", lambda: self.mid_trials() is not None, 120)
            job = self.mid_trials()
        self.phase = label
        where = None if job is None else f"{job['id']} at {job['trials_done']} trials"
        self.log("database stopped", secs=secs, mid_job=where)
        away = time.time()
        self.pg.stop()
        time.sleep(secs)
        self.pg.start()
        self.outages.append((away, time.time()))
        self.log("database started")
        took = self.wait("health ok", lambda: self.health() == "ok", 60)
        self.log("health ok again", after_secs=round(took, 1))
        self.events[-1]["recovery_secs"] = round(took, 1)
        self.phase = f"after {label}"

    def ray_victim(self) -> Any:
        store = SqlScheduleStore(self.pg.url)
        try:
            live = [
                w
                for w in store.list_workers()
                if w.kind == "ray" and w.info.get("state") != "lost" and alive(w.pid)
            ]
        finally:
            store.close()
        # The newest: rows of actors that died with a killed serve stay until noticed.
        return max(live, key=lambda w: w.started_at) if live else None

    # --- the run ------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        a = self.args
        self.pg = OwnPostgres()
        self.pg.start()
        upgrade(self.pg.url)
        self.log("own PostgreSQL started", port=self.pg.port)
        home = self.work / "home"
        env: dict[str, Any] = {
            "TUNEHUB_DATABASE_URL": self.pg.url,
            "TUNEHUB_DB_OUTAGE_SECS": str(a.outage_limit),
            "TUNEHUB_JOB_SLICE_SECS": str(a.slice),
            "TUNEHUB_JOB_MIN_SLICE_SECS": str(a.min_slice),
            "TUNEHUB_LEASE_SECS": "6",
            "TUNEHUB_REPLICA_ID": "faults-bench",
            "TUNEHUB_TRAIN_MODELS": "false",
            "TUNEHUB_MIN_REPEAT_SECS": "0.01",
        }
        ray_env = dict(os.environ)
        ray_env.update(
            TUNEHUB_HOME=str(self.work / "ray-home"),
            PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            TUNEHUB_MIN_REPEAT_SECS="0.01",
        )
        if a.ray:
            self.start_ray(ray_env)
            if self.ray_address:
                env["TUNEHUB_RAY_ADDRESS"] = self.ray_address
                env["RAY_AUTH_MODE"] = ray_env["RAY_AUTH_MODE"]
                env["RAY_AUTH_TOKEN"] = ray_env["RAY_AUTH_TOKEN"]
        else:
            self.ray_skipped = "--no-ray: the Ray worker kill is skipped"
        self.server = LiveServer(home, **env)
        for name in self.args.keys:
            self.keys[name] = create_key(home, "write", "--name", name, **env)
        self.server.start()
        self.log("serve started", url=self.server.url)
        self.phase = "running"
        shapes = iter(SHAPES)
        for key, count in self.args.keys.items():
            for _ in range(count):
                self.submit(key, next(shapes))
        poller = Poller(self)
        poller.start()
        self.log(
            f"{len(self.job_ids)} jobs submitted", ids=f"{self.job_ids[0]}..{self.job_ids[-1]}"
        )
        if self.ray_address:
            self.wait("a Ray worker registered", lambda: self.ray_victim() is not None, 120)
        self.wait("a job runs", lambda: any(j["trials_done"] > 0 for j in self.jobs().values()),
                  120)  # fmt: skip
        if not a.fairness_only:
            self.faults()
        self.phase = "draining"
        self.wait("every job ended",
                  lambda: all(j["state"] in FINAL for j in self.jobs().values()),
                  a.drain)  # fmt: skip
        self.log("every job ended")
        time.sleep(2)
        poller.stop.set()
        poller.join(30)
        self.phase = "report"
        return self.report(poller)

    def faults(self) -> None:
        """The stops and kills, in turn (the jobs meanwhile running)."""
        a = self.args
        self.db_stop(a.short_stop, "db stop 1")
        time.sleep(a.gap)
        self.phase = "serve killed"
        self.log("SIGKILL serve")
        away = time.time()
        self.server.kill()
        self.server.start()
        self.outages.append((away, time.time()))
        self.log("serve restarted")
        self.phase = "after serve kill"
        time.sleep(a.gap)
        if self.ray_address:
            victim = self.ray_victim()
            self.phase = "ray worker killed"
            if victim is None:
                self.log("no live Ray worker to kill")
            else:
                os.kill(victim.pid, signal.SIGKILL)
                self.log("SIGKILL a Ray worker's actor", pid=victim.pid, worker=victim.worker_id)
                self.killed_worker = victim.worker_id

                def replaced() -> bool:
                    found = self.ray_victim()
                    return found is not None and found.worker_id != victim.worker_id

                self.wait("a new Ray worker", replaced, 120)
                self.log("a new Ray worker registered")
            self.phase = "after ray kill"
            time.sleep(a.gap)
        self.db_stop(a.long_stop, "db stop 2 (past the outage limit)")

    def report(self, poller: Poller) -> dict[str, Any]:
        jobs = self.jobs()
        rows = []
        lost = duplicated = 0
        for job_id, job in jobs.items():
            records = self.get(f"/api/v1/jobs/{job_id}/records?limit=1000")["items"]
            # Machine statuses (cancelled by a kill, a lost worker, noisy) are kept beside the
            # trials and release their config: only verdicts are trials (MeasureStatus.verdict).
            verdicts = [r for r in records if r["status"] not in MACHINE_STATUSES]
            per_config = Counter(json.dumps(r["config"], sort_keys=True) for r in verdicts)
            dup = sum(c - 1 for c in per_config.values())
            miss = max(0, job["trials_done"] - len(verdicts))
            if job["state"] == "succeeded" and job["trials_done"] < self.args.trials:
                miss += self.args.trials - job["trials_done"]  # stopped short of its budget
            lost += miss
            duplicated += dup
            rows.append(
                {
                    "id": job_id,
                    "key": self.owner[job_id],
                    "state": job["state"],
                    "trials_done": job["trials_done"],
                    "records": len(records),
                    "verdicts": len(verdicts),
                    "machine_records": dict(
                        Counter(r["status"] for r in records if r["status"] in MACHINE_STATUSES)
                    ),
                    "unique_configs": len(per_config),
                    "duplicated": dup,
                    "missing": miss,
                    "replayed": job["replayed"],
                    "resumes": job["resumes"],
                    "started_at": job["started_at"],
                    "finished_at": job["finished_at"],
                    "error": job["error"],
                }
            )
        fairness = {}
        for key in self.args.keys:
            starts = [
                datetime.fromisoformat(j["started_at"]).timestamp()
                for i, j in jobs.items()
                if self.owner[i] == key and j["started_at"]
            ]
            if not starts:
                fairness[key] = {"jobs": self.args.keys[key], "first_start_delay_secs": None}
                continue
            begin, end = self.first_submit[key], min(starts)
            # The database stops and serve's restart in between: no job can start then.
            away = sum(max(0.0, min(end, b) - max(begin, a)) for a, b in self.outages)
            fairness[key] = {
                "jobs": self.args.keys[key],
                "first_start_delay_secs": round(end - begin, 1),
                "in_slices": round((end - begin) / self.args.slice, 2),
                "outage_secs_meanwhile": round(away, 1),
                "in_slices_without_outages": round((end - begin - away) / self.args.slice, 2),
            }
        codes = {route: dict(c) for route, c in sorted(poller.codes.items())}
        total = Counter[str]()
        for c in poller.codes.values():
            total.update(c)
        return {
            "benchmark": "faults",
            "issue": 27,
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "host": platform.node()},
            "quick": self.args.quick,
            "fairness_only": self.args.fairness_only,
            "settings": {
                "jobs": len(self.job_ids),
                "keys": self.args.keys,
                "trials_per_job": self.args.trials,
                "template": "blis.gemm",
                "slice_secs": self.args.slice,
                "min_slice_secs": self.args.min_slice,
                "db_outage_limit_secs": self.args.outage_limit,
                "db_stops_secs": [self.args.short_stop, self.args.long_stop],
                "ray": self.ray_address is not None,
            },
            "ray_skipped": self.ray_skipped,
            "duration_secs": round(now() - self.t0, 1),
            "http_500": total.get("500", 0),
            "http_500_samples": poller.fivehundreds[:10],
            "statuses": dict(total),
            "statuses_by_phase": {p: dict(c) for p, c in poller.by_phase.items()},
            "statuses_by_route": codes,
            "submissions": dict(self.submit_codes),
            "poll_rounds": poller.rounds,
            "lost_results": lost,
            "duplicated_results": duplicated,
            "replayed": sum(r["replayed"] for r in rows),
            "states": dict(Counter(r["state"] for r in rows)),
            "fairness": fairness,
            "killed_ray_worker": self.killed_worker,
            # As GET /api/v1/workers lists them at the end: the killed actor stays, `lost`.
            "workers": [
                {k: w.get(k) for k in ("worker_id", "kind", "state", "lost_reason")}
                for w in self.get("/api/v1/workers")["workers"]
            ],
            "events": self.events,
            "jobs": rows,
        }

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.server.stop()
        for proc in reversed(self.ray_procs):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(10)
        with contextlib.suppress(Exception):
            self.pg.close()


def summary(out: dict[str, Any]) -> str:
    lines = [
        f"faults: {out['settings']['jobs']} jobs x {out['settings']['trials_per_job']} trials "
        f"(blis.gemm) from {len(out['fairness'])} keys on {out['machine']['cpu']} "
        f"({out['machine']['cores']} cores), "
        f"{out['duration_secs']} s",
        f"  HTTP 500: {out['http_500']} of {sum(out['statuses'].values())} polled requests "
        f"({out['poll_rounds']} rounds); statuses {out['statuses']}",
        f"  final states: {out['states']}",
        f"  lost results: {out['lost_results']}, duplicated: {out['duplicated_results']}, "
        f"replayed from the journal: {out['replayed']}",
    ]
    for e in out["events"]:
        if "recovery_secs" in e:
            lines.append(f"  {e['phase']}: health ok {e['recovery_secs']} s after it came back")
    for key, f in out["fairness"].items():
        lines.append(f"  {key} ({f['jobs']} jobs): first job started "
                     f"{f['first_start_delay_secs']} s after its first submission "
                     f"({f['in_slices']} slices of {out['settings']['slice_secs']} s; "
                     f"{f.get('in_slices_without_outages')} without the "
                     f"{f.get('outage_secs_meanwhile')} s of outages meanwhile)")  # fmt: skip
    if out["killed_ray_worker"]:
        state = {w["worker_id"]: w["state"] for w in out["workers"]}
        lines.append(f"  the killed Ray worker is listed {state.get(out['killed_ray_worker'])!r}"
                     f"; workers: {sorted(state.values())}")  # fmt: skip
    if out["ray_skipped"]:
        lines.append(f"  {out['ray_skipped']}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short stops: a smoke run")
    parser.add_argument("--no-ray", dest="ray", action="store_false", help="skip the Ray part")
    parser.add_argument(
        "--fairness-only",
        action="store_true",
        help="no stops or kills: the same jobs and keys, for the keys' first-job delays alone",
    )
    parser.add_argument("--out", type=Path, help="where the JSON goes")
    args = parser.parse_args()
    args.short_stop, args.long_stop, args.outage_limit = (30.0, 150.0, 60.0)
    args.slice, args.gap, args.drain, args.keys, args.trials = 20.0, 12.0, 900.0, KEYS, 6
    args.min_slice = 5.0  # with 3 keys waiting a slice is 20/3 s (TUNEHUB_JOB_MIN_SLICE_SECS)
    if args.quick:
        args.short_stop, args.long_stop, args.outage_limit, args.gap = 5.0, 12.0, 4.0, 5.0
        args.keys, args.trials = QUICK_KEYS, 4
    work = Path(tempfile.mkdtemp(prefix="tunehub-faults-"))
    bench = Bench(args, work)

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupted)  # its servers are stopped as on Ctrl-C
    try:
        out = bench.run()
    except BaseException:
        print(f"failed; logs under {work}", file=sys.stderr)
        bench.close()
        raise
    bench.close()
    text = summary(out)
    print(text)
    if args.out is None:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M")
        name = ("quick-" if args.quick else "") + ("fairness-" if args.fairness_only else "")
        args.out = REPO / "benchmarks" / "results" / f"faults-{name}vm-{stamp}.json"
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")
    shutil.rmtree(work, ignore_errors=True)
    bad = out["http_500"] or out["lost_results"] or out["duplicated_results"]
    return 1 if bad or set(out["states"]) != {"succeeded"} else 0


if __name__ == "__main__":
    sys.exit(main())
