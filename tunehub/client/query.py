"""How a workload field travels in a query string; no HTTP library needed (the lookup path of
``tunehub.triton`` runs where httpx is not installed)."""

from __future__ import annotations

from typing import Any


def query_value(value: Any) -> Any:
    """A workload field as a query parameter: ``true``/``false``, ``3,0,5`` for a list
    (grouped_mm's ``group_sizes``)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    return value
