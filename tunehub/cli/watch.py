"""``tunehub watch``: follow a service's job in lines a log keeps, and end with its best."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import click

from tunehub.cli.common import fail, server_url
from tunehub.cli.progress import DEFAULT_EVERY_SECS

FINISHED = ("succeeded", "failed", "cancelled")
DEFAULT_SERVER = "http://127.0.0.1:8000"  # where `tunehub serve` listens by default


def job_line(job: dict[str, Any], *, config: bool = True) -> str:
    """Where a job stands, e.g. ``job 3: running, trial 5/24, best 151.3 GFLOP/s (blis.gemm
    MR=6 ...), 3.2 s``: the best is the one the job quotes (``best``), its template and knobs
    unless not ``config``; a queued job says what it waits for."""
    head = f"job {job['id']}: {job['state']}"
    if job["state"] == "queued":
        waiting = job.get("waiting_for")
        return f"{head} ({waiting})" if waiting else head
    best = job.get("best")
    if best:
        text = f"best {best['gflops']:.1f} GFLOP/s"
        if config:
            knobs = " ".join(f"{k}={v}" for k, v in best["config"].items())
            text += f" ({best['template']} {knobs})"
    else:
        text = "no config measured ok yet"
    done, total = job["trials_done"], job["budget"]["max_trials"]
    return f"{head}, trial {done}/{total}, {text}, {job['tuning_secs']:.1f} s"


def follow(
    get_job: Callable[[], dict[str, Any]],
    *,
    every_secs: float,
    echo: Callable[[str], None],
    poll_secs: float = 1.0,
) -> dict[str, Any]:
    """Poll a job until it is finished, echoing a line when it changes state, and otherwise at
    most every ``every_secs`` when its trials or its best moved; return the finished job."""
    said: tuple[Any, ...] | None = None
    said_config: Any = None
    said_at = float("-inf")
    while True:
        job = get_job()
        best = job.get("best") or {}
        now = time.monotonic()
        state = (job["state"], job["trials_done"], best.get("gflops"), job.get("waiting_for"))
        finished = job["state"] in FINISHED
        if state != said and (
            said is None or state[0] != said[0] or finished or now - said_at >= every_secs
        ):
            echo(job_line(job, config=best.get("config") != said_config))
            said, said_config, said_at = state, best.get("config"), now
        if finished:
            return job
        time.sleep(poll_secs)


@click.command()
@click.argument("job_id", metavar="JOB", type=click.IntRange(1))
@click.option(
    "--url",
    default=None,
    help=f"The service (default $TUNEHUB_URL, else {DEFAULT_SERVER}).",
)
@click.option(
    "--every",
    "every_secs",
    type=click.FloatRange(0, 3600),
    default=DEFAULT_EVERY_SECS,
    show_default=True,
    metavar="SECS",
    help="A progress line at most every SECS seconds (and one whenever the state changes).",
)
def watch(job_id: int, url: str | None, every_secs: float) -> None:
    """Follow JOB on a service until it ends: a line when it starts, progress lines ("trial
    N/M, best X GFLOP/s") at a bounded rate, then its best in one line. Exits 0 if the job
    succeeded, 1 if it failed or was cancelled. Sends $TUNEHUB_API_KEY where reads are
    closed."""
    from httpx import HTTPError

    from tunehub.client import TunehubClient, TunehubError
    from tunehub.tuner.best import best_line

    server = server_url(url) or DEFAULT_SERVER
    try:
        with TunehubClient(server) as client:
            job = follow(
                lambda: client.get_job(job_id),
                every_secs=every_secs,
                echo=click.echo,
                poll_secs=min(1.0, max(0.2, every_secs)),
            )
    except TunehubError as exc:
        if exc.status_code == 404:
            fail(f"{server} has no job {job_id}; `tunehub jobs --url {server}` lists them")
        fail(f"{server}: {exc}")
    except (OSError, HTTPError) as exc:
        fail(f"{server}: {exc}; is `tunehub serve` running there?")
    except KeyboardInterrupt:
        click.echo(f"stopped watching; job {job_id} goes on", err=True)
        sys.exit(130)
    if job["state"] != "succeeded":
        error = job.get("error") or "no reason given"
        fail(f"job {job_id} {job['state']}: {error}")
    click.echo(best_line(job.get("best"), job["workload_label"], job["target_label"]))
