"""Routes of the operators resource: what a workload may compute, each with its own fields."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from tunehub.core.operators import get_operator, operator_names
from tunehub.kernels.registry import TEMPLATES
from tunehub.service.auth import KeyedRoute, ReadAccess

router = APIRouter(
    prefix="/api/v1/operators",
    tags=["operators"],
    route_class=KeyedRoute,
    dependencies=[ReadAccess],
)


def operator_templates() -> dict[str, list[dict[str, Any]]]:
    """By operator: the templates that compute it (tunable and baselines, with their target
    kind). A template whose capabilities cannot be read is left out, not an error."""
    found: dict[str, list[dict[str, Any]]] = {}
    for name in TEMPLATES.names():
        try:
            template = TEMPLATES.get(name)
            ops = template.capabilities(_ANY_TARGET[template.device_kind]).ops
        except Exception:
            continue
        for op in ops:
            found.setdefault(op, []).append(
                {"name": name, "kind": template.device_kind, "baseline": template.baseline}
            )
    return found


def _any_targets() -> dict[str, Any]:
    from tunehub.core import Target

    return {
        "cpu": Target(kind="cpu", name="any", arch=(), cores=1),
        "cuda": Target(kind="cuda", name="any", arch=("sm_90",), cores=1, vendor="nvidia"),
    }


_ANY_TARGET = _any_targets()


@router.get("", operation_id="list_operators", summary="The operators workloads may name")
def list_operators() -> dict[str, Any]:
    """Every registered operator: its description, what its m, n, k mean, its own fields
    (name, type, default, limits: they go beside m, n, k in a workload and in a lookup's
    query), the epilogues it fuses, and the templates that compute it."""
    templates = operator_templates()
    items = []
    for name in operator_names():
        item = get_operator(name).to_dict()
        item["templates"] = templates.get(name, [])
        items.append(item)
    return {"items": items}
