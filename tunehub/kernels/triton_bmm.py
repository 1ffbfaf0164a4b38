"""GPU templates of ``bmm`` and ``grouped_mm`` (``triton.bmm``, ``triton.grouped_mm``) and their
vendor baselines (``torch.bmm_gpu``: cuBLAS's strided batched GEMM; ``torch.grouped_mm``:
``torch._grouped_mm`` where it runs the workload, else one ``torch.mm`` per group).

Knobs of both: ``BLOCK_M``, ``BLOCK_N``, ``BLOCK_K``, ``GROUP_M`` (rows of tiles swizzled
together), ``num_warps``, ``num_stages``. ``triton.bmm`` adds ``BATCH_MAJOR`` (the order of the
batch in the grid) and, on Hopper and newer for 16-byte rows, ``TMA`` (a persistent kernel, one
program per SM, reading A and B and writing C through TMA descriptors, a tile's store
overlapping the next tile's loads); ``triton.grouped_mm`` adds the group schedule:
``SCHEDULE`` (``tile``: one program per tile of the groups' flat tile list; ``persistent``:
``PROGRAMS`` programs per SM looping over it) and, on Hopper and newer for row-major
operands, ``TMA`` (A's rows and each group's B read through TMA descriptors). The kernels are
in ``triton_bmm_kernels``; configs the device cannot hold (shared memory, registers) are left
out by ``triton_gemm_limits.config_problem``, as for ``triton.gemm``. Like ``triton.gemm``
this module imports neither torch nor Triton: ``build`` (the build sandbox, no GPU needed)
and ``run`` (the GPU's run sandbox, or the CPU under ``TRITON_INTERPRET=1``) do.

>>> from tunehub.core import Target, Workload
>>> h100 = Target(kind="cuda", name="H100", arch=("sm_90",), cores=132, properties={
...     "compute_capability": 90, "smem_per_block_bytes": 232448, "regs_per_sm": 65536})
>>> w = Workload(op="bmm", m=512, n=512, k=64, dtype="float16", params={"batch": 16})
>>> TritonBmmTemplate().default_config(w, h100)["BLOCK_M"]
128
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable
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
    Tf32GpuBaseline,
    TimingPolicy,
    compile_errors,
)
from tunehub.kernels.space import Knob, KnobConstraint, SearchSpace
from tunehub.kernels.triton_gemm import capability_of, device_props

BLOCK_MS = (16, 32, 64, 128, 256)
BLOCK_NS = (32, 64, 128, 256)
BLOCK_KS = (32, 64, 128)
GROUP_MS = (1, 4, 8)
WARPS = (4, 8)
STAGES = (2, 3, 4, 5)
SCHEDULES = ("tile", "persistent")
PROGRAMS = (1, 2, 4)
# Known-good tiles of triton.gemm's ``tiled`` variant on the H100 (BLOCK_M, BLOCK_N, BLOCK_K,
# warps, stages), largest first; each is clamped to the problem, and the first that fits is
# the default. Not yet measured for bmm or grouped_mm on a GPU.
TILES = (
    (128, 128, 64, 8, 3),
    (128, 64, 64, 4, 4),
    (64, 128, 64, 4, 4),
    (64, 64, 64, 4, 4),
    (32, 64, 64, 4, 4),
    (16, 64, 128, 4, 4),
)


def _pow2_at_least(n: int, floor: int) -> int:
    return max(floor, 1 << max(0, math.ceil(math.log2(max(1, n)))))


def group_sizes(workload: Workload) -> tuple[int, ...]:
    value = workload.param("group_sizes")
    return value if isinstance(value, tuple) else ()


# triton.grouped_mm's TMA tiles (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, programs an SM),
# the fastest of 48 configs a shape on Mixtral-8x7B's expert GEMMs on an H200
# (grouped_tma-h200-20261127.json): 1.03x torch._grouped_mm on the down projection where the
# pointer-load kernel's tuned config ran 0.88x.
GROUPED_TMA_TILES = ((64, 128, 64, 4, 4, 2), (64, 256, 64, 8, 4, 1))


# triton.bmm's TMA tiles (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages), the fastest of 47 configs
# on LLaMA-2-7B's Q.K^T at 1,024-8,192 tokens on an H200 (bmm_store-h200-20261127T0505.json):
# 0.93-0.97x of cuBLAS, where the pointer-load kernel's tuned configs ran 0.59-0.67x.
BMM_TMA_TILES = ((128, 256, 64, 8, 3), (128, 128, 64, 4, 4))


def bmm_tma_runs(workload: Workload, target: Target) -> bool:
    """Whether ``bmm_tma_kernel`` can run the workload: a Hopper or newer GPU, and every
    operand's rows (along its contiguous dimension) and C's 16-byte multiples."""
    elem = limits.ELEMENT_BYTES.get(workload.dtype, 4)
    a_row = workload.k if workload.a_layout == "row_major" else workload.m
    b_row = workload.n if workload.b_layout == "row_major" else workload.k
    return capability_of(target) >= 90 and all(
        size * elem % 16 == 0 for size in (a_row, b_row, workload.n)
    )


def grouped_tma_runs(workload: Workload, target: Target) -> bool:
    """Whether ``grouped_tma_kernel`` can run the workload: a Hopper or newer GPU, row-major
    A and B (TMA reads rows along the contiguous dimension), rows of 16-byte multiples."""
    elem = limits.ELEMENT_BYTES.get(workload.dtype, 4)
    return (
        capability_of(target) >= 90
        and workload.a_layout == "row_major"
        and workload.b_layout == "row_major"
        and workload.k * elem % 16 == 0
        and workload.n * elem % 16 == 0
    )


class _TritonBatched(Template):
    """What ``triton.bmm`` and ``triton.grouped_mm`` share: dtypes, the tile knobs and their
    limits, build and run."""

    version = 1
    device_kind = "cuda"
    slowest_gflops = 50.0
    op: str

    def capabilities(self, target: Target) -> Capabilities:
        return Capabilities(
            kinds=("cuda",),
            ops=(self.op,),
            dtypes=("float16", "bfloat16", "float32"),
            epilogues=("none",),
            tf32=True,
        )

    # --- the space ---------------------------------------------------------------------------
    def _rows(self, workload: Workload) -> int:
        """The most rows one product has (a tile taller than that only pads)."""
        return workload.m

    def _extra_knobs(self, workload: Workload, target: Target) -> tuple[Knob, ...]:
        return ()

    def _extra_constraints(self) -> tuple[KnobConstraint, ...]:
        return ()

    def _limits_config(self, config: Config) -> dict[str, Any]:
        """The config as the resource limits read it (``gemm_config``)."""
        return gemm_config(config)

    def space(self, workload: Workload, target: Target) -> SearchSpace:
        dtype = workload.dtype
        props = device_props(target)
        cap_m = _pow2_at_least(self._rows(workload), 16)
        cap_n = _pow2_at_least(workload.n, 32)
        cap_k = _pow2_at_least(workload.k, 32)

        def fits(c: Config) -> bool:
            return (
                int(c["BLOCK_M"]) <= cap_m
                and int(c["BLOCK_N"]) <= cap_n
                and int(c["BLOCK_K"]) <= cap_k
            )

        def runs(c: Config) -> bool:
            return limits.config_problem(self._limits_config(c), dtype, props) is None

        knobs = (
            Knob("BLOCK_M", BLOCK_MS),
            Knob("BLOCK_N", BLOCK_NS),
            Knob("BLOCK_K", BLOCK_KS),
            Knob("GROUP_M", GROUP_MS),
            Knob("num_warps", WARPS),
            Knob("num_stages", STAGES),
            *self._extra_knobs(workload, target),
        )
        constraints: tuple[Any, ...] = (
            KnobConstraint(("BLOCK_M", "BLOCK_N", "BLOCK_K"), fits),
            *self._extra_constraints(),
            runs,
        )
        return SearchSpace(knobs=knobs, constraints=constraints)

    def invalid_reason(self, workload: Workload, target: Target, config: Config) -> str | None:
        if self.space(workload, target).is_valid(config):
            return None
        problem = limits.config_problem(
            self._limits_config(config), workload.dtype, device_props(target)
        )
        why = problem or "outside the space (a tile larger than the problem, or a bad knob)"
        return f"config is not in the space of {self.name}: {why}"

    def _tiles(
        self, workload: Workload, tiles: Iterable[tuple[int, ...]] = TILES, group_m: int = 8
    ) -> Iterable[dict[str, int]]:
        """``tiles`` (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages) clamped to the problem."""
        cap_m = _pow2_at_least(self._rows(workload), 16)
        cap_n = _pow2_at_least(workload.n, 32)
        cap_k = _pow2_at_least(workload.k, 32)
        wide_k = 32 if workload.dtype == "float32" else 64
        for bm, bn, bk, warps, stages in tiles:
            yield {
                "BLOCK_M": min(bm, cap_m),
                "BLOCK_N": min(bn, cap_n),
                "BLOCK_K": min(bk if bk != 64 else wide_k, cap_k),
                "GROUP_M": group_m,
                "num_warps": warps,
                "num_stages": stages,
            }

    def _variants(self, tile: dict[str, int], workload: Workload) -> Iterable[Config]:
        yield Config(tile)

    def _tma_seeds(self, workload: Workload, target: Target) -> list[Config]:
        """The TMA kernel's seed configs where it runs the workload (none by default)."""
        return []

    def seed_configs(self, workload: Workload, target: Target) -> list[Config]:
        """The TMA kernel's seed tiles first where it runs the workload, then the shared
        tiles on pointer loads."""
        space = self.space(workload, target)
        seeds: list[Config] = []
        tiles = (c for tile in self._tiles(workload) for c in self._variants(tile, workload))
        for config in (*self._tma_seeds(workload, target), *tiles):
            if config not in seeds and space.is_valid(config):
                seeds.append(config)
        return seeds or [space.points[0]]

    def default_config(self, workload: Workload, target: Target) -> Config:
        return self.seed_configs(workload, target)[0]

    # --- where and how it runs ---------------------------------------------------------------
    def cores_used(self, config: Config) -> int:
        return 1

    def baseline_config(self, config: Config, workload: Workload, target: Target) -> Config:
        return Config({"allow_tf32": workload.allow_tf32})

    # --- build and run -----------------------------------------------------------------------
    def _compile_args(self, workload: Workload, config: Config, target: Target) -> tuple[int, ...]:
        raise NotImplementedError

    def build(self, request: MeasureRequest, *, build_dir: Path) -> Artifact:
        """Compile the kernel into Triton's cache for the target's compute capability (no
        GPU needed); nothing to compile under the interpreter."""
        problem = self.request_problem(request)
        if problem:
            raise BuildFailed(MeasureStatus.INVALID, problem)
        if _interpreting():
            return Artifact(template=self.name, key="interpreter", environment={"build": "none"})
        from tunehub.kernels import triton_bmm_kernels as kernels
        from tunehub.kernels.gpu_reference import TORCH_DTYPES

        workload, target = request.workload, request.target
        start = time.perf_counter()
        with compile_errors(start):
            compiled = kernels.compile_for(
                self.op,
                request.config.to_dict(),
                TORCH_DTYPES[workload.dtype],
                workload.allow_tf32,
                capability_of(target),
                self._compile_args(workload, request.config, target),
            )
        return Artifact(
            template=self.name,
            key=str(compiled.hash),
            compile_secs=time.perf_counter() - start,
            environment={
                "shared_bytes": int(compiled.metadata.shared),
                "triton_cache_dir": os.environ.get("TRITON_CACHE_DIR", ""),
            },
        )

    def _operands(self, workload: Workload, device: Any, seed: int) -> Any:
        raise NotImplementedError

    def _call(self, ops: Any, request: MeasureRequest) -> Callable[[], Any]:
        raise NotImplementedError

    def run(
        self, request: MeasureRequest, artifact: Artifact, *, timing: TimingPolicy
    ) -> MeasureResult:
        """Check on fresh operands into a NaN-poisoned C against a float64 reference, then
        time (``tunehub.kernels.gpu_timing``)."""
        return run_checked(self, request, artifact, timing, {})


