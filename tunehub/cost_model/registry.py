"""The model registry's logic: training a family's global model with held-out metrics,
loading registered models (cached), predicting for unseen shapes (cached), and the background
trainer that retrains when enough new records arrive.

Training never happens on a lookup: ``GlobalTrainer`` runs in a thread of the service (and
``tunehub`` jobs train their own online models in their Session); lookups only read the
latest accepted model through ``ModelCache``.

Every model passes a quality gate before it is used (``gate``): on the held-out workloads,
its first pick must reach at least the share of the best that the template's analytical
default reaches there (the default is what answers without a model), its ranking must
correlate with the measurements, and its predicted times must be within a factor of the
measured. A model that fails is registered all the same, refused, with the reason: it shows
on ``/models`` as a candidate and is never used.
"""

from __future__ import annotations

import logging
import math
import statistics
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tunehub.core import Config, MeasureRecord, ModelInfo, Target, Workload, utc_now
from tunehub.cost_model.predict import Pick, pick_config
from tunehub.cost_model.xgb import FeatureMismatch, XGBCostModel, group_records, normalised
from tunehub.db.store import ScheduleStore
from tunehub.workers.locks import Cancelled, cpu_work

log = logging.getLogger(__name__)

# Records read to train one global model (the newest).
TRAIN_LIMIT = 100_000
# Workloads held out, one at a time, to measure a model before it is registered.
HOLDOUT_WORKLOADS = 5
MIN_NEW_RECORDS = 200
# Boosters (seeds) averaged in a global model.
GLOBAL_ENSEMBLE = 3


# The gate (see ``gate``): held-out workloads on which the default was measured, at least;
# the median Spearman above this; the median predicted time within 2**this of the measured.
GATE_MIN_WORKLOADS = 2
GATE_MIN_SPEARMAN = 0.0
GATE_MAX_TIME_LOG2_ERROR = 2.0
# A pick that failed (share 0) counts as this share in a geometric mean.
SHARE_FLOOR = 1e-3

DefaultConfig = Callable[[Workload, Target], Config | None]


def template_default(template: str) -> DefaultConfig:
    """The template's analytical default for a workload and target (None where the template
    is unknown here or has no default for it): what the gate measures a model against."""

    def default(workload: Workload, target: Target) -> Config | None:
        from tunehub.kernels.registry import get_template

        try:
            return get_template(template).default_config(workload, target)
        except Exception:  # an unknown template, a workload it cannot run: no default
            return None

    return default


def geomean(values: Sequence[float]) -> float:
    """Geometric mean of shares of the best, each floored at SHARE_FLOOR."""
    return math.exp(statistics.fmean(math.log(max(v, SHARE_FLOOR)) for v in values))


@dataclass(frozen=True)
class HeldOut:
    """One workload held out of a model trained on the others: the model's rank correlation
    with the measured throughput, the share of the workload's best (among the configs
    measured) its first pick reaches, the share the template's analytical default reaches
    (None where the default was not measured), and |log2(predicted / measured time)| of the
    first pick (None without a predicted time)."""

    workload: Workload
    configs: int
    spearman: float  # NaN where either side is constant
    top1: float
    default: float | None
    time_log2_error: float | None


