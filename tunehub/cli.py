"""The ``tunehub`` command line: serve, tune, lookup, jobs, db."""

from __future__ import annotations

import errno
import json
import logging
import os
import sys
import time
from typing import Any, NoReturn

import click

from tunehub.core import Budget, InvalidSpec, Workload
from tunehub.core.job import DEFAULT_STRATEGY, MAX_SECS, MAX_TRIALS
from tunehub.core.workload import DTYPES, EPILOGUES, LAYOUTS

DEFAULT_URL = "http://127.0.0.1:8000"


def _settings() -> Any:
    """The service's settings; a malformed TUNEHUB_* variable is a one-line error."""
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    from tunehub.service.settings import Settings

    try:
        return Settings()
    except ValidationError as exc:
        first = exc.errors()[0]
        name = "TUNEHUB_" + ".".join(str(p) for p in first["loc"]).upper()
        _fail(f"{name}: {first['msg']} (got {str(first.get('input'))[:80]!r})")
    except SettingsError as exc:
        _fail(f"settings: {exc}")


def _fail(message: str) -> NoReturn:
    raise click.ClickException(message)


def _home(settings: Any) -> Any:
    """The data dir, created if missing; a one-line error when it cannot be made or written."""
    from tunehub.kernels.build import dir_problem

    problem = dir_problem(settings.home)
    if problem is not None:
        _fail(
            f"TUNEHUB_HOME: {problem}; make it writable or point TUNEHUB_HOME at a "
            "writable directory"
        )
    return settings.home


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
    """Open the store at ``url``; a brand-new database is created at head when ``init``.

    Every way this can fail (an unreachable or unwritable database, a schema at another
    revision, tables that no tunehub migration made) is a one-line error saying what to do.
    """
    from tunehub.db import SchemaOutOfDate, SqlScheduleStore, check_at_head
    from tunehub.db import upgrade as db_upgrade

    try:
        state = database_state(url)
        if state == "foreign":
            _fail(database_problem(url, RuntimeError("tables but no revision")))
        if init and state == "empty":
            db_upgrade(url)
        check_at_head(url)
        return SqlScheduleStore(url)
    except SchemaOutOfDate as exc:
        _fail(str(exc))
    except click.ClickException:
        raise
    except Exception as exc:
        _fail(database_problem(url, exc))


def database_state(url: str) -> str:
    """``empty`` (no tables at all), ``migrated`` (an Alembic revision), or ``foreign``
    (tables but no revision: made outside tunehub's migrations, or its revision was lost)."""
    from sqlalchemy import inspect

    from tunehub.db import current_revision, make_engine

    if current_revision(url) is not None:
        return "migrated"
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            tables = set(inspect(conn).get_table_names())
    finally:
        engine.dispose()
    return "foreign" if tables else "empty"


def database_problem(url: str, exc: BaseException) -> str:
    """One line saying why the database at ``url`` cannot be used, and what to do."""
    from sqlalchemy.exc import DBAPIError

    from tunehub.db.engine import safe_url

    where = f"database {safe_url(url)}"
    if str(exc) == "tables but no revision" or (
        isinstance(exc, DBAPIError) and "already exists" in str(exc.orig)
    ):
        return (
            f"{where} has tables but no tunehub schema revision: tunehub did not create "
            "it (or its alembic_version table was lost); use an empty database, or "
            "restore alembic_version"
        )
    if isinstance(exc, DBAPIError) and exc.orig is not None:
        reason = " ".join(str(exc.orig).split())[:300]
        if database_state_safe(url) == "foreign":
            return (
                f"{where} has tables but no tunehub schema revision: tunehub did not create "
                "it (or its alembic_version table was lost); use an empty database, or "
                "restore alembic_version"
            )
        if "readonly" in reason or "read-only" in reason:
            return f"{where} is read-only ({reason}); tunehub needs to write to it"
        return (
            f"{where} cannot be used: {reason}; check TUNEHUB_DATABASE_URL and that the "
            "server is up and reachable"
        )
    return f"{where} cannot be used: {type(exc).__name__}: {exc}"


