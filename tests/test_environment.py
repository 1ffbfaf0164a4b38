"""A broken environment is a clear message, never a traceback: tunehub serve's checks at start,
a degraded /healthz, and a full disk that fails a job with the reason without judging its
configs. Mounts are made in a private mount namespace (``unshare -m``), so nothing outside the
test sees them."""

from __future__ import annotations

import errno
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine

from tests.live import REPO, LiveServer, tunehub_env
from tunehub.client import TunehubClient
from tunehub.core import local_cpu_target
from tunehub.db import MemoryScheduleStore
from tunehub.db.tables import Base
from tunehub.service.app import create_app
from tunehub.service.settings import Settings
from tunehub.workers.replay import ReplayMeasurer


def _can_mount() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt"],
        capture_output=True,
        timeout=30,
    )
    return probe.returncode == 0


needs_mounts = pytest.mark.skipif(
    not _can_mount(), reason="needs `unshare -m` and tmpfs mounts (root in a mount namespace)"
)


def in_namespace(mount: str) -> list[str]:
    """A command prefix running the rest in a new mount namespace after ``mount`` (a shell
    command) succeeded."""
    return ["unshare", "-m", "sh", "-c", f'{mount} && exec "$0" "$@"']


def serve(home: Path, *prefix: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*prefix, sys.executable, "-m", "tunehub.cli", "serve", "--port", "1"],
        cwd=REPO,
        env=tunehub_env(home, **env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *expected: str) -> str:
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


