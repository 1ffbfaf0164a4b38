"""The nearest tuned workloads of an untuned shape (``NeighbourIndex``): the same answers as
reading every schedule and sorting on ``workload_distance`` (the implementation it replaced,
kept in benchmarks/neighbour_search.py as the reference), on every store; and kept fresh by
the change feed."""

from __future__ import annotations

import dataclasses
import importlib.util
import random
import time
from pathlib import Path
from types import ModuleType

import pytest
from fastapi.testclient import TestClient

from tunehub.core import (
    Config,
    MeasureRecord,
    MeasureRequest,
    MeasureResult,
    MeasureStatus,
    Target,
    Workload,
    local_cpu_target,
)
from tunehub.core.workload import DTYPES, EPILOGUES, LAYOUTS
from tunehub.db import MemoryScheduleStore, ScheduleStore
from tunehub.kernels.registry import get_template
from tunehub.service.app import create_app
from tunehub.service.lookup_cache import LookupCache
from tunehub.service.settings import Settings
from tunehub.tuner.lookup import CHECK_NEIGHBOURS, NeighbourIndex
from tunehub.tuner.model_strategy import workload_distance

BENCHMARK = Path(__file__).resolve().parents[1] / "benchmarks" / "neighbour_search.py"
TEMPLATE = get_template("blis.gemm")
# Few sizes, so that many workloads are as far from a query as each other (ties).
DIMS = (16, 24, 32, 48, 64, 100, 128, 256, 1000)


