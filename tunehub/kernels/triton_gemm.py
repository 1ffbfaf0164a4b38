"""The ``triton.gemm`` template: Triton GEMM kernels on NVIDIA GPUs, their space, build and run.

The kernels (``triton_gemm_kernels``) come in six variants: ``tiled`` (one program per tile,
optionally splitting K, its partials summed by a second kernel), ``persistent`` (a grid of one
program per SM looping over tiles), ``tma`` (persistent, operands through Hopper's TMA tensor
descriptors), ``ws`` (``tma`` with warp specialisation), ``splitk`` (``tiled``'s split of K
in one kernel: the last program to arrive at a tile reduces it) and ``splitk_atomic`` (the
same, its partials summed by fp32 atomics: faster, not bit-reproducible). Knobs: ``variant``,
``BLOCK_M``, ``BLOCK_N``, ``BLOCK_K``, ``GROUP_M``, ``num_warps``, ``num_stages``, ``SPLIT_K``
(the one-kernel split-Ks need >= 2), ``FLATTEN``.

The space comes from the device's fingerprint (compute capability, SMs, shared memory per
block, registers per SM) and the workload (tiles no larger than the problem, TMA alignment,
split-K only where the tiles do not fill the GPU); every config that cannot run is left out
with the reason ``invalid_reason`` gives. This module imports neither torch nor Triton at
import time: the service builds spaces without them; ``build`` (in a build sandbox: Triton
compiles into the shared cache, no GPU needed) and ``run`` (in the GPU's run sandbox) import
them.

>>> from tunehub.core import Target, Workload
>>> h100 = Target(kind="cuda", name="H100", arch=("sm_90",), cores=132, properties={
...     "compute_capability": 90, "smem_per_block_bytes": 232448, "regs_per_sm": 65536})
>>> t = TritonGemmTemplate()
>>> t.default_config(Workload(m=4096, n=4096, k=4096, dtype="float16"), h100)["variant"]
'tma'
>>> len(t.space(Workload(m=4096, n=4096, k=4096, dtype="float16"), h100)) > 1000
True
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterable
from dataclasses import asdict
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
from tunehub.kernels import triton_gemm_limits as limits
from tunehub.kernels.base import (
    Artifact,
    BuildFailed,
    Template,
    TimingPolicy,
    compile_errors,
)
from tunehub.kernels.space import Knob, KnobConstraint, SearchSpace

# 192: a composite tile (a 128- and a 64-row block, ``tiled`` and ``tma`` without split-K),
# for shapes whose power-of-two tiles leave SMs idle (triton_gemm_limits.COMPOSITE_BLOCK_MS).
BLOCK_MS = (16, 32, 64, 128, 192, 256)
# 80, 144, 192: composite tile edges (a 64- and a 16-, a 128- and a 16-, a 128- and a
# 64-column block, ``tma`` only), for products whose power-of-two tiles leave SMs idle
# (triton_gemm_limits.COMPOSITE_BLOCK_NS).
BLOCK_NS = (32, 64, 80, 128, 144, 192, 256)
BLOCK_KS = (32, 64, 128, 256)
GROUP_MS = (1, 4, 8, 16)
WARPS = (4, 8)
STAGES = (2, 3, 4, 5, 6)
SPLIT_KS = (1, 2, 4, 8, 16, 32, 64)
# Split-K pays only when the output tiles leave SMs idle: at most this many programs per SM.
SPLIT_K_MAX_WAVES = 2
DEFAULT_CAPABILITY = 80
# Tile lists that production autotuners start from (facts about them, not their code), as
# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages); both run a one-tile-per-program kernel
# like ``tiled`` with GROUP_M=8. Inductor's default mm configs (torch 2.11,
# ``template_heuristics/triton.py``), in its order; those outside this space (BLOCK_K=16,
# 2 warps, 1 stage) drop out:
INDUCTOR_MM_TILES = (
    (32, 32, 16, 2, 1),
    (32, 32, 128, 4, 2),
    (32, 64, 32, 8, 5),
    (64, 32, 32, 8, 5),
    (64, 32, 128, 4, 5),
    (64, 64, 16, 4, 2),
    (64, 64, 32, 4, 2),
    (64, 64, 64, 8, 3),
    (64, 64, 128, 4, 5),
    (64, 128, 32, 4, 3),
    (64, 128, 32, 8, 4),
    (64, 128, 64, 4, 3),
    (64, 128, 128, 4, 4),
    (128, 64, 32, 4, 3),
    (128, 64, 32, 8, 4),
    (128, 128, 32, 8, 2),
    (128, 128, 32, 4, 3),
    (128, 128, 64, 4, 3),
    (128, 128, 64, 8, 5),
    (128, 128, 128, 8, 4),
    (128, 256, 64, 8, 4),
)
# and the CUDA configs of Triton's matmul tutorial (03-matrix-multiplication.py).
TRITON_TUTORIAL_TILES = (
    (128, 256, 64, 8, 3),
    (64, 256, 32, 4, 4),
    (128, 128, 32, 4, 4),
    (128, 64, 32, 4, 4),
    (64, 128, 32, 4, 4),
    (128, 32, 32, 4, 4),
    (64, 32, 32, 2, 5),
    (32, 64, 32, 2, 5),
)
LAYOUT = {"row_major": "row", "col_major": "col"}


def _pow2_at_least(n: int, floor: int) -> int:
    return max(floor, 1 << max(0, math.ceil(math.log2(max(1, n)))))


def _wave_fill(m: int, n: int, bm: int, bn: int, sms: int) -> float:
    """The share of the SM slots its waves offer that one-program-per-SM tiles keep busy."""
    tiles = math.ceil(m / bm) * math.ceil(n / bn)
    return tiles / (math.ceil(tiles / sms) * sms)


def capability_of(target: Target) -> int:
    """The GPU's compute capability as an integer (90 for sm_90)."""
    found = target.prop("compute_capability")
    if found:
        return found
    for arch in target.arch:
        if arch.startswith("sm_") and arch[3:].isdigit():
            return int(arch[3:])
    return DEFAULT_CAPABILITY


