"""API keys at the door: which scope each route needs, and checking the key a request sends.

A route says what it needs with a dependency (``ReadAccess``, ``WriteAccess``, ``AdminAccess``)
and the routers use ``KeyedRoute``, which checks the key before FastAPI reads and validates the
body: a write without a key is a 401 whatever its body holds. The key travels in the
``X-API-Key`` header (or ``Authorization: Bearer``), never in a cookie, so a page on another
site cannot write through a user's browser.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request, Response, Security, status
from fastapi.concurrency import run_in_threadpool
from fastapi.routing import APIRoute
from fastapi.security import APIKeyHeader

from tunehub.core import ApiKey, Scope
from tunehub.core.apikey import matches, parse_api_key
from tunehub.db.store import ScheduleStore

API_KEY_HEADER = "X-API-Key"
KEY_STATE = "tunehub.api_key"  # where a checked key is kept for the request's dependencies
_CREATE_HINT = "an operator makes one with `tunehub keys create --scope {scope}`"

api_key_header = APIKeyHeader(
    name=API_KEY_HEADER,
    auto_error=False,
    description="An API key (`tunehub keys create`); `Authorization: Bearer <key>` also works.",
)


def _unauthorized(detail: str) -> HTTPException:
    return HTTPException(
        status.HTTP_401_UNAUTHORIZED, detail=detail, headers={"WWW-Authenticate": "ApiKey"}
    )


def presented_key(request: Request) -> str | None:
    """The key a request carries, from ``X-API-Key`` or ``Authorization: Bearer``."""
    value = request.headers.get(API_KEY_HEADER)
    if value:
        return value.strip()
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return None


def check_key(store: ScheduleStore, token: str | None, needed: Scope, action: str) -> ApiKey:
    """The stored key ``token`` names, if it is active and has ``needed``; else 401 (none,
    malformed, unknown, revoked) or 403 (a narrower scope), each saying why."""
    if not token:
        raise _unauthorized(
            f"{action} needs an API key with scope {needed.value} in the {API_KEY_HEADER} "
            f"header; {_CREATE_HINT.format(scope=needed.value)}"
        )
    prefix = parse_api_key(token)
    if prefix is None:
        raise _unauthorized(
            f"the {API_KEY_HEADER} header does not hold a tunehub API key (th_<8 hex>_<43 "
            "characters>)"
        )
    key = store.get_api_key(prefix=prefix)
    if key is None or not matches(token, key.secret_hash):
        raise _unauthorized(f"unknown API key th_{prefix}")
    if not key.active:
        raise _unauthorized(f"API key {key.label} was revoked")
    if not key.scope.allows(needed):
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            detail=f"API key {key.label} has scope {key.scope.value}; {action} needs "
            f"{needed.value}",
        )
    return key


def authorize(request: Request, needed: Scope, action: str) -> ApiKey | None:
    """Check the request's key for ``needed`` once per request (the answer is kept). Reads
    need no key unless ``read_requires_key`` is set; then None is returned for open reads."""
    known = request.scope.get(KEY_STATE)
    if known is not None and known.scope.allows(needed):
        return known  # type: ignore[no-any-return]
    if needed is Scope.READ and not request.app.state.settings.read_requires_key:
        return None
    key = check_key(request.app.state.store, presented_key(request), needed, action)
    request.scope[KEY_STATE] = key
    return key


class KeyGuard:
    """The dependency naming the scope a route needs (and giving the route the key)."""

    def __init__(self, scope: Scope, action: str) -> None:
        self.scope = scope
        self.action = action

    def __call__(
        self,
        request: Request,
        _header: Annotated[str | None, Security(api_key_header)] = None,
    ) -> ApiKey | None:
        return authorize(request, self.scope, self.action)


class _ReadGuard(KeyGuard):
    # Reads are open by default: no security scheme in the OpenAPI document for them.
    # Async, so an open read (or one whose key KeyedRoute checked) takes no thread-pool hop.
    async def __call__(self, request: Request) -> ApiKey | None:  # type: ignore[override]
        if not request.app.state.settings.read_requires_key:
            return None
        known = request.scope.get(KEY_STATE)
        if known is not None and known.scope.allows(self.scope):
            return known  # type: ignore[no-any-return]
        return await run_in_threadpool(authorize, request, self.scope, self.action)


def needs_key(scope: Scope, action: str) -> Any:
    """A dependency (for ``Annotated[ApiKey, needs_key(...)]``) asking for a key of ``scope``
    to do ``action`` (said in the 401 and 403 answers, e.g. "submitting a job")."""
    return Depends(KeyGuard(scope, action))


# Every route of the API's routers: open unless ``read_requires_key`` is set.
ReadAccess = Depends(_ReadGuard(Scope.READ, "reading"))


class KeyedRoute(APIRoute):
    """An APIRoute that checks the key its guards ask for before the body is read."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        guards = [d.dependency for d in self.dependencies if isinstance(d.dependency, KeyGuard)]
        guards += [d.call for d in self.dependant.dependencies if isinstance(d.call, KeyGuard)]
        if not guards:
            return handler
        guard = max(guards, key=lambda g: g.scope.rank)

        async def guarded(request: Request) -> Response:
            open_read = (
                guard.scope is Scope.READ and not request.app.state.settings.read_requires_key
            )
            if not open_read:  # open reads (the compilers' lookups) skip the thread hop
                await run_in_threadpool(authorize, request, guard.scope, guard.action)
            return await handler(request)

        return guarded