def held_out_workloads(
    template: str,
    records: Sequence[MeasureRecord],
    *,
    holdout: int | None = HOLDOUT_WORKLOADS,
    default: DefaultConfig | None = None,
) -> list[HeldOut]:
    """Leave-one-workload-out over up to ``holdout`` workloads (those where the template's
    ``default`` config was measured first, then the largest; all of them with ``holdout``
    None), each held out of a model trained as the global model is on the records of the
    others. The first pick is ``pick_config``'s without the default: the model's own choice,
    as a job's first trial and a lookup make it. Empty with fewer than two workloads."""
    from scipy.stats import spearmanr

    groups = [g for g in group_records(records, template) if any(x is not None for x in g.gflops)]
    if len(groups) < 2:
        return []
    defaults: dict[int, int] = {}  # group index -> the default config's index in it
    for i, group in enumerate(groups):
        config = default(group.workload, group.target) if default is not None else None
        keys = [c.key for c in group.configs]
        if config is not None and config.key in keys:
            defaults[i] = keys.index(config.key)
    order = sorted(range(len(groups)), key=lambda i: (i not in defaults, -len(groups[i].configs)))
    out = []
    for i in order[:holdout]:
        group = groups[i]
        train = [r for r in records if r.request.workload.key != group.workload.key]
        model = XGBCostModel(template, learn_secs=True, ensemble=GLOBAL_ENSEMBLE)
        model.fit(train)
        if not model.trained:
            continue
        measured = normalised(group.gflops)
        scores = np.asarray(model.predict(group.workload, group.target, group.configs))
        pick = pick_config(
            model, group.workload, group.target, group.configs, consensus=model.features.consensus
        )
        top = next(j for j, c in enumerate(group.configs) if c.key == pick.config.key)
        gflops = group.gflops[top]
        error = None
        if gflops and pick.predicted_secs:
            measured_secs = group.workload.flops / (gflops * 1e9)
            error = abs(math.log2(pick.predicted_secs / measured_secs))
        out.append(
            HeldOut(
                workload=group.workload,
                configs=len(group.configs),
                spearman=float(spearmanr(scores, measured).statistic),
                top1=float(measured[top]),
                default=float(measured[defaults[i]]) if i in defaults else None,
                time_log2_error=error,
            )
        )
    return out


def summarise(rows: Sequence[HeldOut]) -> dict[str, float]:
    """The held-out figures a model is registered with (see ``held_out_metrics``)."""
    rhos = [r.spearman for r in rows if math.isfinite(r.spearman)]
    errors = [r.time_log2_error for r in rows if r.time_log2_error is not None]
    paired = [(r.top1, r.default) for r in rows if r.default is not None]
    out: dict[str, float] = {"held_out_workloads": float(len(rows))}
    if rhos:
        out["spearman"] = statistics.median(rhos)
    if rows:
        out["top1_fraction"] = statistics.median(r.top1 for r in rows)
    if errors:
        out["time_log2_error"] = statistics.median(errors)
    out["compared_workloads"] = float(len(paired))
    if paired:
        out["top1_geomean"] = geomean([p for p, _ in paired])
        out["default_top1_geomean"] = geomean([d for _, d in paired])
        out["default_top1_fraction"] = statistics.median(d for _, d in paired)
    return out


def held_out_metrics(
    template: str,
    records: Sequence[MeasureRecord],
    *,
    holdout: int | None = HOLDOUT_WORKLOADS,
    default: DefaultConfig | None = None,
    rows: list[HeldOut] | None = None,
) -> dict[str, float]:
    """The held-out figures of ``held_out_workloads``:

    - ``spearman``: median rank correlation of predicted score with measured throughput;
    - ``top1_fraction``: median share of the workload's best that the first pick reaches;
    - ``time_log2_error``: median |log2(predicted / measured time)| of that pick;
    - over the ``compared_workloads`` where the default was measured: ``top1_geomean`` (the
      first pick's shares, geometric mean) and ``default_top1_geomean`` and
      ``default_top1_fraction`` (the default's shares, geometric mean and median).

    With one workload, its records are split in halves instead (``spearman`` only).
    ``rows``, where given, receives the held-out workloads' figures."""
    from scipy.stats import spearmanr

    groups = [g for g in group_records(records, template) if any(x is not None for x in g.gflops)]
    if not groups:
        return {}
    if len(groups) == 1:
        train = [r for i, r in enumerate(records) if i % 2 == 0]
        test = group_records([r for i, r in enumerate(records) if i % 2 == 1], template)
        if not test or len(test[0].configs) < 3:
            return {}
        model = XGBCostModel(template)
        model.fit(train)
        half = model.predict(test[0].workload, test[0].target, test[0].configs)
        rho = spearmanr(half, normalised(test[0].gflops)).statistic
        return {"spearman": float(rho), "held_out_workloads": 0.0}
    found = held_out_workloads(template, records, holdout=holdout, default=default)
    if rows is not None:
        rows.extend(found)
    return summarise(found)