def database_state_safe(url: str) -> str | None:
    try:
        return database_state(url)
    except Exception:
        return None


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
@click.option(
    "--ray",
    "ray_address",
    default=None,
    metavar="ADDRESS",
    help="Measure through the Ray cluster at ADDRESS (its head's host:port; `local` starts "
    "Ray here). Default: $TUNEHUB_RAY_ADDRESS, else this machine's devices without Ray.",
)
@click.option(
    "--workers",
    type=click.IntRange(1, 64),
    default=None,
    help="Worker processes (default 1, or TUNEHUB_WORKERS); one of them runs the jobs.",
)
def serve(
    host: str | None,
    port: int | None,
    no_runner: bool,
    ray_address: str | None,
    workers: int | None,
) -> None:
    """Start the API, the dashboard and the job runner.

    First it checks what it needs and says what to do when something is wrong: the port must
    be free (checked before anything starts), the data dir (and, with the runner, its build
    dir) must be writable, the database reachable and at this tunehub's schema. A new
    database is created at the current schema; an older one is refused until you run
    `tunehub db upgrade`.
    """
    import uvicorn

    from tunehub.core import Scope
    from tunehub.kernels.build import dir_problem
    from tunehub.service.app import create_app

    settings = _settings()
    host = host or settings.host
    port = settings.port if port is None else port
    # Before anything starts: uvicorn runs the app's startup (the job runner, its workers'
    # registration) before it binds, so a busy port would fail only after all of that.
    problem = port_problem(host, port)
    if problem is not None:
        _fail(problem)
    _home(settings)
    if ray_address is not None:
        settings.ray_address = ray_address
    if settings.ray_address and not no_runner:
        _ray_or_fail()
    if no_runner:
        settings.run_jobs = False
    else:
        problem = dir_problem(settings.build_dir)
        if problem is not None:
            _fail(f"build dir: {problem}; the job runner compiles kernels there")
        low = dir_problem(settings.build_dir, min_free_bytes=settings.min_free_bytes)
        if low is not None:
            click.echo(f"tunehub: warning: {low}; jobs wait until there is room", err=True)
    url = settings.resolved_database_url()
    store = _open_store(url, init=True)
    try:
        writers = [k for k in store.list_api_keys() if k.active and k.scope.allows(Scope.WRITE)]
    except Exception as exc:
        _fail(database_problem(url, exc))
    finally:
        store.close()
    if host not in ("0.0.0.0", "::", "") and "*" not in settings.allowed_hosts:
        settings.allowed_hosts = [*settings.allowed_hosts, host]  # its own address is served
    logging.getLogger("tunehub").setLevel(logging.INFO)
    click.echo(f"tunehub: dashboard and API on http://{host}:{port}/ (data: {settings.home})")
    if not writers:
        click.echo(
            "tunehub: no API key can submit jobs yet: make one with "
            "`tunehub keys create --scope write`",
            err=True,
        )
    if workers is not None:
        settings.workers = workers
    if settings.workers == 1:
        uvicorn.run(
            create_app(settings),
            host=host,
            port=port,
            log_level="info",
            timeout_keep_alive=5,
            limit_concurrency=settings.max_connections,
        )
        return
    # Each worker process builds its app from the environment (serve_app): hand it what the
    # options changed. One of them takes the runner's lock and runs jobs and the trainer.
    os.environ.update(
        TUNEHUB_RUN_JOBS=str(settings.run_jobs).lower(),
        TUNEHUB_WORKERS=str(settings.workers),
        TUNEHUB_ALLOWED_HOSTS=",".join(settings.allowed_hosts),
        TUNEHUB_HOME=str(settings.home),
        TUNEHUB_RAY_ADDRESS=settings.ray_address or "",
    )
    uvicorn.run(
        "tunehub.service.app:serve_app",
        factory=True,
        workers=settings.workers,
        host=host,
        port=port,
        log_level="info",
        timeout_keep_alive=5,
        limit_concurrency=settings.max_connections,
    )


