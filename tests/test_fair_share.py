"""Fair share between keys (issue 27): the claim's order on every store, and a real runner
with a short time slice giving another key's first job the device after one slice."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from datetime import timedelta
from typing import Any

import pytest

from tests.test_runner import WORKLOAD, SlowReplay, replay_history, wait_for
from tunehub.core import (
    Budget,
    JobSpec,
    JobState,
    MeasureRecord,
    MeasureRequest,
    MeasureResult,
    MeasureStatus,
    Scope,
    Target,
    local_cpu_target,
)
from tunehub.core.apikey import new_api_key
from tunehub.core.fairshare import FairShare, OwnerQueue, job_slice_secs
from tunehub.core.records import utc_now
from tunehub.db import MemoryScheduleStore, ScheduleStore
from tunehub.service.runner import JobRunner
from tunehub.service.settings import Settings
from tunehub.workers.base import resolve
from tunehub.workers.replay import ReplayMeasurer


def make_key(store: ScheduleStore, name: str) -> int:
    _, prefix, digest = new_api_key()
    return store.create_api_key(prefix=prefix, secret_hash=digest, name=name, scope=Scope.WRITE).id


def submit(
    store: ScheduleStore, target: Target, key: int | None, trials: int = 4, priority: int = 0
) -> int:
    spec = JobSpec(
        workload=WORKLOAD,
        target_key=target.target_key,
        budget=Budget(max_trials=trials, max_secs=600),
    )
    return store.create_job(spec, api_key_id=key, priority=priority).id


def run_for(store: ScheduleStore, job_id: int, secs: float) -> None:
    """Mark ``job_id`` (claimed) as having tuned ``secs``, then end it."""
    store.commit_records([], tuning_secs={job_id: secs})
    store.set_job_state(job_id, JobState.SUCCEEDED)


def test_the_claim_goes_to_the_key_that_used_least_then_priority_then_age(
    store: ScheduleStore,
) -> None:
    target = local_cpu_target()
    store.put_target(target)
    a, b, c = make_key(store, "a"), make_key(store, "b"), make_key(store, "c")
    fair = FairShare()
    done = submit(store, target, a)  # a used 100 s, b 10 s; c nothing
    assert store.claim_job(fair_share=fair).id == done  # type: ignore[union-attr]
    run_for(store, done, 100.0)
    done = submit(store, target, b)
    assert store.claim_job(fair_share=fair).id == done  # type: ignore[union-attr]
    run_for(store, done, 10.0)
    a_jobs = [submit(store, target, a) for _ in range(3)]
    b_job = submit(store, target, b)
    c_low = submit(store, target, c, priority=-10)  # a lookup's job: after people's
    c_job = submit(store, target, c)
    none_job = submit(store, target, None)  # no key: an owner of its own, nothing used
    # Without fair share: priority, then age.
    order = [store.claim_job() for _ in range(2)]
    assert [j.id for j in order if j] == a_jobs[:2]
    for job in order:
        assert job is not None
        store.set_job_state(job.id, JobState.QUEUED)  # back of the queue
    claimed = []
    while (job := store.claim_job(fair_share=fair)) is not None:
        claimed.append(job.id)
    # c and no key (nothing used; c's person job, then the older) before b (10 s) before a
    # (100 s, and its own jobs in queue order: the two handed back are now the last), and
    # the lookup's job last. a's three have no time of their own: its share stays the same.
    assert claimed == [c_job, none_job, b_job, a_jobs[2], a_jobs[0], a_jobs[1], c_low]


def test_weights_scale_a_keys_share(store: ScheduleStore) -> None:
    target = local_cpu_target()
    store.put_target(target)
    a, b = make_key(store, "big"), make_key(store, "small")
    for key, secs in ((a, 300.0), (b, 100.0)):
        job = submit(store, target, key)
        assert store.claim_job().id == job  # type: ignore[union-attr]
        run_for(store, job, secs)
    a_job, b_job = submit(store, target, a), submit(store, target, b)
    plain = FairShare()
    assert store.claim_job(fair_share=plain).id == b_job  # type: ignore[union-attr]
    store.set_job_state(b_job, JobState.QUEUED)
    weighted = FairShare(weights={"big": 4.0})  # 300/4 < 100
    assert store.claim_job(fair_share=weighted).id == a_job  # type: ignore[union-attr]


def test_the_weights_setting_is_read_and_checked() -> None:
    settings = Settings(fair_share_weights="ci=0.5, alice=2", fair_share_window_secs=600)  # type: ignore[arg-type]
    assert settings.fair_share == FairShare(window_secs=600, weights={"ci": 0.5, "alice": 2.0})
    for bad in ("ci", "ci=0", "ci=x", "=2"):
        with pytest.raises(ValueError, match="fair_share_weights"):
            Settings(fair_share_weights=bad)  # type: ignore[arg-type]


def test_another_keys_first_job_starts_within_one_slice(store: ScheduleStore) -> None:
    """Key A queues 10 long jobs, then key B one: B's starts once A's first has had its
    slice, before any other of A's (it used to wait for all ten)."""
    target = local_cpu_target()
    store.put_target(target)
    history = replay_history(target)
    a, b = make_key(store, "a"), make_key(store, "b")
    a_jobs = [submit(store, target, a, trials=300) for _ in range(10)]
    b_job = submit(store, target, b, trials=3)
    slice_secs = 0.5
    runner = JobRunner(
        store, lambda: SlowReplay(history, target=target), poll_secs=0.01, slice_secs=slice_secs
    )
    start = time.monotonic()
    runner.start()
    try:
        wait_for(lambda: store.get_job(b_job).state is not JobState.QUEUED, 20)
        waited = time.monotonic() - start
        # Which of A's jobs had run by then (a job handed back keeps its tuning time).
        ran = [
            j
            for j in a_jobs
            if (job := store.get_job(j)).tuning_secs > 0 or job.state is JobState.RUNNING
        ]
        wait_for(lambda: store.get_job(b_job).state.finished, 20)
    finally:
        runner.stop()
        for job_id in a_jobs:
            if not store.get_job(job_id).state.finished:
                store.set_job_state(job_id, JobState.CANCELLED)
    assert store.get_job(b_job).state is JobState.SUCCEEDED
    assert ran == a_jobs[:1], f"A's jobs that ran before B's: {ran}"
    # One slice, plus the slice check's period and the hand-back (generous on a busy VM).
    assert waited < slice_secs + 3.0, f"B's job waited {waited:.2f}s"