@dataclass(frozen=True)
class GateVerdict:
    """Whether a model may be used, and the figures that decided it (one line)."""

    accepted: bool
    reason: str


def gate(metrics: Mapping[str, float]) -> GateVerdict:
    """The quality gate: a model is used only when, on the held-out workloads where the
    template's analytical default was measured (at least GATE_MIN_WORKLOADS of them), the
    geometric mean of its first pick's share of the best is at least the default's; its
    median Spearman is above GATE_MIN_SPEARMAN; and its median predicted time is within
    2**GATE_MAX_TIME_LOG2_ERROR of the measured. Otherwise it is refused, and the reason
    names each bar it missed.

    >>> gate({"compared_workloads": 3, "top1_geomean": 0.9, "default_top1_geomean": 0.8,
    ...       "spearman": 0.5, "time_log2_error": 0.3}).accepted
    True
    >>> print(gate({"compared_workloads": 5, "top1_geomean": 0.04, "default_top1_geomean": 0.8,
    ...             "spearman": -0.02, "time_log2_error": 4.8}).reason)
    ... # doctest: +NORMALIZE_WHITESPACE
    refused: first pick 4.0% of the best < the default's 80.0% (geomean over 5 held-out
    workloads); Spearman -0.020 <= 0; time error x27.9 > x4
    """
    compared = int(metrics.get("compared_workloads", 0))
    if compared < GATE_MIN_WORKLOADS:
        return GateVerdict(
            False,
            f"refused: {compared} held-out workload(s) where the default was measured, "
            f"fewer than the {GATE_MIN_WORKLOADS} needed to compare the model with it",
        )
    top = metrics.get("top1_geomean", math.nan)
    base = metrics.get("default_top1_geomean", math.nan)
    rho = metrics.get("spearman", math.nan)
    error = metrics.get("time_log2_error", math.nan)

    def pick(sign: str) -> str:
        return (
            f"first pick {100 * top:.1f}% of the best {sign} the default's {100 * base:.1f}% "
            f"(geomean over {compared} held-out workloads)"
        )

    missed = []
    if not top >= base:  # NaN fails too
        missed.append(pick("<"))
    if not rho > GATE_MIN_SPEARMAN:
        missed.append(f"Spearman {rho:.3f} <= {GATE_MIN_SPEARMAN:g}")
    if not error <= GATE_MAX_TIME_LOG2_ERROR:
        limit = 2**GATE_MAX_TIME_LOG2_ERROR
        missed.append(f"time error x{2**error:.1f} > x{limit:g}")
    if missed:
        return GateVerdict(False, "refused: " + "; ".join(missed))
    return GateVerdict(
        True,
        f"accepted: {pick('>=')}; Spearman {rho:.3f}; time error x{2**error:.2f}",
    )


