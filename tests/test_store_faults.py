"""The service while its store cannot answer: every route 503 with Retry-After (cached lookups
200), never 500; health degraded at once and ok again by itself; recovery without a restart.

The live tests stop and start a PostgreSQL server of their own (initdb into a temporary
directory, on a port of their own), never the machine's shared one, and lock a SQLite database
from a second connection.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sqlite3
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from tests.live import LiveServer, free_port
from tests.test_api import SHAPE, add_key
from tunehub.core import local_cpu_target
from tunehub.core.damped import DampedLog
from tunehub.db import MemoryScheduleStore, SqlScheduleStore, StoreUnavailable, upgrade
from tunehub.db.journal import ResultJournal
from tunehub.service.app import create_app
from tunehub.service.settings import Settings

LOOKUP = "/api/v1/schedules/best?op=matmul&m=64&n=64&k=64&dtype=float32&target=local-cpu"
JOB = {"workload": dict(SHAPE), "budget": {"max_trials": 4, "max_secs": 30}}
AUTOTUNE_KEY = "ab" * 32


def routes(job_id: int) -> list[tuple[str, str, Any]]:
    """One request of each kind: method, path, JSON body."""
    return [
        ("GET", "/api/v1/jobs", None),
        ("GET", f"/api/v1/jobs/{job_id}", None),
        ("GET", f"/api/v1/jobs/{job_id}/records", None),
        ("POST", "/api/v1/jobs", JOB),
        ("GET", LOOKUP.replace("m=64", "m=72"), None),  # never asked: not cached
        ("POST", "/api/v1/schedules/lookup", {"items": [{"workload": {**SHAPE, "m": 72}}]}),
        ("GET", "/api/v1/schedules", None),
        ("GET", "/api/v1/targets", None),
        ("GET", "/api/v1/workers", None),
        ("GET", "/api/v1/models", None),
        ("GET", f"/api/v1/autotune/{AUTOTUNE_KEY}", None),
        ("GET", f"/api/v1/jobs/{job_id}/predictions", None),
        ("GET", "/api/v1/targets/local-cpu", None),
    ]


# --- in process: a store that goes away ------------------------------------------------------
class FlakyStore(MemoryScheduleStore):
    """The memory store, whose every call raises StoreUnavailable while ``down``."""

    down = False

    def __getattribute__(self, name: str) -> Any:
        value = super().__getattribute__(name)
        if (
            not name.startswith("_")
            and callable(value)
            and MemoryScheduleStore.__getattribute__(self, "down")
        ):

            def away(*args: Any, **kwargs: Any) -> Any:
                raise StoreUnavailable("the database is unreachable: connection refused")

            return away
        return value


@pytest.fixture
def flaky(tmp_path: Path) -> Iterator[tuple[TestClient, FlakyStore]]:
    store = FlakyStore()
    app = create_app(Settings(home=tmp_path, run_jobs=False), store=store)
    with TestClient(app, base_url="http://127.0.0.1") as client:
        client.headers["X-API-Key"] = add_key(store)
        yield client, store


def test_every_route_answers_503_with_retry_after_while_the_store_is_away(
    flaky: tuple[TestClient, FlakyStore],
) -> None:
    client, store = flaky
    job_id = client.post("/api/v1/jobs", json=JOB).json()["id"]
    assert client.get(LOOKUP).status_code == 200  # cached from now on
    assert client.get("/healthz").json()["status"] == "ok"
    store.down = True
    health = client.app.state.store_health  # type: ignore[attr-defined]
    health.check_secs = 3600  # only a request's failure may mark it now
    for method, path, body in routes(job_id):
        response = client.request(method, path, json=body)
        assert response.status_code == 503, (method, path, response.text)
        assert response.headers["Retry-After"].isdigit(), (method, path)
        assert "connection refused" in response.json()["detail"], (method, path)
    assert client.get(LOOKUP).status_code == 200  # a cached single lookup still answers
    # Degraded at once, though health's own check is not due.
    got = client.get("/healthz").json()
    assert got["status"] == "degraded" and "connection refused" in got["problems"][0], got
    health.check_secs = 0.0
    store.down = False
    assert client.get("/healthz").json() == {**got, "status": "ok", "problems": []}


def test_health_checks_the_store_itself_with_no_request_and_no_job(
    flaky: tuple[TestClient, FlakyStore],
) -> None:
    client, store = flaky
    client.app.state.store_health.check_secs = 0.0  # type: ignore[attr-defined]
    store.down = True
    assert client.get("/healthz").json()["status"] == "degraded"
    store.down = False
    assert client.get("/healthz").json()["status"] == "ok"


def test_a_repeated_warning_is_said_once_then_counted_each_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    damped = DampedLog(logging.getLogger("tunehub.test"), every_secs=60, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="tunehub.test"):
        for _ in range(4 * 150):  # 4 a second for 150 s
            damped.warning("cannot read the change feed: %s", "refused")
            now[0] += 0.25
        damped.clear("reading it again")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "cannot read the change feed: refused",
        "cannot read the change feed: refused (240 times in the last 60 s)",
        "cannot read the change feed: refused (240 times in the last 60 s)",
        "the last warning repeated 119 more times",
        "reading it again",
    ]


def test_a_repeated_error_gives_its_traceback_once_then_a_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The job runner's loops (Ray discovery, worker states, heartbeats, claims) say a fault
    that repeats every period this way: the traceback once, then a count a minute."""
    now = [0.0]
    damped = DampedLog(logging.getLogger("tunehub.test"), every_secs=60, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="tunehub.test"):
        for _ in range(13):  # every 5 s for a minute
            try:
                raise ConnectionError("the Ray head is away")
            except ConnectionError:
                damped.exception("looking for ray workers failed; tried again later")
            now[0] += 5.0
        damped.clear("looking for ray workers works again")
    said = [(r.levelno, r.getMessage(), r.exc_info is not None) for r in caplog.records]
    failed = "looking for ray workers failed; tried again later"
    assert said == [
        (logging.ERROR, failed, True),
        (logging.ERROR, f"{failed} (12 times in the last 60 s)", True),
        (logging.WARNING, "looking for ray workers works again", False),
    ]


