"""Session: the tuning loop that serves one job (ask → measure → store → tell, to a budget).

The loop keeps the measurer full (``measurer.capacity`` requests in flight, so the device
times one candidate while the next ones build), stores each result the moment it arrives
(with the tuning time spent since the last store), and tells the strategy. It stops on the
budget (trials, or tuning seconds over every run of the job), an exhausted space, a cancel or
shutdown (in-flight candidates are killed and recorded as ``cancelled``), repeated machine
failures, or a pause (its time slice is over: what is in flight finishes and is stored, then
the job goes back to the queue and a later run resumes it). A pause that cannot wait for what
is in flight (``pause_now``: another key's first job is due) cuts it short instead: it is
stored ``cancelled``, which is no verdict, so the resumed run measures it again, once. The
library baselines a job measures first stop at any pause (those that settled are stored, the
others are measured by the next run). When the budget ends it, it
re-times the fastest configs, interleaved, and the Schedule keeps the confirmed winner.

Every result of a live measurer passes the trust guard (``tunehub.tuner.guard``) before it is
stored: one timed on a busy machine, or far slower than the same config's earlier times, the
model's estimate or its measured neighbours, waits and is measured again later, between other
candidates; one that does not settle is stored ``noisy`` (not a trial, never a schedule or a
model's row). The same holds for the baselines and the confirmation's rounds. The loop's own
CPU work (the strategy's ask and tell, the model's estimates) runs in ``measurer.host_work()``:
on a core no timing uses, never beside a timing that needs every core.

Stores are fenced by the job's ``owner`` (the holder of its lease): if the lease is lost (the
job went back to the queue, perhaps to another replica) the session stops at once, cutting
short what is in flight, and writes nothing more (``stopped_by="lease_lost"``). While the
database cannot be reached, results are kept in memory, in arrival order, and stored when it
returns. If it stays away longer than ``db_outage_secs``, they go to the result journal on
local disk (``tunehub.db.journal``: fsynced, bounded) and so does every result after them,
while the job goes on; when the database answers again the journal is replayed into it first
(``replayed`` counts this job's results it stored). Only a full journal (or none, or a disk
that fails) ends the job with DatabaseOutage; what the journal took is stored all the same.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from typing import Any

from tunehub.core import (
    Budget,
    Config,
    Confirmation,
    JobSpec,
    MeasureRecord,
    MeasureRequest,
    MeasureResult,
    MeasureStatus,
    Target,
    Workload,
    utc_now,
)
from tunehub.cost_model.registry import ModelCache
from tunehub.db.journal import JournalEntry, JournalFull, ResultJournal
from tunehub.db.store import LeaseLost, ScheduleStore, StoreUnavailable
from tunehub.kernels.base import Template
from tunehub.kernels.registry import get_template
from tunehub.tuner import guard
from tunehub.tuner.guard import GuardPolicy, References
from tunehub.tuner.history import HistoryView, StoreHistory
from tunehub.tuner.strategy import Strategy, StrategyContext, make_strategy
from tunehub.workers.base import Measurer

log = logging.getLogger(__name__)

CONFIRM_TOP = 3
CONFIRM_ROUNDS = 3
# How much more than the confirmed winner the baseline library may have slowed since its
# Baseline before its re-time in the confirmation is taken as a bad measurement, not a drift.
LIBRARY_DRIFT_TOLERANCE = 1.25
MAX_MACHINE_FAILURES = 3
# Configs in a row the guard found noisy before the job stops: the machine is too busy to time.
MAX_NOISY_IN_A_ROW = 8
# Measured configs that differ from a new one in at most this many knobs are its neighbours.
NEIGHBOUR_KNOBS = 2
POLL_SECS = 0.1
# How long results may wait in memory for an unreachable database (TUNEHUB_DB_OUTAGE_SECS),
# and how often the store is tried meanwhile.
DB_OUTAGE_SECS = 120.0
DB_RETRY_SECS = 1.0


class DatabaseOutage(RuntimeError):
    """The database stayed unreachable longer than the session may keep results waiting, and
    the result journal could not take them (none, full, or its disk failed)."""

    def __init__(
        self,
        outage_secs: float,
        limit_secs: float,
        unstored: int,
        reason: str,
        *,
        journaled: int = 0,
    ) -> None:
        kept = (
            f"{journaled} result(s) wait in the result journal and are stored when it is back; "
            if journaled
            else ""
        )
        super().__init__(
            f"the database was unreachable for {outage_secs:.0f} s, longer than the "
            f"{limit_secs:g} s allowed (TUNEHUB_DB_OUTAGE_SECS); {kept}{unstored} result(s) "
            f"measured meanwhile could not be stored; last error: {reason}"
        )
        self.outage_secs = outage_secs
        self.unstored = unstored
        self.journaled = journaled


@dataclass(frozen=True)
class Progress:
    """Where a session stands after a record arrived."""

    trials_done: int
    max_trials: int
    elapsed_secs: float  # tuning seconds, over every run of the job
    best: MeasureRecord | None
    last: tuple[MeasureRecord, ...]
    in_flight: int = 0


@dataclass(frozen=True)
class SessionResult:
    trials_done: int
    best: MeasureRecord | None
    # "max_trials" | "max_secs" | "exhausted" | "cancelled" | "worker_error" | "paused"
    # | "lease_lost" | "noisy" (MAX_NOISY_IN_A_ROW configs in a row: too busy to time)
    stopped_by: str
    elapsed_secs: float  # tuning seconds of this run
    confirmation: Confirmation | None = None
    error: str = ""
    machine_failures: int = 0
    baselines: tuple[MeasureRecord, ...] = field(default=())
    # Results of this run written to the result journal during an outage, and results of this
    # job the journal's replays stored.
    journaled: int = 0
    replayed: int = 0


@dataclass(eq=False)
class _Trial:
    """One config on its way to a record: the attempts at timing it the guard has judged."""

    request: MeasureRequest
    attempts: tuple[guard.Attempt, ...] = ()
    results: list[MeasureResult] = field(default_factory=list)
    due: float = 0.0  # when a deferred re-measure may start (time.monotonic)
    arrived: int = 0  # results that had come back when it was deferred


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
    records when it resumes after a restart (its verdicts count against its budget), and the
    verdicts earlier jobs stored for the same workload, target and template version (they do
    not count; the job explores configs the fleet has not tried, and the Schedule keeps the
    best of all). Timeouts of other jobs are not told: a loaded machine may have caused them.
    ``tuning_secs_before`` is the tuning time earlier runs of the job spent (``max_secs``
    counts both).
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
        history: HistoryView | None = None,
        on_progress: Callable[[Progress], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
        should_pause: Callable[[], bool] | None = None,
        pause_now: Callable[[], bool] | None = None,
        baseline: Template | None = None,
        tuning_secs_before: float = 0.0,
        confirm_top: int = CONFIRM_TOP,
        confirm_rounds: int = CONFIRM_ROUNDS,
        max_machine_failures: int = MAX_MACHINE_FAILURES,
        owner: str | None = None,
        db_outage_secs: float = DB_OUTAGE_SECS,
        guard_policy: GuardPolicy | None = None,
        max_noisy_in_a_row: int = MAX_NOISY_IN_A_ROW,
        journal: ResultJournal | None = None,
    ) -> None:
        self.store = store
        self.measurer = measurer
        self.template = template
        self.strategy = strategy
        self.workload = workload
        self.target = target
        self.budget = budget
        self.job_id = job_id
        self.history = history or strategy.context.history
        self.on_progress = on_progress
        self.should_stop = should_stop or (lambda: False)
        # An orderly hand-back, not a cancel: nothing new is asked, what is in flight finishes.
        self.should_pause = should_pause or (lambda: False)
        # A pause that cannot wait: what is in flight is cut short (stored ``cancelled``, not a
        # verdict, so the resumed run measures it again). Asked only once a pause is due.
        self.pause_now = pause_now or (lambda: False)
        self._paused = False  # once a pause is due it stays due
        self.baseline = baseline
        self.tuning_secs_before = tuning_secs_before
        self.confirm_top = max(0, confirm_top)
        self.confirm_rounds = max(1, confirm_rounds)
        self.max_machine_failures = max(1, max_machine_failures)
        # The lease holder the job's writes are fenced by (None: unfenced, e.g. no job).
        self.owner = owner
        self.db_outage_secs = db_outage_secs
        # The trust guard (see tunehub.tuner.guard): only a live measurer's timings are judged
        # (a replay's answers were judged when they were measured, and a second ask repeats
        # them).
        self.guard_policy = guard_policy or GuardPolicy()
        self.max_noisy_in_a_row = max(1, max_noisy_in_a_row)
        # Config key -> (config, clean ok times): what the guard compares a new timing with.
        self._times: dict[str, tuple[Config, list[float]]] = {}
        # Results (and tuning seconds) waiting for the database, in arrival order.
        self._pending: list[tuple[MeasureRecord | None, float]] = []
        self._outage_since: float | None = None
        self._outage_reason = ""
        self._tried_at = float("-inf")
        # Past db_outage_secs, results go to the journal (None: the session fails instead).
        self.journal = journal
        self._journaling = False  # this outage outlasted the limit: results go to the journal
        self._journal_waiting = False  # entries written here and not replayed yet
        self.journaled = 0
        self.replayed = 0

    def request(self, config: Config, template: Template | None = None) -> MeasureRequest:
        template = template or self.template
        return MeasureRequest(
            workload=self.workload,
            target=self.target,
            template=template.name,
            template_version=template.version,
            config=config,
        )

    # --- baselines ---------------------------------------------------------------------------
    def measure_baselines(self) -> list[MeasureRecord]:
        """Measure the baseline library's configs that have no Baseline yet (not tuning time)."""
        baseline = self.baseline
        if baseline is None:
            return []
        problem = baseline.capabilities(self.target).problem(
            baseline.name, self.workload, self.target
        )
        if problem is not None:
            log.info("no %s baseline for %s: %s", baseline.name, self.workload.label, problem)
            return []
        missing = [
            config
            for config in baseline.baseline_configs(self.workload, self.target)
            if self.store.get_baseline(
                workload_key=self.workload.key,
                target_key=self.target.target_key,
                template=baseline.name,
                config=config,
            )
            is None
        ]
        requests = [self.request(config, baseline) for config in missing]
        # The library is judged by the machine's state only (nothing to compare it with yet).
        # A pause stops them too (its slice is over before its first trial): what settled is
        # stored, the others are measured by the job's next run.
        decisions = self._guarded(
            requests,
            [References()] * len(requests),
            halt=lambda: self.should_stop() or self._pause_due(),
        )
        records = []
        for request, decision in zip(requests, decisions, strict=True):
            if decision is None:  # cut short by a stop or a pause
                continue
            record = MeasureRecord(request=request, result=decision.result)
            records.append(record)
            if not record.verdict:
                # A machine failure, or noisy: measured again next time.
                if record.status is MeasureStatus.NOISY:
                    log.warning("baseline %s %s not stored: %s", baseline.name, request.config,
                                record.result.error)  # fmt: skip
                continue
            self.store.commit_baseline(record)
            if record.gflops is not None:
                log.info("baseline %s %s: %.2f GFLOP/s", baseline.name, request.config,
                         record.gflops)  # fmt: skip
            else:
                log.warning("baseline %s failed: %s", baseline.name, record.result.error)
        return records

    def _library_requests(self, top: Sequence[MeasureRecord]) -> list[MeasureRequest]:
        """The baseline library's requests the confirmation re-times beside ``top``: the
        library config each top config is compared with, once each."""
        baseline = self.baseline
        if baseline is None or baseline.capabilities(self.target).problem(
            baseline.name, self.workload, self.target
        ):
            return []
        configs: dict[str, Config] = {}
        for record in top:
            config = self.template.baseline_config(record.config, self.workload, self.target)
            configs.setdefault(config.key, config)
        return [self.request(config, baseline) for config in configs.values()]

    def _store_library_rounds(
        self, rounds: Sequence[tuple[MeasureRequest, MeasureResult]], winner_drift: float
    ) -> None:
        """Store each library config re-timed in every round as its Baseline (one that
        failed or was noisy in a round keeps the Baseline it had). A re-time slower than the
        Baseline it had by more than the winner slowed since its trial (``winner_drift``,
        confirmed over trial median) and LIBRARY_DRIFT_TOLERANCE on top is not believed: the
        GPU did not slow down that much for the winner in the same rounds, so the Baseline it
        had stands (on the H100 a confirmation once timed cuBLAS at 2.1x its job-start time
        while the winner ran as in its trial, and the lookup served a kernel 0.8x cuBLAS)."""
        results: dict[str, list[MeasureResult]] = {}
        requests: dict[str, MeasureRequest] = {}
        for request, result in rounds:
            requests[request.config.key] = request
            results.setdefault(request.config.key, []).append(result)
        for key, found in results.items():
            if len(found) != self.confirm_rounds or any(
                r.status is not MeasureStatus.OK for r in found
            ):
                log.warning("baseline %s not re-timed: a round failed", requests[key].config)
                continue
            record = MeasureRecord(requests[key], _library_round_result(found))
            before = self.store.get_baseline(
                workload_key=self.workload.key,
                target_key=self.target.target_key,
                template=record.request.template,
                config=record.config,
            )
            assert record.median_secs is not None
            if (
                before is not None
                and before.median_secs
                and record.median_secs
                > before.median_secs * max(1.0, winner_drift) * LIBRARY_DRIFT_TOLERANCE
            ):
                log.warning(
                    "baseline %s re-timed at %.6gs, %.2fx its Baseline, where the winner ran "
                    "%.2fx its trial: the Baseline (%.6gs) stands",
                    record.config,
                    record.median_secs,
                    record.median_secs / before.median_secs,
                    winner_drift,
                    before.median_secs,
                )
                continue
            self.store.commit_baseline(record)
            log.info("baseline %s re-timed beside the confirmation: median %.6gs",
                     requests[key].config, record.median_secs)  # fmt: skip

    # --- the loop ----------------------------------------------------------------------------
    def run(self) -> SessionResult:
        own = self.store.job_records(self.job_id) if self.job_id is not None else []
        baselines: list[MeasureRecord] = []
        # A resumed run (an earlier run stored trials, so it measured the baselines first) does
        # not measure again those that did not settle then: on a busy machine each run of each
        # job spent the guard's re-measures on them (1, 3 and 9 s later); the confirmation
        # re-times the library beside the winner.
        if self.baseline is not None and not own and not self.should_stop():
            baselines = self.measure_baselines()
        own_keys = {r.uid for r in own}
        shared = [
            r
            for r in self.history.records()
            if r.uid not in own_keys and r.status is not MeasureStatus.TIMEOUT
        ]
        with self.measurer.host_work():
            self.strategy.tell(shared)
            self.strategy.tell(own)
        for record in (*shared, *own):
            self._learn(record)
        trials = sum(1 for r in own if r.verdict)
        best: MeasureRecord | None = None
        for record in own:
            best = _faster(best, record)
        if own:
            log.info("job %s resumes with %d stored trials", self.job_id, trials)
        if shared:
            log.info("%d configs already measured by earlier runs are skipped", len(shared))

        start = time.monotonic()
        committed_at = start
        # Each future's trial: its request and the attempts the guard has judged so far.
        in_flight: dict[Future[MeasureResult], _Trial] = {}
        # Trials whose timing the guard did not trust: measured again once due, interleaved.
        deferred: list[_Trial] = []
        arrived = 0  # results that came back, re-measures included
        stopped_by = ""
        error = ""
        failures_in_a_row = 0
        machine_failures = 0
        noisy_in_a_row = 0
        exhausted = False
        cut_short = False  # a pause that could not wait cancelled what was in flight

        def spent() -> float:
            return self.tuning_secs_before + time.monotonic() - start

        while True:
            if not stopped_by:
                if self.should_stop():
                    stopped_by = "cancelled"
                elif failures_in_a_row >= self.max_machine_failures:
                    stopped_by = "worker_error"
                elif noisy_in_a_row >= self.max_noisy_in_a_row:
                    stopped_by = "noisy"
                elif trials >= self.budget.max_trials:
                    stopped_by = "max_trials"
                elif spent() >= self.budget.max_secs:
                    stopped_by = "max_secs"
                elif self._pause_due():
                    stopped_by = "paused"
                if stopped_by == "paused" and in_flight and self.pause_now():
                    cut_short = True
                if stopped_by and in_flight and (stopped_by != "paused" or cut_short):
                    # The budget, a stop or a pause that cannot wait ends the job now: what is
                    # in flight is cut short.
                    self.measurer.cancel(list(in_flight))
            elif stopped_by == "paused" and in_flight:
                if self.should_stop():
                    stopped_by = "cancelled"  # a cancel or shutdown while the pause drains
                    self.measurer.cancel(list(in_flight))
                elif not cut_short and self.pause_now():  # the pause can wait no longer
                    cut_short = True
                    self.measurer.cancel(list(in_flight))
            try:
                if stopped_by and deferred:
                    # No more re-measures: what has not settled is stored as noisy.
                    for trial in deferred:
                        why = f"the job stopped ({stopped_by}) before it settled"
                        self._commit(self._record(trial, guard.noisy(trial.attempts, why)), 0.0)
                    deferred.clear()
                if not stopped_by:
                    free = max(1, self.measurer.capacity) - len(in_flight)
                    now = time.monotonic()
                    for trial in list(deferred):
                        # Due, and another result came back since (or nothing else runs).
                        if (
                            free > 0
                            and now >= trial.due
                            and (arrived > trial.arrived or not in_flight)
                        ):
                            deferred.remove(trial)
                            in_flight[self.measurer.submit(trial.request)] = trial
                            free -= 1
                    room = self.budget.max_trials - trials - len(in_flight) - len(deferred)
                    if not exhausted and free > 0 and room > 0:
                        with self.measurer.host_work():
                            configs = self.strategy.ask(min(free, room))
                        if not configs:
                            exhausted = True
                        for config in configs:
                            request = self.request(config)
                            in_flight[self.measurer.submit(request)] = _Trial(request)
            except LeaseLost as exc:
                self._lost(exc, in_flight)
                stopped_by = "lease_lost"
                break
            except DatabaseOutage:
                self.measurer.cancel(list(in_flight))
                raise
            if not in_flight:
                if deferred:  # waiting for a re-measure to be due
                    time.sleep(POLL_SECS)
                    continue
                if not stopped_by:
                    stopped_by = "exhausted" if exhausted else "max_trials"
                break
            done, _ = wait(list(in_flight), timeout=POLL_SECS, return_when=FIRST_COMPLETED)
            try:
                if not done:
                    self._flush()  # a backlog from an outage, once the database is back
                for future in done:
                    trial = in_flight.pop(future)
                    arrived += 1
                    decision = self._judge(trial, future.result())
                    if decision.action == "retry" and stopped_by:
                        why = f"the job stopped ({stopped_by}) before it settled"
                        decision = guard.noisy(decision.attempts, why)
                    if decision.action == "retry":
                        log.info(
                            "re-measuring %s in %.0f s: %s",
                            trial.request.config,
                            decision.retry_after_secs,
                            decision.reason,
                        )
                        trial.due = time.monotonic() + decision.retry_after_secs
                        trial.arrived = arrived
                        deferred.append(trial)
                        continue
                    record = self._record(trial, decision)
                    now = time.monotonic()
                    self._commit(record, now - committed_at)
                    committed_at = now
                    with self.measurer.host_work():
                        self.strategy.tell([record])
                    if record.verdict:
                        trials += 1
                        failures_in_a_row = 0
                        noisy_in_a_row = 0
                        best = _faster(best, record)
                        self._learn(record)
                    elif record.status is MeasureStatus.WORKER_ERROR:
                        failures_in_a_row += 1
                        machine_failures += 1
                        error = record.result.error
                    elif record.status is MeasureStatus.NOISY:
                        noisy_in_a_row += 1
                        error = record.result.error
                        log.warning("%s is noisy: %s", record.config, record.result.error)
                    if self.on_progress is not None:
                        self.on_progress(
                            Progress(
                                trials_done=trials,
                                max_trials=self.budget.max_trials,
                                elapsed_secs=spent(),
                                best=best,
                                last=(record,),
                                in_flight=len(in_flight),
                            )
                        )
            except LeaseLost as exc:
                self._lost(exc, in_flight)
                stopped_by = "lease_lost"
                break
            except DatabaseOutage:
                self.measurer.cancel(list(in_flight))
                raise
        now = time.monotonic()
        if stopped_by != "lease_lost":
            try:
                self._commit(None, now - committed_at)
                self._drain()
            except LeaseLost as exc:
                self._lost(exc, {})
                stopped_by = "lease_lost"
        elapsed = now - start
        if stopped_by == "worker_error":
            error = (
                f"the worker failed {failures_in_a_row} times in a row without measuring; "
                f"last: {error}"
            )
        elif stopped_by == "noisy":
            error = (
                f"the machine was too busy to time: {noisy_in_a_row} configs in a row were "
                f"noisy; last: {error}"
            )
        confirmation = None
        if stopped_by in ("max_trials", "max_secs", "exhausted") and not self.should_stop():
            try:
                confirmation = self.confirm()
            except StoreUnavailable as exc:  # every record is stored: only the re-timing is lost
                log.warning("job %s: no confirmation, the database is away: %s", self.job_id, exc)
        return SessionResult(
            trials_done=trials,
            best=best,
            stopped_by=stopped_by,
            elapsed_secs=elapsed,
            confirmation=confirmation,
            error=error,
            machine_failures=machine_failures,
            baselines=tuple(baselines),
            journaled=self.journaled,
            replayed=self.replayed,
        )

    # --- the trust guard ----------------------------------------------------------------------
    def _learn(self, record: MeasureRecord) -> None:
        """Keep an ok record's time as a reference for later timings of it and its neighbours
        (one the guard had to re-measure keeps only the time it settled on)."""
        if record.status is MeasureStatus.OK and record.median_secs is not None:
            if guard.disturbance(record.result, self.guard_policy) is not None:
                return  # stored before the guard, on a busy machine: no reference
            entry = self._times.setdefault(record.config.key, (record.config, []))
            entry[1].append(record.median_secs)

    def references(self, config: Config) -> References:
        """What a timing of ``config`` is compared with: its own earlier clean times, the
        cost model's estimate, and its measured neighbours' times (configs that differ from
        it in at most NEIGHBOUR_KNOBS knobs)."""
        same = self._times.get(config.key)
        neighbours = [
            statistics.median(times)
            for key, (other, times) in self._times.items()
            if key != config.key and _differing_knobs(config, other) <= NEIGHBOUR_KNOBS
        ]
        return References(
            same_config_secs=tuple(same[1]) if same else (),
            predicted_secs=self._predicted_secs(config),
            neighbour_secs=tuple(neighbours),
        )

    def _predicted_secs(self, config: Config) -> float | None:
        model = self.strategy.context.cost_model
        if model is None or not model.trained:
            return None
        try:
            with self.measurer.host_work():
                found = model.predict_secs(self.workload, self.target, [config])
        except Exception:  # the guard must not fail a job over a model
            log.exception("the cost model could not estimate %s", config)
            return None
        secs = found[0] if found else None
        return secs if secs is not None and 0 < secs < float("inf") else None

    def _judge(
        self, trial: _Trial, result: MeasureResult, refs: References | None = None
    ) -> guard.Decision:
        """The guard's decision on ``trial`` with its newest ``result`` (accepted as it is
        when the measurer is not live)."""
        trial.results.append(result)
        if not self.measurer.live:
            return guard.Decision("accept", result)
        if refs is None:
            refs = self.references(trial.request.config)
        decision = guard.judge(trial.results, refs, self.guard_policy)
        trial.attempts = decision.attempts
        return decision

    def _record(self, trial: _Trial, decision: guard.Decision) -> MeasureRecord:
        return MeasureRecord(trial.request, decision.result, job_id=self.job_id)

    def _pause_due(self) -> bool:
        """Whether the job is to be handed back (``should_pause``, asked until it says so)."""
        if not self._paused:
            self._paused = self.should_pause()
        return self._paused

    def _measure_guarded(
        self, requests: Sequence[MeasureRequest], refs: Sequence[References]
    ) -> list[guard.Decision] | None:
        """Measure every request, re-measuring what the guard does not trust (after its
        delay, interleaved with the others); the final decisions in order. None if the
        session was stopped meanwhile (what was in flight is cancelled)."""
        decisions = self._guarded(requests, refs, halt=self.should_stop)
        if any(d is None for d in decisions):
            return None
        return [d for d in decisions if d is not None]

    def _guarded(
        self,
        requests: Sequence[MeasureRequest],
        refs: Sequence[References],
        *,
        halt: Callable[[], bool],
    ) -> list[guard.Decision | None]:
        """``_measure_guarded``'s loop: each request's final decision, in order; once
        ``halt`` says so, what is in flight is cancelled and what had not settled is None."""
        trials = [_Trial(request) for request in requests]
        decisions: list[guard.Decision | None] = [None] * len(trials)
        in_flight = {self.measurer.submit(t.request): i for i, t in enumerate(trials)}
        deferred: list[int] = []
        arrived = 0
        while in_flight or deferred:
            now = time.monotonic()
            for i in list(deferred):
                if now >= trials[i].due and (arrived > trials[i].arrived or not in_flight):
                    deferred.remove(i)
                    in_flight[self.measurer.submit(trials[i].request)] = i
            if not in_flight:
                if halt():
                    return decisions
                time.sleep(POLL_SECS)
                continue
            done, _ = wait(list(in_flight), timeout=POLL_SECS, return_when=FIRST_COMPLETED)
            if not done and halt():
                self.measurer.cancel(list(in_flight))
            for future in done:
                i = in_flight.pop(future)
                arrived += 1
                result = future.result()
                if result.status is MeasureStatus.CANCELLED or halt():
                    self.measurer.cancel(list(in_flight))
                    return decisions
                decision = self._judge(trials[i], result, refs[i])
                if decision.action == "retry":
                    log.info("re-measuring %s %s in %.0f s: %s", requests[i].template,
                             requests[i].config, decision.retry_after_secs,
                             decision.reason)  # fmt: skip
                    trials[i].due = time.monotonic() + decision.retry_after_secs
                    trials[i].arrived = arrived
                    deferred.append(i)
                else:
                    decisions[i] = decision
        return decisions

    # --- storing results, through outages and lease losses ---------------------------------
    def _lost(self, exc: LeaseLost, in_flight: dict[Future[MeasureResult], Any]) -> None:
        """The job is no longer ours: cut what is in flight short and keep nothing."""
        log.warning("job %s: %s; stopping now", self.job_id, exc)
        if in_flight:
            self.measurer.cancel(list(in_flight))
            in_flight.clear()
        self._pending.clear()

    def _commit(self, record: MeasureRecord | None, tuning_secs: float) -> None:
        """Store ``record`` (and tuning seconds), after any results still waiting for the
        database; while it is away, keep them in order."""
        if record is None and (self.job_id is None or tuning_secs <= 0):
            return
        self._pending.append((record, tuning_secs))
        self._flush()  # during an outage, tried once a DB_RETRY_SECS, not per result

    def _flush(self) -> bool:
        """Store the waiting results in order, after what this session journaled; False while
        the database is away (tried at most every DB_RETRY_SECS then; past the limit, results
        go to the journal at once). Raises DatabaseOutage past the limit when the journal
        cannot take them, and LeaseLost if the job is no longer ours."""
        if not self._pending and not self._journal_waiting:
            return True
        clock = time.monotonic()
        if self._outage_since is not None and clock - self._tried_at < DB_RETRY_SECS:
            if self._journaling:
                self._to_journal(clock)
            return False
        self._tried_at = clock
        try:
            if self._journal_waiting:
                self._replay()
            while self._pending:
                record, tuning = self._pending[0]
                secs = {self.job_id: tuning} if self.job_id is not None and tuning > 0 else None
                self.store.commit_records(
                    [record] if record is not None else [], tuning_secs=secs, owner=self.owner
                )
                self._pending.pop(0)
        except StoreUnavailable as exc:
            self._outage_reason = str(exc)
            if self._outage_since is None:
                self._outage_since = clock
                log.warning(
                    "job %s: the database is away; results wait in memory (up to %g s): %s",
                    self.job_id,
                    self.db_outage_secs,
                    exc,
                )
            if clock - self._outage_since > self.db_outage_secs:
                if not self._journaling and self.journal is not None:
                    log.warning(
                        "job %s: the database has been away for more than %g s; results go "
                        "to the result journal %s until it is back",
                        self.job_id,
                        self.db_outage_secs,
                        self.journal.path,
                    )
                self._journaling = True
                self._to_journal(clock, cause=exc)
            return False
        if self._outage_since is not None:
            log.warning(
                "job %s: the database is back after %.1f s; waiting results stored",
                self.job_id,
                clock - self._outage_since,
            )
            self._outage_since = None
            self._journaling = False
        return True

    def _to_journal(self, clock: float, cause: BaseException | None = None) -> None:
        """Move the results waiting in memory to the journal (a result's tuning seconds ride
        with it; seconds after the last result wait in memory). DatabaseOutage if it cannot
        take them."""
        away = clock - (self._outage_since or clock)
        if self.journal is None:
            raise DatabaseOutage(
                away, self.db_outage_secs, len(self._pending), self._outage_reason
            ) from cause
        entries: list[JournalEntry] = []
        spare = 0.0
        for record, secs in self._pending:
            if record is None:
                spare += secs
                continue
            entries.append(JournalEntry(record, tuning_secs=secs + spare))
            spare = 0.0
        if not entries:
            return
        try:
            self.journal.append(entries)
        except (JournalFull, OSError) as exc:
            raise DatabaseOutage(
                away,
                self.db_outage_secs,
                len(entries),
                f"{self._outage_reason}; the journal: {exc}",
                journaled=self.journaled,
            ) from exc
        self.journaled += len(entries)
        self._journal_waiting = True
        self._pending = [(None, spare)] if spare > 0 else []

    def _replay(self) -> None:
        """Store what the journal holds (StoreUnavailable if the database is still away)."""
        assert self.journal is not None
        report = self.journal.replay(self.store)
        self._journal_waiting = False
        mine = report.stored.get(self.job_id, 0) if self.job_id is not None else 0
        self.replayed += mine
        log.warning(
            "job %s: the database is back; %d of its result(s) replayed from the journal",
            self.job_id,
            mine,
        )

    def _drain(self) -> None:
        """Wait until every waiting result is stored (or DatabaseOutage). A session told to
        stop meanwhile leaves them in the journal (when it has one) and returns."""
        while not self._flush():
            if self.journal is not None and self.should_stop():
                self._to_journal(time.monotonic())
                if not self._pending or all(r is None for r, _ in self._pending):
                    return
            time.sleep(min(DB_RETRY_SECS, POLL_SECS * 5))

    # --- confirming the winner -----------------------------------------------------------------
    def top_records(self) -> list[MeasureRecord]:
        """The ``confirm_top`` fastest ok records of distinct configs for this workload,
        target and template version, over every job."""
        found = self.store.records_for(
            workload_key=self.workload.key,
            target_key=self.target.target_key,
            template=self.template.name,
        )
        best: dict[str, MeasureRecord] = {}
        for record in found:
            if record.request.template_version != self.template.version:
                continue
            if record.status is not MeasureStatus.OK or record.median_secs is None:
                continue
            known = best.get(record.config.key)
            if known is None or record.median_secs < (known.median_secs or 0):
                best[record.config.key] = record
        ranked = sorted(best.values(), key=lambda r: r.median_secs or 0.0)
        return ranked[: self.confirm_top]

    def confirm(self) -> Confirmation | None:
        """Re-time the top configs in interleaved rounds (A B C L A B C L …) and make the
        fastest of them, by the median of its round medians, the Schedule with that
        confirmation.

        The baseline library (L: its config for the top configs, e.g. cuBLAS, or OpenBLAS on
        their thread counts) is re-timed in the same rounds and stored as the Baseline, so
        that the lookup's "use the library" compares two times taken side by side, not the
        winner's with a library time from the job's start (a GPU's clocks drift between
        them by more than the two differ). A candidate that fails in any round drops out; its
        failure is stored as a record (it says something about the config). None if nothing
        could be confirmed or the session was stopped meanwhile.
        """
        if self.confirm_top <= 0:
            return None
        top = self.top_records()
        if not top:
            return None
        library = self._library_requests(top)
        requests: list[MeasureRequest] = []
        owners: list[MeasureRecord | None] = []  # the top record a round times; None: library
        refs: list[References] = []
        for _ in range(self.confirm_rounds):
            for record in top:
                requests.append(self.request(record.config))
                owners.append(record)
                # A round far slower than the config's own trial is re-measured.
                refs.append(References(same_config_secs=(record.median_secs or 0.0,)))
            for request in library:
                requests.append(request)
                owners.append(None)
                refs.append(References())
        decisions = self._measure_guarded(requests, refs)
        if decisions is None or self.should_stop():
            return None
        medians: dict[str, list[float]] = {r.uid: [] for r in top}
        dropped: set[str] = set()
        library_rounds: list[tuple[MeasureRequest, MeasureResult]] = []
        for request, owner, decision in zip(requests, owners, decisions, strict=True):
            result = decision.result
            if owner is None:
                library_rounds.append((request, result))
                continue
            if result.status is MeasureStatus.OK and result.median_secs is not None:
                medians[owner.uid].append(result.median_secs)
                continue
            if owner.uid not in dropped and (
                result.status.verdict or result.status is MeasureStatus.NOISY
            ):
                log.warning(
                    "confirming %s: %s (%s)", owner.config, result.status.value, result.error
                )
                try:
                    self.store.commit_records(
                        [MeasureRecord(request, result, job_id=self.job_id)], owner=self.owner
                    )
                except LeaseLost as exc:
                    log.warning("job %s: %s; the confirmation stops", self.job_id, exc)
                    return None
            dropped.add(owner.uid)
        confirmed = {
            uid: statistics.median(times)
            for uid, times in medians.items()
            if uid not in dropped and len(times) == self.confirm_rounds
        }
        if not confirmed:
            return None
        winner = min(confirmed, key=lambda uid: confirmed[uid])
        times = medians[winner]
        median = confirmed[winner]
        # How much slower (or faster) the GPU runs the winner now than in its trial.
        trial = next(r.median_secs for r in top if r.uid == winner)
        drift = median / trial if trial else 1.0
        self._store_library_rounds(library_rounds, drift)
        confirmation = Confirmation(
            median_secs=median,
            spread=(max(times) - min(times)) / median,
            rounds=self.confirm_rounds,
            confirmed_at=utc_now(),
            others={uid: secs for uid, secs in confirmed.items() if uid != winner},
        )
        schedule = self.store.confirm_schedule(
            workload_key=self.workload.key,
            target_key=self.target.target_key,
            template=self.template.name,
            candidates=set(confirmed),
            winner_uid=winner,
            confirmation=confirmation,
        )
        if schedule is None or schedule.record_uid != winner:
            log.info("confirmation of %s not kept: the schedule moved meanwhile", winner)
            return None
        log.info(
            "confirmed %s: median %.6gs over %d rounds (spread %.1f%%)",
            schedule.config,
            median,
            self.confirm_rounds,
            100 * confirmation.spread,
        )
        return confirmation


