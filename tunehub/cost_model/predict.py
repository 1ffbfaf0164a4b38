"""Zero-trial picks: the config a trained model ranks first for a workload nobody measured."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tunehub.core import Config, Target, Workload
from tunehub.cost_model.base import CostModel


@dataclass(frozen=True)
class Pick:
    """The chosen config, its score, its predicted time (None if the model has no times), and
    whether it came from a neighbour's winner rather than the model's own first choice."""

    config: Config
    score: float
    predicted_secs: float | None
    from_neighbour: bool = False


def medoid(configs: Sequence[Config], universe: Sequence[Config]) -> int:
    """Index of the config among ``configs`` with the least total distance to the others.
    A knob's distance is the gap between the two values' positions among the values that
    knob takes in ``universe`` (sorted), over the number of positions: two neighbouring
    block sizes are close whatever their ratio."""
    if len(configs) <= 2:
        return 0
    knobs = sorted({k for c in configs for k in c})
    dist = np.zeros((len(configs), len(configs)))
    for knob in knobs:
        values = sorted({c[knob] for c in universe if knob in c}, key=lambda v: (str(type(v)), v))
        position: dict[tuple[type, object], int] = {(type(v), v): i for i, v in enumerate(values)}
        span = max(1, len(values) - 1)
        at = np.array(
            [position.get((type(c.get(knob)), c.get(knob)), 0) for c in configs], dtype=np.float64
        )
        dist += np.abs(at[:, None] - at[None, :]) / span
    return int(np.argmin(dist.sum(axis=1)))


def pick_config(
    model: CostModel,
    workload: Workload,
    target: Target,
    points: Sequence[Config],
    winners: Sequence[Config] = (),
    *,
    consensus: int,
    default: Config | None = None,
    default_margin: float = 0.0,
) -> Pick:
    """The model's zero-trial choice among ``points``: the medoid of the ``consensus``
    best-scored points (the feature set's, see features.FeatureSet: where a model overrates
    extreme corners, e.g. KC=32 for K=16384 on the CPU at 0.49 of the best, the centre of
    the region it likes is the safer bet; 1 is the argmax), then checked against
    ``winners`` (the nearest tuned workloads' best configs that are also points of this
    space): a winner the model scores at least as high is taken instead, since it was
    measured fast on a similar shape. Last, the template's analytical ``default`` (a point
    of the space; its seeds were measured good) is taken where the model predicts it at
    least as fast as that choice (by time where it learnt times, else by score), or slower
    by no more than ``default_margin`` (a share of the choice's predicted time: differences
    the model cannot be trusted to tell)."""
    if not points:
        raise ValueError("no points to choose from")
    candidates = list(points)
    scores = np.asarray(model.predict(workload, target, candidates), dtype=np.float64)
    top = np.argsort(-scores, kind="stable")[: max(1, consensus)]
    best = int(top[medoid([candidates[int(i)] for i in top], candidates)])
    chosen, score, neighbour = candidates[best], float(scores[best]), False
    keys = {c.key for c in candidates} if winners else set()
    valid_winners = [w for w in winners if w.key in keys]
    if valid_winners:
        winner_scores = model.predict(workload, target, valid_winners)
        for config, s in zip(valid_winners, winner_scores, strict=True):
            if s >= score:
                chosen, score, neighbour = config, float(s), True
    if default is not None and default.key != chosen.key and default in candidates:
        # By predicted time where the model learnt times (its scores rank within a
        # workload's configs, its times across them; on the H100 datasets the two disagreed
        # on waves_3000x1000x4000, where the time was right), else by score.
        (default_score,) = model.predict(workload, target, [default])
        both = model.predict_secs(workload, target, [chosen, default])
        faster = both[1] <= both[0] * (1.0 + default_margin) if both else default_score >= score
        if faster:
            chosen, score, neighbour = default, float(default_score), False
    secs = model.predict_secs(workload, target, [chosen])
    return Pick(chosen, score, secs[0] if secs else None, neighbour)
