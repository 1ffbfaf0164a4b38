"""Routes of the shared autotuning results: what ``tunehub.triton.autotune`` stores and fetches
by cache key, so a kernel is tuned once per target across the fleet."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Response, status

from tunehub.core import ApiKey, AutotuneResult, InvalidSpec, Scope, utc_now
from tunehub.core.autotune import CACHE_KEY_PATTERN
from tunehub.service.auth import KeyedRoute, ReadAccess, needs_key
from tunehub.service.deps import StoreDep
from tunehub.service.schemas_autotune import AutotuneOut, AutotuneRequest

router = APIRouter(
    prefix="/api/v1/autotune",
    tags=["autotune"],
    route_class=KeyedRoute,
    dependencies=[ReadAccess],
)

CacheKey = Annotated[
    str,
    Path(
        pattern=CACHE_KEY_PATTERN,
        description="sha256 (64 lowercase hex digits) of the result's key document.",
    ),
]
UploadKey = Annotated[ApiKey, needs_key(Scope.WRITE, "uploading autotune results")]


@router.get(
    "/{cache_key}",
    response_model=AutotuneOut,
    operation_id="get_autotune",
    summary="A shared autotuning result",
    responses={404: {"description": "Nobody uploaded a result under this key."}},
)
def get_autotune(store: StoreDep, cache_key: CacheKey) -> dict[str, Any]:
    found = store.get_autotune(cache_key)
    if found is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no autotune result {cache_key}")
    return found.to_dict()


@router.put(
    "/{cache_key}",
    response_model=AutotuneOut,
    operation_id="put_autotune",
    summary="Share an autotuning result",
    status_code=status.HTTP_201_CREATED,
    responses={200: {"description": "A result was stored under this key already: it stays."}},
)
def put_autotune(
    store: StoreDep, key: UploadKey, cache_key: CacheKey, body: AutotuneRequest, response: Response
) -> dict[str, Any]:
    """Stores the result unless one is stored under this key (then answers it, 200): the
    first upload stays, so every process of the fleet runs the same config. The key document
    must hash to ``cache_key``."""
    try:
        result = AutotuneResult(
            cache_key=cache_key,
            key_doc=body.key_doc,
            best_index=body.best_index,
            timings_ms=tuple(tuple(t) if t is not None else None for t in body.timings_ms),
            created_at=utc_now(),
            api_key_id=key.id,
        )
    except InvalidSpec as exc:
        raise InvalidSpec(exc.field, exc.reason) from None
    stored, created = store.put_autotune(result)
    if not created:
        response.status_code = status.HTTP_200_OK
    return stored.to_dict()
