"""The model registry's logic: training a family's global model with held-out metrics,
loading registered models (cached), predicting for unseen shapes (cached), and the background
trainer that retrains when enough new records arrive.

Training never happens on a lookup: ``GlobalTrainer`` runs in a thread of the service (and
``tunehub`` jobs train their own online models in their Session); lookups only read the
latest registered model through ``ModelCache``.
"""

from __future__ import annotations

import logging
import math
import statistics
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from tunehub.core import Config, MeasureRecord, ModelInfo, Target, Workload, utc_now
from tunehub.cost_model.predict import Pick, pick_config
from tunehub.cost_model.xgb import FeatureMismatch, XGBCostModel, group_records, normalised
from tunehub.db.store import ScheduleStore

log = logging.getLogger(__name__)

# Records read to train one global model (the newest).
TRAIN_LIMIT = 100_000
# Workloads held out, one at a time, to measure a model before it is registered.
HOLDOUT_WORKLOADS = 5
MIN_NEW_RECORDS = 200
# Boosters (seeds) averaged in a global model.
GLOBAL_ENSEMBLE = 3


def held_out_metrics(
    template: str, records: Sequence[MeasureRecord], *, holdout: int = HOLDOUT_WORKLOADS
) -> dict[str, float]:
    """Leave-one-workload-out figures over up to ``holdout`` workloads (the largest): median
    Spearman of predicted score against measured throughput, median share of the workload's
    best reached by the model's first pick among the configs measured, and the median
    |log2(predicted time / measured time)| of that pick. With one workload, its records are
    split in halves instead (``spearman`` only)."""
    from scipy.stats import spearmanr

    groups = [g for g in group_records(records, template) if any(x is not None for x in g.gflops)]
    if not groups:
        return {}
    if len(groups) == 1:
        (group,) = groups
        train = [r for i, r in enumerate(records) if i % 2 == 0]
        test = group_records([r for i, r in enumerate(records) if i % 2 == 1], template)
        if not test or len(test[0].configs) < 3:
            return {}
        model = XGBCostModel(template)
        model.fit(train)
        half = model.predict(test[0].workload, test[0].target, test[0].configs)
        rho = spearmanr(half, normalised(test[0].gflops)).statistic
        return {"spearman": float(rho), "held_out_workloads": 0.0}
    rhos, tops, errors = [], [], []
    for group in sorted(groups, key=lambda g: -len(g.configs))[:holdout]:
        key = (group.workload.key, group.target.target_key)
        train = [
            r
            for r in records
            if (r.request.workload.key, r.request.target.target_key) != key
            and r.request.workload.key != group.workload.key
        ]
        model = XGBCostModel(template, learn_secs=True, ensemble=GLOBAL_ENSEMBLE)
        model.fit(train)
        if not model.trained:
            continue
        measured = normalised(group.gflops)
        scores = np.asarray(model.predict(group.workload, group.target, group.configs))
        rho = spearmanr(scores, measured).statistic
        if math.isfinite(rho):
            rhos.append(float(rho))
        top = int(np.argmax(scores))
        tops.append(float(measured[top]))
        gflops = group.gflops[top]
        secs = model.predict_secs(group.workload, group.target, [group.configs[top]])
        if gflops and secs:
            measured_secs = group.workload.flops / (gflops * 1e9)
            errors.append(abs(math.log2(secs[0] / measured_secs)))
    out: dict[str, float] = {"held_out_workloads": float(len(tops))}
    if rhos:
        out["spearman"] = statistics.median(rhos)
    if tops:
        out["top1_fraction"] = statistics.median(tops)
    if errors:
        out["time_log2_error"] = statistics.median(errors)
    return out


def train_global_model(
    store: ScheduleStore,
    *,
    family_key: str,
    template: str,
    template_version: int,
    target_label: str = "",
    knob_names: Sequence[str] = (),
) -> ModelInfo | None:
    """Train the family's global model on every stored record of the template version,
    measure it on held-out workloads, and register it; None if there is nothing to learn."""
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
    metrics = held_out_metrics(template, verdicts)
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
    )
    stored = store.register_model(info, model.to_bytes())
    log.info(
        "registered %s: %d records of %d workloads, %s",
        stored.label,
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
        key = (family_key, template, template_version)
        now = time.monotonic()
        with self._lock:
            cached = self._latest.get(key)
        if cached is not None and now - cached[0] < self.latest_ttl_secs:
            return cached[1]
        info = self.store.latest_model(
            family_key=family_key, template=template, template_version=template_version
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
    records arrived since its latest model (or it has none and has that many), every
    ``interval_secs``. ``trainables`` says which (family, template, version) to watch."""

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
                info = train_global_model(
                    self.store,
                    family_key=item.family_key,
                    template=item.template,
                    template_version=item.template_version,
                    target_label=item.target_label,
                )
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
