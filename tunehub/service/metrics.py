"""What an operator watches: the service's metrics in Prometheus' text format (``GET /metrics``).

Two kinds of metric, kept apart:

- **Counted as it happens** (``prometheus_client`` counters and histograms, this module's
  globals): lookups by route, tier and status with their latency, the lookup cache's hits and
  misses, trials and records by target and status, requests the store could not answer.
  Under ``tunehub serve --workers N`` each process counts in its own files under
  ``PROMETHEUS_MULTIPROC_DIR`` (``<home>/metrics``, emptied by ``serve`` before the workers
  start: ``prepare_multiprocess``) and a scrape, whichever process answers it, adds up every
  process's files (prometheus-client's multiprocess mode). One process (``tunehub serve`` with
  one worker, tests) uses the default registry, with the process and Python collectors.
- **Read at scrape time** (``ServiceCollector``, one per app): jobs by state, queued and running
  jobs per API key, workers by state, whether the store answers and for how long it has not,
  the result journal's size. They come from the store (a few counting queries, kept for
  ``CACHE_SECS``, so a scrape every few seconds from several Prometheus servers costs one
  round of queries) and from the answering process, so they are never summed across processes.

The environment variable is read when ``prometheus_client`` is first imported: a process that
counts for a multiprocess scrape must have it set before it imports this module.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tunehub.core import JobState, MeasureRecord, utc_now
from tunehub.core.apikey import KEY_PREFIX

if TYPE_CHECKING:
    from tunehub.db.store import ScheduleStore
    from tunehub.service.store_health import StoreHealth

log = logging.getLogger(__name__)

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
# Whether this process counts in files for a multiprocess scrape (decided, as
# prometheus_client decides it, when the module is imported).
MULTIPROCESS = bool(os.environ.get(MULTIPROC_ENV))
CONTENT_TYPE = CONTENT_TYPE_LATEST
# How long a scrape's store queries are reused.
CACHE_SECS = 5.0
# Queued/running counts are read for at most this many API keys (the active ones, newest
# first); the rest of the queue is counted under key="other".
MAX_KEYS = 100
# Workers silent for longer are not counted (as GET /api/v1/workers leaves them out).
WORKER_FORGET_SECS = 3600.0

# A cached single lookup answers in tens of microseconds, a batch of 1,000 in about a second.
LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0,
)  # fmt: skip

LOOKUPS = Counter(
    "tunehub_lookups",
    "Schedule lookups answered: route single (GET /api/v1/schedules/best) or batch (each item "
    "of POST /api/v1/schedules/lookup); tier exact, family, predicted, default, or none "
    "(not answered); status the HTTP status (a batch item's own).",
    ["route", "tier", "status"],
)
LOOKUP_SECONDS = Histogram(
    "tunehub_lookup_seconds",
    "Time to answer one lookup request (a batch is one request), from the service's side.",
    ["route"],
    buckets=LATENCY_BUCKETS,
)
CACHE_HITS = Counter(
    "tunehub_lookup_cache_hits", "Single lookups answered from the process's lookup cache."
)
CACHE_MISSES = Counter(
    "tunehub_lookup_cache_misses",
    "Single lookups the lookup cache could not answer (computed on the full path).",
)
TRIALS = Counter(
    "tunehub_trials",
    "Trials (configs given a verdict) measured by the jobs this service ran, by target key "
    "(its first 12 characters); rate() of it is trials per second.",
    ["target"],
)
RECORDS = Counter(
    "tunehub_records",
    "Measurement records of the jobs this service ran, by target key and status (ok, "
    "build_error, ..., worker_error, cancelled).",
    ["target", "status"],
)
STORE_ERRORS = Counter(
    "tunehub_store_errors",
    "Requests answered 503 because the database could not answer.",
)

_single = LOOKUP_SECONDS.labels("single")
_batch = LOOKUP_SECONDS.labels("batch")
_lookups: dict[tuple[str, str, str], Any] = {}


def _lookup_counter(route: str, tier: str, status: int) -> Any:
    key = (route, tier, str(status))
    child = _lookups.get(key)
    if child is None:
        child = _lookups[key] = LOOKUPS.labels(*key)
    return child


def lookup_answered(tier: str, status: int, started: float, *, hit: bool) -> None:
    """A single lookup ended (``started``: its ``time.perf_counter()``); ``hit``: from the
    lookup cache (else the full path; a ``tune`` lookup is neither)."""
    _single.observe(time.perf_counter() - started)
    _lookup_counter("single", tier or "none", status).inc()
    if hit:
        CACHE_HITS.inc()


def lookup_missed() -> None:
    """A single lookup the cache could have answered but did not have."""
    CACHE_MISSES.inc()


def batch_answered(started: float) -> None:
    _batch.observe(time.perf_counter() - started)


def batch_items(tiers: Tally[tuple[str, int]]) -> None:
    """A batch's items by (tier, status)."""
    for (tier, status), count in tiers.items():
        _lookup_counter("batch", tier or "none", status).inc(count)


def records_measured(target_key: str, records: Iterable[MeasureRecord]) -> None:
    """Records a job's session produced (each once, as it arrives)."""
    target = target_key[:12]
    for record in records:
        RECORDS.labels(target, record.status.value).inc()
        if record.verdict:
            TRIALS.labels(target).inc()


