"""Tiered schedule lookup: exact target, then the same family, then the global cost model's
prediction for an unseen shape, then the template's analytical default; tuned answers are
compared with the Baseline."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tunehub.core import Budget, Config, JobSpec, MeasureRecord, Schedule, Target, Workload
from tunehub.core.job import LOOKUP_PRIORITY
from tunehub.core.model import ModelInfo
from tunehub.core.registry import UnknownName
from tunehub.cost_model.predict import PickRequest, candidates, pick_many
from tunehub.cost_model.registry import ModelCache, Prediction
from tunehub.cost_model.xgb import XGBCostModel
from tunehub.db.store import QueueFull, ScheduleStore
from tunehub.kernels.base import Template
from tunehub.kernels.registry import TEMPLATES, get_template

# Re-exported: the service and the tests find them here.
from tunehub.tuner.neighbours import CHECK_NEIGHBOURS as CHECK_NEIGHBOURS
from tunehub.tuner.neighbours import NeighbourIndex as NeighbourIndex

# A schedule the library runs within this factor of is a tie, and a tie goes to the library
# (no build, nothing to go wrong): the two are timed side by side in the confirmation's
# rounds, and on the H100 such times moved by this much between the confirmation and the
# benchmark's rounds minutes later (1024^3: the kernel 1.5% ahead in the one, cuBLAS 1.7% in
# the other; 256x256x65536: 0.1% and 2.3%; benchmarks/results/gpu_gemm-h100-20261125T084951.log).
# The least tie: a confirmation whose rounds moved more ties over more (``library_tie``).
LIBRARY_TIE = 1.02
# A batch's untuned lookups ask whether their caller is still there this often.
CHECK_EVERY = 32


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

    @property
    def library_tie(self) -> float:
        """The speedup over the library below which the two tie (``library_tie``)."""
        return library_tie(self.schedule, self.baseline)

    @property
    def baseline_faster(self) -> bool | None:
        """Whether the library wins or ties (then the library is the answer to take); None
        without a Baseline."""
        speedup = self.speedup_vs_baseline
        return None if speedup is None else speedup < self.library_tie

    def to_dict(self, *, iso_times: bool = True) -> dict[str, Any]:
        """The answer as the API and the CLI print it. ``iso_times=False`` leaves timestamps
        as datetimes, for an encoder that writes them itself (as the API's models do)."""
        s = self.schedule
        stamp = _iso if iso_times else _same
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
            "confirmed_at": stamp(c.confirmed_at) if c else None,
            "source": self.source,
            "record_id": s.record_uid,
            "target_key": s.target_key,
            "workload_key": s.workload_key,
            "updated_at": stamp(s.updated_at),
            "baseline": baseline_dict(self.baseline, iso_times=iso_times),
            "speedup_vs_baseline": speedup,
            "library_tie": None if speedup is None else self.library_tie,
            "baseline_faster": self.baseline_faster,
        }


def library_tie(schedule: Schedule, baseline: MeasureRecord | None) -> float:
    """The speedup over the library a schedule needs to be served in its place: LIBRARY_TIE,
    or more where the confirmation's rounds say the difference may be noise: 1 plus the
    spread of the winner's round medians, or plus how far the library's fastest round (where
    it was re-timed in those rounds) came under its median. A slow library round does not
    count: the median leaves it out. On a lent H100, LLaMA's MLP down (2048 x 4096 x 11008)
    confirmed at 1.069x of cuBLAS with the winner's rounds 7.7% apart; the two were even
    (0.99-1.00x) inside the model and timed again on another H100 (docs/benchmarks.md, "A win
    within its rounds' spread")."""
    margins = [LIBRARY_TIE - 1, library_margin(baseline)]
    if schedule.confirmation is not None:
        margins.append(schedule.confirmation.spread)
    return 1 + max(margins)


def library_margin(record: MeasureRecord | None) -> float:
    """(median - fastest) / median of a library's round medians where the confirmation
    re-timed it (its repeats are those medians); 0 for a Baseline timed once."""
    if record is None or not record.result.environment.get("confirmation_rounds"):
        return 0.0
    times, median = record.result.repeat_secs, record.median_secs
    return (median - min(times)) / median if times and median else 0.0