def train_global_model(
    store: ScheduleStore,
    *,
    family_key: str,
    template: str,
    template_version: int,
    target_label: str = "",
    knob_names: Sequence[str] = (),
    default: DefaultConfig | None = None,
    held_out: list[HeldOut] | None = None,
) -> ModelInfo | None:
    """Train the family's global model on every stored record of the template version,
    measure it and the template's analytical ``default`` (the registry's template's, unless
    given) on held-out workloads, and register it, accepted or refused by ``gate``; None if
    there is nothing to learn. ``held_out``, where given, receives the held-out workloads'
    figures behind the metrics (for a report: see benchmarks/model_gate.py)."""
    records = store.family_records(
        family_key=family_key,
        template=template,
        template_version=template_version,
        limit=TRAIN_LIMIT,
    )
    verdicts = [r for r in records if r.verdict]
    if not any(r.gflops for r in verdicts):
        return None
    start = time.perf_counter()
    rows: list[HeldOut] = []
    metrics = held_out_metrics(
        template, verdicts, default=default or template_default(template), rows=rows
    )
    if held_out is not None:
        held_out.extend(rows)
    verdict = gate(metrics)
    model = XGBCostModel(template, knob_names=knob_names, learn_secs=True, ensemble=GLOBAL_ENSEMBLE)
    model.fit(verdicts)
    if not model.trained:
        return None
    metrics["train_secs"] = time.perf_counter() - start
    info = ModelInfo(
        family_key=family_key,
        template=template,
        template_version=template_version,
        kind=model.name,
        features=model.features.key,
        records_used=model.records_used,
        workloads_used=model.workloads_used,
        last_record_seq=max((r.seq or 0) for r in records),
        created_at=utc_now(),
        metrics=metrics,
        target_label=target_label,
        accepted=verdict.accepted,
        reason=verdict.reason,
    )
    stored = store.register_model(info, model.to_bytes())
    log.log(
        logging.INFO if verdict.accepted else logging.WARNING,
        "registered %s (%s): %d records of %d workloads, %s",
        stored.label,
        verdict.reason,
        stored.records_used,
        stored.workloads_used,
        ", ".join(f"{k} {v:.3g}" for k, v in sorted(metrics.items())),
    )
    return stored


@dataclass(frozen=True)
class Prediction:
    """A zero-trial answer for a workload on a target: the model's pick."""

    model: ModelInfo
    pick: Pick


class ModelCache:
    """Loaded models by id, the latest model per (family, template, version) for a few
    seconds, and zero-trial picks per (workload, target, model): after the first lookup of a
    shape, answering it again costs a dictionary read (plus the latest-model check, itself
    cached). Thread-safe."""

    def __init__(
        self, store: ScheduleStore, *, latest_ttl_secs: float = 5.0, max_entries: int = 4096
    ) -> None:
        self.store = store
        self.latest_ttl_secs = latest_ttl_secs
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._models: dict[int, XGBCostModel | None] = {}
        self._latest: dict[tuple[str, str, int], tuple[float, ModelInfo | None]] = {}
        self._picks: OrderedDict[tuple[str, str, int], Prediction] = OrderedDict()

    def latest(self, family_key: str, template: str, template_version: int) -> ModelInfo | None:
        """The model in use: the newest the gate accepted (refused ones are never used)."""
        key = (family_key, template, template_version)
        now = time.monotonic()
        with self._lock:
            cached = self._latest.get(key)
        if cached is not None and now - cached[0] < self.latest_ttl_secs:
            return cached[1]
        info = self.store.latest_model(
            family_key=family_key,
            template=template,
            template_version=template_version,
            accepted_only=True,
        )
        with self._lock:
            self._latest[key] = (now, info)
        return info

    def forget_latest(self) -> None:
        """Make the next ``latest`` read the store (after registering a model)."""
        with self._lock:
            self._latest.clear()

    def model(self, info: ModelInfo, knob_names: Sequence[str] = ()) -> XGBCostModel | None:
        """The loaded model of ``info``; None if its artifact is gone or its features are not
        the ones this code computes (logged once)."""
        with self._lock:
            if info.id in self._models:
                return self._models[info.id]
        blob = self.store.model_artifact(info.id)
        model: XGBCostModel | None = None
        if blob is not None:
            try:
                model = XGBCostModel.from_bytes(
                    blob, knob_names=knob_names, version=str(info.version)
                )
            except (FeatureMismatch, ValueError) as exc:
                log.warning("model %s is not usable here: %s", info.label, exc)
        with self._lock:
            self._models[info.id] = model
        return model

    def latest_model(
        self, target: Target, template: str, template_version: int, knob_names: Sequence[str] = ()
    ) -> tuple[ModelInfo, XGBCostModel] | None:
        info = self.latest(target.family_key, template, template_version)
        if info is None:
            return None
        model = self.model(info, knob_names)
        return None if model is None else (info, model)

    def cached_pick(self, workload: Workload, target: Target, info: ModelInfo) -> Prediction | None:
        """The pick kept for this shape, target and model, if any."""
        key = (workload.key, target.target_key, info.id)
        with self._lock:
            cached = self._picks.get(key)
            if cached is not None:
                self._picks.move_to_end(key)
            return cached

    def keep_pick(self, workload: Workload, target: Target, prediction: Prediction) -> None:
        """Keep a pick made elsewhere (``tunehub.tuner.lookup.predict_schedules``)."""
        with self._lock:
            self._picks[(workload.key, target.target_key, prediction.model.id)] = prediction
            while len(self._picks) > self.max_entries:
                self._picks.popitem(last=False)

    def predict(
        self,
        workload: Workload,
        target: Target,
        template: str,
        template_version: int,
        points: Callable[[], Sequence[Config]],
        winners: Callable[[], Sequence[Config]] = tuple,
        knob_names: Sequence[str] = (),
        default: Callable[[], Config | None] = lambda: None,
    ) -> Prediction | None:
        """The latest model's pick for ``workload`` among ``points()`` (called only on a
        cache miss), checked against ``winners()`` and the template's ``default()``; None
        without a usable model."""
        found = self.latest_model(target, template, template_version, knob_names)
        if found is None:
            return None
        info, model = found
        key = (workload.key, target.target_key, info.id)
        with self._lock:
            cached = self._picks.get(key)
            if cached is not None:
                self._picks.move_to_end(key)
                return cached
        prediction = Prediction(
            info,
            pick_config(
                model,
                workload,
                target,
                points(),
                winners(),
                consensus=model.features.consensus,
                default=default(),
                default_margin=model.features.default_margin,
            ),
        )
        with self._lock:
            self._picks[key] = prediction
            while len(self._picks) > self.max_entries:
                self._picks.popitem(last=False)
        return prediction


