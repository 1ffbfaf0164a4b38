"""Clients of the service: the HTTP client, and the compilers' cached, deadline-bound lookups
(compiler integrations land here)."""

from __future__ import annotations

from tunehub.client.http import TunehubClient, TunehubError
from tunehub.client.schedules import (
    ScheduleAnswer,
    ScheduleClient,
    best,
    best_many,
    default_client,
    set_default_client,
)

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
