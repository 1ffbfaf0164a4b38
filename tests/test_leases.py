"""Leases and outages on a real PostgreSQL server: two ``tunehub serve`` replicas share jobs and
one is killed mid-job; the database refuses connections mid-job, briefly and for too long.

Each test makes its own database (``tunehub_test_…``) and drops it; only that database is ever
closed to connections, never ``postgres`` or another helper's.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from concurrent.futures import Future
from itertools import pairwise
from pathlib import Path

import pytest
from sqlalchemy import create_engine, make_url, text
from sqlalchemy.pool import NullPool

from tests.db_fixtures import DEFAULT_PG_URL, PG_URL_ENV, empty_pg_database
from tests.live import LiveServer
from tests.test_runner import WORKLOAD, replay_history, submit, wait_finished, wait_for
from tunehub.client import TunehubClient
from tunehub.core import JobState, MeasureRecord, MeasureRequest, MeasureResult, local_cpu_target
from tunehub.db import SqlScheduleStore, upgrade
from tunehub.db.engine import normalize_url
from tunehub.db.journal import ResultJournal
from tunehub.service.runner import JobRunner
from tunehub.workers.replay import ReplayMeasurer

pytestmark = pytest.mark.postgres


@pytest.fixture
def own_pg() -> Iterator[str]:
    """A database of this test's own at head, dropped afterwards."""
    for url in empty_pg_database():
        upgrade(url)
        yield url


def allow_connections(url: str, allow: bool) -> None:
    """Open or close ``url``'s database to new connections; closing also ends the open ones,
    as a database restart or a network cut would."""
    name = make_url(url).database
    assert name is not None and name.startswith("tunehub_test_"), name  # ours, nobody else's
    admin = create_engine(
        normalize_url(os.environ.get(PG_URL_ENV, DEFAULT_PG_URL)),
        isolation_level="AUTOCOMMIT",
        poolclass=NullPool,
    )
    try:
        with admin.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS {str(allow).lower()}'))
            if not allow:
                conn.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                        " WHERE datname = :name AND pid <> pg_backend_pid()"
                    ),
                    {"name": name},
                )
    finally:
        admin.dispose()


class PacedReplay(ReplayMeasurer):
    """A replay measurer that takes ``secs`` per candidate, as a real device would."""

    def __init__(self, history: list[MeasureRecord], secs: float) -> None:
        super().__init__(history, target=local_cpu_target())
        self.secs = secs

    def submit(self, request: MeasureRequest) -> Future[MeasureResult]:
        time.sleep(self.secs)
        return super().submit(request)


# --- the database away ---------------------------------------------------------------------
def test_results_measured_while_the_database_is_away_are_stored_once_it_returns(
    own_pg: str,
) -> None:
    store = SqlScheduleStore(own_pg)
    target = local_cpu_target()
    history = replay_history(target)
    job_id = submit(store, target, trials=60)
    runner = JobRunner(store, lambda: PacedReplay(history, 0.1), poll_secs=0.05, heartbeat_secs=0.5)
    runner.start()
    try:
        wait_for(lambda: store.get_job(job_id).trials_done >= 5, 30)
        allow_connections(own_pg, False)
        try:
            wait_for(lambda: runner.problems, 10)  # degraded: the heartbeat cannot write
            time.sleep(3)  # candidates go on being measured meanwhile
        finally:
            allow_connections(own_pg, True)
        assert wait_finished(store, job_id, 60) is JobState.SUCCEEDED
        wait_for(lambda: not runner.problems, 10)
    finally:
        runner.stop()
    job = store.get_job(job_id)
    records = store.job_records(job_id)
    assert job.trials_done == 60 == len(records) == len({r.config.key for r in records})
    # Stored in the order they were measured, the waiting ones too.
    assert [r.created_at for r in records] == sorted(r.created_at for r in records)
    assert job.state is JobState.SUCCEEDED and job.error == ""
    store.close()


def test_a_database_away_longer_than_allowed_fails_the_job_naming_the_outage(
    own_pg: str,
) -> None:
    store = SqlScheduleStore(own_pg)
    target = local_cpu_target()
    job_id = submit(store, target, trials=400)
    runner = JobRunner(
        store,
        lambda: PacedReplay(replay_history(target), 0.05),
        poll_secs=0.05,
        heartbeat_secs=0.5,
        db_outage_secs=1.0,
    )
    runner.start()
    try:
        wait_for(lambda: store.get_job(job_id).trials_done >= 3, 30)
        allow_connections(own_pg, False)
        try:
            time.sleep(4)
        finally:
            allow_connections(own_pg, True)
        assert wait_finished(store, job_id, 60) is JobState.FAILED
    finally:
        runner.stop()
    job = store.get_job(job_id)
    assert "database was unreachable" in job.error and "TUNEHUB_DB_OUTAGE_SECS" in job.error
    assert "could not be stored" in job.error
    records = store.job_records(job_id)
    assert 3 <= job.trials_done == len(records) < 400  # what was stored is counted, no more
    store.close()


