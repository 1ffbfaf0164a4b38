"""Optuna's samplers behind ask/tell: ``optuna.tpe`` (multivariate TPE) and ``optuna.cmaes``
(CMA-ES over the knobs' value positions).

Each knob is a distribution over its values (TPE: categorical; CMA-ES: the integer position
of the value in the knob's ordered values, so neighbouring block sizes are near each other).
A point Optuna suggests that breaks the space's constraints, or that was measured already,
never reaches a worker: that trial is told FAIL and the nearest valid unseen point of the
space is asked instead, as a trial of its own (Optuna's enqueued trials), so the study only
learns from points that were measured. Records are told as trials with the measured GFLOP/s
(maximised); a failed config is told as 0, a machine failure as FAIL (and may be asked again).
History records are added to the study as finished trials before the first ask.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from typing import Any

from tunehub.core import Config, KnobValue, MeasureRecord, MeasureStatus
from tunehub.tuner.model_strategy import SpaceIndex
from tunehub.tuner.strategy import Strategy, StrategyContext, register_strategy

log = logging.getLogger(__name__)

STARTUP_TRIALS = 10
# Suggestions tried before the nearest valid point is taken without asking Optuna again.
MAX_INVALID_SUGGESTIONS = 1


class OptunaStrategy(Strategy):
    """Ask/tell over an Optuna study (see the module docstring)."""

    name = "optuna.tpe"
    sampler_name = "tpe"

    def __init__(self, context: StrategyContext) -> None:
        super().__init__(context)
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self._optuna = optuna
        self._index: SpaceIndex | None = None
        self.distributions: dict[str, Any] = {}
        for knob in self.space.knobs:
            if self.sampler_name == "cmaes":
                self.distributions[knob.name] = optuna.distributions.IntDistribution(
                    0, len(knob.values) - 1
                )
            else:
                self.distributions[knob.name] = optuna.distributions.CategoricalDistribution(
                    knob.values
                )
        self.study = optuna.create_study(direction="maximize", sampler=self._sampler())
        self._trials: dict[str, Any] = {}  # config key -> optuna trial in flight
        self._told: set[str] = set()
        for config in self.prior:
            self.study.enqueue_trial(self._params(config), skip_if_exists=True)

    def _sampler(self) -> Any:
        samplers = self._optuna.samplers
        with warnings.catch_warnings():
            # multivariate/group/constant_liar are "experimental" in Optuna's own words
            warnings.simplefilter("ignore", self._optuna.exceptions.ExperimentalWarning)
            return samplers.TPESampler(
                seed=self.seed,
                n_startup_trials=STARTUP_TRIALS,
                multivariate=True,
                group=True,
                constant_liar=True,
            )

    # --- config <-> params ---------------------------------------------------------------------
    def _params(self, config: Config) -> dict[str, Any]:
        if self.sampler_name == "cmaes":
            return {k.name: k.values.index(config[k.name]) for k in self.space.knobs}
        return {k.name: config[k.name] for k in self.space.knobs}

    def _config(self, params: dict[str, Any]) -> Config:
        values: dict[str, KnobValue] = {}
        for knob in self.space.knobs:
            value = params[knob.name]
            values[knob.name] = knob.values[int(value)] if self.sampler_name == "cmaes" else value
        return Config(values)

    def _representable(self, config: Config) -> bool:
        return set(config) == set(self.space.names) and all(
            config[k.name] in k.values for k in self.space.knobs
        )

    # --- ask/tell ----------------------------------------------------------------------------
    def _candidates(self) -> Sequence[Config]:
        return ()  # ask is overridden

    def ask(self, n: int) -> list[Config]:
        out: list[Config] = []
        while len(out) < n:
            config = self._ask_one()
            if config is None:
                break
            out.append(config)
        return out

    def _ask_one(self) -> Config | None:
        if len(self._seen) >= len(self.space.points):
            return None
        for _ in range(MAX_INVALID_SUGGESTIONS + 1):
            trial = self.study.ask(self.distributions)
            config = self._config(trial.params)
            if self.space.is_valid(config) and config.key not in self._seen:
                return self._take(config, trial)
            self.study.tell(trial, state=self._optuna.trial.TrialState.FAIL)
        # Optuna keeps suggesting invalid or measured points: measure the nearest valid one.
        if self._index is None:
            self._index = SpaceIndex(self.space)
        row = self._index.nearest(config, exclude=self._seen)
        if row < 0:
            return None
        nearest = self._index.points[row]
        self.study.enqueue_trial(self._params(nearest))
        trial = self.study.ask(self.distributions)
        if self._config(trial.params) != nearest:  # another enqueued point came first
            config = self._config(trial.params)
            if not self.space.is_valid(config) or config.key in self._seen:
                self.study.tell(trial, state=self._optuna.trial.TrialState.FAIL)
                return None
            return self._take(config, trial)
        return self._take(nearest, trial)

    def _take(self, config: Config, trial: Any) -> Config:
        self._seen.add(config.key)
        self._trials[config.key] = trial
        return config

    def tell(self, records: Sequence[MeasureRecord]) -> None:
        super().tell(records)
        for record in records:
            if record.request.workload.key != self.context.workload.key:
                continue
            key = record.config.key
            trial = self._trials.pop(key, None)
            if not record.verdict:
                if trial is not None:
                    self.study.tell(trial, state=self._optuna.trial.TrialState.FAIL)
                continue
            value = record.gflops if record.status is MeasureStatus.OK else 0.0
            if key in self._told:
                if trial is not None:
                    self.study.tell(trial, state=self._optuna.trial.TrialState.FAIL)
                continue
            self._told.add(key)
            if trial is not None:
                self.study.tell(trial, value)
            elif self._representable(record.config):  # history: a finished trial
                self.study.add_trial(
                    self._optuna.trial.create_trial(
                        params=self._params(record.config),
                        distributions=self.distributions,
                        value=value,
                    )
                )


class OptunaCmaEsStrategy(OptunaStrategy):
    """``optuna.cmaes``: CMA-ES over knob-value positions (see the module docstring)."""

    name = "optuna.cmaes"
    sampler_name = "cmaes"

    def _sampler(self) -> Any:
        return self._optuna.samplers.CmaEsSampler(
            seed=self.seed, n_startup_trials=STARTUP_TRIALS, warn_independent_sampling=False
        )


register_strategy(OptunaStrategy.name, OptunaStrategy)
register_strategy(OptunaCmaEsStrategy.name, OptunaCmaEsStrategy)
