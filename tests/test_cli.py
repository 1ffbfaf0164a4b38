"""The command line as a user runs it: tune, lookup, jobs, db, and its error messages."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.live import REPO, LiveServer, tunehub_env


def tunehub(home: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "tunehub.cli", *args],
        cwd=REPO,
        env=tunehub_env(home),
        capture_output=True,
        text=True,
        timeout=300,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"tunehub {' '.join(args)} -> {proc.returncode}\n{proc.stderr}")
    return proc


@pytest.mark.slow
def test_tune_then_lookup_and_jobs(tmp_path: Path) -> None:
    out = tunehub(
        tmp_path, "tune", "33", "17", "29", "--trials", "3", "--json", "--progress-every", "0"
    )
    result = json.loads(out.stdout)
    assert result["trials"] == 3
    assert result["gflops"] > 0
    baseline = result["baseline"]  # OpenBLAS timed beside it, with the best's thread count
    assert baseline["threads"] == result["config"]["threads"]
    assert result["speedup_vs_baseline"] == pytest.approx(
        baseline["median_secs"] / result["median_secs"]
    )
    assert result["confirmed"] is True  # the winner was re-timed against the runners-up
    # stderr is a pipe: progress is lines a log keeps (with no bound on their rate, one a
    # trial), the best's template and knobs when it is new, the last trial's line at the end.
    lines = out.stderr.splitlines()
    shape = re.compile(
        r"trial (\d)/3(?: \(.*\))?, (best ([\d.]+) GFLOP/s( \(.*\))?|no config .*), [\d.]+ s"
    )
    progress = [m for m in map(shape.fullmatch, lines) if m is not None]
    done = [int(m[1]) for m in progress]
    assert done == sorted(done) and {1, 2, 3} <= set(done), out.stderr
    bests = [float(m[3]) for m in progress if m[3]]
    assert bests == sorted(bests), "the best so far never drops"
    first = next(m for m in progress if m[3])
    assert re.fullmatch(r" \(blis\.gemm .*MR=\d+.*\)", first[4]), first[0]  # its knobs
    last = lines.index(progress[-1][0])
    assert progress[-1][1] == "3" and "re-timing the best" in lines[last + 1], out.stderr
    found = json.loads(tunehub(tmp_path, "lookup", "33", "17", "29").stdout)
    assert found["config"] == result["config"]
    assert found["source"] == "exact"
    listing = tunehub(tmp_path, "jobs").stdout
    assert "succeeded" in listing and "matmul 33x17x29 float32" in listing


def test_lookup_of_an_unknown_shape_exits_1(tmp_path: Path) -> None:
    tunehub(tmp_path, "db", "upgrade")
    proc = tunehub(tmp_path, "lookup", "5", "6", "7", check=False)
    assert proc.returncode == 1
    assert "no schedule known for matmul 5x6x7 float32" in proc.stderr


def test_bad_sizes_get_a_message_naming_the_argument(tmp_path: Path) -> None:
    proc = tunehub(tmp_path, "tune", "0", "16", "16", check=False)
    assert proc.returncode == 2
    assert "Invalid value for 'M': must be >= 1, got 0" in proc.stderr, proc.stderr
    proc = tunehub(tmp_path, "tune", "16", "16", "16", "--dtype", "int4", check=False)
    assert proc.returncode == 2 and "int4" in proc.stderr
    proc = tunehub(tmp_path, "tune", "16", "16", "16", "--dtype", "float16", check=False)
    assert proc.returncode == 2 and "--dtype" in proc.stderr and "blis.gemm" in proc.stderr
    proc = tunehub(tmp_path, "tune", "16", "16", "16", "--strategy", "nope", check=False)
    assert proc.returncode == 2 and "known: " in proc.stderr and "random" in proc.stderr
    proc = tunehub(tmp_path, "tune", "16", "16", "16", "--allow-tf32", "--dtype", "float64",
                   check=False)  # fmt: skip
    assert proc.returncode == 2 and "--allow-tf32" in proc.stderr
    for flag, value in (("--secs", "1e9"), ("--trials", "200000"), ("--seed", "9" * 20)):
        proc = tunehub(tmp_path, "tune", "8", "8", "8", flag, value, check=False)
        assert proc.returncode == 2, (flag, proc.stderr)
        assert flag in proc.stderr and "Traceback" not in proc.stderr


def test_db_upgrade_and_current(tmp_path: Path) -> None:
    first = tunehub(tmp_path, "db", "upgrade").stdout
    assert "empty ->" in first and "(head)" in first
    current = tunehub(tmp_path, "db", "current").stdout
    head = current.split("head ")[-1].strip()
    assert f": {head}; head {head}" in current


def test_serve_refuses_a_database_at_another_revision(tmp_path: Path) -> None:
    tunehub(tmp_path, "db", "upgrade")
    with sqlite3.connect(tmp_path / "tunehub.db") as conn:
        conn.execute("UPDATE alembic_version SET version_num = 'f00dfeed0000'")
    proc = tunehub(tmp_path, "serve", "--port", "0", check=False)
    assert proc.returncode == 1
    assert "tunehub db upgrade" in proc.stderr


def test_serve_on_a_busy_port_says_so_before_it_starts_anything(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = tunehub(tmp_path, "serve", "--port", str(port), check=False)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert f"port {port} on 127.0.0.1 is in use" in lines[0] and "--port" in lines[0], lines
    assert not (tmp_path / "tunehub.db").exists()  # no database opened, no worker registered


def test_jobs_over_http(tmp_path: Path) -> None:
    with LiveServer(tmp_path) as server:
        proc = tunehub(tmp_path, "jobs", "--url", server.url)
        assert "no jobs yet" in proc.stdout


def seed_two_bests(home: Path) -> tuple[float, float, float]:
    """A finished job whose confirmation picked another config than its fastest trial (issue
    23's job 1: best trial 310.2, confirmed winner 304.9), with the library timed beside it,
    and a job with one trial so far. Both are of a target no worker here serves, so the live
    server runs neither. Returns (trial GFLOP/s, confirmed GFLOP/s, speedup)."""
    from tunehub.core import (
        Config,
        Confirmation,
        JobSpec,
        JobState,
        MeasureRecord,
        MeasureRequest,
        MeasureResult,
        MeasureStatus,
        Target,
        Workload,
        utc_now,
    )
    from tunehub.db import SqlScheduleStore, upgrade

    url = f"sqlite:///{home / 'tunehub.db'}"
    upgrade(url)
    store = SqlScheduleStore(url)
    target = Target(kind="cpu", name="Elsewhere CPU", arch=("avx2", "fma"), cores=2)
    store.put_target(target)
    workload = Workload(m=256, n=256, k=256)

    def rec(
        template: str, config: dict[str, int], secs: float, job: int | None, w: Workload = workload
    ) -> MeasureRecord:
        req = MeasureRequest(w, target, template, 2, Config(config))
        env = {"blas": "openblas", "blas_version": "0.3.31"}
        result = MeasureResult(MeasureStatus.OK, repeat_secs=(secs,), environment=env)
        return MeasureRecord(request=req, result=result, job_id=job)

    job = store.create_job(JobSpec(workload, target.target_key))
    trial, winner = workload.flops / 310.2e9, workload.flops / 304.0e9
    a = rec("blis.gemm", {"MR": 6, "NR": 32, "threads": 1}, trial, job.id)
    b = rec("blis.gemm", {"MR": 6, "NR": 64, "threads": 1}, winner, job.id)
    store.commit_records([a, b])
    store.commit_baseline(rec("numpy.matmul", {"threads": 1}, workload.flops / 272.0e9, None))
    confirmed = workload.flops / 304.9e9
    store.confirm_schedule(
        workload_key=workload.key, target_key=target.target_key, template="blis.gemm",
        candidates={a.uid, b.uid}, winner_uid=b.uid,
        confirmation=Confirmation(confirmed, 0.01, 5, utc_now(), others={a.uid: winner}),
    )  # fmt: skip
    store.set_job_state(job.id, JobState.SUCCEEDED)
    small = Workload(m=64, n=64, k=64)
    running = store.create_job(JobSpec(small, target.target_key))
    store.commit_records([rec("blis.gemm", {"MR": 4}, 1e-5, running.id, small)])
    store.close()
    return 310.2, 304.9, 304.9 / 272.0


def test_jobs_show_the_confirmed_best_and_its_speedup(tmp_path: Path) -> None:
    trial, confirmed, speedup = seed_two_bests(tmp_path)
    local = tunehub(tmp_path, "jobs").stdout
    with LiveServer(tmp_path) as server:
        remote = tunehub(tmp_path, "jobs", "--url", server.url).stdout
    for listing in (local, remote):
        lines = listing.splitlines()
        (done,) = [line for line in lines if "matmul 256x256x256" in line]
        assert f"{confirmed:9.2f}  {speedup:5.2f}x" in done, done
        assert f"{trial:.2f}" not in listing, "the single trial is not the best quoted"
        (running,) = [line for line in lines if "matmul 64x64x64" in line]
        assert "*" in running and "-" in running.split("*")[1], "unconfirmed, no library yet"
        assert "* the best trial so far, unconfirmed" in lines[-1]
