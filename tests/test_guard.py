"""The trust guard: its decisions on attempts, and the session that acts on them (in-memory
doubles: a live replay measurer answering each attempt afresh, the memory store)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tunehub.core import (
    Budget,
    Capabilities,
    Config,
    JobSpec,
    MeasureRequest,
    MeasureResult,
    MeasureStatus,
    Target,
    Workload,
)
from tunehub.cost_model.xgb import XGBCostModel
from tunehub.db import MemoryScheduleStore
from tunehub.kernels.base import Artifact, Template, TimingPolicy
from tunehub.kernels.machine import gpu_state
from tunehub.kernels.space import Knob, SearchSpace
from tunehub.tuner import ExhaustiveStrategy, Session, StoreHistory, StrategyContext
from tunehub.tuner.guard import (
    GuardPolicy,
    References,
    disturbance,
    far_off,
    judge,
)
from tunehub.workers.replay import ReplayMeasurer

TARGET = Target(kind="cpu", name="Guard CPU", arch=("avx2",), cores=2)
WORKLOAD = Workload(m=64, n=64, k=64)
NO_WAIT = GuardPolicy(retry_after_secs=(0.0,))


def machine(wait: float, cores: int = 2, **more: Any) -> dict[str, Any]:
    return {"machine": {"cores": list(range(cores)), "wait_share": wait, **more}}


QUIET = machine(0.01)
BUSY = machine(0.7, others_share=0.6)


def ok(secs: float, env: dict[str, Any] | None = None) -> MeasureResult:
    return MeasureResult(MeasureStatus.OK, repeat_secs=(secs,), environment=env or dict(QUIET))


# --- the decisions -----------------------------------------------------------------------------
def test_threads_that_waited_for_a_cpu_disturb_a_timing_on_every_core() -> None:
    assert disturbance(ok(1.0, machine(0.01))) is None
    reason = disturbance(ok(1.0, machine(0.3, others_share=0.5)))
    assert reason is not None and "30%" in reason and "50%" in reason
    # One thread survives waits (its median skips the preempted repeats), not most of the time.
    assert disturbance(ok(1.0, machine(0.3, cores=1))) is None
    assert disturbance(ok(1.0, machine(0.7, cores=1))) is not None
    assert "stole" in (disturbance(ok(1.0, machine(0.0, steal_share=0.3))) or "")
    gpu = machine(0.0, cores=1, gpu_after={"clock_reasons": ["sw_power_cap", "hw_slowdown"]})
    assert "hw_slowdown" in (disturbance(ok(1.0, gpu)) or "")
    # The power cap alone is the kernel's own doing; no machine state: nothing to judge.
    assert disturbance(ok(1.0, machine(0.0, gpu_after={"clock_reasons": ["sw_power_cap"]}))) is None
    assert disturbance(ok(1.0, {})) is None
    # Watched only around a whole run (a template that does not watch its timing): recorded.
    assert disturbance(ok(1.0, machine(0.9, scope="run"))) is None


def test_where_each_repeat_is_known_the_median_must_be_a_clean_repeats() -> None:
    # Beside a busy process the repeats are either clean (every thread on its CPU: the
    # config's speed) or far slower; the median is a clean one's when most are clean.
    mostly_clean = machine(0.7, others_share=0.7, clean_repeats=6, repeats=10)
    assert disturbance(ok(1.0, mostly_clean)) is None
    half = machine(0.7, clean_repeats=5, repeats=10)
    assert "only 5 of 10 repeats" in (disturbance(ok(1.0, half)) or "")
    # Threads that slept (passive OpenMP waiting) while nothing else wanted the cores: clean.
    assert disturbance(ok(1.0, machine(0.0, clean_repeats=0, repeats=3))) is None


def test_far_off_is_slower_than_the_config_the_model_or_the_neighbours_say() -> None:
    assert far_off(2.0, References(same_config_secs=(1.0, 1.1))) is not None
    assert far_off(1.3, References(same_config_secs=(1.0,))) is None
    assert far_off(0.1, References(same_config_secs=(1.0,))) is None  # faster: never suspect
    assert "model" in (far_off(5.0, References(predicted_secs=1.0)) or "")
    assert "3 measured neighbour" in (far_off(50.0, References(neighbour_secs=(1, 2, 3))) or "")
    assert far_off(3.0, References(neighbour_secs=(1.0,))) is None


def test_a_clean_timing_is_accepted_at_once() -> None:
    decision = judge([ok(1.0)], References(same_config_secs=(1.1,)))
    assert decision.action == "accept" and decision.result.median_secs == 1.0
    assert decision.result.environment["guard"] == {"attempts": 1}


def test_a_disturbed_timing_is_retried_then_the_clean_one_is_kept() -> None:
    first = judge([ok(50.0, BUSY)], References())
    assert first.action == "retry" and "waited for a CPU" in first.reason
    assert first.retry_after_secs == GuardPolicy().retry_after_secs[0]
    second = judge([ok(50.0, BUSY), ok(1.0)], References())
    assert second.action == "accept" and second.result.median_secs == 1.0
    notes = second.result.environment["guard"]
    assert notes["attempts"] == 2 and "waited for a CPU" in notes["reason"]
    assert [t.get("disturbed") is not None for t in notes["tried"]] == [True, False]


def test_a_timing_that_never_settles_is_noisy_with_its_reason_and_no_time() -> None:
    results = [ok(50.0, BUSY)] * 4
    decision = judge(results, References())
    assert decision.action == "noisy"
    noisy = decision.result
    assert noisy.status is MeasureStatus.NOISY and noisy.repeat_secs == ()
    assert not noisy.status.verdict
    assert noisy.error.startswith("did not settle in 4 attempts") and "waited" in noisy.error
    assert [t["median_secs"] for t in noisy.environment["guard"]["tried"]] == [50.0] * 4


def test_a_clean_but_far_off_time_is_kept_once_a_second_clean_one_agrees() -> None:
    refs = References(neighbour_secs=(1.0, 1.2))
    assert judge([ok(10.0)], refs).action == "retry"  # 10x its neighbours: measured again
    assert judge([ok(10.0), ok(10.5)], refs).action == "accept"  # it is that slow
    assert judge([ok(10.0), ok(30.0)], refs).action == "retry"  # the two disagree
    assert judge([ok(10.0), ok(1.1)], refs).action == "accept"  # the second is not far off
    assert judge([ok(10.0), ok(30.0), ok(20.0), ok(40.0)], refs).action == "noisy"


def test_failures_are_verdicts_the_guard_passes_on() -> None:
    failed = MeasureResult(MeasureStatus.WRONG_ANSWER, error="mismatch")
    assert judge([failed], References()).result.status is MeasureStatus.WRONG_ANSWER
    # A failure on a re-measure is the verdict, with the earlier attempts noted.
    decision = judge([ok(50.0, BUSY), failed], References())
    assert decision.action == "accept" and decision.result.status is MeasureStatus.WRONG_ANSWER
    assert decision.result.environment["guard"]["attempts"] == 2


# --- the session -------------------------------------------------------------------------------
class ToyTemplate(Template):
    """Answered by the measurer double: only its name and space matter."""

    name = "toy.guarded"
    version = 1

    def capabilities(self, target: Target) -> Capabilities:
        return Capabilities(kinds=("cpu",))

    def space(self, workload: Workload, target: Target) -> SearchSpace:
        return SearchSpace(knobs=(Knob("MR", (2, 4, 6, 8)), Knob("threads", (1, 2))))

    def default_config(self, workload: Workload, target: Target) -> Config:
        return Config({"MR": 2, "threads": 1})

    def build(self, request: MeasureRequest, *, build_dir: Path) -> Artifact:
        raise NotImplementedError

    def run(
        self, request: MeasureRequest, artifact: Artifact, *, timing: TimingPolicy
    ) -> MeasureResult:
        raise NotImplementedError


TEMPLATE = ToyTemplate()


def speed(config: Config) -> float:
    """The config's true time: MR 8 with 2 threads is the fastest."""
    return 1.0 / (int(config["MR"]) * int(config["threads"]))


