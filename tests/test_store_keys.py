"""API keys, queue limits per key and queue order in every ScheduleStore (memory, SQLite,
PostgreSQL)."""

from __future__ import annotations

import threading

import pytest

from tunehub.core import Budget, JobSpec, JobState, KeyLimits, Scope, Workload, local_cpu_target
from tunehub.core.apikey import matches, new_api_key, parse_api_key
from tunehub.core.job import LOOKUP_PRIORITY
from tunehub.db import ApiKeyNotFound, QueueFull, ScheduleStore, SqlScheduleStore

SPEC = JobSpec(Workload(m=8, n=8, k=8), local_cpu_target().target_key, budget=Budget(2, 10))


def make_key(store: ScheduleStore, scope: Scope = Scope.WRITE, **limits: int) -> int:
    _, prefix, digest = new_api_key()
    return store.create_api_key(
        prefix=prefix, secret_hash=digest, name="ci", scope=scope, limits=KeyLimits(**limits)
    ).id


def test_keys_are_stored_by_prefix_and_hash_and_revoked(store: ScheduleStore) -> None:
    token, prefix, digest = new_api_key()
    key = store.create_api_key(
        prefix=prefix,
        secret_hash=digest,
        name="ci runner",
        scope=Scope.WRITE,
        limits=KeyLimits(max_trials=50, max_secs=600.0, max_queued_jobs=3),
    )
    found = store.get_api_key(prefix=parse_api_key(token))
    assert found == key and found.active and matches(token, found.secret_hash)
    assert found.limits == KeyLimits(max_trials=50, max_secs=600.0, max_queued_jobs=3)
    assert token not in repr(found) and digest not in repr(found)
    assert store.get_api_key(key_id=key.id) == key
    assert store.get_api_key(prefix="00000000") is None
    with pytest.raises(ValueError, match="prefix"):
        store.create_api_key(prefix=prefix, secret_hash=digest, name="x", scope=Scope.READ)
    revoked = store.revoke_api_key(key.id)
    assert revoked.revoked_at is not None and not revoked.active
    assert store.revoke_api_key(key.id).revoked_at == revoked.revoked_at  # idempotent
    assert [k.id for k in store.list_api_keys()] == [key.id]
    with pytest.raises(ApiKeyNotFound):
        store.revoke_api_key(9999)


def test_a_key_cannot_queue_more_jobs_than_its_limit(store: ScheduleStore) -> None:
    store.put_target(local_cpu_target())
    mine, other = make_key(store), make_key(store)
    for _ in range(2):
        store.create_job(SPEC, api_key_id=mine, max_active_for_key=2)
    with pytest.raises(QueueFull, match="this key has 2 jobs queued or running") as info:
        store.create_job(SPEC, api_key_id=mine, max_active_for_key=2)
    assert info.value.limit == 2
    store.create_job(SPEC, api_key_id=other, max_active_for_key=2)  # its own count
    assert store.count_jobs(api_key_id=mine) == 2
    # A finished job frees a place; the total limit counts every key's jobs.
    first = store.list_jobs(limit=10)[-1]
    store.set_job_state(first.id, JobState.CANCELLED)
    store.create_job(SPEC, api_key_id=mine, max_active_for_key=2)
    with pytest.raises(QueueFull, match="the service has 3 jobs"):
        store.create_job(SPEC, api_key_id=other, max_active_total=3)
    with pytest.raises(ApiKeyNotFound):
        store.create_job(SPEC, api_key_id=12345)


def test_jobs_a_keys_lookups_queued_do_not_count_against_its_own_limit(
    store: ScheduleStore,
) -> None:
    """A key's ``tune=true`` lookups queue jobs at LOOKUP_PRIORITY under their own bound
    (max_active_at_priority); its own submissions count only its own (issue 27)."""
    store.put_target(local_cpu_target())
    mine = make_key(store)
    for _ in range(3):
        store.create_job(SPEC, api_key_id=mine, priority=LOOKUP_PRIORITY, max_active_at_priority=3)
    with pytest.raises(QueueFull, match="limit is 3"):
        store.create_job(SPEC, api_key_id=mine, priority=LOOKUP_PRIORITY, max_active_at_priority=3)
    for _ in range(2):
        store.create_job(SPEC, api_key_id=mine, max_active_for_key=2)
    with pytest.raises(QueueFull, match="this key has 2 jobs"):
        store.create_job(SPEC, api_key_id=mine, max_active_for_key=2)


def test_concurrent_submissions_never_pass_the_limit(sql_url: str) -> None:
    stores = [SqlScheduleStore(sql_url) for _ in range(4)]
    try:
        stores[0].put_target(local_cpu_target())
        key = make_key(stores[0])
        refused: list[int] = []
        barrier = threading.Barrier(len(stores))

        def submit(store: SqlScheduleStore) -> None:
            barrier.wait()
            for _ in range(5):
                try:
                    store.create_job(SPEC, api_key_id=key, max_active_for_key=7)
                except QueueFull:
                    refused.append(1)

        threads = [threading.Thread(target=submit, args=(s,)) for s in stores]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert stores[0].count_jobs(api_key_id=key) == 7
        assert len(refused) == 20 - 7
    finally:
        for store in stores:
            store.close()


def test_a_job_moved_back_to_the_queue_waits_behind_the_others(store: ScheduleStore) -> None:
    store.put_target(local_cpu_target())
    first, second = (store.create_job(SPEC).id for _ in range(2))
    claimed = store.claim_job()
    assert claimed is not None and claimed.id == first
    store.set_job_state(first, JobState.QUEUED, only_from=(JobState.RUNNING,))
    again = store.claim_job()
    assert again is not None and again.id == second  # the other job's turn
    last = store.claim_job()
    assert last is not None and last.id == first
    target_keys = {local_cpu_target().target_key}
    assert store.count_jobs(states=(JobState.RUNNING,), target_keys=target_keys) == 2
    assert store.count_jobs(states=(JobState.RUNNING,), target_keys={"f" * 64}) == 0
