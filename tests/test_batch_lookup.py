"""The batch lookup ``POST /api/v1/schedules/lookup`` against a real server on loopback, on
SQLite and PostgreSQL: 1,000 items with tuned, untuned, unknown and malformed ones mixed in,
answered in order, each as ``GET /api/v1/schedules/best`` answers it, in a number of SQL
statements that does not grow with the items."""

from __future__ import annotations

import itertools
import json
import random
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import event

from tests.db_fixtures import _truncate as truncate
from tests.live import ServedApp
from tests.test_api import add_key, baseline_record, record
from tunehub.core import Confirmation, Scope, Target, Workload, local_cpu_target, sha256_key
from tunehub.core.workload import DTYPES, EPILOGUES, LAYOUTS
from tunehub.db import ScheduleStore, SqlScheduleStore, upgrade
from tunehub.kernels.registry import template_names
from tunehub.service.app import create_app
from tunehub.service.batch_lookup import encode, encode_schedule, miss, schedule_data
from tunehub.service.redact import printable
from tunehub.service.schemas import LookupBatchOut, ScheduleOut
from tunehub.service.settings import Settings
from tunehub.tuner.lookup import (
    LookupQuery,
    TuningOutcome,
    find_schedule,
    find_schedules,
    predict_schedule,
)

TUNED = 300  # shapes with a schedule on this CPU (a third with a Baseline too)


def tuned_shape(i: int) -> dict[str, int]:
    return {"m": 16 + i, "n": 32, "k": 48}


