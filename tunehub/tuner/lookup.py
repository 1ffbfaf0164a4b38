"""Tiered schedule lookup (exact target, then the same family), compared with the Baseline."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tunehub.core import Config, MeasureRecord, Schedule, Target, Workload
from tunehub.core.registry import UnknownName
from tunehub.db.store import ScheduleStore
from tunehub.kernels.registry import get_template


@dataclass(frozen=True)
class LookupAnswer:
    """A schedule and the tier it came from (``exact`` or ``family``)."""

    schedule: Schedule
    source: str
    workload: Workload
    baseline: MeasureRecord | None = None

    @property
    def best_secs(self) -> float:
        """The schedule's time to quote: the confirmed median where a job confirmed it."""
        c = self.schedule.confirmation
        return c.median_secs if c is not None else self.schedule.median_secs

    @property
    def speedup_vs_baseline(self) -> float | None:
        """Baseline time / schedule time: above 1 the schedule is faster than the library."""
        if self.baseline is None or self.baseline.median_secs is None:
            return None
        return self.baseline.median_secs / self.best_secs

    def to_dict(self) -> dict[str, Any]:
        """The answer as the API and the CLI print it."""
        s = self.schedule
        c = s.confirmation
        speedup = self.speedup_vs_baseline
        return {
            "config": s.config.to_dict(),
            "template": s.template,
            "template_version": s.template_version,
            "median_secs": s.median_secs,
            "gflops": s.gflops,
            "confirmed_median_secs": c.median_secs if c else None,
            "confirmed_gflops": self.workload.gflops(c.median_secs) if c else None,
            "confirmed_spread": c.spread if c else None,
            "confirmed_rounds": c.rounds if c else None,
            "confirmed_at": c.confirmed_at.isoformat() if c else None,
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
    library = library or " ".join(str(env[k]) for k in ("library", "library_version") if env.get(k))
    return {
        "template": record.request.template,
        "library": library or record.request.template,
        "kernel": str(env.get("blas_architecture") or env.get("library_kernel") or ""),
        "config": record.config.to_dict(),
        "threads": config_threads(record.config),
        "median_secs": record.median_secs,
        "gflops": record.gflops,
        "record_id": record.uid,
        "measured_at": record.created_at.isoformat(),
    }


def find_schedule(
    store: ScheduleStore, workload: Workload, target: Target, *, template: str | None = None
) -> LookupAnswer | None:
    """The best known schedule for ``workload`` on ``target``, or None if nothing is known.

    Tiers, in order: a schedule tuned on exactly this target; one tuned for the same workload on
    another target of the same family (same device model and arch, other toolchain versions).
    The answer carries the vendor library's Baseline, if one was measured, for comparison.
    """
    exact = store.get_schedule(
        workload_key=workload.key, target_key=target.target_key, template=template
    )
    if exact is not None:
        return _answer(store, exact, "exact", workload, target)
    family = [
        s
        for s in store.family_schedules(
            workload_key=workload.key, family_key=target.family_key, template=template
        )
        if config_threads(s.config) <= target.cores  # a 16-thread schedule does not fit 2 cores
    ]
    if family:
        return _answer(store, family[0], "family", workload, target)
    return None


def config_threads(config: Config) -> int:
    """The thread count a config runs with (its ``threads`` knob; 1 without one)."""
    return config.typed_get("threads", 1)


def baseline_for(
    store: ScheduleStore,
    *,
    workload: Workload,
    target: Target,
    template: str,
    config: Config,
    target_key: str | None = None,
) -> MeasureRecord | None:
    """The Baseline to compare ``config`` (of ``template``) with: the template's baseline
    library with the matching config (e.g. OpenBLAS on the same thread count), measured on
    ``target_key`` (default: ``target``'s)."""
    try:
        tmpl = get_template(template)
    except UnknownName:
        return None
    if tmpl.baseline_template is None:
        return None
    return store.get_baseline(
        workload_key=workload.key,
        target_key=target_key or target.target_key,
        template=tmpl.baseline_template,
        config=tmpl.baseline_config(config, workload, target),
    )


def _answer(
    store: ScheduleStore, schedule: Schedule, source: str, workload: Workload, target: Target
) -> LookupAnswer:
    """The answer with the Baseline measured on the schedule's own target and config."""
    baseline = baseline_for(
        store,
        workload=workload,
        target=target,
        template=schedule.template,
        config=schedule.config,
        target_key=schedule.target_key,
    )
    return LookupAnswer(schedule, source, workload, baseline)
