"""The ScheduleStore contract, run against the in-memory double, SQLite and PostgreSQL."""

from __future__ import annotations

import dataclasses
import multiprocessing
import threading
import time
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import text

from tunehub.core import (
    Budget,
    Config,
    Confirmation,
    JobSpec,
    JobState,
    MeasureRecord,
    MeasureRequest,
    MeasureResult,
    MeasureStatus,
    ModelInfo,
    Target,
    Worker,
    Workload,
    utc_now,
)
from tunehub.db import JobNotFound, LeaseLost, ScheduleStore, SqlScheduleStore

CPU = Target(
    kind="cpu",
    name="Test CPU 9000",
    arch=("avx2", "fma"),
    cores=8,
    l1d_bytes=32 << 10,
    l2_bytes=1 << 20,
    l3_bytes=32 << 20,
    machine="x86_64",
    toolchain={"cc": "gcc 12.2.0"},
)
# Same chip under another compiler: same family, another target.
CPU_NEW_CC = Target(
    kind="cpu",
    name="Test CPU 9000",
    arch=("avx2", "fma"),
    cores=8,
    l1d_bytes=32 << 10,
    l2_bytes=1 << 20,
    l3_bytes=32 << 20,
    machine="x86_64",
    toolchain={"cc": "gcc 13.1.0"},
)
OTHER_CPU = Target(kind="cpu", name="Other CPU", arch=("avx2",), cores=4)

SQUARE = Workload(m=64, n=64, k=64)
TALL = Workload(m=256, n=32, k=48, dtype="float64", epilogue="bias_relu")

T0 = datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=UTC)


def record(
    secs: float | None,
    *,
    workload: Workload = SQUARE,
    target: Target = CPU,
    template: str = "blis.gemm",
    config: dict[str, Any] | None = None,
    job_id: int | None = None,
    status: MeasureStatus | None = None,
    created_at: datetime | None = None,
    uid: str | None = None,
) -> MeasureRecord:
    """An ok record timed ``secs`` (repeats around it), or a failed one when secs is None."""
    if secs is None:
        result = MeasureResult(
            status=status or MeasureStatus.BUILD_ERROR,
            error="cc: error: unknown option",
            compile_secs=0.25,
        )
    else:
        result = MeasureResult(
            status=MeasureStatus.OK,
            repeat_secs=(secs * 1.01, secs, secs * 0.98),
            compile_secs=0.5,
            verify_secs=0.125,
            run_secs=0.0625,
            environment={"host": "node-1", "clocks": {"cpu_mhz": 3500}, "ok": True},
        )
    extra: dict[str, Any] = {}
    if uid is not None:
        extra["uid"] = uid
    return MeasureRecord(
        request=MeasureRequest(
            workload=workload,
            target=target,
            template=template,
            template_version=3,
            config=Config(config if config is not None else {"MR": 6, "NR": 16}),
        ),
        result=result,
        job_id=job_id,
        created_at=created_at or T0,
        **extra,
    )


def new_job(store: ScheduleStore, workload: Workload = SQUARE, **spec: Any) -> int:
    store.put_target(CPU)
    return store.create_job(JobSpec(workload=workload, target_key=CPU.target_key, **spec)).id


# --- targets and workloads -------------------------------------------------------------------
def test_targets_and_workloads_round_trip_and_puts_are_idempotent(store: ScheduleStore) -> None:
    assert store.get_target(CPU.target_key) is None
    assert store.get_workload(TALL.key) is None
    for _ in range(2):
        store.put_target(CPU)
        store.put_workload(TALL)
    got = store.get_target(CPU.target_key)
    assert got == CPU and got is not None and got.family_key == CPU.family_key
    assert store.get_workload(TALL.key) == TALL


# --- jobs ------------------------------------------------------------------------------------
def test_create_job_needs_a_stored_target(store: ScheduleStore) -> None:
    with pytest.raises(ValueError, match="put_target"):
        store.create_job(JobSpec(workload=SQUARE, target_key=CPU.target_key))
    assert store.count_jobs() == 0


def test_create_and_get_job(store: ScheduleStore) -> None:
    store.put_target(CPU)
    spec = JobSpec(
        workload=TALL,
        target_key=CPU.target_key,
        template="blis.gemm",
        strategy="exhaustive",
        budget=Budget(max_trials=17, max_secs=42.5),
        seed=2**40 + 7,
    )
    before = datetime.now(UTC)
    job = store.create_job(spec)
    assert job.spec == spec
    assert job.state is JobState.QUEUED and job.trials_done == 0
    assert job.created_at.tzinfo is not None and job.created_at.utcoffset() == timedelta(0)
    assert before - timedelta(seconds=1) <= job.created_at <= datetime.now(UTC)
    assert (job.started_at, job.finished_at, job.error) == (None, None, "")
    assert (job.best_record_uid, job.best_median_secs) == (None, None)
    assert store.get_job(job.id) == job
    assert store.get_workload(TALL.key) == TALL  # the job stored its workload


def test_a_claimed_job_is_created_running_and_never_claimed_again(store: ScheduleStore) -> None:
    store.put_target(CPU)
    job = store.create_job(JobSpec(workload=SQUARE, target_key=CPU.target_key), claimed=True)
    assert job.state is JobState.RUNNING and job.started_at is not None
    assert store.get_job(job.id) == job
    assert store.claim_job() is None


def test_unknown_job_raises_job_not_found(store: ScheduleStore) -> None:
    with pytest.raises(JobNotFound, match="no job with id 404"):
        store.get_job(404)
    with pytest.raises(JobNotFound):
        store.set_job_state(404, JobState.CANCELLED)
    with pytest.raises(JobNotFound):
        store.job_records(404)


def test_list_and_count_jobs_newest_first_paged_and_filtered(store: ScheduleStore) -> None:
    ids = [new_job(store, seed=i) for i in range(5)]
    assert [j.id for j in store.list_jobs()] == ids[::-1]
    assert [j.id for j in store.list_jobs(limit=2)] == ids[4:2:-1]
    assert [j.id for j in store.list_jobs(limit=2, offset=2)] == ids[2:0:-1]
    assert store.list_jobs(limit=2, offset=5) == []
    store.set_job_state(ids[1], JobState.CANCELLED)
    store.set_job_state(ids[3], JobState.FAILED, error="boom")
    finished = store.list_jobs(states=[JobState.CANCELLED, JobState.FAILED])
    assert [j.id for j in finished] == [ids[3], ids[1]]
    assert [j.id for j in store.list_jobs(states=[JobState.QUEUED], offset=1)] == [ids[2], ids[0]]
    assert store.count_jobs() == 5
    assert store.count_jobs(states=[JobState.QUEUED]) == 3
    assert store.count_jobs(states=[JobState.RUNNING]) == 0
    with pytest.raises(ValueError, match="limit"):
        store.list_jobs(limit=-1)


