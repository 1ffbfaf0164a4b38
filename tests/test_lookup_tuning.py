"""Tuning queued by lookups, bounded: a write key (or the service's ``tune_unseen`` policy), one
job per (workload, target), a cap and a budget from settings, a priority below people's jobs,
and an answer that says whether a job was queued or why not."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.test_api import SHAPE, add_key, record
from tests.test_runner import WORKLOAD, SlowReplay, replay_history
from tunehub.core import Budget, JobSpec, JobState, Scope, Workload, local_cpu_target
from tunehub.core.job import LOOKUP_PRIORITY, PERSON_PRIORITY
from tunehub.db import MemoryScheduleStore, QueueFull, ScheduleStore
from tunehub.service.app import create_app
from tunehub.service.runner import JobRunner
from tunehub.service.settings import Settings

BEST = "/api/v1/schedules/best"


def shape(i: int) -> dict[str, Any]:
    return {"m": 100 + i, "n": 64, "k": 64}


@pytest.fixture
def memory() -> MemoryScheduleStore:
    return MemoryScheduleStore()


def app_client(store: ScheduleStore, home: Path, **settings: Any) -> TestClient:
    config = Settings(home=home, run_jobs=False, train_models=False, **settings)
    return TestClient(create_app(config, store=store), base_url="http://127.0.0.1")


@pytest.fixture
def client(memory: MemoryScheduleStore, tmp_path: Path) -> Iterator[TestClient]:
    with app_client(
        memory, tmp_path, max_lookup_jobs=3, lookup_job_trials=7, lookup_job_secs=30
    ) as c:
        yield c


def tune(client: TestClient, i: int, key: str | None = None) -> dict[str, Any]:
    headers = {"X-API-Key": key} if key else {}
    response = client.get(BEST, params={**shape(i), "tune": "true"}, headers=headers)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def test_a_lookup_without_tune_says_nothing_of_tuning(client: TestClient) -> None:
    answer = client.get(BEST, params=shape(0)).json()
    assert answer["tuning"] is None and answer["tuning_job_id"] is None


def test_tuning_needs_a_key_that_may_write(client: TestClient, memory: MemoryScheduleStore) -> None:
    anonymous = tune(client, 0)
    assert anonymous["source"] == "default"  # the lookup itself is answered
    assert anonymous["tuning"]["queued"] is False and anonymous["tuning_job_id"] is None
    assert "API key with scope write" in anonymous["tuning"]["reason"]
    reader = tune(client, 0, add_key(memory, Scope.READ))
    assert "has scope read" in reader["tuning"]["reason"]
    assert memory.count_jobs() == 0
    written = tune(client, 0, add_key(memory, Scope.WRITE))
    assert written["tuning"] == {"queued": True, "job_id": 1, "reason": "queued"}
    assert written["tuning_job_id"] == 1


def test_a_lookup_job_has_the_lookup_budget_and_priority_and_names_its_key(
    client: TestClient, memory: MemoryScheduleStore
) -> None:
    key = add_key(memory, Scope.WRITE)
    job_id = tune(client, 0, key)["tuning_job_id"]
    job = memory.get_job(job_id)
    assert job.spec.budget == Budget(max_trials=7, max_secs=30)
    assert job.priority == LOOKUP_PRIORITY and job.from_lookup
    assert job.spec.workload == Workload(**shape(0)) and job.state is JobState.QUEUED
    assert job.spec.target_key == local_cpu_target().target_key
    assert job.api_key_id is not None
    shown = client.get(f"/api/v1/jobs/{job_id}").json()
    assert shown["submitted_by"] == "test write" and shown["queued_by_lookup"] is True


def test_the_tune_unseen_policy_queues_without_a_key(
    memory: MemoryScheduleStore, tmp_path: Path
) -> None:
    with app_client(memory, tmp_path, tune_unseen=True, max_lookup_jobs=5) as c:
        plain = c.get(BEST, params=shape(0)).json()  # not even asked
        assert plain["tuning"]["queued"] is True and plain["tuning_job_id"] == 1
        asked = tune(c, 1)  # asked without a key: the policy queues it anyway
        assert asked["tuning"]["queued"] is True and asked["tuning_job_id"] == 2
    assert memory.get_job(1).api_key_id is None and memory.get_job(1).from_lookup


def test_lookup_jobs_are_deduplicated_per_workload_and_target(
    client: TestClient, memory: MemoryScheduleStore
) -> None:
    key = add_key(memory, Scope.WRITE)
    first = tune(client, 0, key)["tuning"]
    again = tune(client, 0, key)["tuning"]
    assert again == {
        "queued": True,
        "job_id": first["job_id"],
        "reason": "a job for it is already queued or running",
    }
    # A job a person submitted for the same workload and target is reused too.
    body = {"workload": {**SHAPE}, "budget": {"max_trials": 4, "max_secs": 30}}
    person = client.post("/api/v1/jobs", json=body, headers={"X-API-Key": key}).json()
    params = {k: v for k, v in SHAPE.items() if k != "op"}
    answer = client.get(BEST, params={**params, "tune": "true"}, headers={"X-API-Key": key})
    assert answer.json()["tuning_job_id"] == person["id"]
    # Once the job finished, a lookup may queue another (the shape may still be untuned).
    memory.set_job_state(first["job_id"], JobState.FAILED, error="no worker")
    assert tune(client, 0, key)["tuning"]["reason"] == "queued"
    assert memory.count_jobs() == 3


def test_lookup_jobs_are_capped_and_the_cap_leaves_people_alone(
    client: TestClient, memory: MemoryScheduleStore
) -> None:
    key = add_key(memory, Scope.WRITE)
    ids = [tune(client, i, key)["tuning_job_id"] for i in range(3)]
    assert ids == [1, 2, 3]
    refused = tune(client, 3, key)["tuning"]
    assert refused["queued"] is False and refused["job_id"] is None
    assert "limit is 3" in refused["reason"]
    body = {"workload": {**SHAPE}, "budget": {"max_trials": 4, "max_secs": 30}}
    assert client.post("/api/v1/jobs", json=body, headers={"X-API-Key": key}).status_code == 202
    memory.set_job_state(1, JobState.SUCCEEDED)  # one lookup job done: room for one more
    assert tune(client, 3, key)["tuning"]["queued"] is True
    assert tune(client, 4, key)["tuning"]["queued"] is False


def test_a_keys_lookup_jobs_do_not_count_against_its_own_job_limit(
    memory: MemoryScheduleStore, tmp_path: Path
) -> None:
    """A key whose ``tune=true`` lookups queued jobs may still submit as many jobs of its own
    as its limit allows: the lookup jobs have their own bound (issue 27)."""
    with app_client(memory, tmp_path, max_lookup_jobs=5, max_queued_jobs_per_key=2) as client:
        key = add_key(memory, Scope.WRITE)
        assert [tune(client, i, key)["tuning"]["queued"] for i in range(3)] == [True] * 3
        body = {"workload": {**SHAPE}, "budget": {"max_trials": 4, "max_secs": 30}}
        codes = [
            client.post("/api/v1/jobs", json=body, headers={"X-API-Key": key}).status_code
            for _ in range(3)
        ]
        assert codes == [202, 202, 429], codes  # its own two, then its own limit


def test_a_cap_of_zero_turns_lookup_tuning_off(memory: MemoryScheduleStore, tmp_path: Path) -> None:
    with app_client(memory, tmp_path, max_lookup_jobs=0) as c:
        answer = tune(c, 0, add_key(memory, Scope.WRITE))
    assert answer["tuning"]["queued"] is False and memory.count_jobs() == 0


def test_a_tuned_workload_queues_nothing(client: TestClient, memory: MemoryScheduleStore) -> None:
    memory.commit_records([record(local_cpu_target(), Workload(**shape(0)), {"MR": 4}, 1e-3)])
    answer = tune(client, 0, add_key(memory, Scope.WRITE))
    assert answer["source"] == "exact"
    assert answer["tuning"] == {"queued": False, "job_id": None, "reason": "tuned already (exact)"}
    assert memory.count_jobs() == 0


# --- the queue: people first, on every store --------------------------------------------------
def spec(i: int) -> JobSpec:
    return JobSpec(
        workload=Workload(**shape(i)),
        target_key=local_cpu_target().target_key,
        budget=Budget(max_trials=4, max_secs=30),
    )


def test_runners_claim_peoples_jobs_before_lookup_jobs(store: ScheduleStore) -> None:
    store.put_target(local_cpu_target())
    lookup = store.create_job(spec(0), priority=LOOKUP_PRIORITY)
    person = store.create_job(spec(1))
    assert (lookup.priority, person.priority) == (LOOKUP_PRIORITY, PERSON_PRIORITY)
    queued = (JobState.QUEUED,)
    assert store.count_jobs(states=queued) == 2
    assert store.count_jobs(states=queued, min_priority=PERSON_PRIORITY) == 1
    claimed = store.claim_job()
    assert claimed is not None and claimed.id == person.id
    # Handed back to the queue, a person's job still goes before the lookup job.
    store.set_job_state(person.id, JobState.QUEUED)
    again = store.claim_job()
    assert again is not None and again.id == person.id
    last = store.claim_job()
    assert last is not None and last.id == lookup.id and last.priority == LOOKUP_PRIORITY
    active = store.active_jobs(
        workload_keys={Workload(**shape(0)).key, Workload(**shape(9)).key},
        target_keys={local_cpu_target().target_key},
    )
    assert [j.id for j in active] == [lookup.id]


def test_the_lookup_cap_is_checked_in_the_insert(store: ScheduleStore) -> None:
    store.put_target(local_cpu_target())
    for i in range(2):
        store.create_job(spec(i), priority=LOOKUP_PRIORITY, max_active_at_priority=2)
    store.create_job(spec(5), max_active_at_priority=2)  # a person's: another priority
    with pytest.raises(QueueFull, match="limit is 2"):
        store.create_job(spec(3), priority=LOOKUP_PRIORITY, max_active_at_priority=2)
    store.set_job_state(1, JobState.CANCELLED)
    store.create_job(spec(3), priority=LOOKUP_PRIORITY, max_active_at_priority=2)


def test_a_waiting_lookup_job_does_not_pause_a_persons_job() -> None:
    target = local_cpu_target()
    memory = MemoryScheduleStore()
    memory.put_target(target)
    person = memory.create_job(
        JobSpec(workload=WORKLOAD, target_key=target.target_key,
                budget=Budget(max_trials=12, max_secs=60))
    )  # fmt: skip
    memory.create_job(spec(0), priority=LOOKUP_PRIORITY)
    runner = JobRunner(
        memory,
        lambda: SlowReplay(replay_history(target), target=target),
        poll_secs=0.01,
        slice_secs=0.05,
    )
    job = memory.claim_job()
    assert job is not None and job.id == person.id
    runner.run_job(job)  # one run, to the end: only a lookup job waited
    assert memory.get_job(person.id).state is JobState.SUCCEEDED