def device_props(target: Target) -> dict[str, Any]:
    """What ``config_problem`` reads about the device, from its fingerprint."""
    props: dict[str, Any] = {"compute_capability": capability_of(target), "sm_count": target.cores}
    for key in ("smem_per_block_bytes", "regs_per_sm"):
        if target.prop(key):
            props[key] = target.prop(key)
    return props


class TritonGemmTemplate(Template):
    """``triton.gemm``: see the module docstring."""

    name = "triton.gemm"
    # 2: kernels specialised on the problem's sizes and strides, TMA descriptors built on the
    # host, Inductor's and Triton's tile lists among the seeds (same knobs, faster kernels:
    # records of version 1 time other code). The ``splitk`` and ``splitk_atomic`` variants
    # (and the composite tiles) only added points: every config spelled before them still
    # times the same code, so records of version 2 stand. 3: ``PAD_K`` pads in one launch
    # (it was two copies: 1.36x faster at the same tile on 1000x3000x777), so records of
    # version 2 timed slower code for every padded config.
    version = 3
    device_kind = "cuda"
    baseline_template = "torch.matmul"
    # The slowest kernel worth waiting for: 50 GFLOP/s is far below any sane GPU config.
    slowest_gflops = 50.0

    # --- what it can do --------------------------------------------------------------------
    def capabilities(self, target: Target) -> Capabilities:
        dtypes = ["float16", "bfloat16", "float32"]
        if capability_of(target) >= 89:
            dtypes.append("float8_e4m3")
        return Capabilities(kinds=("cuda",), dtypes=tuple(dtypes), tf32=True)

    def check(self, workload: Workload, target: Target) -> None:
        super().check(workload, target)
        from tunehub.core import Unsupported

        if not self.variants(workload, target):
            raise Unsupported(
                "workload", f"no {self.name} variant runs {workload.label} on {target.label}"
            )

    def variants(
        self, workload: Workload, target: Target, *, padded: bool = False
    ) -> tuple[str, ...]:
        """The variants that can run ``workload`` on ``target`` (with K padded, if asked)."""
        cc = capability_of(target)
        dtype = _kernel_dtype(workload)
        k = padded_k(workload) if padded else workload.k
        return tuple(
            v
            for v in limits.VARIANTS
            if limits.variant_problem(v, cc) is None
            and limits.dtype_problem(dtype, cc) is None
            and limits.workload_problem(
                v,
                workload.m,
                workload.n,
                k,
                dtype,
                LAYOUT[workload.a_layout],
                LAYOUT[workload.b_layout],
            )
            is None
        )

    # --- the space ---------------------------------------------------------------------------
    def space(self, workload: Workload, target: Target) -> SearchSpace:
        dtype = _kernel_dtype(workload)
        props = device_props(target)
        sms = max(1, target.cores)
        cap_m = _pow2_at_least(workload.m, 16)
        cap_n = _pow2_at_least(workload.n, 32)
        cap_k = _pow2_at_least(workload.k, 32)

        def fits(c: Config) -> bool:
            return (
                int(c["BLOCK_M"]) <= cap_m
                and int(c["BLOCK_N"]) <= cap_n
                and int(c["BLOCK_K"]) <= cap_k
            )

        def warps(c: Config) -> bool:
            variant = c["variant"]
            if variant == "ws":
                return c["num_warps"] == 4
            return True

        def split(c: Config) -> bool:
            k_split = int(c["SPLIT_K"])
            if k_split == 1:
                return c["variant"] not in limits.ONE_KERNEL_SPLIT_VARIANTS
            if c["variant"] not in limits.SPLIT_K_VARIANTS:
                return False
            tiles = math.ceil(workload.m / int(c["BLOCK_M"])) * math.ceil(
                workload.n / int(c["BLOCK_N"])
            )
            # Splitting pays only while the tiles leave SMs idle, and needs K to share out.
            return tiles * k_split <= SPLIT_K_MAX_WAVES * sms and workload.k >= 2 * k_split * int(
                c["BLOCK_K"]
            )

        def flattened(c: Config) -> bool:
            return not c["FLATTEN"] or c["variant"] in ("persistent", "tma")

        plain = set(self.variants(workload, target))
        padded = (
            set(self.variants(workload, target, padded=True)) if needs_padding(workload) else set()
        )

        def variant_fits(c: Config) -> bool:
            return c["variant"] in (padded if c.get("PAD_K") else plain)

        def runs(c: Config) -> bool:
            return limits.config_problem(kernel_config(c), dtype, props) is None

        # PAD_K is a knob only where padding can matter, so every other workload's configs
        # are spelled as before it existed.
        pad_knob = (Knob("PAD_K", (False, True)),) if padded else ()
        knobs = (
            Knob("variant", tuple(v for v in limits.VARIANTS if v in plain | padded)),
            *pad_knob,
            Knob("BLOCK_M", BLOCK_MS),
            Knob("BLOCK_N", BLOCK_NS),
            Knob("BLOCK_K", BLOCK_KS),
            Knob("num_warps", WARPS),
            Knob("num_stages", STAGES),
            Knob("GROUP_M", GROUP_MS),
            Knob("SPLIT_K", SPLIT_KS),
            Knob("FLATTEN", (False, True)),
        )
        constraints = (
            KnobConstraint(("variant", *(k.name for k in pad_knob)), variant_fits),
            KnobConstraint(("BLOCK_M", "BLOCK_N", "BLOCK_K"), fits),
            KnobConstraint(("variant", "num_warps"), warps),
            KnobConstraint(("variant", "BLOCK_M", "BLOCK_N", "BLOCK_K", "SPLIT_K"), split),
            KnobConstraint(("variant", "FLATTEN"), flattened),
            runs,
        )
        return SearchSpace(knobs=knobs, constraints=constraints)

    def invalid_reason(self, workload: Workload, target: Target, config: Config) -> str | None:
        if self.space(workload, target).is_valid(config):
            return None
        problem = limits.config_problem(
            kernel_config(config), _kernel_dtype(workload), device_props(target)
        )
        why = problem or (
            "outside the space (a tile larger than the problem, or split-K where it cannot pay)"
        )
        return f"config is not in the space of {self.name}: {why}"

    def default_config(self, workload: Workload, target: Target) -> Config:
        """The first of the known-good configs (from the H100 sweep in
        benchmarks/notes/triton_gemm_notes.md) that fits this workload and device."""
        space = self.space(workload, target)
        for config in self._candidates(workload, target):
            if space.is_valid(config):
                return config
        return space.points[0]

    def seed_configs(self, workload: Workload, target: Target) -> list[Config]:
        """The default, then the other known-good configs that fit: the strong tile of each
        variant, the small-M and split-K ones where they apply."""
        space = self.space(workload, target)
        seeds: list[Config] = []
        for config in self._candidates(workload, target):
            if config not in seeds and space.is_valid(config):
                seeds.append(config)
        return seeds or [space.points[0]]

    def _candidates(self, workload: Workload, target: Target) -> Iterable[Config]:
        m, n, k = workload.m, workload.n, workload.k
        sms = max(1, target.cores)
        dtype = workload.dtype
        wide_k = 128 if dtype == "float8_e4m3" else 32 if dtype == "float32" else 64

        def c(
            variant: str,
            bm: int,
            bn: int,
            bk: int,
            warps: int,
            stages: int,
            group: int = 8,
            split: int = 1,
            flat: bool = False,
            pad: bool = False,
        ) -> Config:
            return Config(
                {
                    "variant": variant,
                    **({"PAD_K": pad} if needs_padding(workload) else {}),
                    "BLOCK_M": bm,
                    "BLOCK_N": bn,
                    "BLOCK_K": bk,
                    "num_warps": warps,
                    "num_stages": stages,
                    "GROUP_M": group,
                    "SPLIT_K": split,
                    "FLATTEN": flat,
                }
            )

        small_m = _pow2_at_least(m, 16)
        tiles_64 = math.ceil(m / 64) * math.ceil(n / 64)
        # 128x192 tiles (a 128- and a 64-column block through TMA) where they fill a wave much
        # better than 128x256: 128 tiles of 1000x3000 for 132 SMs where 128x256 makes 96.
        fill_n192 = _wave_fill(m, n, 128, 192, sms)
        wide_n = fill_n192 >= 0.9 and fill_n192 > _wave_fill(m, n, 128, 256, sms) + 0.1
        if "tma" not in self.variants(workload, target):
            # Rows not 16-byte aligned (e.g. K = 777 in fp16): no TMA, no vectorised loads.
            # Padding K (one launch copying A and B into aligned buffers each call) brings TMA
            # back, and ran 1000x3000x777 1.8x faster than the best unpadded config of its
            # dataset on the H100: 128x192x64 w4 s4 3.1x cuBLAS, 128x256x32 3.0x
            # (benchmarks/results/gpu_padk-h100-20261125T163201.json).
            if needs_padding(workload):
                if wide_n:
                    yield c("tma", 128, 192, 64, 4, 4, pad=True)
                yield c("tma", 128, 256, wide_k, 8, 3, group=16, pad=True)
                yield c("tma", 128, 128, 64, 4, 4, group=16, flat=True, pad=True)
                yield c("tma", 128, 128, 64, 8, 4, pad=True)
                yield c("tiled", 128, 128, 64, 8, 4, pad=True)
            # Unpadded, only 128x128x64 w8 s4 kept up with cuBLAS without spilling.
            yield c("persistent", 128, 128, 64, 8, 4, flat=True)
            yield c("tiled", 128, 128, 64, 8, 4)
        if m <= 64:
            # Memory-bound skinny products: short, deep tiles (16x64x256 s4 led at M=16).
            yield c("tiled", min(small_m, 64), 64, 256, 4, 4)
            yield c("tiled", min(small_m, 64), 64, 128, 4, 5)
            yield c("tiled", 64, 64, 128, 4, 4)
        if tiles_64 < sms and k >= 8192:
            # Few output tiles, long K: split it. Partials summed by atomics first, split so
            # the programs come nearest one wave: on the H100, 64x64x128 s6 split 8 ran
            # 256x256x65536 1.04x faster than ``splitk`` at the same tile, split 32 ran
            # 128x128x32768 1.47x faster, and 64x128x128 s4 split 4 512x512x16384 1.05x
            # (benchmarks/results/gpu_atomic-h100-20261125T074518.log).
            for bn, stages in ((64, 6), (128, 4)):
                tiles = math.ceil(m / 64) * math.ceil(n / bn)
                splits = [s for s in SPLIT_KS[1:] if tiles * s <= SPLIT_K_MAX_WAVES * sms]
                waves = {s: abs(math.log(tiles * s / sms)) for s in splits}
                for split in sorted(splits, key=waves.__getitem__)[:2]:
                    yield c("splitk_atomic", 64, bn, 128, 4, stages, split=split)
            # Then the same bits every call: the one-kernel split beat the two-kernel one at
            # the same tile and split on all four long-K shapes timed (1.04-2.8x,
            # gpu_splitk-h100-20261124T045120).
            for split in (8, 4, 16, 32, 2):
                if tiles_64 * split <= SPLIT_K_MAX_WAVES * sms:
                    yield c("splitk", 64, 64, 128, 4, 5, split=split)
            for split in (8, 4, 16, 2):
                if tiles_64 * split <= SPLIT_K_MAX_WAVES * sms:
                    yield c("tiled", 64, 64, 128, 4, 5, split=split)
        fill_80 = _wave_fill(m, n, 64, 80, sms)
        if m <= 128 and fill_80 >= 0.7 and fill_80 > _wave_fill(m, n, 64, 128, sms) + 0.1:
            # Likewise along N, for skinny products: 64x80 tiles (cuBLAS's for 127x5000x2048:
            # 126 tiles where 64x128 makes 80) ran it 1.04x faster than the search's 64x128
            # pick on the H100 with 6 stages of BLOCK_K 128
            # (benchmarks/results/gpu_skinny-h100-20261125T051002-deep.log).
            yield c("tma", 64, 80, 128, 4, 6)
        if wide_n:
            yield c("tma", 128, 192, 64, 4, 4)
        if math.ceil(m / 64) * math.ceil(n / 128) <= sms and _wave_fill(m, n, 64, 128, sms) >= 0.9:
            # One wave of 64x128 tiles where 128x256 leaves most SMs idle (1024^3: 128 tiles
            # against 32): tma 64x128x128 w4 s4 g1 ran 1024^3 at 0.99x cuBLAS on the H100
            # (benchmarks/results/gpu_tiles-h100-20261125T163329.json; 1.02-1.04x in the
            # searches that found it), the search's tiled picks 0.93x.
            yield c("tma", 64, 128, 128, 4, 4, group=1)
        fill_192 = _wave_fill(m, n, 192, 128, sms)
        if fill_192 >= 0.7 and fill_192 > _wave_fill(m, n, 128, 256, sms) + 0.1:
            # The 128x256 tiles leave SMs idle that 192x128 ones fill (cuBLAS's tile for
            # 3000x1000x4000: 128 tiles for 132 SMs where 128x256 makes 96). On the H100 the
            # composite tile through TMA, unflattened, ran it 1.23x faster than tma 128x256
            # and 1.05x faster than through pointers (1536^3 bf16: 1.20x and 1.03x;
            # benchmarks/results/gpu_tiles-h100-20261125T044631.json).
            yield c("tma", 192, 128, 64, 4, 4)
            yield c("tiled", 192, 128, 64, 4, 4)
        yield c("tma", 128, 256, wide_k, 8, 3, group=16)
        # Flattened (one loop over tiles and K): the fastest of 17 configs on GPT-2's and
        # ViT-B's MLP up (4096 and 12608 x 3072 x 768 fp16) with the GELU fused, 1.03x and
        # 1.09x of cuBLAS with its separate pass, and with the bias alone at 4096 rows (an
        # H200; benchmarks/results/gelu_variants-h200-20261127T1316.json).
        yield c("tma", 128, 256, wide_k, 8, 3, flat=True)
        yield c("tma", 128, 256, wide_k, 8, 4)
        yield c("ws", 128, 256, wide_k, 4, 3)
        yield c("ws", 256, 128, wide_k, 4, 3)
        yield c("persistent", 128, 256, wide_k, 8, 3, flat=True)
        yield c("persistent", 128, 128, 64, 8, 4, flat=True)
        yield c("tiled", 128, 128, 64, 8, 4)
        yield c("tiled", 256, 128, 64, 8, 3)
        yield c("tma", 128, 128, 64, 8, 4)
        yield c("tma", 64, 64, 128, 4, 4)
        yield c("tiled", 64, 64, 64, 4, 6)
        yield c("tiled", 64, 128, 64, 4, 4)
        yield c("tiled", 32, 64, 64, 4, 4)
        # On the H100 Inductor's autotuning picked 64x128x128 w4 s4 (1024^3, 127x5000x2048)
        # and 128x128x64 w8 s5 (2048^3) from the first list (benchmarks/notes/gpu_kernels_v2.md).
        for bm, bn, bk, warps, stages in (*INDUCTOR_MM_TILES, *TRITON_TUTORIAL_TILES):
            yield c("tiled", bm, bn, bk, warps, stages)

    # --- where and how it runs -----------------------------------------------------------------
    def cores_used(self, config: Config) -> int:
        return 1  # the launching thread

    def baseline_config(self, config: Config, workload: Workload, target: Target) -> Config:
        return Config({"allow_tf32": workload.allow_tf32})

    # --- build and run -------------------------------------------------------------------------
    def build(self, request: MeasureRequest, *, build_dir: Path) -> Artifact:
        """Compile every kernel the run will launch into Triton's cache (shared with the run
        sandbox through TRITON_CACHE_DIR); no GPU is touched. Under the Triton interpreter
        there is nothing to compile."""
        problem = self.request_problem(request)
        if problem:
            raise BuildFailed(MeasureStatus.INVALID, problem)
        if _interpreting():
            return Artifact(template=self.name, key="interpreter", environment={"build": "none"})
        from tunehub.kernels import triton_gemm_kernels as kernels

        workload, target = request.workload, request.target
        start = time.perf_counter()
        with compile_errors(start, invalid=(ValueError,)):
            built = kernels.precompile(
                config=kernel_config(request.config),
                dtype=_kernel_dtype(workload),
                epilogue=workload.epilogue,
                allow_tf32=workload.allow_tf32,
                m=workload.m,
                n=workload.n,
                k=workload.k,
                a_layout=LAYOUT[workload.a_layout],
                b_layout=LAYOUT[workload.b_layout],
                capability=capability_of(target),
                num_sms=target.cores,
            )
        kernels_info = [asdict(k) for k in built]
        registers = [k.registers for k in built if k.registers is not None]
        stacks = [k.stack_bytes for k in built if k.stack_bytes is not None]
        return Artifact(
            template=self.name,
            key=";".join(k.cache_key for k in built),
            data={"kernels": kernels_info},
            compile_secs=time.perf_counter() - start,
            cached=all(k.cache_hit for k in built),
            environment={
                "registers": max(registers) if registers else None,
                "stack_bytes": max(stacks) if stacks else None,
                "shared_bytes": max(k.shared_bytes for k in built),
                "triton_cache_hit": all(k.cache_hit for k in built),
                "triton_cache_dir": os.environ.get("TRITON_CACHE_DIR", ""),
            },
        )

    def run(
        self, request: MeasureRequest, artifact: Artifact, *, timing: TimingPolicy
    ) -> MeasureResult:
        """Check the kernel on fresh random operands into a NaN-poisoned C against a float64
        reference, then time it (see ``tunehub.kernels.gpu_timing``)."""
        from tunehub.kernels import gpu_reference as ref
        from tunehub.kernels import triton_gemm_kernels as kernels
        from tunehub.kernels.gpu_timing import TRITON_FAILURES as failures
        from tunehub.kernels.gpu_timing import check_then_time, run_environment

        workload = request.workload
        device = _device()
        environment, seed = run_environment(device, artifact.environment)
        try:
            ops = ref.operands(workload, device, seed)
            start = time.perf_counter()  # binding the launch counts as verification
            launch = gemm_call(
                kernels,
                ops,
                workload,
                request.config,
                num_sms=request.target.cores if device.type == "cuda" else None,
            )
            return check_then_time(
                launch,
                lambda _: ref.check(ops.out, ref.reference(ops, workload.epilogue), workload),
                device=device,
                environment=environment,
                timing=timing,
                compile_secs=artifact.compile_secs,
                since=start,
            )
        except failures.catch as exc:
            return failures.record(exc, environment, artifact.compile_secs)


