"""Clients of the service: the HTTP client, and the compilers' cached, deadline-bound lookups
(compiler integrations land here).

The names below load on first use, so that importing a compiler integration
(``tunehub.triton``, ``tunehub.client.gemm_choice``) costs no HTTP library: ``TunehubClient``
needs httpx, the lookups only the standard library.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tunehub.client.http import TunehubClient, TunehubError
    from tunehub.client.schedules import (
        ScheduleAnswer,
        ScheduleClient,
        best,
        best_many,
        default_client,
        set_default_client,
    )

_HOMES = {
    "TunehubClient": "tunehub.client.http",
    "TunehubError": "tunehub.client.http",
    "ScheduleAnswer": "tunehub.client.schedules",
    "ScheduleClient": "tunehub.client.schedules",
    "best": "tunehub.client.schedules",
    "best_many": "tunehub.client.schedules",
    "default_client": "tunehub.client.schedules",
    "set_default_client": "tunehub.client.schedules",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:  # a submodule not imported yet is found by the import system instead
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


__all__ = [
    "ScheduleAnswer",
    "ScheduleClient",
    "TunehubClient",
    "TunehubError",
    "best",
    "best_many",
    "default_client",
    "set_default_client",
]