def store_error() -> None:
    STORE_ERRORS.inc()


# --- the scrape ------------------------------------------------------------------------------
def prepare_multiprocess(home: Path) -> Path:
    """For ``tunehub serve --workers N``, before the workers start: an empty
    ``<home>/metrics`` (what processes of an earlier run counted is gone) named in the
    environment the workers inherit."""
    path = home / "metrics"
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True, exist_ok=True)
    os.environ[MULTIPROC_ENV] = str(path)
    return path


def exposition(collector: Collector | None = None) -> bytes:
    """Every metric in Prometheus' text format: this process's (or, in multiprocess mode,
    every process's) counters, then ``collector``'s."""
    if MULTIPROCESS:
        registry = CollectorRegistry(auto_describe=False)
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        counted = generate_latest(registry)
    else:
        counted = generate_latest(REGISTRY)
    if collector is None:
        return counted
    scraped = CollectorRegistry(auto_describe=False)
    scraped.register(collector)
    return counted + generate_latest(scraped)


class ServiceCollector(Collector):
    """The metrics read at scrape time: from the store (cached ``CACHE_SECS``), the store's
    health as this process sees it, and the journal (``journal()``: an object with
    ``size_bytes``, ``max_bytes`` and ``len()``, or None)."""

    def __init__(
        self,
        store: ScheduleStore,
        health: StoreHealth,
        *,
        journal: Callable[[], Any] = lambda: None,
        cache_secs: float = CACHE_SECS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.health = health
        self.journal = journal
        self.cache_secs = cache_secs
        self.clock = clock
        self._lock = threading.Lock()
        self._read_at: float | None = None
        self._from_store: list[Metric] = []

    def collect(self) -> Iterator[Metric]:
        problem = self.health.problem()
        up = GaugeMetricFamily(
            "tunehub_store_up",
            "1 while the database answers (as the process answering this scrape sees it), else 0.",
        )
        up.add_metric([], 0.0 if problem else 1.0)
        yield up
        down = GaugeMetricFamily(
            "tunehub_store_outage_seconds",
            "How long the database has not answered, as this process sees it (0 while it does).",
        )
        down.add_metric([], self.health.outage_secs())
        yield down
        yield from self._journal()
        if problem is None:
            yield from self._store_metrics()

    def _journal(self) -> Iterator[Metric]:
        journal = self.journal()
        size, entries, limit = 0, 0, 0
        if journal is not None:
            size, entries, limit = journal.size_bytes, len(journal), journal.max_bytes
        for name, value, text in (
            ("tunehub_journal_bytes", size, "Bytes of measured results waiting in the journal."),
            ("tunehub_journal_entries", entries, "Measured results waiting in the journal."),
            ("tunehub_journal_max_bytes", limit, "The journal's size limit (0: no journal)."),
        ):
            metric = GaugeMetricFamily(name, text)
            metric.add_metric([], float(value))
            yield metric

    def _store_metrics(self) -> list[Metric]:
        with self._lock:
            now = self.clock()
            if self._read_at is None or now - self._read_at >= self.cache_secs:
                try:
                    self._from_store = self._read_store()
                except Exception as exc:  # the store went away between the check and here
                    log.debug("metrics: could not read the store: %s", exc)
                    self._from_store = []
                self._read_at = now
            return self._from_store

    def _read_store(self) -> list[Metric]:
        store = self.store
        jobs = GaugeMetricFamily("tunehub_jobs", "Jobs stored, by state.", labels=["state"])
        totals = {state: store.count_jobs(states=[state]) for state in JobState}
        for state, n in totals.items():
            jobs.add_metric([state.value], float(n))
        per_key = GaugeMetricFamily(
            "tunehub_jobs_active",
            "Queued and running jobs by the API key that submitted them (its public prefix; "
            "none: no key, e.g. `tunehub tune` or lookups of the tune_unseen policy; other: "
            f"keys past the {MAX_KEYS} newest).",
            labels=["key", "state"],
        )
        keys = sorted((k for k in store.list_api_keys() if k.active), key=lambda k: -k.id)
        rest = "other" if len(keys) > MAX_KEYS else "none"
        for state in (JobState.QUEUED, JobState.RUNNING):
            left = totals[state]
            for key in keys[:MAX_KEYS]:
                if left <= 0:
                    break
                n = store.count_jobs(states=[state], api_key_id=key.id)
                if n:
                    per_key.add_metric([KEY_PREFIX + key.prefix, state.value], float(n))
                    left -= n
            per_key.add_metric([rest, state.value], float(max(0, left)))
        workers = GaugeMetricFamily(
            "tunehub_workers",
            "Workers that reported in the last hour, by kind (local, ray) and state (idle, "
            "building, timing, lost), as GET /api/v1/workers lists them.",
            labels=["kind", "state"],
        )
        from tunehub.service.routes_workers import worker_state

        now = utc_now()
        tally: Tally[tuple[str, str]] = Tally()
        since = now - timedelta(seconds=WORKER_FORGET_SECS)
        for worker in store.list_workers(live_since=since):
            tally[(worker.kind, str(worker_state(worker, "", "", now)["state"]))] += 1
        for (kind, said), n in sorted(tally.items()):
            workers.add_metric([kind, said], float(n))
        return [jobs, per_key, workers]
