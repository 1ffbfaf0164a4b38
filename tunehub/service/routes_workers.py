"""Routes of the workers resource: every worker the store knows, with its live state."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Query

from tunehub.core import Worker, utc_now
from tunehub.service.auth import KeyedRoute, ReadAccess
from tunehub.service.deps import StoreDep
from tunehub.service.schemas import NAME_PATTERN, WorkerStateListOut

# A worker silent for this long is dropped from the list (its row stays in the store): an hour
# of `lost` is enough to notice a dead machine, and a cluster whose workers come and go (Ray
# restarts actors with new ids) would otherwise list its history forever.
FORGET_SECS = 3600.0
LIVE_STATES = ("idle", "building", "timing")

router = APIRouter(
    prefix="/api/v1/workers", tags=["workers"], route_class=KeyedRoute, dependencies=[ReadAccess]
)


def worker_state(
    worker: Worker, target_label: str, target_name: str, now: datetime
) -> dict[str, Any]:
    """A worker's row of the list: its record and the live keys of ``Worker.info`` (the
    registrar's ``state``, ``job_id``, ``config``, ``node``, ``device_name``), ``lost`` when
    its heartbeat is older than the live window, or when the service saw its Ray actor die
    (``lost_reason`` then says why)."""
    info = worker.info
    live = worker.live(now)
    why = info.get("lost")
    state = info.get("state") if info.get("state") in LIVE_STATES else "idle"
    job_id = info.get("job_id") if isinstance(info.get("job_id"), int) else None
    config = info.get("config") if isinstance(info.get("config"), dict) else None
    return {
        "worker_id": worker.worker_id,
        "kind": worker.kind,
        "target_key": worker.target_key,
        "target_label": str(info.get("label") or target_label),
        "host": worker.host,
        "node": str(info.get("node") or worker.host),
        "device": worker.device,
        "device_name": str(info.get("device_name") or target_name),
        "state": state if live else "lost",
        "lost_reason": str(why)[:300] if why and not live else None,
        "job_id": job_id if live else None,
        "config": config if live else None,
        "heartbeat_at": worker.heartbeat_at,
        "started_at": worker.started_at,
        "live": live,
    }


@router.get(
    "",
    response_model=WorkerStateListOut,
    operation_id="list_workers",
    summary="List workers and their live state",
)
def list_workers(
    store: StoreDep,
    target: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=64,
            pattern=NAME_PATTERN,
            description="Only the workers of this target key.",
        ),
    ] = None,
) -> dict[str, Any]:
    """Every worker that reported in the last hour, local and on Ray nodes, oldest first:
    its target, host or Ray node, device, state (`idle`, `building`, `timing`, or `lost`
    once its heartbeat is older than 30 s, or at once when the service saw its Ray actor die,
    with `lost_reason`), last heartbeat, and the job and config it is on. Workers silent for
    over an hour are left out."""
    now = utc_now()
    targets = {t.target_key: t for t in store.list_targets()}
    since = now - timedelta(seconds=FORGET_SECS)
    workers = []
    for worker in store.list_workers(target_key=target, live_since=since):
        found = targets.get(worker.target_key)
        label, name = (found.label, found.name) if found else (worker.target_key[:12], "")
        workers.append(worker_state(worker, label, name, now))
    return {"workers": workers}
