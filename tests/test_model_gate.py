"""The cost models' quality gate (issue 23): a model trained on records like the bad data of a
busy machine is registered refused and never used; one trained on good data passes, and
``/models`` shows both with the default's figures and the reason."""

from __future__ import annotations

import dataclasses
import math
import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.test_api import add_key
from tests.test_lookup_tiers import TEMPLATE, dataset_records, local_records
from tunehub.core import MeasureRecord, ModelInfo, Target, Workload, local_cpu_target, utc_now
from tunehub.cost_model.registry import (
    GATE_MIN_WORKLOADS,
    GlobalTrainer,
    ModelCache,
    Trainable,
    gate,
    train_global_model,
)
from tunehub.db import MemoryScheduleStore
from tunehub.service.app import create_app
from tunehub.service.settings import Settings
from tunehub.tuner.lookup import predict_schedule

UNSEEN = Workload(m=300, n=700, k=500)


def remeasured(records: list[MeasureRecord], *, bad: bool, seed: int = 0) -> list[MeasureRecord]:
    """``records`` measured again, later (the latest record of a config is the one a model
    learns). ``bad``: shaped like issue 23's busy machine: half of each workload's fastest
    configs (the multi-thread ones there, which share the cores with a build) stored as ``ok``
    at 30-100x their time, every repeat alike; the analytical default runs one thread and is
    left alone, as it was there."""
    rng = random.Random(seed)
    hit: set[str] = set()
    if bad:
        by_workload: dict[str, list[MeasureRecord]] = {}
        for r in records:
            if r.median_secs is not None:
                by_workload.setdefault(r.request.workload.key, []).append(r)
        for group in by_workload.values():
            req = group[0].request
            default = TEMPLATE.default_config(req.workload, req.target).key
            fast = sorted(group, key=lambda r: r.median_secs or 0.0)[: len(group) // 2]
            hit |= {r.uid for r in fast if r.config.key != default and rng.random() < 0.5}
    out = []
    for r in records:
        result = r.result
        if r.uid in hit:
            factor = rng.uniform(30, 100)
            result = dataclasses.replace(
                result, repeat_secs=tuple(s * factor for s in result.repeat_secs)
            )
        out.append(
            dataclasses.replace(
                r,
                uid=uuid.UUID(int=rng.getrandbits(128)).hex,  # the same run to run
                created_at=r.created_at + timedelta(days=1),
                result=result,
                seq=None,
            )
        )
    return out


@dataclass
class Gated:
    store: MemoryScheduleStore
    refused: ModelInfo  # v1: trained on the bad re-measurements
    accepted: ModelInfo  # v2: trained once they were measured again on a quiet machine
    source_with_only_the_refused: str  # what an unseen shape's lookup answered meanwhile
    target: Target  # the datasets' machine


@pytest.fixture(scope="module")
def gated() -> Gated:
    store = MemoryScheduleStore()
    # The records on the machine that measured them, whatever this one is: on another CPU
    # of the same family the analytical default may be another config (a Zen 5's 48 KiB L1
    # gives KC 512 where the datasets' Zen 4 gave 384), and the gate would compare a model
    # with a default whose time no record holds.
    good = dataset_records()
    target = good[0].request.target
    store.commit_records(remeasured(good, bad=True))
    refused = train_global_model(
        store, family_key=target.family_key, template=TEMPLATE.name, template_version=2
    )
    assert refused is not None
    answer = predict_schedule(store, UNSEEN, target, ModelCache(store))
    assert answer is not None
    store.commit_records(remeasured(good, bad=False, seed=1))  # uids apart from the first
    accepted = train_global_model(
        store, family_key=target.family_key, template=TEMPLATE.name, template_version=2
    )
    assert accepted is not None
    return Gated(store, refused, accepted, answer.source, target)


def test_a_model_trained_on_records_like_the_bad_data_is_refused(gated: Gated) -> None:
    m = gated.refused.metrics
    assert gated.refused.accepted is False
    assert gated.refused.reason.startswith("refused: first pick ")
    assert "< the default's" in gated.refused.reason
    # What issue 23 saw: a first pick far below the best and below the default's (0.07
    # against 0.73 on the datasets' records; with them relabelled for this machine's CPU the
    # figures moved with its caches, to an accepted 0.79 against 0.73 on a Zen 5 VM).
    assert m["compared_workloads"] >= GATE_MIN_WORKLOADS
    assert m["top1_geomean"] < 0.5 and m["top1_geomean"] < m["default_top1_geomean"]
    # Never used: an unseen shape got the analytical default meanwhile, not the model's pick.
    assert gated.source_with_only_the_refused == "default"


def test_a_model_trained_on_good_data_passes_and_is_used(gated: Gated) -> None:
    m = gated.accepted.metrics
    assert gated.accepted.accepted is True, gated.accepted.reason
    assert gated.accepted.reason.startswith("accepted: first pick ")
    assert m["top1_geomean"] >= m["default_top1_geomean"] and m["spearman"] > 0
    assert m["time_log2_error"] <= 2.0
    target = gated.target
    cache = ModelCache(gated.store)
    assert cache.latest(target.family_key, TEMPLATE.name, 2) == gated.accepted
    answer = predict_schedule(gated.store, UNSEEN, target, cache)
    assert answer is not None and answer.source == "predicted"
    assert answer.model_id == gated.accepted.id


def test_a_newer_refused_model_leaves_the_accepted_one_in_use() -> None:
    store = MemoryScheduleStore()
    local = local_cpu_target()
    store.commit_records(local_records(10)[:10])
    seq = max(
        r.seq or 0 for r in store.family_records(family_key=local.family_key, template="blis.gemm")
    )
    info = ModelInfo(
        family_key=local.family_key, template=TEMPLATE.name, template_version=2,
        kind="xgboost", features="blis.gemm/1", records_used=10, workloads_used=1,
        last_record_seq=seq, created_at=utc_now(),
    )  # fmt: skip
    good = store.register_model(dataclasses.replace(info, accepted=True, reason="accepted"), b"")
    store.register_model(dataclasses.replace(info, accepted=False, reason="refused: x"), b"")
    assert ModelCache(store).latest(local.family_key, TEMPLATE.name, 2) == good
    # Refused is not a reason to retrain at once: the trainer waits for new records.
    item = Trainable(local.family_key, TEMPLATE.name, 2)
    trainer = GlobalTrainer(store, lambda: [item])
    assert not trainer.due(item)
    # A model registered before the gate existed (its verdict unknown) is retrained now.
    store.register_model(info, b"")
    assert trainer.due(item)
    assert ModelCache(store).latest(local.family_key, TEMPLATE.name, 2) == good


@pytest.fixture
def client(gated: Gated, tmp_path: Path) -> Iterator[TestClient]:
    settings = Settings(home=tmp_path, run_jobs=False, train_models=False)
    with TestClient(create_app(settings, store=gated.store), base_url="http://127.0.0.1") as c:
        c.headers["X-API-Key"] = add_key(gated.store)
        yield c


def test_models_shows_the_active_model_and_the_refused_candidate(
    client: TestClient, gated: Gated
) -> None:
    page = client.get("/api/v1/models").json()
    assert [m["id"] for m in page["active"]] == [gated.accepted.id]
    newest, oldest = page["items"]
    assert (newest["id"], oldest["id"]) == (gated.accepted.id, gated.refused.id)
    assert (newest["accepted"], newest["active"]) == (True, True)
    assert (oldest["accepted"], oldest["active"]) == (False, False)
    assert oldest["reason"] == gated.refused.reason
    for shown, info in ((newest, gated.accepted), (oldest, gated.refused)):
        # the model's held-out figures, and the default's on the same workloads, apart
        assert shown["metrics"]["top1_geomean"] == pytest.approx(info.metrics["top1_geomean"])
        assert shown["default_metrics"]["top1_geomean"] == pytest.approx(
            info.metrics["default_top1_geomean"]
        )
        assert set(shown["default_metrics"]) == {"top1_geomean", "top1_fraction"}
    html = client.get("/models").text
    assert 'id="models-active"' in html and "Default / best" in html and "Reason" in html


@pytest.mark.parametrize(
    ("metrics", "missed"),
    [
        ({"compared_workloads": 1, "top1_geomean": 1.0, "default_top1_geomean": 0.5}, "fewer"),
        ({"compared_workloads": 5, "default_top1_geomean": 0.5, "spearman": 0.5}, "first pick"),
        (
            {"compared_workloads": 5, "top1_geomean": 0.9, "default_top1_geomean": 0.5,
             "spearman": -0.1, "time_log2_error": 0.5},
            "Spearman -0.100 <= 0",
        ),
        (
            {"compared_workloads": 5, "top1_geomean": 0.9, "default_top1_geomean": 0.5,
             "spearman": 0.4, "time_log2_error": math.log2(28)},
            "time error x28.0 > x4",
        ),
        (
            {"compared_workloads": 5, "top1_geomean": 0.9, "default_top1_geomean": 0.5,
             "spearman": math.nan, "time_log2_error": 0.5},
            "Spearman nan",
        ),
    ],
)  # fmt: skip
def test_the_gate_names_each_bar_missed(metrics: dict[str, float], missed: str) -> None:
    verdict = gate(metrics)
    assert not verdict.accepted and verdict.reason.startswith("refused: ")
    assert missed in verdict.reason


def test_the_gate_accepts_a_tie_with_the_default() -> None:
    metrics = {"compared_workloads": 2, "top1_geomean": 0.8, "default_top1_geomean": 0.8,
               "spearman": 0.1, "time_log2_error": 1.9}  # fmt: skip
    verdict = gate(metrics)
    assert verdict.accepted and "80.0% of the best >= the default's 80.0%" in verdict.reason


def test_a_job_after_a_refused_model_trains_no_stand_in_on_the_same_history() -> None:
    """transfer trains its own model from similar workloads when no global model is in use;
    not when the family's model was refused: it would learn from the same records."""
    from tunehub.core import JobSpec
    from tunehub.tuner import session_for_job
    from tunehub.tuner.model_strategy import TransferStrategy
    from tunehub.workers.replay import ReplayMeasurer

    store = MemoryScheduleStore()
    local = local_cpu_target()
    store.commit_records(local_records(60))
    spec = JobSpec(UNSEEN, local.target_key, strategy="transfer")

    def strategy() -> TransferStrategy:
        session = session_for_job(
            spec, store=store, measurer=ReplayMeasurer([]), target=local, job_id=None
        )
        assert isinstance(session.strategy, TransferStrategy)
        return session.strategy

    assert strategy().base is not None, "no model yet: a stand-in from similar workloads"
    seq = max(
        r.seq or 0 for r in store.family_records(family_key=local.family_key, template="blis.gemm")
    )
    refused = ModelInfo(
        family_key=local.family_key, template=TEMPLATE.name, template_version=2,
        kind="xgboost", features="blis.gemm/1", records_used=10, workloads_used=7,
        last_record_seq=seq, created_at=utc_now(), accepted=False, reason="refused: x",
    )  # fmt: skip
    store.register_model(refused, b"")
    after = strategy()
    assert after.base is None and after.context.model_refused.endswith("refused: x")
    assert after.ask(1) == [TEMPLATE.default_config(UNSEEN, local)], "the default first"
