"""The ``triton.attention`` template: a flash-attention forward in Triton, its space, build, run.

The kernel (``triton_attention_kernels``) runs one program per BLOCK_M query rows of one
(batch, head), walking the keys BLOCK_N at a time with an online softmax. Knobs: ``BLOCK_M``
and ``BLOCK_N`` (the query and key tiles), ``num_warps``, and ``num_stages`` (how deep the
key loop's loads are pipelined). The space keeps tiles no larger than the sequence lengths
need and leaves out configs whose shared memory (Q's tile, and K's and V's per stage) does not
fit the device's or whose register estimate (the output accumulator and the score tile per
thread) is far past what a thread holds. This module imports neither torch nor Triton at
import time; ``run`` does, in the GPU's run sandbox (or on the CPU under TRITON_INTERPRET=1).

>>> from tunehub.core import Target, Workload
>>> h100 = Target(kind="cuda", name="H100", arch=("sm_90",), cores=132, properties={
...     "compute_capability": 90, "smem_per_block_bytes": 232448, "regs_per_sm": 65536})
>>> w = Workload.from_dict({"op": "attention", "m": 4096, "n": 4096, "k": 128,
...     "dtype": "float16", "batch": 4, "heads": 32, "causal": True})
>>> t = TritonAttentionTemplate()
>>> c = t.default_config(w, h100)
>>> c["BLOCK_M"], c["BLOCK_N"], c["num_warps"], c["num_stages"]
(128, 64, 8, 3)
>>> len(t.space(w, h100)) > 50
True
"""

from __future__ import annotations

import math
import secrets
import time
from pathlib import Path
from typing import Any

from tunehub.core import (
    Capabilities,
    Config,
    MeasureRequest,
    MeasureResult,
    MeasureStatus,
    Target,
    Workload,
)
from tunehub.kernels.base import Artifact, BuildFailed, DeviceContextLost, Template, TimingPolicy
from tunehub.kernels.space import Knob, KnobConstraint, SearchSpace
from tunehub.kernels.triton_gemm import _device, _interpreting, _synchronize, device_props

BLOCK_MS = (16, 32, 64, 128, 256)
BLOCK_NS = (16, 32, 64, 128)
WARPS = (2, 4, 8)
STAGES = (1, 2, 3, 4, 5)
# Shared memory per block where the fingerprint does not say (an A100's opt-in limit).
DEFAULT_SMEM = 166912
# fp32 values a thread may hold for the accumulator and the score tile before the config is
# left out (a thread has at most 255 registers; past this it spills heavily).
MAX_VALUES_PER_THREAD = 256
# Known-good tiles (BLOCK_M, BLOCK_N, num_warps, num_stages) per head_dim, the first that fits
# being the default: those of Triton's fused-attention tutorial for Hopper and Ampere (facts
# about its autotune list, not its code), then smaller ones for short sequences.
SEEDS = {
    64: ((128, 64, 4, 3), (128, 128, 8, 3), (64, 64, 4, 3), (128, 32, 4, 4), (64, 32, 4, 2)),
    128: ((128, 64, 8, 3), (128, 128, 8, 2), (64, 64, 4, 3), (128, 32, 8, 4), (64, 32, 4, 2)),
}
SMALL_SEEDS = ((64, 64, 4, 2), (32, 32, 4, 2), (16, 16, 2, 1), (16, 32, 4, 2))


def _pow2_at_least(n: int, floor: int) -> int:
    return max(floor, 1 << max(0, math.ceil(math.log2(max(1, n)))))


def shared_bytes(config: Config, head_dim: int, elem: int = 2) -> int:
    """Shared memory the kernel needs: Q's tile, and a K and a V tile per stage."""
    stages = max(1, int(config["num_stages"]))
    return elem * head_dim * (int(config["BLOCK_M"]) + 2 * stages * int(config["BLOCK_N"]))


def values_per_thread(config: Config, head_dim: int) -> float:
    """fp32 values per thread of the accumulator (BLOCK_M x head_dim) and the scores."""
    tile = int(config["BLOCK_M"]) * (head_dim + int(config["BLOCK_N"]))
    return tile / (32 * int(config["num_warps"]))


