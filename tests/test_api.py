"""The HTTP contract through FastAPI's TestClient: validation, 404s, jobs and lookups."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tunehub.core import (
    Config,
    MeasureRecord,
    MeasureRequest,
    MeasureResult,
    MeasureStatus,
    Target,
    Workload,
    local_cpu_target,
)
from tunehub.db import MemoryScheduleStore
from tunehub.service.app import create_app
from tunehub.service.settings import Settings

SHAPE = {"op": "matmul", "m": 256, "n": 256, "k": 256, "dtype": "float32"}


@pytest.fixture
def store() -> MemoryScheduleStore:
    return MemoryScheduleStore()


@pytest.fixture
def client(store: MemoryScheduleStore, tmp_path: Any) -> Iterator[TestClient]:
    app = create_app(Settings(home=tmp_path, run_jobs=False), store=store)
    with TestClient(app) as c:
        yield c


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
    assert job["template"] == "blis.gemm" and job["strategy"] == "random"
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
    ({"workload": {**SHAPE, "op": "conv2d"}}, ["body", "workload", "op"]),
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


def test_lookup_404_when_nothing_is_known(client: TestClient) -> None:
    response = client.get("/api/v1/schedules/best", params={"m": 8, "n": 8, "k": 8})
    assert response.status_code == 404
    assert "submit a job" in response.json()["detail"]


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
    exact = client.get("/api/v1/schedules/best", params=params).json()
    assert exact["source"] == "exact"
    assert exact["record_id"] == fast.uid
    assert exact["config"] == {"MR": 8}
    assert exact["gflops"] == pytest.approx(workload.flops / 1e-3 / 1e9)
    by_key = client.get("/api/v1/schedules/best", params={**params, "target": local.target_key})
    assert by_key.json()["record_id"] == fast.uid
    assert exact["baseline"] is None and exact["speedup_vs_baseline"] is None


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
    assert client.get("/api/v1/schedules/best", params=params).status_code == 404
    sibling = Target.from_dict({**local.to_dict(), "toolchain": {"cc": "othercc 2"}})
    store.commit_records([record(sibling, workload, {"MR": 6, "threads": local.cores}, 2e-4)])
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
    assert [b["threads"] for b in items] == list(range(1, local.cores + 1))
    assert items[0]["gflops"] == pytest.approx(workload.flops / 1e-3 / 1e9)
    assert items[0]["library"] == "openblas 0.3.31"
