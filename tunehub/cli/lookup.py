"""``tunehub lookup`` and ``tunehub jobs``: what the database, or a server, knows."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from tunehub.cli.common import (
    NumbersCommand,
    fail,
    make_workload,
    open_store,
    server_url,
    store_url,
    workload_options,
)
from tunehub.core import InvalidSpec


@click.command(cls=NumbersCommand)
@click.argument("m", type=int, required=False, metavar="M")
@click.argument("n", type=int, required=False, metavar="N")
@click.argument("k", type=int, required=False, metavar="K")
@workload_options
@click.option("--target", default="local-cpu", show_default=True)
@click.option("--url", default=None, help="Ask this server (or $TUNEHUB_URL) instead of the DB.")
def lookup(
    m: int | None,
    n: int | None,
    k: int | None,
    dtype: str,
    epilogue: str,
    a_layout: str,
    b_layout: str,
    allow_tf32: bool,
    op: str,
    fields: tuple[str, ...],
    target: str,
    url: str | None,
) -> None:
    """Print the best known schedule for an MxNxK GEMM as JSON (exit 1 if none is known)."""
    workload = make_workload(
        m, n, k, dtype, epilogue, a_layout, b_layout, allow_tf32, op=op, fields=fields
    )
    server = server_url(url)
    if server:
        from httpx import HTTPError

        from tunehub.client import TunehubClient, TunehubError

        try:
            with TunehubClient(server) as client:
                answer = client.best_schedule(workload.to_dict(), target=target)
        except (TunehubError, OSError, HTTPError) as exc:
            fail(f"{server}: {exc}")
        if answer is None:
            click.echo(f"no schedule known for {workload.label}", err=True)
            sys.exit(1)
        click.echo(json.dumps(answer, indent=2))
        return
    from tunehub.tuner import find_schedule

    store = open_store(store_url(), init=False)
    from tunehub.service.deps import resolve_target

    try:
        tgt = resolve_target(store, target)
    except InvalidSpec as exc:
        raise click.BadParameter(exc.reason, param_hint="--target") from None
    found = find_schedule(store, workload, tgt)
    store.close()
    if found is None:
        click.echo(f"no schedule known for {workload.label} on {tgt.label}", err=True)
        sys.exit(1)
    click.echo(json.dumps(found.to_dict(), indent=2))


@click.command()
@click.option("--limit", type=click.IntRange(1, 500), default=20, show_default=True)
@click.option("--url", default=None, help="Ask this server (or $TUNEHUB_URL) instead of the DB.")
def jobs(limit: int, url: str | None) -> None:
    """List recent jobs, newest first, each with its best: the schedule the lookup serves for
    its workload (confirmed, or marked as the best trial so far) and its speedup over the
    library."""
    rows: list[tuple[Any, ...]] = []
    server = server_url(url)
    if server:
        from httpx import HTTPError

        from tunehub.client import TunehubClient, TunehubError

        try:
            with TunehubClient(server) as client:
                items = client.list_jobs(limit=limit)["items"]
        except (TunehubError, OSError, HTTPError) as exc:
            fail(f"{server}: {exc}")
        for j in items:
            rows.append(
                (j["id"], j["state"], j["trials_done"], j["budget"]["max_trials"],
                 j.get("best"), j["workload_label"])
            )  # fmt: skip
    else:
        from tunehub.tuner.best import best_dict, job_bests

        store = open_store(store_url(), init=False)
        found = store.list_jobs(limit=limit)
        targets = {j.spec.target_key: store.get_target(j.spec.target_key) for j in found}
        for job, answer in zip(found, job_bests(store, found, targets), strict=True):
            rows.append(
                (job.id, job.state.value, job.trials_done, job.spec.budget.max_trials,
                 best_dict(answer) if answer is not None else None, job.spec.workload.label)
            )  # fmt: skip
        store.close()
    if not rows:
        click.echo("no jobs yet: `tunehub tune 256 256 256` or POST /api/v1/jobs")
        return
    click.echo(f"{'id':>5}  {'state':<10} {'trials':>9}  {'GFLOP/s':>9}  {'vs lib':>6}  workload")
    unconfirmed = False
    for jid, state, done, total, best, label in rows:
        gf, mark, speedup = f"{'-':>9}", " ", f"{'-':>6}"
        if best is not None:
            gf = f"{best['gflops']:9.2f}"
            if not best["confirmed"]:
                mark, unconfirmed = "*", True
            if best.get("speedup_vs_baseline") is not None:
                speedup = f"{best['speedup_vs_baseline']:5.2f}x"
        click.echo(f"{jid:>5}  {state:<10} {f'{done}/{total}':>9}  {gf}{mark} {speedup}  {label}")
    click.echo(
        "GFLOP/s: the schedule the lookup serves for the workload (confirmed by a job's "
        "re-timing"
        + ("; * the best trial so far, unconfirmed" if unconfirmed else "")
        + "); vs lib: its speedup over the vendor library"
    )
