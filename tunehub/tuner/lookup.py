"""Tiered schedule lookup (exact target, then the same family), compared with the Baseline."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tunehub.core import Config, MeasureRecord, Schedule, Target, Workload
from tunehub.db.store import ScheduleStore


@dataclass(frozen=True)
class LookupAnswer:
    """A schedule and the tier it came from (``exact`` or ``family``)."""

    schedule: Schedule
    source: str
    baseline: MeasureRecord | None = None

    @property
    def speedup_vs_baseline(self) -> float | None:
        """Baseline time / schedule time: above 1 the schedule is faster than the library."""
        if self.baseline is None or self.baseline.median_secs is None:
            return None
        return self.baseline.median_secs / self.schedule.median_secs

    def to_dict(self) -> dict[str, Any]:
        """The answer as the API and the CLI print it."""
        s = self.schedule
        speedup = self.speedup_vs_baseline
        return {
            "config": s.config.to_dict(),
            "template": s.template,
            "template_version": s.template_version,
            "median_secs": s.median_secs,
            "gflops": s.gflops,
            "source": self.source,
            "record_id": s.record_uid,
            "target_key": s.target_key,
            "workload_key": s.workload_key,
            "updated_at": s.updated_at.isoformat(),
            "baseline": baseline_dict(self.baseline),
            "speedup_vs_baseline": speedup,
            "baseline_faster": None if speedup is None else speedup < 1.0,
        }


def baseline_dict(record: MeasureRecord | None) -> dict[str, Any] | None:
    """A Baseline as the API shows it, or None for no (or no ok) measurement."""
    if record is None or record.median_secs is None:
        return None
    env = record.result.environment
    library = " ".join(str(env[k]) for k in ("blas", "blas_version") if env.get(k))
    return {
        "template": record.request.template,
        "library": library or record.request.template,
        "threads": record.config.get("threads", 1),
        "median_secs": record.median_secs,
        "gflops": record.gflops,
        "record_id": record.uid,
        "measured_at": record.created_at.isoformat(),
    }


def target_baselines(
    store: ScheduleStore, workload: Workload, target: Target
) -> list[MeasureRecord]:
    """The stored Baselines of ``workload`` on ``target``, one per thread count, fewest first."""
    found = (
        store.get_baseline(workload_key=workload.key, target_key=target.target_key, threads=n)
        for n in range(1, max(1, target.cores) + 1)
    )
    return [b for b in found if b is not None]


def find_schedule(
    store: ScheduleStore, workload: Workload, target: Target, *, template: str | None = None
) -> LookupAnswer | None:
    """The best known schedule for ``workload`` on ``target``, or None if nothing is known.

    Tiers, in order: a schedule tuned on exactly this target; one tuned for the same workload on
    another target of the same family (same CPU model and ISA, other toolchain versions).
    The answer carries the vendor library's Baseline, if one was measured, for comparison.
    """
    exact = store.get_schedule(
        workload_key=workload.key, target_key=target.target_key, template=template
    )
    if exact is not None:
        return _answer(store, exact, "exact")
    family = [
        s
        for s in store.family_schedules(
            workload_key=workload.key, family_key=target.family_key, template=template
        )
        if config_threads(s.config) <= target.cores  # a 16-thread schedule does not fit 2 cores
    ]
    if family:
        return _answer(store, family[0], "family")
    return None


def config_threads(config: Config) -> int:
    """The thread count a config runs with (its ``threads`` knob; 1 without one)."""
    threads = config.get("threads", 1)
    return threads if isinstance(threads, int) and not isinstance(threads, bool) else 1


def baseline_for(
    store: ScheduleStore, *, workload_key: str, target_key: str, config: Config
) -> MeasureRecord | None:
    """The Baseline to compare ``config`` with: same workload, target and thread count."""
    return store.get_baseline(
        workload_key=workload_key, target_key=target_key, threads=config_threads(config)
    )


def _answer(store: ScheduleStore, schedule: Schedule, source: str) -> LookupAnswer:
    """The answer with the Baseline measured on the schedule's own target and thread count."""
    baseline = baseline_for(
        store,
        workload_key=schedule.workload_key,
        target_key=schedule.target_key,
        config=schedule.config,
    )
    return LookupAnswer(schedule, source, baseline)
