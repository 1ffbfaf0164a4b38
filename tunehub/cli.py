"""The ``tunehub`` command line: serve, tune, lookup, jobs, db."""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any

import click

from tunehub.core import Budget, InvalidSpec, Workload, local_cpu_target
from tunehub.core.job import MAX_SECS, MAX_TRIALS, STRATEGIES
from tunehub.core.workload import DTYPES, EPILOGUES

DEFAULT_URL = "http://127.0.0.1:8000"


def _settings() -> Any:
    from tunehub.service.settings import Settings

    return Settings()


def _fail(message: str) -> None:
    raise click.ClickException(message)


def _workload(m: int, n: int, k: int, dtype: str, epilogue: str) -> Workload:
    try:
        return Workload(m=m, n=n, k=k, dtype=dtype, epilogue=epilogue)
    except InvalidSpec as exc:
        raise click.BadParameter(exc.reason, param_hint=exc.field) from None


def _open_store(url: str, *, init: bool) -> Any:
    """Open the store at ``url``; a brand-new database is created at head when ``init``."""
    from tunehub.db import SchemaOutOfDate, SqlScheduleStore, check_at_head, current_revision
    from tunehub.db import upgrade as db_upgrade

    try:
        if init and current_revision(url) is None:
            db_upgrade(url)
        check_at_head(url)
    except SchemaOutOfDate as exc:
        _fail(str(exc))
    return SqlScheduleStore(url)


@click.group()
@click.version_option(package_name="tunehub")
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def main(verbose: int) -> None:
    """tunehub: tune compute kernels, store the best schedules, answer lookups.

    Data lives in $TUNEHUB_HOME (default ~/.tunehub); TUNEHUB_DATABASE_URL picks another
    database (e.g. postgresql://user@host/db).
    """
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@main.command()
@click.option("--host", default=None, help="Interface to bind (default 127.0.0.1).")
@click.option("--port", default=None, type=click.IntRange(0, 65535), help="Port (default 8000).")
@click.option("--no-runner", is_flag=True, help="Serve the API only; run no tuning jobs here.")
def serve(host: str | None, port: int | None, no_runner: bool) -> None:
    """Start the API, the dashboard and the job runner.

    A new database is created at the current schema; an older one is refused until you run
    `tunehub db upgrade`.
    """
    import uvicorn

    from tunehub.service.app import create_app

    settings = _settings()
    settings.home.mkdir(parents=True, exist_ok=True)
    if no_runner:
        settings.run_jobs = False
    url = settings.resolved_database_url()
    _open_store(url, init=True).close()
    host = host or settings.host
    port = settings.port if port is None else port
    logging.getLogger("tunehub").setLevel(logging.INFO)
    click.echo(f"tunehub: dashboard and API on http://{host}:{port}/ (data: {settings.home})")
    uvicorn.run(create_app(settings), host=host, port=port, log_level="info")


