"""``tunehub watch``: a service's job followed in lines a log keeps, ending with its best."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.live import REPO, LiveServer, tunehub_env
from tunehub.cli.watch import follow
from tunehub.client import TunehubClient


def job(state: str, done: int, gflops: float | None = None, mr: int = 6) -> dict[str, Any]:
    best = {"gflops": gflops, "template": "blis.gemm", "config": {"MR": mr}} if gflops else None
    return {"id": 7, "state": state, "trials_done": done, "budget": {"max_trials": 9},
            "best": best, "tuning_secs": float(done), "waiting_for": None}  # fmt: skip


def test_lines_on_each_state_and_at_a_bounded_rate_between() -> None:
    """A job's answers as the API gives them, one per poll: polled faster than every_secs, only
    its state changes and the end are said, and a best's knobs only when they change."""
    answers = iter([
        job("queued", 0), job("queued", 0), job("running", 0), job("running", 1, 10.0),
        job("running", 2, 12.0, mr=4), job("running", 3, 12.0, mr=4),
        job("succeeded", 9, 11.5, mr=4),
    ])  # fmt: skip
    lines: list[str] = []
    done = follow(lambda: next(answers), every_secs=3600, echo=lines.append, poll_secs=0)
    assert done["state"] == "succeeded"
    assert lines == [
        "job 7: queued",
        "job 7: running, trial 0/9, no config measured ok yet, 0.0 s",
        "job 7: succeeded, trial 9/9, best 11.5 GFLOP/s (blis.gemm MR=4), 9.0 s",
    ]
    answers = iter([job("running", 1, 10.0), job("running", 1, 10.0), job("running", 2, 10.0),
                    job("running", 3, 12.0, mr=4), job("failed", 3, 12.0, mr=4)])  # fmt: skip
    lines.clear()
    follow(lambda: next(answers), every_secs=0, echo=lines.append, poll_secs=0)
    assert lines == [  # every change, and nothing twice
        "job 7: running, trial 1/9, best 10.0 GFLOP/s (blis.gemm MR=6), 1.0 s",
        "job 7: running, trial 2/9, best 10.0 GFLOP/s, 2.0 s",
        "job 7: running, trial 3/9, best 12.0 GFLOP/s (blis.gemm MR=4), 3.0 s",
        "job 7: failed, trial 3/9, best 12.0 GFLOP/s, 3.0 s",
    ]


def watch(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tunehub.cli", "watch", *args],
        cwd=REPO, env=tunehub_env(home), capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.mark.slow
def test_watch_a_job_on_a_live_service(tmp_path: Path) -> None:
    with LiveServer(tmp_path, TUNEHUB_TEST_BUILD_SECS="0.02") as server:
        proc = watch(tmp_path, "99", "--url", server.url)
        assert proc.returncode == 1
        assert proc.stderr.strip() == (
            f"Error: {server.url} has no job 99; `tunehub jobs --url {server.url}` lists them"
        )
        with TunehubClient(server.url, api_key=server.key) as client:
            # test.pipeline: a template whose builds and runs only sleep (0.02 s, 0.05 s)
            submitted = client.submit_job(
                {"m": 8, "n": 8, "k": 8}, template="test.pipeline", max_trials=3
            )
            proc = watch(tmp_path, str(submitted["id"]), "--url", server.url, "--every", "0")
            finished = client.get_job(submitted["id"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    shape = re.compile(
        rf"job {submitted['id']}: (\w+)(?:, trial (\d)/3, (.*), [\d.]+ s)?(?: \(.*\))?"
    )
    said = [shape.fullmatch(line) for line in lines[:-1]]
    assert all(said), lines
    states = [m[1] for m in said if m]
    assert states[-1] == "succeeded" and set(states) <= {"queued", "running", "succeeded"}
    done = [int(m[2]) for m in said if m and m[2]]
    assert done == sorted(done) and done[-1] == 3, lines
    # The last line is the job's best, as the API quotes it.
    best = finished["best"]
    assert lines[-1].startswith(f"{finished['workload_label']} on ")
    assert f"{best['gflops']:.1f} GFLOP/s" in lines[-1] and "(test.pipeline " in lines[-1]