# --- live: a real server and a real database that goes away ----------------------------------
def wait_until(check: Callable[[], bool], secs: float, what: str) -> float:
    start = time.monotonic()
    while time.monotonic() - start < secs:
        if check():
            return time.monotonic() - start
        time.sleep(0.1)
    raise AssertionError(f"not within {secs} s: {what}")


def health_of(server: LiveServer) -> str:
    try:
        return str(httpx.get(f"{server.url}/healthz", timeout=5).json()["status"])
    except httpx.HTTPError:
        return "unreachable"


def check_routes_during_outage(server: LiveServer, job_id: int) -> dict[str, int]:
    """Every route answers 503, or what it answers with the store up (a cached lookup, a read
    on SQLite, which a writer's lock does not stop), never 500 or a reset connection."""
    codes: dict[str, int] = {}
    headers = {"X-API-Key": server.key}
    with httpx.Client(base_url=server.url, headers=headers, timeout=30) as http:
        for method, path, body in [*routes(job_id), ("GET", LOOKUP, None)]:
            response = http.request(method, path, json=body)
            codes[f"{method} {path}"] = response.status_code
            assert response.status_code in (200, 404, 503), (method, path, response.text)
            if response.status_code == 503:
                assert response.headers["Retry-After"].isdigit()
    return codes


def submit(server: LiveServer, trials: int) -> int:
    body = {
        "workload": {"op": "matmul", "m": 8, "n": 8, "k": 8 + trials, "dtype": "float32"},
        "template": "test.pipeline",
        "budget": {"max_trials": trials, "max_secs": 60},
    }
    response = httpx.post(f"{server.url}/api/v1/jobs", json=body,
                          headers={"X-API-Key": server.key}, timeout=30)  # fmt: skip
    assert response.status_code == 202, response.text
    return int(response.json()["id"])


def finish(server: LiveServer, job_id: int, secs: float) -> dict[str, Any]:
    headers = {"X-API-Key": server.key}
    job: dict[str, Any] = {}
    with httpx.Client(base_url=server.url, headers=headers, timeout=30) as http:

        def finished() -> bool:
            nonlocal job
            job = http.get(f"/api/v1/jobs/{job_id}").json()
            return job["state"] in ("succeeded", "failed", "cancelled")

        wait_until(finished, secs, f"job {job_id} finished\n{server.logs()}")
        job["records"] = http.get(f"/api/v1/jobs/{job_id}/records").json()["items"]
    return job


def job_progress(server: LiveServer, job_id: int) -> int:
    response = httpx.get(f"{server.url}/api/v1/jobs/{job_id}",
                         headers={"X-API-Key": server.key}, timeout=10)  # fmt: skip
    return int(response.json()["trials_done"]) if response.status_code == 200 else -1


FAST_SERVER = {
    "TUNEHUB_LOOKUP_REFRESH_SECS": "0.25",
    "TUNEHUB_TEST_BUILD_SECS": "0.02",
    "TUNEHUB_TEST_RUN_SECS": "0.08",
}


