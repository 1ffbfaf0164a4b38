"""Request dependencies: the store and settings held by the app, as Annotated aliases."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from tunehub.core import LOCAL_CPU, InvalidSpec, Target, local_cpu_target
from tunehub.db.store import ScheduleStore
from tunehub.service.settings import Settings


def get_store(request: Request) -> ScheduleStore:
    store: ScheduleStore = request.app.state.store
    return store


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


StoreDep = Annotated[ScheduleStore, Depends(get_store)]
SettingsDep = Annotated[Settings, Depends(get_settings)]


def resolve_target(store: ScheduleStore, name: str, *, field: str = "target") -> Target:
    """``local-cpu`` → this machine's CPU; otherwise a stored target key."""
    if name == LOCAL_CPU:
        return local_cpu_target()  # stored once when the app starts
    target_or_none = store.get_target(name)
    if target_or_none is None:
        raise InvalidSpec(field, f"unknown target {name!r}: use 'local-cpu' or a stored target key")
    return target_or_none
