"""A test-only template whose ``mode`` knob makes measure succeed, crash, hang, lie, raise...

Loaded into sandbox processes with ``TUNEHUB_TEMPLATE_MODULES=tests.faulty_template``.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np

from tunehub.core import Config, MeasureRequest, MeasureResult, MeasureStatus, Target, Workload
from tunehub.kernels.base import Template
from tunehub.kernels.registry import register
from tunehub.kernels.space import Knob, SearchSpace

MODES = ("ok", "crash", "hang", "wrong", "raise", "exit", "noisy")


class FaultyTemplate(Template):
    name = "test.faulty"
    version = 1

    def space(self, workload: Workload, target: Target) -> SearchSpace:
        return SearchSpace(knobs=(Knob("mode", MODES),))

    def default_config(self, workload: Workload, target: Target) -> Config:
        return Config({"mode": "ok"})

    def measure(
        self, request: MeasureRequest, *, workdir: Path, min_secs: float, max_repeats: int
    ) -> MeasureResult:
        mode = request.config["mode"]
        if mode == "crash":
            os.kill(os.getpid(), signal.SIGSEGV)
        if mode == "exit":
            os._exit(7)
        if mode == "hang":
            while True:
                time.sleep(3600)
        if mode == "raise":
            raise RuntimeError("faulty template was asked to raise")
        if mode == "noisy":
            # stray output must not reach the sandbox's protocol channel
            print("noise from the template (print)")
            os.write(1, b"noise from the template (fd 1)\n")
        if mode == "wrong":
            return MeasureResult(MeasureStatus.WRONG_ANSWER, error="deliberately wrong")
        # ok: time a real (small) matmul so the result carries genuine times
        w = request.workload
        a = np.ones((w.m, w.k))
        b = np.ones((w.k, w.n))
        secs = []
        for _ in range(max(1, min(3, max_repeats))):
            start = time.perf_counter()
            a @ b
            secs.append(time.perf_counter() - start)
        return MeasureResult(
            MeasureStatus.OK, repeat_secs=tuple(secs), environment={"pid": os.getpid()}
        )


register(FaultyTemplate())