class TritonBmmTemplate(_TritonBatched):
    """``triton.bmm``: see the module docstring."""

    name = "triton.bmm"
    op = "bmm"
    baseline_template = "torch.bmm_gpu"
    # 2: the persistent TMA kernel (configs carry TMA).
    version = 2

    def _extra_knobs(self, workload: Workload, target: Target) -> tuple[Knob, ...]:
        tma = (False, True) if bmm_tma_runs(workload, target) else (False,)
        return (Knob("BATCH_MAJOR", (True, False)), Knob("TMA", tma))

    def _limits_config(self, config: Config) -> dict[str, Any]:
        # The TMA kernel's limits are a flattened ``tma`` GEMM's: its ring of loads beside a
        # C tile staged for the store, and wgmma's 4 or 8 warps.
        if config.get("TMA", False):
            return {**gemm_config(config), "variant": "tma", "FLATTEN": True}
        return gemm_config(config)

    def _order(self, workload: Workload) -> tuple[bool, bool]:
        # A shared B is reused across the entries of one tile: those first.
        return (False, True) if workload.param("b_broadcast") else (True, False)

    def _variants(self, tile: dict[str, int], workload: Workload) -> Iterable[Config]:
        for major in self._order(workload):
            yield Config({**tile, "BATCH_MAJOR": major, "TMA": False})

    def _tma_seeds(self, workload: Workload, target: Target) -> list[Config]:
        if not bmm_tma_runs(workload, target):
            return []
        major = self._order(workload)[0]
        return [
            Config({**tile, "BATCH_MAJOR": major, "TMA": True})
            for tile in self._tiles(workload, BMM_TMA_TILES)
        ]

    def _compile_args(self, workload: Workload, config: Config, target: Target) -> tuple[int, ...]:
        m, n, k = workload.m, workload.n, workload.k
        batch = int(workload.param("batch"))
        am, ak = (k, 1) if workload.a_layout == "row_major" else (1, m)
        bk, bn = (n, 1) if workload.b_layout == "row_major" else (1, k)
        sbb = 0 if workload.param("b_broadcast") else k * n
        return (m, n, k, batch, m * k, am, ak, sbb, bk, bn, m * n, n, 1)

    def _operands(self, workload: Workload, device: Any, seed: int) -> Any:
        return bmm_operands(workload, device, seed)

    def _call(self, ops: Any, request: MeasureRequest) -> Callable[[], Any]:
        from tunehub.kernels import triton_bmm_kernels as kernels

        # The persistent TMA kernel's programs: the device's SMs (the interpreter's few).
        return kernels.bmm_launch(
            ops.a, ops.b, ops.out, request.config.to_dict(), request.workload.allow_tf32
        ).bind()


