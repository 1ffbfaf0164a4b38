"""The untuned lookup tiers (``predicted``, ``default``), the model registry's routes and the
background trainer, through FastAPI's TestClient on the in-memory store."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.test_api import add_key
from tunehub.core import Config, JobState, MeasureRecord, Target, Workload, local_cpu_target
from tunehub.cost_model.registry import GlobalTrainer, ModelCache, Trainable, train_global_model
from tunehub.db import MemoryScheduleStore
from tunehub.kernels.registry import get_template
from tunehub.service.app import create_app, trainables
from tunehub.service.settings import Settings
from tunehub.workers.replay import load_datasets

DATASETS = Path(__file__).resolve().parent.parent / "benchmarks" / "datasets" / "cpu"
TEMPLATE = get_template("blis.gemm")


def dataset_records(limit: int = 400, target: Target | None = None) -> list[MeasureRecord]:
    """The first ``limit`` records of each CPU replay dataset and its analytical default's
    record (as a job measures it: the default is a seed). With ``target``: as if measured on
    it (same family), the default's record standing for ``target``'s own default config (the
    same config where ``target`` has the datasets' ISA, as this VM does), so the model gate
    finds the default it measures a model against wherever the tests run."""
    out = []
    for dataset in load_datasets(DATASETS):
        req = dataset.request
        default = TEMPLATE.default_config(req.workload, req.target)
        (measured,) = [r for r in dataset.records if r.config.key == default.key]
        if target is None:
            mine, records = default, [r for r in dataset.records[:limit] if r is not measured]
        else:
            mine = TEMPLATE.default_config(req.workload, target)
            records = [
                r for r in dataset.records[:limit] if r.config.key not in (default.key, mine.key)
            ]
            records = [
                dataclasses.replace(r, request=dataclasses.replace(r.request, target=target))
                for r in records
            ]
        request = dataclasses.replace(measured.request, target=target or req.target, config=mine)
        out += [*records, dataclasses.replace(measured, request=request)]
    return out


def local_records(limit: int = 400) -> list[MeasureRecord]:
    """``dataset_records`` as if measured on this machine's CPU."""
    return dataset_records(limit, local_cpu_target())


@pytest.fixture(scope="module")
def trained_store() -> MemoryScheduleStore:
    store = MemoryScheduleStore()
    store.commit_records(local_records())
    local = local_cpu_target()
    info = train_global_model(
        store, family_key=local.family_key, template=TEMPLATE.name, template_version=2
    )
    assert info is not None and info.version == 1
    return store


@pytest.fixture
def client(trained_store: MemoryScheduleStore, tmp_path: Path) -> Iterator[TestClient]:
    settings = Settings(home=tmp_path, run_jobs=False, train_models=False)
    with TestClient(create_app(settings, store=trained_store), base_url="http://127.0.0.1") as c:
        c.headers["X-API-Key"] = add_key(trained_store)
        yield c


PARAMS = {"m": 300, "n": 700, "k": 500}


def test_an_unseen_shape_gets_the_models_pick_with_its_time_and_version(
    client: TestClient, trained_store: MemoryScheduleStore
) -> None:
    answer = client.get("/api/v1/schedules/best", params=PARAMS).json()
    assert answer["source"] == "predicted"
    assert answer["model_id"] == 1 and answer["model_version"].endswith(" v1")
    assert 0 < answer["predicted_median_secs"] < 1
    workload = Workload(m=300, n=700, k=500)
    assert answer["predicted_gflops"] == pytest.approx(
        workload.flops / answer["predicted_median_secs"] / 1e9
    )
    assert answer["median_secs"] is None and answer["record_id"] is None
    space = TEMPLATE.space(workload, local_cpu_target())
    assert space.is_valid(Config(answer["config"]))
    assert answer["tuning_job_id"] is None and trained_store.count_jobs() == 0


def test_predictions_are_cached_and_fast_once_warm(client: TestClient) -> None:
    params = {"m": 200, "n": 900, "k": 300}
    first = client.get("/api/v1/schedules/best", params=params).json()
    times = []
    for _ in range(50):
        start = time.perf_counter()
        again = client.get("/api/v1/schedules/best", params=params).json()
        times.append(time.perf_counter() - start)
    assert again == first
    assert sorted(times)[-1] < 0.25  # the model is never re-run: a cached answer


def test_tune_queues_one_job_for_an_untuned_shape(
    client: TestClient, trained_store: MemoryScheduleStore
) -> None:
    params = {**PARAMS, "m": 301, "tune": "true"}
    first = client.get("/api/v1/schedules/best", params=params).json()
    second = client.get("/api/v1/schedules/best", params=params).json()
    assert first["tuning_job_id"] is not None
    assert second["tuning_job_id"] == first["tuning_job_id"]
    job = trained_store.get_job(first["tuning_job_id"])
    assert job.state is JobState.QUEUED and job.spec.workload.m == 301


def test_a_tuned_shape_still_answers_exact(client: TestClient) -> None:
    workload = local_records(1)[0].request.workload
    params = {"m": workload.m, "n": workload.n, "k": workload.k, "epilogue": workload.epilogue}
    assert client.get("/api/v1/schedules/best", params=params).json()["source"] == "exact"


def test_no_template_for_the_target_is_a_404(
    client: TestClient, trained_store: MemoryScheduleStore
) -> None:
    # blis.gemm computes no float16 (named: test-only templates may be registered in this
    # process); an untuned shape on a GPU gets triton.gemm's default.
    params = {**PARAMS, "dtype": "float16", "template": "blis.gemm"}
    assert client.get("/api/v1/schedules/best", params=params).status_code == 404
    gpu = Target(
        kind="cuda",
        name="Some GPU",
        arch=("sm_90",),
        cores=132,
        properties={"compute_capability": 90, "smem_per_block_bytes": 232448},
    )
    trained_store.put_target(gpu)
    answer = client.get(
        "/api/v1/schedules/best", params={**PARAMS, "dtype": "float16", "target": gpu.target_key}
    ).json()
    assert answer["source"] == "default" and answer["template"] == "triton.gemm"


def test_models_route_lists_held_out_metrics(client: TestClient) -> None:
    page = client.get("/api/v1/models").json()
    (model,) = page["items"]
    assert page["active"] == [model]
    assert model["template"] == "blis.gemm" and model["version"] == 1
    assert model["workloads_used"] >= 4 and model["records_used"] > 1000
    assert -1 <= model["metrics"]["spearman"] <= 1
    assert 0 < model["metrics"]["top1_fraction"] <= 1
    assert model["metrics"]["held_out_workloads"] >= 4
    # the gate's figures: the model's first pick beside the default's on the same workloads
    assert model["accepted"] is True and model["active"] is True
    assert model["reason"].startswith("accepted: first pick")
    assert model["metrics"]["compared_workloads"] >= 2
    assert model["metrics"]["top1_geomean"] >= model["default_metrics"]["top1_geomean"] > 0
    assert not any(k.startswith("default_") for k in model["metrics"])


def test_job_predictions_pair_predicted_and_measured_times(
    client: TestClient, trained_store: MemoryScheduleStore
) -> None:
    job = client.post(
        "/api/v1/jobs", json={"workload": {"m": 64, "n": 64, "k": 64}, "strategy": "model"}
    ).json()
    records = [
        dataclasses.replace(r, job_id=job["id"], uid=f"{i:032x}")
        for i, r in enumerate(local_records(5)[:5])
    ]
    trained_store.commit_records(records)
    out = client.get(f"/api/v1/jobs/{job['id']}/predictions").json()
    assert out["model"]["version"] == 1
    assert [i["trial"] for i in out["items"]] == [1, 2, 3, 4, 5]
    assert all(i["predicted_secs"] > 0 and i["measured_secs"] > 0 for i in out["items"])
    assert client.get("/api/v1/jobs/999/predictions").status_code == 404


def test_without_a_model_the_default_answers_and_jobs_have_no_predictions(tmp_path: Path) -> None:
    store = MemoryScheduleStore()
    settings = Settings(home=tmp_path, run_jobs=False, train_models=False)
    with TestClient(create_app(settings, store=store), base_url="http://127.0.0.1") as client:
        answer = client.get("/api/v1/schedules/best", params=PARAMS).json()
        workload, target = Workload(m=300, n=700, k=500), local_cpu_target()
        assert answer["source"] == "default"
        assert answer["config"] == TEMPLATE.default_config(workload, target).to_dict()
        assert client.get("/api/v1/models").json() == {"active": [], "items": []}


def test_the_trainer_retrains_only_when_enough_records_arrived() -> None:
    store = MemoryScheduleStore()
    local = local_cpu_target()
    records = local_records(150)
    store.commit_records(records[:100])
    store.put_target(local)
    items = trainables(store)
    assert Trainable(local.family_key, "blis.gemm", 2) in [
        dataclasses.replace(i, target_label="") for i in items
    ]
    made: list[int] = []
    trainer = GlobalTrainer(
        store, lambda: items, min_new_records=200, on_model=lambda m: made.append(m.version)
    )
    assert trainer.run_once() == []  # 100 records: not enough
    store.commit_records(records[100:])
    (first,) = trainer.run_once()
    assert first.version == 1 and made == [1]
    assert trainer.run_once() == []  # nothing new since
    cache = ModelCache(store)
    assert cache.latest(local.family_key, "blis.gemm", 2) == first


def test_the_trainer_thread_starts_and_stops() -> None:
    store = MemoryScheduleStore()
    trainer = GlobalTrainer(store, lambda: [], interval_secs=0.05)
    trainer.start()
    time.sleep(0.2)
    trainer.stop()
    assert trainer._thread is not None and not trainer._thread.is_alive()
