"""JobRunner on the in-memory store with a replay measurer: outcomes, cancel, restart."""

from __future__ import annotations

import socket
import time

from tunehub.core import (
    Budget,
    JobSpec,
    JobState,
    MeasureRecord,
    MeasureRequest,
    MeasureResult,
    MeasureStatus,
    Target,
    Workload,
    local_cpu_target,
)
from tunehub.core.owner import process_owner
from tunehub.db import MemoryScheduleStore
from tunehub.kernels.registry import get_template
from tunehub.service.runner import JobRunner
from tunehub.workers.replay import ReplayMeasurer

WORKLOAD = Workload(m=48, n=40, k=32)


def replay_history(target: Target, secs: float | None = 1e-3) -> list[MeasureRecord]:
    """A time (or a failure) for every blis.gemm config of WORKLOAD, and numpy baselines."""
    template = get_template("blis.gemm")
    out = []
    for i, config in enumerate(template.space(WORKLOAD, target).points):
        if secs is None:
            result = MeasureResult(MeasureStatus.BUILD_ERROR, error="cc failed")
        else:
            t = secs * (1 + (i % 7) / 10)
            result = MeasureResult(MeasureStatus.OK, repeat_secs=(t, t))
        req = MeasureRequest(WORKLOAD, target, template.name, template.version, config)
        out.append(MeasureRecord(request=req, result=result))
    baseline = get_template("numpy.matmul")
    for config in baseline.space(WORKLOAD, target).points:
        req = MeasureRequest(WORKLOAD, target, baseline.name, baseline.version, config)
        out.append(
            MeasureRecord(request=req, result=MeasureResult(MeasureStatus.OK, repeat_secs=(2e-3,)))
        )
    return out


def submit(store: MemoryScheduleStore, target: Target, trials: int = 4) -> int:
    store.put_target(target)
    spec = JobSpec(
        workload=WORKLOAD,
        target_key=target.target_key,
        budget=Budget(max_trials=trials, max_secs=60),
    )
    return store.create_job(spec).id


def wait_finished(store: MemoryScheduleStore, job_id: int, timeout: float = 30) -> JobState:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = store.get_job(job_id).state
        if state.finished:
            return state
        time.sleep(0.02)
    raise TimeoutError(f"job {job_id} is {store.get_job(job_id).state}")


def test_runner_tunes_queued_jobs_to_success() -> None:
    target = local_cpu_target()
    store = MemoryScheduleStore()
    runner = JobRunner(store, lambda: ReplayMeasurer(replay_history(target)), poll_secs=0.01)
    job_id = submit(store, target)
    runner.start()
    try:
        assert wait_finished(store, job_id) is JobState.SUCCEEDED
    finally:
        runner.stop()
    job = store.get_job(job_id)
    assert job.trials_done == 4 and job.best_record_uid is not None
    assert (
        store.get_baseline(workload_key=WORKLOAD.key, target_key=target.target_key, threads=1)
        is not None
    )


def test_a_job_whose_every_trial_fails_is_failed_with_the_reason() -> None:
    target = local_cpu_target()
    store = MemoryScheduleStore()
    runner = JobRunner(store, lambda: ReplayMeasurer(replay_history(target, None)))
    job_id = submit(store, target, trials=3)
    job = store.claim_job()
    assert job is not None
    runner.run_job(job)
    job = store.get_job(job_id)
    assert job.state is JobState.FAILED and "no candidate measured ok" in job.error
    assert job.trials_done == 3


def test_a_job_for_another_machine_fails_clearly() -> None:
    target = local_cpu_target()
    other = Target(kind="cpu", name="Elsewhere", arch=("avx2",), cores=64)
    store = MemoryScheduleStore()
    runner = JobRunner(store, lambda: ReplayMeasurer([]))
    job_id = submit(store, other)
    job = store.claim_job()
    assert job is not None
    runner.run_job(job)
    job = store.get_job(job_id)
    assert job.state is JobState.FAILED
    assert "no worker here for target" in job.error and target.label in job.error


def test_cancel_stops_a_running_job_and_stays_cancelled() -> None:
    target = local_cpu_target()
    store = MemoryScheduleStore()
    job_id = submit(store, target, trials=1000)

    class SlowReplay(ReplayMeasurer):
        def measure(self, requests):  # type: ignore[no-untyped-def]
            time.sleep(0.02)
            return super().measure(requests)

    runner = JobRunner(store, lambda: SlowReplay(replay_history(target)), poll_secs=0.01)
    runner.start()
    try:
        deadline = time.monotonic() + 20
        while store.get_job(job_id).trials_done < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        store.set_job_state(job_id, JobState.CANCELLED, error="cancelled by request")
        time.sleep(0.3)
        done = store.get_job(job_id).trials_done
        time.sleep(0.2)
    finally:
        runner.stop()
    job = store.get_job(job_id)
    assert job.state is JobState.CANCELLED
    assert job.trials_done == done < 1000  # nothing measured after the cancel took effect


def test_stop_hands_the_job_back_and_a_new_runner_resumes_it() -> None:
    target = local_cpu_target()
    store = MemoryScheduleStore()
    job_id = submit(store, target, trials=12)
    history = replay_history(target)

    class SlowReplay(ReplayMeasurer):
        def measure(self, requests):  # type: ignore[no-untyped-def]
            time.sleep(0.02)
            return super().measure(requests)

    first = JobRunner(store, lambda: SlowReplay(history), poll_secs=0.01)
    first.start()
    deadline = time.monotonic() + 20
    while store.get_job(job_id).trials_done < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    first.stop()
    assert store.get_job(job_id).state is JobState.QUEUED  # handed back, not lost
    second = JobRunner(store, lambda: SlowReplay(history), poll_secs=0.01)
    second.start()  # requeues the interrupted job, then claims it again
    try:
        assert wait_finished(store, job_id) is JobState.SUCCEEDED
    finally:
        second.stop()
    records = store.job_records(job_id)
    assert len(records) == 12 == len({r.config.key for r in records})


def test_start_requeues_only_jobs_whose_process_is_gone() -> None:
    target = local_cpu_target()
    store = MemoryScheduleStore()
    dead, alive, remote = (submit(store, target) for _ in range(3))
    store.claim_job(owner=f"{socket.gethostname()}:999999999:1")  # no such pid
    store.claim_job(owner=process_owner())  # this very process, e.g. a tunehub tune
    store.claim_job(owner="some-other-host:1:1")
    runner = JobRunner(store, lambda: ReplayMeasurer([]))
    assert runner.requeue_orphans() == [dead]
    assert store.get_job(dead).state is JobState.QUEUED
    assert store.get_job(alive).state is JobState.RUNNING
    assert store.get_job(remote).state is JobState.RUNNING


def test_a_repeat_job_on_a_fully_measured_space_succeeds() -> None:
    target = local_cpu_target()
    store = MemoryScheduleStore()
    history = replay_history(target)
    runner = JobRunner(store, lambda: ReplayMeasurer(history))
    store.put_target(target)
    spec = JobSpec(
        workload=WORKLOAD,
        target_key=target.target_key,
        strategy="exhaustive",
        budget=Budget(max_trials=100_000, max_secs=600),
    )
    for _ in range(2):
        job_id = store.create_job(spec).id
        job = store.claim_job()
        assert job is not None
        runner.run_job(job)
        assert store.get_job(job_id).state is JobState.SUCCEEDED
    assert store.get_job(job_id).trials_done == 0  # nothing was left to measure
