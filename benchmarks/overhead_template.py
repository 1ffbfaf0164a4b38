"""``bench.noop``: a template whose build and run cost (almost) nothing, for benchmarks/overhead.py.

Its one knob ``i`` (0..4095) changes nothing; a run reports a fixed time. What a trial then
costs is tunehub's own machinery: strategy, sandbox round trips, locks, store commits.
Loaded into sandboxes through ``TUNEHUB_TEMPLATE_MODULES=overhead_template``.
"""

from __future__ import annotations

import os
from pathlib import Path

from tunehub.core import (
    Capabilities,
    Config,
    MeasureRequest,
    MeasureResult,
    MeasureStatus,
    Target,
    Workload,
)
from tunehub.kernels.base import Artifact, Template, TimingPolicy
from tunehub.kernels.registry import register
from tunehub.kernels.space import Knob, SearchSpace

SPACE = 4096


class NoopTemplate(Template):
    name = "bench.noop"
    version = 1

    def capabilities(self, target: Target) -> Capabilities:
        return Capabilities(kinds=("cpu",))

    def space(self, workload: Workload, target: Target) -> SearchSpace:
        return SearchSpace(knobs=(Knob("i", tuple(range(SPACE))),))

    def default_config(self, workload: Workload, target: Target) -> Config:
        return Config({"i": 0})

    def build(self, request: MeasureRequest, *, build_dir: Path) -> Artifact:
        return Artifact(template=self.name, key=str(request.config["i"]))

    def run(
        self, request: MeasureRequest, artifact: Artifact, *, timing: TimingPolicy
    ) -> MeasureResult:
        secs = 1e-3 * (1 + int(request.config["i"]) % 97 / 97)
        return MeasureResult(
            MeasureStatus.OK, repeat_secs=(secs, secs, secs), environment={"pid": os.getpid()}
        )


register(NoopTemplate())