@main.command()
@click.argument("m", type=int)
@click.argument("n", type=int)
@click.argument("k", type=int)
@click.option("--dtype", type=click.Choice(DTYPES), default="float32", show_default=True)
@click.option("--epilogue", type=click.Choice(EPILOGUES), default="none", show_default=True)
@click.option("--template", default="blis.gemm", show_default=True)
@click.option("--strategy", type=click.Choice(STRATEGIES), default="random", show_default=True)
@click.option("--trials", type=click.IntRange(1, MAX_TRIALS), default=32, show_default=True)
@click.option("--secs", type=click.FloatRange(1, MAX_SECS), default=300.0, show_default=True)
@click.option("--seed", type=click.IntRange(0, 2**31 - 1), default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def tune(
    m: int,
    n: int,
    k: int,
    dtype: str,
    epilogue: str,
    template: str,
    strategy: str,
    trials: int,
    secs: float,
    seed: int,
    as_json: bool,
) -> None:
    """Tune an MxNxK GEMM on this machine's CPU, without a server.

    Measurements and the best schedule go to the local database, as a job that shows on the
    dashboard. The winner is compared with OpenBLAS (through numpy) timed the same way with the
    same thread count, and the output says which is faster.
    """
    from tunehub.core import JobSpec, JobState
    from tunehub.core.owner import process_owner
    from tunehub.kernels.registry import UnknownTemplate, get_template
    from tunehub.tuner import Progress, baseline_dict, session_for_job
    from tunehub.tuner.lookup import baseline_for, config_threads
    from tunehub.workers.local import LocalMeasurer

    workload = _workload(m, n, k, dtype, epilogue)
    settings = _settings()
    settings.home.mkdir(parents=True, exist_ok=True)
    store = _open_store(settings.resolved_database_url(), init=True)
    target = local_cpu_target()
    try:
        tmpl = get_template(template)
    except UnknownTemplate as exc:
        raise click.BadParameter(str(exc.args[0]), param_hint="--template") from None
    reason = tmpl.supports(workload, target)
    if reason:
        raise click.BadParameter(reason, param_hint="--template")
    store.put_target(target)
    spec = JobSpec(
        workload=workload,
        target_key=target.target_key,
        template=tmpl.name,
        strategy=strategy,
        budget=Budget(max_trials=trials, max_secs=secs),
        seed=seed,
    )
    job = store.create_job(spec, claimed=True, owner=process_owner())
    click.echo(
        f"job {job.id}: tuning {workload.label} with {tmpl.name} on {target.label}: "
        f"{len(tmpl.space(workload, target))} configs, {strategy}, "
        f"budget {trials} trials / {secs:.0f}s",
        err=True,
    )

    def finish(state: JobState, error: str) -> None:
        # Only from RUNNING: a cancel from the dashboard or the API stands.
        store.set_job_state(job.id, state, error=error, only_from=(JobState.RUNNING,))

    measurer = LocalMeasurer(
        build_dir=settings.build_dir,
        timeout_secs=settings.measure_timeout_secs,
        min_secs=settings.min_repeat_secs,
        max_repeats=settings.max_repeats,
    )
    with click.progressbar(length=trials, label="trials", file=sys.stderr) as bar:

        def progress(p: Progress) -> None:
            bar.update(len(p.last))
            best = f"{p.best.gflops:.1f} GFLOP/s" if p.best and p.best.gflops else "none ok yet"
            bar.label = f"best {best}"

        try:
            result = session_for_job(
                spec,
                store=store,
                measurer=measurer,
                target=target,
                job_id=job.id,
                on_progress=progress,
                should_stop=lambda: store.get_job(job.id).state is JobState.CANCELLED,
            ).run()
        except BaseException as exc:
            finish(JobState.FAILED, f"{type(exc).__name__}: {exc}")
            raise
        finally:
            measurer.close()
    if result.stopped_by == "cancelled":
        _fail(f"job {job.id} was cancelled after {result.trials_done} trials")
    best = result.best
    if best is None:
        if result.trials_done == 0:
            finish(JobState.SUCCEEDED, "")
            _fail(
                f"every config of {tmpl.name} for {workload.label} was measured before; "
                f"see `tunehub lookup {m} {n} {k}`"
            )
        finish(JobState.FAILED, "no candidate measured ok")
        _fail(f"no candidate measured ok in {result.trials_done} trials; see `tunehub jobs`")
    finish(JobState.SUCCEEDED, "")
    assert best is not None and best.gflops is not None and best.median_secs is not None
    baseline = baseline_for(
        store, workload_key=workload.key, target_key=target.target_key, config=best.config
    )
    store.close()
    speedup = baseline.median_secs / best.median_secs if baseline and baseline.median_secs else None
    out = {
        "job": job.id,
        "workload": workload.label,
        "template": tmpl.name,
        "trials": result.trials_done,
        "stopped_by": result.stopped_by,
        "config": best.config.to_dict(),
        "median_secs": best.median_secs,
        "gflops": best.gflops,
        "baseline": baseline_dict(baseline),
        "speedup_vs_baseline": speedup,
    }
    if as_json:
        click.echo(json.dumps(out, indent=2))
        return
    knobs = " ".join(f"{k}={v}" for k, v in best.config.items())
    click.echo(
        f"best after {result.trials_done} trials ({result.stopped_by}): "
        f"{best.gflops:.2f} GFLOP/s, median {best.median_secs * 1e3:.3f} ms\n  {knobs}"
    )
    if baseline is not None and baseline.gflops is not None and speedup is not None:
        verdict = "tunehub is faster" if speedup >= 1 else "the library is faster: use it"
        click.echo(
            f"vs {baseline.request.template} on {config_threads(best.config)} thread(s): "
            f"{baseline.gflops:.2f} GFLOP/s, speedup {speedup:.2f}x ({verdict})"
        )


def _server_url(url: str | None) -> str | None:
    return url or os.environ.get("TUNEHUB_URL")


@main.command()
@click.argument("m", type=int)
@click.argument("n", type=int)
@click.argument("k", type=int)
@click.option("--dtype", type=click.Choice(DTYPES), default="float32", show_default=True)
@click.option("--epilogue", type=click.Choice(EPILOGUES), default="none", show_default=True)
@click.option("--target", default="local-cpu", show_default=True)
@click.option("--url", default=None, help="Ask this server (or $TUNEHUB_URL) instead of the DB.")
def lookup(m: int, n: int, k: int, dtype: str, epilogue: str, target: str, url: str | None) -> None:
    """Print the best known schedule for an MxNxK GEMM as JSON (exit 1 if none is known)."""
    workload = _workload(m, n, k, dtype, epilogue)
    server = _server_url(url)
    if server:
        from tunehub.client import TunehubClient, TunehubError

        try:
            with TunehubClient(server) as client:
                answer = client.best_schedule(workload.to_dict(), target=target)
        except (TunehubError, OSError) as exc:
            _fail(f"{server}: {exc}")
        if answer is None:
            click.echo(f"no schedule known for {workload.label}", err=True)
            sys.exit(1)
        click.echo(json.dumps(answer, indent=2))
        return
    from tunehub.tuner import find_schedule

    store = _open_store(_settings().resolved_database_url(), init=False)
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


@main.command()
@click.option("--limit", type=click.IntRange(1, 500), default=20, show_default=True)
@click.option("--url", default=None, help="Ask this server (or $TUNEHUB_URL) instead of the DB.")
def jobs(limit: int, url: str | None) -> None:
    """List recent jobs, newest first."""
    rows: list[tuple[Any, ...]] = []
    server = _server_url(url)
    if server:
        from tunehub.client import TunehubClient, TunehubError

        try:
            with TunehubClient(server) as client:
                items = client.list_jobs(limit=limit)["items"]
        except (TunehubError, OSError) as exc:
            _fail(f"{server}: {exc}")
        for j in items:
            rows.append(
                (j["id"], j["state"], j["trials_done"], j["budget"]["max_trials"],
                 j["best_gflops"], j["workload_label"])
            )  # fmt: skip
    else:
        store = _open_store(_settings().resolved_database_url(), init=False)
        for job in store.list_jobs(limit=limit):
            rows.append(
                (job.id, job.state.value, job.trials_done, job.spec.budget.max_trials,
                 job.best_gflops, job.spec.workload.label)
            )  # fmt: skip
        store.close()
    if not rows:
        click.echo("no jobs yet: `tunehub tune 256 256 256` or POST /api/v1/jobs")
        return
    click.echo(f"{'id':>5}  {'state':<10} {'trials':>9}  {'GFLOP/s':>9}  workload")
    for jid, state, done, total, gflops, label in rows:
        gf = f"{gflops:9.2f}" if gflops is not None else f"{'-':>9}"
        click.echo(f"{jid:>5}  {state:<10} {f'{done}/{total}':>9}  {gf}  {label}")


@main.group()
def db() -> None:
    """Database schema commands."""


@db.command("upgrade")
def db_upgrade_cmd() -> None:
    """Create the database or migrate it to the current schema."""
    from tunehub.db import current_revision, head_revision
    from tunehub.db import upgrade as db_upgrade
    from tunehub.db.engine import safe_url

    settings = _settings()
    settings.home.mkdir(parents=True, exist_ok=True)
    url = settings.resolved_database_url()
    before = current_revision(url)
    db_upgrade(url)
    click.echo(f"database {safe_url(url)}: {before or 'empty'} -> {head_revision()} (head)")


@db.command("current")
def db_current_cmd() -> None:
    """Print the database's schema revision and the head revision."""
    from tunehub.db import current_revision, head_revision
    from tunehub.db.engine import safe_url

    url = _settings().resolved_database_url()
    click.echo(
        f"database {safe_url(url)}: {current_revision(url) or 'empty'}; head {head_revision()}"
    )


if __name__ == "__main__":
    main()