def test_owner_queues_say_who_waits_and_whose_first_job_has_not_started(
    store: ScheduleStore,
) -> None:
    target = local_cpu_target()
    store.put_target(target)
    a, b, c = make_key(store, "a"), make_key(store, "b"), make_key(store, "c")
    jobs = {
        name: submit(store, target, key, priority=priority)
        for name, key, priority in (
            ("a1", a, 0), ("a2", a, 0), ("b1", b, 0), ("none", None, 0), ("b_low", b, -10),
            ("c1", c, 0), ("c2", c, 0),
        )
    }  # fmt: skip
    running = store.claim_job()  # a's first: running, no longer queued
    assert running is not None and running.id == jobs["a1"]
    store.set_job_state(jobs["a1"], JobState.QUEUED)  # handed back at its slice
    claimed = [store.claim_job(), store.claim_job(), store.claim_job()]
    assert [j.id for j in claimed if j] == [jobs["a2"], jobs["b1"], jobs["none"]]
    store.set_job_state(jobs["a2"], JobState.QUEUED)
    store.set_job_state(jobs["b1"], JobState.QUEUED)
    store.set_job_state(jobs["none"], JobState.SUCCEEDED)  # its only job ended: not waiting
    made = {name: store.get_job(job_id) for name, job_id in jobs.items()}
    keys = [target.target_key]
    since = utc_now() - timedelta(hours=1)

    def queues(**kw: Any) -> dict[int | None, OwnerQueue]:
        found = store.owner_queues(target_keys=keys, since=since, **kw)
        assert len({q.api_key_id for q in found}) == len(found)
        return {q.api_key_id: q for q in found}

    found = queues()
    assert set(found) == {a, b, c}  # no key's only job ended: it waits for nothing
    assert found[a] == OwnerQueue(a, 2, made["a1"].created_at, made["a2"].started_at)
    assert found[b] == OwnerQueue(b, 2, made["b1"].created_at, made["b1"].started_at)
    assert found[c] == OwnerQueue(c, 2, made["c1"].created_at, None)
    assert [k for k, q in found.items() if q.first_job_waits] == [c]
    assert queues(min_priority=0)[b].queued == 1  # b's lookup job left out
    # c's first job runs and ends: c has had its turn, its next job is no first job.
    c_first = store.claim_job(target_keys=keys)
    assert c_first is not None and c_first.id == jobs["c1"]
    store.set_job_state(jobs["c1"], JobState.SUCCEEDED)
    assert not queues()[c].first_job_waits
    # ... until its jobs that ran have ended before ``since``.
    later = utc_now() + timedelta(seconds=1)
    gone = {q.api_key_id: q for q in store.owner_queues(target_keys=keys, since=later)}
    assert gone[c].first_job_waits and not gone[a].first_job_waits
    assert store.owner_queues(target_keys=["no such target"], since=since) == []