def _differing_knobs(a: Config, b: Config) -> int:
    return sum(1 for name in set(a) | set(b) if a.get(name) != b.get(name))


def _library_round_result(results: list[MeasureResult]) -> MeasureResult:
    """One Baseline measurement of a library re-timed in the confirmation's rounds: each
    round's median as a repeat, so its median is the median of the round medians (the
    confirmation's own statistic)."""
    last = results[-1]
    return MeasureResult(
        MeasureStatus.OK,
        repeat_secs=tuple(r.median_secs for r in results if r.median_secs is not None),
        compile_secs=last.compile_secs,
        verify_secs=last.verify_secs,
        run_secs=sum(r.run_secs or 0.0 for r in results),
        environment={
            **last.environment,
            "confirmation_rounds": len(results),
            # Whether each round replayed a CUDA graph (GPU libraries): a round that could not
            # times Python's launch too.
            "round_graphs": [r.environment.get("graph") for r in results],
        },
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
    should_pause: Callable[[], bool] | None = None,
    pause_now: Callable[[], bool] | None = None,
    tuning_secs_before: float = 0.0,
    confirm_top: int = CONFIRM_TOP,
    models: ModelCache | None = None,
    owner: str | None = None,
    db_outage_secs: float = DB_OUTAGE_SECS,
    journal: ResultJournal | None = None,
) -> Session:
    """The Session that serves ``spec``: its template's space, the strategy (built from the
    registry with the job's context: the store's history, the template's seed configs, and
    the global model in use for the target's family, the newest the gate accepted, if any, or
    why the newest was refused), and the template's baseline library (measured if not
    stored). ``owner`` fences its writes (the job's lease holder)."""
    template = get_template(spec.template)
    history = StoreHistory(
        store, spec.workload, target, template.name, template.version, exclude_job=job_id
    )
    found = (models or ModelCache(store)).latest_model(target, template.name, template.version)
    refused = ""
    if found is not None:
        log.info("job %s: global model %s", job_id, found[0].label)
    else:
        newest = store.latest_model(
            family_key=target.family_key, template=template.name, template_version=template.version
        )
        if newest is not None and newest.accepted is False:
            refused = f"{newest.label} {newest.reason}"
            log.info("job %s: no global model in use: %s", job_id, refused)
    context = StrategyContext(
        space=template.space(spec.workload, target),
        workload=spec.workload,
        target=target,
        template=template,
        history=history,
        seed=spec.seed,
        prior=template.seed_configs(spec.workload, target),
        cost_model=found[1] if found is not None else None,
        model_refused=refused,
    )
    baseline = get_template(template.baseline_template) if template.baseline_template else None
    return Session(
        store=store,
        measurer=measurer,
        template=template,
        strategy=make_strategy(spec.strategy, context),
        workload=spec.workload,
        target=target,
        budget=spec.budget,
        job_id=job_id,
        history=history,
        on_progress=on_progress,
        should_stop=should_stop,
        should_pause=should_pause,
        pause_now=pause_now,
        baseline=baseline,
        tuning_secs_before=tuning_secs_before,
        confirm_top=confirm_top,
        owner=owner,
        db_outage_secs=db_outage_secs,
        journal=journal,
    )