def port_problem(host: str, port: int) -> str | None:
    """One line saying why ``tunehub serve`` cannot listen on ``host``:``port`` and what to do,
    or None. Binds as uvicorn will (``SO_REUSEADDR``) and lets go at once."""
    import socket

    if port == 0:
        return None  # any free port
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)  # fmt: skip
    except OSError as exc:
        return f"cannot listen on {host}:{port}: {exc}; pass another --host"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            fix = "pass another --port (or TUNEHUB_PORT)"
            if exc.errno == errno.EADDRINUSE:
                return (f"port {port} on {host} is in use (another tunehub serve?): stop what "
                        f"listens there, or {fix}")  # fmt: skip
            if exc.errno == errno.EACCES:
                return f"port {port} on {host} needs privileges to listen on: {fix} above 1023"
            return f"cannot listen on {host}:{port}: {exc.strerror or exc}; {fix} or --host"
    return None


def _ray_or_fail() -> None:
    try:
        import ray  # noqa: F401
    except ImportError:
        _fail("Ray is not installed: pip install 'tunehub[cluster]'")


def _parse_gpus(text: str) -> list[int]:
    """``all`` (every GPU this host has), ``none``, or indices such as ``0,1``."""
    from tunehub.workers.gpus import visible_gpus

    value = text.strip().lower()
    if value == "all":
        return visible_gpus()
    if value in ("none", ""):
        return []
    parts = [p.strip() for p in value.split(",")]
    if not all(p.isdigit() for p in parts):
        _fail(f"--gpus: expected all, none or indices like 0,1; got {text!r}")
    wanted = sorted({int(p) for p in parts})
    have = visible_gpus()
    missing = [i for i in wanted if i not in have]
    if missing:
        _fail(f"--gpus: this machine has no GPU {missing[0]} (it has: {have or 'none'})")
    return wanted


def _check_claim(claim: str, devices: list[str]) -> None:
    """Refuse to join when a device's fingerprint is not the target this worker must be."""
    from tunehub.core import local_cpu_target
    from tunehub.workers.local import LocalMeasurer
    from tunehub.workers.ray_measurer import fingerprint_difference

    for device in devices:
        if device == "cpu":
            found = local_cpu_target()
        else:
            measurer = LocalMeasurer(device=device)
            try:
                found = measurer.target
            except RuntimeError as exc:
                _fail(f"{device}: {exc}")
            finally:
                measurer.close()
        if found.target_key != claim:
            why = fingerprint_difference(None, claim, found)
            logging.getLogger("tunehub.worker").error("refused to join: %s: %s", device, why)
            _fail(f"refused: {device}: {why}; this machine's target key is {found.target_key}")


def _reachable(address: str) -> None:
    import socket

    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        _fail(f"--address: expected host:port (as `ray start --head` prints it), got {address!r}")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except OSError as exc:
        _fail(
            f"cannot reach the Ray cluster at {address}: {exc.strerror or exc}; is "
            "`ray start --head` running there and its port open to this machine?"
        )


@main.command()
@click.option("--address", required=True, help="The Ray cluster to join: its head's host:port.")
@click.option("--cpu/--no-cpu", default=True, show_default=True, help="Offer this CPU.")
@click.option(
    "--gpus", default="all", show_default=True, help="GPUs to offer: all, none, or indices 0,1."
)
@click.option(
    "--target",
    "claim",
    default=None,
    metavar="KEY",
    help="The target key this machine must be; it refuses to join (and the service refuses "
    "its actors) when an offered device's fingerprint differs. It applies to every device "
    "offered: claim a GPU's target with --no-cpu --gpus N.",
)
def worker(address: str, cpu: bool, gpus: str, claim: str | None) -> None:
    """Join a Ray cluster as a node that measures for tunehub (until stopped).

    Runs `ray start --address ADDRESS --block` with the resources that tell a tunehub
    service to place one measuring actor on this node per offered device.
    """
    import json
    import signal
    import subprocess

    indices = _parse_gpus(gpus)
    devices = (["cpu"] if cpu else []) + [f"cuda:{i}" for i in indices]
    if not devices:
        _fail("nothing to offer: pass --cpu or --gpus")
    _ray_or_fail()
    from tunehub.workers.ray_measurer import node_resources

    if claim is not None:
        _check_claim(claim, devices)
    _reachable(address)
    resources = node_resources(cpu=cpu, gpus=indices, claim=claim)
    command = [
        sys.executable, "-m", "ray.scripts.scripts", "start", "--address", address, "--block",
        "--num-gpus", str(len(indices)), "--resources", json.dumps(resources),
        "--disable-usage-stats",
    ]  # fmt: skip
    click.echo(f"tunehub: joining the Ray cluster at {address}, offering {', '.join(devices)}")
    proc = subprocess.Popen(command, preexec_fn=_die_with_parent)

    def forward(signum: int, frame: object) -> None:
        proc.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, forward)
    code = proc.wait()
    if code not in (0, -signal.SIGTERM, -signal.SIGINT):
        hint = ""
        if os.environ.get("RAY_AUTH_MODE", "").lower() != "token":
            # Ray turns token authentication on by itself for `ray start --head`, never for a
            # node or driver given an address: a joining node must be told (the usual refusal).
            hint = (
                "; if it says InvalidAuthToken, the cluster uses token authentication: set "
                "RAY_AUTH_MODE=token and the cluster's token (RAY_AUTH_TOKEN or ~/.ray/auth_token)"
            )
        _fail(f"ray start exited with status {code} (its output is above){hint}")