class OwnPostgres:
    """A PostgreSQL server of this test's own: initdb into a temporary directory, served on a
    free port; ``stop`` and ``start`` as an operator's restart would."""

    def __init__(self) -> None:
        found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
        bindir = found[-1].parent if found else None
        if bindir is None and shutil.which("initdb"):
            bindir = Path(shutil.which("initdb") or "").parent
        if bindir is None:
            pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl) on this machine")
        self.bindir = bindir
        self.dir = Path(tempfile.mkdtemp(prefix="tunehub-pg-"))
        self.port = free_port()
        self.as_user: list[str] = []
        if os.geteuid() == 0:  # initdb refuses root
            if shutil.which("runuser") is None:
                pytest.skip("running as root without runuser: cannot run initdb")
            shutil.chown(self.dir, "postgres")
            self.as_user = ["runuser", "-u", "postgres", "--"]
        self._run("initdb", "-D", str(self.dir / "data"), "-A", "trust", "-U", "postgres",
                  "--no-sync", "-E", "UTF8")  # fmt: skip
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str) -> None:
        out = subprocess.run(
            [*self.as_user, str(self.bindir / tool), *args],
            capture_output=True, text=True, timeout=60, cwd=self.dir,
        )  # fmt: skip
        assert out.returncode == 0, (tool, out.stdout, out.stderr)

    def start(self) -> None:
        options = (f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off "
                   "-c full_page_writes=off")  # fmt: skip
        self._run("pg_ctl", "-D", str(self.dir / "data"), "-o", options, "-l",
                  str(self.dir / "log"), "-w", "-t", "30", "start")  # fmt: skip

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.dir / "data"), "-m", "fast", "-w", "stop")

    def close(self) -> None:
        with contextlib.suppress(AssertionError):  # already stopped
            self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def own_postgres() -> Iterator[OwnPostgres]:
    server = OwnPostgres()
    try:
        server.start()
        upgrade(server.url)
        yield server
    finally:
        server.close()


def outage_and_recovery(
    server: LiveServer, go_away: Callable[[], None], come_back: Callable[[], None]
) -> None:
    """The checks both stores share: routes during the outage, health, recovery, a job that
    ran through the outage and one submitted after it."""
    headers = {"X-API-Key": server.key}
    first = finish(server, submit(server, 3), 40)
    assert first["state"] == "succeeded", first
    assert httpx.get(f"{server.url}{LOOKUP}", headers=headers, timeout=10).status_code == 200
    trials = 40
    through = submit(server, trials)
    wait_until(lambda: job_progress(server, through) >= 2, 30, "the second job runs")
    go_away()
    try:
        codes = check_routes_during_outage(server, first["id"])
        logging.getLogger(__name__).info("during the outage: %s", codes)
        assert 503 in codes.values(), codes
        wait_until(lambda: health_of(server) == "degraded", 5, "health degraded")
        time.sleep(2)  # the lookup cache's reader fails 8 times meanwhile
        check_routes_during_outage(server, first["id"])
    finally:
        come_back()
    took = wait_until(lambda: health_of(server) == "ok", 10, f"health ok\n{server.logs()}")
    logging.getLogger(__name__).info("health ok %.1f s after the store came back; the job "
                                     "running through it: %d trials", took,
                                     job_progress(server, through))  # fmt: skip
    after = finish(server, submit(server, 3), 40)
    assert after["state"] == "succeeded", (after, server.logs())
    # The job that ran through the outage stored every trial once.
    done = finish(server, through, 60)
    assert done["state"] == "succeeded", (done, server.logs())
    configs = [r["config"]["i"] for r in done["records"]]
    assert done["trials_done"] == trials == len(configs) == len(set(configs)), done
    logs = server.logs()
    assert "Exception in ASGI application" not in logs, logs
    assert logs.count("cannot read the change feed") <= 2, logs


