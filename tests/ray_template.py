"""Test-only template ``test.worker_killer``: its ``kill_worker`` config kills the process that
runs its sandbox (a Ray actor), as a machine lost mid-measurement; ``ok`` measures.

Loaded into sandboxes with ``TUNEHUB_TEMPLATE_MODULES=tests.ray_template``.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from tests.faulty_template import FaultyTemplate
from tunehub.core import Config, MeasureRequest, Target, Workload
from tunehub.kernels.base import Artifact
from tunehub.kernels.registry import register
from tunehub.kernels.space import Knob, SearchSpace


class WorkerKillerTemplate(FaultyTemplate):
    name = "test.worker_killer"

    def space(self, workload: Workload, target: Target) -> SearchSpace:
        return SearchSpace(knobs=(Knob("mode", ("ok", "kill_worker")),))

    def default_config(self, workload: Workload, target: Target) -> Config:
        return Config({"mode": "ok"})

    def build(self, request: MeasureRequest, *, build_dir: Path) -> Artifact:
        if request.config["mode"] == "kill_worker":
            os.kill(os.getppid(), signal.SIGKILL)
        return super().build(request, build_dir=build_dir)


register(WorkerKillerTemplate())
