"""Route of the metrics resource: ``GET /metrics`` in Prometheus' text format."""

from __future__ import annotations

import threading
from typing import Any

from fastapi import APIRouter, Request, Response

from tunehub.db.journal import ResultJournal
from tunehub.service.auth import KeyedRoute, ReadAccess
from tunehub.service.metrics import CONTENT_TYPE, ServiceCollector, exposition

router = APIRouter(tags=["metrics"], route_class=KeyedRoute, dependencies=[ReadAccess])
_made = threading.Lock()


def collector(request: Request) -> ServiceCollector:
    """The app's scrape-time collector, made at its first scrape."""
    state = request.app.state
    with _made:
        found: ServiceCollector | None = getattr(state, "metrics_collector", None)
        if found is None:
            found = state.metrics_collector = ServiceCollector(
                state.store,
                state.store_health,
                cache_secs=state.settings.metrics_cache_secs,
                journal=lambda: journal_of(state),
            )
        return found


def journal_of(state: Any) -> ResultJournal | None:
    """The result journal of the app's job runner; in a process without one (the others of
    `serve --workers N`), the same file read afresh; None where there is no journal."""
    journal: ResultJournal | None = getattr(getattr(state, "runner", None), "journal", None)
    if journal is not None:
        return journal
    settings = state.settings
    if not settings.journal_max_bytes:
        return None
    return ResultJournal.in_home(settings.home, max_bytes=settings.journal_max_bytes)


@router.get(
    "/metrics",
    operation_id="metrics",
    summary="Metrics in Prometheus' text format",
    response_class=Response,
    responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format."}},
)
def metrics(request: Request) -> Response:
    """Lookups by route, tier and status with their latency, the lookup cache's hits and
    misses, trials and records by target and status, jobs by state and per API key, workers
    by state, the database's errors and outage, the result journal's size: every process of
    `tunehub serve --workers N` counted together (docs/configuration.md lists them). Needs a
    key where reads do (`TUNEHUB_READ_REQUIRES_KEY`)."""
    return Response(content=exposition(collector(request)), headers={"content-type": CONTENT_TYPE})