@dataclass(frozen=True)
class Trainable:
    """One (family, template, version) a trainer keeps a model of."""

    family_key: str
    template: str
    template_version: int
    target_label: str = ""


class GlobalTrainer:
    """A background thread that retrains a family's global model when ``min_new_records``
    records arrived since its latest model, accepted or refused (or it has none and has that
    many, or its latest was registered before the gate), every ``interval_secs``.
    ``trainables`` says which (family, template, version) to watch."""

    def __init__(
        self,
        store: ScheduleStore,
        trainables: Callable[[], Sequence[Trainable]],
        *,
        interval_secs: float = 60.0,
        min_new_records: int = MIN_NEW_RECORDS,
        on_model: Callable[[ModelInfo], None] | None = None,
    ) -> None:
        self.store = store
        self.trainables = trainables
        self.interval_secs = interval_secs
        self.min_new_records = max(1, min_new_records)
        self.on_model = on_model
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def due(self, item: Trainable) -> bool:
        latest = self.store.latest_model(
            family_key=item.family_key,
            template=item.template,
            template_version=item.template_version,
        )
        if latest is not None and latest.accepted is None:
            return True  # registered before the gate: never used until a gated one replaces it
        new = self.store.count_family_records(
            family_key=item.family_key,
            template=item.template,
            template_version=item.template_version,
            after=latest.last_record_seq if latest is not None else None,
        )
        return new >= self.min_new_records

    def run_once(self) -> list[ModelInfo]:
        """Retrain every family that is due; returns the models registered."""
        made = []
        for item in self.trainables():
            if self._stop.is_set():
                break
            try:
                if not self.due(item):
                    continue
                # On a core no CPU timing uses meanwhile, as the tuning loop's own work is.
                with cpu_work(cancelled=self._stop.is_set):
                    info = train_global_model(
                        self.store,
                        family_key=item.family_key,
                        template=item.template,
                        template_version=item.template_version,
                        target_label=item.target_label,
                    )
            except Cancelled:  # stopped while waiting for a core
                break
            except Exception:  # one family's failure must not stop the others
                log.exception("training the model of %s failed", item)
                continue
            if info is not None:
                made.append(info)
                if self.on_model is not None:
                    self.on_model(info)
        return made

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="tunehub-trainer", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _loop(self) -> None:
        while True:
            self.run_once()
            if self._stop.wait(self.interval_secs):
                return