Script = Callable[[Config, int], MeasureResult]


def measurer(script: Script) -> tuple[ReplayMeasurer, dict[str, int]]:
    """A live measurer: the n-th attempt (from 1) at a config answers ``script(config, n)``."""
    calls: dict[str, int] = defaultdict(int)

    def answer(request: MeasureRequest) -> MeasureResult:
        calls[request.config.key] += 1
        return script(request.config, calls[request.config.key])

    return ReplayMeasurer([], fallback=answer, live=True, capacity=3), calls


def session(
    store: MemoryScheduleStore, script: Script, **kw: Any
) -> tuple[Session, dict[str, int], int]:
    budget = kw.pop("budget", Budget(max_trials=8, max_secs=120))
    store.put_target(TARGET)
    spec = JobSpec(
        workload=WORKLOAD, target_key=TARGET.target_key, template=TEMPLATE.name, budget=budget
    )
    job = store.create_job(spec)
    history = StoreHistory(store, WORKLOAD, TARGET, TEMPLATE.name, 1, exclude_job=job.id)
    ctx = StrategyContext(
        space=TEMPLATE.space(WORKLOAD, TARGET),
        workload=WORKLOAD,
        target=TARGET,
        template=TEMPLATE,
        history=history,
        cost_model=kw.pop("cost_model", None),
    )
    double, calls = measurer(script)
    kw.setdefault("guard_policy", NO_WAIT)
    kw.setdefault("confirm_top", 0)
    made = Session(
        store=store,
        measurer=double,
        template=TEMPLATE,
        strategy=ExhaustiveStrategy(ctx),
        workload=WORKLOAD,
        target=TARGET,
        budget=budget,
        job_id=job.id,
        history=history,
        **kw,
    )
    return made, calls, job.id


