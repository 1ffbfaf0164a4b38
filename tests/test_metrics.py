"""GET /metrics on a real ``tunehub serve``: one process running a job, and ``--workers 2``,
whose processes' counters add up in every scrape whichever process answers it."""

from __future__ import annotations

import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from prometheus_client import CollectorRegistry, multiprocess
from prometheus_client.parser import text_string_to_metric_families

from tests.live import LiveServer
from tunehub.client import TunehubClient

SHAPE: dict[str, int | str] = {"m": 24, "n": 40, "k": 56, "dtype": "float32"}


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition by (name, sorted labels)."""
    found: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def value(found: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str,
          **labels: str) -> float:  # fmt: skip
    return found.get((name, tuple(sorted(labels.items()))), 0.0)


def scrape(url: str, key: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    answer = httpx.get(f"{url}/metrics", headers={"X-API-Key": key}, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain")
    return samples(answer.text)


def lookup(url: str, m: int, **extra: str) -> int:
    params: dict[str, int | str] = {**SHAPE, "m": m, **extra}
    return httpx.get(f"{url}/api/v1/schedules/best", params=params, timeout=30).status_code


def test_one_process_counts_lookups_jobs_trials_and_the_store(tmp_path: Path) -> None:
    with (
        LiveServer(
            tmp_path, TUNEHUB_MEASURE_TIMEOUT_SECS="3", TUNEHUB_METRICS_CACHE_SECS="0"
        ) as server,
        TunehubClient(server.url, api_key=server.key) as client,
    ):
        before = scrape(server.url, server.key)
        job = client.submit_job(
            {"m": 8, "n": 8, "k": 8},
            template="test.faulty",
            strategy="exhaustive",
            max_trials=2,  # modes ok and crash
            max_secs=120,
        )
        done = client.wait(job["id"], timeout_secs=120)
        assert done["state"] == "succeeded", (done, server.logs())
        # An untuned shape four times (the full path, then the cache: once the store's
        # changes of the job are read, answers stay cached), and a malformed one; then a
        # batch of three items, two answered and one refused.
        assert lookup(server.url, 24) == 200
        time.sleep(0.6)  # the change feed is read every 0.25 s
        assert [lookup(server.url, 24) for _ in range(3)] == [200] * 3
        assert lookup(server.url, 0) == 422
        items = [{"workload": SHAPE}, {"workload": {**SHAPE, "m": 25}}, {"workload": {"m": 1}}]
        batch = httpx.post(f"{server.url}/api/v1/schedules/lookup", json={"items": items})
        assert [r["ok"] for r in batch.json()["results"]] == [True, True, False]
        found = scrape(server.url, server.key)

    def delta(name: str, **labels: str) -> float:
        return value(found, name, **labels) - value(before, name, **labels)

    target = done["target_key"][:12]
    assert delta("tunehub_trials_total", target=target) == 2
    assert delta("tunehub_records_total", target=target, status="ok") >= 1
    assert delta("tunehub_records_total", target=target, status="runtime_error") == 1
    # The untuned shape's tier is the template's default (no model trained here).
    single = {"route": "single"}
    assert delta("tunehub_lookups_total", **single, tier="default", status="200") == 4
    assert delta("tunehub_lookups_total", **single, tier="none", status="422") == 1
    hits, misses = (
        delta("tunehub_lookup_cache_hits_total"),
        delta("tunehub_lookup_cache_misses_total"),
    )
    assert hits + misses == 5 and hits >= 2, (hits, misses)
    assert delta("tunehub_lookup_seconds_count", **single) == 5
    assert delta("tunehub_lookup_seconds_bucket", **single, le="+Inf") == 5
    assert delta("tunehub_lookups_total", route="batch", tier="default", status="200") == 2
    assert delta("tunehub_lookups_total", route="batch", tier="none", status="422") == 1
    assert delta("tunehub_lookup_seconds_count", route="batch") == 1
    # Read from the store at scrape time.
    assert value(found, "tunehub_jobs", state="succeeded") == 1
    assert value(found, "tunehub_jobs", state="queued") == 0
    assert value(found, "tunehub_workers", kind="local", state="idle") == 1
    assert value(found, "tunehub_store_up") == 1
    assert value(found, "tunehub_store_outage_seconds") == 0
    assert delta("tunehub_store_errors_total") == 0
    assert value(found, "tunehub_journal_max_bytes") == 64 << 20  # the runner's journal
    assert ("tunehub_journal_bytes", ()) in found
    # This one process's own collectors come along.
    assert any(name == "process_cpu_seconds_total" for name, _ in found)


def per_process(metrics_dir: Path, tmp_path: Path) -> dict[str, float]:
    """Single lookups each serving process counted, read from its own files alone."""
    counts = {}
    for path in metrics_dir.glob("counter_*.db"):
        pid = path.stem.removeprefix("counter_")
        alone = tmp_path / f"alone-{pid}"
        alone.mkdir()
        shutil.copy(path, alone / path.name)
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=str(alone))  # type: ignore[no-untyped-call]
        total = 0.0
        for family in registry.collect():
            for sample in family.samples:
                if sample.name == "tunehub_lookups_total":
                    total += sample.value
        counts[pid] = total
    return counts


def answering(counts: dict[str, float]) -> int:
    """How many processes counted at least one lookup."""
    return sum(1 for v in counts.values() if v)


def test_two_processes_counts_add_up_in_every_scrape(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with LiveServer(
        home,
        command=[sys.executable, "-m", "tunehub.cli", "serve", "--workers", "2", "--no-runner"],
    ) as server:
        # Queued jobs (no runner here) are counted per key.
        with TunehubClient(server.url, api_key=server.key) as client:
            for m in (8, 9, 10):
                client.submit_job({"m": m, "n": 8, "k": 8}, template="test.faulty", max_trials=1)
        # Lookups on fresh connections, several at once: both processes answer some.
        asked = 60
        with ThreadPoolExecutor(6) as pool:
            statuses = list(pool.map(lambda i: lookup(server.url, 100 + i % 20), range(asked)))
        assert statuses == [200] * asked
        counts = per_process(home / "metrics", tmp_path)
        assert answering(counts) == 2, f"one process answered every lookup: {counts}"
        assert sum(counts.values()) == asked
        prefix = "th_" + server.key.split("_")[1]
        for _ in range(6):  # whichever process answers the scrape
            found = scrape(server.url, server.key)
            single = value(found, "tunehub_lookups_total", route="single", tier="default",
                           status="200")  # fmt: skip
            assert single == asked
            hits = value(found, "tunehub_lookup_cache_hits_total")
            misses = value(found, "tunehub_lookup_cache_misses_total")
            assert hits + misses == asked and misses >= 20
            assert value(found, "tunehub_lookup_seconds_count", route="single") == asked
            assert value(found, "tunehub_jobs", state="queued") == 3
            assert value(found, "tunehub_jobs_active", key=prefix, state="queued") == 3
            assert value(found, "tunehub_jobs_active", key="none", state="queued") == 0
            assert value(found, "tunehub_store_up") == 1
            # No runner here: the journal's file is read by whichever process answers.
            assert value(found, "tunehub_journal_max_bytes") == 64 << 20
            assert value(found, "tunehub_journal_bytes") == 0
        # A key is needed where reads need one; not for these defaults.
        assert httpx.get(f"{server.url}/metrics").status_code == 200
