"""The cluster's views: `GET /api/v1/workers` (every worker and its live state) and
`GET /api/v1/schedules` (the stored schedules, paged by the store), on a real `tunehub serve`
over SQLite and PostgreSQL, and the store's listing on every backend."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.live import LiveServer
from tunehub.core import (
    Config,
    MeasureRecord,
    MeasureRequest,
    MeasureResult,
    MeasureStatus,
    Target,
    Worker,
    Workload,
    utc_now,
)
from tunehub.db import ScheduleStore, SqlScheduleStore
from tunehub.db.store import SCHEDULE_SORTS

CPU = Target(kind="cpu", name="Views Test CPU", arch=("avx2", "fma"), cores=8, machine="x86_64")
GPU = Target(
    kind="cuda", name="NVIDIA H100 80GB HBM3", arch=("sm_90",), cores=132, machine="x86_64"
)
SQUARE = Workload(m=256, n=256, k=256)
TALL = Workload(m=512, n=64, k=128, dtype="float64")
SMALL = Workload(m=32, n=32, k=32)


def ok_record(
    workload: Workload, target: Target, secs: float, template: str = "blis.gemm"
) -> MeasureRecord:
    config = Config({"threads": 1} if template == "numpy.matmul" else {"MR": 6, "NR": 8})
    request = MeasureRequest(workload, target, template, 1, config)
    result = MeasureResult(MeasureStatus.OK, repeat_secs=(secs, secs, secs))
    return MeasureRecord(request=request, result=result)


def seed_schedules(store: ScheduleStore) -> None:
    """Three schedules on CPU (one with a slower and one with a faster library beside it) and
    one on GPU with no baseline."""
    store.commit_records(
        [
            ok_record(SQUARE, CPU, 1.0e-3),
            ok_record(TALL, CPU, 4.0e-3),
            ok_record(SMALL, CPU, 2.0e-5),
            ok_record(SQUARE, GPU, 1.0e-5, template="triton.gemm"),
        ]
    )
    assert store.commit_baseline(ok_record(SQUARE, CPU, 2.0e-3, template="numpy.matmul"))
    assert store.commit_baseline(ok_record(SMALL, CPU, 1.0e-5, template="numpy.matmul"))


def test_the_listing_filters_sorts_and_pages_in_the_store(store: ScheduleStore) -> None:
    seed_schedules(store)
    page, total = store.list_schedules(sort="speedup", limit=10)
    assert total == 4
    assert [(i.workload, i.schedule.target_key) for i in page[:2]] == [
        (SQUARE, CPU.target_key),  # 2x faster than the library
        (SMALL, CPU.target_key),  # the library is 2x faster
    ]
    assert page[0].speedup == pytest.approx(2.0) and page[1].speedup == pytest.approx(0.5)
    assert {i.speedup for i in page[2:]} == {None}, "no baseline: last"

    page, total = store.list_schedules(sort="speedup", descending=False, limit=10)
    assert [i.speedup for i in page[:2]] == pytest.approx([0.5, 2.0])

    page, total = store.list_schedules(sort="workload", descending=False, limit=2, offset=1)
    assert total == 4
    assert [i.workload for i in page] == [SQUARE, SQUARE]  # after SMALL, before TALL
    by_target = sorted([(CPU.target_key, "blis.gemm"), (GPU.target_key, "triton.gemm")])
    assert [(i.schedule.target_key, i.schedule.template) for i in page] == by_target

    page, total = store.list_schedules(dtype="float64")
    assert total == 1 and [i.workload for i in page] == [TALL]
    page, total = store.list_schedules(target_key=GPU.target_key, template="triton.gemm")
    assert total == 1 and page[0].baseline_secs is None
    assert store.list_schedules(template="no.such", limit=5) == ([], 0)
    for sort in SCHEDULE_SORTS:
        page, total = store.list_schedules(sort=sort, limit=3)
        assert total == 4 and len(page) == 3, sort
    with pytest.raises(ValueError, match="sort: expected one of"):
        store.list_schedules(sort="median")


# --- a real server ------------------------------------------------------------------------


@pytest.fixture
def served(sql_url: str, tmp_path: Path) -> Iterator[tuple[LiveServer, SqlScheduleStore]]:
    """`tunehub serve` (with its local runner) on ``sql_url``, and a store on the same DB."""
    store = SqlScheduleStore(sql_url)
    server = LiveServer(tmp_path / "home", TUNEHUB_DATABASE_URL=sql_url,
                        TUNEHUB_TRAIN_MODELS="false")  # fmt: skip
    server.start()
    try:
        yield server, store
    finally:
        server.stop()
        store.close()


def get(server: LiveServer, path: str, **params: Any) -> Any:
    response = httpx.get(server.url + path, params=params, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def register(store: ScheduleStore, worker_id: str, target: Target, age_secs: float,
             **info: Any) -> None:  # fmt: skip
    at = utc_now() - timedelta(seconds=age_secs)
    store.put_target(target)
    store.register_worker(
        Worker(worker_id=worker_id, target_key=target.target_key, host="gpu-box-7", pid=4242,
               kind="ray", device="cuda:0", started_at=at, heartbeat_at=at, info=info)
    )  # fmt: skip


@pytest.mark.slow
def test_workers_lists_each_worker_with_its_live_state(
    served: tuple[LiveServer, SqlScheduleStore],
) -> None:
    server, store = served
    config = {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8}
    register(store, "ray-timing", GPU, 2, state="timing", job_id=17, config=config,
             node="a1b2c3", device_name="NVIDIA H100 80GB HBM3", label=GPU.label)  # fmt: skip
    register(store, "ray-bare", GPU, 1)  # a registrar that wrote no live keys yet
    register(store, "ray-lost", GPU, 120, state="building", job_id=18, config=config)
    register(store, "ray-gone", GPU, 2 * 3600, state="idle")

    workers = {w["worker_id"]: w for w in get(server, "/api/v1/workers")["workers"]}
    assert "ray-gone" not in workers, "silent for over an hour: left out"
    local = [w for w in workers.values() if w["kind"] == "local"]
    assert [w["device"] for w in local] == ["cpu"], "the server's own runner"
    assert local[0]["state"] == "idle" and local[0]["live"] is True
    assert local[0]["node"] == local[0]["host"]

    busy = workers["ray-timing"]
    assert busy == {
        **busy,
        "kind": "ray",
        "target_key": GPU.target_key,
        "target_label": GPU.label,
        "host": "gpu-box-7",
        "node": "a1b2c3",
        "device": "cuda:0",
        "device_name": "NVIDIA H100 80GB HBM3",
        "state": "timing",
        "job_id": 17,
        "config": config,
        "live": True,
    }
    bare = workers["ray-bare"]
    assert (bare["state"], bare["job_id"], bare["config"]) == ("idle", None, None)
    assert (bare["node"], bare["device_name"]) == ("gpu-box-7", GPU.name)
    lost = workers["ray-lost"]
    assert (lost["state"], lost["live"], lost["job_id"]) == ("lost", False, None)

    only = get(server, "/api/v1/workers", target=GPU.target_key)["workers"]
    assert {w["worker_id"] for w in only} == {"ray-timing", "ray-bare", "ray-lost"}
    bad = httpx.get(server.url + "/api/v1/workers", params={"target": "no spaces"}, timeout=30)
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "target"]

    spec = get(server, "/openapi.json")
    answer = spec["components"]["schemas"]["WorkerStateOut"]
    assert set(answer["properties"]) == set(busy)
    assert all(p.get("description") for p in answer["properties"].values())


@pytest.mark.slow
def test_schedules_are_listed_a_page_at_a_time(
    served: tuple[LiveServer, SqlScheduleStore],
) -> None:
    server, store = served
    seed_schedules(store)
    page = get(server, "/api/v1/schedules", sort="speedup", limit=2)
    assert (page["total"], page["limit"], page["offset"]) == (4, 2, 0)
    first, second = page["items"]
    assert first["workload"] == SQUARE.to_dict() and first["target_label"] == CPU.label
    assert first["speedup_vs_baseline"] == pytest.approx(2.0)
    assert first["baseline_secs"] == pytest.approx(2.0e-3)
    assert first["median_secs"] == pytest.approx(1.0e-3)
    assert first["gflops"] == pytest.approx(SQUARE.gflops(1.0e-3))
    assert first["source"] == "exact" and first["confirmed_at"] is None
    assert second["speedup_vs_baseline"] == pytest.approx(0.5)

    rest = get(server, "/api/v1/schedules", sort="speedup", limit=2, offset=2)
    assert [i["speedup_vs_baseline"] for i in rest["items"]] == [None, None]
    gpu = get(server, "/api/v1/schedules", target=GPU.target_key)
    assert [i["template"] for i in gpu["items"]] == ["triton.gemm"]
    f64 = get(server, "/api/v1/schedules", dtype="float64", sort="workload", order="asc")
    assert [i["workload_label"] for i in f64["items"]] == [TALL.label]

    for params, field in (
        ({"sort": "median"}, "sort"),
        ({"limit": 0}, "limit"),
        ({"limit": 501}, "limit"),
        ({"dtype": "int3"}, "dtype"),
        ({"order": "up"}, "order"),
    ):
        bad = httpx.get(server.url + "/api/v1/schedules", params=params, timeout=30)
        assert bad.status_code == 422, params
        assert bad.json()["detail"][0]["loc"] == ["query", field]
