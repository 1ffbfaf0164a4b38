"""Bounded work per request (issue 27): a keyless batch of 1,000 never-seen shapes with a
trained model answers within its limit and leaves nothing running, and keyless requests have
their own rate limit per client address."""

from __future__ import annotations

import random
import time
from pathlib import Path

import httpx
from fastapi.testclient import TestClient

from tests.live import ServedApp
from tests.test_lookup_tiers import trained_store  # noqa: F401 - the module's fixture
from tunehub.db import MemoryScheduleStore
from tunehub.service.app import create_app
from tunehub.service.settings import Settings


def test_a_keyless_batch_of_1000_new_shapes_answers_in_time_and_leaves_no_work(
    trained_store: MemoryScheduleStore,  # noqa: F811
    tmp_path: Path,
) -> None:
    rng = random.Random(27)
    items = [
        {"workload": {"m": rng.randint(8, 8192), "n": rng.randint(8, 8192), "k": 8 + i}}
        for i in range(1000)
    ]
    settings = Settings(home=tmp_path, run_jobs=False, train_models=False)
    with ServedApp(create_app(settings, store=trained_store)) as served:
        with httpx.Client(base_url=served.url, timeout=60) as client:
            # The model loaded and the tuned set read, as a running service has them.
            client.post("/api/v1/schedules/lookup", json={"items": items[:1]})
            start = time.perf_counter()
            answer = client.post("/api/v1/schedules/lookup", json={"items": items[1:]})
            took = time.perf_counter() - start
        assert answer.status_code == 200
        results = answer.json()["results"]
        assert len(results) == 999 and all(r["ok"] for r in results)
        assert {r["schedule"]["source"] for r in results} == {"predicted"}
        # About a second on the quiet 2-core VM; before issue 27, minutes.
        assert took < 10, f"the batch took {took:.1f}s"
        cpu = time.process_time()
        time.sleep(1.0)
        busy = time.process_time() - cpu
    assert busy < 0.3, f"{busy:.2f}s of CPU in the second after the answer"


def test_keyless_requests_are_limited_per_address_with_retry_after(tmp_path: Path) -> None:
    settings = Settings(
        home=tmp_path,
        run_jobs=False,
        train_models=False,
        keyless_requests_per_sec=1,
        keyless_burst=3,
    )
    store = MemoryScheduleStore()
    with TestClient(create_app(settings, store=store), base_url="http://127.0.0.1") as client:
        codes = [client.get("/api/v1/jobs").status_code for _ in range(4)]
        assert codes == [200, 200, 200, 429]
        refused = client.get("/api/v1/jobs")
        assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
        assert "without an API key" in refused.json()["detail"]
        # A request with a key is not counted against the address (here: 401, not 429).
        keyed = client.get("/api/v1/jobs", headers={"X-API-Key": "th_00000000_x"})
        assert keyed.status_code != 429
        assert client.get("/healthz").status_code == 200  # not the API
        time.sleep(1.05)
        assert client.get("/api/v1/jobs").status_code == 200