def test_a_database_away_longer_than_allowed_journals_the_results_and_replays_them(
    own_pg: str, tmp_path: Path
) -> None:
    """Past TUNEHUB_DB_OUTAGE_SECS results go to the result journal and the job goes on; once
    the database is back they are replayed into it, each once, and the job says how many
    (issue 27)."""
    store = SqlScheduleStore(own_pg)
    target = local_cpu_target()
    trials = 60
    job_id = submit(store, target, trials=trials)
    journal = ResultJournal.in_home(tmp_path)
    runner = JobRunner(
        store,
        lambda: PacedReplay(replay_history(target), 0.05),
        poll_secs=0.05,
        heartbeat_secs=0.5,
        db_outage_secs=1.0,
        journal=journal,
    )
    runner.start()
    try:
        wait_for(lambda: store.get_job(job_id).trials_done >= 3, 30)
        allow_connections(own_pg, False)
        try:
            wait_for(lambda: len(journal) >= 5, 20)  # past the limit: on disk, fsynced
        finally:
            allow_connections(own_pg, True)
        assert wait_finished(store, job_id, 60) is JobState.SUCCEEDED
    finally:
        runner.stop()
    job = store.get_job(job_id)
    records = store.job_records(job_id)
    assert job.trials_done == trials == len(records) == len({r.config.key for r in records})
    assert job.replayed >= 5 and job.error == "", job
    assert not journal  # replayed and emptied
    store.close()


# --- two replicas ----------------------------------------------------------------------------
def test_a_replica_killed_mid_job_loses_it_and_the_other_resumes_it(
    own_pg: str, tmp_path: Path
) -> None:
    """Two ``tunehub serve`` processes on one database take jobs from one queue; the one
    holding a job is killed with SIGKILL; after its lease the other resumes it from its
    records: every job ends with each config measured once, none lost, none twice."""
    env = {
        "TUNEHUB_DATABASE_URL": own_pg,
        "TUNEHUB_LEASE_SECS": "3",
        "TUNEHUB_TEST_BUILD_SECS": "0.05",
        "TUNEHUB_TEST_RUN_SECS": "0.1",
        "TUNEHUB_LOCK_DIR": str(tmp_path / "locks"),
        "TUNEHUB_TRAIN_MODELS": "false",
        "TUNEHUB_TEST_REPLICA_RUNS": str(tmp_path / "runs.log"),
    }
    trials = 16
    replicas = [LiveServer(tmp_path / name, **env) for name in ("a", "b")]
    store = SqlScheduleStore(own_pg)
    try:
        for replica in replicas:
            replica.start()
        with TunehubClient(replicas[0].url, api_key=replicas[0].key) as client:
            job_ids = [
                client.submit_job(
                    {"m": 8 + i, "n": 8, "k": 8},
                    template="test.pipeline",
                    max_trials=trials,
                    max_secs=300,
                )["id"]
                for i in range(3)
            ]

        def victim_job() -> int | None:
            for job_id in job_ids:
                job = store.get_job(job_id)
                if job.state is JobState.RUNNING and job.trials_done >= 3:
                    return job_id
            return None

        wait_for(lambda: victim_job() is not None, 120)
        job_id = victim_job()
        assert job_id is not None
        pid = int(store.get_job(job_id).owner.split(":")[1])
        (killed,) = [r for r in replicas if r.proc is not None and r.proc.pid == pid]
        (survivor,) = [r for r in replicas if r is not killed]
        before = store.count_job_records(job_id)
        killed.kill()  # SIGKILL to its process group: the replica and its sandboxes, as a crash
        with TunehubClient(survivor.url, api_key=survivor.key) as client:
            for other in job_ids:
                done = client.wait(other, timeout_secs=240)
                assert done["state"] == "succeeded", (done, survivor.logs())
        taken_over = store.get_job(job_id)
        assert taken_over.owner.split(":")[1] == str(survivor.proc.pid)  # type: ignore[union-attr]
        assert store.count_job_records(job_id) > before  # the survivor measured the rest
        for other in job_ids:
            job = store.get_job(other)
            records = store.job_records(other)
            verdicts = [r for r in records if r.verdict]
            assert job.trials_done == trials == len(verdicts)
            assert len({r.config.key for r in verdicts}) == trials  # none twice
            # The killed replica's in-flight candidate died with it: no record of it at all.
            assert len(records) == len({r.config.key for r in records})
        # From the runs each replica timed: each job's runs on one replica and on the other
        # fall in disjoint spans (one held it, then the other), and the killed one's job was
        # run by both.
        pids = {r.proc.pid for r in replicas if r.proc is not None}
        spans: dict[tuple[int, int], tuple[float, float]] = {}
        orphaned = 0
        for line in (tmp_path / "runs.log").read_text().splitlines():
            m, ppid, start, end = line.split()
            if int(ppid) not in pids:
                # A sandbox of the killed replica finishing the run it was in (it exits within
                # a second of its parent): its result reached no one.
                orphaned += 1
                continue
            key = (int(m), int(ppid))
            first, last = spans.get(key, (float(start), float(end)))
            spans[key] = (min(first, float(start)), max(last, float(end)))
        assert orphaned <= 3
        killed_m = 8 + job_ids.index(job_id)
        assert {ppid for m, ppid in spans if m == killed_m} == pids  # taken over
        for m in {m for m, _ in spans}:
            held = sorted(span for (mm, _), span in spans.items() if mm == m)
            for (_, end), (start, _) in pairwise(held):
                assert end <= start, f"job of m={m} ran on both replicas at once"
    finally:
        for replica in replicas:
            replica.stop()
        store.close()


def test_run_job_writes_as_the_owner_that_claimed_the_job(own_pg: str) -> None:
    """A job claimed by another owner (a caller that runs it itself) is fenced by that owner,
    not by the runner's own id."""
    store = SqlScheduleStore(own_pg)
    target = local_cpu_target()
    job_id = submit(store, target, trials=2)
    JobRunner(store, lambda: PacedReplay(replay_history(target), 0)).run_job(
        store.claim_job(owner="x:1:y") or pytest.fail("nothing to claim")
    )
    assert store.get_job(job_id).state is JobState.SUCCEEDED
    assert store.get_schedule(workload_key=WORKLOAD.key, target_key=target.target_key)
    store.close()
