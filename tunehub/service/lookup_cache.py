"""The single lookup's fast path: answers cached in process as encoded bytes with their ETag,
served by an ASGI middleware before FastAPI routes, and forgotten when the store says a
schedule, a baseline, a confirmation, a model or an API key changed.

How fresh an answer is: every serving process (each worker of ``tunehub serve --workers N``,
each replica) reads ``ScheduleStore.lookup_changes`` every ``lookup_refresh_secs`` in a
thread of its own and forgets the answers it names, so an answer is at most about that long
(plus one read of the change feed) older than the database. If the reads stop (the database
is down), the cache stops answering after three periods and every lookup takes the full path
again. An answer computed while a change was being applied is not kept (a generation count
taken before the database is read).

What is cached: 200 answers of ``GET /api/v1/schedules/best``, keyed by the raw query string,
for requests without ``tune`` (which may queue a job) and without ``Origin`` (browsers get
the full path, with CORS); and, in the same entries, each item's answer of the batch lookup
``POST /api/v1/schedules/lookup`` without ``tune`` (keyed by workload, target and template
behind a NUL byte, which no query string holds; only the batch route reads them). Tuned
answers (``exact``, ``family``) are forgotten when their workload changes; untuned ones
(``predicted``, ``default``) when any schedule or model does (a prediction is checked against
the nearest tuned shapes). The same reads tell the process's ``NeighbourIndex`` (the tuned
sets those nearest shapes are found in) which workloads to read again, so a new or changed
schedule counts as a neighbour within about ``lookup_refresh_secs`` too. Where reads need a key, the
fast path serves a key the full path accepted since the API keys last changed.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import Any

from fastapi import Request, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tunehub.core import ApiKey
from tunehub.core.damped import DampedLog
from tunehub.db.store import ChangeMark, LookupChanges, ScheduleStore
from tunehub.service import metrics
from tunehub.service.auth import KEY_STATE
from tunehub.service.schemas import ScheduleOut

log = logging.getLogger(__name__)

LOOKUP_PATH = "/api/v1/schedules/best"
BATCH_PATH = "/api/v1/schedules/lookup"
# Where the lookup route leaves its answer's tier for the metrics (the request's scope).
SOURCE_STATE = "tunehub.source"
UNTUNED = ("predicted", "default")
# The cache answers only while its view of the store is this many refresh periods old at most.
STALE_PERIODS = 3.0


def etag_of(body: bytes) -> bytes:
    """A strong ETag for an answer's bytes (quoted, as the header carries it)."""
    return b'"' + hashlib.blake2b(body, digest_size=12).hexdigest().encode() + b'"'


def etag_matches(if_none_match: str | bytes | None, etag: bytes) -> bool:
    """Whether an ``If-None-Match`` header names ``etag`` (weak or strong, or ``*``).

    >>> etag_matches('W/"ab", "cd"', b'"cd"'), etag_matches('"ab"', b'"cd"')
    (True, False)
    """
    if not if_none_match:
        return False
    text = if_none_match.decode("latin-1") if isinstance(if_none_match, bytes) else if_none_match
    wanted = etag.decode("latin-1")
    for part in text.split(","):
        tag = part.strip()
        if tag == "*" or tag.removeprefix("W/") == wanted:
            return True
    return False


@dataclass(frozen=True, slots=True)
class CachedAnswer:
    """One encoded answer: the body, its ETag, its workload, whether it is untuned, and its
    tier (``source``: exact, family, predicted, default)."""

    body: bytes
    etag: bytes
    workload_key: str
    untuned: bool
    source: str = ""


