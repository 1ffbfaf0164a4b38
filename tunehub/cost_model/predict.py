"""Zero-trial picks: the config a trained model ranks first for a workload nobody measured."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tunehub.core import Config, Target, Workload
from tunehub.cost_model.base import CostModel
from tunehub.cost_model.xgb import XGBCostModel


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


# Zero-trial picks for shapes nobody measured, in bulk and in bounded time: instead of the
# whole space (enumerated and scored: 0.3-0.5 s a shape on the 2-core VM), each shape's
# candidates are its template's seeds (the analytical default and its variants), the
# default's one-step neighbours, the nearest tuned shapes' winners and a pool of configs
# that won elsewhere on the target, those valid in its space; every shape's candidates are
# scored in one call of the model.
CANDIDATE_CONSENSUS = 1  # the medoid of this many best-scored candidates (see pick_config)


@dataclass(frozen=True)
class PickRequest:
    """One shape to pick for: its ``candidates`` (valid points of its space; the first
    ``len(winners)`` of ``winners`` that are candidates are checked as pick_config does),
    and the template's ``default`` (a candidate too, or None)."""

    workload: Workload
    target: Target
    candidates: Sequence[Config]
    winners: Sequence[Config] = ()
    default: Config | None = None


def candidates(
    space_valid: Callable[[Config], bool],
    seeds: Sequence[Config],
    neighbours: Sequence[Config],
    winners: Sequence[Config],
    pool: Sequence[Config],
) -> list[Config]:
    """Distinct configs, in this order: ``seeds`` and ``neighbours`` (points of the space
    already), then the ``winners`` and ``pool`` configs ``space_valid`` accepts."""
    out: dict[str, Config] = {}
    for config in (*seeds, *neighbours):
        out.setdefault(config.key, config)
    for config in (*winners, *pool):
        if config.key not in out and space_valid(config):
            out[config.key] = config
    return list(out.values())


def pick_many(
    model: XGBCostModel,
    requests: Sequence[PickRequest],
    *,
    consensus: int = CANDIDATE_CONSENSUS,
    default_margin: float = 0.0,
) -> list[Pick]:
    """``pick_config`` for each request among its candidates, with the model run twice in
    all (scores, then the predicted times of each choice and its default) however many
    requests there are."""
    if not requests:
        return []
    if any(not r.candidates for r in requests):
        raise ValueError("no points to choose from")
    blocks = [model.features.matrix(r.workload, r.target, r.candidates) for r in requests]
    bounds = np.cumsum([0, *(len(b) for b in blocks)])
    scores = model.predict_matrix(np.vstack(blocks))
    chosen: list[tuple[int, bool]] = []  # (candidate index, from a neighbour's winner)
    for i, r in enumerate(requests):
        own = scores[bounds[i] : bounds[i + 1]]
        top = np.argsort(-own, kind="stable")[: max(1, consensus)]
        best = int(top[medoid([r.candidates[int(j)] for j in top], r.candidates)])
        neighbour = False
        if r.winners:
            index = {c.key: j for j, c in enumerate(r.candidates)}
            for w in r.winners:
                j = index.get(w.key)
                if j is not None and own[j] >= own[best]:
                    best, neighbour = j, True
        chosen.append((best, neighbour))
    # Predicted times of each choice and its default, in one call.
    rows: list[np.ndarray[Any, np.dtype[np.float64]]] = []
    pairs: list[tuple[int, int | None]] = []
    for i, (r, (best, _)) in enumerate(zip(requests, chosen, strict=True)):
        d = None
        if r.default is not None and r.default.key != r.candidates[best].key:
            d = next((j for j, c in enumerate(r.candidates) if c.key == r.default.key), None)
        pairs.append((len(rows), d))
        rows.append(blocks[i][best])
        if d is not None:
            rows.append(blocks[i][d])
    speed = model.predict_log_gflops(np.vstack(rows))  # log2 GFLOP/s, or None
    picks = []
    for i, (r, (best, neighbour)) in enumerate(zip(requests, chosen, strict=True)):
        own = scores[bounds[i] : bounds[i + 1]]
        at, d = pairs[i]
        if d is not None:
            # As pick_config: by predicted time where the model learnt times, else by score.
            # (time = flops / speed: the default's time within the margin of the choice's)
            faster = (
                2.0 ** (speed[at] - speed[at + 1]) <= 1.0 + default_margin
                if speed is not None
                else own[d] >= own[best]
            )
            if faster:
                best, neighbour, at = d, False, at + 1
        picks.append(
            Pick(
                r.candidates[best],
                float(own[best]),
                r.workload.flops / (2.0 ** float(speed[at]) * 1e9) if speed is not None else None,
                neighbour,
            )
        )
    return picks