def test_claim_job_takes_the_oldest_queued(store: ScheduleStore) -> None:
    assert store.claim_job() is None
    first, second, third = (new_job(store, seed=i) for i in range(3))
    store.set_job_state(second, JobState.CANCELLED)
    claimed = store.claim_job()
    assert claimed is not None and claimed.id == first
    assert claimed.state is JobState.RUNNING and claimed.started_at is not None
    assert store.get_job(first) == claimed
    claimed = store.claim_job()
    assert claimed is not None and claimed.id == third
    assert store.claim_job() is None


def _claim_all(store: ScheduleStore, out: list[int], start: threading.Barrier) -> None:
    start.wait()
    while (job := store.claim_job()) is not None:
        out.append(job.id)


def test_concurrent_claims_take_each_job_once(store: ScheduleStore) -> None:
    ids = [new_job(store, seed=i) for i in range(24)]
    claimed: list[list[int]] = [[] for _ in range(4)]
    start = threading.Barrier(len(claimed))
    threads = [threading.Thread(target=_claim_all, args=(store, c, start)) for c in claimed]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    everything = [job_id for c in claimed for job_id in c]
    assert sorted(everything) == ids  # each exactly once
    assert store.count_jobs(states=[JobState.RUNNING]) == len(ids)


def _claim_in_process(url: str, start: Any, out: Any) -> None:
    store = SqlScheduleStore(url)
    start.wait()
    ids = []
    while (job := store.claim_job()) is not None:
        ids.append(job.id)
    store.close()
    out.put(ids)


def test_claims_from_several_processes_take_each_job_once(sql_url: str) -> None:
    store = SqlScheduleStore(sql_url)
    ids = [new_job(store, seed=i) for i in range(30)]
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Barrier(3), ctx.Queue()
    procs = [ctx.Process(target=_claim_in_process, args=(sql_url, start, out)) for _ in range(3)]
    for p in procs:
        p.start()
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    assert sorted(job_id for r in results for job_id in r) == ids
    store.close()


def test_set_job_state_sets_timestamps_and_error(store: ScheduleStore) -> None:
    job_id = new_job(store)
    running = store.set_job_state(job_id, JobState.RUNNING)
    assert running.started_at is not None and running.finished_at is None
    again = store.set_job_state(job_id, JobState.RUNNING)
    assert again.started_at == running.started_at  # a start is not moved
    failed = store.set_job_state(job_id, JobState.FAILED, error="worker lost")
    assert failed.state is JobState.FAILED and failed.error == "worker lost"
    assert failed.started_at == running.started_at
    assert failed.finished_at is not None and failed.finished_at >= running.started_at
    assert failed.finished_at.utcoffset() == timedelta(0)
    assert store.get_job(job_id) == failed
    requeued = store.set_job_state(job_id, JobState.QUEUED)
    # Back in the queue it keeps its first start (issue 27).
    assert (requeued.started_at, requeued.finished_at, requeued.error) == (
        running.started_at, None, ""
    )  # fmt: skip


def test_claims_and_claimed_jobs_record_their_owner(store: ScheduleStore) -> None:
    ids = [new_job(store) for _ in range(2)]
    claimed = store.claim_job(owner="host-a:42:1000")
    assert claimed is not None and claimed.id == ids[0] and claimed.owner == "host-a:42:1000"
    assert store.get_job(ids[0]).owner == "host-a:42:1000"
    store.put_target(CPU)
    own = store.create_job(JobSpec(SQUARE, CPU.target_key), claimed=True, owner="cli:7:9")
    assert store.get_job(own.id).owner == "cli:7:9"
    assert store.get_job(ids[1]).owner == ""  # queued: nobody's yet
    requeued = store.set_job_state(ids[0], JobState.QUEUED)
    assert (requeued.owner, requeued.started_at, requeued.lease_expires_at) == (
        "", claimed.started_at, None
    )  # fmt: skip
    done = store.set_job_state(own.id, JobState.SUCCEEDED)
    # The last holder stays named (it may store what was in flight); the lease is over.
    assert (done.owner, done.lease_expires_at) == ("cli:7:9", None)


# --- leases ----------------------------------------------------------------------------------
def test_claims_take_a_lease_that_renewal_extends(store: ScheduleStore) -> None:
    job_id = new_job(store)
    before = utc_now()
    claimed = store.claim_job(owner="a:1:x", lease_secs=30)
    assert claimed is not None and claimed.lease_expires_at is not None
    assert before + timedelta(seconds=29) < claimed.lease_expires_at
    assert claimed.lease_expires_at <= utc_now() + timedelta(seconds=30)
    assert claimed.lease_expires_at.utcoffset() == timedelta(0)
    assert store.renew_leases("a:1:x", [job_id], lease_secs=300) == {job_id}
    renewed = store.get_job(job_id).lease_expires_at
    assert renewed is not None and renewed > utc_now() + timedelta(seconds=290)
    assert store.renew_leases("a:1:x", []) == set()
    store.put_target(CPU)
    cli = store.create_job(JobSpec(SQUARE, CPU.target_key), claimed=True, owner="b:2:y",
                           lease_secs=5)  # fmt: skip
    assert cli.lease_expires_at is not None and cli.lease_expires_at < renewed
    with pytest.raises(ValueError, match="lease_secs"):
        store.claim_job(owner="a:1:x", lease_secs=0)


def test_a_renewal_by_anyone_but_the_holder_renews_nothing(store: ScheduleStore) -> None:
    held, queued, done, ghost = new_job(store), new_job(store), new_job(store), 999_999
    store.claim_job(owner="a:1:x")
    store.set_job_state(done, JobState.RUNNING)
    store.set_job_state(done, JobState.SUCCEEDED)
    lease = store.get_job(held).lease_expires_at
    assert store.renew_leases("b:2:y", [held]) == set()  # another owner's job
    assert store.get_job(held).lease_expires_at == lease
    assert store.renew_leases("a:1:x", [held, queued, done, ghost]) == {held}


def test_expired_leases_are_requeued_and_claimed_by_another_owner(
    store: ScheduleStore,
) -> None:
    stale, fresh = new_job(store), new_job(store)
    store.claim_job(owner="dead:1:x", lease_secs=30)
    store.claim_job(owner="live:2:y", lease_secs=30)
    assert store.requeue_expired() == []  # both leases run
    later = utc_now() + timedelta(seconds=60)
    store.renew_leases("live:2:y", [fresh], lease_secs=120)
    assert store.requeue_expired(now=later) == [stale]
    job = store.get_job(stale)
    first_start = job.started_at
    assert (job.state, job.owner, job.lease_expires_at, job.resumes) == (
        JobState.QUEUED, "", None, 0
    )  # fmt: skip
    assert first_start is not None  # kept: it is the first start
    assert store.get_job(fresh).state is JobState.RUNNING
    taken = store.claim_job(owner="next:3:z")
    assert taken is not None and taken.id == stale and taken.owner == "next:3:z"
    # A resume: the first start stays, the resume is counted and timed.
    assert (taken.started_at, taken.resumes) == (first_start, 1)
    assert taken.resumed_at is not None and taken.resumed_at >= first_start
    assert store.get_job(stale) == taken
    # The dead owner, back, renews nothing: it lost the job.
    assert store.renew_leases("dead:1:x", [stale]) == set()