def _iso(when: datetime) -> str:
    return when.isoformat()


def _same(when: datetime) -> datetime:
    return when


def baseline_dict(record: MeasureRecord | None, *, iso_times: bool = True) -> dict[str, Any] | None:
    """A Baseline as the API shows it, or None for no (or no ok) measurement (``iso_times``:
    as in ``LookupAnswer.to_dict``)."""
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
        "measured_at": (_iso if iso_times else _same)(record.created_at),
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
    # target's) and the Baseline (the workload's on the family): a lookup is on every
    # compiler's path, and the database is the most of its time.
    schedules, baselines = store.family_lookup(
        workload_key=workload.key, family_key=target.family_key, template=template
    )
    return answer_from(schedules, baselines, workload, target, template=template)


def answer_from(
    schedules: Sequence[Schedule],
    baselines: Sequence[MeasureRecord],
    workload: Workload,
    target: Target,
    *,
    template: str | None = None,
) -> LookupAnswer | None:
    """``find_schedule``'s answer from what ``ScheduleStore.family_lookup`` read (or its
    async read, whose workloads have no Baseline)."""
    picked = _pick(schedules, target, template)
    if picked is None:
        return None
    schedule, source = picked
    baseline = None
    key = _baseline_key(workload, target, schedule.template, schedule.config, schedule.target_key)
    if key is not None and baselines:
        wanted = Config(key[4])
        baseline = next(
            (
                r
                for r in baselines
                if r.request.target.target_key == key[1]
                and r.request.template == key[2]
                and r.request.config == wanted
            ),
            None,
        )
    return LookupAnswer(schedule, source, workload, baseline)


@dataclass(frozen=True)
class LookupQuery:
    """One item of a batch lookup: a workload on a target (of one template, if named)."""

    workload: Workload
    target: Target
    template: str | None = None


def find_schedules(
    store: ScheduleStore, queries: Sequence[LookupQuery]
) -> list[LookupAnswer | None]:
    """``find_schedule`` for every query, in order, in a bounded number of store reads (the
    schedules of every query's workload and family at once, then their Baselines at once)
    however many queries there are."""
    if not queries:
        return []
    schedules = store.schedules_for(
        workload_keys={q.workload.key for q in queries},
        family_keys={q.target.family_key for q in queries},
    )
    picks = [
        _pick(schedules.get((q.workload.key, q.target.family_key), ()), q.target, q.template)
        for q in queries
    ]
    wanted = {q.workload.key for q, p in zip(queries, picks, strict=True) if p is not None}
    # Baselines by (workload, target, library); the library config that matches a schedule's
    # is found by comparing configs, and only for workloads that have a Baseline at all: a
    # batch of a thousand answers would otherwise hash a thousand configs it never uses.
    baselines: dict[tuple[str, str, str], list[MeasureRecord]] = {}
    if wanted:
        for record in store.baselines_for(workload_keys=wanted):
            request = record.request
            baselines.setdefault(
                (request.workload.key, request.target.target_key, request.template), []
            ).append(record)
    answers: list[LookupAnswer | None] = []
    libraries: dict[str, str | None] = {}  # by template: the registry is asked once each
    for q, picked in zip(queries, picks, strict=True):
        if picked is None:
            answers.append(None)
            continue
        schedule, source = picked
        baseline = None
        if schedule.template not in libraries:
            libraries[schedule.template] = _baseline_library(schedule.template)
        library = libraries[schedule.template]
        measured = baselines.get((q.workload.key, schedule.target_key, library or ""))
        if library is not None and measured:
            tmpl = get_template(schedule.template)
            wanted_config = tmpl.baseline_config(schedule.config, q.workload, q.target)
            baseline = next((r for r in measured if r.request.config == wanted_config), None)
        answers.append(LookupAnswer(schedule, source, q.workload, baseline))
    return answers


def _baseline_library(template: str) -> str | None:
    """The baseline template (the vendor library) ``template`` is compared with, if any."""
    try:
        return get_template(template).baseline_template
    except UnknownName:
        return None