def _die_with_parent() -> None:
    """In the child: be sent SIGTERM when the worker process dies, however it dies."""
    import ctypes
    import signal

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


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
    from tunehub.core.owner import new_owner
    from tunehub.core.registry import UnknownName
    from tunehub.kernels.base import TimingPolicy
    from tunehub.kernels.registry import get_template
    from tunehub.tuner import (
        LeaseKeeper,
        Progress,
        baseline_dict,
        find_schedule,
        session_for_job,
    )
    from tunehub.tuner import strategy_names as known_strategies
    from tunehub.tuner.best import best_dict, best_line
    from tunehub.tuner.lookup import LIBRARY_TIE, config_threads
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
    _home(settings)
    measurer = LocalMeasurer(
        device=device,
        build_dir=settings.build_dir,
        timing=TimingPolicy(min_secs=settings.min_repeat_secs, max_repeats=settings.max_repeats),
        timeout_secs=settings.measure_timeout_secs,
        max_candidate_secs=settings.max_candidate_secs,
        build_timeout_secs=settings.build_timeout_secs,
        builders=settings.builders,
        build_cache_max_bytes=settings.build_cache_max_bytes,
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
    owner = new_owner()
    job = store.create_job(spec, claimed=True, owner=owner, lease_secs=settings.lease_secs)
    # The lease keeps serve's runners off this job while it runs here; were this process to
    # die, the job would go back to their queue once the lease expired.
    leases = LeaseKeeper(store, lease_secs=settings.lease_secs, reap=False)
    leases.hold(job.id, owner)
    leases.start()
    click.echo(
        f"job {job.id}: tuning {workload.label} with {tmpl.name} on {target.label}: "
        f"{len(tmpl.space(workload, target))} configs, {strategy}, "
        f"budget {trials} trials / {secs:.0f}s, {measurer.builders} build process(es)",
        err=True,
    )

    def finish(state: JobState, error: str) -> None:
        # Only from RUNNING and only while ours: a cancel from the dashboard or the API stands.
        leases.stop()
        store.set_job_state(job.id, state, error=error, only_from=(JobState.RUNNING,), owner=owner)

    last_check = [0.0, False]

    def cancelled() -> bool:
        if leases.lost(job.id):
            return True
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
                owner=owner,
                db_outage_secs=settings.db_outage_secs,
            ).run()
        except BaseException as exc:
            finish(JobState.FAILED, f"{type(exc).__name__}: {exc}")
            raise
        finally:
            measurer.close()
            leases.stop()
    if result.stopped_by == "lease_lost" or leases.lost(job.id):
        _fail(
            f"job {job.id} lost its lease (this process was stalled, or the database away, for "
            f"longer than TUNEHUB_LEASE_SECS={settings.lease_secs:g}); a runner of "
            "`tunehub serve` resumes it"
        )
    if result.stopped_by == "cancelled":
        _fail(f"job {job.id} was cancelled after {result.trials_done} trials")
    if result.stopped_by in ("worker_error", "noisy"):  # the machine failed, or was too busy
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
    # One best: what the lookup now serves for this workload (the confirmed winner, which can
    # be another config than the fastest single trial), as the job list and the API show it.
    answer = find_schedule(store, workload, target, template=tmpl.name)
    store.close()
    if answer is None:  # an ok record was stored, so a schedule exists; unless it was deleted
        _fail(f"job {job.id}: no schedule stored for {workload.label}; see `tunehub jobs`")
    served = best_dict(answer)
    schedule = answer.schedule
    confirmation = schedule.confirmation
    out = {
        "job": job.id,
        "workload": workload.label,
        "template": tmpl.name,
        "target": target.label,
        "trials": result.trials_done,
        "stopped_by": result.stopped_by,
        "config": schedule.config.to_dict(),
        "median_secs": answer.best_secs,
        "gflops": served["gflops"],
        "confirmed": confirmation is not None,
        "confirmed_spread": confirmation.spread if confirmation else None,
        "baseline": baseline_dict(answer.baseline),
        "speedup_vs_baseline": answer.speedup_vs_baseline,
        "best": served,
    }
    if as_json:
        click.echo(json.dumps(out, indent=2))
        return
    how = (
        f"confirmed over {confirmation.rounds} rounds, spread {100 * confirmation.spread:.1f}%"
        if confirmation
        else "not confirmed"
    )
    click.echo(f"job {job.id}: {result.trials_done} trials ({result.stopped_by}); {how}")
    click.echo(best_line(served, workload.label, target.label))
    baseline, speedup = answer.baseline, answer.speedup_vs_baseline
    if baseline is not None and baseline.gflops is not None and speedup is not None:
        # The lookup's rule: within LIBRARY_TIE of the library is a tie, and goes to it.
        verdict = (
            "tunehub is faster"
            if speedup >= LIBRARY_TIE
            else "a tie: use the library"
            if speedup >= 1
            else "the library is faster: use it"
        )
        library = baseline_dict(baseline) or {}
        on = (
            f"on {config_threads(schedule.config)} thread(s)"
            if target.kind == "cpu"
            else f"({library.get('library', 'vendor library')})"
        )
        click.echo(
            f"vs {baseline.request.template} {on}: {baseline.gflops:.2f} GFLOP/s, "
            f"speedup {speedup:.2f}x ({verdict})"
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

    store = _open_store(_store_url(), init=False)
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
    """List recent jobs, newest first, each with its best: the schedule the lookup serves for
    its workload (confirmed, or marked as the best trial so far) and its speedup over the
    library."""
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
                 j.get("best"), j["workload_label"])
            )  # fmt: skip
    else:
        from tunehub.tuner.best import best_dict, job_bests

        store = _open_store(_store_url(), init=False)
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
    _home(settings)
    url = settings.resolved_database_url()
    try:
        before = current_revision(url)
        if before is None and database_state(url) == "foreign":
            _fail(database_problem(url, RuntimeError("tables but no revision")))
        db_upgrade(url)
    except click.ClickException:
        raise
    except Exception as exc:
        _fail(database_problem(url, exc))
    click.echo(f"database {safe_url(url)}: {before or 'empty'} -> {head_revision()} (head)")