class TritonGroupedMmTemplate(_TritonBatched):
    """``triton.grouped_mm``: see the module docstring."""

    name = "triton.grouped_mm"
    op = "grouped_mm"
    baseline_template = "torch.grouped_mm"

    # 2: the TMA kernel (configs carry TMA).
    version = 2

    def _rows(self, workload: Workload) -> int:
        return max(group_sizes(workload), default=1)

    def _extra_knobs(self, workload: Workload, target: Target) -> tuple[Knob, ...]:
        tma = (False, True) if grouped_tma_runs(workload, target) else (False,)
        return (Knob("SCHEDULE", SCHEDULES), Knob("PROGRAMS", PROGRAMS), Knob("TMA", tma))

    def _extra_constraints(self) -> tuple[KnobConstraint, ...]:
        return (
            KnobConstraint(
                ("SCHEDULE", "PROGRAMS"),
                lambda c: c["SCHEDULE"] == "persistent" or c["PROGRAMS"] == 1,
            ),
        )

    def _variants(self, tile: dict[str, int], workload: Workload) -> Iterable[Config]:
        yield Config({**tile, "SCHEDULE": "tile", "PROGRAMS": 1, "TMA": False})
        yield Config({**tile, "SCHEDULE": "persistent", "PROGRAMS": 2, "TMA": False})

    def _tma_seeds(self, workload: Workload, target: Target) -> list[Config]:
        if not grouped_tma_runs(workload, target):
            return []
        tiles = self._tiles(workload, (t[:5] for t in GROUPED_TMA_TILES), group_m=4)
        return [
            Config({**tile, "SCHEDULE": "persistent", "PROGRAMS": spec[5], "TMA": True})
            for tile, spec in zip(tiles, GROUPED_TMA_TILES, strict=True)
        ]

    def _compile_args(self, workload: Workload, config: Config, target: Target) -> tuple[int, ...]:
        m, n, k = workload.m, workload.n, workload.k
        groups = len(group_sizes(workload))
        bound = (-(-m // int(config["BLOCK_M"])) + groups) * -(-n // int(config["BLOCK_N"]))
        if config.get("TMA", False):
            return (n, k, groups, bound, m)
        am, ak = (k, 1) if workload.a_layout == "row_major" else (1, m)
        bk, bn = (n, 1) if workload.b_layout == "row_major" else (1, k)
        return (n, k, groups, bound, am, ak, k * n, bk, bn, n, 1)

    def _operands(self, workload: Workload, device: Any, seed: int) -> Any:
        return grouped_operands(workload, device, seed)

    def _call(self, ops: Any, request: MeasureRequest) -> Callable[[], Any]:
        from tunehub.kernels import triton_bmm_kernels as kernels

        sms = request.target.cores if ops.out.device.type == "cuda" else 3
        return kernels.grouped_launch(
            ops.a,
            ops.b,
            ops.out,
            ops.offsets,
            request.config.to_dict(),
            request.workload.allow_tf32,
            max(1, sms),
        )


# --- the vendor baselines --------------------------------------------------------------------
class _TorchGpuBaseline(Tf32GpuBaseline):
    """A PyTorch call on the GPU, checked and timed as the tuned kernels are. Its one knob is
    ``allow_tf32`` (cuBLAS's TF32 switch), set from the workload."""

    version = 1
    library_key = "torch"
    slowest_gflops = 50.0
    op: str

    def capabilities(self, target: Target) -> Capabilities:
        return Capabilities(
            kinds=("cuda",),
            ops=(self.op,),
            dtypes=("float16", "bfloat16", "float32"),
            epilogues=("none",),
            tf32=True,
        )

    def _operands(self, workload: Workload, device: Any, seed: int) -> Any:
        raise NotImplementedError

    def _call(self, ops: Any, request: MeasureRequest) -> Callable[[], Any]:
        raise NotImplementedError

    def run(
        self, request: MeasureRequest, artifact: Artifact, *, timing: TimingPolicy
    ) -> MeasureResult:
        import torch

        extra = {"library_version": f"torch {torch.__version__}, CUDA {torch.version.cuda}"}
        return run_checked(self, request, artifact, timing, extra)


class TorchBmmGpuBaseline(_TorchGpuBaseline):
    """``torch.bmm`` on the GPU (cuBLAS's strided batched GEMM; a shared B expanded along
    the batch with stride 0, no copy)."""

    name = "torch.bmm_gpu"
    op = "bmm"

    def _operands(self, workload: Workload, device: Any, seed: int) -> Any:
        return bmm_operands(workload, device, seed)

    def _call(self, ops: Any, request: MeasureRequest) -> Callable[[], Any]:
        import torch

        batch = ops.a.shape[0]
        b = ops.b.expand(batch, *ops.b.shape[1:])
        ops.library = {"library": "cuBLAS", "library_kernel": "torch.bmm"}
        return lambda: torch.bmm(ops.a, b, out=ops.out)


class TorchGroupedMmBaseline(_TorchGpuBaseline):
    """``torch._grouped_mm`` (CUTLASS grouped GEMM in PyTorch) where this PyTorch has it and
    it takes the workload (on CUDA it wants bfloat16 and 16-byte aligned rows), else a loop
    of ``torch.mm`` calls, one per group, each writing its rows of C: what a
    mixture-of-experts layer without a grouped kernel runs. The record's environment says
    which (``library_kernel``) and why the first was not used (``grouped_mm_refused``)."""

    name = "torch.grouped_mm"
    op = "grouped_mm"

    def _operands(self, workload: Workload, device: Any, seed: int) -> Any:
        return grouped_operands(workload, device, seed)

    def _call(self, ops: Any, request: MeasureRequest) -> Callable[[], Any]:
        import torch

        refused = grouped_mm_refusal(ops, torch)
        if refused is None:
            ends = ops.offsets[1:]
            ops.library = {"library": "CUTLASS", "library_kernel": "torch._grouped_mm"}
            return lambda: torch._grouped_mm(ops.a, ops.b, offs=ends)
        bounds = list(zip(ops.sizes_at[:-1], ops.sizes_at[1:], strict=True))
        ops.library = {
            "library": "cuBLAS" if ops.a.device.type == "cuda" else "torch",
            "library_kernel": "torch.mm per group",
            "grouped_mm_refused": refused,
        }

        def loop() -> Any:
            for g, (lo, hi) in enumerate(bounds):
                if hi > lo:
                    torch.mm(ops.a[lo:hi], ops.b[g], out=ops.out[lo:hi])
            return ops.out

        return loop


def grouped_mm_refusal(ops: Any, torch: Any) -> str | None:
    """Why ``torch._grouped_mm`` cannot stand for this workload here (None if it can): not in
    this PyTorch, or it refuses these operands (tried once, outside the timing)."""
    if not hasattr(torch, "_grouped_mm"):
        return f"torch {torch.__version__} has no torch._grouped_mm"
    try:
        torch._grouped_mm(ops.a, ops.b, offs=ops.offsets[1:])
    except (RuntimeError, NotImplementedError, TypeError) as exc:
        return f"{type(exc).__name__}: {exc}"[:300]
    return None


# --- operands, the check and the timing --------------------------------------------------------
class _Operands:
    def __init__(self, **items: Any) -> None:
        self.library: dict[str, Any] = {}
        self.offsets: Any = None
        self.sizes_at: list[int] = []
        self.__dict__.update(items)


def _matrices(
    count: int, rows: int, cols: int, layout: str, workload: Workload, device: Any, g: Any
) -> Any:
    """``count`` rows x cols matrices uniform in [-1, 1), each stored as ``layout`` says."""
    import torch

    from tunehub.kernels.gpu_reference import TORCH_DTYPES

    dtype = TORCH_DTYPES[workload.dtype]
    shape = (count, rows, cols) if layout == "row_major" else (count, cols, rows)
    t = torch.empty(shape, dtype=dtype, device=device).uniform_(-1.0, 1.0, generator=g)
    return t if layout == "row_major" else t.transpose(1, 2)


def bmm_operands(workload: Workload, device: Any, seed: int) -> Any:
    """Fresh A (batch x m x k), B (batch x k x n, or 1 x k x n when broadcast) and a
    NaN-poisoned C; the float64 reference ``ref``."""
    import torch

    g = torch.Generator(device=device)
    g.manual_seed(seed)
    batch = int(workload.param("batch"))
    m, n, k = workload.m, workload.n, workload.k
    a = _matrices(batch, m, k, workload.a_layout, workload, device, g)
    b_count = 1 if workload.param("b_broadcast") else batch
    b = _matrices(b_count, k, n, workload.b_layout, workload, device, g)
    out = torch.full((batch, m, n), math.nan, dtype=a.dtype, device=device)
    return _Operands(a=a, b=b, out=out)


def bmm_reference(ops: Any) -> Any:
    import torch

    return ops.a.to(torch.float64) @ ops.b.to(torch.float64)


def grouped_operands(workload: Workload, device: Any, seed: int) -> Any:
    """Fresh A (m x k), B (groups x k x n) and a NaN-poisoned C (m x n); ``offsets``: the
    groups' running row sums from 0 (int32, on the device)."""
    import torch

    g = torch.Generator(device=device)
    g.manual_seed(seed)
    sizes = group_sizes(workload)
    m, n, k = workload.m, workload.n, workload.k
    a = _matrices(1, m, k, workload.a_layout, workload, device, g)[0]
    b = _matrices(len(sizes), k, n, workload.b_layout, workload, device, g)
    out = torch.full((m, n), math.nan, dtype=a.dtype, device=device)
    at = [0]
    for size in sizes:
        at.append(at[-1] + size)
    offsets = torch.tensor(at, dtype=torch.int32, device=device)
    return _Operands(a=a, b=b, out=out, offsets=offsets, sizes_at=at)


def grouped_reference(ops: Any) -> Any:
    import torch

    ref = torch.empty(ops.out.shape, dtype=torch.float64, device=ops.out.device)
    for g, (lo, hi) in enumerate(zip(ops.sizes_at[:-1], ops.sizes_at[1:], strict=True)):
        ref[lo:hi] = ops.a[lo:hi].to(torch.float64) @ ops.b[g].to(torch.float64)
    return ref


def run_checked(
    template: Any,
    request: MeasureRequest,
    artifact: Artifact,
    timing: TimingPolicy,
    extra: dict[str, Any],
) -> MeasureResult:
    """Check ``template._call`` on fresh operands against the float64 reference (every
    element of C finite and the relative error within the dtype's tolerance), then time it."""
    import torch

    from tunehub.kernels import gpu_reference as ref
    from tunehub.kernels.gpu_timing import TRITON_FAILURES as failures
    from tunehub.kernels.gpu_timing import check_then_time, run_environment, tf32
    from tunehub.kernels.triton_gemm import _device

    workload = request.workload
    device = _device()
    environment, seed = run_environment(device, artifact.environment, extra)
    compile_secs = artifact.compile_secs
    rows = "C's rows are batch-major (entry = row // m)" if workload.op == "bmm" else ""
    try:
        with tf32(workload.allow_tf32):
            ops = template._operands(workload, device, seed)
            call = template._call(ops, request)
            environment.update(ops.library)

            def check(got: Any) -> Any:
                out = got if isinstance(got, torch.Tensor) else ops.out
                expected = bmm_reference(ops) if workload.op == "bmm" else grouped_reference(ops)
                n = workload.n
                return ref.check(out.reshape(-1, n), expected.reshape(-1, n), workload)

            return check_then_time(
                call,
                check,
                device=device,
                environment=environment,
                timing=timing,
                compile_secs=compile_secs,
                wrong_answer_note=rows,
            )
    except failures.catch as exc:
        return failures.record(exc, environment, compile_secs)


def gemm_config(config: Config) -> dict[str, Any]:
    """The config as ``triton_gemm_limits.config_problem`` reads a ``tiled`` GEMM's (the
    resource limits of one tile are the same)."""
    return {
        "variant": "tiled",
        "BLOCK_M": config["BLOCK_M"],
        "BLOCK_N": config["BLOCK_N"],
        "BLOCK_K": config["BLOCK_K"],
        "GROUP_M": config["GROUP_M"],
        "num_warps": config["num_warps"],
        "num_stages": config["num_stages"],
        "SPLIT_K": 1,
    }


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "") not in ("", "0")
