"""ReplayMeasurer: answers from stored records, latest first; unknown configs are invalid."""

from __future__ import annotations

from datetime import timedelta

from tunehub.core import (
    Config,
    MeasureRecord,
    MeasureRequest,
    MeasureResult,
    MeasureStatus,
    Target,
    Workload,
)
from tunehub.workers.replay import NOT_IN_HISTORY, ReplayMeasurer

TARGET = Target(kind="cpu", name="Test CPU", arch=("avx2",), cores=2)
WORKLOAD = Workload(m=64, n=64, k=64)


def request(mr: int, workload: Workload = WORKLOAD, template: str = "blis.gemm") -> MeasureRequest:
    return MeasureRequest(workload, TARGET, template, 1, Config({"MR": mr, "NR": 16}))


def ok(secs: float) -> MeasureResult:
    return MeasureResult(MeasureStatus.OK, repeat_secs=(secs, secs))


def test_answers_in_order_and_marks_unknown_configs_invalid() -> None:
    records = [
        MeasureRecord(request(4), ok(2.0)),
        MeasureRecord(request(6), MeasureResult(MeasureStatus.BUILD_ERROR, error="no")),
    ]
    replay = ReplayMeasurer(records)
    asked = [request(6), request(8), request(4), request(4, Workload(m=65, n=64, k=64))]
    futures = [replay.submit(r) for r in asked]
    assert all(f.done() for f in futures)  # answered at once
    results = [f.result() for f in futures]
    assert [r.status for r in results] == [
        MeasureStatus.BUILD_ERROR,
        MeasureStatus.INVALID,
        MeasureStatus.OK,
        MeasureStatus.INVALID,  # same config, other workload
    ]
    assert results[1].error == NOT_IN_HISTORY
    assert results[2].median_secs == 2.0
    assert replay.requests == asked
    assert request(4) in replay and request(8) not in replay and len(replay) == 2


def test_latest_record_wins_and_fallback_answers_the_rest() -> None:
    old = MeasureRecord(request(4), ok(3.0))
    new = MeasureRecord(request(4), ok(1.0), created_at=old.created_at + timedelta(seconds=1))
    replay = ReplayMeasurer([new, old], fallback=lambda req: ok(float(req.config["MR"])))
    assert [r.median_secs for r in replay.measure([request(4), request(9)])] == [1.0, 9.0]
    replay.add([MeasureRecord(request(9), ok(0.5), created_at=new.created_at)])
    assert replay.measure([request(9)])[0].median_secs == 0.5


def test_machine_failures_are_not_answers() -> None:
    lost = MeasureRecord(request(4), MeasureResult(MeasureStatus.WORKER_ERROR, error="lost"))
    replay = ReplayMeasurer([lost], capacity=4)
    assert request(4) not in replay and replay.capacity == 4
    assert replay.measure([request(4)])[0].status is MeasureStatus.INVALID