@needs_mounts
def test_a_read_only_home_is_a_one_line_error_at_start(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    proc = serve(home, *in_namespace(f'mount -t tmpfs -o ro,size=1m tmpfs "{home}"'))
    assert_one_line_error(proc, "TUNEHUB_HOME", "Read-only file system", "writable")


@needs_mounts
def test_a_read_only_build_dir_under_postgresql_is_refused_at_start(
    tmp_path: Path, pg_url: str
) -> None:
    """With PostgreSQL the database is elsewhere, but the build dir must still take files."""
    home = tmp_path / "home"
    (home / "build").mkdir(parents=True)
    prefix = in_namespace(f'mount -t tmpfs -o ro,size=1m tmpfs "{home / "build"}"')
    proc = serve(home, *prefix, TUNEHUB_DATABASE_URL=pg_url)
    assert_one_line_error(proc, "build dir", "Read-only file system")


def test_a_home_that_cannot_be_made_is_a_one_line_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    proc = serve(blocker / "home")
    assert_one_line_error(proc, "TUNEHUB_HOME", "Not a directory")


def test_an_unreachable_database_is_a_one_line_error(tmp_path: Path) -> None:
    proc = serve(tmp_path, TUNEHUB_DATABASE_URL="postgresql://tunehub@127.0.0.1:1/nowhere")
    assert_one_line_error(proc, "database postgresql://tunehub@127.0.0.1:1/nowhere", "refused",
                          "TUNEHUB_DATABASE_URL")  # fmt: skip


def test_tables_with_no_revision_are_a_one_line_error(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'tunehub.db'}")
    Base.metadata.create_all(engine)  # tunehub's tables, made without its migrations
    engine.dispose()
    proc = serve(tmp_path)
    assert_one_line_error(proc, "has tables but no tunehub schema revision")
    upgrade = subprocess.run(
        [sys.executable, "-m", "tunehub.cli", "db", "upgrade"],
        cwd=REPO, env=tunehub_env(tmp_path), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert_one_line_error(upgrade, "has tables but no tunehub schema revision")


def test_a_malformed_setting_is_a_one_line_error(tmp_path: Path) -> None:
    proc = serve(tmp_path, TUNEHUB_MAX_JOB_SECS="forever")
    assert_one_line_error(proc, "TUNEHUB_MAX_JOB_SECS")


@pytest.fixture
def degraded_client(tmp_path: Path) -> Iterator[TestClient]:
    (tmp_path / "build").write_text("a file where the build dir should be")
    target = local_cpu_target()
    settings = Settings(home=tmp_path, health_check_secs=0.1, gpus="none")
    app = create_app(
        settings,
        store=MemoryScheduleStore(),
        measurer_factory=lambda: ReplayMeasurer([], target=target),
    )
    with TestClient(app, base_url="http://127.0.0.1") as client:
        yield client


def test_healthz_says_degraded_and_why(degraded_client: TestClient, tmp_path: Path) -> None:
    health = degraded_client.get("/healthz")
    assert health.status_code == 200  # lookups are still served
    body = health.json()
    assert body["status"] == "degraded"
    assert body["problems"] and "build dir" in body["problems"][0]
    (tmp_path / "build").unlink()
    deadline = time.monotonic() + 20
    while degraded_client.get("/healthz").json()["status"] != "ok":
        assert time.monotonic() < deadline, "still degraded"
        time.sleep(0.1)
    assert degraded_client.get("/healthz").json()["problems"] == []


# --- a full disk, end to end -----------------------------------------------------------------
def fill(path: Path) -> None:
    """Write ``path`` until its file system is full."""
    chunk = b"\0" * (1 << 20)
    with open(path, "wb") as f:
        try:
            while True:
                f.write(chunk)
                f.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc


def wait_until(predicate: Any, secs: float, what: str) -> None:
    deadline = time.monotonic() + secs
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.3)


@pytest.mark.slow
@needs_mounts
def test_a_job_on_a_full_disk_fails_with_the_reason_and_a_later_job_measures_its_configs(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    build = home / "build"
    build.mkdir(parents=True)
    server = LiveServer(
        home,
        command=[
            *in_namespace(f'mount -t tmpfs -o size=16m tmpfs "{build}"'),
            sys.executable, "-m", "tunehub.cli", "serve",
        ],
        TUNEHUB_HEALTH_CHECK_SECS="0.5",
        TUNEHUB_MIN_FREE_BYTES=str(1 << 20),
        TUNEHUB_BUILDERS="1",
    )  # fmt: skip
    shape = {"m": 24, "n": 40, "k": 16, "dtype": "float32"}
    with server, TunehubClient(server.url, api_key=server.key) as client:
        assert server.proc is not None
        # The server's view of the build dir: the tmpfs lives in its mount namespace only.
        seen = Path(f"/proc/{server.proc.pid}/root") / str(build).lstrip("/")
        job = client.submit_job(shape, strategy="exhaustive", max_trials=60, max_secs=600)
        wait_until(lambda: client.get_job(job["id"])["trials_done"] >= 2, 240, "2 trials")
        fill(seen / "filler")
        done = client.wait(job["id"], timeout_secs=240)
        assert done["state"] == "failed", (done, server.logs())
        assert "No space left on device" in done["error"] or "not writable" in done["error"]
        assert str(build) not in done["error"]  # the reason, not the server's paths
        records = client.job_records(job["id"])
        # Not verdicts: the machine's doing (noisy: timed while the machine was too busy).
        lost = [r for r in records if r["status"] in ("worker_error", "cancelled", "noisy")]
        machine = [r for r in lost if r["status"] == "worker_error"]
        assert len(machine) >= 3, records
        assert all("the machine cannot build" in r["error"] for r in machine)
        assert done["trials_done"] == len(records) - len(lost)  # they are not trials
        health = httpx.get(f"{server.url}/healthz").json()
        assert health["status"] == "degraded" and "build dir" in health["problems"][0]

        (seen / "filler").unlink()
        wait_until(lambda: client.health()["status"] == "ok", 30, "healthy again")
        unmeasured = {tuple(sorted(r["config"].items())) for r in lost}
        later = client.submit_job(
            shape, strategy="exhaustive", max_trials=len(unmeasured), max_secs=600
        )
        again = client.wait(later["id"], timeout_secs=300)
        assert again["state"] == "succeeded", (again, server.logs())
        measured = {
            tuple(sorted(r["config"].items()))
            for r in client.job_records(later["id"])
            if r["status"] not in ("worker_error", "cancelled", "noisy")
        }
        assert measured == unmeasured  # the configs the full disk kept from being measured
