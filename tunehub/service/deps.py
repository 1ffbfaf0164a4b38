"""Request dependencies: the store and settings held by the app, as Annotated aliases.

The getters are ``async`` although they only read ``app.state``: FastAPI runs a plain
``def`` dependency in its thread pool, one hop per dependency, which cost a lookup about a
millisecond each on the 2-core VM."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Annotated

from fastapi import Depends, Request

from tunehub.core import LOCAL_CPU, InvalidSpec, Target, local_cpu_target
from tunehub.cost_model.registry import ModelCache
from tunehub.db.store import ScheduleStore
from tunehub.service.settings import Settings


async def get_store(request: Request) -> ScheduleStore:
    store: ScheduleStore = request.app.state.store
    return store


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def get_local_targets(request: Request) -> dict[str, Target]:
    targets: dict[str, Target] = getattr(request.app.state, "local_targets", {})
    return targets


async def get_models(request: Request) -> ModelCache:
    models: ModelCache = request.app.state.models
    return models


StoreDep = Annotated[ScheduleStore, Depends(get_store)]
ModelsDep = Annotated[ModelCache, Depends(get_models)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
LocalTargetsDep = Annotated[dict[str, Target], Depends(get_local_targets)]


def resolve_target(
    store: ScheduleStore,
    name: str,
    *,
    local: Mapping[str, Target] | None = None,
    field: str = "target",
) -> Target:
    """A target named by an alias of this service's own devices (``local-cpu``,
    ``local-cuda:0``) or by a stored target key."""
    if local and name in local:
        return local[name]
    if name == LOCAL_CPU:
        return local_cpu_target()  # stored once when the app starts
    target_or_none = store.get_target(name)
    if target_or_none is None:
        raise InvalidSpec(field, unknown_target_reason(name, local))
    return target_or_none


def resolve_targets(
    store: ScheduleStore, names: Collection[str], *, local: Mapping[str, Target] | None = None
) -> dict[str, Target]:
    """``resolve_target`` for many names at once (one store read for the stored keys); names
    that name no target are left out."""
    found: dict[str, Target] = {}
    stored: set[str] = set()
    for name in names:
        if local and name in local:
            found[name] = local[name]
        elif name == LOCAL_CPU:
            found[name] = local_cpu_target()
        else:
            stored.add(name)
    if stored:
        found.update(store.get_targets(stored))
    return found


def unknown_target_reason(name: str, local: Mapping[str, Target] | None = None) -> str:
    aliases = ", ".join(sorted({LOCAL_CPU, *(local or {})}))
    return f"unknown target {name!r}: use {aliases} or a stored target key"
