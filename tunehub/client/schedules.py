"""ScheduleClient: deadline-bound, cached schedule lookups for compilers, which never raise.

A compiler asks ``best(workload, target=...)`` for every GEMM it compiles. The answer comes
from memory (a dictionary read), else the disk cache shared by the user's processes, else the
service, within a hard deadline (default 50 ms) measured on the wall clock from the call: the
request runs on a background thread and the caller stops waiting at the deadline, so a DNS or
connect stall, a slow or dead service cannot hold a compile longer. When the service cannot
answer in time the caller gets the cached answer (flagged ``stale``) or the template's default
config (``source`` "default", ``fallback`` true, with the reason), and the service is left
alone for a while (backoff) so later calls do not wait at all.

The first call of a process is bound by the same deadline: the client is cheap to make (the
standard library's ``http.client``, which torch has imported already; no TLS set-up for an
``http`` URL; no connection until a request), and the templates the default tier needs (a few
hundred ms of imports) load on a background thread, started by ``warm_up`` (the compiler
integrations call it when imported) or by the first client. A fallback that comes before they
have loaded answers with no config (``use_library``), says so in ``reason``, and is not
cached: the next call computes the default.

>>> client = ScheduleClient("http://127.0.0.1:8000")  # doctest: +SKIP
>>> answer = client.best({"m": 4096, "n": 4096, "k": 4096, "dtype": "float16"},
...                      target="local-cuda:0")  # doctest: +SKIP
>>> answer.use_library, answer.config  # doctest: +SKIP
(False, {'BLOCK_M': 128, 'BLOCK_N': 256, ...})
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import http.client
import json
import logging
import os
import threading
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunehub.client.cache import CachedLookup, DiskCache, default_cache_dir
from tunehub.client.query import query_value

log = logging.getLogger(__name__)

URL_ENV = "TUNEHUB_URL"
API_KEY_ENV = "TUNEHUB_API_KEY"
DEADLINE_ENV = "TUNEHUB_CLIENT_DEADLINE_SECS"
TTL_ENV = "TUNEHUB_CLIENT_TTL_SECS"
OFFLINE_ENV = "TUNEHUB_OFFLINE"
DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_DEADLINE_SECS = 0.05
# How long an answer is used without asking the service again; after it, the next lookup
# revalidates it (If-None-Match: a 304 costs the service almost nothing).
DEFAULT_TTL_SECS = 300.0
# After the service failed to answer in time, leave it alone this long (doubling on each
# failure up to the maximum): calls meanwhile answer from the cache or the default at once.
BACKOFF_SECS = 0.5
MAX_BACKOFF_SECS = 30.0
MAX_BATCH = 1000  # the service's limit per batch lookup
MAX_MEMORY_ENTRIES = 100_000
LOCAL_CPU = "local-cpu"
# An idle keep-alive connection older than this is not reused: uvicorn closes its side after 5 s,
# and a request on a closed connection costs a failed round trip before the retry.
IDLE_SECS = 4.0

# A workload's fields and defaults, as the API spells them (the key of every cache).
WORKLOAD_FIELDS: tuple[tuple[str, Any], ...] = (
    ("op", "matmul"),
    ("m", None),
    ("n", None),
    ("k", None),
    ("dtype", "float32"),
    ("a_layout", "row_major"),
    ("b_layout", "row_major"),
    ("epilogue", "none"),
    ("allow_tf32", False),
)


def workload_fields(workload: tuple[Any, ...]) -> dict[str, Any]:
    """A ``workload_tuple`` as the API's workload fields: the common ones, then the
    operator's own (``batch`` for bmm)."""
    *common, own = workload
    fields = {name: v for (name, _), v in zip(WORKLOAD_FIELDS, common, strict=True)}
    fields.update(own)
    return fields


