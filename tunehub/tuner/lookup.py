"""Tiered schedule lookup: exact target, then the same family, then the global cost model's
prediction for an unseen shape, then the template's analytical default; tuned answers are
compared with the Baseline."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from tunehub.core import Config, JobSpec, JobState, MeasureRecord, Schedule, Target, Workload
from tunehub.core.registry import UnknownName
from tunehub.cost_model.registry import ModelCache
from tunehub.db.store import ScheduleStore
from tunehub.kernels.base import Template
from tunehub.kernels.registry import TEMPLATES, get_template
from tunehub.tuner.model_strategy import workload_distance

# Tuned shapes whose winners a prediction is checked against.
CHECK_NEIGHBOURS = 3


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
    # One read serves both tiers (the family's schedules, fastest first, include this
    # target's): a lookup is on every compiler's path, and most find nothing tuned.
    schedules = store.family_schedules(
        workload_key=workload.key, family_key=target.family_key, template=template
    )
    exact = next((s for s in schedules if s.target_key == target.target_key), None)
    if exact is not None:
        return _answer(store, exact, "exact", workload, target)
    family = [
        s
        for s in schedules
        if config_threads(s.config) <= target.cores  # a 16-thread schedule does not fit 2 cores
    ]
    if family:
        return _answer(store, family[0], "family", workload, target)
    return None


@dataclass(frozen=True)
class UntunedAnswer:
    """An answer for a workload nobody tuned on this family: ``predicted`` (the global cost
    model's first pick, with its predicted time and the model's version) or ``default`` (the
    template's analytical default; no model yet). ``job_id``: a tuning job queued for it."""

    source: str  # "predicted" | "default"
    workload: Workload
    target: Target
    template: Template
    config: Config
    predicted_secs: float | None = None
    model_id: int | None = None
    model_version: str | None = None
    job_id: int | None = None

    def to_dict(self) -> dict[str, Any]:
        secs = self.predicted_secs
        return {
            "config": self.config.to_dict(),
            "template": self.template.name,
            "template_version": self.template.version,
            "median_secs": None,
            "gflops": None,
            "confirmed_median_secs": None,
            "confirmed_gflops": None,
            "confirmed_spread": None,
            "confirmed_rounds": None,
            "confirmed_at": None,
            "source": self.source,
            "record_id": None,
            "target_key": self.target.target_key,
            "workload_key": self.workload.key,
            "updated_at": None,
            "baseline": None,
            "speedup_vs_baseline": None,
            "baseline_faster": None,
            "predicted_median_secs": secs,
            "predicted_gflops": self.workload.gflops(secs) if secs else None,
            "model_id": self.model_id,
            "model_version": self.model_version,
            "tuning_job_id": self.job_id,
        }


def lookup_templates(workload: Workload, target: Target, template: str | None) -> list[Template]:
    """The tunable templates that run ``workload`` on ``target`` (the named one only)."""
    names = [template] if template is not None else list(TEMPLATES.names())
    out = []
    for name in names:
        try:
            tmpl = get_template(name)
        except UnknownName:
            continue
        if tmpl.baseline or tmpl.device_kind != target.kind:
            continue
        if tmpl.problem(workload, target) is None:
            out.append(tmpl)
    return out


def predict_schedule(
    store: ScheduleStore,
    workload: Workload,
    target: Target,
    models: ModelCache | None,
    *,
    template: str | None = None,
) -> UntunedAnswer | None:
    """The untuned tiers: the latest global model's pick for this workload among the
    template's space (checked against the winners of the nearest tuned shapes on this
    target), else the template's default. None if no template runs the workload here.
    Reads only cached models: never trains."""
    templates = lookup_templates(workload, target, template)
    if not templates:
        return None
    for tmpl in templates:
        if models is None:
            break
        prediction = models.predict(
            workload,
            target,
            tmpl.name,
            tmpl.version,
            points=partial(_space_points, tmpl, workload, target),
            winners=partial(_neighbour_winners, store, workload, target, tmpl),
        )
        if prediction is not None:
            return UntunedAnswer(
                source="predicted",
                workload=workload,
                target=target,
                template=tmpl,
                config=prediction.pick.config,
                predicted_secs=prediction.pick.predicted_secs,
                model_id=prediction.model.id,
                model_version=prediction.model.label,
            )
    tmpl = templates[0]
    return UntunedAnswer(
        source="default",
        workload=workload,
        target=target,
        template=tmpl,
        config=tmpl.default_config(workload, target),
    )


def queue_tuning(store: ScheduleStore, answer: UntunedAnswer) -> UntunedAnswer:
    """Queue a tuning job (default strategy and budget) for an untuned answer's workload,
    unless one is queued or running for it already; the answer names the job."""
    target_key = answer.target.target_key
    for job in store.list_jobs(states=(JobState.QUEUED, JobState.RUNNING), limit=1000):
        spec = job.spec
        if (spec.workload.key, spec.target_key, spec.template) == (
            answer.workload.key,
            target_key,
            answer.template.name,
        ):
            return replace(answer, job_id=job.id)
    job = store.create_job(
        JobSpec(workload=answer.workload, target_key=target_key, template=answer.template.name)
    )
    return replace(answer, job_id=job.id)


def _space_points(template: Template, workload: Workload, target: Target) -> Sequence[Config]:
    return template.space(workload, target).points


def _neighbour_winners(
    store: ScheduleStore, workload: Workload, target: Target, template: Template
) -> list[Config]:
    """Schedules of the nearest tuned workloads on this target (same template version)."""
    found = []
    for schedule in store.target_schedules(target_key=target.target_key, template=template.name):
        if schedule.template_version != template.version:
            continue
        other = store.get_workload(schedule.workload_key)
        if other is not None and other.key != workload.key and other.op == workload.op:
            found.append((workload_distance(other, workload), schedule.config))
    found.sort(key=lambda t: t[0])
    return [config for _, config in found[:CHECK_NEIGHBOURS]]


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
