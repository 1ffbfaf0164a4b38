"""The HTTP contract through FastAPI's TestClient: validation, 404s, jobs and lookups."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tunehub.core import (
    Config,
    Confirmation,
    JobState,
    KeyLimits,
    MeasureRecord,
    MeasureRequest,
    MeasureResult,
    MeasureStatus,
    Scope,
    Target,
    Worker,
    Workload,
    local_cpu_target,
    utc_now,
)
from tunehub.core.apikey import new_api_key
from tunehub.core.job import DEFAULT_STRATEGY
from tunehub.db import MemoryScheduleStore, ScheduleStore
from tunehub.service.app import create_app
from tunehub.service.settings import Settings

SHAPE = {"op": "matmul", "m": 256, "n": 256, "k": 256, "dtype": "float32"}


@pytest.fixture
def store() -> MemoryScheduleStore:
    return MemoryScheduleStore()


def add_key(store: ScheduleStore, scope: Scope = Scope.WRITE, **limits: Any) -> str:
    """A new key of ``scope`` in ``store``; returns the key itself."""
    token, prefix, digest = new_api_key()
    store.create_api_key(
        prefix=prefix, secret_hash=digest, name=f"test {scope}", scope=scope,
        limits=KeyLimits(**limits),
    )  # fmt: skip
    return token


@pytest.fixture
def client(store: MemoryScheduleStore, tmp_path: Any) -> Iterator[TestClient]:
    """The app on the in-memory store, sending a write key."""
    app = create_app(Settings(home=tmp_path, run_jobs=False), store=store)
    with TestClient(app, base_url="http://127.0.0.1") as c:
        c.headers["X-API-Key"] = add_key(store)
        yield c


def changes_seen(client: TestClient) -> None:
    """What the service's cache thread does every ``lookup_refresh_secs``: read the store's
    change feed, so lookups no longer answer from before the writes (tests/test_lookup_cache.py
    checks the thread itself)."""
    client.app.state.lookup_cache.refresh()  # type: ignore[attr-defined]


def submit(client: TestClient, **changes: Any) -> Any:
    body: dict[str, Any] = {"workload": dict(SHAPE), "budget": {"max_trials": 4, "max_secs": 30}}
    body.update(changes)
    return client.post("/api/v1/jobs", json=body)


def record(target: Target, workload: Workload, config: dict[str, Any], secs: float | None):
    if secs is None:
        result = MeasureResult(MeasureStatus.RUNTIME_ERROR, error="SIGSEGV")
    else:
        result = MeasureResult(MeasureStatus.OK, repeat_secs=(secs, secs))
    req = MeasureRequest(workload, target, "blis.gemm", 1, Config(config))
    return MeasureRecord(request=req, result=result)


def test_health_and_openapi_describe_every_field(client: TestClient) -> None:
    assert client.get("/healthz").json()["status"] == "ok"
    spec = client.get("/openapi.json").json()
    ids = {op["operationId"] for path in spec["paths"].values() for op in path.values()}
    assert {"submit_job", "list_jobs", "get_job", "list_job_records", "cancel_job"} <= ids
    assert "best_schedule" in ids
    undocumented = [
        f"{name}.{field}"
        for name, schema in spec["components"]["schemas"].items()
        if not name.startswith(("HTTPValidationError", "ValidationError"))
        for field, prop in schema.get("properties", {}).items()
        if "description" not in prop
    ]
    assert undocumented == []


def test_submit_returns_202_and_a_queued_job(client: TestClient) -> None:
    response = submit(client)
    assert response.status_code == 202, response.text
    job = response.json()
    assert job["state"] == "queued"
    assert job["workload_label"] == "matmul 256x256x256 float32"
    assert job["target_key"] == local_cpu_target().target_key
    assert job["template"] == "blis.gemm" and job["strategy"] == DEFAULT_STRATEGY
    assert client.get(f"/api/v1/jobs/{job['id']}").json()["id"] == job["id"]


def test_jobs_list_is_newest_first_and_paginated(client: TestClient) -> None:
    ids = [submit(client).json()["id"] for _ in range(3)]
    page = client.get("/api/v1/jobs", params={"limit": 2}).json()
    assert page["total"] == 3
    assert [j["id"] for j in page["items"]] == ids[::-1][:2]
    rest = client.get("/api/v1/jobs", params={"limit": 2, "offset": 2}).json()
    assert [j["id"] for j in rest["items"]] == [ids[0]]
    queued = client.get("/api/v1/jobs", params={"state": "succeeded"}).json()
    assert queued["total"] == 0


def test_cancel_moves_a_queued_job_to_cancelled(client: TestClient) -> None:
    job_id = submit(client).json()["id"]
    out = client.post(f"/api/v1/jobs/{job_id}/cancel")
    assert out.status_code == 200
    assert out.json()["state"] == "cancelled"
    assert out.json()["finished_at"] is not None
    # cancelling again is harmless
    assert client.post(f"/api/v1/jobs/{job_id}/cancel").json()["state"] == "cancelled"


@pytest.mark.parametrize(
    ("path", "method"),
    [
        ("/api/v1/jobs/999", "get"),
        ("/api/v1/jobs/999/records", "get"),
        ("/api/v1/jobs/999/baselines", "get"),
        ("/api/v1/jobs/999/cancel", "post"),
    ],
)
def test_unknown_job_is_404(client: TestClient, path: str, method: str) -> None:
    response = getattr(client, method)(path)
    assert response.status_code == 404
    assert "999" in response.json()["detail"]


BAD_BODIES = [
    ({"workload": {**SHAPE, "m": 0}}, ["body", "workload", "m"]),
    ({"workload": {**SHAPE, "n": -5}}, ["body", "workload", "n"]),
    ({"workload": {**SHAPE, "k": 10**9}}, ["body", "workload", "k"]),
    ({"workload": {**SHAPE, "m": "256"}}, ["body", "workload", "m"]),
    ({"workload": {**SHAPE, "m": 2.5}}, ["body", "workload", "m"]),
    ({"workload": {**SHAPE, "m": True}}, ["body", "workload", "m"]),
    ({"workload": {**SHAPE, "op": "conv3d"}}, ["body", "workload", "op"]),
    ({"workload": {**SHAPE, "dtype": "int8"}}, ["body", "workload", "dtype"]),
    ({"workload": {**SHAPE, "epilogue": "gelu"}}, ["body", "workload", "epilogue"]),
    ({"workload": {**SHAPE, "m": 65536, "n": 65536, "k": 65536}}, ["body", "workload", "k"]),
    ({"workload": {k: v for k, v in SHAPE.items() if k != "m"}}, ["body", "workload", "m"]),
    (
        {"workload": {**SHAPE, "m": 65536, "n": 65536, "k": 1, "dtype": "float64"}},
        ["body", "workload", "m"],
    ),
    ({"workload": SHAPE, "strategy": "annealing"}, ["body", "strategy"]),
    ({"workload": SHAPE, "budget": {"max_trials": 0}}, ["body", "budget", "max_trials"]),
    ({"workload": SHAPE, "budget": {"max_trials": 10**7}}, ["body", "budget", "max_trials"]),
    ({"workload": SHAPE, "budget": {"max_secs": -1}}, ["body", "budget", "max_secs"]),
    ({"workload": SHAPE, "template": "nope.gemm"}, ["body", "template"]),
    ({"workload": SHAPE, "template": "numpy.matmul"}, ["body", "template"]),
    ({"workload": SHAPE, "target": "f" * 64}, ["body", "target"]),
    ({"workload": {**SHAPE, "dtype": "float16"}}, ["body", "workload", "dtype"]),
    ({"workload": {**SHAPE, "a_layout": "col_major"}}, ["body", "workload", "a_layout"]),
    ({"workload": {**SHAPE, "b_layout": "diagonal"}}, ["body", "workload", "b_layout"]),
    ({"workload": {**SHAPE, "epilogue": "bias_gelu"}}, ["body", "workload", "epilogue"]),
    ({"workload": {**SHAPE, "dtype": "float64", "allow_tf32": True}}, ["body", "workload"]),
    ({"workload": {**SHAPE, "allow_tf32": "yes"}}, ["body", "workload", "allow_tf32"]),
    ({"workload": SHAPE, "budget": {"max_secs": True}}, ["body", "budget", "max_secs"]),
    ({"workload": SHAPE, "budget": {"max_secs": "5"}}, ["body", "budget", "max_secs"]),
    ({"workload": SHAPE, "seed": "7"}, ["body", "seed"]),
    ({"workload": SHAPE, "strategy": "x" * 40}, ["body", "strategy"]),
    ({"workload": SHAPE, "colour": "blue"}, ["body", "colour"]),
    ({}, ["body", "workload"]),
]


@pytest.mark.parametrize(("body", "loc"), BAD_BODIES)
def test_bad_job_requests_are_422_naming_the_field(
    client: TestClient, body: dict[str, Any], loc: list[str]
) -> None:
    response = client.post("/api/v1/jobs", json=body)
    assert response.status_code == 422, response.text
    errors = response.json()["detail"]
    assert any(e["loc"][: len(loc)] == loc for e in errors), errors
    assert all(e["msg"] for e in errors)
    assert client.get("/api/v1/jobs").json()["total"] == 0  # nothing was stored


@pytest.mark.parametrize(
    "raw",
    [
        b'{"workload": {"m": 8, "n": 8, "k": 8}, "budget": {"max_secs": NaN}}',
        b'{"workload": {"m": 8, "n": 8, "k": 8}, "budget": {"max_secs": Infinity}}',
        b'{"workload": {"m": 8, "n": 8, "k": NaN}}',
        b'{"workload": {"m": 8, "n": 8, "k": 8}, "seed": 1e400}',
        b'{"workload": {"m": 8, "n": 8, "k": 8}, "colour": -Infinity}',
    ],
)
def test_non_finite_numbers_are_422_not_500(client: TestClient, raw: bytes) -> None:
    response = client.post(
        "/api/v1/jobs", content=raw, headers={"content-type": "application/json"}
    )
    assert response.status_code == 422, response.text
    assert all(e["loc"] and e["msg"] for e in response.json()["detail"])


def test_non_json_body_is_422(client: TestClient) -> None:
    response = client.post(
        "/api/v1/jobs", content=b"m=1", headers={"content-type": "application/json"}
    )
    assert response.status_code == 422


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"m": 0, "n": 1, "k": 1}, "m"),
        ({"m": "x", "n": 1, "k": 1}, "m"),
        ({"n": 1, "k": 1}, "m"),
        ({"m": 1, "n": 1, "k": 1, "dtype": "bf7"}, "dtype"),
        ({"m": 1, "n": 1, "k": 1, "target": "nope"}, "target"),
        ({"m": 65536, "n": 65536, "k": 65536}, "k"),
    ],
)
def test_bad_lookups_are_422(client: TestClient, params: dict[str, Any], field: str) -> None:
    response = client.get("/api/v1/schedules/best", params=params)
    assert response.status_code == 422, response.text
    assert any(e["loc"][-1] == field for e in response.json()["detail"])


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/jobs/0",
        "/api/v1/jobs/abc",
        "/api/v1/jobs/99999999999999999999",
        "/api/v1/jobs?limit=0",
        "/api/v1/jobs?offset=-1",
        "/api/v1/jobs?state=sleeping",
    ],
)
def test_bad_paths_and_queries_are_422(client: TestClient, path: str) -> None:
    assert client.get(path).status_code == 422


def test_lookup_answers_the_default_when_nothing_is_known(client: TestClient) -> None:
    response = client.get("/api/v1/schedules/best", params={"m": 8, "n": 8, "k": 8})
    assert response.status_code == 200
    answer = response.json()
    assert answer["source"] == "default" and answer["median_secs"] is None
    assert answer["template"] == "blis.gemm" and answer["model_version"] is None


def test_lookup_tiers_exact_then_family(client: TestClient, store: MemoryScheduleStore) -> None:
    local = local_cpu_target()
    workload = Workload(m=32, n=48, k=64)
    params = {"m": 32, "n": 48, "k": 64, "dtype": "float32"}
    # A sibling of this CPU: same model and ISA, another compiler.
    sibling = Target.from_dict({**local.to_dict(), "toolchain": {"cc": "othercc 1.0"}})
    store.commit_records([record(sibling, workload, {"MR": 4}, 2e-3)])
    family = client.get("/api/v1/schedules/best", params=params).json()
    assert family["source"] == "family"
    assert family["target_key"] == sibling.target_key
    assert family["config"] == {"MR": 4}

    fast = record(local, workload, {"MR": 8}, 1e-3)
    store.commit_records(
        [record(local, workload, {"MR": 6}, 3e-3), fast, record(local, workload, {"MR": 2}, None)]
    )
    changes_seen(client)
    exact = client.get("/api/v1/schedules/best", params=params).json()
    assert exact["source"] == "exact"
    assert exact["record_id"] == fast.uid
    assert exact["config"] == {"MR": 8}
    assert exact["gflops"] == pytest.approx(workload.flops / 1e-3 / 1e9)
    by_key = client.get("/api/v1/schedules/best", params={**params, "target": local.target_key})
    assert by_key.json()["record_id"] == fast.uid
    assert exact["baseline"] is None and exact["speedup_vs_baseline"] is None
    # A faster schedule on the sibling does not displace this target's own.
    store.commit_records([record(sibling, workload, {"MR": 12}, 5e-4)])
    changes_seen(client)
    again = client.get("/api/v1/schedules/best", params=params).json()
    assert (again["source"], again["record_id"]) == ("exact", fast.uid)
    sibling_answer = client.get(
        "/api/v1/schedules/best", params={**params, "target": sibling.target_key}
    ).json()
    assert (sibling_answer["source"], sibling_answer["config"]) == ("exact", {"MR": 12})


def baseline_record(target: Target, workload: Workload, threads: int, secs: float):
    req = MeasureRequest(workload, target, "numpy.matmul", 1, Config({"threads": threads}))
    env = {"blas": "openblas", "blas_version": "0.3.31"}
    result = MeasureResult(MeasureStatus.OK, repeat_secs=(secs,), environment=env)
    return MeasureRecord(request=req, result=result)


def test_family_schedules_with_more_threads_than_cores_are_not_offered(
    client: TestClient, store: MemoryScheduleStore
) -> None:
    local = local_cpu_target()
    workload = Workload(m=24, n=24, k=24)
    big = Target.from_dict({**local.to_dict(), "cores": local.cores * 8, "toolchain": {}})
    store.commit_records([record(big, workload, {"MR": 4, "threads": local.cores * 8}, 1e-4)])
    params = {"m": 24, "n": 24, "k": 24}
    assert client.get("/api/v1/schedules/best", params=params).json()["source"] == "default"
    sibling = Target.from_dict({**local.to_dict(), "toolchain": {"cc": "othercc 2"}})
    store.commit_records([record(sibling, workload, {"MR": 6, "threads": local.cores}, 2e-4)])
    changes_seen(client)
    answer = client.get("/api/v1/schedules/best", params=params).json()
    assert answer["source"] == "family" and answer["config"]["MR"] == 6


def test_lookup_compares_with_the_baseline_of_the_same_thread_count(
    client: TestClient, store: MemoryScheduleStore
) -> None:
    local = local_cpu_target()
    workload = Workload(m=40, n=40, k=40)
    params = {"m": 40, "n": 40, "k": 40}
    store.commit_records([record(local, workload, {"MR": 8, "threads": 2}, 1e-3)])
    store.commit_baseline(baseline_record(local, workload, 1, 1.5e-3))
    store.commit_baseline(baseline_record(local, workload, 2, 0.8e-3))
    answer = client.get("/api/v1/schedules/best", params=params).json()
    assert answer["baseline"]["threads"] == 2
    assert answer["baseline"]["library"] == "openblas 0.3.31"
    assert answer["speedup_vs_baseline"] == pytest.approx(0.8)
    assert answer["baseline_faster"] is True
    store.commit_records([record(local, workload, {"MR": 4, "threads": 2}, 0.5e-3)])
    changes_seen(client)
    answer = client.get("/api/v1/schedules/best", params=params).json()
    assert answer["speedup_vs_baseline"] == pytest.approx(1.6)
    assert answer["baseline_faster"] is False


def test_job_baselines_list_each_thread_count(
    client: TestClient, store: MemoryScheduleStore
) -> None:
    job = submit(client).json()
    assert client.get(f"/api/v1/jobs/{job['id']}/baselines").json() == {"items": []}
    local = local_cpu_target()
    workload = Workload(**SHAPE)
    for threads in range(local.cores, 0, -1):
        store.commit_baseline(baseline_record(local, workload, threads, 1e-3 / threads))
    items = client.get(f"/api/v1/jobs/{job['id']}/baselines").json()["items"]
    assert [b["threads"] for b in items] == list(range(local.cores, 0, -1))  # stored order
    one = items[-1]
    assert one["gflops"] == pytest.approx(workload.flops / 1e-3 / 1e9)
    assert one["library"] == "openblas 0.3.31" and one["config"] == {"threads": 1}


def test_targets_list_live_workers_and_queued_jobs_say_what_they_wait_for(
    client: TestClient, store: MemoryScheduleStore
) -> None:
    local = local_cpu_target()
    job = submit(client).json()
    assert job["waiting_for"] == f"waiting for a worker of target {local.short_label}"
    targets = client.get("/api/v1/targets").json()["items"]
    assert [t["target_key"] for t in targets] == [local.target_key]
    assert targets[0]["live"] is False and targets[0]["aliases"] == ["local-cpu"]
    now = utc_now()
    store.register_worker(
        Worker("w-1", local.target_key, "node-1", 7, "local", "cpu", now, now, {})
    )
    listed = client.get("/api/v1/targets").json()["items"][0]
    assert listed["live"] is True and [w["worker_id"] for w in listed["workers"]] == ["w-1"]
    assert client.get(f"/api/v1/jobs/{job['id']}").json()["waiting_for"] is None
    one = client.get(f"/api/v1/targets/{local.target_key}").json()
    assert one["label"] == local.label and one["cores"] == local.cores
    assert client.get("/api/v1/targets/" + "0" * 64).status_code == 404
    # A worker that stopped reporting is not live.
    store.heartbeat_worker("w-1", at=now - timedelta(minutes=5))
    assert client.get("/api/v1/targets").json()["items"][0]["live"] is False


def test_a_job_may_name_any_stored_target(client: TestClient, store: MemoryScheduleStore) -> None:
    gpu = Target(kind="cuda", name="NVIDIA H100", arch=("sm_90",), cores=132, vendor="nvidia")
    store.put_target(gpu)
    response = submit(client, target=gpu.target_key, template="blis.gemm")  # a CPU template
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "target"]
    # Naming no template takes the first that runs the workload there.
    assert submit(client, target=gpu.target_key).json()["template"] == "triton.gemm"
    other_cpu = Target(kind="cpu", name="Elsewhere", arch=("avx2", "fma"), cores=64)
    store.put_target(other_cpu)
    job = submit(client, target=other_cpu.target_key).json()
    assert job["state"] == "queued" and job["target_key"] == other_cpu.target_key
    assert "waiting for a worker of target cpu Elsewhere" in job["waiting_for"]


def test_job_records_come_in_pages_after_a_cursor(
    client: TestClient, store: MemoryScheduleStore
) -> None:
    job_id = submit(client).json()["id"]
    workload = Workload(**SHAPE)
    local = local_cpu_target()
    records = [
        dataclasses.replace(record(local, workload, {"MR": i}, 1e-3 * (i + 1)), job_id=job_id)
        for i in range(5)
    ]
    for r in records:
        store.commit_records([r])
    first = client.get(f"/api/v1/jobs/{job_id}/records", params={"limit": 2}).json()
    assert [r["uid"] for r in first["items"]] == [r.uid for r in records[:2]]
    assert [r["trial"] for r in first["items"]] == [1, 2] and first["total"] == 5
    rest = client.get(
        f"/api/v1/jobs/{job_id}/records", params={"after": first["next_after"]}
    ).json()
    assert [r["uid"] for r in rest["items"]] == [r.uid for r in records[2:]]
    assert [r["trial"] for r in rest["items"]] == [3, 4, 5]
    empty = client.get(f"/api/v1/jobs/{job_id}/records", params={"after": rest["next_after"]})
    assert empty.json()["items"] == [] and empty.json()["next_after"] == rest["next_after"]


def test_lookup_returns_the_confirmed_time(client: TestClient, store: MemoryScheduleStore) -> None:
    local = local_cpu_target()
    workload = Workload(m=40, n=40, k=40)
    best = record(local, workload, {"MR": 8, "threads": 1}, 1e-3)
    store.commit_records([best])
    store.commit_baseline(baseline_record(local, workload, 1, 1.5e-3))
    store.confirm_schedule(
        workload_key=workload.key,
        target_key=local.target_key,
        template="blis.gemm",
        candidates={best.uid},
        winner_uid=best.uid,
        confirmation=Confirmation(1.2e-3, 0.03, 3, utc_now()),
    )
    answer = client.get("/api/v1/schedules/best", params={"m": 40, "n": 40, "k": 40}).json()
    assert answer["median_secs"] == pytest.approx(1e-3)
    assert answer["confirmed_median_secs"] == pytest.approx(1.2e-3)
    assert answer["confirmed_gflops"] == pytest.approx(workload.gflops(1.2e-3))
    assert answer["confirmed_spread"] == pytest.approx(0.03) and answer["confirmed_rounds"] == 3
    assert answer["speedup_vs_baseline"] == pytest.approx(1.25)  # against the confirmed time


def test_a_win_within_its_rounds_spread_is_a_tie_that_goes_to_the_library(
    client: TestClient, store: MemoryScheduleStore
) -> None:
    """The library is the answer unless the schedule's win over it exceeds 2% and what the
    confirmation's rounds moved by: the winner's round medians' spread, and how far the
    library's fastest round came under its median. The schedule is 1.06x of it each time."""
    local = local_cpu_target()

    def answer(size: int, spread: float, library_rounds: tuple[float, ...] = ()) -> Any:
        workload = Workload(m=size, n=size, k=size)
        best = record(local, workload, {"MR": 8, "threads": 1}, 1e-3)
        store.commit_records([best])
        library = baseline_record(local, workload, 1, 1.06e-3)  # timed once
        if library_rounds:  # re-timed in the confirmation's rounds
            library = dataclasses.replace(library, result=dataclasses.replace(
                library.result, repeat_secs=library_rounds,
                environment={**library.result.environment, "confirmation_rounds": 3}))  # fmt: skip
        store.commit_baseline(library)
        store.confirm_schedule(
            workload_key=workload.key, target_key=local.target_key, template="blis.gemm",
            candidates={best.uid}, winner_uid=best.uid,
            confirmation=Confirmation(1e-3, spread, 3, utc_now()),
        )  # fmt: skip
        params = {"m": size, "n": size, "k": size}
        return client.get("/api/v1/schedules/best", params=params).json()

    steady = answer(41, 0.01)
    assert steady["speedup_vs_baseline"] == pytest.approx(1.06)
    assert (steady["library_tie"], steady["baseline_faster"]) == (pytest.approx(1.02), False)
    spread = answer(42, 0.08)  # the winner's rounds 8% apart: 1.06x is within them
    assert (spread["library_tie"], spread["baseline_faster"]) == (pytest.approx(1.08), True)
    # The library re-timed in rounds, its fastest 6.6% under its median: a tie again.
    library_fast = answer(43, 0.01, (0.99e-3, 1.06e-3, 1.07e-3))
    assert library_fast["speedup_vs_baseline"] == pytest.approx(1.06)
    assert library_fast["library_tie"] == pytest.approx(1 + 0.07 / 1.06)
    assert library_fast["baseline_faster"] is True
    # A slow library round is left out by the median and by the tie.
    library_slow = answer(44, 0.01, (1.05e-3, 1.06e-3, 1.7e-3))
    assert library_slow["speedup_vs_baseline"] == pytest.approx(1.06)
    assert (library_slow["library_tie"], library_slow["baseline_faster"]) == (
        pytest.approx(1.02), False)  # fmt: skip


