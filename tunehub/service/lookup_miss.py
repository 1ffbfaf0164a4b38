"""The uncached single lookup's own path: a plain ``GET /api/v1/schedules/best`` answered from
a tuned schedule without FastAPI's routing, parameter validation and response model.

A fleet of compilers asks many shapes once each, so most of their lookups miss the cache
(``lookup_cache.FastLookup``) and used to take the whole route: FastAPI matching the path,
resolving the router's dependencies, validating a dozen query parameters through pydantic,
then validating the answer against ``ScheduleOut`` and encoding it. Here a request that asks
only for the lookup's usual parameters, spelled plainly (no percent-encoding, no repeated
name, no key, no body, no ``tune``), is parsed by hand to the same ``Workload``, looked up
on the event loop where the store can (PostgreSQL: ``family_lookup_async``, no thread; see
``tunehub.db.async_lookup``), else with ``find_schedule`` in the thread pool (one database
read), and answered with the bytes
``ScheduleOut.model_dump_json`` would write (``batch_lookup.encode_schedule``; the tests hold
both paths to the same answer), then kept in the lookup cache as the route would keep it.

Everything else goes on to the app unchanged, and so does every request this path cannot
answer: an untuned shape (the ``predicted`` and ``default`` tiers, a 404), a value it does not
take as it is (the route then answers its 422), and any failure, the database's included
(the route reads again, and answers 503 with ``Retry-After`` through the app's one error
mapping). It sits inside the host check, the lookup cache and the keyless rate limit (which
apply as to the route), and outside the layers that only a browser's request or a body needs
(cross-site checks, CORS, the body limit) and Starlette's own, whose wrapping of every
response was a tenth of an uncached answer's CPU time in a profile.
"""

from __future__ import annotations

import logging
import re
from typing import Any, get_args

import anyio.to_thread
from starlette.types import ASGIApp, Receive, Scope, Send

from tunehub.core import LOCAL_CPU, Target, Workload, local_cpu_target
from tunehub.core.workload import MAX_DIM
from tunehub.db.store import ScheduleStore
from tunehub.service.batch_lookup import encode_schedule, schedule_data
from tunehub.service.deps import resolve_target
from tunehub.service.lookup_cache import (
    LOOKUP_PATH,
    SOURCE_STATE,
    CachedAnswer,
    LookupCache,
    etag_matches,
    etag_of,
)
from tunehub.service.schemas import NAME_PATTERN, Dtype, Epilogue, Layout
from tunehub.tuner.lookup import LookupAnswer, answer_from, find_schedule

log = logging.getLogger(__name__)

_DIMS = ("m", "n", "k")
_CHOICES: dict[str, frozenset[str]] = {
    "dtype": frozenset(get_args(Dtype)),
    "a_layout": frozenset(get_args(Layout)),
    "b_layout": frozenset(get_args(Layout)),
    "epilogue": frozenset(get_args(Epilogue)),
}
_NAMES = frozenset((*_DIMS, *_CHOICES, "op", "allow_tf32", "target", "template"))
_DIM = re.compile(r"[1-9][0-9]{0,5}")
_NAME = re.compile(NAME_PATTERN)
# The spellings of a boolean taken here; FastAPI's others (1, yes, on, ...) take the route.
_BOOLS = {"true": True, "false": False}
# Characters that a query string's value may hold only encoded, or that decoding changes.
_ENCODED = re.compile(r"[%+]")


def plain_query(query_string: bytes) -> tuple[Workload, str, str | None] | None:
    """The workload, target name and template of a plain lookup's query string, or None
    where the route must judge it (anything unusual, invalid or beyond the matmul fields)."""
    try:
        text = query_string.decode("ascii")
    except UnicodeDecodeError:
        return None
    if _ENCODED.search(text):
        return None
    values: dict[str, str] = {}
    for part in text.split("&"):
        name, sep, value = part.partition("=")
        if not sep or name not in _NAMES or name in values:
            return None
        values[name] = value
    if values.get("op", "matmul") != "matmul":
        return None  # another operator's fields and derived dimensions: the route's
    dims = []
    for name in _DIMS:
        raw = values.get(name)
        if raw is None or not _DIM.fullmatch(raw) or int(raw) > MAX_DIM:
            return None
        dims.append(int(raw))
    for name, allowed in _CHOICES.items():
        if values.get(name, next(iter(allowed))) not in allowed:
            return None
    tf32 = _BOOLS.get(values.get("allow_tf32", "false"))
    target = values.get("target", LOCAL_CPU)
    template = values.get("template")
    if tf32 is None or not _name(target) or (template is not None and not _name(template)):
        return None
    try:
        workload = Workload(
            op="matmul",
            m=dims[0],
            n=dims[1],
            k=dims[2],
            dtype=values.get("dtype", "float32"),
            a_layout=values.get("a_layout", "row_major"),
            b_layout=values.get("b_layout", "row_major"),
            epilogue=values.get("epilogue", "none"),
            allow_tf32=tf32,
        )
    except Exception:  # the route says why (InvalidSpec as a 422)
        return None
    return workload, target, template


