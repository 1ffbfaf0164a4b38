"""Routes of the targets resource: the devices tunehub knows, and their live workers."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, status

from tunehub.core import Target, utc_now
from tunehub.core.job import DEFAULT_STRATEGY
from tunehub.core.worker import LIVE_SECS
from tunehub.kernels.registry import TEMPLATES
from tunehub.service.auth import KeyedRoute, ReadAccess
from tunehub.service.deps import LocalTargetsDep, StoreDep
from tunehub.service.schemas import NAME_PATTERN, TargetListOut, TargetOut, TemplateOptionsOut
from tunehub.tuner import strategy_names

router = APIRouter(
    prefix="/api/v1/targets", tags=["targets"], route_class=KeyedRoute, dependencies=[ReadAccess]
)

TargetKey = Annotated[
    str,
    Path(min_length=1, max_length=64, pattern=NAME_PATTERN, description="Target key or alias."),
]


def template_options(target: Target) -> list[TemplateOptionsOut]:
    """The tunable templates of ``target``'s kind and what each runs on it. A template whose
    capabilities cannot be read (a plugin that fails to load) is left out, not an error."""
    found = []
    for name in TEMPLATES.names():
        try:
            template = TEMPLATES.get(name)
            if template.baseline or template.device_kind != target.kind:
                continue
            caps = template.capabilities(target)
        except Exception:
            continue
        found.append(
            TemplateOptionsOut(
                name=template.name,
                version=template.version,
                ops=list(caps.ops),
                dtypes=list(caps.dtypes),
                epilogues=list(caps.epilogues),
                a_layouts=list(caps.a_layouts),
                b_layouts=list(caps.b_layouts),
                allow_tf32=caps.tf32,
            )
        )
    return found


@router.get("", response_model=TargetListOut, operation_id="list_targets", summary="List targets")
def list_targets(store: StoreDep, local: LocalTargetsDep) -> TargetListOut:
    """Every stored target with its live workers (those that reported in the last 30 s), live
    targets first, each with the templates a job on it may name and what they run there; and
    the search strategies. A job may name any target; one with no live worker waits in the
    queue."""
    now = utc_now()
    since = now - timedelta(seconds=LIVE_SECS)
    workers = [w for w in store.list_workers(live_since=since) if w.live(now)]  # not lost
    items = []
    for target in store.list_targets():
        mine = [w for w in workers if w.target_key == target.target_key]
        aliases = sorted(a for a, t in local.items() if t.target_key == target.target_key)
        items.append(TargetOut.from_core(target, mine, aliases, template_options(target)))
    items.sort(key=lambda t: not t.live)
    return TargetListOut(
        items=items, strategies=list(strategy_names()), default_strategy=DEFAULT_STRATEGY
    )


@router.get(
    "/{target_key}", response_model=TargetOut, operation_id="get_target", summary="Show a target"
)
def get_target(target_key: TargetKey, store: StoreDep, local: LocalTargetsDep) -> TargetOut:
    target = local.get(target_key) or store.get_target(target_key)
    if target is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no target {target_key!r}")
    now = utc_now()
    since = now - timedelta(seconds=LIVE_SECS)
    found = store.list_workers(target_key=target.target_key, live_since=since)
    workers = [w for w in found if w.live(now)]  # a Ray worker marked lost is not
    aliases = sorted(a for a, t in local.items() if t.target_key == target.target_key)
    return TargetOut.from_core(target, workers, aliases, template_options(target))
