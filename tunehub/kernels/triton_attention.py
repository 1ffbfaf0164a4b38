"""The ``triton.attention`` template: a flash-attention forward in Triton, its space, build, run.

The kernel (``triton_attention_kernels``) runs one program per BLOCK_M query rows of one
(batch, head), walking the keys BLOCK_N at a time with an online softmax in base 2; only the
key blocks on the causal diagonal or past the end are masked, and blocks above the diagonal
are never read. Knobs: ``BLOCK_M`` and ``BLOCK_N`` (the query and key tiles), ``num_warps``,
``num_stages`` (how deep the key loop's loads are pipelined), and on Hopper and later ``TMA``
(Q, K, V and O through tensor descriptors made in the kernel) and, with TMA on sm_90,
``WARP_SPECIALIZE`` (Triton's warp specialisation of the key loop: a producer warpgroup
issuing the TMA loads and two consumer warpgroups, 12 warps for ``num_warps=4``), and on
sm_90 ``GLUON`` (the kernel written in Gluon, ``triton_attention_gluon``: each block's softmax
runs while the previous block's P @ V product is on the tensor cores; 16 query rows a warp,
``num_stages`` slots of K and V).

The space keeps tiles no larger than the sequence lengths need, and leaves out configs whose
shared memory does not fit the device's or whose register estimate (the output accumulator
and the score tile per thread) is past what ptxas holds without heavy spills (calibrated on
sm_90 builds: ``benchmarks/notes/attention_hopper.md``), and warp specialisation where
Triton 3.6 does not apply it (``num_warps`` other than 4 silently compiles the plain loop) or
where its kernels computed wrong outputs on an H200: any ``num_stages`` but 2 (non-finite
outputs at 3; ``attention_gpu-persistent-h200-20261127T0706.json``). Causal attention is in
(its mask written in the form Triton's split keeps right; the kernels' comments say why).
This module imports neither torch nor Triton at import time; ``run`` does, in the GPU's run
sandbox (or on the CPU under TRITON_INTERPRET=1).

>>> from tunehub.core import Target, Workload
>>> h100 = Target(kind="cuda", name="H100", arch=("sm_90",), cores=132, properties={
...     "compute_capability": 90, "smem_per_block_bytes": 232448, "regs_per_sm": 65536})
>>> w = Workload.from_dict({"op": "attention", "m": 4096, "n": 4096, "k": 128,
...     "dtype": "float16", "batch": 4, "heads": 32, "causal": True})
>>> t = TritonAttentionTemplate()
>>> c = t.default_config(w, h100)
>>> c["BLOCK_M"], c["BLOCK_N"], c["num_warps"], c["num_stages"], c["GLUON"]
(64, 64, 4, 2, True)
>>> len(t.space(w, h100)) > 100
True
"""

from __future__ import annotations

import math
import os
import time
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
from tunehub.kernels.base import (
    Artifact,
    BuildFailed,
    Template,
    TimingPolicy,
    compile_errors,
)
from tunehub.kernels.space import Knob, KnobConstraint, SearchSpace
from tunehub.kernels.triton_gemm import (
    _device,
    _interpreting,
    capability_of,
    device_props,
)

