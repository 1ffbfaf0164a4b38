"""The FastAPI application: routers, error handlers, store and job runner lifecycle."""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

import tunehub
from tunehub.core import LOCAL_CPU, InvalidSpec, Target, local_cpu_target
from tunehub.cost_model.registry import GlobalTrainer, ModelCache, Trainable
from tunehub.db import (
    QueueFull,
    ScheduleStore,
    SqlScheduleStore,
    StoreUnavailable,
    check_at_head,
)
from tunehub.db.journal import ResultJournal
from tunehub.kernels.base import TimingPolicy
from tunehub.kernels.registry import TEMPLATES, get_template
from tunehub.service import dashboard
from tunehub.service.auth import API_KEY_HEADER
from tunehub.service.lookup_cache import FastLookup, LookupCache
from tunehub.service.lookup_miss import FastMiss
from tunehub.service.redact import printable
from tunehub.service.routes_autotune import router as autotune_router
from tunehub.service.routes_jobs import router as jobs_router
from tunehub.service.routes_metrics import router as metrics_router
from tunehub.service.routes_models import router as models_router
from tunehub.service.routes_operators import router as operators_router
from tunehub.service.routes_schedules import router as schedules_router
from tunehub.service.routes_targets import router as targets_router
from tunehub.service.routes_workers import router as workers_router
from tunehub.service.runner import JobRunner
from tunehub.service.schemas import HealthOut
from tunehub.service.security import (
    BodyLimit,
    CrossSiteCheck,
    HostCheck,
    KeylessRateLimit,
    SecurityHeaders,
)
from tunehub.service.settings import Settings
from tunehub.service.store_health import RETRY_AFTER_SECS, StoreHealth
from tunehub.tuner.lookup import NeighbourIndex
from tunehub.workers.base import Measurer
from tunehub.workers.local import LocalMeasurer

log = logging.getLogger(__name__)


def local_measurer_factory(settings: Settings, device: str = "cpu") -> Callable[[], Measurer]:
    """Builds the LocalMeasurer of one device with the service's settings."""

    def make() -> Measurer:
        return LocalMeasurer(
            device=device,
            build_dir=settings.build_dir,
            timing=TimingPolicy(
                min_secs=settings.min_repeat_secs, max_repeats=settings.max_repeats
            ),
            timeout_secs=settings.measure_timeout_secs,
            max_candidate_secs=settings.max_candidate_secs,
            build_timeout_secs=settings.build_timeout_secs,
            builders=settings.builders,
            build_cache_max_bytes=settings.build_cache_max_bytes,
        )

    return make


def start_workers(
    runner: JobRunner, settings: Settings, cpu_factory: Callable[[], Measurer]
) -> dict[str, Target]:
    """One worker for the CPU and one per GPU (``settings.gpus``); returns the local aliases
    (``local-cpu``, ``local-cuda:N``) of their targets. A GPU that cannot be fingerprinted
    (no torch, a broken driver) is skipped with a warning."""
    aliases = {LOCAL_CPU: runner.add_worker(cpu_factory, device="cpu").target}
    for index in settings.gpu_indices():
        device = f"cuda:{index}"
        try:
            worker = runner.add_worker(local_measurer_factory(settings, device), device=device)
        except Exception as exc:
            log.warning("no worker for %s: %s", device, exc)
            continue
        aliases[f"local-{device}"] = worker.target
        aliases.setdefault("local-cuda", worker.target)
    return aliases


def start_ray_workers(runner: JobRunner, settings: Settings) -> None:
    """Measure through the Ray cluster at ``settings.ray_address``: its tunehub actors
    become the runner's workers (Ray is imported here only)."""
    from tunehub.workers.ray_measurer import RayCluster, node_resources

    address = settings.ray_address or "local"
    cluster = RayCluster(
        address,
        options={
            "timing": TimingPolicy(
                min_secs=settings.min_repeat_secs, max_repeats=settings.max_repeats
            ),
            "timeout_secs": settings.measure_timeout_secs,
            "max_candidate_secs": settings.max_candidate_secs,
            "build_timeout_secs": settings.build_timeout_secs,
            "builders": settings.builders,
            "build_cache_max_bytes": settings.build_cache_max_bytes,
        },
        resources=node_resources(cpu=True, gpus=settings.gpu_indices()),
    )
    log.info("measuring through the Ray cluster at %s", address)
    runner.attach_cluster(cluster)


