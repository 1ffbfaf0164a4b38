"""Template: a kernel generator plus its search space; the build/run split every worker uses."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import ClassVar

from tunehub.core import Config, MeasureRequest, MeasureResult, Target, Workload
from tunehub.kernels.space import SearchSpace


class Template(ABC):
    """A kernel family, e.g. ``"blis.gemm"``.

    ``measure`` is called inside a sandbox process (see ``tunehub.workers``): it may crash or
    hang, and the worker survives. It builds the candidate (Builder), checks its output against
    a reference on fresh random inputs into a NaN-poisoned buffer, then times it (Runner), and
    returns a MeasureResult whose status says how it ended. It never returns sentinel times.
    """

    name: str
    version: int
    # A baseline template times a vendor library: its results are Baselines, never Schedules,
    # and it is not offered for tuning jobs.
    baseline: ClassVar[bool] = False
    # The baseline template a job of this template is compared against, if any.
    baseline_template: ClassVar[str | None] = None

    @abstractmethod
    def space(self, workload: Workload, target: Target) -> SearchSpace:
        """The knobs and constraints for this workload on this target."""

    @abstractmethod
    def default_config(self, workload: Workload, target: Target) -> Config:
        """A config that is always valid and reasonable, used when nothing is tuned."""

    def seed_configs(self, workload: Workload, target: Target) -> list[Config]:
        """Configs a search should measure first (the default; templates add model variants)."""
        return [self.default_config(workload, target)]

    def supports(self, workload: Workload, target: Target) -> str | None:
        """None if this template can run ``workload`` on ``target``, else the reason it can't."""
        return None

    @abstractmethod
    def measure(
        self, request: MeasureRequest, *, workdir: Path, min_secs: float, max_repeats: int
    ) -> MeasureResult:
        """Build, verify and time one config (called in a sandbox process)."""