class Counter:
    """Counts the SQL statements an engine runs while ``counting`` is set, but not the lookup
    cache's change-feed reads: its thread runs them on its own clock, whatever the requests."""

    def __init__(self) -> None:
        self.counting = False
        self.statements: list[str] = []

    def __call__(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if self.counting and threading.current_thread().name != "lookup-cache":
            self.statements.append(statement)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def served(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[ServedApp, SqlScheduleStore, Counter]]:
    """The app over a SQL store, seeded with TUNED schedules (a sibling target's too), served
    on loopback; yields it, its store and a statement counter on the store's engine."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'tunehub.db'}"
        upgrade(url)
    else:
        url = request.getfixturevalue("pg_url")
        truncate(request.getfixturevalue("pg_engine"))
    store = SqlScheduleStore(url)
    local = local_cpu_target()
    sibling = Target.from_dict({**local.to_dict(), "toolchain": {"cc": "othercc 1.0"}})
    records = []
    for i in range(TUNED):
        workload = Workload(**tuned_shape(i))
        target = local if i % 2 == 0 else sibling  # odd shapes: family answers
        records.append(record(target, workload, {"MR": 4 + i % 3, "threads": 1}, 1e-3 + i * 1e-6))
    store.commit_records(records)
    for i in range(0, TUNED, 6):
        store.commit_baseline(baseline_record(local, Workload(**tuned_shape(i)), 1, 2e-3))
    counter = Counter()
    event.listen(store.engine, "before_cursor_execute", counter)
    settings = Settings(home=tmp_path, run_jobs=False, train_models=False)
    try:
        with ServedApp(create_app(settings, store=store)) as app:
            yield app, store, counter
    finally:
        event.remove(store.engine, "before_cursor_execute", counter)
        store.close()


MALFORMED: list[tuple[Any, list[Any]]] = [
    ({"workload": {"m": 0, "n": 8, "k": 8}}, ["workload", "m"]),
    ({"workload": {"m": "eight", "n": 8, "k": 8}}, ["workload", "m"]),
    ({"workload": {"m": 8, "n": 8}}, ["workload", "k"]),
    ({"workload": {"m": 8, "n": 8, "k": 8, "dtype": "float128"}}, ["workload", "dtype"]),
    ({"workload": {"m": 8, "n": 8, "k": 8}, "colour": "red"}, ["colour"]),
    ({"workload": {"m": 8, "n": 8, "k": 8}, "target": "no such\x00target"}, ["target"]),
    ({"workload": {"m": 8, "n": 8, "k": 8}, "target": "f" * 64}, ["target"]),  # unknown key
    ({"target": "local-cpu"}, ["workload"]),
    (17, []),
    ("a string", []),
    (None, []),
    ({"workload": {"m": 65536, "n": 65536, "k": 65536}}, ["workload"]),  # the m*n*k limit
]


def batch_items(rng: random.Random) -> tuple[list[Any], list[tuple[str, Any]]]:
    """1,000 items: tuned shapes, unseen ones, shapes no template runs here, malformed ones;
    shuffled. Returns the items and what each should get: ("hit", source set), ("404", None)
    or ("422", loc)."""
    items: list[tuple[Any, tuple[str, Any]]] = []
    for i in range(TUNED):
        source = {"exact"} if i % 2 == 0 else {"family"}
        items.append(({"workload": tuned_shape(i)}, ("hit", source)))
    for i in range(600):
        shape = {"m": 1000 + i, "n": 64, "k": 64, "dtype": "float32"}
        items.append(({"workload": shape, "target": "local-cpu"}, ("hit", {"default"})))
    for i in range(40):  # triton.gemm does not run on a CPU target
        shape = {"m": 8 + i, "n": 8, "k": 8}
        items.append(({"workload": shape, "template": "triton.gemm"}, ("404", None)))
    while len(items) < 1000:
        item, loc = MALFORMED[len(items) % len(MALFORMED)]
        items.append((item, ("422", loc)))
    rng.shuffle(items)
    return [item for item, _ in items], [want for _, want in items]


def test_a_batch_of_1000_answers_each_item_in_order_in_a_bounded_number_of_queries(
    served: tuple[ServedApp, SqlScheduleStore, Counter],
) -> None:
    app, _, counter = served
    items, wants = batch_items(random.Random(14))
    with httpx.Client(base_url=app.url, timeout=60) as http:
        counter.counting = True
        response = http.post("/api/v1/schedules/lookup", json={"items": items})
        counter.counting = False
        assert response.status_code == 200, response.text
        results = response.json()["results"]
        assert len(results) == len(items)
        big = len(counter.statements)
        for item, want, result in zip(items, wants, results, strict=True):
            kind, detail = want
            if kind == "hit":
                assert result["ok"] is True, (item, result)
                assert result["schedule"]["source"] in detail
                assert result["schedule"]["tuning"] is None
            else:
                assert result["ok"] is False and result["status"] == int(kind), (item, result)
                assert result["error"]
                if kind == "422":
                    assert result["loc"][: len(detail)] == detail, (item, result)
        # Every hit is what the single lookup answers for the same item.
        singles = [(item, r) for item, r in zip(items, results, strict=True) if r["ok"] is True]
        for item, result in singles[::25]:
            params = {**item["workload"], "target": item.get("target", "local-cpu")}
            single = http.get("/api/v1/schedules/best", params=params).json()
            single.pop("tuning")
            batch = dict(result["schedule"])
            batch.pop("tuning")
            assert batch == single
        with_baseline = [r for r in results if r["ok"] and r["schedule"]["baseline"]]
        assert len(with_baseline) == len(range(0, TUNED, 6))
        # The statements do not grow with the items: 50 items cost as many as 1,000.
        counter.statements.clear()
        counter.counting = True
        small = http.post("/api/v1/schedules/lookup", json={"items": items[:50]})
        counter.counting = False
        assert small.status_code == 200
        assert small.json()["results"] == results[:50]
    # The reads of the tiers (targets, schedules and Baselines in chunks of 500 keys), plus
    # one check for the latest cost model per template the untuned items may use (cached for
    # a few seconds): a bound set by the templates, not by the items.
    assert big <= 8 + 2 * len(template_names()), counter.statements
    assert len(counter.statements) <= big


def test_more_than_1000_items_is_a_422_on_the_request(
    served: tuple[ServedApp, SqlScheduleStore, Counter],
) -> None:
    app, _, _ = served
    items = [{"workload": {"m": 8, "n": 8, "k": 8}}] * 1001
    response = httpx.post(f"{app.url}/api/v1/schedules/lookup", json={"items": items}, timeout=30)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "items"]
    for body in ({"items": "nope"}, {}, {"items": [], "tune": "yes"}, {"items": [], "x": 1}):
        response = httpx.post(f"{app.url}/api/v1/schedules/lookup", json=body, timeout=30)
        assert response.status_code == 422, body
    empty = httpx.post(f"{app.url}/api/v1/schedules/lookup", json={"items": []}, timeout=30)
    assert empty.status_code == 200 and empty.json() == {"results": []}


def test_batch_tuning_is_bounded_deduplicated_and_needs_a_write_key(
    served: tuple[ServedApp, SqlScheduleStore, Counter],
) -> None:
    app, store, counter = served
    unseen = [{"workload": {"m": 2000 + i, "n": 64, "k": 64}} for i in range(300)]
    items = unseen + unseen[:5] + [{"workload": tuned_shape(0)}]  # repeats and a tuned one
    url = f"{app.url}/api/v1/schedules/lookup"
    anonymous = httpx.post(url, json={"items": items, "tune": True}, timeout=60).json()
    assert store.count_jobs() == 0
    tuning = anonymous["results"][0]["schedule"]["tuning"]
    assert tuning["queued"] is False and "API key" in tuning["reason"]
    read_key = {"X-API-Key": add_key(store, Scope.READ)}
    refused = httpx.post(url, json={"items": items, "tune": True}, headers=read_key, timeout=60)
    assert "scope read" in refused.json()["results"][0]["schedule"]["tuning"]["reason"]
    assert store.count_jobs() == 0

    write_key = {"X-API-Key": add_key(store, Scope.WRITE)}
    counter.statements.clear()
    counter.counting = True
    response = httpx.post(url, json={"items": items, "tune": True}, headers=write_key, timeout=60)
    counter.counting = False
    results = response.json()["results"]
    cap = Settings().max_lookup_jobs
    queued = [r["schedule"]["tuning"] for r in results[:300] if r["schedule"]["tuning"]["queued"]]
    assert len(queued) == cap and store.count_jobs() == cap
    assert [t["job_id"] for t in queued] == list(range(1, cap + 1))
    rest = results[cap]["schedule"]["tuning"]
    assert rest["queued"] is False and "limit is 20" in rest["reason"]
    # The repeats name the jobs queued for their first occurrence.
    for i in range(5):
        assert results[300 + i]["schedule"]["tuning_job_id"] == i + 1
    assert results[-1]["schedule"]["tuning"] == {
        "queued": False,
        "job_id": None,
        "reason": "tuned already (exact)",
    }
    # Bounded: the reads, the key check and one short transaction per job the cap let in.
    assert len(counter.statements) <= 12 + cap * 12, len(counter.statements)
    # Asked again: every queued shape names its job, no new job.
    again = httpx.post(
        url, json={"items": unseen[:30], "tune": True}, headers=write_key, timeout=60
    )
    assert store.count_jobs() == cap
    ids = [r["schedule"]["tuning_job_id"] for r in again.json()["results"]]
    assert ids == list(range(1, cap + 1)) + [None] * 10


def test_find_schedules_answers_as_find_schedule_on_every_store(store: ScheduleStore) -> None:
    """The bulk reads (chunked past 500 keys) give each query what the single read gives."""
    local = local_cpu_target()
    sibling = Target.from_dict({**local.to_dict(), "toolchain": {"cc": "othercc 1.0"}})
    other = Target.from_dict({**local.to_dict(), "name": "Another CPU", "toolchain": {}})
    records = []
    for i in range(0, 1200, 3):
        workload = Workload(**tuned_shape(i))
        target = (local, sibling, other)[i % 9 // 3]
        records.append(record(target, workload, {"MR": 4 + i % 5, "threads": 1}, 1e-3 + i * 1e-7))
        if i % 2 == 0:  # a second schedule of the same workload elsewhere in the family
            records.append(record(sibling, workload, {"MR": 6, "threads": 1}, 0.9e-3))
    store.commit_records(records)
    for i in range(0, 1200, 12):
        store.commit_baseline(baseline_record(local, Workload(**tuned_shape(i)), 1, 2e-3))
    # Baselines of another thread count (faster, too) match no schedule (all single-threaded):
    # beside a matching one, and alone.
    for i in (*range(0, 1200, 24), *range(6, 1200, 24)):
        store.commit_baseline(baseline_record(local, Workload(**tuned_shape(i)), 2, 1e-3))
    store.put_target(other)
    queries = [
        LookupQuery(Workload(**tuned_shape(i)), target, template)
        for i in range(1200)
        for target, template in ((local, None), (other, "blis.gemm"), (local, "numpy.matmul"))
        if i % 2 == 0 or template is None
    ]
    bulk = find_schedules(store, queries)
    assert len(bulk) == len(queries)
    sources: dict[str, int] = {}
    for query, answer in zip(queries, bulk, strict=True):
        single = find_schedule(store, query.workload, query.target, template=query.template)
        assert (answer is None) == (single is None), query
        if answer is not None and single is not None:
            assert answer.to_dict() == single.to_dict()
            sources[answer.source] = sources.get(answer.source, 0) + 1
            sources["baseline"] = sources.get("baseline", 0) + (answer.baseline is not None)
    assert sources["exact"] > 100 and sources["family"] > 100 and sources["baseline"] > 20
    threads = {a.baseline.request.config["threads"] for a in bulk if a and a.baseline}
    assert threads == {1}
    assert store.get_targets([local.target_key, "nope", other.target_key]).keys() == {
        local.target_key,
        other.target_key,
    }
    keys = [Workload(**tuned_shape(i)).key for i in range(0, 1200, 3)]
    assert set(store.get_workloads([*keys, "nope"])) == set(keys)


def test_the_batch_answer_is_what_the_response_models_would_write(store: ScheduleStore) -> None:
    """The batch route encodes its answer without validating it: each hit must be, byte for
    byte, what ScheduleOut writes for the same answer (confirmed, with a Baseline, untuned,
    with tuning), and the whole answer must validate as LookupBatchOut."""
    local = local_cpu_target()
    workload, other = Workload(m=40, n=24, k=8), Workload(m=41, n=24, k=8)
    tuned = record(local, workload, {"MR": 4, "threads": 1}, 1e-3)
    store.commit_records([tuned, record(local, other, {"MR": 6, "threads": 1}, 3e-3)])
    store.commit_baseline(baseline_record(local, workload, 1, 2e-3))
    store.confirm_schedule(
        workload_key=workload.key,
        target_key=local.target_key,
        template="blis.gemm",
        candidates=[tuned.uid],
        winner_uid=tuned.uid,
        confirmation=Confirmation(9e-4, 0.02, 5, datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC)),
    )
    found = find_schedules(store, [LookupQuery(w, local) for w in (workload, other)])
    assert found[0] is not None and found[0].schedule.confirmation is not None
    assert found[0].baseline is not None and found[1] is not None
    guess = predict_schedule(store, Workload(m=3, n=5, k=7), local, None)
    assert guess is not None and guess.source == "default"
    for answer in (*found, guess):
        assert answer is not None
        body = encode_schedule(schedule_data(answer))
        assert body == ScheduleOut.model_validate(answer.to_dict()).model_dump_json().encode()
        (item,) = json.loads(encode([body]))["results"]
        assert LookupBatchOut.model_validate({"results": [item]}).model_dump(mode="json") == {
            "results": [item]
        }
    asked = schedule_data(guess)
    asked["tuning"] = TuningOutcome(True, 7, "queued").to_dict()
    asked["tuning_job_id"] = 7
    wrong = miss(422, "bad \x00 input", ("workload", "m\ud800"))
    body = json.loads(encode([encode_schedule(asked), wrong]))
    assert LookupBatchOut.model_validate(body).model_dump(mode="json") == body
    assert body["results"][1] == {
        "ok": False,
        "status": 422,
        "error": printable("bad \x00 input"),
        "loc": ["workload", printable("m\ud800")],
    }


def test_a_workloads_key_is_the_sha256_of_its_canonical_json() -> None:
    """Workload.key writes the canonical JSON itself: it must equal canonical_json's text for
    every field value there is (the stored schedules are keyed by it)."""
    combos = itertools.product(DTYPES, LAYOUTS, LAYOUTS, EPILOGUES, (False, True))
    seen = set()
    for dtype, a_layout, b_layout, epilogue, tf32 in combos:
        if tf32 and dtype != "float32":
            continue
        for m, n, k in ((1, 1, 1), (7, 65536, 3), (4096, 11008, 4096)):
            w = Workload(
                m=m,
                n=n,
                k=k,
                dtype=dtype,
                a_layout=a_layout,
                b_layout=b_layout,
                epilogue=epilogue,
                allow_tf32=tf32,
            )
            assert w.key == sha256_key(w.key_dict()), w
            seen.add(w.key)
    assert len(seen) == 3 * (len(DTYPES) * 4 * len(EPILOGUES) + 4 * len(EPILOGUES))