@db.command("current")
def db_current_cmd() -> None:
    """Print the database's schema revision and the head revision."""
    from tunehub.db import current_revision, head_revision
    from tunehub.db.engine import safe_url

    url = _store_url()
    try:
        current = current_revision(url)
    except Exception as exc:
        _fail(database_problem(url, exc))
    click.echo(f"database {safe_url(url)}: {current or 'empty'}; head {head_revision()}")


def _store_url() -> str:
    """The database URL of the settings (the data dir checked first)."""
    settings = _settings()
    _home(settings)
    url: str = settings.resolved_database_url()
    return url


# --- API keys ------------------------------------------------------------------------------
@main.group()
def keys() -> None:
    """API keys: writes over HTTP need one (reads too, if TUNEHUB_READ_REQUIRES_KEY is set).

    Keys are stored hashed: a key is shown once, when it is made.
    """


@keys.command("create")
@click.option(
    "--scope",
    type=click.Choice(["read", "write", "admin"]),
    default="write",
    show_default=True,
    help="read: closed reads; write: submit jobs and cancel its own; admin: everything.",
)
@click.option("--name", default=None, help="Who or what it is for (default: the scope).")
@click.option(
    "--max-trials",
    type=click.IntRange(1, MAX_TRIALS),
    default=None,
    help="Most trials per job for this key (default TUNEHUB_MAX_JOB_TRIALS).",
)
@click.option(
    "--max-secs",
    type=click.FloatRange(1, MAX_SECS),
    default=None,
    help="Most tuning seconds per job (default TUNEHUB_MAX_JOB_SECS).",
)
@click.option("--max-queued-jobs", type=click.IntRange(1, 100_000), default=None,
              help="Jobs it may have queued or running (default "
              "TUNEHUB_MAX_QUEUED_JOBS_PER_KEY).")  # fmt: skip
