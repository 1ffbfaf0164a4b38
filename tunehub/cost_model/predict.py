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


def pick_config(
    model: CostModel,
    workload: Workload,
    target: Target,
    points: Sequence[Config],
    winners: Sequence[Config] = (),
) -> Pick:
    """The point the model scores highest, checked against ``winners`` (the nearest tuned
    workloads' best configs that are also points of this space): a winner the model scores
    at least as high is taken instead, since it was measured fast on a similar shape."""
    if not points:
        raise ValueError("no points to choose from")
    keys = {c.key for c in points}
    candidates = list(points)
    scores = np.asarray(model.predict(workload, target, candidates), dtype=np.float64)
    best = int(np.argmax(scores))
    chosen, score, neighbour = candidates[best], float(scores[best]), False
    valid_winners = [w for w in winners if w.key in keys]
    if valid_winners:
        winner_scores = model.predict(workload, target, valid_winners)
        for config, s in zip(valid_winners, winner_scores, strict=True):
            if s >= score:
                chosen, score, neighbour = config, float(s), True
    secs = model.predict_secs(workload, target, [chosen])
    return Pick(chosen, score, secs[0] if secs else None, neighbour)