def test_record_and_job_errors_show_the_reason_not_server_paths_or_tracebacks(
    client: TestClient, store: MemoryScheduleStore
) -> None:
    job_id = submit(client).json()["id"]
    traceback = (
        "RuntimeError: faulty template was asked to raise\n"
        "Traceback (most recent call last):\n"
        '  File "/srv/tunehub/.venv/lib/python3.11/site-packages/tunehub/workers/sandbox.py", '
        "line 211, in run_job\n"
        "    result = template.run(job.request, job.artifact, timing=job.timing)\n"
        "RuntimeError: faulty template was asked to raise"
    )
    compiler = "/root/.tunehub/build/kernel-0a1b.c:7:3: error: 'MR' undeclared"
    local = local_cpu_target()
    for i, error in enumerate((traceback, compiler)):
        failed = dataclasses.replace(
            record(local, Workload(**SHAPE), {"MR": i}, None), job_id=job_id
        )
        failed = dataclasses.replace(
            failed, result=MeasureResult(MeasureStatus.RUNTIME_ERROR, error=error)
        )
        store.commit_records([failed])
    shown = [r["error"] for r in client.get(f"/api/v1/jobs/{job_id}/records").json()["items"]]
    assert shown[0] == (
        "RuntimeError: faulty template was asked to raise\n"
        "RuntimeError: faulty template was asked to raise"
    )
    assert shown[1] == "kernel-0a1b.c:7:3: error: 'MR' undeclared"
    assert all("/" not in e and "Traceback" not in e for e in shown)
    # The store keeps every detail for the operator.
    assert store.job_records(job_id)[0].result.error == traceback
    store.set_job_state(job_id, JobState.FAILED, error="OSError: [Errno 28] /srv/x/build: full")
    assert client.get(f"/api/v1/jobs/{job_id}").json()["error"] == (
        "OSError: [Errno 28] build: full"
    )


