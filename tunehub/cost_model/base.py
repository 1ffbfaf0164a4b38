"""CostModel: predicts how good configs are for a workload on a target, learned from records.

A model scores configs; higher is better. Scores are only comparable within one (workload,
target): models are trained on throughput normalised within each workload (best = 1), as
TVM's are, so ``predict`` ranks candidates and ``predict_secs`` (where the model also learned
absolute speed) estimates a time for a lookup that has no measurement.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Sequence

from tunehub.core import Config, MeasureRecord, Target, Workload


class CostModel(ABC):
    """The interface every cost model implements (an XGBoost model, the random double)."""

    name: str
    # Identifies the trained state: a registry version, or "online" for a model fit in a job.
    version: str = "untrained"

    @property
    @abstractmethod
    def trained(self) -> bool:
        """Whether ``predict`` says anything better than chance."""

    @abstractmethod
    def fit(self, records: Sequence[MeasureRecord]) -> None:
        """Train (from scratch) on these records; machine failures are ignored, other failed
        records teach the model that a config is bad."""

    def update(self, records: Sequence[MeasureRecord]) -> None:
        """Learn from new records (online, within a job). Default: nothing."""
        return None

    @abstractmethod
    def predict(self, workload: Workload, target: Target, configs: Sequence[Config]) -> list[float]:
        """A score per config, higher is better, comparable within this workload only."""

    def predict_secs(
        self, workload: Workload, target: Target, configs: Sequence[Config]
    ) -> list[float] | None:
        """Estimated seconds per config, or None if this model does not estimate times."""
        return None


class RandomCostModel(CostModel):
    """The in-memory double: seeded random scores, never trained.

    >>> RandomCostModel(seed=1).predict(None, None, [Config({}), Config({})])  # type: ignore
    [0.13436424411240122, 0.8474337369372327]
    """

    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(seed)

    @property
    def trained(self) -> bool:
        return False

    def fit(self, records: Sequence[MeasureRecord]) -> None:
        return None

    def predict(self, workload: Workload, target: Target, configs: Sequence[Config]) -> list[float]:
        return [self._rng.random() for _ in configs]
