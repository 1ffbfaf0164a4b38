"""Session: the tuning loop that serves one job (ask → measure → store → tell, to a budget)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from tunehub.core import (
    Budget,
    Config,
    JobSpec,
    MeasureRecord,
    MeasureRequest,
    MeasureStatus,
    Target,
    Workload,
)
from tunehub.db.store import ScheduleStore
from tunehub.kernels.base import Template
from tunehub.kernels.registry import get_template
from tunehub.tuner.strategy import Strategy, make_strategy
from tunehub.workers.base import Measurer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Progress:
    """Where a session stands after a batch."""

    trials_done: int
    max_trials: int
    elapsed_secs: float
    best: MeasureRecord | None
    last: tuple[MeasureRecord, ...]


@dataclass(frozen=True)
class SessionResult:
    trials_done: int
    best: MeasureRecord | None
    stopped_by: str  # "max_trials" | "max_secs" | "exhausted" | "cancelled"
    elapsed_secs: float


def _faster(a: MeasureRecord | None, b: MeasureRecord) -> MeasureRecord | None:
    """The faster ok record of the two (``a`` may be None)."""
    if b.result.status is not MeasureStatus.OK:
        return a
    if a is None or (b.median_secs or 0) < (a.median_secs or 0):
        return b
    return a


class Session:
    """Runs the tuning loop for one workload on one target with one template.

    History is told to the strategy first, so no config is measured twice: the job's own
    records when it resumes after a restart (they count against its budget), and the records
    earlier jobs stored for the same workload, target and template version (they do not count;
    the job explores configs the fleet has not tried, and the Schedule keeps the best of all).
    ``max_secs`` counts the wall time of this run only.
    """

    def __init__(
        self,
        *,
        store: ScheduleStore,
        measurer: Measurer,
        template: Template,
        strategy: Strategy,
        workload: Workload,
        target: Target,
        budget: Budget,
        job_id: int | None = None,
        batch_size: int = 2,
        on_progress: Callable[[Progress], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
        baseline: Template | None = None,
    ) -> None:
        self.store = store
        self.measurer = measurer
        self.template = template
        self.strategy = strategy
        self.workload = workload
        self.target = target
        self.budget = budget
        self.job_id = job_id
        self.batch_size = max(1, batch_size)
        self.on_progress = on_progress
        self.should_stop = should_stop or (lambda: False)
        self.baseline = baseline

    def baseline_threads(self) -> tuple[int, ...]:
        """The thread counts the space offers (its ``threads`` knob), each needing a Baseline."""
        for knob in self.strategy.space.knobs:
            if knob.name == "threads":
                return tuple(sorted({int(v) for v in knob.values}))
        return (1,)

    def measure_baselines(self) -> list[MeasureRecord]:
        """Measure the baseline library for every thread count that has no Baseline yet."""
        if self.baseline is None:
            return []
        missing = [
            threads
            for threads in self.baseline_threads()
            if self.store.get_baseline(
                workload_key=self.workload.key,
                target_key=self.target.target_key,
                threads=threads,
                template=self.baseline.name,
            )
            is None
        ]
        requests = [
            MeasureRequest(
                workload=self.workload,
                target=self.target,
                template=self.baseline.name,
                template_version=self.baseline.version,
                config=Config({"threads": threads}),
            )
            for threads in missing
        ]
        records = [
            MeasureRecord(request=req, result=res)
            for req, res in zip(requests, self.measurer.measure(requests), strict=True)
        ]
        for record in records:
            self.store.commit_baseline(record)
            if record.median_secs is not None:
                log.info(
                    "baseline %s threads=%s: %.2f GFLOP/s",
                    self.baseline.name,
                    record.config["threads"],
                    record.gflops,
                )
            else:
                log.warning("baseline %s failed: %s", self.baseline.name, record.result.error)
        return records

    def _history(self) -> list[MeasureRecord]:
        if self.job_id is None:
            return []
        return self.store.job_records(self.job_id)

    def _shared_history(self) -> list[MeasureRecord]:
        """Other jobs' (and job-less runs') records of this template version for this workload
        on this target: what the fleet already measured, which this job need not repeat."""
        return [
            r
            for r in self.store.records_for(
                workload_key=self.workload.key,
                target_key=self.target.target_key,
                template=self.template.name,
            )
            if r.request.template_version == self.template.version
            and (self.job_id is None or r.job_id != self.job_id)
            # A timeout may come from a loaded machine rather than the config: try it again.
            and r.status is not MeasureStatus.TIMEOUT
        ]

    def run(self) -> SessionResult:
        start = time.monotonic()
        if self.baseline is not None and not self.should_stop():
            self.measure_baselines()
        shared = self._shared_history()
        self.strategy.tell(shared)
        history = self._history()
        self.strategy.tell(history)
        trials = len(history)
        best: MeasureRecord | None = None
        for record in history:
            best = _faster(best, record)
        if history:
            log.info("job %s resumes with %d stored trials", self.job_id, trials)
        if shared:
            log.info("%d configs already measured by earlier runs are skipped", len(shared))

        stopped_by = "max_trials"
        while True:
            elapsed = time.monotonic() - start
            if trials >= self.budget.max_trials:
                stopped_by = "max_trials"
                break
            if elapsed >= self.budget.max_secs:
                stopped_by = "max_secs"
                break
            if self.should_stop():
                stopped_by = "cancelled"
                break
            configs = self.strategy.ask(min(self.batch_size, self.budget.max_trials - trials))
            if not configs:
                stopped_by = "exhausted"
                break
            requests = [
                MeasureRequest(
                    workload=self.workload,
                    target=self.target,
                    template=self.template.name,
                    template_version=self.template.version,
                    config=config,
                )
                for config in configs
            ]
            results = self.measurer.measure(requests)
            records = [
                MeasureRecord(request=req, result=res, job_id=self.job_id)
                for req, res in zip(requests, results, strict=True)
            ]
            self.store.commit_records(records)
            self.strategy.tell(records)
            trials += len(records)
            for record in records:
                best = _faster(best, record)
            if self.on_progress is not None:
                self.on_progress(
                    Progress(
                        trials_done=trials,
                        max_trials=self.budget.max_trials,
                        elapsed_secs=time.monotonic() - start,
                        best=best,
                        last=tuple(records),
                    )
                )
        return SessionResult(
            trials_done=trials,
            best=best,
            stopped_by=stopped_by,
            elapsed_secs=time.monotonic() - start,
        )


def session_for_job(
    spec: JobSpec,
    *,
    store: ScheduleStore,
    measurer: Measurer,
    target: Target,
    job_id: int | None,
    on_progress: Callable[[Progress], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> Session:
    """The Session that serves ``spec``: its template's space, the strategy seeded with the
    template's seed configs (its analytical model's points), and the template's baseline
    library (measured if not stored)."""
    template = get_template(spec.template)
    space = template.space(spec.workload, target)
    prior = template.seed_configs(spec.workload, target)
    baseline = get_template(template.baseline_template) if template.baseline_template else None
    return Session(
        store=store,
        measurer=measurer,
        template=template,
        strategy=make_strategy(spec.strategy, space, seed=spec.seed, prior=prior),
        workload=spec.workload,
        target=target,
        budget=spec.budget,
        job_id=job_id,
        on_progress=on_progress,
        should_stop=should_stop,
        baseline=baseline,
    )
