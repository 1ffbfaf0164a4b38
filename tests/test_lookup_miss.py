"""The uncached single lookup's own path (``tunehub.service.lookup_miss``): the same answer,
byte for byte, as the route's for the tuned tiers, on every store, and every other request
left to the route."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

import tunehub.service.routes_schedules
from tests.test_api import baseline_record
from tests.test_lookup_cache import add_key, record
from tunehub.core import Target, Workload, local_cpu_target
from tunehub.core.workload import MAX_DIM
from tunehub.db import ScheduleStore, SqlScheduleStore
from tunehub.db.async_lookup import MAX_OPEN
from tunehub.service.app import create_app, serving_process
from tunehub.service.lookup_miss import plain_query
from tunehub.service.settings import Settings

BEST = "/api/v1/schedules/best"


@pytest.fixture
def route_calls(monkeypatch: pytest.MonkeyPatch) -> list[Workload]:
    """The workloads the route itself looked up (it still does, through the real code)."""
    calls: list[Workload] = []
    real = tunehub.service.routes_schedules.find_schedule

    def spy(store: ScheduleStore, workload: Workload, target: Target, **kw: Any) -> Any:
        calls.append(workload)
        return real(store, workload, target, **kw)

    monkeypatch.setattr(tunehub.service.routes_schedules, "find_schedule", spy)
    return calls


@contextmanager
def client_for(store: ScheduleStore, tmp_path: Path, **settings: Any) -> Iterator[TestClient]:
    # No cache: every request misses, so each one is answered by one of the two paths.
    app = create_app(
        Settings(home=tmp_path, run_jobs=False, lookup_cache_entries=0, **settings), store=store
    )
    with TestClient(app, base_url="http://127.0.0.1") as client:
        yield client


def test_the_tuned_tiers_answer_as_the_route_does(
    store: ScheduleStore, tmp_path: Path, route_calls: list[Workload]
) -> None:
    local = local_cpu_target()
    store.put_target(local)
    exact, family = Workload(m=40, n=48, k=56), Workload(m=24, n=24, k=24, dtype="float64")
    store.commit_records([record(local, exact, 8, 1e-3)])
    store.commit_baseline(baseline_record(local, exact, 1, 1.5e-3))  # the answer quotes it
    sibling = Target.from_dict({**local.to_dict(), "toolchain": {}})
    assert sibling.family_key == local.family_key and sibling.target_key != local.target_key
    store.put_target(sibling)
    store.commit_records([record(sibling, family, 6, 2e-4)])
    threaded: list[str] = []  # workloads read with family_lookup (on a thread)
    real = store.family_lookup

    def family_lookup(**kw: Any) -> Any:
        threaded.append(kw["workload_key"])
        return real(**kw)

    store.family_lookup = family_lookup  # type: ignore[method-assign]
    with client_for(store, tmp_path) as client:
        for query, source in (
            ("m=40&n=48&k=56", "exact"),
            ("m=24&n=24&k=24&dtype=float64&template=blis.gemm", "family"),
            (f"m=40&n=48&k=56&target={local.target_key}", "exact"),
        ):
            fast = client.get(f"{BEST}?{query}")
            assert fast.status_code == 200 and fast.json()["source"] == source
            assert route_calls == [], f"the route answered {query}"
            # allow_tf32=0 is the same workload, spelled as only the route takes it.
            routed = client.get(f"{BEST}?{query}&allow_tf32=0")
            assert route_calls, f"the route did not answer {query}&allow_tf32=0"
            route_calls.clear()
            assert fast.content == routed.content
            assert fast.headers["etag"] == routed.headers["etag"]
            assert fast.headers["content-type"] == routed.headers["content-type"]
            assert fast.headers["x-content-type-options"] == "nosniff"
            tag = fast.headers["etag"]
            same = client.get(f"{BEST}?{query}", headers={"If-None-Match": tag})
            assert same.status_code == 304 and same.headers["etag"] == tag
        # PostgreSQL reads on the event loop (no thread) where no Baseline is to be read.
        threaded.clear()
        assert client.get(f"{BEST}?m=24&n=24&k=24&dtype=float64").json()["source"] == "family"
        on_pg = isinstance(store, SqlScheduleStore) and store.engine.dialect.name == "postgresql"
        assert threaded == ([] if on_pg else [family.key])
        answer = client.get(f"{BEST}?m=40&n=48&k=56").json()
        assert threaded[-1] == exact.key  # its Baseline too: the threaded read
        assert answer["baseline"]["library"] == "openblas 0.3.31"
        assert answer["speedup_vs_baseline"] == pytest.approx(1.5)


def test_what_the_route_answers_instead(
    store: ScheduleStore, tmp_path: Path, route_calls: list[Workload]
) -> None:
    local = local_cpu_target()
    store.put_target(local)
    store.commit_records([record(local, Workload(m=40, n=48, k=56), 8, 1e-3)])
    token, _ = add_key(store)
    with client_for(store, tmp_path) as client:
        untuned = client.get(f"{BEST}?m=8&n=8&k=8")  # not tuned: the route's default tier
        assert untuned.status_code == 200 and untuned.json()["source"] == "default"
        assert len(route_calls) == 1
        bad = client.get(f"{BEST}?m=0&n=8&k=8")
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "m"]
        unknown = client.get(f"{BEST}?m=40&n=48&k=56&target=nosuchtarget")
        assert unknown.status_code == 422 and "unknown target" in unknown.text
        route_calls.clear()
        keyed = client.get(f"{BEST}?m=40&n=48&k=56", headers={"X-API-Key": token})
        wrong = client.get(f"{BEST}?m=40&n=48&k=56", headers={"X-API-Key": "th_nope"})
        assert keyed.status_code == 200 and wrong.status_code in (200, 401)
        assert len(route_calls) == 2  # keys are the route's to judge
    route_calls.clear()
    with client_for(store, tmp_path, read_requires_key=True) as client:
        assert client.get(f"{BEST}?m=40&n=48&k=56").status_code == 401


def test_only_plain_queries_are_parsed_here() -> None:
    found = plain_query(b"m=16&n=32&k=48&dtype=float64&b_layout=col_major&target=local-cpu")
    assert found == (
        Workload(m=16, n=32, k=48, dtype="float64", b_layout="col_major"),
        "local-cpu",
        None,
    )
    assert plain_query(b"k=1&n=2&m=3&template=blis.gemm&allow_tf32=true") == (
        Workload(m=3, n=2, k=1, allow_tf32=True),
        "local-cpu",
        "blis.gemm",
    )
    for query in (
        b"",
        b"m=16&n=32",  # k left out
        b"m=16&n=32&k=48&m=8",  # repeated
        b"m=16&n=32&k=48&tune=true",
        b"m=16&n=32&k=48&batch=4",  # another operator's field
        b"m=16&n=32&k=48&op=bmm",
        b"m=0&n=32&k=48",
        b"m=016&n=32&k=48",
        b"m=-1&n=32&k=48",
        b"m=%d&n=32&k=48" % (MAX_DIM + 1),
        b"m=16&n=32&k=48&dtype=float8",
        b"m=16&n=32&k=48&allow_tf32=1",
        b"m=16&n=32&k=48&target=local%2Dcpu",  # encoded
        b"m=16&n=32&k=48&target=a+b",
        b"m=16&n=32&k=48&target=",
        b"m=16&n=32&k=48&&",
        "m=16&n=32&k=48&target=caf\u00e9".encode(),
    ):
        assert plain_query(query) is None, query


def test_a_serving_process_sets_its_thread_switch_interval(tmp_path: Path) -> None:
    before = sys.getswitchinterval()
    try:
        serving_process(Settings(home=tmp_path, switch_interval_secs=0.002))
        assert sys.getswitchinterval() == pytest.approx(0.002)
    finally:
        sys.setswitchinterval(before)
    with pytest.raises(ValueError, match="switch_interval_secs"):
        Settings(home=tmp_path, switch_interval_secs=0)


@pytest.mark.postgres
def test_the_event_loop_read_keeps_a_few_connections(pg_store: SqlScheduleStore) -> None:
    """Lookups beyond MAX_OPEN at once read on a thread (None here) rather than open more."""
    local = local_cpu_target()
    workload = Workload(m=40, n=48, k=56)
    pg_store.commit_records([record(local, workload, 8, 1e-3)])
    ask = {"workload_key": workload.key, "family_key": local.family_key}

    async def burst() -> list[Any]:
        found = await asyncio.gather(
            *(pg_store.family_lookup_async(**ask) for _ in range(MAX_OPEN + 2))
        )
        again = await pg_store.family_lookup_async(**ask)  # an idle one again
        await pg_store.aclose_async()
        return [*found, again]

    *found, again = asyncio.run(burst())
    assert found.count(None) == 2
    expected, _ = pg_store.family_lookup(**ask)
    assert [f for f in found if f is not None] == [expected] * MAX_OPEN and again == expected