@dataclass(frozen=True)
class ScheduleAnswer:
    """What a compiler gets for one workload; never raised, always returned.

    ``config`` is the kernel's knobs (None when no tunehub template runs the workload: then
    ``use_library`` is true). ``source``: ``exact``, ``family``, ``predicted``, ``default`` or
    ``unsupported``. ``use_library``: the vendor library is faster than this schedule (or
    tunehub has no kernel for it): call the library instead. ``fallback``: the service did not
    answer this call (``reason`` says why): the answer is a cached one (``stale`` true when
    past its freshness) or the template's default. ``schedule``: the service's whole answer
    (as ``GET /api/v1/schedules/best`` gives it), when there is one.
    """

    config: dict[str, Any] | None
    template: str | None
    source: str
    use_library: bool
    workload: tuple[Any, ...]
    target: str
    fallback: bool = False
    stale: bool = False
    reason: str = ""
    speedup_vs_baseline: float | None = None
    tuning_job_id: int | None = None
    schedule: Mapping[str, Any] | None = None


@dataclass
class _Entry:
    answer: ScheduleAnswer
    cached: CachedLookup
    fresh_until: float  # time.monotonic()


class ScheduleClient:
    """Cached, deadline-bound lookups against one tunehub service (thread-safe).

    ``base_url`` None or empty, or ``offline=True``: the service is never asked; answers come
    from the disk cache (of ``base_url``'s service: cached answers are per service, whose
    ``local-cpu`` is its own machine) and defaults only.
    ``deadline_secs`` bounds every call on the wall clock (the request, its DNS and connect
    included); ``ttl_secs`` is how long an answer is used before it is revalidated;
    ``cache_dir`` None: the user's cache directory (``$TUNEHUB_CACHE_DIR`` overrides it);
    ``disk=False`` keeps the cache in memory only.
    """

    def __init__(
        self,
        base_url: str | None = DEFAULT_URL,
        *,
        api_key: str | None = None,
        deadline_secs: float = DEFAULT_DEADLINE_SECS,
        ttl_secs: float = DEFAULT_TTL_SECS,
        cache_dir: Path | str | None = None,
        disk: bool = True,
        offline: bool = False,
    ) -> None:
        self.base_url = (base_url or "").rstrip("/") or None
        self.deadline_secs = deadline_secs
        self.ttl_secs = ttl_secs
        headers = {"X-API-Key": api_key} if api_key else {}
        self._http: _Connections | None = None
        if self.base_url is not None and not offline:
            self._http = _Connections(self.base_url, headers)
        root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self._disk = DiskCache(root, self.base_url or "offline") if disk else None
        self._memory: dict[tuple[Any, ...], _Entry] = {}
        self._defaults: dict[tuple[Any, ...], ScheduleAnswer] = {}
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=4, thread_name_prefix="tunehub-lookup"
        )
        self._lock = threading.Lock()
        self._inflight: dict[tuple[Any, ...], concurrent.futures.Future[Any]] = {}
        self._down_until = 0.0
        self._backoff = 0.0
        self._last_error = ""
        # The default tier imports the templates (a few hundred ms once): on a thread from the
        # first fallback (``templates_ready``), off the caller's path; or ahead of it where an
        # integration asks (``load_templates``). Not here: a process whose lookups all find
        # answers (a compile) would pay for them beside its work.

    # --- public API ------------------------------------------------------------------------
    def best(
        self,
        workload: Any,
        *,
        target: str = LOCAL_CPU,
        template: str | None = None,
        tune: bool = False,
        deadline_secs: float | None = None,
    ) -> ScheduleAnswer:
        """The best known schedule for ``workload`` (a Workload or a mapping of its fields:
        ``m``, ``n``, ``k``, ``dtype``, …) on ``target``; never raises, never takes longer
        than the deadline (``deadline_secs``, else the client's)."""
        try:
            key = (workload_tuple(workload), target, template)
            entry = self._memory.get(key)
            now = time.monotonic()
            if entry is not None and entry.fresh_until > now:
                return entry.answer
            budget = self.deadline_secs if deadline_secs is None else deadline_secs
            return self._lookup(key, entry, tune, now + budget)
        except Exception as exc:  # never into the compiler
            log.exception("tunehub lookup failed")
            return _broken(workload, target, template, f"client error: {exc!r}")

    def best_many(
        self,
        items: Sequence[Any],
        *,
        target: str = LOCAL_CPU,
        template: str | None = None,
        tune: bool = False,
        deadline_secs: float | None = None,
    ) -> list[ScheduleAnswer]:
        """``best`` for many workloads at once, in order: cached ones from the cache, the rest
        in one batch lookup (``POST /api/v1/schedules/lookup``) within one deadline. An item
        is a workload, or a mapping ``{"workload": …, "target": …, "template": …}``."""
        try:
            budget = self.deadline_secs if deadline_secs is None else deadline_secs
            return self._best_many(items, target, template, tune, time.monotonic() + budget)
        except Exception as exc:
            log.exception("tunehub batch lookup failed")
            return [_broken(item, target, template, f"client error: {exc!r}") for item in items]

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._http is not None:
            self._http.close()

    def connect_ahead(self) -> None:
        """Open a connection to the service now, for the first lookup to reuse (``warm_up``
        calls it on a thread of its own); takes up to about twice the deadline, never raises:
        a failure is left for that lookup to meet."""
        if self._http is not None:
            self._http.connect_ahead(_http_timeout(self.deadline_secs))

    def __enter__(self) -> ScheduleClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- one lookup ------------------------------------------------------------------------
    def _lookup(
        self, key: tuple[Any, ...], entry: _Entry | None, tune: bool, deadline_at: float
    ) -> ScheduleAnswer:
        if entry is None:
            entry = self._from_disk(key)
            if entry is not None and entry.fresh_until > time.monotonic():
                return entry.answer
        down = self._down_reason(time.monotonic())
        if down is not None:
            return self._fallback(key, entry, down, deadline_at)
        etag = entry.cached.etag if entry is not None else None
        budget = deadline_at - time.monotonic()
        try:
            future = self._submit(key, lambda: self._get(key, etag, tune, _http_timeout(budget)))
            status_code, body, new_etag = future.result(timeout=max(budget, 0.0))
        except concurrent.futures.TimeoutError:
            reason = self._failed("no answer within the deadline")
            return self._fallback(key, entry, reason, deadline_at)
        except Exception as exc:  # OSError, http.client's errors, anything else on the way
            reason = self._failed(f"{type(exc).__name__}: {exc}")
            return self._fallback(key, entry, reason, deadline_at)
        return self._answered(key, entry, status_code, body, new_etag, deadline_at)

    def _get(
        self, key: tuple[Any, ...], etag: str | None, tune: bool, timeout: float
    ) -> tuple[int, Any, str | None]:
        assert self._http is not None
        workload, target, template = key
        params: dict[str, Any] = {
            name: query_value(v) for name, v in workload_fields(workload).items()
        }
        params["target"] = target
        if template is not None:
            params["template"] = template
        if tune:
            params["tune"] = "true"
        headers = {"If-None-Match": etag} if etag else {}
        status, payload, new_etag = self._http.request(
            "GET", "/api/v1/schedules/best", params=params, headers=headers, timeout=timeout
        )
        body = None
        if status != 304:
            try:
                body = json.loads(payload)
            except ValueError:
                body = None
        return status, body, new_etag

    def _answered(
        self,
        key: tuple[Any, ...],
        entry: _Entry | None,
        status_code: int,
        body: Any,
        etag: str | None,
        deadline_at: float,
    ) -> ScheduleAnswer:
        if status_code == 304 and entry is not None:
            self._up()
            cached = dataclasses.replace(entry.cached, fetched_at=time.time())
            return self._remember(cached).answer
        if status_code == 200 and isinstance(body, dict) and "config" in body:
            self._up()
            return self._remember(CachedLookup(key, body, "", etag, time.time())).answer
        if status_code == 404:
            self._up()
            detail = body.get("detail") if isinstance(body, dict) else None
            error = str(detail or "no template runs this workload on this target")
            return self._remember(CachedLookup(key, None, error, etag, time.time())).answer
        detail = body.get("detail") if isinstance(body, dict) else body
        reason = f"HTTP {status_code}: {detail}"
        if status_code >= 500 or status_code == 429:
            reason = self._failed(reason)
        return self._fallback(key, entry, reason, deadline_at)

    # --- many lookups ----------------------------------------------------------------------
    def _best_many(
        self,
        items: Sequence[Any],
        target: str,
        template: str | None,
        tune: bool,
        deadline_at: float,
    ) -> list[ScheduleAnswer]:
        started = time.monotonic()
        out: list[ScheduleAnswer | None] = [None] * len(items)
        keys: list[tuple[Any, ...] | None] = [None] * len(items)
        missing: dict[tuple[Any, ...], list[int]] = {}
        entries: dict[tuple[Any, ...], _Entry | None] = {}
        for i, item in enumerate(items):
            try:
                key = _item_key(item, target, template)
            except Exception as exc:
                out[i] = _broken(item, target, template, f"malformed item: {exc}")
                continue
            keys[i] = key
            entry = self._memory.get(key)
            if entry is None:
                entry = self._from_disk(key)
            if entry is not None and entry.fresh_until > started:
                out[i] = entry.answer
                continue
            entries[key] = entry
            missing.setdefault(key, []).append(i)
        if missing:
            answers = self._fetch_many(list(missing), entries, tune, deadline_at)
            for key, answer in answers.items():
                for i in missing[key]:
                    out[i] = answer
        return [a if a is not None else _broken(items[i], target, template, "unanswered")
                for i, a in enumerate(out)]  # fmt: skip

    def _fetch_many(
        self,
        keys: list[tuple[Any, ...]],
        entries: Mapping[tuple[Any, ...], _Entry | None],
        tune: bool,
        deadline_at: float,
    ) -> dict[tuple[Any, ...], ScheduleAnswer]:
        down = self._down_reason(time.monotonic())
        if down is not None:
            return {key: self._fallback(key, entries[key], down, deadline_at) for key in keys}
        budget = deadline_at - time.monotonic()
        try:
            if self._http is None:
                raise ConnectionError("offline")
            future = self._pool.submit(self._post_many, keys, tune, _http_timeout(budget))
            results = future.result(timeout=max(budget, 0.0))
        except concurrent.futures.TimeoutError:
            reason = self._failed("no answer within the deadline")
            return {key: self._fallback(key, entries[key], reason, deadline_at) for key in keys}
        except Exception as exc:  # OSError, http.client's errors, a malformed answer, …
            reason = self._failed(f"{type(exc).__name__}: {exc}")
            return {key: self._fallback(key, entries[key], reason, deadline_at) for key in keys}
        self._up()
        out = {}
        for key, result in zip(keys, results, strict=True):
            if result.get("ok") is True:
                cached = CachedLookup(key, result["schedule"], "", None, time.time())
                out[key] = self._remember(cached).answer
            elif result.get("status") == 404:
                cached = CachedLookup(key, None, str(result.get("error")), None, time.time())
                out[key] = self._remember(cached).answer
            else:
                where = ".".join(str(p) for p in result.get("loc") or ())
                reason = f"HTTP {result.get('status')}: {where}: {result.get('error')}"
                out[key] = self._fallback(key, entries[key], reason, deadline_at)
        return out

    def _post_many(
        self, keys: list[tuple[Any, ...]], tune: bool, timeout: float
    ) -> list[dict[str, Any]]:
        assert self._http is not None
        results: list[dict[str, Any]] = []
        for start in range(0, len(keys), MAX_BATCH):
            chunk = keys[start : start + MAX_BATCH]
            items = []
            for workload, target, template in chunk:
                fields = workload_fields(workload)
                item: dict[str, Any] = {"workload": fields, "target": target}
                if template is not None:
                    item["template"] = template
                items.append(item)
            status, payload, _ = self._http.request(
                "POST",
                "/api/v1/schedules/lookup",
                body={"items": items, "tune": tune},
                timeout=timeout,
            )
            if status != 200:
                raise _BadAnswer(f"HTTP {status}: {payload[:200].decode(errors='replace')}")
            answer = json.loads(payload)
            found = answer.get("results") if isinstance(answer, dict) else None
            if not isinstance(found, list) or len(found) != len(chunk):
                raise _BadAnswer("the batch answer does not have one result per item")
            results += [r if isinstance(r, dict) else {} for r in found]
        return results

    # --- cache, fallback, backoff ----------------------------------------------------------
    def _submit(self, key: tuple[Any, ...], call: Any) -> concurrent.futures.Future[Any]:
        """The request for ``key`` already in flight (from a caller that gave up waiting),
        else a new one: a slow service gets one request per lookup, not one per call."""
        if self._http is None:
            raise ConnectionError("offline")
        with self._lock:
            future = self._inflight.get(key)
            if future is not None and not future.done():
                return future
            future = self._pool.submit(call)
            self._inflight[key] = future
        # Outside the lock: a request already done (a refused connection is quick) runs the
        # callback here and now, and the callback takes the lock.
        future.add_done_callback(lambda f: self._forget(key, f))
        return future

    def _forget(self, key: tuple[Any, ...], future: concurrent.futures.Future[Any]) -> None:
        with self._lock:
            if self._inflight.get(key) is future:
                del self._inflight[key]

    def _remember(self, cached: CachedLookup) -> _Entry:
        entry = self._entry(cached)
        self._keep(cached.key, entry)
        if self._disk is not None:
            self._disk.put(cached)
        return entry

    def _entry(self, cached: CachedLookup) -> _Entry:
        age = max(0.0, time.time() - cached.fetched_at)
        fresh_until = time.monotonic() + self.ttl_secs - age
        return _Entry(_answer_of(cached), cached, fresh_until)

    def _from_disk(self, key: tuple[Any, ...]) -> _Entry | None:
        if self._disk is None:
            return None
        cached = self._disk.get(key)
        if cached is None:
            return None
        entry = self._entry(cached)
        self._keep(key, entry)
        return entry

    def _keep(self, key: tuple[Any, ...], entry: _Entry) -> None:
        # A bound, not an LRU: a hit must stay a bare dictionary read. Past it (a process that
        # looked up that many distinct shapes) memory starts again from the disk cache.
        if len(self._memory) >= MAX_MEMORY_ENTRIES:
            self._memory.clear()
            self._defaults.clear()
        self._memory[key] = entry

    def _fallback(
        self, key: tuple[Any, ...], entry: _Entry | None, reason: str, deadline_at: float
    ) -> ScheduleAnswer:
        if entry is not None:
            return dataclasses.replace(entry.answer, fallback=True, stale=True, reason=reason)
        answer = self._defaults.get(key)
        if answer is None:
            if not templates_ready(deadline_at - time.monotonic()):
                # Not cached: the next call computes the default once the templates are in.
                workload, target, _ = key
                return _no_default(workload, target, f"{reason}; {NOT_READY}")
            answer = default_answer(*key)
            self._defaults[key] = answer
        return dataclasses.replace(answer, reason=f"{reason}; {answer.reason}".rstrip("; "))

    def _down_reason(self, now: float) -> str | None:
        if self._http is None:
            return "offline"
        if now < self._down_until:
            return f"the service is not answering ({self._last_error}); next try in " \
                   f"{self._down_until - now:.1f}s"  # fmt: skip
        return None

    def _failed(self, reason: str) -> str:
        with self._lock:
            self._backoff = min(max(self._backoff * 2, BACKOFF_SECS), MAX_BACKOFF_SECS)
            self._down_until = time.monotonic() + self._backoff
            self._last_error = reason
        return reason

    def _up(self) -> None:
        if self._backoff:
            with self._lock:
                self._backoff = 0.0
                self._down_until = 0.0


