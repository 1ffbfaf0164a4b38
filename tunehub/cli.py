"""The ``tunehub`` command line: serve, tune, lookup, jobs, db."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any

import click

from tunehub.core import Budget, InvalidSpec, Workload
from tunehub.core.job import DEFAULT_STRATEGY, MAX_SECS, MAX_TRIALS
from tunehub.core.workload import DTYPES, EPILOGUES, LAYOUTS

DEFAULT_URL = "http://127.0.0.1:8000"


def _settings() -> Any:
    from tunehub.service.settings import Settings

    return Settings()


def _fail(message: str) -> None:
    raise click.ClickException(message)


def _workload(
    m: int,
    n: int,
    k: int,
    dtype: str,
    epilogue: str,
    a_layout: str = "row_major",
    b_layout: str = "row_major",
    allow_tf32: bool = False,
) -> Workload:
    try:
        return Workload(
            m=m,
            n=n,
            k=k,
            dtype=dtype,
            epilogue=epilogue,
            a_layout=a_layout,
            b_layout=b_layout,
            allow_tf32=allow_tf32,
        )
    except InvalidSpec as exc:
        raise click.BadParameter(
            exc.reason, param_hint=f"--{exc.field.replace('_', '-')}"
        ) from None


def workload_options(func: Any) -> Any:
    """The options that describe a workload besides its shape."""
    options = [
        click.option("--dtype", type=click.Choice(DTYPES), default="float32", show_default=True),
        click.option("--epilogue", type=click.Choice(EPILOGUES), default="none", show_default=True),
        click.option(
            "--a-layout", type=click.Choice(LAYOUTS), default="row_major", show_default=True
        ),
        click.option(
            "--b-layout",
            type=click.Choice(LAYOUTS),
            default="row_major",
            show_default=True,
            help="col_major: B is stored as a row-major N x K matrix (a linear layer's weight).",
        ),
        click.option("--allow-tf32", is_flag=True, help="float32: allow TensorFloat-32 products."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


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
@workload_options
@click.option(
    "--device",
    default="cpu",
    show_default=True,
    help="Where to tune: cpu, or cuda:N for this host's GPU N.",
)
@click.option("--template", default=None, help="Default: blis.gemm on cpu, triton.gemm on GPUs.")
@click.option("--strategy", default=DEFAULT_STRATEGY, show_default=True)
@click.option("--trials", type=click.IntRange(1, MAX_TRIALS), default=32, show_default=True)
@click.option(
    "--secs",
    type=click.FloatRange(1, MAX_SECS),
    default=300.0,
    show_default=True,
    help="Tuning time budget (the baseline and the final confirmation are not counted).",
)
@click.option("--seed", type=click.IntRange(0, 2**31 - 1), default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def tune(
    m: int,
    n: int,
    k: int,
    dtype: str,
    epilogue: str,
    a_layout: str,
    b_layout: str,
    allow_tf32: bool,
    device: str,
    template: str | None,
    strategy: str,
    trials: int,
    secs: float,
    seed: int,
    as_json: bool,
) -> None:
    """Tune an MxNxK GEMM on this machine (its CPU, or a GPU), without a server.

    Measurements and the best schedule go to the local database, as a job that shows on the
    dashboard. The winner is re-timed against the runners-up, then compared with the vendor
    library (OpenBLAS through numpy on the CPU) timed the same way with the same thread
    count, and the output says which is faster.
    """
    from tunehub.core import JobSpec, JobState
    from tunehub.core.owner import process_owner
    from tunehub.core.registry import UnknownName
    from tunehub.kernels.base import TimingPolicy
    from tunehub.kernels.registry import get_template
    from tunehub.tuner import Progress, baseline_dict, baseline_for, session_for_job
    from tunehub.tuner import strategy_names as known_strategies
    from tunehub.tuner.lookup import config_threads
    from tunehub.workers.local import LocalMeasurer

    workload = _workload(m, n, k, dtype, epilogue, a_layout, b_layout, allow_tf32)
    if device != "cpu" and not (device.startswith("cuda:") and device[5:].isdigit()):
        raise click.BadParameter("use cpu or cuda:N", param_hint="--device")
    if strategy not in known_strategies():
        raise click.BadParameter(
            f"unknown strategy {strategy!r}; known: {', '.join(known_strategies())}",
            param_hint="--strategy",
        )
    template = template or ("blis.gemm" if device == "cpu" else "triton.gemm")
    try:
        tmpl = get_template(template)
    except UnknownName as exc:
        raise click.BadParameter(str(exc), param_hint="--template") from None
    settings = _settings()
    settings.home.mkdir(parents=True, exist_ok=True)
    measurer = LocalMeasurer(
        device=device,
        build_dir=settings.build_dir,
        timing=TimingPolicy(min_secs=settings.min_repeat_secs, max_repeats=settings.max_repeats),
        timeout_secs=settings.measure_timeout_secs,
        max_candidate_secs=settings.max_candidate_secs,
        build_timeout_secs=settings.build_timeout_secs,
        builders=settings.builders,
    )
    try:
        target = measurer.target
    except RuntimeError as exc:
        measurer.close()
        _fail(str(exc))
    problem = tmpl.problem(workload, target)
    if problem is not None:
        measurer.close()
        field = problem.field.removeprefix("workload.").replace("_", "-")
        raise click.BadParameter(problem.reason, param_hint=f"--{field}")
    store = _open_store(settings.resolved_database_url(), init=True)
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
        f"budget {trials} trials / {secs:.0f}s, {measurer.builders} build process(es)",
        err=True,
    )

    def finish(state: JobState, error: str) -> None:
        # Only from RUNNING: a cancel from the dashboard or the API stands.
        store.set_job_state(job.id, state, error=error, only_from=(JobState.RUNNING,))

    last_check = [0.0, False]

    def cancelled() -> bool:
        if not last_check[1] and time.monotonic() - float(last_check[0]) > 0.25:
            last_check[0] = time.monotonic()
            last_check[1] = store.get_job(job.id).state is JobState.CANCELLED
        return bool(last_check[1])

    with click.progressbar(length=trials, label="trials", file=sys.stderr) as bar:
        shown = [0]

        def progress(p: Progress) -> None:
            bar.update(p.trials_done - shown[0])
            shown[0] = p.trials_done
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
                should_stop=cancelled,
            ).run()
        except BaseException as exc:
            finish(JobState.FAILED, f"{type(exc).__name__}: {exc}")
            raise
        finally:
            measurer.close()
    if result.stopped_by == "cancelled":
        _fail(f"job {job.id} was cancelled after {result.trials_done} trials")
    if result.stopped_by == "worker_error":
        finish(JobState.FAILED, result.error)
        _fail(f"job {job.id} failed: {result.error}")
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
    confirmation = result.confirmation
    schedule = store.get_schedule(
        workload_key=workload.key, target_key=target.target_key, template=tmpl.name
    )
    winner_config = schedule.config if schedule is not None else best.config
    winner_secs = (
        confirmation.median_secs
        if confirmation is not None
        else (schedule.median_secs if schedule is not None else best.median_secs)
    )
    baseline = baseline_for(
        store, workload=workload, target=target, template=tmpl.name, config=winner_config
    )
    store.close()
    speedup = baseline.median_secs / winner_secs if baseline and baseline.median_secs else None
    out = {
        "job": job.id,
        "workload": workload.label,
        "template": tmpl.name,
        "target": target.label,
        "trials": result.trials_done,
        "stopped_by": result.stopped_by,
        "config": winner_config.to_dict(),
        "median_secs": winner_secs,
        "gflops": workload.gflops(winner_secs),
        "confirmed": confirmation is not None,
        "confirmed_spread": confirmation.spread if confirmation else None,
        "baseline": baseline_dict(baseline),
        "speedup_vs_baseline": speedup,
    }
    if as_json:
        click.echo(json.dumps(out, indent=2))
        return
    knobs = " ".join(f"{k}={v}" for k, v in winner_config.items())
    how = (
        f"confirmed over {confirmation.rounds} rounds, spread {100 * confirmation.spread:.1f}%"
        if confirmation
        else "not confirmed"
    )
    click.echo(
        f"best after {result.trials_done} trials ({result.stopped_by}): "
        f"{workload.gflops(winner_secs):.2f} GFLOP/s, median {winner_secs * 1e3:.3f} ms "
        f"({how})\n  {knobs}"
    )
    if baseline is not None and baseline.gflops is not None and speedup is not None:
        verdict = "tunehub is faster" if speedup >= 1 else "the library is faster: use it"
        click.echo(
            f"vs {baseline.request.template} on {config_threads(winner_config)} thread(s): "
            f"{baseline.gflops:.2f} GFLOP/s, speedup {speedup:.2f}x ({verdict})"
        )


def _server_url(url: str | None) -> str | None:
    return url or os.environ.get("TUNEHUB_URL")


@main.command()
@click.argument("m", type=int)
@click.argument("n", type=int)
@click.argument("k", type=int)
@workload_options
@click.option("--target", default="local-cpu", show_default=True)
@click.option("--url", default=None, help="Ask this server (or $TUNEHUB_URL) instead of the DB.")
def lookup(
    m: int,
    n: int,
    k: int,
    dtype: str,
    epilogue: str,
    a_layout: str,
    b_layout: str,
    allow_tf32: bool,
    target: str,
    url: str | None,
) -> None:
    """Print the best known schedule for an MxNxK GEMM as JSON (exit 1 if none is known)."""
    workload = _workload(m, n, k, dtype, epilogue, a_layout, b_layout, allow_tf32)
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