class LookupCache:
    """Encoded lookup answers by raw query string, at most ``max_entries`` (least recently
    used go first), kept fresh by a thread reading the store's change feed every
    ``refresh_secs``. ``max_entries`` 0 turns it off (``get`` never answers)."""

    def __init__(self, *, max_entries: int, refresh_secs: float) -> None:
        self.max_entries = max_entries
        self.refresh_secs = refresh_secs
        self._lock = threading.Lock()
        self._entries: OrderedDict[bytes, CachedAnswer] = OrderedDict()
        # The queries of each cached workload (a dict of None, not a set: the collector does
        # not follow a dict of bytes); a workload goes when its last query does.
        self._by_workload: dict[str, dict[bytes, None]] = {}
        self._keys: dict[str, ApiKey] = {}  # tokens the full path accepted
        self._generation = 0
        self._fresh_at = 0.0  # monotonic time of the last successful read of the feed
        self._mark: ChangeMark | None = None
        self._store: ScheduleStore | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._on_models: list[Any] = []
        self._on_changes: list[Callable[[frozenset[str] | None], object]] = []
        self.hits = 0
        self.misses = 0
        self._feed_warning = DampedLog(log)

    # --- lifecycle -------------------------------------------------------------------------
    @property
    def enabled(self) -> bool:
        return self.max_entries > 0

    def start(
        self,
        store: ScheduleStore,
        *,
        on_models: Iterable[Any] = (),
        on_changes: Iterable[Callable[[frozenset[str] | None], object]] = (),
    ) -> None:
        """Read the feed's first mark and start the thread that follows it. ``on_models``:
        callables to call when models change (e.g. ``ModelCache.forget_latest``);
        ``on_changes``: callables given the workloads whose schedules may have changed (None:
        any), e.g. ``NeighbourIndex.forget``. With ``on_changes`` the feed is followed even
        when the answer cache is off."""
        self._store = store
        self._on_models = list(on_models)
        self._on_changes = list(on_changes)
        if not self.enabled and not self._on_changes:
            return
        self.refresh()
        self._stop.clear()
        self._thread = threading.Thread(target=self._follow, name="lookup-cache", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _follow(self) -> None:
        while not self._stop.wait(self.refresh_secs):
            try:
                self.refresh()
            except Exception as exc:  # the database is away: answers go stale, then unused
                # Said once, then counted: this repeats every period for the whole outage.
                self._feed_warning.warning("lookup cache: cannot read the change feed: %s", exc)
            else:
                self._feed_warning.clear("lookup cache: reading the change feed again")

    def refresh(self) -> LookupChanges | None:
        """Read the change feed once and forget what it names (the thread does this)."""
        if self._store is None:
            return None
        changes = self._store.lookup_changes(self._mark)
        with self._lock:
            seen = self._mark is not None
            if seen and changes.any:
                self._apply(changes)
            self._mark = changes.mark
            self._fresh_at = time.monotonic()
        if seen and (changes.workload_keys is None or changes.workload_keys):
            for forget_workloads in self._on_changes:
                forget_workloads(changes.workload_keys)
        if changes.models:
            for forget in self._on_models:
                forget()
        return changes

    def _apply(self, changes: LookupChanges) -> None:
        self._generation += 1
        if changes.api_keys:
            self._keys.clear()
        if changes.workload_keys is None:
            self._entries.clear()
            self._by_workload.clear()
            return
        doomed: set[bytes] = set()
        for key in changes.workload_keys:
            doomed.update(self._by_workload.pop(key, ()))
        if changes.workload_keys or changes.models:
            doomed |= {q for q, a in self._entries.items() if a.untuned}
        for query in doomed:
            answer = self._entries.pop(query, None)
            if answer is not None:
                self._unindex(answer.workload_key, query)

    # --- reads and writes ------------------------------------------------------------------
    @property
    def fresh(self) -> bool:
        return time.monotonic() - self._fresh_at <= STALE_PERIODS * self.refresh_secs

    @property
    def generation(self) -> int:
        """Taken before computing an answer, handed back to ``put``."""
        return self._generation

    def get(self, query: bytes) -> CachedAnswer | None:
        if not self.enabled or not self.fresh:
            return None
        with self._lock:
            answer = self._entries.get(query)
            if answer is not None:
                self._entries.move_to_end(query)
        return answer

    def get_many(self, queries: Sequence[bytes]) -> list[CachedAnswer | None]:
        """``get`` for each of ``queries``, under one hold of the lock (a batch lookup)."""
        if not self.enabled or not self.fresh:
            return [None] * len(queries)
        found: list[CachedAnswer | None] = []
        with self._lock:
            for query in queries:
                answer = self._entries.get(query)
                if answer is not None:
                    self._entries.move_to_end(query)
                found.append(answer)
        return found

    def put(
        self, query: bytes, answer: CachedAnswer, generation: int, *, api_key: str | None = None
    ) -> None:
        """Keep ``answer`` unless the feed changed something since ``generation``."""
        if not self.enabled:
            return
        with self._lock:
            if generation != self._generation:
                return
            if api_key is not None:
                self._keys[api_key] = _KEY_SEEN
            self._keep(query, answer)

    def put_many(self, answers: Iterable[tuple[bytes, CachedAnswer]], generation: int) -> None:
        """``put`` for each (query, answer), under one hold of the lock (a batch lookup)."""
        if not self.enabled:
            return
        with self._lock:
            if generation != self._generation:
                return
            for query, answer in answers:
                self._keep(query, answer)

    def _keep(self, query: bytes, answer: CachedAnswer) -> None:
        old = self._entries.pop(query, None)
        if old is not None:
            self._unindex(old.workload_key, query)
        self._entries[query] = answer
        self._by_workload.setdefault(answer.workload_key, {})[query] = None
        while len(self._entries) > self.max_entries:
            evicted_query, evicted = self._entries.popitem(last=False)
            self._unindex(evicted.workload_key, evicted_query)

    def _unindex(self, workload_key: str, query: bytes) -> None:
        queries = self._by_workload.get(workload_key)
        if queries is not None:
            queries.pop(query, None)
            if not queries:  # else every workload ever cached would stay, with no query
                del self._by_workload[workload_key]

    def key_known(self, token: str) -> bool:
        """Whether the full path accepted ``token`` for a read since keys last changed."""
        return token in self._keys

    def __len__(self) -> int:
        return len(self._entries)


_KEY_SEEN: Any = object()


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


def presented_token(scope: Scope) -> str | None:
    """The API key in ``X-API-Key`` or ``Authorization: Bearer`` (as auth.presented_key)."""
    value = _header(scope, b"x-api-key")
    if value and value.strip():
        return value.decode("latin-1").strip()
    scheme, _, token = (_header(scope, b"authorization") or b"").decode("latin-1").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return None


def answer_headers(answer: CachedAnswer) -> list[tuple[bytes, bytes]]:
    return [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(answer.body)).encode()),
        (b"etag", answer.etag),
    ]