def outage_past_the_limit(
    server: LiveServer, home: Path, go_away: Callable[[], None], come_back: Callable[[], None]
) -> None:
    """The store away longer than TUNEHUB_DB_OUTAGE_SECS (1 s here) mid-job: results go to
    the result journal while the job goes on; routes 503 meanwhile; once the store is back,
    health is ok within 10 s, and the journal is replayed: every result in it stored once,
    counted in the job's ``replayed`` and ``summary``, the journal empty (issue 27)."""
    journal = ResultJournal.in_home(home)
    trials = 30
    job_id = submit(server, trials)
    wait_until(lambda: job_progress(server, job_id) >= 2, 30, "the job runs")
    go_away()
    try:
        wait_until(lambda: len(journal.entries()) >= 4, 30, f"results journaled\n{server.logs()}")
        check_routes_during_outage(server, job_id)
        journaled = {entry.key for entry in journal.entries()}
    finally:
        come_back()
    took = wait_until(lambda: health_of(server) == "ok", 10, f"health ok\n{server.logs()}")
    done = finish(server, job_id, 60)
    logging.getLogger(__name__).info("health ok %.1f s after the store came back; the job "
                                     "replayed %d results (%d seen in the journal)", took,
                                     done["replayed"], len(journaled))  # fmt: skip
    assert done["state"] == "succeeded", (done, server.logs())
    configs = [r["config"]["i"] for r in done["records"]]
    assert done["trials_done"] == trials == len(configs) == len(set(configs)), done
    # Every result the journal held was replayed into the store, none twice.
    assert journaled <= {r["uid"] for r in done["records"]}, done
    assert done["replayed"] >= len(journaled) >= 4, done
    assert f"{done['replayed']} results measured while the database was away" in done["summary"]
    assert not journal and not journal.rejected_path.exists()
    logs = server.logs()
    assert "Exception in ASGI application" not in logs, logs


def test_postgres_stopped_and_started_again_503s_then_recovers_without_a_restart(
    own_postgres: OwnPostgres, tmp_path: Path
) -> None:
    server = LiveServer(tmp_path, TUNEHUB_DATABASE_URL=own_postgres.url, **FAST_SERVER)
    server.start()
    try:
        outage_and_recovery(server, own_postgres.stop, own_postgres.start)
    finally:
        server.stop()


def test_postgres_away_past_the_outage_limit_journals_and_replays_every_result(
    own_postgres: OwnPostgres, tmp_path: Path
) -> None:
    server = LiveServer(
        tmp_path, TUNEHUB_DATABASE_URL=own_postgres.url, TUNEHUB_DB_OUTAGE_SECS="1", **FAST_SERVER
    )
    server.start()
    try:
        outage_past_the_limit(server, tmp_path, own_postgres.stop, own_postgres.start)
    finally:
        server.stop()


def test_sqlite_locked_by_another_process_503s_writes_then_recovers(tmp_path: Path) -> None:
    path = tmp_path / "tunehub.db"
    url = f"sqlite:///{path}?timeout=1"
    upgrade(url)
    server = LiveServer(tmp_path, TUNEHUB_DATABASE_URL=url, **FAST_SERVER)
    server.start()
    holder = sqlite3.connect(path, isolation_level=None, timeout=10)

    def lock() -> None:
        holder.execute("BEGIN EXCLUSIVE")  # every writer now waits for it, then gives up

    try:
        outage_and_recovery(server, lock, lambda: holder.execute("ROLLBACK"))
    finally:
        holder.close()
        server.stop()


# --- recovery: connections of the fault are not kept ------------------------------------------
def test_a_sqlite_connection_that_became_read_only_is_reopened(tmp_path: Path) -> None:
    """A connection opened while its file could not be written stays read-only for its life
    (``PRAGMA query_only`` stands in for it here): after one failed write, it is gone."""
    url = f"sqlite:///{tmp_path / 'tunehub.db'}"
    upgrade(url)
    store = SqlScheduleStore(url)
    try:
        with store.engine.connect() as connection:  # back to the pool, read-only
            connection.exec_driver_sql("PRAGMA query_only=1")
        with pytest.raises(StoreUnavailable, match="readonly"):
            store.ping()
        store.ping()  # a fresh connection
        with store.engine.connect() as connection:
            connection.exec_driver_sql("PRAGMA query_only=1")
        with pytest.raises(StoreUnavailable, match="readonly"):
            store.put_target(local_cpu_target())
        store.put_target(local_cpu_target())
        assert store.get_target(local_cpu_target().target_key) is not None
    finally:
        store.close()


def test_sqlite_unwritable_past_the_outage_limit_journals_and_replays_every_result(
    tmp_path: Path,
) -> None:
    path = tmp_path / "tunehub.db"
    url = f"sqlite:///{path}?timeout=0.5"
    upgrade(url)
    server = LiveServer(tmp_path, TUNEHUB_DATABASE_URL=url, TUNEHUB_DB_OUTAGE_SECS="1",
                        **FAST_SERVER)  # fmt: skip
    server.start()
    holder = sqlite3.connect(path, isolation_level=None, timeout=10)
    try:
        outage_past_the_limit(
            server,
            tmp_path,
            lambda: holder.execute("BEGIN EXCLUSIVE"),  # no other connection may write
            lambda: holder.execute("ROLLBACK"),
        )
    finally:
        holder.close()
        server.stop()