def _pick(
    schedules: Sequence[Schedule], target: Target, template: str | None
) -> tuple[Schedule, str] | None:
    """Of a workload's schedules on ``target``'s family (fastest first), the answer and its
    tier: this target's own schedule, else the fastest that fits the target's cores."""
    if template is not None:
        schedules = [s for s in schedules if s.template == template]
    exact = next((s for s in schedules if s.target_key == target.target_key), None)
    if exact is not None:
        return exact, "exact"
    family = [
        s
        for s in schedules
        if config_threads(s.config) <= target.cores  # a 16-thread schedule does not fit 2 cores
    ]
    if family:
        return family[0], "family"
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
            "library_tie": None,
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


class LookupCancelled(Exception):
    """The caller of a lookup left (or its time ran out): the rest of the work is dropped."""


def predict_schedule(
    store: ScheduleStore,
    workload: Workload,
    target: Target,
    models: ModelCache | None,
    *,
    template: str | None = None,
    neighbours: NeighbourIndex | None = None,
) -> UntunedAnswer | None:
    """The untuned tiers for one workload: ``predict_schedules``'s answer."""
    query = LookupQuery(workload, target, template)
    return predict_schedules(store, [query], models, neighbours=neighbours)[0]


def predict_schedules(
    store: ScheduleStore,
    queries: Sequence[LookupQuery],
    models: ModelCache | None,
    *,
    neighbours: NeighbourIndex | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> list[UntunedAnswer | None]:
    """The untuned tiers, for each query: the latest global model's pick for the workload
    (``predicted``) among a few candidates of the template's space (its seeds, the default's
    neighbours, the winners of the nearest tuned shapes and the configs that won most often
    on this target: ``tunehub.cost_model.predict.pick_many``), else the template's
    ``default``; None if no template runs the workload there. Every query's candidates are
    scored together (a thousand new shapes: well under a second), and picks are cached per
    model. Reads only cached models: never trains. ``cancelled`` is asked every
    CHECK_EVERY queries: once it says so, LookupCancelled is raised and nothing more is
    done."""
    neighbours = neighbours or NeighbourIndex(store)
    answers: list[UntunedAnswer | None] = [None] * len(queries)
    # By model: (its info, the model, [(query index, template, request)]).
    pending: dict[int, tuple[ModelInfo, XGBCostModel, list[tuple[int, Template, PickRequest]]]]
    pending = {}
    for i, q in enumerate(queries):
        if cancelled is not None and i % CHECK_EVERY == 0 and cancelled():
            raise LookupCancelled(f"stopped after {i} of {len(queries)} lookups")
        templates = lookup_templates(q.workload, q.target, q.template)
        if not templates:
            continue
        found = None
        for tmpl in templates if models is not None else ():
            assert models is not None
            latest = models.latest_model(q.target, tmpl.name, tmpl.version)
            if latest is not None:
                found = (tmpl, *latest)
                break
        if found is None:
            tmpl = templates[0]
            answers[i] = UntunedAnswer(
                source="default",
                workload=q.workload,
                target=q.target,
                template=tmpl,
                config=tmpl.default_config(q.workload, q.target),
            )
            continue
        tmpl, info, model = found
        assert models is not None
        cached = models.cached_pick(q.workload, q.target, info)
        if cached is not None:
            answers[i] = _predicted(q, tmpl, cached)
            continue
        space = tmpl.space(q.workload, q.target)
        default = tmpl.default_config(q.workload, q.target)
        winners = neighbours.winners(q.workload, q.target, tmpl)
        points = candidates(
            space.is_valid,
            [default],
            space.neighbours(default),
            winners,
            neighbours.pool(q.target, tmpl),
        )
        request = PickRequest(q.workload, q.target, points, winners, default)
        pending.setdefault(info.id, (info, model, []))[2].append((i, tmpl, request))
    for info, model, items in pending.values():
        picks = pick_many(
            model, [r for _, _, r in items], default_margin=model.features.default_margin
        )
        for (i, tmpl, request), pick in zip(items, picks, strict=True):
            prediction = Prediction(info, pick)
            assert models is not None
            models.keep_pick(request.workload, request.target, prediction)
            answers[i] = _predicted(queries[i], tmpl, prediction)
    return answers


def _predicted(query: LookupQuery, template: Template, prediction: Prediction) -> UntunedAnswer:
    return UntunedAnswer(
        source="predicted",
        workload=query.workload,
        target=query.target,
        template=template,
        config=prediction.pick.config,
        predicted_secs=prediction.pick.predicted_secs,
        model_id=prediction.model.id,
        model_version=prediction.model.label,
    )


@dataclass(frozen=True)
class LookupTuningLimits:
    """How far lookups may queue tuning: ``max_jobs`` queued or running at once (over every
    lookup), each with this budget."""

    max_jobs: int
    max_trials: int
    max_secs: float


@dataclass(frozen=True)
class TuningOutcome:
    """Whether a lookup queued tuning for its workload: the job (new, or one already queued or
    running for the same workload and target), or why not."""

    queued: bool
    job_id: int | None
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"queued": self.queued, "job_id": self.job_id, "reason": self.reason}


