"""The single lookup's fast path: the change feed of every store, the per-process cache of
encoded answers (ETag, 304, keys where reads are closed, what is never cached) and its
invalidation across two ``tunehub serve`` processes when a job stores a faster schedule."""

from __future__ import annotations

import gc
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, event

import tunehub.db.common
import tunehub.db.memory_store
import tunehub.db.sql_store
from tunehub.core import (
    Config,
    JobSpec,
    JobState,
    MeasureRecord,
    MeasureRequest,
    MeasureResult,
    MeasureStatus,
    Scope,
    Target,
    Workload,
    local_cpu_target,
)
from tunehub.core.apikey import new_api_key
from tunehub.db import MemoryScheduleStore, ScheduleStore, SqlScheduleStore
from tunehub.db.common import CHANGE_LOOKBACK_IDS, CHANGE_MAX_LISTED
from tunehub.service.app import create_app
from tunehub.service.lookup_cache import CachedAnswer, LookupCache, etag_matches
from tunehub.service.settings import Settings

BEST = "/api/v1/schedules/best"
LOOKUP = "/api/v1/schedules/lookup"
SHAPE = {"m": 32, "n": 48, "k": 64}
ROOT = Path(__file__).resolve().parent.parent


def record(
    target: Target, workload: Workload, mr: int, secs: float, job_id: int | None = None
) -> MeasureRecord:
    req = MeasureRequest(workload, target, "blis.gemm", 1, Config({"MR": mr}))
    result = MeasureResult(MeasureStatus.OK, repeat_secs=(secs, secs))
    return MeasureRecord(request=req, result=result, job_id=job_id)


def add_key(store: ScheduleStore, scope: Scope = Scope.READ) -> tuple[str, int]:
    token, prefix, digest = new_api_key()
    key = store.create_api_key(prefix=prefix, secret_hash=digest, name="t", scope=scope)
    return token, key.id


# --- the change feed, on every store ------------------------------------------------------
def test_change_feed_names_the_workloads_models_and_keys_that_changed(
    store: ScheduleStore,
) -> None:
    local = local_cpu_target()
    store.put_target(local)
    one, two = Workload(m=8, n=8, k=8), Workload(m=16, n=16, k=16)
    start = store.lookup_changes()
    assert not store.lookup_changes(start.mark).any

    store.commit_records([record(local, one, 4, 1e-3)])
    changed = store.lookup_changes(start.mark)
    assert changed.workload_keys == {one.key} and not changed.models and not changed.api_keys
    assert not store.lookup_changes(changed.mark).any  # seen once, not again

    # A finished job names its workload (its confirmation may have moved the schedule).
    job = store.create_job(JobSpec(workload=two, target_key=local.target_key))
    assert store.claim_job() is not None
    mark = store.lookup_changes(changed.mark).mark
    store.set_job_state(job.id, JobState.SUCCEEDED)
    finished = store.lookup_changes(mark)
    assert finished.workload_keys == {two.key}
    assert not store.lookup_changes(finished.mark).any

    _, key_id = add_key(store)
    made = store.lookup_changes(finished.mark)
    assert made.api_keys and not made.workload_keys
    store.revoke_api_key(key_id)
    revoked = store.lookup_changes(made.mark)
    assert revoked.api_keys
    assert not store.lookup_changes(revoked.mark).any


def test_a_quiet_read_of_the_change_feed_is_one_statement(sql_url: str) -> None:
    # Every serving process reads the feed four times a second on a thread beside its event
    # loop: when nothing changed, one statement (on PostgreSQL no BEGIN or COMMIT round trip;
    # SQLite's BEGIN stays in process).
    store = SqlScheduleStore(sql_url)
    try:
        local = local_cpu_target()
        store.put_target(local)
        store.commit_records([record(local, Workload(m=8, n=8, k=8), 4, 1e-3)])
        mark = store.lookup_changes(store.lookup_changes().mark).mark  # the record seen
        statements: list[str] = []

        def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            statements.append(statement)

        event.listen(Engine, "before_cursor_execute", seen)
        try:
            quiet = store.lookup_changes(mark)
        finally:
            event.remove(Engine, "before_cursor_execute", seen)
        assert not quiet.any and quiet.mark.record_id == mark.record_id
        selects = [s for s in statements if s.lstrip().upper().startswith("SELECT")]
        assert len(selects) == 1, statements
        if store.engine.dialect.name == "postgresql":  # in autocommit: nothing around it
            assert statements == selects
    finally:
        store.close()


