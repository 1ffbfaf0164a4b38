"""Measurement through Ray on a real local cluster: actors per node, jobs through the runner,
builds beside timing on an actor, a killed actor, a lost node (with and without another of its
target), a killed service, `serve --ray local`, the database away mid-job (PostgreSQL), a worker
whose fingerprint is not the target it claims."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import os
import pickle
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import tests.faulty_template  # registers the test templates in this process too
from tests.db_fixtures import empty_pg_database
from tests.live import LiveServer, ServedApp
from tests.ray_fixtures import *  # noqa: F403 - the ray_cluster fixture (skips without Ray)
from tests.ray_fixtures import REPO, add_worker_node
from tests.test_leases import allow_connections
from tests.test_local_measurer import FAST, alive
from tests.test_runner import wait_finished, wait_for
from tunehub.core import (
    Budget,
    Config,
    JobSpec,
    JobState,
    MeasureRequest,
    MeasureResult,
    MeasureStatus,
    Workload,
    local_cpu_target,
    utc_now,
)
from tunehub.db import MemoryScheduleStore, ScheduleStore, SqlScheduleStore, upgrade
from tunehub.kernels.registry import get_template
from tunehub.service.app import create_app
from tunehub.service.routes_jobs import job_out
from tunehub.service.runner import JobRunner
from tunehub.service.settings import Settings
from tunehub.workers.ray_measurer import RayCluster

WORKLOAD = Workload(m=16, n=16, k=16)
OPTIONS = {"timeout_secs": 3.0, "build_timeout_secs": 3.0, "timing": FAST}


def submit(store: ScheduleStore, template: str, trials: int, workload: Workload = WORKLOAD) -> int:
    target = local_cpu_target()
    store.put_target(target)
    spec = JobSpec(
        workload=workload,
        target_key=target.target_key,
        template=template,
        strategy="exhaustive",
        budget=Budget(max_trials=trials, max_secs=300),
    )
    return store.create_job(spec).id


def check_records(store: ScheduleStore, job_id: int, template: str, trials: int) -> None:
    """Each config the job asked for has exactly one final record, nothing else was measured,
    and the schedule is the best ``ok`` one."""
    target = local_cpu_target()
    asked = [c.key for c in get_template(template).space(WORKLOAD, target).points[:trials]]
    records = store.job_records(job_id)
    finals = [r for r in records if r.verdict]
    assert sorted(r.config.key for r in finals) == sorted(asked)
    assert {r.config.key for r in records} <= set(asked)
    assert store.get_job(job_id).trials_done == trials
    ok = [r for r in finals if r.status is MeasureStatus.OK]
    schedule = store.get_schedule(
        workload_key=WORKLOAD.key, target_key=target.target_key, template=template
    )
    assert ok and schedule is not None
    assert schedule.record_uid in {r.uid for r in ok}
    confirmed = schedule.confirmation
    if confirmed is None:
        best = min(r.median_secs or 0.0 for r in ok)
        assert schedule.median_secs == best
    else:  # the top few were re-timed side by side: the winner is the fastest of those
        assert confirmed.median_secs <= min(confirmed.others.values(), default=float("inf"))


@pytest.fixture
def runner(ray_cluster: Any) -> Iterator[JobRunner]:
    store = MemoryScheduleStore()
    cluster = RayCluster(ray_cluster.address, options=OPTIONS)
    job_runner = JobRunner(store, poll_secs=0.05, heartbeat_secs=0.5)
    job_runner.attach_cluster(cluster, discover_secs=0.5)
    try:
        yield job_runner
    finally:
        job_runner.stop()
        cluster.close()


@pytest.fixture
def two_nodes(ray_cluster: Any) -> Iterator[list[Any]]:
    nodes = [add_worker_node(ray_cluster), add_worker_node(ray_cluster)]
    try:
        yield nodes
    finally:
        for node in nodes:
            if node in ray_cluster.worker_nodes:  # a test may have removed it already
                ray_cluster.remove_node(node, allow_graceful=False)


def ray_workers(store: ScheduleStore) -> list[Any]:
    """The Ray workers registered and not lost (a dead actor's row stays, marked lost)."""
    return [w for w in store.list_workers() if w.kind == "ray" and w.info.get("state") != "lost"]


def lost_workers(store: ScheduleStore) -> list[Any]:
    return [w for w in store.list_workers() if w.info.get("state") == "lost"]


def test_requests_and_results_are_plain_data_that_pickle() -> None:
    request = MeasureRequest(WORKLOAD, local_cpu_target(), "test.faulty", 1, {"mode": "ok"})  # type: ignore[arg-type]
    result = MeasureResult(MeasureStatus.OK, repeat_secs=(1e-3, 2e-3), environment={"a": 1})
    assert pickle.loads(pickle.dumps(request)) == request
    assert pickle.loads(pickle.dumps(result)) == result


def test_a_job_runs_on_the_actors_of_its_target_and_a_crash_costs_one_record(
    runner: JobRunner, two_nodes: list[Any]
) -> None:
    store = runner.store
    job_id = submit(store, "test.faulty", trials=11)
    runner.start()
    wait_for(lambda: len(ray_workers(store)) == 2, timeout=60)
    workers = ray_workers(store)
    assert {w.target_key for w in workers} == {local_cpu_target().target_key}
    assert len({w.info["node"] for w in workers}) == 2  # one actor per node
    for worker in workers:
        assert worker.device == "cpu" and worker.info["capacity"] >= 2
        assert worker.info["device_name"] == local_cpu_target().name
    busy: list[dict[str, Any]] = []

    def seen_busy() -> bool:
        busy.extend(
            w.info for w in ray_workers(store) if w.info.get("state") in ("building", "timing")
        )
        return bool(busy) or store.get_job(job_id).state.finished

    wait_for(seen_busy, timeout=60)
    assert wait_finished(store, job_id, 90) is JobState.SUCCEEDED
    # The hang alone holds an actor in `timing` for seconds, against a 0.5 s heartbeat.
    assert busy, "no ray worker was ever seen building or timing"
    assert busy[0]["job_id"] == job_id
    assert busy[0]["config"]["mode"] in tests.faulty_template.MODES
    check_records(store, job_id, "test.faulty", 11)
    by_mode = {r.config["mode"]: r.status for r in store.job_records(job_id)}
    assert by_mode["crash"] is MeasureStatus.RUNTIME_ERROR
    assert by_mode["hang"] is MeasureStatus.TIMEOUT
    assert by_mode["build_crash"] is MeasureStatus.BUILD_ERROR
    assert by_mode["ok"] is MeasureStatus.OK
    # Crashes and hangs killed sandboxes, never an actor: the same two workers are there.
    assert {w.worker_id for w in ray_workers(store)} == {w.worker_id for w in workers}


def test_a_killed_actor_s_requests_are_measured_by_another_and_the_job_goes_on(
    runner: JobRunner, two_nodes: list[Any]
) -> None:
    store = runner.store
    job_id = submit(store, "test.pipeline", trials=24)
    runner.start()
    cluster = runner.cluster
    assert cluster is not None
    wait_for(lambda: len(store.job_records(job_id)) >= 3, timeout=60)
    with cluster.lock:
        victim = max(cluster.slots.values(), key=lambda s: s.in_flight)
    assert victim.in_flight > 0, "nothing was in flight on the actor to kill"
    cluster.kill_slot(victim)
    assert wait_finished(store, job_id, 90) is JobState.SUCCEEDED
    check_records(store, job_id, "test.pipeline", 24)
    statuses = {r.status for r in store.job_records(job_id)}
    assert statuses == {MeasureStatus.OK}, "a lost actor cost a config its verdict"
    # The runner's discovery (every 0.5 s) retires the dead actor's worker; on a loaded
    # machine the job can finish first, so wait for it rather than race it.
    wait_for(lambda: victim.worker_id not in {w.worker_id for w in ray_workers(store)}, timeout=30)
    (lost,) = lost_workers(store)  # kept, with why
    assert lost.worker_id == victim.worker_id and lost.info["lost"]


def test_a_lost_node_s_requests_are_measured_on_the_other_node_and_the_job_goes_on(
    runner: JobRunner,
    two_nodes: list[Any],
    ray_cluster: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A whole worker node killed (its raylet, the actor and its sandboxes): the calls it had
    in flight go to the actor on the other node of the target, and the job never stops."""
    store = runner.store
    job_id = submit(store, "test.pipeline", trials=24)
    with caplog.at_level(logging.WARNING, logger="tunehub.workers.ray_measurer"):
        runner.start()
        cluster = runner.cluster
        assert cluster is not None
        wait_for(lambda: len(store.job_records(job_id)) >= 3, timeout=60)
        with cluster.lock:
            victim = max(cluster.slots.values(), key=lambda s: s.in_flight)
            in_flight = victim.in_flight
        assert in_flight > 0, "nothing was in flight on the node to kill"
        (node,) = [n for n in two_nodes if n.node_id == victim.node_id]
        ray_cluster.remove_node(node, allow_graceful=False)
        assert wait_finished(store, job_id, 90) is JobState.SUCCEEDED
    check_records(store, job_id, "test.pipeline", 24)
    assert {r.status for r in store.job_records(job_id)} == {MeasureStatus.OK}
    retried = [r.getMessage() for r in caplog.records if r.getMessage().startswith("retrying")]
    assert retried, "the lost node's calls were not sent to another worker"
    (left,) = ray_workers(store)
    assert left.info["node"] != victim.node_id and left.worker_id != victim.worker_id


def start_worker_process(address: str) -> subprocess.Popen[bytes]:
    """``tunehub worker`` as a user runs it: a Ray node of its own, in its own session."""
    return subprocess.Popen(
        [sys.executable, "-m", "tunehub.cli", "worker", "--address", address, "--gpus", "none"],
        cwd=REPO,
        env=dict(os.environ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the worker and its node's processes (raylet, actors), as a machine lost."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def test_a_lost_node_hands_the_job_back_until_a_worker_joins(
    runner: JobRunner, ray_cluster: Any
) -> None:
    store = runner.store
    job_id = submit(store, "test.pipeline", trials=20)
    first = start_worker_process(ray_cluster.address)
    second: subprocess.Popen[bytes] | None = None
    try:
        runner.start()
        wait_for(lambda: len(store.job_records(job_id)) >= 3, timeout=90)
        (lost,) = ray_workers(store)
        kill_group(first)
        # No worker of the target is left: the job goes back to the queue and says why.
        wait_for(lambda: store.get_job(job_id).state is JobState.QUEUED, timeout=60)
        wait_for(lambda: not ray_workers(store), timeout=30)
        waiting = job_out(store, store.get_job(job_id)).waiting_for or ""
        assert waiting.startswith("waiting for a worker of target")
        done_before = len([r for r in store.job_records(job_id) if r.verdict])
        assert done_before < 20
        second = start_worker_process(ray_cluster.address)
        assert wait_finished(store, job_id, 120) is JobState.SUCCEEDED
        (joined,) = ray_workers(store)
        assert joined.worker_id != lost.worker_id and joined.info["node"] != lost.info["node"]
    finally:
        kill_group(first)
        if second is not None:
            kill_group(second)
    check_records(store, job_id, "test.pipeline", 20)


def ok_records(store: ScheduleStore, job_id: int) -> int:
    return sum(r.status is MeasureStatus.OK for r in store.job_records(job_id))


def test_a_sigkilled_actor_is_listed_lost_and_a_killed_worker_command_stops_its_node_at_once(
    runner: JobRunner, ray_cluster: Any, tmp_path: Path
) -> None:
    """An actor's process SIGKILLed (the OOM killer) stays in GET /api/v1/workers as `lost`
    with why, and a new actor takes its device; `tunehub worker` SIGKILLed takes its node down
    within seconds (not after Ray's 30 s drain, measuring all the while)."""
    store = runner.store
    job_id = submit(store, "test.pipeline", trials=60)
    proc = start_worker_process(ray_cluster.address)
    settings = Settings(home=tmp_path, run_jobs=False, train_models=False)
    try:
        runner.start()
        with ServedApp(create_app(settings, store=store)) as app:

            def listed() -> dict[str, dict[str, Any]]:
                found = httpx.get(f"{app.url}/api/v1/workers", timeout=10).json()["workers"]
                return {w["worker_id"]: w for w in found if w["kind"] == "ray"}

            wait_for(lambda: ok_records(store, job_id) >= 3, timeout=90)
            (victim,) = ray_workers(store)
            os.kill(victim.pid, signal.SIGKILL)
            wait_for(lambda: listed().get(victim.worker_id, {}).get("state") == "lost", 30)
            row = listed()[victim.worker_id]
            assert row["live"] is False and row["job_id"] is None and row["config"] is None
            assert "actor died" in row["lost_reason"], row  # Ray's words
            wait_for(lambda: len(ray_workers(store)) == 1, timeout=60)
            (second,) = ray_workers(store)
            assert second.worker_id != victim.worker_id
            assert second.info["node"] == victim.info["node"]
            done = ok_records(store, job_id)
            wait_for(lambda: ok_records(store, job_id) >= done + 2, timeout=60)
            sandboxes = children(second.pid)
            proc.kill()  # SIGKILL `tunehub worker` alone: its `ray start` is told by the kernel
            proc.wait(10)
            killed = time.monotonic()
            wait_for(lambda: not alive(second.pid), timeout=10)
            wait_for(lambda: not any(alive(pid) for pid in sandboxes), timeout=5)
            assert time.monotonic() - killed < 10
            settled = ok_records(store, job_id)
            time.sleep(1.0)
            assert ok_records(store, job_id) == settled, "the node measured on"
            wait_for(lambda: listed()[second.worker_id]["state"] == "lost", 30)
            assert {w["state"] for w in listed().values()} == {"lost"}
    finally:
        kill_group(proc)
        with contextlib.suppress(ProcessLookupError):  # what it left, had it left anything
            os.killpg(proc.pid, signal.SIGKILL)


def test_a_worker_whose_fingerprint_is_not_the_target_it_claims_is_refused(
    runner: JobRunner, ray_cluster: Any, caplog: pytest.LogCaptureFixture
) -> None:
    store = runner.store
    other_machine = "0" * 64
    node = add_worker_node(ray_cluster, claim=other_machine)
    try:
        with caplog.at_level(logging.ERROR, logger="tunehub.workers.ray_measurer"):
            runner.sync_cluster()
    finally:
        ray_cluster.remove_node(node, allow_graceful=False)
    assert ray_workers(store) == []
    assert runner.cluster is not None and runner.cluster.pools == {}
    refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert refused and f"claims target {other_machine[:12]}" in refused[0]
    assert local_cpu_target().name in refused[0]


def test_a_refusal_names_what_differs_from_a_target_the_service_knows(
    runner: JobRunner, ray_cluster: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A node claiming a known target — this CPU as it was with another compiler (another
    driver, for a GPU) — is refused, naming the field and both values."""
    store = runner.store
    here = local_cpu_target()
    other = dataclasses.replace(here, toolchain={**here.toolchain, "cc": "gcc 4.8.5"})
    store.put_target(other)
    node = add_worker_node(ray_cluster, claim=other.target_key)
    try:
        with caplog.at_level(logging.ERROR, logger="tunehub.workers.ray_measurer"):
            runner.sync_cluster()
    finally:
        ray_cluster.remove_node(node, allow_graceful=False)
    assert ray_workers(store) == []
    (refused,) = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert "differs in toolchain:" in refused and "gcc 4.8.5" in refused, refused
    assert repr(here.toolchain) in refused  # what it has, beside what it claims


def test_the_worker_command_refuses_a_claim_its_fingerprint_does_not_match(
    ray_cluster: Any,
) -> None:
    import ray

    nodes_before = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    out = subprocess.run(
        [sys.executable, "-m", "tunehub.cli", "worker", "--address", ray_cluster.address,
         "--gpus", "none", "--target", "f" * 64],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 1
    assert "refused: cpu: it claims target ffffffffffff" in out.stderr
    assert local_cpu_target().target_key in out.stderr
    time.sleep(1)
    # It never joined (a node an earlier test removed may still be leaving: look for new ones).
    assert not {n["NodeID"] for n in ray.nodes() if n["Alive"]} - nodes_before


def children(pid: int) -> list[int]:
    """Pids whose parent is ``pid`` (an actor's sandboxes)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()  # noqa: SIM115
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == pid:
                found.append(int(entry))
    return found


def test_a_killed_service_s_actors_stop_and_its_restart_resumes_the_job(
    ray_cluster: Any, tmp_path: Path
) -> None:
    node = add_worker_node(ray_cluster)
    home = tmp_path / "home"
    server = LiveServer(
        home,
        TUNEHUB_RAY_ADDRESS=ray_cluster.address,
        TUNEHUB_MEASURE_TIMEOUT_SECS="5",
        TUNEHUB_MIN_REPEAT_SECS="0.01",
        TUNEHUB_MAX_REPEATS="5",
        TUNEHUB_TRAIN_MODELS="false",
        # The restarted service resumes the job once the killed one's lease has expired: a
        # short lease keeps the test short (the default is 30 s), as in test_e2e.py.
        TUNEHUB_LEASE_SECS="4",
    )
    store = SqlScheduleStore(f"sqlite:///{home / 'tunehub.db'}")
    try:
        server.start()
        job_id = submit(store, "test.pipeline", trials=30)
        wait_for(lambda: len(store.job_records(job_id)) >= 4, timeout=90)
        (worker,) = ray_workers(store)
        sandboxes = children(worker.pid)
        assert sandboxes, "the actor has no sandboxes to check"
        server.kill()  # SIGKILL: no shutdown hook runs
        # Ray kills the dead driver's actors; their sandboxes see their parent go and exit.
        wait_for(lambda: not alive(worker.pid), timeout=30)
        wait_for(lambda: not any(alive(pid) for pid in sandboxes), timeout=30)
        assert store.get_job(job_id).state is JobState.RUNNING  # as the crash left it
        workdirs = Path(os.environ["TUNEHUB_HOME"]) / "ray-actors"
        assert list(workdirs.glob(f"*-{worker.pid}")), "the dead actor left no workdir"
        server.start()
        assert wait_finished(store, job_id, 120) is JobState.SUCCEEDED
        # The next actor on the node removed what the dead one could not.
        assert not list(workdirs.glob(f"*-{worker.pid}"))
    finally:
        server.stop()
        ray_cluster.remove_node(node, allow_graceful=False)
        store.close()
    check_records(store, job_id, "test.pipeline", 30)


def test_serve_ray_local_starts_a_ray_of_its_own_even_beside_another_cluster(
    ray_cluster: Any, tmp_path: Path
) -> None:
    """``tunehub serve --ray local`` measures on this machine through a Ray instance it starts
    in its process, and never joins a cluster that already runs here (found through
    ``RAY_ADDRESS`` or the address file ``ray start`` leaves behind)."""
    import ray

    nodes_before = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    home = tmp_path / "home"
    server = LiveServer(
        home,
        command=[sys.executable, "-m", "tunehub.cli", "serve", "--ray", "local"],
        RAY_ADDRESS=ray_cluster.address,  # another cluster, as `ray start` would announce it
        TUNEHUB_MEASURE_TIMEOUT_SECS="5",
        TUNEHUB_MIN_REPEAT_SECS="0.01",
        TUNEHUB_MAX_REPEATS="5",
        TUNEHUB_TRAIN_MODELS="false",
    )
    store = SqlScheduleStore(f"sqlite:///{home / 'tunehub.db'}")
    try:
        server.start(timeout_secs=180)
        job_id = submit(store, "test.pipeline", trials=6)
        assert wait_finished(store, job_id, 120) is JobState.SUCCEEDED, server.logs()
        (worker,) = ray_workers(store)
        assert worker.device == "cpu" and worker.target_key == local_cpu_target().target_key
        check_records(store, job_id, "test.pipeline", 6)
    finally:
        server.stop()
        store.close()
    # (A node an earlier test removed may still be leaving: only a new one would be its.)
    joined = {n["NodeID"] for n in ray.nodes() if n["Alive"]} - nodes_before
    assert not joined, "it joined our cluster"


def test_two_jobs_of_a_target_share_its_actors_at_once(
    runner: JobRunner, two_nodes: list[Any]
) -> None:
    store = runner.store
    # Two workloads (one target): neither job skips configs because the other measured them.
    jobs = [submit(store, "test.pipeline", 16, Workload(m=16, n=16, k=k)) for k in (16, 32)]
    runner.start()
    wait_for(lambda: all(store.get_job(j).state is JobState.RUNNING for j in jobs), timeout=60)
    for job_id in jobs:
        assert wait_finished(store, job_id, 120) is JobState.SUCCEEDED
    first, second = ([r.seq or 0 for r in store.job_records(j)] for j in jobs)
    # Both ran at once: their records interleave, neither waited for the other to end.
    assert min(first) < max(second) and min(second) < max(first)
    for job_id in jobs:
        records = store.job_records(job_id)
        assert len(records) == 16 == len({r.config.key for r in records})
        assert all(r.status is MeasureStatus.OK for r in records)


def test_an_actor_builds_beside_timing_on_other_cores_and_times_one_at_a_time(
    ray_cluster: Any, tmp_path: Path
) -> None:
    """Through an actor, as on one machine: builds run in parallel on the node's CPU slots,
    also while a candidate is timed but never on the cores it is timed on, and timing is
    exclusive. The test template logs each build's and run's interval and cores."""
    log = tmp_path / "intervals.log"
    env = {"TUNEHUB_TEST_INTERVALS": str(log), "TUNEHUB_TEST_RUN_SECS": "0.2"}
    node = add_worker_node(ray_cluster)
    cluster = RayCluster(ray_cluster.address, options={**OPTIONS, "timeout_secs": 30.0, "env": env})
    try:
        added, _ = cluster.refresh()
        assert {s.node_id for s in added} == {node.node_id}
        measurer = cluster.measurer(local_cpu_target().target_key, job_id=1)
        requests = [
            MeasureRequest(WORKLOAD, local_cpu_target(), "test.pipeline", 1, Config({"i": i}))
            for i in range(10)
        ]
        results = measurer.measure(requests)
    finally:
        cluster.close()
        ray_cluster.remove_node(node, allow_graceful=False)
    assert [r.status for r in results] == [MeasureStatus.OK] * 10
    lines = [line.split() for line in log.read_text().splitlines()]
    builds = [(float(s), float(e), cores) for kind, _, s, e, _, cores in lines if kind == "build"]
    runs = sorted((float(s), float(e), cores) for kind, _, s, e, _, cores in lines if kind == "run")
    assert len(builds) == len(runs) == 10
    for (_, end, _), (start, _, _) in itertools.pairwise(runs):
        assert end <= start, "two candidates were timed at once"
    beside = [(b, r) for b in builds for r in runs if b[0] < r[1] and r[0] < b[1]]
    if len(os.sched_getaffinity(0)) > 1:
        assert beside, "no build ran while a candidate was timed"
        for build, run in beside:
            assert not set(build[2].split(",")) & set(run[2].split(",")), (build, run)


def test_a_request_that_loses_every_worker_it_meets_is_a_worker_error(
    ray_cluster: Any, two_nodes: list[Any]
) -> None:
    cluster = RayCluster(ray_cluster.address, options=OPTIONS, retries=1)
    try:
        added, _ = cluster.refresh()
        assert len(added) == 2
        measurer = cluster.measurer(local_cpu_target().target_key, job_id=1)
        request = MeasureRequest(
            WORKLOAD, local_cpu_target(), "test.worker_killer", 1, Config({"mode": "kill_worker"})
        )
        (result,) = measurer.measure([request])
        # Two actors lost to it (the first try and one retry), then the machine's failure:
        assert result.status is MeasureStatus.WORKER_ERROR and not result.status.verdict
        assert result.error.startswith("lost 2 workers while measuring it")
        assert cluster.pools[local_cpu_target().target_key].slots == []
        # With no actor of the target left, a request is not a verdict either: cancelled.
        (late,) = measurer.measure([request])
        assert late.status is MeasureStatus.CANCELLED and "no worker" in late.error
        # A node's actor comes back on the next look (the nodes are alive): measuring goes on.
        added, removed = cluster.refresh()
        assert len(added) == 2 and len(removed) == 2
        ok = MeasureRequest(
            WORKLOAD, local_cpu_target(), "test.worker_killer", 1, Config({"mode": "ok"})
        )
        assert measurer.measure([ok])[0].status is MeasureStatus.OK
    finally:
        cluster.close()


# --- the database away, measuring through Ray -------------------------------------------------
@pytest.fixture
def own_pg() -> Iterator[str]:
    """A PostgreSQL database of this test's own at head, dropped afterwards (skips without a
    server): only it is ever closed to connections."""
    for url in empty_pg_database():
        upgrade(url)
        yield url


@pytest.fixture
def pg_runner(ray_cluster: Any, own_pg: str) -> Iterator[JobRunner]:
    """The runner of ``runner`` on a PostgreSQL database of its own (one that can go away)."""
    store = SqlScheduleStore(own_pg)
    cluster = RayCluster(ray_cluster.address, options=OPTIONS)
    job_runner = JobRunner(store, poll_secs=0.05, heartbeat_secs=0.5, db_outage_secs=60)
    job_runner.attach_cluster(cluster, discover_secs=0.5)
    try:
        yield job_runner
    finally:
        job_runner.stop()
        cluster.close()
        store.close()


@pytest.mark.postgres
def test_results_measured_through_ray_while_the_database_is_away_are_stored_when_it_returns(
    pg_runner: JobRunner, two_nodes: list[Any], own_pg: str
) -> None:
    store = pg_runner.store
    job_id = submit(store, "test.pipeline", trials=30)
    pg_runner.start()
    wait_for(lambda: store.get_job(job_id).trials_done >= 4, timeout=60)
    away_from = utc_now()
    allow_connections(own_pg, False)
    try:
        wait_for(lambda: pg_runner.problems, timeout=15)  # the heartbeat cannot write
        time.sleep(3)  # the actors go on measuring meanwhile
    finally:
        back_at = utc_now()
        allow_connections(own_pg, True)
    assert wait_finished(store, job_id, 120) is JobState.SUCCEEDED
    wait_for(lambda: not pg_runner.problems, timeout=15)
    check_records(store, job_id, "test.pipeline", 30)
    records = store.job_records(job_id)
    assert {r.status for r in records} == {MeasureStatus.OK}
    # Results that came back while the database was away were kept and stored afterwards.
    kept = [r for r in records if away_from <= r.created_at <= back_at]
    assert kept, "nothing was measured while the database was away"
    assert store.get_job(job_id).error == ""


@pytest.mark.postgres
def test_a_database_away_too_long_fails_a_ray_job_naming_the_outage(
    ray_cluster: Any, two_nodes: list[Any], own_pg: str
) -> None:
    store = SqlScheduleStore(own_pg)
    cluster = RayCluster(ray_cluster.address, options=OPTIONS)
    runner = JobRunner(store, poll_secs=0.05, heartbeat_secs=0.5, db_outage_secs=1.0)
    runner.attach_cluster(cluster, discover_secs=0.5)
    job_id = submit(store, "test.pipeline", trials=60)
    try:
        runner.start()
        wait_for(lambda: store.get_job(job_id).trials_done >= 3, timeout=60)
        allow_connections(own_pg, False)
        try:
            time.sleep(4)
        finally:
            allow_connections(own_pg, True)
        assert wait_finished(store, job_id, 60) is JobState.FAILED
    finally:
        runner.stop()
        cluster.close()
    job = store.get_job(job_id)
    assert "database was unreachable" in job.error and "could not be stored" in job.error
    records = store.job_records(job_id)
    # What was stored is counted, each config once; the rest is named in the error, not lost
    # in silence.
    assert 3 <= job.trials_done == len(records) == len({r.config.key for r in records}) < 60
    store.close()