BLOCK_MS = (16, 32, 64, 128, 256)
BLOCK_NS = (16, 32, 64, 128)
WARPS = (2, 4, 8)
STAGES = (1, 2, 3, 4, 5)
# Shared memory per block where the fingerprint does not say (an A100's opt-in limit).
DEFAULT_SMEM = 166912
# fp32 values a thread may hold for the accumulator and the score tile before the config is
# left out. On sm_90 builds (Triton 3.6) 128 per thread compile without spills, 192 spill a
# little (40-160 bytes of stack when causal) and 256 spill hundreds of bytes.
MAX_VALUES_PER_THREAD = 192
# Seeds (BLOCK_M, BLOCK_N, num_warps, num_stages, loads) per head_dim, where loads is "ptr"
# (pointer loads), "tma" (tensor descriptors) or "ws" (tma with warp specialisation), the
# first that fits being the default. Hopper's follow what Triton's fused-attention tutorial
# keeps on sm_90 (BLOCK_M 128, 8 warps for 128 x 128 tiles, 4 below; facts about its autotune
# list, not its code) and FlashAttention-3's producer/consumer split, ordered by what was
# fastest on an H200 over 15 LLaMA/Mistral/ViT shapes (attention_gpu-h200-20261126T1457.json,
# attention_gpu-persistent-h200-20261127T0706.json): ws 128x128 with 4 warps for full
# attention at head dim 128 (3 of 3 shapes), 128x64 pointer loads with 8 warps at 64 (and
# 64x64 for ViT's 257 tokens); for causal attention (HOPPER_CAUSAL_FIRST) 64x64 pointer-load
# tiles, fastest on 7 of 9 (fewer wasted keys on the diagonal), then tma 128x128 with 8
# warps (8,192 tokens); warp-specialised seeds for full attention only
# (attention_gpu-wscausal-h200-20261127T0918.json).
# Then pointer-load tiles for older GPUs; then smaller ones for short sequences.
HOPPER_SEEDS = {
    64: (
        (128, 64, 8, 3, "ptr"), (64, 64, 4, 3, "ptr"), (128, 64, 4, 3, "tma"),
        (128, 64, 8, 3, "tma"), (128, 128, 4, 2, "ws"), (128, 64, 4, 2, "ws"),
    ),
    128: (
        (128, 128, 4, 2, "ws"), (128, 128, 8, 3, "tma"), (128, 64, 8, 3, "ptr"),
        (128, 64, 4, 2, "ws"), (128, 64, 8, 3, "tma"), (64, 64, 4, 3, "tma"),
    ),
}  # fmt: skip
HOPPER_CAUSAL_FIRST = (64, 64, 4, 3, "ptr")
# Ahead of those, the Gluon kernel ("gluon"), fastest on 14 of 16 shapes on an H200
# (attention_gpu-v3-h200-20261127T1015.json; 11 of 15 in attention_gpu-gluon-h200-
# 20261127T0934.json): 64 x 64 tiles, one warpgroup and 2 stages first (best on 9); at
# head_dim 128 then 64 x 128 with one stage (best at 8,192 causal tokens and in two full
# shapes), at 64, 64 x 128 and 128 x 64 with 8 warps (best at 4,096 full tokens).
HOPPER_GLUON = {
    64: ((64, 64, 4, 2, "gluon"), (64, 128, 4, 2, "gluon"), (128, 64, 8, 2, "gluon")),
    128: ((64, 64, 4, 2, "gluon"), (64, 128, 4, 1, "gluon"), (64, 64, 4, 3, "gluon")),
}  # fmt: skip
SEEDS = {
    64: (
        (128, 64, 4, 3, "ptr"), (128, 128, 8, 3, "ptr"), (64, 64, 4, 3, "ptr"),
        (128, 32, 4, 4, "ptr"), (64, 32, 4, 2, "ptr"),
    ),
    128: (
        (128, 64, 8, 3, "ptr"), (128, 128, 8, 2, "ptr"), (64, 64, 4, 3, "ptr"),
        (128, 32, 8, 4, "ptr"), (64, 32, 4, 2, "ptr"),
    ),
}  # fmt: skip
SMALL_SEEDS = (
    (64, 64, 4, 2, "ptr"), (32, 32, 4, 2, "ptr"), (16, 16, 2, 1, "ptr"), (16, 32, 4, 2, "ptr"),
)  # fmt: skip


def _pow2_at_least(n: int, floor: int) -> int:
    return max(floor, 1 << max(0, math.ceil(math.log2(max(1, n)))))


def _on(config: Config, key: str) -> bool:
    return bool(config.get(key, False))


def _gluon_problem(config: Config) -> str | None:
    """Why a ``GLUON`` config is outside the space (the Gluon kernel loads through TMA of its
    own and takes 16 query rows a warp), or None; None for any other config."""
    if not _on(config, "GLUON"):
        return None
    if not _on(config, "TMA") or _on(config, "WARP_SPECIALIZE"):
        return "GLUON needs TMA on and WARP_SPECIALIZE off"
    if int(config["num_warps"]) not in (4, 8) or int(config["BLOCK_M"]) != 16 * int(
        config["num_warps"]
    ):
        return "GLUON takes 16 query rows a warp: BLOCK_M=64 with 4 warps or 128 with 8"
    return None


def shared_bytes(config: Config, head_dim: int, elem: int = 2) -> int:
    """Shared memory the kernel needs: Q's tile and a K and a V tile per stage; warp
    specialisation adds O's staging tile and a K/V handoff (at least 128 rows of O, measured
    on sm_90 builds: 17-33 KiB), and TMA its barriers."""
    stages = max(1, int(config["num_stages"]))
    block_m, block_n = int(config["BLOCK_M"]), int(config["BLOCK_N"])
    total = elem * head_dim * (block_m + 2 * stages * block_n)
    if _on(config, "WARP_SPECIALIZE"):
        total += elem * head_dim * (max(block_m, 128) + block_n)
    if _on(config, "TMA"):
        total += 1024
    return total


def values_per_thread(config: Config, head_dim: int) -> float:
    """fp32 values per thread of the accumulator (BLOCK_M x head_dim) and the scores; with
    warp specialisation two consumer warpgroups (8 warps) hold them."""
    tile = int(config["BLOCK_M"]) * (head_dim + int(config["BLOCK_N"]))
    warps = 8 if _on(config, "WARP_SPECIALIZE") else int(config["num_warps"])
    return tile / (32 * warps)