def test_change_feed_gives_up_listing_past_its_limit(
    store: ScheduleStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert CHANGE_LOOKBACK_IDS < CHANGE_MAX_LISTED
    # The same limits, scaled down: past 10,000 workloads took the stores half a minute each.
    lookback, listed = 10, 40
    for module in (tunehub.db.common, tunehub.db.memory_store, tunehub.db.sql_store):
        monkeypatch.setattr(module, "CHANGE_LOOKBACK_IDS", lookback)
        monkeypatch.setattr(module, "CHANGE_MAX_LISTED", listed)
    local = local_cpu_target()
    store.put_target(local)
    start = store.lookup_changes()
    store.commit_records([record(local, Workload(m=8, n=8, k=k), 4, 1e-3) for k in (1, 2)])
    assert len(store.lookup_changes(start.mark).workload_keys or ()) == 2  # listed below it
    start = store.lookup_changes()
    shapes = [Workload(m=8, n=8, k=k) for k in range(3, listed + 5)]
    store.commit_records([record(local, w, 4, 1e-3) for w in shapes])
    assert store.lookup_changes(start.mark).workload_keys is None


# --- the cache in the app ---------------------------------------------------------------
@pytest.fixture
def memory() -> MemoryScheduleStore:
    return MemoryScheduleStore()


@contextmanager
def app_client(store: ScheduleStore, tmp_path: Path, **settings: Any) -> Iterator[TestClient]:
    app = create_app(Settings(home=tmp_path, run_jobs=False, **settings), store=store)
    with TestClient(app, base_url="http://127.0.0.1") as client:
        yield client


def test_answers_carry_an_etag_and_if_none_match_answers_304(
    memory: MemoryScheduleStore, tmp_path: Path
) -> None:
    local = local_cpu_target()
    workload = Workload(**SHAPE)
    memory.commit_records([record(local, workload, 4, 2e-3)])
    with app_client(memory, tmp_path) as client:
        cache = client.app.state.lookup_cache  # type: ignore[attr-defined]
        first = client.get(BEST, params=SHAPE)
        assert first.status_code == 200 and first.json()["config"] == {"MR": 4}
        etag = first.headers["etag"]
        assert etag.startswith('"') and len(cache) == 1
        hits = cache.hits
        again = client.get(BEST, params=SHAPE)  # from the cache: the same bytes and tag
        assert cache.hits == hits + 1
        assert again.content == first.content and again.headers["etag"] == etag
        assert again.headers["x-content-type-options"] == "nosniff"  # headers kept
        assert again.headers["content-type"] == "application/json"
        same = client.get(BEST, params=SHAPE, headers={"If-None-Match": f'W/"x", {etag}'})
        assert same.status_code == 304 and same.content == b""
        assert same.headers["etag"] == etag
        other = client.get(BEST, params=SHAPE, headers={"If-None-Match": '"nope"'})
        assert other.status_code == 200

        # A faster schedule: once the feed is read, a new answer with a new tag.
        memory.commit_records([record(local, workload, 8, 1e-3)])
        cache.refresh()
        moved = client.get(BEST, params=SHAPE, headers={"If-None-Match": etag})
        assert moved.status_code == 200 and moved.json()["config"] == {"MR": 8}
        assert moved.headers["etag"] != etag

    # The full path (no cache) answers the same tag and 304 too.
    with app_client(memory, tmp_path, lookup_cache_entries=0) as client:
        full = client.get(BEST, params=SHAPE)
        assert full.headers["etag"] == moved.headers["etag"]
        assert full.content == moved.content
        assert client.get(BEST, params=SHAPE, headers={"If-None-Match": "*"}).status_code == 304


def test_what_is_never_cached(memory: MemoryScheduleStore, tmp_path: Path) -> None:
    with app_client(memory, tmp_path) as client:
        cache = client.app.state.lookup_cache  # type: ignore[attr-defined]
        # Asking for tuning (refused here: no write key) says so in the answer: never cached.
        asked = client.get(BEST, params={**SHAPE, "tune": "true"})
        assert asked.status_code == 200 and asked.json()["tuning"]["queued"] is False
        assert len(cache) == 0
        bad = client.get(BEST, params={**SHAPE, "m": 0})
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "m"]
        assert len(cache) == 0
        unknown = client.get(BEST, params={**SHAPE, "target": "nosuchtarget"})
        assert unknown.status_code == 422 and len(cache) == 0
        # Still 422 the second time: errors are never answered from the cache.
        assert client.get(BEST, params={**SHAPE, "m": 0}).status_code == 422
        # A browser's request takes the full path (CORS, cross-site rules), same answer.
        plain = client.get(BEST, params=SHAPE)
        hits = cache.hits
        browser = client.get(BEST, params=SHAPE, headers={"Origin": "http://127.0.0.1"})
        assert browser.content == plain.content and cache.hits == hits