def keys_create(
    scope: str,
    name: str | None,
    max_trials: int | None,
    max_secs: float | None,
    max_queued_jobs: int | None,
) -> None:
    """Make a key and print it (only now: it is stored hashed)."""
    from tunehub.core import KeyLimits, Scope
    from tunehub.core.apikey import check_key_name, new_api_key

    name = name or f"{scope} key"
    try:
        check_key_name(name)
    except InvalidSpec as exc:
        raise click.BadParameter(exc.reason, param_hint="--name") from None
    store = _open_store(_store_url(), init=True)
    try:
        for _ in range(5):  # a clash of the random 8-digit prefixes is rare; draw again
            token, prefix, digest = new_api_key()
            try:
                key = store.create_api_key(
                    prefix=prefix,
                    secret_hash=digest,
                    name=name,
                    scope=Scope(scope),
                    limits=KeyLimits(max_trials, max_secs, max_queued_jobs),
                )
                break
            except ValueError:
                continue
        else:
            _fail("could not draw an unused key prefix; try again")
    finally:
        store.close()
    click.echo(token)
    click.echo(
        f"API key {key.id} ({name}, scope {scope}) made; this is the only time it is shown. "
        "Send it in the X-API-Key header.",
        err=True,
    )


@keys.command("list")
def keys_list() -> None:
    """Every key: id, prefix, scope, name, when made, revoked or not, its own limits."""
    store = _open_store(_store_url(), init=False)
    try:
        found = store.list_api_keys()
    finally:
        store.close()
    if not found:
        click.echo("no API keys yet: `tunehub keys create --scope write`")
        return
    click.echo(f"{'id':>4}  {'key':<12} {'scope':<6} {'state':<8} {'created (UTC)':<17} name")
    for key in found:
        state = "active" if key.active else "revoked"
        limits = [
            f"{label} {value:g}"
            for label, value in (
                ("trials", key.limits.max_trials),
                ("secs", key.limits.max_secs),
                ("queued", key.limits.max_queued_jobs),
            )
            if value is not None
        ]
        extra = f"  [{', '.join(limits)}]" if limits else ""
        created = key.created_at.strftime("%Y-%m-%d %H:%M")
        click.echo(
            f"{key.id:>4}  th_{key.prefix:<9} {key.scope.value:<6} {state:<8} {created:<17} "
            f"{key.name}{extra}"
        )


@keys.command("revoke")
@click.argument("key")
def keys_revoke(key: str) -> None:
    """Revoke KEY (its id, its th_xxxxxxxx prefix, or the key itself): it stops working at
    once. Its jobs run on."""
    from tunehub.core.apikey import parse_api_key
    from tunehub.db import ApiKeyNotFound

    store = _open_store(_store_url(), init=False)
    try:
        if key.isdigit():
            found = store.get_api_key(key_id=int(key))
        else:
            prefix = parse_api_key(key) or key.removeprefix("th_")
            found = store.get_api_key(prefix=prefix) if len(prefix) == 8 else None
        if found is None:
            raise ApiKeyNotFound(key)
        revoked = store.revoke_api_key(found.id)
    except ApiKeyNotFound:
        _fail(f"no API key {key!r}; `tunehub keys list` shows them")
    finally:
        store.close()
    click.echo(f"API key {revoked.id} ({revoked.label}) revoked")


if __name__ == "__main__":
    main()