class TritonAttentionTemplate(Template):
    """``triton.attention``: see the module docstring."""

    name = "triton.attention"
    version = 1
    device_kind = "cuda"
    baseline_template = "torch.sdpa"
    slowest_gflops = 50.0

    def capabilities(self, target: Target) -> Capabilities:
        return Capabilities(
            kinds=("cuda",),
            ops=("attention",),
            dtypes=("float16", "bfloat16"),
            a_layouts=("row_major",),
            b_layouts=("row_major",),
            epilogues=("none",),
        )

    # --- the space ---------------------------------------------------------------------------
    def space(self, workload: Workload, target: Target) -> SearchSpace:
        head_dim = workload.k
        cap_m = _pow2_at_least(workload.m, 16)
        cap_n = _pow2_at_least(workload.n, 16)
        smem = int(device_props(target).get("smem_per_block_bytes") or DEFAULT_SMEM)

        def fits(c: Config) -> bool:
            return int(c["BLOCK_M"]) <= cap_m and int(c["BLOCK_N"]) <= cap_n

        def registers(c: Config) -> bool:
            return values_per_thread(c, head_dim) <= MAX_VALUES_PER_THREAD

        def shared(c: Config) -> bool:
            return shared_bytes(c, head_dim) <= smem

        knobs = (
            Knob("BLOCK_M", BLOCK_MS),
            Knob("BLOCK_N", BLOCK_NS),
            Knob("num_warps", WARPS),
            Knob("num_stages", STAGES),
        )
        constraints = (
            KnobConstraint(("BLOCK_M", "BLOCK_N"), fits),
            KnobConstraint(("BLOCK_M", "BLOCK_N", "num_warps"), registers),
            KnobConstraint(("BLOCK_M", "BLOCK_N", "num_warps", "num_stages"), shared),
        )
        return SearchSpace(knobs=knobs, constraints=constraints)

    def invalid_reason(self, workload: Workload, target: Target, config: Config) -> str | None:
        if self.space(workload, target).is_valid(config):
            return None
        why = "outside the space"
        if set(config) == {"BLOCK_M", "BLOCK_N", "num_warps", "num_stages"}:
            try:
                if values_per_thread(config, workload.k) > MAX_VALUES_PER_THREAD:
                    why = "the accumulator and score tile need more registers than a thread has"
                elif shared_bytes(config, workload.k) > int(
                    device_props(target).get("smem_per_block_bytes") or DEFAULT_SMEM
                ):
                    why = f"needs {shared_bytes(config, workload.k)} bytes of shared memory"
                else:
                    why = "a tile larger than the sequence, or a value not among the knob's"
            except (TypeError, ValueError):
                pass
        return f"config is not in the space of {self.name}: {why}"

    def _seeds(self, workload: Workload) -> list[Config]:
        tiles = (*SEEDS.get(workload.k, SEEDS[64]), *SMALL_SEEDS)
        return [
            Config({"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w, "num_stages": s})
            for bm, bn, w, s in tiles
        ]

    def default_config(self, workload: Workload, target: Target) -> Config:
        """The first known-good tile that fits the workload and device."""
        space = self.space(workload, target)
        for config in self._seeds(workload):
            if space.is_valid(config):
                return config
        return space.points[0]

    def seed_configs(self, workload: Workload, target: Target) -> list[Config]:
        space = self.space(workload, target)
        seeds = [c for c in self._seeds(workload) if space.is_valid(c)]
        return seeds or [space.points[0]]

    # --- where and how it runs -----------------------------------------------------------------
    def cores_used(self, config: Config) -> int:
        return 1  # the launching thread

    def baseline_config(self, config: Config, workload: Workload, target: Target) -> Config:
        """What a PyTorch user gets: scaled_dot_product_attention choosing its own backend."""
        return Config({"backend": "auto"})

    # --- build and run -------------------------------------------------------------------------
    def build(self, request: MeasureRequest, *, build_dir: Path) -> Artifact:
        """Checks the request; the kernel is compiled (into Triton's cache) by its first
        launch in the run sandbox."""
        problem = self.request_problem(request)
        if problem:
            raise BuildFailed(MeasureStatus.INVALID, problem)
        build = "none" if _interpreting() else "at first launch"
        return Artifact(
            template=self.name, key=f"attention-v{self.version}", environment={"build": build}
        )

    def run(
        self, request: MeasureRequest, artifact: Artifact, *, timing: TimingPolicy
    ) -> MeasureResult:
        """Check the kernel on fresh random Q, K, V into a NaN-poisoned O against the float32
        reference, then time it (``tunehub.kernels.gpu_timing``)."""
        import torch

        from tunehub.kernels import triton_attention_kernels as kernels
        from tunehub.kernels.gpu_timing import gpu_environment, time_gpu

        workload = request.workload
        device = _device()
        environment: dict[str, Any] = gpu_environment(device)
        environment.update(artifact.environment)
        seed = secrets.randbits(62)
        environment["seed"] = seed
        compile_secs = 0.0
        try:
            ops = kernels.operands(workload, device, seed)
            launch = kernels.bind(
                ops.q, ops.k, ops.v, ops.out, causal=ops.causal, config=request.config.to_dict()
            )
            start = time.perf_counter()
            launch()  # compiles on first launch (the Triton cache keeps it)
            _synchronize(device)
            compile_secs = time.perf_counter() - start
            start = time.perf_counter()
            ref = kernels.reference(ops)
            check = kernels.check(ops.out, ref, workload.dtype)
            del ref
            verify_secs = time.perf_counter() - start
            environment.update(relative_error=check.relative_error, tolerance=check.tolerance)
            if not check.ok:
                return MeasureResult(
                    MeasureStatus.WRONG_ANSWER,
                    error=check.message,
                    compile_secs=compile_secs,
                    verify_secs=verify_secs,
                    environment=environment,
                )
            start = time.perf_counter()
            timed = time_gpu(
                launch, min_secs=timing.min_secs, max_repeats=timing.max_repeats, device=device
            )
            run_secs = time.perf_counter() - start
        except torch.cuda.OutOfMemoryError as exc:
            return MeasureResult(
                MeasureStatus.RUNTIME_ERROR,
                error=f"out of GPU memory: {exc}"[:2000],
                compile_secs=compile_secs,
                environment=environment,
            )
        except Exception as exc:  # a compile failure (out of resources), a CUDA error
            text = f"{type(exc).__name__}: {exc}"
            failed = MeasureResult(
                MeasureStatus.RUNTIME_ERROR, error=text[-3000:], environment=environment
            )
            if "CUDA error" in text or "illegal" in text:
                raise DeviceContextLost(failed) from None
            return failed
        environment.update(graph=timed.graph, flush_bytes=timed.flush_bytes, machine=timed.machine)
        return MeasureResult(
            MeasureStatus.OK,
            repeat_secs=timed.repeat_secs,
            compile_secs=compile_secs,
            verify_secs=verify_secs,
            run_secs=run_secs,
            environment=environment,
        )