def test_untuned_answers_are_forgotten_when_any_schedule_changes(
    memory: MemoryScheduleStore, tmp_path: Path
) -> None:
    local = local_cpu_target()
    with app_client(memory, tmp_path) as client:
        cache = client.app.state.lookup_cache  # type: ignore[attr-defined]
        assert client.get(BEST, params=SHAPE).json()["source"] == "default"
        assert len(cache) == 1
        memory.commit_records([record(local, Workload(m=8, n=8, k=8), 4, 1e-3)])
        cache.refresh()
        assert len(cache) == 0


def test_a_disallowed_host_is_refused_before_the_cache(
    memory: MemoryScheduleStore, tmp_path: Path
) -> None:
    with app_client(memory, tmp_path) as client:
        assert client.get(BEST, params=SHAPE).status_code == 200
        evil = client.get(BEST, params=SHAPE, headers={"Host": "evil.example"})
        assert evil.status_code == 400


def test_closed_reads_need_a_key_on_the_fast_path_too(
    memory: MemoryScheduleStore, tmp_path: Path
) -> None:
    token, key_id = add_key(memory, Scope.READ)
    other, _ = add_key(memory, Scope.READ)
    with app_client(memory, tmp_path, read_requires_key=True) as client:
        cache = client.app.state.lookup_cache  # type: ignore[attr-defined]
        assert client.get(BEST, params=SHAPE).status_code == 401
        good = client.get(BEST, params=SHAPE, headers={"X-API-Key": token})
        assert good.status_code == 200 and len(cache) == 1
        hits = cache.hits
        assert client.get(BEST, params=SHAPE, headers={"X-API-Key": token}).status_code == 200
        assert cache.hits == hits + 1
        # The cached answer is not given to a request without the key, nor a wrong one.
        assert client.get(BEST, params=SHAPE).status_code == 401
        wrong = "th_00000000_" + "A" * 43
        assert client.get(BEST, params=SHAPE, headers={"X-API-Key": wrong}).status_code == 401
        # Another valid key is checked by the full path first, then served from the cache.
        bearer = {"Authorization": f"Bearer {other}"}
        assert client.get(BEST, params=SHAPE, headers=bearer).status_code == 200
        # A revoked key: refused once the feed is read.
        memory.revoke_api_key(key_id)
        cache.refresh()
        assert client.get(BEST, params=SHAPE, headers={"X-API-Key": token}).status_code == 401
        assert client.get(BEST, params=SHAPE, headers=bearer).status_code == 200


def test_the_cache_thread_follows_the_feed(memory: MemoryScheduleStore, tmp_path: Path) -> None:
    local = local_cpu_target()
    workload = Workload(**SHAPE)
    memory.commit_records([record(local, workload, 4, 2e-3)])
    with app_client(memory, tmp_path, lookup_refresh_secs=0.05) as client:
        assert client.get(BEST, params=SHAPE).json()["config"] == {"MR": 4}
        memory.commit_records([record(local, workload, 8, 1e-3)])
        assert wait_for(lambda: client.get(BEST, params=SHAPE).json()["config"] == {"MR": 8})