def encoded_answer(
    request: Request, data: dict[str, Any], generation: int, *, cacheable: bool
) -> Response:
    """The lookup route's answer: ``data`` validated once against ScheduleOut and encoded
    once, with its ETag (304 when ``If-None-Match`` names it); kept in the process's cache
    when ``cacheable`` (an answer that queued a job is not)."""
    body = ScheduleOut.model_validate(data).model_dump_json().encode()
    answer = CachedAnswer(
        body=body,
        etag=etag_of(body),
        workload_key=str(data["workload_key"]),
        untuned=data["source"] in UNTUNED,
        source=str(data["source"]),
    )
    request.scope[SOURCE_STATE] = answer.source
    if cacheable:
        cache: LookupCache = request.app.state.lookup_cache
        key: ApiKey | None = request.scope.get(KEY_STATE)
        token = presented_token(request.scope) if key is not None else None
        cache.put(request.scope["query_string"], answer, generation, api_key=token)
    if etag_matches(request.headers.get("if-none-match"), answer.etag):
        return Response(status_code=304, headers={"etag": answer.etag.decode()})
    return Response(
        content=body, media_type="application/json", headers={"etag": answer.etag.decode()}
    )


class FastLookup:
    """Answers cached single lookups before FastAPI (no routing, dependencies, validation or
    thread-pool hop): the cached bytes, or 304 when ``If-None-Match`` names their ETag. Sits
    inside the host check and the security headers; every other request, and every miss,
    goes on to the app, whose lookup route fills the cache."""

    def __init__(self, app: ASGIApp, *, cache: LookupCache, read_requires_key: bool) -> None:
        self.app = app
        self.cache = cache
        self.read_requires_key = read_requires_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = perf_counter()
        if scope["path"] == BATCH_PATH and scope["method"] == "POST":
            try:
                await self.app(scope, receive, send)
            finally:
                metrics.batch_answered(started)
            return
        if scope["path"] != LOOKUP_PATH or scope["method"] != "GET":
            await self.app(scope, receive, send)
            return
        answer = None
        cacheable = b"tune" not in scope["query_string"]
        if cacheable:
            answer = self.cache.get(scope["query_string"])
        if answer is None or not self._plain(scope):
            if cacheable:
                self.cache.misses += 1
                metrics.lookup_missed()
            await self._full_path(scope, receive, send, started)
            return
        self.cache.hits += 1
        if etag_matches(_header(scope, b"if-none-match"), answer.etag):
            await send(
                {"type": "http.response.start", "status": 304, "headers": [(b"etag", answer.etag)]}
            )
            await send({"type": "http.response.body", "body": b""})
            metrics.lookup_answered(answer.source, 304, started, hit=True)
            return
        await send(
            {"type": "http.response.start", "status": 200, "headers": answer_headers(answer)}
        )
        await send({"type": "http.response.body", "body": answer.body})
        metrics.lookup_answered(answer.source, 200, started, hit=True)

    async def _full_path(self, scope: Scope, receive: Receive, send: Send, started: float) -> None:
        """The app answers; its status and the answer's tier are counted."""
        status = 500  # an exception that leaves here becomes a 500 further out

        async def sent(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sent)
        finally:
            tier = scope.get(SOURCE_STATE, "") if status < 400 else ""
            metrics.lookup_answered(tier, status, started, hit=False)

    def _plain(self, scope: Scope) -> bool:
        """No browser origin, no body, and (where reads need one) a key already accepted."""
        for key, value in scope["headers"]:
            if key == b"origin" or key == b"transfer-encoding":
                return False
            if key == b"content-length" and value.strip() != b"0":
                return False
        if self.read_requires_key:
            token = presented_token(scope)
            return token is not None and self.cache.key_known(token)
        return True
