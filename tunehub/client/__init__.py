"""Clients of the service: the HTTP client (compiler integrations land here)."""

from __future__ import annotations

from tunehub.client.http import TunehubClient, TunehubError

__all__ = ["TunehubClient", "TunehubError"]