def test_a_stale_view_is_not_used(memory: MemoryScheduleStore, tmp_path: Path) -> None:
    with app_client(memory, tmp_path, lookup_refresh_secs=60) as client:
        cache = client.app.state.lookup_cache  # type: ignore[attr-defined]
        client.get(BEST, params=SHAPE)
        assert cache.get(client.get(BEST, params=SHAPE).request.url.query) is not None
        cache._fresh_at -= 1000  # as if the feed had not been read for a long while
        assert cache.get(client.get(BEST, params=SHAPE).request.url.query) is None


def test_etag_matching() -> None:
    assert etag_matches(b'"a"', b'"a"') and etag_matches('W/"a"', b'"a"')
    assert etag_matches("*", b'"a"') and not etag_matches(None, b'"a"')
    assert not etag_matches('"ab"', b'"a"')


def wait_for(check: Any, secs: float = 10.0) -> bool:
    deadline = time.monotonic() + secs
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return False


# --- two serving processes --------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def serving(url: str, home: Path, *extra: str) -> Iterator[str]:
    """``tunehub serve --no-runner`` on ``url`` in a child process; yields its base URL."""
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "TUNEHUB_HOME": str(home),
        "TUNEHUB_DATABASE_URL": url,
        "TUNEHUB_TRAIN_MODELS": "false",
        "TUNEHUB_LOOKUP_REFRESH_SECS": "0.1",
    }
    cmd = [sys.executable, "-m", "tunehub.cli", "serve", "--port", str(port), *extra]
    home.mkdir(parents=True, exist_ok=True)
    log = (home / "serve.log").open("w")
    child = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if child.poll() is not None:
                tail = (home / "serve.log").read_text()[-2000:]
                raise RuntimeError(f"tunehub serve exited: {tail}")
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("tunehub serve did not answer within 60 s")
            time.sleep(0.2)
        yield base
    finally:
        child.terminate()
        try:
            child.wait(timeout=15)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        log.close()


@pytest.mark.slow
def test_two_processes_forget_an_answer_when_a_job_stores_a_faster_schedule(
    sql_url: str, tmp_path: Path
) -> None:
    store = SqlScheduleStore(sql_url)
    try:
        local = local_cpu_target()
        workload = Workload(**SHAPE)
        store.put_target(local)
        job = store.create_job(JobSpec(workload=workload, target_key=local.target_key))
        store.commit_records([record(local, workload, 4, 2e-3, job_id=job.id)])
        with (
            serving(sql_url, tmp_path / "a", "--no-runner") as a,
            serving(sql_url, tmp_path / "b", "--no-runner") as b,
        ):
            tags = {}
            for base in (a, b):
                for _ in range(3):  # the second and third come from the process's cache
                    answer = httpx.get(f"{base}{BEST}", params=SHAPE, timeout=10)
                    assert answer.json()["config"] == {"MR": 4}
                tags[base] = answer.headers["etag"]
            assert tags[a] == tags[b]
            # The job stores a faster record: its schedule moves (as the runner's session does).
            store.commit_records([record(local, workload, 8, 1e-3, job_id=job.id)])
            for base in (a, b):
                assert wait_for(
                    lambda base=base: (
                        httpx.get(f"{base}{BEST}", params=SHAPE, timeout=10).json()["config"]
                        == {"MR": 8}
                    )
                ), base
                moved = httpx.get(
                    f"{base}{BEST}", params=SHAPE, headers={"If-None-Match": tags[base]}, timeout=10
                )
                assert moved.status_code == 200 and moved.headers["etag"] != tags[base]
    finally:
        store.close()


@pytest.mark.slow
def test_serve_with_two_workers_runs_jobs_in_one(sqlite_url: str, tmp_path: Path) -> None:
    with serving(sqlite_url, tmp_path, "--workers", "2") as base:
        assert httpx.get(f"{base}{BEST}", params=SHAPE, timeout=10).status_code == 200
        assert wait_for(lambda: "in another process" in (tmp_path / "serve.log").read_text())
        log = (tmp_path / "serve.log").read_text()
    assert log.count("job runner and trainer here") == 1, log
    assert log.count("job runner and trainer in another process") == 1, log