def _load_benchmark() -> ModuleType:
    spec = importlib.util.spec_from_file_location("neighbour_search", BENCHMARK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The implementation NeighbourIndex replaced (every schedule read, every distance in Python, a
# stable sort over the store's order), kept once, in the benchmark that times the two.
scan_winners = _load_benchmark().scan_winners


def record(
    target: Target, workload: Workload, config: dict[str, int], secs: float, version: int
) -> MeasureRecord:
    req = MeasureRequest(workload, target, TEMPLATE.name, version, Config(config))
    return MeasureRecord(request=req, result=MeasureResult(MeasureStatus.OK, (secs, secs)))


def random_workload(rng: random.Random) -> Workload:
    odd = rng.random() < 0.3  # mostly the common kind: more ties among near shapes
    return Workload(
        m=rng.choice(DIMS),
        n=rng.choice(DIMS),
        k=rng.choice(DIMS),
        dtype=rng.choice(DTYPES) if odd else "float32",
        a_layout=rng.choice(LAYOUTS) if odd else "row_major",
        b_layout=rng.choice(LAYOUTS) if odd else "row_major",
        epilogue=rng.choice(EPILOGUES) if rng.random() < 0.3 else "none",
    )


def other_target() -> Target:
    return dataclasses.replace(local_cpu_target(), name="another cpu")


@pytest.mark.parametrize("seed", [1, 2])
def test_same_winners_as_the_full_scan_on_random_tuned_sets(
    store: ScheduleStore, seed: int
) -> None:
    rng = random.Random(seed)
    local, other = local_cpu_target(), other_target()
    store.put_target(local)
    store.put_target(other)
    tuned = list({w.key: w for w in (random_workload(rng) for _ in range(300))}.values())
    records = []
    for i, w in enumerate(tuned):
        # Few distinct configs (shared by many schedules); some of another template version
        # or only on another target, which must not count.
        config = {"MR": rng.choice((4, 6, 8)), "NR": rng.choice((4, 8, 16)), "i": i % 7}
        roll = rng.random()
        version = TEMPLATE.version if roll > 0.1 else TEMPLATE.version - 1
        target = local if roll < 0.9 else other
        records.append(record(target, w, config, rng.uniform(1e-4, 1e-2), version))
    store.commit_records(records)
    index = NeighbourIndex(store)
    queries = [random_workload(rng) for _ in range(150)] + tuned[:50]  # tuned: excluded
    ties = 0
    for q in queries:
        expected = scan_winners(store, q, local, TEMPLATE)
        assert index.winners(q, local, TEMPLATE) == expected, q
        d = sorted(workload_distance(w, q) for w in tuned if w.key != q.key)
        ties += d[CHECK_NEIGHBOURS - 1] == d[CHECK_NEIGHBOURS]
    assert index.builds == 1  # read once, searched 200 times
    assert ties > 20  # the cut falls inside a tie often: the order among ties is tested


def test_few_or_no_tuned_workloads(store: ScheduleStore) -> None:
    local = local_cpu_target()
    store.put_target(local)
    index = NeighbourIndex(store)
    one = Workload(m=64, n=64, k=64)
    assert index.winners(one, local, TEMPLATE) == []
    store.commit_records([record(local, one, {"MR": 4}, 1e-3, TEMPLATE.version)])
    fresh = NeighbourIndex(store)
    assert fresh.winners(one, local, TEMPLATE) == []  # only itself: excluded
    assert fresh.winners(Workload(m=8, n=8, k=8), local, TEMPLATE) == [Config({"MR": 4})]


def test_forget_patches_new_changed_and_faster_schedules_in(store: ScheduleStore) -> None:
    rng = random.Random(7)
    local = local_cpu_target()
    store.put_target(local)
    tuned = list({w.key: w for w in (random_workload(rng) for _ in range(60))}.values())
    store.commit_records(
        [record(local, w, {"MR": 4, "i": i}, 1e-3, TEMPLATE.version) for i, w in enumerate(tuned)]
    )
    index = NeighbourIndex(store)
    query = Workload(m=300, n=300, k=300)
    assert index.winners(query, local, TEMPLATE) == scan_winners(store, query, local, TEMPLATE)

    near = Workload(m=256, n=256, k=320)
    store.commit_records([record(local, near, {"MR": 8}, 1e-3, TEMPLATE.version)])
    assert Config({"MR": 8}) not in index.winners(query, local, TEMPLATE)  # not told yet
    index.forget({near.key})
    assert index.winners(query, local, TEMPLATE)[0] == Config({"MR": 8})
    # A faster record of the same workload changes its schedule's config.
    store.commit_records([record(local, near, {"MR": 6}, 1e-4, TEMPLATE.version)])
    index.forget({near.key, tuned[0].key})
    assert index.winners(query, local, TEMPLATE)[0] == Config({"MR": 6})
    for q in [query, *tuned[:20], *(random_workload(rng) for _ in range(40))]:
        assert index.winners(q, local, TEMPLATE) == scan_winners(store, q, local, TEMPLATE)
    assert (index.builds, index.patches) == (1, 2)
    index.forget(None)  # "any workload": read whole again
    assert index.winners(query, local, TEMPLATE)[0] == Config({"MR": 6})
    assert index.builds == 2


def test_the_change_feed_reader_tells_the_index(store: ScheduleStore) -> None:
    local = local_cpu_target()
    store.put_target(local)
    store.commit_records(
        [record(local, Workload(m=16, n=16, k=16), {"MR": 4}, 1e-3, TEMPLATE.version)]
    )
    index = NeighbourIndex(store)
    cache = LookupCache(max_entries=0, refresh_secs=60)  # answers off; the feed still read
    cache.start(store, on_changes=[index.forget])
    try:
        query = Workload(m=300, n=300, k=300)
        assert index.winners(query, local, TEMPLATE) == [Config({"MR": 4})]
        store.commit_records(
            [record(local, Workload(m=256, n=256, k=256), {"MR": 8}, 1e-3, TEMPLATE.version)]
        )
        cache.refresh()
        assert index.winners(query, local, TEMPLATE) == [Config({"MR": 8}), Config({"MR": 4})]
        assert index.patches == 1
    finally:
        cache.stop()


def test_the_service_keeps_one_index_fresh_from_its_feed(tmp_path: Path) -> None:
    store = MemoryScheduleStore()
    local = local_cpu_target()
    store.put_target(local)
    store.commit_records(
        [record(local, Workload(m=16, n=16, k=16), {"MR": 4}, 1e-3, TEMPLATE.version)]
    )
    settings = Settings(
        home=tmp_path,
        run_jobs=False,
        train_models=False,
        lookup_cache_entries=0,
        lookup_refresh_secs=0.05,
    )
    app = create_app(settings, store=store)
    with TestClient(app, base_url="http://127.0.0.1"):
        index: NeighbourIndex = app.state.neighbours
        query = Workload(m=300, n=300, k=300)
        assert index.winners(query, local, TEMPLATE) == [Config({"MR": 4})]
        store.commit_records(
            [record(local, Workload(m=256, n=256, k=256), {"MR": 8}, 1e-3, TEMPLATE.version)]
        )
        deadline = time.monotonic() + 5
        while index.winners(query, local, TEMPLATE)[0] != Config({"MR": 8}):
            assert time.monotonic() < deadline, "the feed never told the index"
            time.sleep(0.05)
