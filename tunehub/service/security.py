"""The service's edge, as ASGI middleware: allowed hosts, no cross-site writes, bounded request
bodies, and the headers every answer carries (framing and content-security on the dashboard).

Each answers before the routes run, so a refused request costs no database access and its body
is never parsed.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

# The dashboard loads only its own scripts and styles and talks only to its own API.
DASHBOARD_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
# /docs and /redoc load Swagger UI and ReDoc from this service (dashboard.mount_api_docs), with
# an inline script and styles: nothing from elsewhere, even if a page asked.
DOCS_CSP = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; font-src 'self' data:; connect-src 'self'; worker-src 'self' blob:; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
API_CSP = "default-src 'none'; frame-ancestors 'none'"
DOCS_PATHS = ("/docs", "/redoc")


async def _answer(
    send: Send,
    status: int,
    detail: str,
    *,
    close: bool = False,
    headers: Iterable[tuple[str, str]] = (),
) -> None:
    body = json.dumps({"detail": detail}).encode()
    raw = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *((k.encode(), v.encode()) for k, v in headers),
    ]
    if close:
        raw.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return str(value.decode("latin-1"))
    return None


def host_name(value: str) -> str:
    """The host of a Host header or URL authority, without port, lowercased (IPv6 unbracketed).

    >>> host_name("LocalHost:8000"), host_name("[::1]:8000"), host_name("127.0.0.1")
    ('localhost', '::1', '127.0.0.1')
    """
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:].partition("]")[0]
    if value.count(":") > 1:  # a bare IPv6 address
        return value
    return value.partition(":")[0]


class HostCheck:
    """Answers 400 to a request whose Host is not an allowed one (``*`` allows any): a page on
    another site that rebinds its DNS name to this address sends its own name as Host."""

    def __init__(self, app: ASGIApp, allowed: Iterable[str]) -> None:
        self.app = app
        self.allowed = {host_name(h) for h in allowed}
        self.any = "*" in self.allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or self.any:
            await self.app(scope, receive, send)
            return
        host = _header(scope, b"host") or ""
        if host_name(host) not in self.allowed:
            await _answer(
                send,
                400,
                f"host {host[:100]!r} is not served here; the service's operator can allow it "
                "with TUNEHUB_ALLOWED_HOSTS",
                close=True,
            )
            return
        await self.app(scope, receive, send)


class CrossSiteCheck:
    """Answers 403 to a write (any method but GET, HEAD, OPTIONS) that a browser sent from
    another site: its ``Origin`` names another host than the request's (and no configured CORS
    origin), or its ``Sec-Fetch-Site`` says ``cross-site``. API keys already keep such writes
    out (a form cannot send the key header); this refuses them even before the key is read."""

    def __init__(self, app: ASGIApp, cors_origins: Iterable[str] = ()) -> None:
        self.app = app
        self.cors = {o.rstrip("/").lower() for o in cors_origins}

    def _refusal(self, scope: Scope) -> str | None:
        origin = _header(scope, b"origin")
        if origin is not None:
            origin = origin.strip().rstrip("/").lower()
            if origin in self.cors:
                return None
            if origin == "null":
                return "a write from an opaque origin (a sandboxed page or a file) is refused"
            host = _header(scope, b"host") or ""
            if urlsplit(origin).netloc != host.strip().lower():
                return f"a write from another site ({origin[:100]}) is refused"
            return None
        if (_header(scope, b"sec-fetch-site") or "").lower() == "cross-site":
            return "a write from another site is refused"
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] not in SAFE_METHODS:
            reason = self._refusal(scope)
            if reason is not None:
                await _answer(send, 403, reason, close=True)
                return
        await self.app(scope, receive, send)


class BodyLimit:
    """Reads each request's body first, within ``max_bytes`` (413 above; a larger
    Content-Length is refused unread) and ``timeout_secs`` for the whole of it (408 after, and
    the connection is closed), then hands it to the app. A stalled client holds a connection
    for ``timeout_secs`` at most."""

    def __init__(self, app: ASGIApp, *, max_bytes: int, timeout_secs: float) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_secs = timeout_secs

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = _header(scope, b"content-length")
        if length is None and _header(scope, b"transfer-encoding") is None:
            # No body follows (HTTP/1.1 frames one with either header): nothing to bound,
            # and a GET skips the body read (10 us of asyncio.wait_for each).
            await self.app(scope, receive, send)
            return
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                await _answer(send, 400, "Content-Length is not a number", close=True)
                return
            if declared > self.max_bytes:
                await _answer(send, 413, self._too_large(), close=True)
                return
        chunks: list[bytes] = []
        size = 0
        deadline = time.monotonic() + self.timeout_secs
        while True:
            left = deadline - time.monotonic()
            try:
                message = await asyncio.wait_for(receive(), timeout=max(left, 0.0))
            except TimeoutError:
                await _answer(
                    send,
                    408,
                    f"the request body did not arrive within {self.timeout_secs:g}s",
                    close=True,
                )
                return
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await _answer(send, 413, self._too_large(), close=True)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    def _too_large(self) -> str:
        return f"the request body is larger than {self.max_bytes} bytes (TUNEHUB_MAX_BODY_BYTES)"


class KeylessRateLimit:
    """A token bucket per client address for API requests that carry no key (``X-API-Key``
    or ``Authorization``): ``per_sec`` a second on average, ``burst`` at once; beyond, 429
    with ``Retry-After``. Reads are open to anyone by default, and a keyless caller should
    not be able to hold the service; callers with a key are limited by their key's limits.
    ``per_sec`` 0: no limit. Cached single lookups are answered before this (they cost a
    dictionary read)."""

    MAX_CLIENTS = 10_000  # buckets kept; full ones are dropped first beyond it

    def __init__(self, app: ASGIApp, *, per_sec: float, burst: int) -> None:
        self.app = app
        self.per_sec = per_sec
        self.burst = max(1, burst)
        self._buckets: dict[str, tuple[float, float]] = {}  # address -> (tokens, when)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or self.per_sec <= 0
            or not scope.get("path", "").startswith("/api/")
            or _header(scope, b"x-api-key")
            or _header(scope, b"authorization")
        ):
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        address = str(client[0]) if client else "unknown"
        now = time.monotonic()
        tokens, when = self._buckets.get(address, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - when) * self.per_sec)
        if tokens < 1.0:
            self._buckets[address] = (tokens, now)
            retry = max(1, math.ceil((1.0 - tokens) / self.per_sec))
            await _answer(
                send,
                429,
                f"more than {self.per_sec:g} requests a second without an API key from "
                f"{address} (TUNEHUB_KEYLESS_REQUESTS_PER_SEC); retry after {retry} s, or send "
                "a key",
                headers=[("retry-after", str(retry))],
            )
            return
        self._buckets[address] = (tokens - 1.0, now)
        if len(self._buckets) > self.MAX_CLIENTS:
            self._prune(now)
        await self.app(scope, receive, send)

    def _prune(self, now: float) -> None:
        full = [
            a
            for a, (tokens, when) in self._buckets.items()
            if tokens + (now - when) * self.per_sec >= self.burst
        ]
        for address in full:
            del self._buckets[address]
        while len(self._buckets) > self.MAX_CLIENTS:  # all busy: the oldest go
            del self._buckets[next(iter(self._buckets))]


class SecurityHeaders:
    """Adds to every answer: no MIME sniffing, no referrer, no framing, and a content-security
    policy (the dashboard's strict one on its pages and files)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope.get("path", "")
        if path.startswith(DOCS_PATHS):
            csp = DOCS_CSP
        elif path.startswith(("/api/", "/healthz", "/openapi.json")):
            csp = API_CSP
        else:
            csp = DASHBOARD_CSP
        extra = [
            (b"x-content-type-options", b"nosniff"),
            (b"x-frame-options", b"DENY"),
            (b"referrer-policy", b"no-referrer"),
            (b"content-security-policy", csp.encode()),
        ]

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {k.lower() for k, _ in message.get("headers", ())}
                message["headers"] = [
                    *message.get("headers", ()),
                    *((k, v) for k, v in extra if k not in names),
                ]
            await send(message)

        await self.app(scope, receive, send_with_headers)
