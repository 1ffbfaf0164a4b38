"""Strategies and the Session loop, on the in-memory store and the replay measurer."""

from __future__ import annotations

import random

import pytest

from tunehub.core import (
    Budget,
    Config,
    JobSpec,
    JobState,
    MeasureRecord,
    MeasureRequest,
    MeasureResult,
    MeasureStatus,
    Target,
    Workload,
    core_strategies,
)
from tunehub.db import MemoryScheduleStore
from tunehub.kernels.space import Knob, SearchSpace
from tunehub.tuner import STRATEGIES, ExhaustiveStrategy, RandomStrategy, Session, make_strategy
from tunehub.workers.replay import ReplayMeasurer

TARGET = Target(kind="cpu", name="Test CPU", arch=("avx2",), cores=2)
WORKLOAD = Workload(m=64, n=64, k=64)
TEMPLATE = "blis.gemm"


def small_space() -> SearchSpace:
    return SearchSpace(
        knobs=(Knob("MR", (2, 4, 6, 8)), Knob("NR", (4, 8, 16))),
        constraints=(lambda c: int(c["MR"]) * int(c["NR"]) <= 64,),
    )


def history(space: SearchSpace) -> list[MeasureRecord]:
    """One stored record per config: time falls with MR*NR; MR=6 configs fail to build."""
    records = []
    for config in space.points:
        if config["MR"] == 6:
            result = MeasureResult(MeasureStatus.BUILD_ERROR, error="no")
        else:
            secs = 1.0 / (int(config["MR"]) * int(config["NR"]))
            result = MeasureResult(MeasureStatus.OK, repeat_secs=(secs, secs * 1.1, secs * 0.9))
        request = MeasureRequest(WORKLOAD, TARGET, TEMPLATE, 1, config)
        records.append(MeasureRecord(request=request, result=result))
    return records


class _Template:
    name = TEMPLATE
    version = 1


def make_session(store: MemoryScheduleStore, budget: Budget, job_id: int | None, **kw: object):
    space = small_space()
    return Session(
        store=store,
        measurer=ReplayMeasurer(history(space)),
        template=_Template(),  # type: ignore[arg-type]
        strategy=kw.pop("strategy", None) or RandomStrategy(space, seed=3),  # type: ignore[arg-type]
        workload=WORKLOAD,
        target=TARGET,
        budget=budget,
        job_id=job_id,
        **kw,  # type: ignore[arg-type]
    )


def new_job(store: MemoryScheduleStore, budget: Budget) -> int:
    store.put_target(TARGET)
    spec = JobSpec(workload=WORKLOAD, target_key=TARGET.target_key, budget=budget)
    return store.create_job(spec).id


def test_core_and_tuner_agree_on_strategy_names() -> None:
    assert set(core_strategies) == set(STRATEGIES)


def test_exhaustive_visits_every_point_once_in_order() -> None:
    space = small_space()
    strategy = ExhaustiveStrategy(space)
    seen = []
    while batch := strategy.ask(3):
        seen.extend(batch)
    assert seen == list(space.points)
    assert all(space.is_valid(c) for c in seen)


def test_random_is_a_seeded_permutation() -> None:
    space = small_space()

    def drain(seed: int) -> list[Config]:
        s = RandomStrategy(space, seed=seed)
        out = []
        while batch := s.ask(2):
            out.extend(batch)
        return out

    a, b, c = drain(1), drain(1), drain(2)
    assert a == b
    assert sorted(x.key for x in a) == sorted(x.key for x in space.points)
    assert a != c


def test_tell_keeps_told_configs_out_of_ask() -> None:
    space = small_space()
    records = history(space)[:4]
    strategy = make_strategy("random", space, seed=0)
    strategy.tell(records)
    asked = strategy.ask(100)
    assert len(asked) == len(space) - 4
    assert not {r.config.key for r in records} & {c.key for c in asked}


def test_unknown_strategy_names_the_known_ones() -> None:
    with pytest.raises(KeyError, match="exhaustive, random"):
        make_strategy("annealing", small_space())


def test_session_stops_at_max_trials_and_stores_the_fastest() -> None:
    store = MemoryScheduleStore()
    budget = Budget(max_trials=5, max_secs=60)
    job_id = new_job(store, budget)
    result = make_session(store, budget, job_id).run()
    assert result.stopped_by == "max_trials"
    assert result.trials_done == 5
    records = store.job_records(job_id)
    assert len(records) == 5
    assert len({r.config.key for r in records}) == 5
    ok = [r for r in records if r.status is MeasureStatus.OK]
    fastest = min(ok, key=lambda r: r.median_secs or 0)
    assert result.best is not None and result.best.uid == fastest.uid
    schedule = store.get_schedule(workload_key=WORKLOAD.key, target_key=TARGET.target_key)
    assert schedule is not None and schedule.record_uid == fastest.uid
    assert store.get_job(job_id).trials_done == 5