def test_a_lease_that_expired_but_was_not_requeued_is_renewed(store: ScheduleStore) -> None:
    job_id = new_job(store)
    store.claim_job(owner="slow:1:x", lease_secs=0.001)
    time.sleep(0.01)
    assert store.renew_leases("slow:1:x", [job_id], lease_secs=30) == {job_id}
    assert store.requeue_expired() == []


def test_fenced_commits_of_a_lost_job_store_nothing(store: ScheduleStore) -> None:
    job_id = new_job(store)
    store.claim_job(owner="a:1:x")
    assert store.commit_records([record(2e-3, job_id=job_id)], owner="a:1:x") == 1
    store.requeue_expired(now=utc_now() + timedelta(hours=1))
    store.claim_job(owner="b:2:y")
    late = record(1e-3, job_id=job_id, config={"MR": 4, "NR": 8})
    with pytest.raises(LeaseLost, match="b:2:y") as lost:
        store.commit_records([late], tuning_secs={job_id: 5.0}, owner="a:1:x")
    assert (lost.value.job_id, lost.value.owner, lost.value.holder) == (job_id, "a:1:x", "b:2:y")
    job = store.get_job(job_id)
    assert (job.trials_done, job.tuning_secs) == (1, 0.0)
    assert [r.median_secs for r in store.job_records(job_id)] == [2e-3]  # nothing of a's late
    schedule = store.get_schedule(workload_key=SQUARE.key, target_key=CPU.target_key)
    assert schedule is not None and schedule.median_secs == 2e-3
    assert store.commit_records([late], owner="b:2:y") == 1  # the holder's write goes in
    # Without an owner (tools, imports) nothing is fenced.
    assert store.commit_records([record(3e-3, job_id=job_id, config={"MR": 2})]) == 1


def test_a_replayed_batch_counts_its_records_and_seconds_once(store: ScheduleStore) -> None:
    """Records from the result journal: a second replay of the same batch changes nothing,
    tuning seconds included (issue 27)."""
    job_id = new_job(store)
    store.claim_job(owner="a:1:x")
    batch = [record(2e-3, job_id=job_id), record(None, job_id=job_id, config={"MR": 4})]
    for _ in range(2):
        store.commit_records(batch, tuning_secs={job_id: 3.0}, replayed=True)
        job = store.get_job(job_id)
        assert (job.trials_done, job.tuning_secs, job.replayed) == (2, 3.0, 2)
    # A batch of one old and one new record: only the new one counts, with its seconds.
    more = [batch[0], record(1e-3, job_id=job_id, config={"MR": 8})]
    assert store.commit_records(more, tuning_secs={job_id: 1.0}, replayed=True) == 1
    job = store.get_job(job_id)
    assert (job.trials_done, job.tuning_secs, job.replayed) == (3, 4.0, 3)
    assert job.best_median_secs == 1e-3
    # Unfenced: a replay stores what was measured whoever holds the job now.
    store.set_job_state(job_id, JobState.QUEUED)
    late = record(4e-3, job_id=job_id, config={"MR": 2})
    assert store.commit_records([late], replayed=True) == 1
    assert store.get_job(job_id).replayed == 4


def test_a_queued_job_refuses_fenced_commits_and_a_cancelled_one_takes_its_holders(
    store: ScheduleStore,
) -> None:
    job_id = new_job(store)
    with pytest.raises(LeaseLost, match="back to the queue"):
        store.commit_records([record(2e-3, job_id=job_id)], owner="a:1:x")
    store.claim_job(owner="a:1:x")
    store.set_job_state(job_id, JobState.CANCELLED, error="cancelled by request")
    cut = record(None, job_id=job_id, status=MeasureStatus.CANCELLED)
    assert store.commit_records([cut], owner="a:1:x") == 1  # what was in flight is stored
    with pytest.raises(LeaseLost):
        store.commit_records([record(1e-3, job_id=job_id)], owner="b:2:y")


def test_fenced_state_moves_happen_only_for_the_holder(store: ScheduleStore) -> None:
    job_id = new_job(store)
    store.claim_job(owner="a:1:x")
    store.requeue_expired(now=utc_now() + timedelta(hours=1))
    store.claim_job(owner="b:2:y")
    same = store.set_job_state(job_id, JobState.FAILED, error="late", owner="a:1:x")
    assert (same.state, same.owner, same.error) == (JobState.RUNNING, "b:2:y", "")
    back = store.set_job_state(job_id, JobState.QUEUED, owner="a:1:x")
    assert back.state is JobState.RUNNING  # a's hand-back does not free b's job
    done = store.set_job_state(job_id, JobState.SUCCEEDED, owner="b:2:y")
    assert (done.state, done.owner) == (JobState.SUCCEEDED, "b:2:y")


def _lease_race(url: str, name: str, start: Any, out: Any) -> None:
    """Claim, then commit one record per claimed job (fenced); report what went in."""
    store = SqlScheduleStore(url)
    start.wait()
    stored = []
    while (job := store.claim_job(owner=name, lease_secs=60)) is not None:
        rec = record(1e-3, job_id=job.id, config={"by": name, "job": job.id})
        if store.commit_records([rec], owner=name) == 1:
            stored.append(job.id)
        store.set_job_state(job.id, JobState.SUCCEEDED, owner=name)
    store.close()
    out.put(stored)