def trainables(store: ScheduleStore) -> list[Trainable]:
    """Every (target family, tunable template of its kind, template version) the store has
    targets for: what the background trainer keeps models of."""
    found: dict[tuple[str, str, int], Trainable] = {}
    for target in store.list_targets():
        for name in TEMPLATES.names():
            template = get_template(name)
            if template.baseline or template.device_kind != target.kind:
                continue
            key = (target.family_key, template.name, template.version)
            label = f"{target.kind} {target.name} [{' '.join(target.arch)}]"
            found.setdefault(key, Trainable(*key, target_label=label))
    return list(found.values())


def claim_runner(lock_path: Path) -> int | None:
    """Take the lock naming the one process of ``tunehub serve --workers N`` that runs jobs
    and trains models: an open file descriptor holding it (kept open for the process's life;
    the OS frees it when the process ends), or None when another process holds it."""
    import fcntl

    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def serve_app() -> FastAPI:
    """The app of one ``tunehub serve --workers N`` process (uvicorn's factory): settings
    from the environment, which ``tunehub serve`` fills in before starting the workers."""
    # A spawned worker does not inherit the CLI's logging set-up.
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("tunehub").setLevel(logging.INFO)
    settings = Settings()
    serving_process(settings)
    return create_app(settings)


def serving_process(settings: Settings) -> None:
    """What a ``tunehub serve`` process sets for itself (not ``create_app``: apps built in
    tests or embedded leave their process as it is): the interpreter's thread switch
    interval. An uncached lookup reads the database on a thread of the pool and hands its
    answer back to the event loop; with Python's default of 5 ms, either side waiting for
    the other to let go of the interpreter made the answers' latency tail and cost about a
    quarter of the throughput under wrk on the 2-core VM (docs/fastpath.md)."""
    sys.setswitchinterval(settings.switch_interval_secs)