def test_batch_items_are_cached_and_forgotten_as_single_answers_are(
    memory: MemoryScheduleStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    local = local_cpu_target()
    tuned, untuned = Workload(**SHAPE), Workload(m=8, n=8, k=8)
    memory.commit_records([record(local, tuned, 4, 2e-3)])
    reads: list[int] = []
    real = memory.schedules_for
    monkeypatch.setattr(
        memory, "schedules_for", lambda **kw: reads.append(1) or real(**kw), raising=True
    )
    items = [
        {"workload": SHAPE},
        {"workload": {"m": 8, "n": 8, "k": 8}},
        {"workload": {"m": 0, "n": 8, "k": 8}},
        {"workload": SHAPE, "template": "triton.gemm"},  # no template runs it here: 404
    ]
    with app_client(memory, tmp_path) as client:
        cache = client.app.state.lookup_cache  # type: ignore[attr-defined]
        first = client.post(LOOKUP, json={"items": items})
        results = first.json()["results"]
        assert [r["ok"] for r in results] == [True, True, False, False]
        assert results[0]["schedule"]["config"] == {"MR": 4}
        assert results[1]["schedule"]["source"] == "default"
        assert len(cache) == 2 and len(reads) == 1  # the two answers; never the refusals
        # Asked again, the answers come from the cache: no read (the 404 is asked again).
        again = client.post(LOOKUP, json={"items": items[:3]})
        assert again.json()["results"] == results[:3] and len(reads) == 1
        assert client.post(LOOKUP, json={"items": items}).content == first.content
        assert len(reads) == 2
        # The single lookup does not take the batch's entries (nor the batch the single's).
        misses = cache.misses
        assert client.get(BEST, params=SHAPE).json() == results[0]["schedule"]
        assert cache.misses == misses + 1 and len(cache) == 3
        # A faster schedule: the tuned answer is forgotten with its workload, the untuned
        # one because a schedule changed.
        memory.commit_records([record(local, tuned, 6, 1e-3)])
        cache.refresh()
        assert len(cache) == 0
        changed = client.post(LOOKUP, json={"items": items}).json()["results"]
        assert changed[0]["schedule"]["config"] == {"MR": 6} and len(reads) == 3
        assert changed[1:] == results[1:]
        # Asking for tuning (refused: no key) says so in each answer: not from the cache,
        # and not kept.
        size = len(cache)
        asked = client.post(LOOKUP, json={"items": items, "tune": True}).json()["results"]
        assert asked[0]["schedule"]["tuning"]["reason"] == "tuned already (exact)"
        assert asked[1]["schedule"]["tuning"]["queued"] is False
        assert len(reads) == 4 and len(cache) == size
    assert untuned.key != tuned.key


def test_evicted_and_forgotten_answers_leave_no_trace_in_the_workload_index(
    memory: MemoryScheduleStore,
) -> None:
    """A batch puts a thousand answers at a time: the index of queries by workload must shrink
    with the entries (it kept an empty set for every workload ever cached), and hold nothing
    the cyclic collector has to follow."""
    local = local_cpu_target()
    cache = LookupCache(max_entries=100, refresh_secs=60)
    cache.start(memory)
    try:
        workloads = [Workload(m=8 + i, n=8, k=8) for i in range(1000)]
        answers = [
            (f"q{i}".encode(), CachedAnswer(b"{}", b"", w.key, untuned=False))
            for i, w in enumerate(workloads)
        ]
        cache.put_many(answers, cache.generation)
        assert len(cache) == 100 and len(cache._by_workload) == 100
        kept = workloads[900:]
        assert cache.get_many([q for q, _ in answers[895:905]]) == [None] * 5 + [
            a for _, a in answers[900:905]
        ]
        gc.collect()
        assert not any(gc.is_tracked(queries) for queries in cache._by_workload.values())
        # A schedule of ten cached workloads changes: their answers and index entries go.
        memory.commit_records([record(local, w, 4, 1e-3) for w in kept[:10]])
        cache.refresh()
        assert len(cache) == 90 and set(cache._by_workload) == {w.key for w in kept[10:]}
        # Asked again under the same key for another workload: the old one leaves the index.
        cache.put(b"q950", CachedAnswer(b"{}", b"", "other", untuned=False), cache.generation)
        assert "other" in cache._by_workload and kept[50].key not in cache._by_workload
    finally:
        cache.stop()