def busy_first(times: int) -> Script:
    """Two-thread configs are timed beside a busy process for their first ``times`` attempts:
    30x slow and disturbed, then clean."""

    def script(config: Config, n: int) -> MeasureResult:
        if config["threads"] == 2 and n <= times:
            return ok(30 * speed(config), BUSY)
        return ok(speed(config))

    return script


def test_a_session_remeasures_disturbed_timings_and_stores_the_settled_ones() -> None:
    store = MemoryScheduleStore()
    run, calls, job = session(store, busy_first(1))
    result = run.run()
    assert result.stopped_by == "max_trials" and result.trials_done == 8
    records = store.job_records(job)
    assert {r.status for r in records} == {MeasureStatus.OK} and len(records) == 8
    for record in records:  # every stored time is the config's own
        assert record.median_secs == pytest.approx(speed(record.config))
        retried = record.config["threads"] == 2
        assert calls[record.config.key] == (2 if retried else 1)
        assert record.result.environment["guard"]["attempts"] == (2 if retried else 1)
    schedule = store.get_schedule(workload_key=WORKLOAD.key, target_key=TARGET.target_key)
    assert schedule is not None and schedule.config == Config({"MR": 8, "threads": 2})


def test_noisy_records_never_win_count_become_a_schedule_or_train_a_model() -> None:
    store = MemoryScheduleStore()
    # The 2-thread configs (the fastest) never get a quiet machine.
    run, calls, job = session(store, busy_first(99))
    result = run.run()
    records = store.job_records(job)
    noisy = [r for r in records if r.status is MeasureStatus.NOISY]
    assert {r.config["threads"] for r in noisy} == {2} and len(noisy) == 4
    # Each was measured as often as the guard allows, once: a noisy config is not asked again.
    assert all(calls[r.config.key] == GuardPolicy().max_attempts for r in noisy)
    assert all(r.median_secs is None and "did not settle" in r.result.error for r in noisy)
    # Not trials: of the 8-trial budget, the four 1-thread configs are all that counted.
    assert result.stopped_by == "exhausted"
    assert result.trials_done == 4 and store.get_job(job).trials_done == 4
    assert result.best is not None and result.best.config["threads"] == 1
    schedule = store.get_schedule(workload_key=WORKLOAD.key, target_key=TARGET.target_key)
    assert schedule is not None and schedule.config == Config({"MR": 8, "threads": 1})
    # Nothing of them reaches a history, a model's training rows, or a later job's skip list.
    history = StoreHistory(store, WORKLOAD, TARGET, TEMPLATE.name, 1)
    assert all(r.status is not MeasureStatus.NOISY for r in history.records())
    model = XGBCostModel(TEMPLATE.name)
    model.fit(records)
    assert model.records_used == 4