def kernel_config(config: Config) -> dict[str, Any]:
    """The config as the kernels take it: ``FLATTEN`` means nothing to ``tiled`` and the
    split-K variants (the space spells it False there), so it is left out."""
    data = config.to_dict()
    if data.get("variant") in limits.SPLIT_K_VARIANTS:
        data.pop("FLATTEN", None)
    return data


def padded_k(workload: Workload) -> int:
    """K rounded up so a row of K elements is a multiple of 16 bytes."""
    return limits.padded_k(workload.k, _kernel_dtype(workload))


def needs_padding(workload: Workload) -> bool:
    """Whether rows read along K (a row-major A, a column-major B) lose 16-byte alignment."""
    reads_along_k = workload.a_layout == "row_major" or workload.b_layout == "col_major"
    return reads_along_k and padded_k(workload) != workload.k


def gemm_call(
    kernels: Any, ops: Any, workload: Workload, config: Config, num_sms: int | None
) -> Any:
    """A callable computing ``ops.out`` with ``config`` (a bound launch; with ``PAD_K``, its
    first kernel copies A and B into K-padded buffers, every call)."""
    return kernels.bind(
        ops.a,
        ops.b,
        ops.bias,
        ops.out,
        epilogue=workload.epilogue,
        allow_tf32=workload.allow_tf32,
        config=kernel_config(config),
        num_sms=num_sms,
    )


def _kernel_dtype(workload: Workload) -> str:
    return "float8_e4m3fn" if workload.dtype == "float8_e4m3" else workload.dtype


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "") not in ("", "0")


def _device() -> Any:
    """This process's GPU, or the CPU under the Triton interpreter (the CPU tests)."""
    import torch

    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    if _interpreting():
        return torch.device("cpu")
    raise RuntimeError("no CUDA GPU visible to this process (and not under TRITON_INTERPRET=1)")