def queue_lookup_tuning(
    store: ScheduleStore,
    answers: Sequence[UntunedAnswer],
    limits: LookupTuningLimits,
    *,
    api_key_id: int | None = None,
    max_active_total: int | None = None,
) -> list[TuningOutcome]:
    """Queue a tuning job for each untuned answer's (workload, target), in order, behind
    people's jobs (LOOKUP_PRIORITY) with ``limits``' budget, unless one is queued or running
    for it already (then that one is named). Once ``limits.max_jobs`` lookup jobs (or
    ``max_active_total`` jobs of any kind) are active, the rest are not queued, and say so.
    One read for the existing jobs, then one transaction per new job (at most as many as
    the cap lets through)."""
    if not answers:
        return []
    active = store.active_jobs(
        workload_keys={a.workload.key for a in answers},
        target_keys={a.target.target_key for a in answers},
    )
    existing = {(job.spec.workload.key, job.spec.target_key): job.id for job in active}
    budget = Budget(max_trials=limits.max_trials, max_secs=limits.max_secs)
    full: str | None = None
    outcomes = []
    for answer in answers:
        key = (answer.workload.key, answer.target.target_key)
        job_id = existing.get(key)
        if job_id is not None:
            outcomes.append(
                TuningOutcome(True, job_id, "a job for it is already queued or running")
            )
            continue
        if full is not None:
            outcomes.append(TuningOutcome(False, None, full))
            continue
        spec = JobSpec(
            workload=answer.workload,
            target_key=key[1],
            template=answer.template.name,
            budget=budget,
        )
        try:
            job = store.create_job(
                spec,
                api_key_id=api_key_id,
                priority=LOOKUP_PRIORITY,
                max_active_at_priority=limits.max_jobs,
                max_active_total=max_active_total,
            )
        except QueueFull as exc:
            full = f"not queued: {exc}"
            outcomes.append(TuningOutcome(False, None, full))
            continue
        existing[key] = job.id
        outcomes.append(TuningOutcome(True, job.id, "queued"))
    return outcomes


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
    key = _baseline_key(workload, target, template, config, target_key or target.target_key)
    if key is None:
        return None
    return store.get_baseline(
        workload_key=key[0], target_key=key[1], template=key[2], config=Config(key[4])
    )


def _baseline_key(
    workload: Workload, target: Target, template: str, config: Config, target_key: str
) -> tuple[str, str, str, str, dict[str, Any]] | None:
    """(workload key, target key, baseline template, its config's key, that config) of the
    Baseline to compare ``config`` with; None if the template has no baseline library."""
    try:
        tmpl = get_template(template)
    except UnknownName:
        return None
    if tmpl.baseline_template is None:
        return None
    library_config = tmpl.baseline_config(config, workload, target)
    return (
        workload.key,
        target_key,
        tmpl.baseline_template,
        library_config.key,
        library_config.to_dict(),
    )