def _http_timeout(budget_secs: float) -> float:
    """The socket timeout of a request the caller waits ``budget_secs`` for: it frees the
    background thread soon after the caller gave up (and lets a process exit soon)."""
    return max(budget_secs, 0.0) * 2 + 0.1


class _BadAnswer(RuntimeError):
    """The service answered a batch with something that is not a batch answer."""


class _Connections:
    """Keep-alive HTTP/1.1 connections to one service through the standard library's
    ``http.client`` (which sets TCP_NODELAY): one per request in flight, kept for the next
    while idle under ``IDLE_SECS``. Thread-safe; raises OSError or ``http.client``'s errors."""

    def __init__(self, base_url: str, headers: Mapping[str, str]) -> None:
        parts = urllib.parse.urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.https = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.https else 80)
        self.prefix = parts.path.rstrip("/")
        self.headers = {"Accept": "application/json", **headers}
        self._idle: list[tuple[http.client.HTTPConnection, float]] = []
        self._lock = threading.Lock()
        self._tls: Any = None

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        body: Any = None,
        timeout: float,
    ) -> tuple[int, bytes, str | None]:
        """``(status, body bytes, ETag)`` of one request; ``body`` is sent as JSON."""
        url = self.prefix + path
        if params:
            url += "?" + urllib.parse.urlencode(params)
        sent = {**self.headers, **(headers or {})}
        data = None
        if body is not None:
            data = json.dumps(body, separators=(",", ":")).encode()
            sent["Content-Type"] = "application/json"
        for attempt in (1, 2):
            conn, reused = self._take(timeout)
            try:
                conn.request(method, url, body=data, headers=sent)
                response = conn.getresponse()
                payload = response.read()
            except (ConnectionResetError, BrokenPipeError):
                conn.close()
                if reused and attempt == 1:
                    continue  # the server closed it while it was idle: once more, on a new one
                raise
            except BaseException:
                conn.close()
                raise
            if response.will_close:
                conn.close()
            else:
                self._give(conn)
            return response.status, payload, response.getheader("etag")
        raise AssertionError("unreachable")

    def connect_ahead(self, timeout: float) -> None:
        try:
            conn, reused = self._take(timeout)
            if not reused:
                conn.connect()
        except Exception as exc:  # the first lookup meets it again
            log.debug("tunehub: could not connect ahead to %s: %s", self.host, exc)
            return
        self._give(conn)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn, _ in idle:
            conn.close()

    def _take(self, timeout: float) -> tuple[http.client.HTTPConnection, bool]:
        now = time.monotonic()
        stale = []
        conn = None
        with self._lock:
            while self._idle:
                candidate, since = self._idle.pop()
                if now - since < IDLE_SECS:
                    conn = candidate
                    break
                stale.append(candidate)
        for old in stale:
            old.close()
        if conn is not None:
            conn.timeout = timeout
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
            return conn, True
        if self.https:
            if self._tls is None:
                self._tls = _tls_context()
            return http.client.HTTPSConnection(
                self.host, self.port, timeout=timeout, context=self._tls
            ), False
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout), False

    def _give(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            self._idle.append((conn, time.monotonic()))


def _tls_context() -> Any:
    """The TLS context of an https service: certifi's roots where installed (as httpx uses),
    else the system's."""
    import ssl

    try:
        import certifi

        return ssl.create_default_context(cafile=certifi.where())
    except ImportError:
        return ssl.create_default_context()


# --- warm-up: what a first lookup may need, made ahead of it ----------------------------------
NOT_READY = "no default config yet (the templates are still loading): use the library"
_templates_loaded = threading.Event()
_templates_started = threading.Lock()  # held for good by the first to start the import


def start_templates() -> None:
    """Import the template registry on a background thread (once per process): the default
    tier needs it, and it takes a few hundred ms."""
    if _templates_started.acquire(blocking=False):
        threading.Thread(target=_import_templates, name="tunehub-templates", daemon=True).start()


def load_templates() -> None:
    """Import the template registry here and now (unless it is already, or is being imported
    on another thread: then wait for that)."""
    if _templates_started.acquire(blocking=False):
        _import_templates()
    else:
        _templates_loaded.wait()


def templates_ready(timeout_secs: float = 0.0) -> bool:
    """Whether the template registry is imported (or failed to: then defaults say why),
    waiting up to ``timeout_secs`` for it; starts the import if nobody has."""
    if _templates_loaded.is_set():
        return True
    start_templates()
    return _templates_loaded.wait(max(timeout_secs, 0.0))


def _import_templates() -> None:
    try:
        from tunehub.kernels.registry import template_names

        template_names()  # entry points and plugin modules too
    except Exception:
        log.exception("could not import the templates (defaults will say so)")
    finally:
        _templates_loaded.set()


def warm_up() -> None:
    """What a first lookup needs, made on a background thread now: the default client made and
    connected to its service (the templates, which only a fallback needs: ``load_templates``)."""
    threading.Thread(target=_connect_ahead, name="tunehub-warm-up", daemon=True).start()


def _connect_ahead() -> None:
    try:
        from tunehub.core import local_cpu_target

        default_client().connect_ahead()
        local_cpu_target()  # a first fallback asks whether its target is this CPU (runs cc)
    except Exception:
        log.debug("tunehub: warm-up failed", exc_info=True)


def workload_tuple(workload: Any) -> tuple[Any, ...]:
    """A workload's fields in WORKLOAD_FIELDS order (defaults filled in), then its
    operator's own fields as sorted (name, value) pairs: the cache key. The service checks
    the operator's fields (an unknown one is its 422)."""
    common = {name for name, _ in WORKLOAD_FIELDS}
    if isinstance(workload, Mapping):
        for name in workload:
            if not isinstance(name, str):
                raise ValueError(f"unknown workload field {name!r}")
        values = tuple(workload.get(name, default) for name, default in WORKLOAD_FIELDS)
        own = tuple(sorted((n, _hashable(v)) for n, v in workload.items() if n not in common))
    else:
        values = tuple(getattr(workload, name, default) for name, default in WORKLOAD_FIELDS)
        own = tuple(sorted(getattr(workload, "params", ())))
    if any(v is None for v in values):
        raise ValueError("a workload needs m, n and k")
    return (*values, own)


def _hashable(value: Any) -> Any:
    """A list field (grouped_mm's ``group_sizes``) as a tuple, so the key can be hashed."""
    return tuple(value) if isinstance(value, list) else value


def _item_key(item: Any, target: str, template: str | None) -> tuple[Any, ...]:
    if isinstance(item, Mapping) and "workload" in item:
        return (
            workload_tuple(item["workload"]),
            item.get("target", target),
            item.get("template", template),
        )
    return (workload_tuple(item), target, template)


def _answer_of(cached: CachedLookup) -> ScheduleAnswer:
    workload, target, _ = cached.key
    s = cached.schedule
    if s is None:
        return ScheduleAnswer(
            config=None,
            template=None,
            source="unsupported",
            use_library=True,
            workload=workload,
            target=target,
            reason=cached.error,
        )
    return ScheduleAnswer(
        config=dict(s["config"]),
        template=s["template"],
        source=s["source"],
        use_library=bool(s.get("baseline_faster")),
        workload=workload,
        target=target,
        speedup_vs_baseline=s.get("speedup_vs_baseline"),
        tuning_job_id=s.get("tuning_job_id"),
        schedule=s,
    )


def default_answer(workload: tuple[Any, ...], target: str, template: str | None) -> ScheduleAnswer:
    """The template's default config for ``workload`` on ``target``, computed here (no
    service): for this machine's CPU (``local-cpu`` or its target key) and its GPUs
    (``local-cuda:N``, with torch). Other targets, or a workload no template runs: no config,
    ``use_library`` true, and the reason."""
    try:
        from tunehub.core import Workload
        from tunehub.kernels.registry import TEMPLATES, get_template

        tgt = _local_target(target)
        if tgt is None:
            return _no_default(workload, target, f"the target {target!r} is not this machine's")
        core = Workload.from_dict(workload_fields(workload))
        names = [template] if template is not None else list(TEMPLATES.names())
        for name in names:
            tmpl = get_template(name)
            if tmpl.baseline or tmpl.device_kind != tgt.kind:
                continue
            if tmpl.problem(core, tgt) is None:
                config = tmpl.default_config(core, tgt)
                return ScheduleAnswer(
                    config=config.to_dict(),
                    template=tmpl.name,
                    source="default",
                    use_library=False,
                    workload=workload,
                    target=target,
                    fallback=True,
                    reason="the template's default config",
                )
        return _no_default(workload, target, "no template runs this workload on this target")
    except Exception as exc:
        return _no_default(workload, target, f"no default config: {exc!r}")


def _local_target(name: str) -> Any:
    from tunehub.core import local_cpu_target

    if name.startswith("local-cuda:"):
        from tunehub.kernels.cuda_device import cuda_target

        return cuda_target(int(name.partition(":")[2]))
    cpu = local_cpu_target()
    if name in (LOCAL_CPU, cpu.target_key):
        return cpu
    return None


def _no_default(workload: tuple[Any, ...], target: str, reason: str) -> ScheduleAnswer:
    return ScheduleAnswer(
        config=None,
        template=None,
        source="default",
        use_library=True,
        workload=workload,
        target=target,
        fallback=True,
        reason=reason,
    )


def _broken(item: Any, target: str, template: str | None, reason: str) -> ScheduleAnswer:
    """The answer when even the question could not be read: use the library."""
    try:
        workload = workload_tuple(item)
    except Exception:
        workload = ()
    return _no_default(workload, target, reason)


# --- the default client (module-level functions) --------------------------------------------
_default: ScheduleClient | None = None
_default_lock = threading.Lock()


def default_client() -> ScheduleClient:
    """The process's client, made on first use from the environment: ``TUNEHUB_URL``
    (default http://127.0.0.1:8000; empty: offline), ``TUNEHUB_API_KEY``,
    ``TUNEHUB_CLIENT_DEADLINE_SECS`` (0.05), ``TUNEHUB_CLIENT_TTL_SECS`` (300),
    ``TUNEHUB_CACHE_DIR``, ``TUNEHUB_OFFLINE`` (1: never ask the service, answer from the
    disk cache and defaults)."""
    global _default
    client = _default
    if client is not None:
        return client
    with _default_lock:
        if _default is None:
            _default = ScheduleClient(
                os.environ.get(URL_ENV, DEFAULT_URL),
                api_key=os.environ.get(API_KEY_ENV) or None,
                deadline_secs=_env_float(DEADLINE_ENV, DEFAULT_DEADLINE_SECS),
                ttl_secs=_env_float(TTL_ENV, DEFAULT_TTL_SECS),
                offline=os.environ.get(OFFLINE_ENV, "").lower() in ("1", "true", "yes"),
            )
        return _default


def set_default_client(client: ScheduleClient | None) -> None:
    """Use ``client`` for ``best``/``best_many`` (None: make one from the environment again)."""
    global _default
    with _default_lock:
        _default = client


def best(
    workload: Any,
    *,
    target: str = LOCAL_CPU,
    template: str | None = None,
    tune: bool = False,
    deadline_secs: float | None = None,
) -> ScheduleAnswer:
    """``ScheduleClient.best`` on the default client."""
    return default_client().best(
        workload, target=target, template=template, tune=tune, deadline_secs=deadline_secs
    )


def best_many(
    items: Sequence[Any],
    *,
    target: str = LOCAL_CPU,
    template: str | None = None,
    tune: bool = False,
    deadline_secs: float | None = None,
) -> list[ScheduleAnswer]:
    """``ScheduleClient.best_many`` on the default client."""
    return default_client().best_many(
        items, target=target, template=template, tune=tune, deadline_secs=deadline_secs
    )


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name) or default)
    except ValueError:
        log.warning("%s=%r is not a number; using %s", name, os.environ.get(name), default)
        return default