class TritonAttentionTemplate(Template):
    """``triton.attention``: see the module docstring."""

    name = "triton.attention"
    # 2: masks only on the diagonal and last key blocks, causal tiles launched longest first,
    # the TMA and WARP_SPECIALIZE knobs (records of version 1 time other code).
    # 3: the GLUON knob (configs of version 2 lack it; their kernels are unchanged).
    version = 3
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
        capability = capability_of(target)

        def fits(c: Config) -> bool:
            return int(c["BLOCK_M"]) <= cap_m and int(c["BLOCK_N"]) <= cap_n

        def registers(c: Config) -> bool:
            return values_per_thread(c, head_dim) <= MAX_VALUES_PER_THREAD

        def shared(c: Config) -> bool:
            return shared_bytes(c, head_dim) <= smem

        def specialised(c: Config) -> bool:
            # Triton 3.6 specialises the loop only from TMA loads, with num_warps=4 (other
            # counts compile the plain loop: the same kernel as WARP_SPECIALIZE off), and its
            # specialised kernels wrote non-finite outputs on the H200 at 3 stages.
            return not _on(c, "WARP_SPECIALIZE") or (
                _on(c, "TMA") and int(c["num_warps"]) == 4 and int(c["num_stages"]) == 2
            )

        def gluon(c: Config) -> bool:
            return _gluon_problem(c) is None

        tma = (False, True) if capability >= 90 else (False,)
        hopper = (False, True) if capability // 10 == 9 else (False,)  # sm_90's own knobs
        knobs = (
            Knob("BLOCK_M", BLOCK_MS),
            Knob("BLOCK_N", BLOCK_NS),
            Knob("num_warps", WARPS),
            Knob("num_stages", STAGES),
            Knob("TMA", tma),
            Knob("WARP_SPECIALIZE", hopper),
            Knob("GLUON", hopper),
        )
        constraints = (
            KnobConstraint(("BLOCK_M", "BLOCK_N"), fits),
            KnobConstraint(("num_warps", "num_stages", "TMA", "WARP_SPECIALIZE"), specialised),
            KnobConstraint(("BLOCK_M", "BLOCK_N", "num_warps", "WARP_SPECIALIZE"), registers),
            KnobConstraint(("BLOCK_M", "BLOCK_N", "num_stages", "TMA", "WARP_SPECIALIZE"), shared),
            KnobConstraint(
                ("BLOCK_M", "BLOCK_N", "num_warps", "TMA", "WARP_SPECIALIZE", "GLUON"), gluon
            ),
        )
        return SearchSpace(knobs=knobs, constraints=constraints)

    def invalid_reason(self, workload: Workload, target: Target, config: Config) -> str | None:
        if self.space(workload, target).is_valid(config):
            return None
        why = "outside the space"
        names = {
            "BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "TMA", "WARP_SPECIALIZE", "GLUON"
        }  # fmt: skip
        try:
            if set(config) != names:
                missing, unknown = sorted(names - set(config)), sorted(set(config) - names)
                why = f"its knobs are {sorted(names)}" + (f"; {missing} missing" if missing else "")
                why += f"; {unknown} unknown" if unknown else ""
            elif _on(config, "WARP_SPECIALIZE") and not (
                _on(config, "TMA") and int(config["num_warps"]) == 4
            ):
                why = "WARP_SPECIALIZE needs TMA and num_warps=4"
            elif _on(config, "WARP_SPECIALIZE") and int(config["num_stages"]) != 2:
                why = "WARP_SPECIALIZE computed wrong outputs on Hopper except at num_stages=2"
            elif (_on(config, "TMA") and capability_of(target) < 90) or (
                (_on(config, "WARP_SPECIALIZE") or _on(config, "GLUON"))
                and capability_of(target) // 10 != 9
            ):
                why = "TMA needs sm_90 or later, WARP_SPECIALIZE and GLUON sm_90"
            elif gluon_problem := _gluon_problem(config):
                why = gluon_problem
            elif values_per_thread(config, workload.k) > MAX_VALUES_PER_THREAD:
                why = "the accumulator and score tile need more registers than a thread has"
            elif (needed := shared_bytes(config, workload.k)) > int(
                device_props(target).get("smem_per_block_bytes") or DEFAULT_SMEM
            ):
                why = f"needs {needed} bytes of shared memory"
            else:
                why = "a tile larger than the sequence, or a value not among the knob's"
        except (KeyError, TypeError, ValueError):
            pass
        return f"config is not in the space of {self.name}: {why}"

    def _seeds(self, workload: Workload, target: Target) -> list[Config]:
        tiles: tuple[tuple[int, int, int, int, str], ...] = ()
        if capability_of(target) // 10 == 9:
            tiles = HOPPER_SEEDS.get(workload.k, HOPPER_SEEDS[64])
            if workload.param("causal"):
                # Warp-specialised kernels mask every key block when causal (Triton 3.6 takes
                # one loop): right, but 0.44-0.77x of cuDNN where the best plain tile ran
                # 0.76-0.96x on 11 causal shapes; the space keeps them, the seeds do not.
                tiles = (HOPPER_CAUSAL_FIRST, *(t for t in tiles if t[4] != "ws"))
            tiles = (*HOPPER_GLUON.get(workload.k, HOPPER_GLUON[64]), *tiles)
        tiles = (*tiles, *SEEDS.get(workload.k, SEEDS[64]), *SMALL_SEEDS)
        return [
            Config({
                "BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w, "num_stages": s,
                "TMA": loads != "ptr", "WARP_SPECIALIZE": loads == "ws",
                "GLUON": loads == "gluon",
            })
            for bm, bn, w, s, loads in tiles
        ]  # fmt: skip

    def default_config(self, workload: Workload, target: Target) -> Config:
        """The first seed that fits the workload and device."""
        space = self.space(workload, target)
        for config in self._seeds(workload, target):
            if space.is_valid(config):
                return config
        return space.points[0]

    def seed_configs(self, workload: Workload, target: Target) -> list[Config]:
        space = self.space(workload, target)
        seeds = [c for c in self._seeds(workload, target) if space.is_valid(c)]
        return seeds or [space.points[0]]

    # --- where and how it runs -----------------------------------------------------------------
    def cores_used(self, config: Config) -> int:
        return 1  # the launching thread

    def baseline_config(self, config: Config, workload: Workload, target: Target) -> Config:
        """What a PyTorch user gets: scaled_dot_product_attention choosing its own backend."""
        return Config({"backend": "auto"})

    # --- build and run -------------------------------------------------------------------------
    def build(self, request: MeasureRequest, *, build_dir: Path) -> Artifact:
        """Compile the kernel the run will launch into Triton's cache for the target's
        compute capability (no GPU needed), so builders compile while the GPU times another
        candidate and the run's first launch finds it; nothing to compile under the
        interpreter."""
        problem = self.request_problem(request)
        if problem:
            raise BuildFailed(MeasureStatus.INVALID, problem)
        if _interpreting():
            return Artifact(template=self.name, key="interpreter", environment={"build": "none"})
        from tunehub.kernels import triton_attention_kernels as kernels

        workload = request.workload
        start = time.perf_counter()
        with compile_errors(start):
            compiled = kernels.precompile(
                config=request.config.to_dict(), head_dim=workload.k, dtype=workload.dtype,
                causal=bool(workload.param("causal")), q_len=workload.m, kv_len=workload.n,
                capability=capability_of(request.target), batch=int(workload.param("batch")),
                heads=int(workload.param("heads")),
            )  # fmt: skip
        return Artifact(
            template=self.name,
            key=compiled.hash,
            compile_secs=compiled.compile_secs,
            environment={
                "build": "ahead",
                "shared_bytes": compiled.shared_bytes,
                "registers": compiled.registers,
                "stack_bytes": compiled.stack_bytes,
                "warp_specialized": compiled.warp_specialized,
                "triton_cache_dir": os.environ.get("TRITON_CACHE_DIR", ""),
            },
        )

    def run(
        self, request: MeasureRequest, artifact: Artifact, *, timing: TimingPolicy
    ) -> MeasureResult:
        """Check the kernel on fresh random Q, K, V into a NaN-poisoned O against the float32
        reference, then time it (``tunehub.kernels.gpu_timing``)."""
        from tunehub.kernels import triton_attention_kernels as kernels
        from tunehub.kernels.gpu_timing import FIRST_LAUNCH_FAILURES as failures
        from tunehub.kernels.gpu_timing import check_then_time, first_launch_secs, run_environment

        workload = request.workload
        device = _device()
        environment, seed = run_environment(device, artifact.environment)
        compile_secs = artifact.compile_secs
        try:
            ops = kernels.operands(workload, device, seed)
            launch = kernels.bind(
                ops.q, ops.k, ops.v, ops.out, causal=ops.causal, config=request.config.to_dict()
            )
            # The build compiled it ahead (or, under the interpreter, nothing compiles): the
            # first launch loads it from Triton's cache.
            compile_secs += first_launch_secs(launch, device)
            return check_then_time(
                launch,
                lambda _: kernels.check(ops.out, kernels.reference(ops), workload.dtype),
                device=device,
                environment=environment,
                timing=timing,
                compile_secs=compile_secs,
                called=True,
            )
        except failures.catch as exc:  # a compile failure (out of resources), a CUDA error
            return failures.record(exc, environment, compile_secs)