def test_racing_owners_in_several_processes_hold_and_write_each_job_once(
    sql_url: str,
) -> None:
    store = SqlScheduleStore(sql_url)
    ids = [new_job(store, seed=i) for i in range(24)]
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Barrier(3), ctx.Queue()
    procs = [
        ctx.Process(target=_lease_race, args=(sql_url, f"p{i}:1:x", start, out)) for i in range(3)
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    assert sorted(job_id for r in results for job_id in r) == ids
    for job_id in ids:
        (only,) = store.job_records(job_id)
        assert store.get_job(job_id).owner == only.config["by"]
    store.close()


def test_a_requeue_waits_for_a_fenced_commit_in_flight(sql_url: str) -> None:
    """The fence and the write are one transaction: a reaper running meanwhile either comes
    first (the commit is refused) or after (the records are in); never records of a job that
    another owner already holds."""
    store = SqlScheduleStore(sql_url)
    job_ids = [new_job(store, seed=i) for i in range(20)]
    for _ in job_ids:
        store.claim_job(owner="a:1:x", lease_secs=30)
    future = utc_now() + timedelta(hours=1)
    outcomes: dict[int, str] = {}

    def commit_all() -> None:
        for job_id in job_ids:
            try:
                store.commit_records([record(1e-3, job_id=job_id)], owner="a:1:x")
                outcomes[job_id] = "stored"
            except LeaseLost:
                outcomes[job_id] = "refused"

    writer = threading.Thread(target=commit_all)
    writer.start()
    requeued = store.requeue_expired(now=future)
    writer.join(60)
    assert sorted(requeued) == job_ids
    for job_id in job_ids:
        stored = store.count_job_records(job_id)
        assert stored == (1 if outcomes[job_id] == "stored" else 0)
    store.close()


def test_set_job_state_only_from_is_a_conditional_move(store: ScheduleStore) -> None:
    job_id = new_job(store)
    same = store.set_job_state(job_id, JobState.SUCCEEDED, only_from=(JobState.RUNNING,))
    assert same.state is JobState.QUEUED and same.finished_at is None  # not running: no move
    store.claim_job(owner="me:1:1")
    cancelled = store.set_job_state(
        job_id,
        JobState.CANCELLED,
        error="by request",
        only_from=(JobState.QUEUED, JobState.RUNNING),
    )
    assert cancelled.state is JobState.CANCELLED
    # The runner finishing afterwards does not overwrite the cancel.
    after = store.set_job_state(job_id, JobState.SUCCEEDED, only_from=(JobState.RUNNING,))
    assert after.state is JobState.CANCELLED and after.error == "by request"
    assert store.get_job(job_id) == after


def test_commit_records_skips_stored_uids_and_counts_trials(store: ScheduleStore) -> None:
    job_id = new_job(store)
    first = [record(2e-3, job_id=job_id), record(None, job_id=job_id), record(3e-3)]
    assert store.commit_records(first) == 3
    assert store.commit_records(first) == 0
    assert store.commit_records([]) == 0
    fresh = record(4e-3, job_id=job_id)
    assert store.commit_records([first[0], fresh, fresh]) == 1
    assert store.get_job(job_id).trials_done == 3  # two from the first batch, one fresh
    # Equal created_at: commit order, and by uid within one commit.
    first_two = sorted([first[0].uid, first[1].uid])
    assert [r.uid for r in store.job_records(job_id)] == [*first_two, fresh.uid]
    assert len(store.records_for(workload_key=SQUARE.key, target_key=CPU.target_key)) == 4


def test_commit_records_stores_their_targets_and_workloads(store: ScheduleStore) -> None:
    assert store.commit_records([record(1e-3, workload=TALL, target=OTHER_CPU)]) == 1
    assert store.get_target(OTHER_CPU.target_key) == OTHER_CPU
    assert store.get_workload(TALL.key) == TALL


def test_records_round_trip_every_field(store: ScheduleStore) -> None:
    job_id = new_job(store, workload=TALL)
    ok = MeasureRecord(
        request=MeasureRequest(
            workload=TALL,
            target=CPU,
            template="blis.gemm",
            template_version=7,
            config=Config({"MR": 6, "NR": 16, "KC": 256, "pack_b": True, "loop": "jik"}),
        ),
        result=MeasureResult(
            status=MeasureStatus.OK,
            repeat_secs=(1.2345678901234567e-3, 1.1e-3, 0.1 + 0.2),
            compile_secs=0.75,
            verify_secs=0.03125,
            run_secs=1.5,
            environment={"host": "n1", "driver": None, "clocks": {"sm": [1, 2.5]}, "n": 3},
        ),
        job_id=job_id,
        # Another zone on the way in; UTC on the way out, the same instant.
        created_at=datetime(2024, 5, 1, 14, 30, 0, 654321, tzinfo=timezone(timedelta(hours=2))),
    )
    failed = record(
        None, workload=TALL, job_id=job_id, status=MeasureStatus.WRONG_ANSWER, created_at=T0
    )
    assert store.commit_records([failed]) == 1
    assert store.commit_records([ok]) == 1
    got = store.job_records(job_id)
    assert got == [failed, ok]  # commit order
    assert got[0].seq is not None and got[1].seq is not None and got[0].seq < got[1].seq
    assert got[1].result.repeat_secs == ok.result.repeat_secs
    assert isinstance(got[1].result.repeat_secs, tuple)
    assert got[1].config["pack_b"] is True and got[1].config["MR"] == 6
    assert got[1].created_at.tzinfo is not None and got[1].created_at.utcoffset() == timedelta(0)
    assert got[0].median_secs is None and got[0].result.error == failed.result.error
    assert got[0].status is MeasureStatus.WRONG_ANSWER
    assert got[1].request.target == CPU and got[1].request.target.toolchain == CPU.toolchain


def test_records_come_in_commit_order_by_uid_within_a_commit(store: ScheduleStore) -> None:
    late = record(1e-3, created_at=T0 + timedelta(minutes=5))
    early = record(2e-3, created_at=T0 - timedelta(minutes=5))
    same_a = record(3e-3, created_at=T0)
    same_b = record(4e-3, created_at=T0)
    store.commit_records([late, same_a])
    store.commit_records([early])
    store.commit_records([same_b])
    got = store.records_for(workload_key=SQUARE.key, target_key=CPU.target_key)
    first = sorted([late.uid, same_a.uid])
    assert [r.uid for r in got] == [*first, early.uid, same_b.uid]
    seqs = [r.seq for r in got]
    assert all(s is not None for s in seqs) and seqs == sorted(seqs)  # type: ignore[type-var]


def test_job_records_page_by_seq(store: ScheduleStore) -> None:
    job_id = new_job(store)
    records = [record(1e-3 * (i + 1), job_id=job_id) for i in range(5)]
    for r in records:
        store.commit_records([r])
    store.commit_records([record(1e-3)])  # another job's (none): not in the pages
    every = store.job_records(job_id)
    assert [r.uid for r in every] == [r.uid for r in records]
    page = store.job_records(job_id, limit=2)
    assert [r.uid for r in page] == [r.uid for r in records[:2]]
    rest = store.job_records(job_id, after=page[-1].seq)
    assert [r.uid for r in rest] == [r.uid for r in records[2:]]
    assert store.job_records(job_id, after=every[-1].seq) == []
    assert store.count_job_records(job_id) == 5
    assert store.count_job_records(job_id, through=page[-1].seq) == 2
    with pytest.raises(JobNotFound):
        store.count_job_records(job_id + 1)


def test_only_verdicts_are_trials_and_tuning_time_adds_up(store: ScheduleStore) -> None:
    job_id = new_job(store)
    cancelled = record(None, job_id=job_id, status=MeasureStatus.CANCELLED)
    lost = record(None, job_id=job_id, status=MeasureStatus.WORKER_ERROR)
    timeout = record(None, job_id=job_id, status=MeasureStatus.TIMEOUT)
    store.commit_records([cancelled, lost, timeout], tuning_secs={job_id: 1.5})
    job = store.get_job(job_id)
    assert job.trials_done == 1 and job.tuning_secs == pytest.approx(1.5)
    assert store.count_job_records(job_id) == 3  # all are stored, for the record
    store.commit_records([], tuning_secs={job_id: 0.25})  # time with no record
    assert store.get_job(job_id).tuning_secs == pytest.approx(1.75)
    with pytest.raises(JobNotFound):
        store.commit_records([], tuning_secs={job_id + 5: 1.0})
    with pytest.raises(ValueError, match="tuning_secs"):
        store.commit_records([], tuning_secs={job_id: float("nan")})


def test_a_noisy_record_is_kept_with_its_reason_but_is_no_trial_and_no_schedule(
    store: ScheduleStore,
) -> None:
    job_id = new_job(store)
    reason = "did not settle in 4 attempts: 0.02s (only 0 of 9 repeats ran without waiting)"
    noisy = dataclasses.replace(
        record(None, job_id=job_id),
        result=MeasureResult(
            MeasureStatus.NOISY,
            error=reason,
            environment={"guard": {"attempts": 4, "tried": [{"median_secs": 0.02}]}},
        ),
    )
    store.commit_records([noisy])
    assert store.get_job(job_id).trials_done == 0
    assert store.get_schedule(workload_key=SQUARE.key, target_key=CPU.target_key) is None
    (back,) = store.job_records(job_id)
    assert back.status is MeasureStatus.NOISY and back.median_secs is None
    assert back.result.error == reason and back.result.environment["guard"]["attempts"] == 4
    ok = record(5e-3, job_id=job_id)
    store.commit_records([ok])
    schedule = store.get_schedule(workload_key=SQUARE.key, target_key=CPU.target_key)
    assert schedule is not None and schedule.record_uid == ok.uid
    assert store.get_job(job_id).trials_done == 1


def test_family_records_span_workloads_and_targets_of_the_family(store: ScheduleStore) -> None:
    here = record(2e-3, target=CPU)
    sibling_tall = record(1e-3, target=CPU_NEW_CC, workload=TALL)
    other_template = record(1e-3, target=CPU, template="triton.gemm")
    stranger = record(1e-3, target=OTHER_CPU)
    newer = dataclasses.replace(
        record(1e-3, target=CPU), request=dataclasses.replace(here.request, template_version=4)
    )
    for r in (here, sibling_tall, other_template, stranger, newer):
        store.commit_records([r])
    found = store.family_records(family_key=CPU.family_key, template="blis.gemm")
    assert [r.uid for r in found] == [here.uid, sibling_tall.uid, newer.uid]
    v3 = store.family_records(family_key=CPU.family_key, template="blis.gemm", template_version=3)
    assert [r.uid for r in v3] == [here.uid, sibling_tall.uid]
    latest = store.family_records(family_key=CPU.family_key, template="blis.gemm", limit=2)
    assert [r.uid for r in latest] == [sibling_tall.uid, newer.uid]


def test_records_for_filters_by_target_and_template(store: ScheduleStore) -> None:
    mine = record(1e-3, template="blis.gemm")
    other_template = record(1e-3, template="triton.gemm")
    other_target = record(1e-3, target=OTHER_CPU)
    other_workload = record(1e-3, workload=TALL)
    store.commit_records([mine, other_template, other_target, other_workload])

    def uids(**kw: Any) -> set[str]:
        return {r.uid for r in store.records_for(**kw)}

    assert uids(workload_key=SQUARE.key, target_key=CPU.target_key) == {
        mine.uid,
        other_template.uid,
    }
    assert uids(workload_key=SQUARE.key, target_key=CPU.target_key, template="blis.gemm") == {
        mine.uid
    }
    assert uids(workload_key=SQUARE.key, target_key=OTHER_CPU.target_key) == {other_target.uid}
    assert uids(workload_key="0" * 64, target_key=CPU.target_key) == set()


def test_commit_records_for_an_unknown_job_stores_nothing(store: ScheduleStore) -> None:
    job_id = new_job(store)
    with pytest.raises(JobNotFound):
        store.commit_records([record(1e-3, job_id=job_id), record(1e-3, job_id=job_id + 99)])
    assert store.job_records(job_id) == []
    assert store.get_job(job_id).trials_done == 0
    assert store.get_schedule(workload_key=SQUARE.key, target_key=CPU.target_key) is None


def test_commit_records_refuses_naive_times_and_bad_uids(store: ScheduleStore) -> None:
    with pytest.raises(ValueError, match="created_at"):
        store.commit_records([record(1e-3, created_at=datetime(2024, 1, 1))])
    with pytest.raises(ValueError, match="uid"):
        store.commit_records([record(1e-3, uid="x" * 33)])
    with pytest.raises(ValueError, match="template"):
        store.commit_records([record(1e-3, template="t" * 65)])
    nan = record(1e-3)
    nan.result.environment["clock_mhz"] = float("nan")
    with pytest.raises(ValueError, match="environment"):
        store.commit_records([record(2e-3), nan])
    assert store.records_for(workload_key=SQUARE.key, target_key=CPU.target_key) == []


def test_values_that_do_not_fit_the_columns_are_refused(store: ScheduleStore) -> None:
    with pytest.raises(ValueError, match=r"target\.name"):
        store.put_target(Target(kind="cpu", name="n" * 257, arch=(), cores=1))
    store.put_target(CPU)
    with pytest.raises(ValueError, match="seed"):
        store.create_job(JobSpec(workload=SQUARE, target_key=CPU.target_key, seed=2**63))
    assert store.count_jobs() == 0
    job = store.create_job(JobSpec(workload=SQUARE, target_key=CPU.target_key, seed=-(2**63)))
    assert store.get_job(job.id).spec.seed == -(2**63)


def test_returned_records_are_snapshots(store: ScheduleStore) -> None:
    mine = record(1e-3)
    store.commit_records([mine])
    mine.result.environment["host"] = "changed after commit"
    got = store.records_for(workload_key=SQUARE.key, target_key=CPU.target_key)[0]
    assert got.result.environment["host"] == "node-1"
    got.result.environment["host"] = "changed after read"
    again = store.records_for(workload_key=SQUARE.key, target_key=CPU.target_key)[0]
    assert again.result.environment["host"] == "node-1"


# --- job best and schedules ------------------------------------------------------------------
def test_job_best_follows_the_fastest_ok_record(store: ScheduleStore) -> None:
    job_id = new_job(store)
    slow, fast, slower = record(3e-3, job_id=job_id), record(1e-3, job_id=job_id), record(5e-3)
    store.commit_records([slow])
    assert store.get_job(job_id).best_record_uid == slow.uid
    store.commit_records([record(None, job_id=job_id), fast])
    job = store.get_job(job_id)
    assert (job.best_record_uid, job.best_median_secs) == (fast.uid, fast.median_secs)
    assert job.best_gflops == pytest.approx(SQUARE.gflops(1e-3))
    store.commit_records([record(2e-3, job_id=job_id), slower])
    assert store.get_job(job_id).best_record_uid == fast.uid
    failed_only = new_job(store, seed=1)
    store.commit_records([record(None, job_id=failed_only)])
    assert store.get_job(failed_only).best_record_uid is None


def test_schedule_moves_only_to_faster_ok_records(store: ScheduleStore) -> None:
    keys = {"workload_key": SQUARE.key, "target_key": CPU.target_key}
    store.commit_records([record(None), record(None, status=MeasureStatus.TIMEOUT)])
    assert store.get_schedule(**keys) is None  # failures never make a schedule

    first = record(2e-3, config={"MR": 4, "NR": 8})
    store.commit_records([first])
    schedule = store.get_schedule(**keys)
    assert schedule is not None
    assert (schedule.record_uid, schedule.config, schedule.template_version) == (
        first.uid,
        Config({"MR": 4, "NR": 8}),
        3,
    )
    assert schedule.median_secs == first.median_secs
    assert schedule.gflops == pytest.approx(SQUARE.gflops(2e-3))
    assert schedule.updated_at.utcoffset() == timedelta(0)

    tie = MeasureRecord(request=first.request, result=first.result)
    store.commit_records([record(3e-3), tie, record(None)])
    assert store.get_schedule(**keys) == schedule  # slower, equal and failed change nothing

    batch = [record(1.5e-3), record(0.5e-3, config={"MR": 8, "NR": 8}), record(0.9e-3)]
    store.commit_records(batch)
    moved = store.get_schedule(**keys)
    assert moved is not None and moved.record_uid == batch[1].uid
    assert moved.config == Config({"MR": 8, "NR": 8}) and moved.median_secs == pytest.approx(5e-4)


def test_a_newer_template_version_takes_the_schedule_even_if_slower(
    store: ScheduleStore,
) -> None:
    keys = {"workload_key": SQUARE.key, "target_key": CPU.target_key}

    def versioned(secs: float, version: int) -> MeasureRecord:
        r = record(secs)
        request = dataclasses.replace(r.request, template_version=version)
        return dataclasses.replace(r, request=request)

    store.commit_records([versioned(1e-3, 1)])
    newer = versioned(2e-3, 2)  # slower, but v1 configs may not build under v2
    store.commit_records([newer])
    got = store.get_schedule(**keys)
    assert got is not None and (got.record_uid, got.template_version) == (newer.uid, 2)
    store.commit_records([versioned(0.5e-3, 1)])  # an older version never comes back
    got = store.get_schedule(**keys)
    assert got is not None and got.record_uid == newer.uid
    faster = versioned(1.5e-3, 2)
    store.commit_records([faster])
    got = store.get_schedule(**keys)
    assert got is not None and got.record_uid == faster.uid


def test_get_schedule_over_templates_or_one(store: ScheduleStore) -> None:
    keys = {"workload_key": SQUARE.key, "target_key": CPU.target_key}
    blis, triton = record(2e-3, template="blis.gemm"), record(1e-3, template="triton.gemm")
    store.commit_records([blis, triton])
    best = store.get_schedule(**keys)
    assert best is not None and best.record_uid == triton.uid
    only_blis = store.get_schedule(**keys, template="blis.gemm")
    assert only_blis is not None and only_blis.record_uid == blis.uid
    assert store.get_schedule(**keys, template="nope.gemm") is None
    assert store.get_schedule(workload_key=TALL.key, target_key=CPU.target_key) is None


def test_family_schedules_cover_targets_of_the_family_fastest_first(store: ScheduleStore) -> None:
    here = record(2e-3, target=CPU)
    sibling = record(1e-3, target=CPU_NEW_CC)
    sibling_triton = record(0.5e-3, target=CPU_NEW_CC, template="triton.gemm")
    stranger = record(0.1e-3, target=OTHER_CPU)
    other_shape = record(0.1e-3, target=CPU, workload=TALL)
    store.commit_records([here, sibling, sibling_triton, stranger, other_shape])
    assert CPU.family_key == CPU_NEW_CC.family_key != OTHER_CPU.family_key

    found = store.family_schedules(workload_key=SQUARE.key, family_key=CPU.family_key)
    assert [s.record_uid for s in found] == [sibling_triton.uid, sibling.uid, here.uid]
    blis = store.family_schedules(
        workload_key=SQUARE.key, family_key=CPU.family_key, template="blis.gemm"
    )
    assert [(s.target_key, s.record_uid) for s in blis] == [
        (CPU_NEW_CC.target_key, sibling.uid),
        (CPU.target_key, here.uid),
    ]
    assert store.family_schedules(workload_key=SQUARE.key, family_key="f" * 64) == []


def test_family_lookup_reads_the_schedules_and_the_familys_baselines(
    store: ScheduleStore,
) -> None:
    here, sibling = record(2e-3, target=CPU), record(1e-3, target=CPU_NEW_CC)
    stranger = record(0.1e-3, target=OTHER_CPU)
    store.commit_records([here, sibling, stranger])
    own = record(3e-3, template="numpy.matmul", config={"threads": 1})
    other_family = record(3e-3, template="numpy.matmul", target=OTHER_CPU, config={"threads": 1})
    other_shape = record(3e-3, template="numpy.matmul", workload=TALL, config={"threads": 1})
    for baseline in (own, other_family, other_shape):
        store.commit_baseline(baseline)

    schedules, baselines = store.family_lookup(workload_key=SQUARE.key, family_key=CPU.family_key)
    assert schedules == store.family_schedules(workload_key=SQUARE.key, family_key=CPU.family_key)
    assert [s.record_uid for s in schedules] == [sibling.uid, here.uid]
    assert [(b.uid, b.median_secs, b.request.target.target_key) for b in baselines] == [
        (own.uid, own.median_secs, CPU.target_key)
    ]
    only = store.family_lookup(
        workload_key=SQUARE.key, family_key=CPU.family_key, template="triton.gemm"
    )
    assert only == ([], [])  # no schedule: the Baselines are not read
    # A Baseline with no schedule beside it (TALL) is not looked for.
    assert store.family_lookup(workload_key=TALL.key, family_key=CPU.family_key) == ([], [])


def test_target_schedules(store: ScheduleStore) -> None:
    square, tall = record(2e-3), record(1e-3, workload=TALL)
    triton = record(1e-3, template="triton.gemm")
    store.commit_records([square, tall, triton, record(1e-3, target=OTHER_CPU)])
    every = store.target_schedules(target_key=CPU.target_key)
    assert {s.record_uid for s in every} == {square.uid, tall.uid, triton.uid}
    blis = store.target_schedules(target_key=CPU.target_key, template="blis.gemm")
    assert {s.record_uid for s in blis} == {square.uid, tall.uid}


def test_concurrent_commits_of_overlapping_records(store: ScheduleStore) -> None:
    job_id = new_job(store)
    records = [record(1e-3 * (1 + i % 7), job_id=job_id) for i in range(40)]
    counts: list[int] = []
    start = threading.Barrier(4)

    def commit(batches: list[list[MeasureRecord]]) -> None:
        start.wait()
        counts.extend(store.commit_records(batch) for batch in batches)

    # Every thread commits every record, in its own order and batch sizes.
    plans = [
        [records[i : i + 5] for i in range(0, 40, 5)],
        [records[::-1][i : i + 8] for i in range(0, 40, 8)],
        [records[i::3] for i in range(3)],
        [records],
    ]
    threads = [threading.Thread(target=commit, args=(plan,)) for plan in plans]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sum(counts) == 40
    job = store.get_job(job_id)
    assert job.trials_done == 40
    assert job.best_median_secs == records[0].median_secs
    assert len(store.job_records(job_id)) == 40


# --- SQL only ----------------------------------------------------------------------------------
def test_commit_records_is_one_transaction(sql_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    store = SqlScheduleStore(sql_url)
    job_id = new_job(store)

    def fail(*_: object) -> None:
        raise RuntimeError("disk full while updating schedules")

    monkeypatch.setattr(SqlScheduleStore, "_update_schedules", fail)
    with pytest.raises(RuntimeError, match="disk full"):
        store.commit_records([record(1e-3, job_id=job_id, workload=TALL, target=OTHER_CPU)])
    monkeypatch.undo()
    assert store.job_records(job_id) == []
    assert store.get_job(job_id).trials_done == 0
    assert store.get_target(OTHER_CPU.target_key) is None
    assert store.get_workload(TALL.key) is None
    store.close()


@pytest.mark.postgres
def test_a_lookup_read_outlives_its_connections_being_killed(pg_store: SqlScheduleStore) -> None:
    """The lookup's reads skip the pool's liveness check (lookup_engine): a connection found
    dead is dropped with the pool's older ones and the read tried once more, so the caller
    never sees it."""
    store = pg_store
    store.commit_records([record(2e-3)])
    first = store.family_lookup(workload_key=SQUARE.key, family_key=CPU.family_key)
    assert [s.workload_key for s in first[0]] == [SQUARE.key]
    with store.engine.connect() as conn:  # every other backend of this database goes
        killed = conn.execute(
            text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        ).scalar_one()
    assert killed >= 1
    assert store.family_lookup(workload_key=SQUARE.key, family_key=CPU.family_key) == first


def test_baseline_is_the_latest_ok_library_time_per_config(store: ScheduleStore) -> None:
    keys = {"workload_key": SQUARE.key, "target_key": CPU.target_key}
    one, two = Config({"threads": 1}), Config({"threads": 2})
    assert store.get_baseline(**keys, template="numpy.matmul", config=one) is None
    first = record(2e-3, template="numpy.matmul", config={"threads": 1})
    assert store.commit_baseline(first) is True
    assert store.commit_baseline(first) is False  # same uid: a no-op
    second = record(1e-3, template="numpy.matmul", config={"threads": 2})
    failed = record(None, template="numpy.matmul", config={"threads": 1})
    store.commit_baseline(second)
    store.commit_baseline(failed)  # stored as a record, never as the baseline
    got = store.get_baseline(**keys, template="numpy.matmul", config=one)
    assert got is not None and got.uid == first.uid and got.median_secs == first.median_secs
    later = record(3e-3, template="numpy.matmul", config={"threads": 1})
    store.commit_baseline(later)  # latest wins: a library is measured, not tuned
    got = store.get_baseline(**keys, template="numpy.matmul", config=one)
    assert got is not None and got.uid == later.uid
    got2 = store.get_baseline(**keys, template="numpy.matmul", config=two)
    assert got2 is not None and got2.uid == second.uid
    assert store.get_baseline(**keys, template="mkl", config=one) is None
    cublas = record(5e-4, template="torch.matmul", config={"allow_tf32": True})
    store.commit_baseline(cublas)
    listed = store.list_baselines(**keys)
    assert [r.uid for r in listed] == [second.uid, later.uid, cublas.uid]
    assert [r.request.template for r in listed] == ["numpy.matmul", "numpy.matmul", "torch.matmul"]
    # Baselines never become schedules, and their records are history like any other.
    assert store.get_schedule(**keys) is None
    assert {r.uid for r in store.records_for(**keys)} == {
        first.uid,
        second.uid,
        failed.uid,
        later.uid,
        cublas.uid,
    }


def test_baselines_belong_to_no_job(store: ScheduleStore) -> None:
    job_id = new_job(store)
    with pytest.raises(ValueError, match="no job"):
        store.commit_baseline(record(1e-3, template="numpy.matmul", job_id=job_id))
    assert (
        store.get_baseline(
            workload_key=SQUARE.key,
            target_key=CPU.target_key,
            template="numpy.matmul",
            config=Config({"MR": 6, "NR": 16}),
        )
        is None
    )


# --- confirmations ---------------------------------------------------------------------------
def _confirmation(secs: float, **others: float) -> Confirmation:
    return Confirmation(
        median_secs=secs, spread=0.02, rounds=3, confirmed_at=T0, others=dict(others)
    )


def test_a_confirmation_moves_the_schedule_to_the_confirmed_winner(store: ScheduleStore) -> None:
    keys = {"workload_key": SQUARE.key, "target_key": CPU.target_key}
    fluke = record(1e-3, config={"MR": 4, "NR": 8})
    steady = record(1.2e-3, config={"MR": 6, "NR": 16})
    store.commit_records([fluke, steady])
    schedule = store.get_schedule(**keys)
    assert schedule is not None and schedule.record_uid == fluke.uid
    got = store.confirm_schedule(
        **keys,
        template="blis.gemm",
        candidates={fluke.uid, steady.uid},
        winner_uid=steady.uid,
        confirmation=_confirmation(1.19e-3, **{fluke.uid: 1.3e-3}),
    )
    assert got is not None and got.record_uid == steady.uid and got.config == steady.config
    assert got.median_secs == steady.median_secs
    assert got.confirmation is not None and got.confirmation.median_secs == 1.19e-3
    assert got.confirmation.others == {fluke.uid: 1.3e-3}
    assert store.get_schedule(**keys) == got
    # A faster record later moves the schedule and clears the confirmation.
    faster = record(0.5e-3, config={"MR": 8, "NR": 8})
    store.commit_records([faster])
    moved = store.get_schedule(**keys)
    assert moved is not None and moved.record_uid == faster.uid and moved.confirmation is None


def test_a_confirmation_never_overrides_a_schedule_that_moved_meanwhile(
    store: ScheduleStore,
) -> None:
    keys = {"workload_key": SQUARE.key, "target_key": CPU.target_key}
    a, b = record(1e-3, config={"MR": 4, "NR": 8}), record(1.1e-3)
    store.commit_records([a, b])
    other_job = record(0.5e-3, config={"MR": 8, "NR": 8})
    store.commit_records([other_job])
    got = store.confirm_schedule(
        **keys,
        template="blis.gemm",
        candidates={a.uid, b.uid},
        winner_uid=b.uid,
        confirmation=_confirmation(1.0e-3),
    )
    assert got is not None and got.record_uid == other_job.uid and got.confirmation is None
    failed = record(None)
    store.commit_records([failed])
    got = store.confirm_schedule(
        **keys,
        template="blis.gemm",
        candidates={other_job.uid, failed.uid},
        winner_uid=failed.uid,
        confirmation=_confirmation(1.0e-3),
    )
    assert got is not None and got.record_uid == other_job.uid  # a failed record never wins
    assert (
        store.confirm_schedule(
            workload_key=TALL.key,
            target_key=CPU.target_key,
            template="blis.gemm",
            candidates={a.uid},
            winner_uid=a.uid,
            confirmation=_confirmation(1.0e-3),
        )
        is None
    )


# --- targets and workers ---------------------------------------------------------------------
def _worker(worker_id: str, target: Target, at: datetime) -> Worker:
    return Worker(
        worker_id=worker_id,
        target_key=target.target_key,
        host="node-1",
        pid=42,
        kind="local",
        device="cpu",
        started_at=at,
        heartbeat_at=at,
        info={"capacity": 3},
    )


def test_workers_register_report_and_leave(store: ScheduleStore) -> None:
    with pytest.raises(ValueError, match="put_target"):
        store.register_worker(_worker("w1", CPU, T0))
    store.put_target(CPU)
    store.put_target(OTHER_CPU)
    store.register_worker(_worker("w1", CPU, T0))
    store.register_worker(_worker("w2", OTHER_CPU, T0 + timedelta(seconds=1)))
    assert [w.worker_id for w in store.list_workers()] == ["w1", "w2"]
    assert [w.worker_id for w in store.list_workers(target_key=CPU.target_key)] == ["w1"]
    later = T0 + timedelta(minutes=5)
    assert store.heartbeat_worker("w2", at=later) is True
    assert store.heartbeat_worker("nobody", at=later) is False
    live = store.list_workers(live_since=T0 + timedelta(minutes=1))
    assert [w.worker_id for w in live] == ["w2"] and live[0].heartbeat_at == later
    assert live[0].info == {"capacity": 3} and live[0].started_at == T0 + timedelta(seconds=1)
    # Registering again refreshes it but keeps when it started.
    store.register_worker(_worker("w1", CPU, later))
    again = store.list_workers(target_key=CPU.target_key)
    assert again[0].started_at == T0 and again[0].heartbeat_at == later
    store.remove_worker("w1")
    store.remove_worker("w1")
    assert [w.worker_id for w in store.list_workers()] == ["w2"]
    assert {t.target_key for t in store.list_targets()} == {CPU.target_key, OTHER_CPU.target_key}


def test_claim_job_only_for_the_given_targets(store: ScheduleStore) -> None:
    store.put_target(CPU)
    store.put_target(OTHER_CPU)
    for_other = store.create_job(JobSpec(workload=SQUARE, target_key=OTHER_CPU.target_key))
    for_cpu = store.create_job(JobSpec(workload=SQUARE, target_key=CPU.target_key))
    assert store.claim_job(target_keys=set()) is None
    got = store.claim_job(target_keys={CPU.target_key})
    assert got is not None and got.id == for_cpu.id
    assert store.claim_job(target_keys={CPU.target_key}) is None
    got = store.claim_job()
    assert got is not None and got.id == for_other.id


def test_times_are_utc_whatever_the_session_time_zone(pg_store: SqlScheduleStore) -> None:
    mine = record(1e-3)
    pg_store.commit_records([mine])
    url = pg_store.engine.url.update_query_dict({"options": "-c timezone=Asia/Kolkata"})
    other = SqlScheduleStore(url.render_as_string(hide_password=False))
    got = other.records_for(workload_key=SQUARE.key, target_key=CPU.target_key)
    assert got == [mine] and got[0].created_at.tzinfo is UTC
    other.close()


# --- the cost-model registry ---------------------------------------------------------------
def _model(family: str, template: str = "blis.gemm", version: int = 2, **kw: Any) -> ModelInfo:
    return ModelInfo(
        family_key=family,
        template=template,
        template_version=version,
        kind="xgboost",
        features="blis.gemm/1",
        records_used=kw.pop("records_used", 800),
        workloads_used=3,
        last_record_seq=kw.pop("last_record_seq", 10),
        created_at=T0,
        metrics={"spearman": 0.75, "top1_fraction": 0.93},
        target_label="cpu Test CPU 9000",
        **kw,
    )


def test_models_are_versioned_per_family_template_and_template_version(
    store: ScheduleStore,
) -> None:
    a1 = store.register_model(_model(CPU.family_key), b"artifact-1")
    a2 = store.register_model(_model(CPU.family_key, records_used=900), b"artifact-2" * 1000)
    other = store.register_model(_model(OTHER_CPU.family_key), b"x")
    newer_template = store.register_model(_model(CPU.family_key, version=3), b"y")
    assert (a1.version, a2.version, other.version, newer_template.version) == (1, 2, 1, 1)
    assert len({a1.id, a2.id, other.id, newer_template.id}) == 4
    assert a2.metrics == {"spearman": 0.75, "top1_fraction": 0.93}
    assert a2.created_at == T0 and a2.created_at.tzinfo is not None
    assert a2.label.endswith(" v2")
    latest = store.latest_model(family_key=CPU.family_key, template="blis.gemm", template_version=2)
    assert latest == a2
    assert store.latest_model(family_key="none", template="blis.gemm", template_version=2) is None
    assert [m.id for m in store.list_models()] == sorted(
        [a1.id, a2.id, other.id, newer_template.id], reverse=True
    )
    assert [m.version for m in store.list_models(family_key=CPU.family_key, limit=2)] == [1, 2]
    assert store.model_artifact(a2.id) == b"artifact-2" * 1000
    assert store.model_artifact(a1.id) == b"artifact-1"
    assert store.model_artifact(12345) is None


def test_the_gates_verdict_is_stored_and_only_accepted_models_are_in_use(
    store: ScheduleStore,
) -> None:
    key = {"family_key": CPU.family_key, "template": "blis.gemm", "template_version": 2}
    ungated = store.register_model(_model(CPU.family_key), b"a")
    good = store.register_model(_model(CPU.family_key, accepted=True, reason="accepted: x"), b"b")
    refused = store.register_model(
        _model(CPU.family_key, accepted=False, reason="refused: first pick 3.8% < 85%"), b"c"
    )
    assert (ungated.accepted, good.accepted, refused.accepted) == (None, True, False)
    assert refused.reason == "refused: first pick 3.8% < 85%"
    assert store.latest_model(**key) == refused, "the newest, whatever its verdict"
    assert store.latest_model(**key, accepted_only=True) == good, "the one in use"
    assert [m.accepted for m in store.list_models()] == [False, True, None]
    assert store.latest_model(**{**key, "template_version": 3}, accepted_only=True) is None


def test_count_family_records_counts_what_arrived_after_a_seq(store: ScheduleStore) -> None:
    first = [record(1.0, config={"MR": i}) for i in range(3)]
    store.commit_records(first)
    seq = max(r.seq or 0 for r in store.records_for(workload_key=SQUARE.key,
                                                   target_key=CPU.target_key))  # fmt: skip
    store.commit_records(
        [record(2.0, config={"MR": 9}, target=CPU_NEW_CC), record(1.0, target=OTHER_CPU)]
    )
    count = store.count_family_records
    assert count(family_key=CPU.family_key, template="blis.gemm") == 4
    assert count(family_key=CPU.family_key, template="blis.gemm", after=seq) == 1
    assert count(family_key=CPU.family_key, template="blis.gemm", template_version=9) == 0
    assert count(family_key=CPU.family_key, template="other") == 0


def test_models_that_do_not_fit_the_columns_are_refused(store: ScheduleStore) -> None:
    with pytest.raises(ValueError, match=r"model\.kind"):
        store.register_model(dataclasses.replace(_model(CPU.family_key), kind="k" * 40), b"")