def _name(value: str) -> bool:
    return 1 <= len(value) <= 64 and _NAME.match(value) is not None


class FastMiss:
    """Answers plain single lookups the cache missed when a tuned schedule answers them
    (see the module docstring); passes everything else to the app."""

    def __init__(self, app: ASGIApp, *, read_requires_key: bool, tune_unseen: bool) -> None:
        self.app = app
        # Where a read needs a key, or every lookup may queue a job: the route's, always.
        self.enabled = not (read_requires_key or tune_unseen)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            not self.enabled
            or scope["type"] != "http"
            or scope["path"] != LOOKUP_PATH
            or scope["method"] != "GET"
            or not _plain(scope)
        ):
            await self.app(scope, receive, send)
            return
        parsed = plain_query(scope["query_string"])
        if parsed is None:
            await self.app(scope, receive, send)
            return
        state = scope["app"].state
        cache: LookupCache = state.lookup_cache
        # Taken before the database is read: an answer computed across a change is not kept.
        generation = cache.generation
        store: ScheduleStore = state.store
        local: dict[str, Target] = getattr(state, "local_targets", {})
        try:
            answer = await _look_up_here(store, local, *parsed)
            if answer is None:
                answer = await anyio.to_thread.run_sync(_look_up, store, local, *parsed)
        except Exception as exc:  # the route reads again and answers (503 from one place)
            log.debug("the fast lookup path failed, the route answers: %s", exc)
            answer = None
        if answer is None:
            await self.app(scope, receive, send)
            return
        scope[SOURCE_STATE] = answer.source
        cache.put(scope["query_string"], answer, generation, api_key=None)
        if etag_matches(_header(scope, b"if-none-match"), answer.etag):
            start: dict[str, Any] = {"status": 304, "headers": [(b"etag", answer.etag)]}
            body = b""
        else:
            start = {
                "status": 200,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(answer.body)).encode()),
                    (b"etag", answer.etag),
                ],
            }
            body = answer.body
        await send({"type": "http.response.start", **start})
        await send({"type": "http.response.body", "body": body})


async def _look_up_here(
    store: ScheduleStore,
    local: dict[str, Target],
    workload: Workload,
    target_name: str,
    template: str | None,
) -> CachedAnswer | None:
    """``_look_up`` on the event loop, where the store reads without a thread
    (``family_lookup_async``: PostgreSQL) and the target is this service's own; None where
    it cannot (then a pool thread reads) or nothing tuned answers."""
    target = local.get(target_name)
    if target is None and target_name == LOCAL_CPU:
        target = local_cpu_target()
    if target is None:
        return None  # a stored target key: read from the store, on a thread
    schedules = await store.family_lookup_async(
        workload_key=workload.key, family_key=target.family_key, template=template
    )
    if schedules is None:
        return None
    found = answer_from(schedules, (), workload, target, template=template)
    return None if found is None else _encoded(found, workload)


def _look_up(
    store: ScheduleStore,
    local: dict[str, Target],
    workload: Workload,
    target_name: str,
    template: str | None,
) -> CachedAnswer | None:
    """The encoded answer of a tuned tier (``exact``, ``family``), or None (untuned: the
    route's tiers)."""
    try:
        target = resolve_target(store, target_name, local=local)
    except Exception:
        return None  # an unknown target: the route's 422 (a store failure: its 503)
    found = find_schedule(store, workload, target, template=template)
    return None if found is None else _encoded(found, workload)


def _encoded(found: LookupAnswer, workload: Workload) -> CachedAnswer:
    body = encode_schedule(schedule_data(found))
    return CachedAnswer(
        body=body,
        etag=etag_of(body),
        workload_key=workload.key,
        untuned=False,
        source=found.source,
    )


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


def _plain(scope: Scope) -> bool:
    """No key (the route checks keys), no browser origin (CORS) and no body."""
    for key, value in scope["headers"]:
        if key in (b"x-api-key", b"authorization", b"origin", b"transfer-encoding"):
            return False
        if key == b"content-length" and value.strip() != b"0":
            return False
    return True
