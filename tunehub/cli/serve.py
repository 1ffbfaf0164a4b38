"""``tunehub serve`` (the API, dashboard and job runner) and ``tunehub worker`` (a Ray node
that measures for a service)."""

from __future__ import annotations

import errno
import logging
import os
import sys

import click

from tunehub.cli.common import data_home, database_problem, fail, load_settings, open_store


@click.command()
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
    from tunehub.service.app import create_app, serving_process

    settings = load_settings()
    host = host or settings.host
    port = settings.port if port is None else port
    # Before anything starts: uvicorn runs the app's startup (the job runner, its workers'
    # registration) before it binds, so a busy port would fail only after all of that.
    problem = port_problem(host, port)
    if problem is not None:
        fail(problem)
    data_home(settings)
    if ray_address is not None:
        settings.ray_address = ray_address
    if settings.ray_address and not no_runner:
        _ray_or_fail()
    if no_runner:
        settings.run_jobs = False
    else:
        problem = dir_problem(settings.build_dir)
        if problem is not None:
            fail(f"build dir: {problem}; the job runner compiles kernels there")
        low = dir_problem(settings.build_dir, min_free_bytes=settings.min_free_bytes)
        if low is not None:
            click.echo(f"tunehub: warning: {low}; jobs wait until there is room", err=True)
    url = settings.resolved_database_url()
    store = open_store(url, init=True)
    try:
        writers = [k for k in store.list_api_keys() if k.active and k.scope.allows(Scope.WRITE)]
    except Exception as exc:
        fail(database_problem(url, exc))
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
        serving_process(settings)
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
    # Each counts its metrics in files of its own under <home>/metrics (emptied now), which a
    # scrape of any of them adds up.
    from tunehub.service.metrics import prepare_multiprocess

    prepare_multiprocess(settings.home)
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
        fail("Ray is not installed: pip install 'tunehub[cluster]'")


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
        fail(f"--gpus: expected all, none or indices like 0,1; got {text!r}")
    wanted = sorted({int(p) for p in parts})
    have = visible_gpus()
    missing = [i for i in wanted if i not in have]
    if missing:
        fail(f"--gpus: this machine has no GPU {missing[0]} (it has: {have or 'none'})")
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
                fail(f"{device}: {exc}")
            finally:
                measurer.close()
        if found.target_key != claim:
            why = fingerprint_difference(None, claim, found)
            logging.getLogger("tunehub.worker").error("refused to join: %s: %s", device, why)
            fail(f"refused: {device}: {why}; this machine's target key is {found.target_key}")


def _reachable(address: str) -> None:
    import socket

    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        fail(f"--address: expected host:port (as `ray start --head` prints it), got {address!r}")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except OSError as exc:
        fail(
            f"cannot reach the Ray cluster at {address}: {exc.strerror or exc}; is "
            "`ray start --head` running there and its port open to this machine?"
        )


@click.command()
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
        fail("nothing to offer: pass --cpu or --gpus")
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
    # Stopped (or its parent gone: _die_with_parent), `ray start` would first drain the node
    # for up to 30 s, and the service's actors on it hold their leases, so they would go on
    # measuring all that time: the node is torn down at once instead (the service sends what
    # they had in flight to another worker).
    env = dict(os.environ)
    env.setdefault("RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", "0")
    proc = subprocess.Popen(command, preexec_fn=_die_with_parent, env=env)

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
        fail(f"ray start exited with status {code} (its output is above){hint}")


def _die_with_parent() -> None:
    """In the child: be sent SIGTERM when the worker process dies, however it dies."""
    import ctypes
    import signal

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