def test_each_of_two_new_keys_first_job_starts_within_one_slice(store: ScheduleStore) -> None:
    """Key A queues 10 long jobs, then keys B and C one each. With the whole slice per job,
    C waited for A's slice and then B's; the slice is now divided between the keys waiting
    (a third each here), so A's first job is handed back after a part of its slice, B's job
    runs, and C's starts before the device has spent one slice on the others."""
    target = local_cpu_target()
    store.put_target(target)
    history = replay_history(target)
    a, b, c = make_key(store, "a"), make_key(store, "b"), make_key(store, "c")
    a_jobs = [submit(store, target, a, trials=300) for _ in range(10)]
    b_job = submit(store, target, b, trials=3)
    c_job = submit(store, target, c, trials=3)
    slice_secs = 3.0
    runner = JobRunner(
        store,
        lambda: SlowReplay(history, target=target),
        poll_secs=0.01,
        slice_secs=slice_secs,
        min_slice_secs=0.2,
    )
    runner.start()
    try:
        wait_for(lambda: store.get_job(c_job).state is not JobState.QUEUED, 30)
        # The device time each job had before C's started (a job handed back keeps it).
        before_c = {j: store.get_job(j).tuning_secs for j in [*a_jobs, b_job]}
        wait_for(lambda: store.get_job(c_job).state.finished, 30)
    finally:
        runner.stop()
        for job_id in a_jobs:
            if not store.get_job(job_id).state.finished:
                store.set_job_state(job_id, JobState.CANCELLED)
    assert store.get_job(c_job).state is JobState.SUCCEEDED
    ran = [j for j, secs in before_c.items() if secs > 0]
    assert ran == [a_jobs[0], b_job], f"jobs that ran before C's: {ran}"
    b_start, c_start = store.get_job(b_job).started_at, store.get_job(c_job).started_at
    assert b_start is not None and c_start is not None and b_start < c_start
    # A's first job was handed back after about a third of the slice, not the whole of it,
    # and the device spent less than one slice on A's and B's jobs before C's started.
    assert before_c[a_jobs[0]] < slice_secs / 2, before_c
    assert sum(before_c.values()) < slice_secs, before_c


def test_the_slice_is_shortened_only_while_other_keys_first_jobs_wait() -> None:
    t0 = utc_now()
    at: dict[str, Any] = {"started_at": t0, "slice_secs": 30.0, "min_slice_secs": 2.0}
    before = t0 - timedelta(seconds=60)
    own = OwnerQueue(1, 3, before, t0)
    had_turn = OwnerQueue(2, 5, before, before + timedelta(seconds=1))
    assert job_slice_secs([], own_key=1, **at) is None  # nothing waits: it runs on
    # Its own key's jobs, or keys that have had a turn since they queued: the whole slice.
    assert job_slice_secs([own, had_turn], own_key=1, **at) == 30.0
    # A key whose job ran and ended (its next job queued before that start) had its turn.
    assert not OwnerQueue(6, 2, before, t0).first_job_waits
    new = [OwnerQueue(k, 1, t0 + timedelta(seconds=k), None) for k in (3, 4, 5)]
    # Three first jobs, the oldest queued 3 s after this job started: 33 s left until it
    # has waited one slice, shared by this job, the two keys before the last, and a margin.
    assert job_slice_secs([own, had_turn, *new], own_key=1, **at) == pytest.approx(33 / 4)
    # A key that ran long ago and queued again (its last start before its oldest waiting job)
    # waits for its first job again.
    back = OwnerQueue(7, 1, t0 + timedelta(seconds=3), before)
    assert back.first_job_waits
    assert job_slice_secs([own, back], own_key=1, **at) == pytest.approx(33 / 2)
    # The first of them, started 10 s after t0: the other two's oldest queued at t0 + 4 s,
    # so 24 s left, shared by it, the one key before the last, and the margin.
    later = {**at, "started_at": t0 + timedelta(seconds=10)}
    assert job_slice_secs(new, own_key=3, **later) == pytest.approx(24 / 3)
    # Many keys at once: never below the floor.
    crowd = [OwnerQueue(k, 1, t0, None) for k in range(10, 40)]
    assert job_slice_secs(crowd, own_key=1, **at) == 2.0


