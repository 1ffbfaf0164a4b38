"""The cluster topology of docker-compose.yml without Docker, all on this machine: PostgreSQL,
``ray start --head``, two ``tunehub worker`` nodes and two ``tunehub serve --ray`` replicas on
one database. A job is submitted to a replica over HTTP; mid-job the replica holding it and a
worker node are SIGKILLed, and the job finishes anyway through the other replica and the
remaining node, each config measured once.

Every process runs in a process group of its own, and only those groups are killed at the end
(never ``ray stop``, which stops every Ray cluster of this user, other test runs' too). The Ray
cluster has a temp dir and an auth token of its own, and the database is dropped afterwards.
docs/ray.md ("The cluster topology without Docker") lists the same commands.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.db_fixtures import empty_pg_database
from tests.live import REPO, LiveServer, free_port
from tests.test_runner import wait_for
from tunehub.client import TunehubClient
from tunehub.core import MeasureStatus, Workload, local_cpu_target
from tunehub.db import SqlScheduleStore, upgrade
from tunehub.kernels.registry import get_template

pytest.importorskip("ray", reason="Ray is not installed (pip install 'tunehub[cluster]')")
pytestmark = pytest.mark.postgres

WORKLOAD = {"m": 16, "n": 16, "k": 16}
TRIALS = 40
# What every process of the topology gets: the test templates (builds slow enough that the job
# is still running when things are killed), and the cluster's token. Ray turns token
# authentication on by itself only for `ray start --head`; a node or driver given an address
# must be told, as on a real cluster.
COMMON_ENV = {
    "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
    "TUNEHUB_TEMPLATE_MODULES": "tests.faulty_template",
    "TUNEHUB_TEST_BUILD_SECS": "0.3",
    "TUNEHUB_TEST_RUN_SECS": "0.1",
    "RAY_AUTH_MODE": "token",
}
# A lost node is noticed in about ten seconds, not Ray's default twenty-five or more (a hidden
# flag of `ray start`; a real cluster can keep the default). Not quicker: on this loaded
# machine a node whose health check stalls for two seconds would be declared dead while alive.
FAST_FAILURE = {
    "health_check_period_ms": 2000,
    "health_check_failure_threshold": 5,
    "health_check_timeout_ms": 2000,
}


@dataclass
class Topology:
    root: Path  # the Ray temp dir and every process's home and log
    address: str
    env: dict[str, str]
    database_url: str
    groups: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    replicas: list[LiveServer] = field(default_factory=list)

    def spawn(
        self, name: str, args: list[str], *, drop: tuple[str, ...] = (), **env: str
    ) -> subprocess.Popen[bytes]:
        """Start ``args`` in a process group of its own (what kill() ends), logging to a file;
        its environment is the topology's without ``drop``, with ``env``."""
        log = (self.root / f"{name}.log").open("ab")
        proc = subprocess.Popen(
            args,
            cwd=REPO,
            env={**{k: v for k, v in self.env.items() if k not in drop}, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.groups[name] = proc
        return proc

    def kill(self, name: str) -> None:
        """SIGKILL a process group, as a machine lost."""
        proc = self.groups[name]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def logs(self) -> str:
        parts = []
        for path in sorted(self.root.glob("*.log")):
            text = path.read_text(errors="replace")
            parts.append(f"--- {path.name}\n{text[-3000:]}")
        for replica in self.replicas:
            parts.append(f"--- replica {replica.home.name}\n{replica.logs()}")
        return "\n".join(parts)


def ours(root: Path) -> list[int]:
    """Pids of processes whose command line names this test's temp dir: Ray's processes that
    left the group they were started in (none should), found by our own unique path only."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if str(root).encode() in cmdline:
            found.append(int(entry))
    return found


def client_server_port() -> list[str]:
    """A free port for Ray's client server, which only ``ray[client]`` (grpcio) starts.

    Without grpcio, ``ray start`` refuses any ``--ray-client-server-port`` at all; with it, the
    server takes 10001 unless told otherwise, which a second cluster on the host already holds.
    """
    if importlib.util.find_spec("grpc") is None:
        return []
    return ["--ray-client-server-port", str(free_port())]


@pytest.fixture
def topology() -> Iterator[Topology]:
    """PostgreSQL database + Ray head: what the replicas and workers join."""
    for database_url in empty_pg_database():
        upgrade(database_url)
        # Short: Ray's sockets live under it (a Unix socket path has at most 107 bytes).
        root = Path(tempfile.mkdtemp(prefix="th-topo-", dir="/tmp"))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "TUNEHUB_"))}
        env.update(COMMON_ENV, RAY_AUTH_TOKEN=secrets.token_hex(32))
        port = free_port()
        top = Topology(root, f"127.0.0.1:{port}", env, database_url)
        try:
            head = top.spawn(
                "head",
                [
                    sys.executable, "-m", "ray.scripts.scripts", "start", "--head",
                    "--port", str(port), "--num-cpus", "0", "--temp-dir", str(root),
                    "--include-dashboard=false", "--dashboard-port", str(free_port()),
                    "--dashboard-agent-listen-port", str(free_port()),
                    *client_server_port(),
                    "--disable-usage-stats", "--system-config", json.dumps(FAST_FAILURE),
                ],
            )  # fmt: skip
            # `ray start --head` returns once the head runs; its processes stay in its group.
            assert head.wait(180) == 0, top.logs()
            yield top
        finally:
            for replica in top.replicas:
                replica.kill()
            for name in list(top.groups):
                top.kill(name)
            for pid in ours(root):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            shutil.rmtree(root, ignore_errors=True)


def wait(top: Topology, what: str, predicate: Callable[[], bool], timeout: float) -> None:
    """wait_for, failing with the processes' logs (what went wrong is in one of them)."""
    try:
        wait_for(predicate, timeout=timeout)
    except TimeoutError:
        pytest.fail(f"{what}: not in {timeout:.0f} s\n{top.logs()}")


def start_worker(top: Topology, name: str) -> None:
    """``tunehub worker`` as a node of its own; returns once its node has joined.

    Nodes start one at a time: two raylets starting at once on one host can pick the same
    free port, and the loser dies with ``bind: Address already in use`` (on a real cluster
    each node has a host of its own). A node that still loses a port that way (to another
    program on this busy machine) is started once more.
    """
    home = top.root / name
    home.mkdir()
    for _ in range(2):
        proc = top.spawn(
            name,
            [sys.executable, "-m", "tunehub.cli", "worker", "--address", top.address,
             "--cpu", "--gpus", "none"],
            TUNEHUB_HOME=str(home),
            # The nodes share this machine's CPU lock (as their actors must), not other runs'.
            TUNEHUB_LOCK_DIR=str(top.root / "locks"),
        )  # fmt: skip
        log = top.root / f"{name}.log"
        wait(
            top,
            f"{name} joined or exited",
            lambda p=proc, f=log: p.poll() is not None or "Ray runtime started" in f.read_text(),
            180,
        )
        if proc.poll() is None:
            return
    pytest.fail(f"{name} could not join the cluster\n{top.logs()}")


def start_replica(top: Topology, name: str) -> LiveServer:
    env = {k: v for k, v in top.env.items() if k.startswith(("RAY_", "TUNEHUB_"))}
    replica = LiveServer(
        top.root / name,
        command=[sys.executable, "-m", "tunehub.cli", "serve", "--ray", top.address],
        **env,
        TUNEHUB_DATABASE_URL=top.database_url,
        TUNEHUB_LEASE_SECS="3",  # a dead replica's job moves after about this long
        TUNEHUB_TRAIN_MODELS="false",
        TUNEHUB_MEASURE_TIMEOUT_SECS="30",
    )
    top.replicas.append(replica)
    replica.start(timeout_secs=180)
    return replica


def live_ray_workers(replica: LiveServer) -> list[dict[str, Any]]:
    targets = httpx.get(f"{replica.url}/api/v1/targets", timeout=10).json()["items"]
    return [w for t in targets for w in t.get("workers", []) if w["kind"] == "ray"]


def test_a_job_survives_its_replica_and_a_worker_node_killed_mid_job(topology: Topology) -> None:
    top = topology
    # A node given the token but not RAY_AUTH_MODE=token is refused by the head, and
    # `tunehub worker` says what to set. (It fails asking the head for the cluster's id, before
    # any raylet of its own starts, so it runs beside worker-1's start.)
    untold = top.spawn(
        "untold",
        [sys.executable, "-m", "tunehub.cli", "worker", "--address", top.address,
         "--cpu", "--gpus", "none"],
        drop=("RAY_AUTH_MODE",),
        TUNEHUB_HOME=str(top.root / "untold"),
    )  # fmt: skip
    start_worker(top, "worker-1")
    start_worker(top, "worker-2")
    replicas = [start_replica(top, "api-a"), start_replica(top, "api-b")]
    assert untold.wait(120) == 1
    refusal = (top.root / "untold.log").read_text()
    assert "InvalidAuthToken" in refusal and "set RAY_AUTH_MODE=token" in refusal, refusal
    target = local_cpu_target()
    # Each replica places one actor on each worker node: four ray workers of this CPU's target.
    wait(top, "four ray workers", lambda: len(live_ray_workers(replicas[0])) == 4, 120)
    (cpu,) = [t for t in httpx.get(f"{replicas[0].url}/api/v1/targets").json()["items"]]
    assert cpu["target_key"] == target.target_key and cpu["live"]
    assert {w["device"] for w in cpu["workers"]} == {"cpu"}
    workers = httpx.get(f"{replicas[1].url}/api/v1/workers", timeout=10)
    assert workers.status_code == 200, workers.text
    listed = [w for w in workers.json()["workers"] if w["kind"] == "ray"]
    assert len(listed) == 4 and {w["target_key"] for w in listed} == {target.target_key}
    assert len({w["node"] for w in listed}) == 2  # two nodes, an actor of each replica on each
    for worker in listed:
        assert worker["device"] == "cpu" and worker["device_name"] == target.name
        assert worker["state"] in ("idle", "building", "timing") and worker["live"]
        assert worker["heartbeat_at"] and worker["host"]

    store = SqlScheduleStore(top.database_url)
    try:
        with TunehubClient(replicas[0].url, api_key=replicas[0].key) as client:
            job_id = client.submit_job(
                WORKLOAD,
                template="test.pipeline",
                strategy="exhaustive",
                max_trials=TRIALS,
                max_secs=300,
            )["id"]
        wait(top, "records", lambda: store.count_job_records(job_id) >= 4, 120)
        job = store.get_job(job_id)
        assert not job.state.finished, "the job ended before anything could be killed"
        holder_pid = int(job.owner.split(":")[1])
        (holder,) = [r for r in replicas if r.proc is not None and r.proc.pid == holder_pid]
        (survivor,) = [r for r in replicas if r is not holder]
        before = store.count_job_records(job_id)
        holder.kill()  # SIGKILL: its lease is not renewed, its actors die with it
        top.kill("worker-1")  # a whole worker node lost, with the survivor's actor on it

        with TunehubClient(survivor.url, api_key=survivor.key) as client:
            done = client.wait(job_id, timeout_secs=240)
            assert done["state"] == "succeeded", (done, top.logs())
            best = client.best_schedule(WORKLOAD)
        taken_over = store.get_job(job_id)
        assert taken_over.owner.split(":")[1] == str(survivor.proc.pid)  # type: ignore[union-attr]
        assert store.count_job_records(job_id) > before  # the survivor measured the rest

        # Each config asked for ends with exactly one final record, all of them ok (a lost
        # replica or node costs no config its verdict); anything else stored is the machine's
        # failure, never a verdict, and of a config that was asked for.
        space = get_template("test.pipeline").space(Workload(**WORKLOAD), target)
        asked = sorted(c.key for c in space.points[:TRIALS])
        records = store.job_records(job_id)
        finals = [r for r in records if r.verdict]
        assert sorted(r.config.key for r in finals) == asked
        assert {r.status for r in finals} == {MeasureStatus.OK}
        others = [r for r in records if not r.verdict]
        assert {r.status for r in others} <= {MeasureStatus.WORKER_ERROR, MeasureStatus.CANCELLED}
        assert {r.config.key for r in others} <= set(asked)
        assert taken_over.trials_done == TRIALS

        # The schedule is the best ok record, and the surviving replica serves it.
        schedule = store.get_schedule(
            workload_key=Workload(**WORKLOAD).key,
            target_key=target.target_key,
            template="test.pipeline",
        )
        assert schedule is not None and schedule.record_uid in {r.uid for r in finals}
        confirmed = schedule.confirmation
        if confirmed is None:
            assert schedule.median_secs == min(r.median_secs or 0.0 for r in finals)
        else:  # the top few were re-timed side by side: the winner is the fastest of those
            assert confirmed.median_secs <= min(confirmed.others.values(), default=float("inf"))
        assert best is not None and best["record_id"] == schedule.record_uid
    finally:
        store.close()