def test_a_jobs_best_is_the_schedule_the_lookup_serves(
    client: TestClient, store: MemoryScheduleStore
) -> None:
    """Issue 23's two bests: the fastest single trial (A) and the confirmed winner (B, which the
    confirmation re-timed faster). The job object, the job list and the lookup name one: the
    served schedule, marked unconfirmed until the confirmation."""
    local = local_cpu_target()
    workload = Workload(m=256, n=256, k=256)  # SHAPE
    job_id = submit(client).json()["id"]
    assert client.get(f"/api/v1/jobs/{job_id}").json()["best"] is None, "nothing measured yet"
    a, b, slow = (
        dataclasses.replace(record(local, workload, {"MR": mr}, secs), job_id=job_id)
        for mr, secs in ((8, 1.0e-3), (6, 1.02e-3), (4, 2e-3))
    )
    store.commit_records([slow, a, b])
    store.commit_baseline(baseline_record(local, workload, 1, 1.12e-3))
    changes_seen(client)
    lookup_params = {**SHAPE, "template": "blis.gemm"}

    def job_and_lookup() -> tuple[dict[str, Any], dict[str, Any]]:
        job = client.get(f"/api/v1/jobs/{job_id}").json()
        (listed,) = [j for j in client.get("/api/v1/jobs").json()["items"] if j["id"] == job_id]
        assert listed["best"] == job["best"], "the list and the job say the same"
        return job, client.get("/api/v1/schedules/best", params=lookup_params).json()

    job, served = job_and_lookup()
    best = job["best"]
    assert best["confirmed"] is False, "before the confirmation: the best trial so far"
    assert (
        (best["config"], best["record_id"])
        == (served["config"], served["record_id"])
        == (
            a.request.config.to_dict(),
            a.uid,
        )
    )
    assert best["gflops"] == pytest.approx(served["gflops"]) == pytest.approx(job["best_gflops"])
    assert best["speedup_vs_baseline"] == pytest.approx(served["speedup_vs_baseline"])
    assert best["speedup_vs_baseline"] == pytest.approx(1.12)

    store.confirm_schedule(
        workload_key=workload.key,
        target_key=local.target_key,
        template="blis.gemm",
        candidates={a.uid, b.uid},
        winner_uid=b.uid,
        confirmation=Confirmation(1.01e-3, 0.02, 5, utc_now(), others={a.uid: 1.03e-3}),
    )
    store.set_job_state(job_id, JobState.SUCCEEDED)  # as the runner does after confirming
    changes_seen(client)
    job, served = job_and_lookup()
    best = job["best"]
    assert best["confirmed"] is True and served["confirmed_rounds"] == best["confirmed_rounds"]
    assert (
        (best["config"], best["record_id"])
        == (served["config"], served["record_id"])
        == (
            b.request.config.to_dict(),
            b.uid,
        )
    )
    assert best["gflops"] == pytest.approx(served["confirmed_gflops"])
    assert best["median_secs"] == pytest.approx(served["confirmed_median_secs"]) == 1.01e-3
    assert best["speedup_vs_baseline"] == pytest.approx(served["speedup_vs_baseline"])
    assert best["speedup_vs_baseline"] == pytest.approx(1.12e-3 / 1.01e-3)
    assert best["library"] == "openblas 0.3.31" and best["baseline_faster"] is False
    assert best["source"] == served["source"] == "exact"
    # The fastest single trial stays on the job as what it is, and is not the best quoted.
    assert job["best_record_uid"] == a.uid and job["best_gflops"] > best["gflops"]
    # A job of another workload has no best until something of its own is measured.
    other = submit(client, workload={**SHAPE, "m": 7}).json()
    assert other["best"] is None