class SlowToAnswer(ReplayMeasurer):
    """Answers ``slow`` template's requests only after ``secs`` (a trial, or the library
    baseline a new job measures first, on a busy machine): a cancel answers at once."""

    def __init__(self, history: list[MeasureRecord], target: Target, slow: str, secs: float):
        super().__init__(history, target=target)
        self.slow, self.secs = slow, secs

    def submit(self, request: MeasureRequest) -> Future[MeasureResult]:
        if request.template != self.slow:
            return super().submit(request)
        future: Future[MeasureResult] = Future()
        timer = threading.Timer(self.secs, lambda: resolve(future, self.answer(request)))
        timer.daemon = True
        timer.start()
        return future


def two_new_keys_behind_a_long_job(
    store: ScheduleStore, slow: str
) -> tuple[list[int], dict[int, float]]:
    """A queues 10 jobs, then B and C one each; every ``slow`` measurement takes longer than
    the whole slice. A's, B's and C's first jobs, and how long B and C waited for theirs."""
    target = local_cpu_target()
    store.put_target(target)
    history = replay_history(target)
    a, b, c = make_key(store, "a"), make_key(store, "b"), make_key(store, "c")
    a_jobs = [submit(store, target, a, trials=300) for _ in range(10)]
    firsts = [a_jobs[0], submit(store, target, b, trials=3), submit(store, target, c, trials=3)]
    slice_secs = 3.0
    runner = JobRunner(
        store,
        lambda: SlowToAnswer(history, target, slow, secs=slice_secs + 0.5),
        poll_secs=0.01,
        slice_secs=slice_secs,
        min_slice_secs=0.2,
    )
    runner.start()
    try:
        wait_for(lambda: store.get_job(firsts[2]).state is not JobState.QUEUED, 30)
    finally:
        runner.stop()
    waited = {}
    for job_id in firsts[1:]:
        job = store.get_job(job_id)
        assert job.started_at is not None
        waited[job_id] = (job.started_at - job.created_at).total_seconds()
    return firsts, waited


def test_two_new_keys_start_within_one_slice_though_a_trial_takes_longer(
    store: ScheduleStore,
) -> None:
    """Each trial takes longer than the slice: A's and B's jobs used to hand back only once
    their trial in flight was stored, so C waited two trials. Their slices now end at once,
    the trial cut short: stored ``cancelled`` (no verdict), measured again when they resume."""
    (a_job, b_job, _), waited = two_new_keys_behind_a_long_job(store, "blis.gemm")
    assert all(secs < 3.0 for secs in waited.values()), waited
    for job_id in (a_job, b_job):
        # Its trial in flight, if it got to ask one before its share was over (a busy VM).
        records = store.job_records(job_id)
        assert {r.status for r in records} <= {MeasureStatus.CANCELLED}, records
        assert store.get_job(job_id).state is JobState.QUEUED  # to resume from its records


def test_two_new_keys_start_within_one_slice_though_the_baseline_takes_longer() -> None:
    """The library baseline a new job measures before its first trial takes longer than the
    slice (on the busy VM the guard re-measured it 1, 3 and 9 s later, and the slice check
    was not asked meanwhile): now a pause stops it, to be measured by the job's next run."""
    store = MemoryScheduleStore()
    (a_job, _, _), waited = two_new_keys_behind_a_long_job(store, "numpy.matmul")
    assert all(secs < 3.0 for secs in waited.values()), waited
    assert store.get_job(a_job).state is JobState.QUEUED
    assert store.job_records(a_job) == []