def test_a_confirmation_round_that_does_not_settle_drops_its_config() -> None:
    store = MemoryScheduleStore()
    confirming = {"on": False}

    runner_up = Config({"MR": 6, "threads": 2})

    def script(config: Config, n: int) -> MeasureResult:
        # In the confirmation the runner-up is always timed beside a busy process.
        if confirming["on"] and config == runner_up:
            return ok(30 * speed(config), BUSY)
        return ok(speed(config))

    def progress(_: object) -> None:
        confirming["on"] = len(store.job_records(job)) >= 8

    run, _, job = session(store, script, confirm_top=3, on_progress=progress)
    result = run.run()
    assert result.confirmation is not None and len(result.confirmation.others) == 1
    noisy = [r for r in store.job_records(job) if r.status is MeasureStatus.NOISY]
    assert [r.config for r in noisy] == [runner_up]
    assert "did not settle" in noisy[0].result.error
    schedule = store.get_schedule(workload_key=WORKLOAD.key, target_key=TARGET.target_key)
    assert schedule is not None and schedule.config == Config({"MR": 8, "threads": 2})
    assert schedule.confirmation == result.confirmation


def test_what_has_not_settled_when_the_job_stops_is_stored_noisy() -> None:
    store = MemoryScheduleStore()
    policy = GuardPolicy(retry_after_secs=(30.0,))
    run, _, job = session(
        store, busy_first(99), budget=Budget(max_trials=8, max_secs=1.0), guard_policy=policy
    )
    result = run.run()
    assert result.stopped_by == "max_secs"
    noisy = [r for r in store.job_records(job) if r.status is MeasureStatus.NOISY]
    assert noisy and all("the job stopped (max_secs)" in r.result.error for r in noisy)


def test_a_machine_too_busy_to_time_stops_the_job_with_the_reason() -> None:
    store = MemoryScheduleStore()
    always = lambda config, n: ok(30 * speed(config), BUSY)  # noqa: E731
    run, _, _ = session(store, always, max_noisy_in_a_row=3)
    result = run.run()
    assert result.stopped_by == "noisy" and result.trials_done == 0
    assert "too busy to time" in result.error and "waited for a CPU" in result.error


def test_a_replay_is_not_remeasured() -> None:
    # A replay's answers were judged when they were measured; asking again repeats them.
    store = MemoryScheduleStore()
    run, calls, job = session(store, busy_first(99))
    run.measurer._live = False  # type: ignore[attr-defined]
    run.run()
    assert set(calls.values()) == {1}
    assert all(r.status is MeasureStatus.OK for r in store.job_records(job))


def test_a_gpu_timing_records_clocks_and_why_nvml_lowered_them() -> None:
    class FakeNvml:
        NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0

        def nvmlInit(self) -> None: ...
        def nvmlShutdown(self) -> None: ...
        def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
            return index

        def nvmlDeviceGetClockInfo(self, handle: int, kind: int) -> int:
            return 1410 if kind == self.NVML_CLOCK_SM else 2619

        def nvmlDeviceGetMaxClockInfo(self, handle: int, kind: int) -> int:
            return 1980

        def nvmlDeviceGetTemperature(self, handle: int, kind: int) -> int:
            return 81

        def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[object]:
            return []

        def nvmlDeviceGetCurrentClocksEventReasons(self, handle: int) -> int:
            return 0x4 | 0x40  # power cap, hardware thermal slowdown

    state = gpu_state(0, nvml=FakeNvml())
    assert state["sm_clock_mhz"] == 1410 and state["max_sm_clock_mhz"] == 1980
    assert state["clock_reasons"] == ["sw_power_cap", "hw_thermal_slowdown"]
    timed = ok(1.0, {"machine": {"cores": [0], "wait_share": 0.0, "gpu_after": state}})
    assert "hw_thermal_slowdown" in (disturbance(timed) or "")
    assert gpu_state(0, nvml=object()) == {}  # an NVML that cannot start: nothing recorded
