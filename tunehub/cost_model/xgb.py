"""XGBCostModel: gradient-boosted trees over a template's features, trained on throughput
normalised within each (workload, target) (best = 1, a failed config = 0), as TVM's are.

Two boosters: ``score`` ranks configs within a workload (what search and lookups need), and,
where asked for (``learn_secs``), ``speed`` learns log2 GFLOP/s so a lookup can quote a time
for a shape nobody measured. Workloads weigh the same in training whatever their record
counts. A ``base`` model (the global model, in a job) gives every row a starting score: the
trees then learn only what this workload's records say that the base did not (xgboost's base
margin), so a handful of records correct the base instead of replacing it.

>>> from tunehub.core import Config, Target, Workload
>>> model = XGBCostModel("toy", knob_names=("X",))
>>> model.trained
False
"""

from __future__ import annotations

import base64
import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tunehub.core import Config, MeasureRecord, MeasureStatus, Target, Workload
from tunehub.cost_model.base import CostModel
from tunehub.cost_model.features import FeatureSet, Matrix, feature_set

ARTIFACT_FORMAT = "tunehub.xgboost/1"
OBJECTIVES = ("regression", "rank")


class FeatureMismatch(ValueError):
    """A saved model was trained on other features than this code computes."""


@dataclass
class _Group:
    """The records of one (workload, target) as training rows."""

    workload: Workload
    target: Target
    configs: list[Config]
    gflops: list[float | None]  # None: a failed config


def group_records(records: Sequence[MeasureRecord], template: str | None = None) -> list[_Group]:
    """Verdicts grouped by (workload, target), in first-seen order; the latest record of a
    config wins (a re-measurement)."""
    groups: dict[tuple[str, str], dict[str, tuple[Config, float | None]]] = defaultdict(dict)
    heads: dict[tuple[str, str], tuple[Workload, Target]] = {}
    for record in records:
        if not record.verdict or (template is not None and record.request.template != template):
            continue
        req = record.request
        key = (req.workload.key, req.target.target_key)
        heads.setdefault(key, (req.workload, req.target))
        gflops = record.gflops if record.status is MeasureStatus.OK else None
        groups[key][req.config.key] = (req.config, gflops)
    out = []
    for key, rows in groups.items():
        workload, target = heads[key]
        configs = [c for c, _ in rows.values()]
        out.append(_Group(workload, target, configs, [g for _, g in rows.values()]))
    return out


def normalised(gflops: Sequence[float | None]) -> np.ndarray[Any, np.dtype[np.float64]]:
    """Throughput / the group's best (failures 0); all zeros if nothing is ok."""
    values = np.array([g if g is not None else 0.0 for g in gflops], dtype=np.float64)
    best = values.max(initial=0.0)
    return values / best if best > 0 else values