def test_session_exhausts_a_small_space_and_finds_the_optimum() -> None:
    store = MemoryScheduleStore()
    budget = Budget(max_trials=1000, max_secs=60)
    result = make_session(store, budget, new_job(store, budget)).run()
    assert result.stopped_by == "exhausted"
    assert result.trials_done == len(small_space())
    assert result.best is not None
    assert int(result.best.config["MR"]) * int(result.best.config["NR"]) == 64


def test_session_resumes_from_stored_records_without_repeats() -> None:
    store = MemoryScheduleStore()
    budget = Budget(max_trials=8, max_secs=60)
    job_id = new_job(store, budget)
    make_session(store, Budget(max_trials=3, max_secs=60), job_id).run()
    # A new Session (as after a restart) with a fresh strategy of the same seed goes on.
    result = make_session(store, budget, job_id).run()
    records = store.job_records(job_id)
    assert result.trials_done == 8
    assert len(records) == 8
    assert len({r.config.key for r in records}) == 8


def test_a_second_job_measures_only_configs_the_first_did_not() -> None:
    store = MemoryScheduleStore()
    budget = Budget(max_trials=5, max_secs=60)
    first = new_job(store, budget)
    make_session(store, budget, first).run()
    second = new_job(store, budget)
    result = make_session(store, budget, second).run()
    assert result.trials_done == 5
    one = {r.config.key for r in store.job_records(first)}
    two = {r.config.key for r in store.job_records(second)}
    assert len(one) == len(two) == 5 and not one & two
    # The Schedule is the best of both jobs.
    everything = store.job_records(first) + store.job_records(second)
    fastest = min((r for r in everything if r.median_secs), key=lambda r: r.median_secs or 0)
    schedule = store.get_schedule(workload_key=WORKLOAD.key, target_key=TARGET.target_key)
    assert schedule is not None and schedule.record_uid == fastest.uid


def test_session_stops_when_asked() -> None:
    store = MemoryScheduleStore()
    budget = Budget(max_trials=100, max_secs=60)
    job_id = new_job(store, budget)
    calls = []

    def stop() -> bool:
        calls.append(1)
        return len(calls) > 2

    result = make_session(store, budget, job_id, should_stop=stop, batch_size=1).run()
    assert result.stopped_by == "cancelled"
    assert result.trials_done == 2
    assert store.get_job(job_id).state is JobState.QUEUED  # the session never touches state


def test_prior_configs_come_first_and_only_once() -> None:
    space = small_space()
    prior = [Config({"MR": 8, "NR": 8}), Config({"MR": 8, "NR": 16})]  # the second is invalid
    strategy = make_strategy("random", space, seed=5, prior=prior)
    first, *rest = strategy.ask(len(space) + 5)
    assert first == prior[0]
    assert prior[0] not in rest and prior[1] not in rest
    assert len(rest) == len(space) - 1


class _Baseline:
    name = "numpy.matmul"
    version = 1


def baseline_history() -> list[MeasureRecord]:
    out = []
    for threads, secs in ((1, 0.05), (2, 0.03)):
        req = MeasureRequest(WORKLOAD, TARGET, "numpy.matmul", 1, Config({"threads": threads}))
        out.append(
            MeasureRecord(request=req, result=MeasureResult(MeasureStatus.OK, repeat_secs=(secs,)))
        )
    return out


def test_session_measures_each_missing_baseline_once() -> None:
    store = MemoryScheduleStore()
    budget = Budget(max_trials=2, max_secs=60)
    space = SearchSpace(
        knobs=(Knob("MR", (2, 4, 8)), Knob("NR", (4, 8)), Knob("threads", (1, 2))),
    )
    measurer = ReplayMeasurer([*history(small_space()), *baseline_history()])

    def session() -> Session:
        return Session(
            store=store,
            measurer=measurer,
            template=_Template(),  # type: ignore[arg-type]
            strategy=RandomStrategy(space),
            workload=WORKLOAD,
            target=TARGET,
            budget=budget,
            job_id=new_job(store, budget),
            baseline=_Baseline(),  # type: ignore[arg-type]
        )

    first = session()
    assert first.baseline_threads() == (1, 2)
    first.run()
    keys = {"workload_key": WORKLOAD.key, "target_key": TARGET.target_key}
    one = store.get_baseline(**keys, threads=1)
    two = store.get_baseline(**keys, threads=2)
    assert one is not None and one.median_secs == 0.05
    assert two is not None and two.median_secs == 0.03
    asked = [r.template for r in measurer.requests]
    assert asked.count("numpy.matmul") == 2
    session().run()  # stored now: not measured again
    assert [r.template for r in measurer.requests].count("numpy.matmul") == 2


def test_random_strategy_space_sample_is_valid() -> None:
    space = small_space()
    sample = space.sample(random.Random(0), 5)
    assert len({c.key for c in sample}) == 5
    assert all(space.is_valid(c) for c in sample)