def create_app(
    settings: Settings | None = None,
    *,
    store: ScheduleStore | None = None,
    measurer_factory: Callable[[], Measurer] | None = None,
) -> FastAPI:
    """Build the app. Without ``store`` it opens ``settings``' database, which must be at the
    Alembic head (else startup fails saying to run ``tunehub db upgrade``)."""
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        owned = store is None
        if store is None:
            url = settings.resolved_database_url()
            check_at_head(url)
            app.state.store = SqlScheduleStore(url)
        else:
            app.state.store = store
        app.state.store_health = StoreHealth(app.state.store)
        # Stored once here, so lookups (the compilers' hot path) never write.
        app.state.store.put_target(local_cpu_target())
        app.state.local_targets = {LOCAL_CPU: local_cpu_target()}
        # Several serving processes: only the one holding the lock runs jobs and trains.
        lock_fd: int | None = None
        runs_jobs, trains = settings.run_jobs, settings.train_models
        if settings.workers > 1 and (runs_jobs or trains):
            lock_fd = claim_runner(settings.home / "serve.lock")
            if lock_fd is None:
                runs_jobs = trains = False
            log.info("process %d: job runner and trainer %s", os.getpid(),
                     "here" if lock_fd is not None else "in another process")  # fmt: skip
        runner: JobRunner | None = None
        if runs_jobs:
            runner = JobRunner(
                app.state.store,
                slice_secs=settings.job_slice_secs,
                min_slice_secs=settings.job_min_slice_secs,
                build_dir=settings.build_dir,
                min_free_bytes=settings.min_free_bytes,
                health_secs=settings.health_check_secs,
                lease_secs=settings.lease_secs,
                db_outage_secs=settings.db_outage_secs,
                replica_id=settings.replica_id,
                journal=(
                    ResultJournal.in_home(settings.home, max_bytes=settings.journal_max_bytes)
                    if settings.journal_max_bytes
                    else None
                ),
                fair_share=settings.fair_share,
            )
            if settings.ray_address:
                start_ray_workers(runner, settings)
            else:
                app.state.local_targets = start_workers(
                    runner, settings, measurer_factory or local_measurer_factory(settings)
                )
            runner.start()
        app.state.runner = runner
        models = ModelCache(app.state.store)
        app.state.models = models
        trainer: GlobalTrainer | None = None
        # The tuned sets predictions are checked against, kept for the process's life and
        # patched from the same change feed as the answers (see tuner/neighbours.py).
        neighbours = NeighbourIndex(app.state.store)
        app.state.neighbours = neighbours
        lookup_cache.start(
            app.state.store, on_models=[models.forget_latest], on_changes=[neighbours.forget]
        )
        if trains:
            store_ = app.state.store
            trainer = GlobalTrainer(
                store_,
                lambda: trainables(store_),
                interval_secs=settings.train_interval_secs,
                min_new_records=settings.train_min_new_records,
                on_model=lambda _: models.forget_latest(),
            )
            trainer.start()
        app.state.trainer = trainer
        # What startup loaded (modules, templates, schemas, the store's metadata) lives as long
        # as the process: set aside from the cyclic collector, so a request's short-lived
        # objects no longer set off full collections over all of it (about 100 ms each on the
        # 2-core VM: the tail of a batch lookup). Given back at shutdown.
        gc.freeze()
        try:
            yield
        finally:
            gc.unfreeze()
            lookup_cache.stop()
            with contextlib.suppress(Exception):  # the uncached lookups' async connections
                await app.state.store.aclose_async()
            if trainer is not None:
                trainer.stop()
            if runner is not None:
                runner.stop()
                if runner.cluster is not None:
                    runner.cluster.close()
            if lock_fd is not None:
                os.close(lock_fd)
            if owned:
                app.state.store.close()

    app = FastAPI(
        title="tunehub",
        version=tunehub.__version__,
        summary="Autotuning service for compute kernels: submit tuning jobs, look up schedules.",
        lifespan=lifespan,
        # /docs and /redoc come from dashboard.mount_api_docs: FastAPI's own load a CDN's files.
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings = settings
    lookup_cache = LookupCache(
        max_entries=settings.lookup_cache_entries, refresh_secs=settings.lookup_refresh_secs
    )
    app.state.lookup_cache = lookup_cache

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI echoes the rejected input; a NaN or 1e400 there cannot be written as JSON,
        # so each error keeps its location, message and type only.
        # A location may hold a key the client sent: made printable, so a NUL or a lone
        # surrogate cannot break the answer.
        errors = [
            {
                "loc": [printable(p) if isinstance(p, str) else p for p in e.get("loc", ())],
                "msg": printable(str(e.get("msg", ""))),
                "type": e.get("type", ""),
            }
            for e in exc.errors()
        ]
        return JSONResponse(
            status_code=status.HTTP_422_UNPROCESSABLE_CONTENT, content={"detail": errors}
        )

    @app.exception_handler(InvalidSpec)
    async def invalid_spec(request: Request, exc: InvalidSpec) -> JSONResponse:
        where = "body" if request.method in ("POST", "PUT", "PATCH") else "query"
        return JSONResponse(
            status_code=status.HTTP_422_UNPROCESSABLE_CONTENT,
            content={
                "detail": [
                    {
                        "loc": [where, *exc.field.split(".")],
                        "msg": exc.reason,
                        "type": "value_error",
                    }
                ]
            },
        )

    @app.exception_handler(QueueFull)
    async def queue_full(request: Request, exc: QueueFull) -> JSONResponse:
        return JSONResponse(
            status_code=status.HTTP_429_TOO_MANY_REQUESTS,
            content={"detail": str(exc)},
            headers={"Retry-After": "60"},
        )

    def store_away(request: Request, reason: str) -> JSONResponse:
        # Every route's answer while the store cannot answer, in this one place: 503 with when
        # to try again, and health degraded at once (not at the runner's next heartbeat).
        health: StoreHealth | None = getattr(request.app.state, "store_health", None)
        if health is not None:
            health.failed(reason)
        return JSONResponse(
            status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
            content={"detail": f"the database cannot answer now: {printable(reason)[:200]}"},
            headers={"Retry-After": str(RETRY_AFTER_SECS)},
        )

    @app.exception_handler(StoreUnavailable)
    async def store_unavailable(request: Request, exc: StoreUnavailable) -> JSONResponse:
        return store_away(request, str(exc).removeprefix("the database is unreachable: "))

    @app.exception_handler(DBAPIError)
    async def database_error(request: Request, exc: DBAPIError) -> JSONResponse:
        # The database is down, read-only or full: the service's trouble, said plainly; the
        # statement and its traceback go to the log only.
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else type(exc).__name__
        if isinstance(exc, OperationalError | InterfaceError):
            return store_away(request, reason)
        log.error("database error on %s %s: %s", request.method, request.url.path, exc)
        return JSONResponse(
            status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
            content={"detail": f"the database cannot answer now: {printable(reason)[:200]}"},
            headers={"Retry-After": str(RETRY_AFTER_SECS)},
        )

    @app.get("/healthz", response_model=HealthOut, operation_id="health", tags=["health"])
    def health(request: Request) -> HealthOut:
        runner: JobRunner | None = request.app.state.runner
        problems = runner.problems if runner is not None else []
        # The store itself, as requests see it: checked here too, so health is right with no
        # job running (the runner's heartbeat only sees its own writes).
        store_problem = request.app.state.store_health.problem()
        if store_problem is not None and not any(p.startswith("database") for p in problems):
            problems = [*problems, f"database: {store_problem}"]
        return HealthOut(
            status="degraded" if problems else "ok",
            problems=problems,
            version=tunehub.__version__,
            database=type(request.app.state.store).__name__,
            runner=runner is not None and runner.alive,
            workers=[w.device for w in runner.workers] if runner is not None else [],
        )

    app.include_router(jobs_router)
    app.include_router(schedules_router)
    app.include_router(targets_router)
    app.include_router(workers_router)
    app.include_router(models_router)
    app.include_router(operators_router)
    app.include_router(autotune_router)
    app.include_router(metrics_router)
    app.include_router(dashboard.router)
    dashboard.mount_static(app)
    dashboard.mount_api_docs(app)
    dashboard.install_not_found(app)
    # Outermost last: headers on every answer, then hosts, cached lookups, the keyless rate
    # limit, uncached plain lookups (answered without the route, before the layers that only
    # browsers' requests and bodies need), cross-site writes, CORS, bodies.
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes,
                       timeout_secs=settings.body_timeout_secs)  # fmt: skip
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=[API_KEY_HEADER, "Authorization", "Content-Type"],
        )
    app.add_middleware(CrossSiteCheck, cors_origins=settings.cors_origins)
    app.add_middleware(FastMiss, read_requires_key=settings.read_requires_key,
                       tune_unseen=settings.tune_unseen)  # fmt: skip
    app.add_middleware(KeylessRateLimit, per_sec=settings.keyless_requests_per_sec,
                       burst=settings.keyless_burst)  # fmt: skip
    # Cached single lookups are answered here: inside the host check and the headers.
    app.add_middleware(FastLookup, cache=lookup_cache, read_requires_key=settings.read_requires_key)
    app.add_middleware(HostCheck, allowed=settings.allowed_hosts)
    app.add_middleware(SecurityHeaders)
    return app