class XGBCostModel(CostModel):
    """The learned model (see the module docstring). Not thread-safe while fitting; a fitted
    model predicts from any thread."""

    name = "xgboost"

    def __init__(
        self,
        template: str,
        *,
        knob_names: Sequence[str] = (),
        objective: str = "rank",
        rounds: int = 150,
        max_depth: int = 5,
        learning_rate: float = 0.1,
        threads: int = 1,
        seed: int = 0,
        learn_secs: bool = False,
        ensemble: int = 1,
        base: CostModel | None = None,
        version: str = "untrained",
    ) -> None:
        if objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
        self.template = template
        self.features: FeatureSet = feature_set(template, knob_names)
        self.objective = objective
        self.rounds = rounds
        self.params: dict[str, Any] = {
            "max_depth": max_depth,
            "eta": learning_rate,
            "subsample": 0.9,
            "colsample_bytree": 0.9,
            "min_child_weight": 1.0,
            "max_bin": 64,
            "nthread": threads,
            "seed": seed,
            "verbosity": 0,
        }
        self.learn_secs = learn_secs
        self.ensemble = max(1, ensemble)
        self.base = base
        self.version = version
        self._score: list[Any] = []  # xgboost.Boosters, one per seed; scores are averaged
        self._speed: Any = None
        self.records_used = 0
        self.workloads_used = 0
        self._records: list[MeasureRecord] = []

    @property
    def trained(self) -> bool:
        return bool(self._score)

    # --- training ----------------------------------------------------------------------------
    def fit(self, records: Sequence[MeasureRecord]) -> None:
        self._records = [r for r in records if r.verdict]
        self._fit(group_records(self._records, self.template))

    def update(self, records: Sequence[MeasureRecord]) -> None:
        """Add records and refit on everything seen (small: a job's own records)."""
        self._records.extend(r for r in records if r.verdict)
        self._fit(group_records(self._records, self.template))

    def _fit(self, groups: Sequence[_Group]) -> None:
        import xgboost as xgb

        groups = [g for g in groups if any(x is not None for x in g.gflops)]
        if not groups:
            return
        xs, ys, weights, margins, qids = [], [], [], [], []
        speed_x, speed_y = [], []
        mean_rows = sum(len(g.configs) for g in groups) / len(groups)
        for qid, group in enumerate(groups):
            x = self.features.matrix(group.workload, group.target, group.configs)
            y = normalised(group.gflops)
            xs.append(x)
            ys.append(y)
            weights.append(np.full(len(y), mean_rows / len(y)))
            qids.append(np.full(len(y), qid))
            margins.append(self._base_margin(group.workload, group.target, group.configs))
            if self.learn_secs:
                ok = np.array([g is not None for g in group.gflops])
                speed_x.append(x[ok])
                speed_y.append(np.log2([g for g in group.gflops if g is not None]))
        x_all = np.vstack(xs)
        y_all = np.concatenate(ys)
        params = dict(self.params)
        if self.objective == "rank":
            params["objective"] = "rank:pairwise"
            # ranking weights are per group
            dtrain = xgb.DMatrix(x_all, label=y_all, qid=np.concatenate(qids))
        else:
            params["objective"] = "reg:squarederror"
            dtrain = xgb.DMatrix(x_all, label=y_all, weight=np.concatenate(weights))
        if self.base is not None and self.base.trained:
            dtrain.set_base_margin(np.concatenate(margins))
        # An ensemble of seeds (row and column subsampling differ) steadies the top of the
        # ranking, which one booster's sampling noise reorders.
        self._score = [
            xgb.train({**params, "seed": params["seed"] + i}, dtrain, num_boost_round=self.rounds)
            for i in range(self.ensemble)
        ]
        if self.learn_secs and speed_x:
            dspeed = xgb.DMatrix(np.vstack(speed_x), label=np.concatenate(speed_y))
            speed_params = {**self.params, "objective": "reg:squarederror"}
            self._speed = xgb.train(speed_params, dspeed, num_boost_round=self.rounds)
        self.records_used = len(y_all)
        self.workloads_used = len(groups)

    def _base_margin(
        self, workload: Workload, target: Target, configs: Sequence[Config]
    ) -> np.ndarray[Any, np.dtype[np.float64]]:
        if self.base is None or not self.base.trained:
            return np.zeros(len(configs))
        return np.asarray(self.base.predict(workload, target, configs), dtype=np.float64)

    # --- prediction --------------------------------------------------------------------------
    def predict_matrix(
        self, x: Matrix, margin: np.ndarray[Any, np.dtype[np.float64]] | None = None
    ) -> np.ndarray[Any, np.dtype[np.float64]]:
        """Scores for a feature matrix already computed (search loops reuse theirs)."""
        if not self._score:
            raise RuntimeError("the model is not trained")
        scores = [_predict(b, x, margin) for b in self._score]
        out: np.ndarray[Any, np.dtype[np.float64]] = np.mean(scores, axis=0)
        return out

    def predict(self, workload: Workload, target: Target, configs: Sequence[Config]) -> list[float]:
        if not configs:
            return []
        x = self.features.matrix(workload, target, configs)
        margin = None
        if self.base is not None and self.base.trained:
            margin = self._base_margin(workload, target, configs)
        return [float(v) for v in self.predict_matrix(x, margin)]

    def predict_secs(
        self, workload: Workload, target: Target, configs: Sequence[Config]
    ) -> list[float] | None:
        if self._speed is None:
            return None
        if not configs:
            return []
        x = self.features.matrix(workload, target, configs)
        log_gflops = _predict(self._speed, x)
        return [workload.flops / (2.0 ** float(g) * 1e9) for g in log_gflops]

    def predict_log_gflops(self, x: Matrix) -> np.ndarray[Any, np.dtype[np.float64]] | None:
        """Predicted log2 GFLOP/s for a feature matrix already computed (rows of any
        workloads); None if the model learnt no times."""
        if self._speed is None:
            return None
        if len(x) == 0:
            return np.zeros(0)
        return _predict(self._speed, x)

    # --- artifacts ---------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        """The trained model as one self-describing artifact (JSON with the boosters in
        xgboost's binary JSON, base64)."""
        if not self._score:
            raise RuntimeError("the model is not trained")
        data = {
            "format": ARTIFACT_FORMAT,
            "template": self.template,
            "features": self.features.key,
            "feature_names": list(self.features.names),
            "objective": self.objective,
            "rounds": self.rounds,
            "params": self.params,
            "records_used": self.records_used,
            "workloads_used": self.workloads_used,
            "score": [base64.b64encode(bytes(b.save_raw("ubj"))).decode() for b in self._score],
            "speed": (
                base64.b64encode(bytes(self._speed.save_raw("ubj"))).decode()
                if self._speed is not None
                else None
            ),
        }
        return json.dumps(data).encode()

    @classmethod
    def from_bytes(
        cls, blob: bytes, *, knob_names: Sequence[str] = (), version: str = "untrained"
    ) -> XGBCostModel:
        """Load an artifact; FeatureMismatch if this code computes other features."""
        import xgboost as xgb

        data = json.loads(blob)
        if data.get("format") != ARTIFACT_FORMAT:
            raise ValueError(f"not a {ARTIFACT_FORMAT} artifact: {data.get('format')!r}")
        model = cls(
            data["template"],
            knob_names=knob_names,
            objective=data["objective"],
            rounds=int(data["rounds"]),
            version=version,
        )
        model.params.update(data.get("params", {}))
        if model.features.key != data["features"] or list(model.features.names) != list(
            data["feature_names"]
        ):
            raise FeatureMismatch(
                f"model trained on features {data['features']} ({len(data['feature_names'])} "
                f"columns); this code computes {model.features.key} "
                f"({len(model.features.names)} columns)"
            )
        scores = data["score"] if isinstance(data["score"], list) else [data["score"]]
        model._score = []
        for blob_b64 in scores:
            booster = xgb.Booster()
            booster.load_model(bytearray(base64.b64decode(blob_b64)))
            booster.set_param({"nthread": model.params["nthread"]})
            model._score.append(booster)
        model.ensemble = len(model._score)
        if data.get("speed"):
            model._speed = xgb.Booster()
            model._speed.load_model(bytearray(base64.b64decode(data["speed"])))
            model._speed.set_param({"nthread": model.params["nthread"]})
            model.learn_secs = True
        model.records_used = int(data.get("records_used", 0))
        model.workloads_used = int(data.get("workloads_used", 0))
        return model


def _predict(
    booster: Any, x: Matrix, margin: np.ndarray[Any, np.dtype[np.float64]] | None = None
) -> np.ndarray[Any, np.dtype[np.float64]]:
    """A booster's predictions for the rows of ``x``, straight from the array (no DMatrix:
    building one cost more than the prediction for a lookup's few dozen rows) on the
    booster's own threads (the model's ``threads``, 1 by default: a lookup's prediction is
    too small to share, and OpenMP threads waiting for a busy machine's cores took tens of
    milliseconds a call on the 2-core VM)."""
    out = booster.inplace_predict(np.asarray(x, dtype=np.float32), base_margin=margin)
    return np.asarray(out, dtype=np.float64)
