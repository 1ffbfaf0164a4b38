"""The ``blis.gemm`` template: BLIS-structured CPU GEMM, its space, model default, build and timing.

Structure (Van Zee & van de Geijn's BLIS, row-major): loops NC -> KC -> MC around a macro-kernel
(loops NR, MR) around an MR x NR micro-kernel. B is packed into KC x NR micro-panels, A into
MR x KC micro-panels, both zero-padded so edge tiles run the full-tile micro-kernel and only
the store of a partial tile goes through a small temp tile. The micro-kernel keeps the MR x NR
accumulators in vector registers (broadcast A, load B, FMA) with AVX-512, AVX2+FMA or GCC
vector extensions. M, N and K are runtime arguments, so one build serves every shape of a
(config, dtype, epilogue).

>>> from tunehub.core import Target, Workload
>>> target = Target(kind="cpu", name="x", arch=("avx2", "fma"), cores=1, l1d_bytes=32768,
...                 l2_bytes=1 << 20, l3_bytes=32 << 20, machine="x86_64")
>>> config = BlisGemmTemplate().default_config(Workload(m=512, n=512, k=512), target)
>>> config["ISA"], config["MR"], config["NR"], config["KC"]
('avx2', 4, 24, 512)
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import math
import secrets
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from tunehub.core import (
    Capabilities,
    Config,
    MeasureRequest,
    MeasureResult,
    MeasureStatus,
    Target,
    Workload,
)
from tunehub.kernels.base import Artifact, BuildFailed, Template, TimingPolicy
from tunehub.kernels.blis_codegen import (
    ELEMENT_BYTES,
    ISA_REGISTERS,
    ISA_REGISTERS_AARCH64,
    ISA_VECTOR_BYTES,
    BlisParams,
    generate_source,
)
from tunehub.kernels.build import (
    BuildError,
    BuiltLibrary,
    build_shared_library,
    compiler,
    compiler_version,
)
from tunehub.kernels.environment import measurement_environment
from tunehub.kernels.machine import repeat_off_cpu, watch
from tunehub.kernels.reference import check_gemm, poisoned_output, random_operands, sample_rows
from tunehub.kernels.space import Knob, KnobConstraint, SearchSpace
from tunehub.kernels.timing import (
    MAX_WARMUP_SECS,
    MIN_REPEAT_SECS,
    MIN_REPEATS,
    repeat_min_secs,
    warmup_secs,
)

Array = npt.NDArray[np.floating]

KNOBS = ("ISA", "MR", "NR", "KC", "MC", "NC", "UNROLL", "threads", "PAR", "PREFETCH", "PACKB")
# Candidate block sizes; each space keeps the ones the cache model allows (see _SpaceModel).
KC_GRID = (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048)
MC_GRID = (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)
NC_GRID = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
UNROLLS = (1, 4)
DEFAULT_UNROLL = 4
PREFETCHES = (0, 8, 32)
PACKED_PREFETCHES = (0, 8)
DEFAULT_PREFETCH = 0
NOPACK_PREFETCH = 32
NOPACK_MAX_M = 256
MAX_MR = 16
MAX_NV = 4  # vectors per micro-tile row
# Used when the target does not report a cache size, and for L1 associativity (not reported).
FALLBACK_L1 = 32 << 10
FALLBACK_L2 = 256 << 10
FALLBACK_L3 = 8 << 20
ASSUMED_L1_WAYS = 8

# Timing: warm-up length, and the shortest repeat (tiny GEMMs batch calls per repeat).


class KernelError(RuntimeError):
    """A compiled kernel reported a failure (a packing buffer could not be allocated)."""


def available_isas(target: Target) -> tuple[str, ...]:
    """Micro-kernel ISAs for ``target``, best first; ``generic`` only without AVX2+FMA."""
    isas = []
    if target.machine in ("x86_64", "AMD64", "amd64", "i686", "i386") or not target.machine:
        if target.has("avx512f"):
            isas.append("avx512")
        if target.has("avx2") and target.has("fma"):
            isas.append("avx2")
    return tuple(isas) or ("generic",)


def vector_registers(isa: str, target: Target) -> int:
    if isa == "generic" and target.machine in ("aarch64", "arm64"):
        return ISA_REGISTERS_AARCH64
    return ISA_REGISTERS[isa]


def tile_fits(isa: str, mr: int, nv: int, target: Target) -> bool:
    """MR x nv accumulators + nv B vectors + one A broadcast fit in the vector registers."""
    return mr * nv + nv + 1 <= vector_registers(isa, target)


def space_tiles(isa: str, dtype: str, target: Target) -> list[tuple[int, int]]:
    """(MR, NR) pairs of the space: they fit the registers and use at least 5/8 of them for C.

    Smaller tiles load more operands per FMA and measure slower (16 x 1 zmm: 0.78x the 6 x 4
    tile at 127 x 5000 x 2048; 6 x 2 ymm 0.97x at 1024^3); dropping them keeps 40 random
    trials from spending themselves there."""
    return list(_space_tiles(isa, dtype, target))


# Every space (and every default config a lookup answers) needs the tiles: a few hundred
# microseconds each time, the same for one target.
@functools.lru_cache(maxsize=256)
def _space_tiles(isa: str, dtype: str, target: Target) -> tuple[tuple[int, int], ...]:
    regs = vector_registers(isa, target)
    vl = ISA_VECTOR_BYTES[isa] // ELEMENT_BYTES[dtype]
    return tuple(
        (mr, nv * vl)
        for nv in range(1, MAX_NV + 1)
        for mr in range(1, MAX_MR + 1)
        if tile_fits(isa, mr, nv, target) and 8 * mr * nv >= 5 * regs
    )


def model_tile(isa: str, dtype: str, target: Target) -> tuple[int, int]:
    """The register block of the analytical model (Low et al. 2016): among tiles that fit, the
    one loading the fewest operands per FMA, (MR + nv) / (MR * nv); ties go to more
    accumulators (more independent FMA chains to hide latency)."""
    vl = ISA_VECTOR_BYTES[isa] // ELEMENT_BYTES[dtype]

    def cost(tile: tuple[int, int]) -> tuple[float, int]:
        mr, nv = tile[0], tile[1] // vl
        return ((mr + nv) / (mr * nv), -mr * nv)

    return min(space_tiles(isa, dtype, target), key=cost)


# Pure, and asked with the same few arguments for every shape that shares a dimension (a
# batch lookup's defaults, a model's layers): cached.
@functools.lru_cache(maxsize=4096)
def _ladder(grid: tuple[int, ...], lo: float, hi: float, cap: int) -> tuple[int, ...]:
    """Grid values in [lo, hi] (else the one nearest that range), capped to ``cap``."""
    inside = [v for v in grid if lo <= v <= hi]
    if not inside:
        inside = [min(grid, key=lambda v: max(lo - v, v - hi))]
    return tuple(sorted({min(v, cap) for v in inside}))


def _nearest(values: Sequence[int], model: float) -> int:
    """The value nearest ``model`` on a log scale (ties to the larger)."""
    return min(values, key=lambda v: (abs(math.log(v / model)), -v))


@functools.lru_cache(maxsize=256)
def _space_model(workload: Workload, target: Target) -> _SpaceModel:
    """The space model of a shape, kept for the next ask: a lookup asks for the space and the
    default of each shape in turn, and a job for its space, default and seeds (a few
    hundred microseconds each time). Never changed once made."""
    return _SpaceModel(workload, target)


class _SpaceModel:
    """The analytical BLIS cache model (Low et al. 2016) for one workload and target.

    - KC: the model keeps the MR x KC micro-panel of A in a quarter of L1 and streams the
      KC x NR micro-panel of B from L2 (an AVX-512 core's L2 feeds one B vector per MR FMAs);
      measured on Zen 4, that KC (384 for 6 x 64 fp32) beats the classic "B micro-panel in
      L1" point (128) by 3-8%. The space allows B micro-panels from L1/4 to 4 x L1, so both
      regimes are searched.
    - MC: the MC x KC block of A lives in L2; the model fills half of L2 with it (B
      micro-panels and C pass through the rest). The space allows L2/8 .. 2 x L2 (blocks
      slightly over L2 still measure well where L2 is large and non-inclusive).
    - NC: the KC x NC panel of B lives in L3 (shared: the model takes a quarter of it; the
      space allows L3/16 .. L3/2).
    Threads: 1 or all cores, with the parallel loop PAR (ic or jc).
    PACKB: reading B in place (no packing) only pays when few MR-row passes reuse each B
    micro-panel, so it is offered for M <= NOPACK_MAX_M, always with software prefetch (the
    rows of an unpacked micro-panel are ldb apart, on different pages, where the hardware
    prefetcher does not follow). Packed panels are contiguous and the hardware prefetcher
    covers them, so PREFETCH there is only 0 or the short distance.
    UNROLL: the asm loop runs at the same speed for every unroll measured (1, 2, 4 within
    noise), so the space keeps the two ends.
    Every block size is capped to the workload's dimension (MC <= M, NC <= N, KC <= K).
    """

    def __init__(self, workload: Workload, target: Target) -> None:
        self.workload = workload
        self.target = target
        self.elem = ELEMENT_BYTES[workload.dtype]
        self.l1 = target.l1d_bytes or FALLBACK_L1
        self.l2 = target.l2_bytes or FALLBACK_L2
        self.l3 = target.l3_bytes or FALLBACK_L3
        self.isas = available_isas(target)
        self.tiles = {isa: space_tiles(isa, workload.dtype, target) for isa in self.isas}
        nrs = sorted({nr for tiles in self.tiles.values() for _, nr in tiles})
        self.mrs = sorted({mr for tiles in self.tiles.values() for mr, _ in tiles})
        self.nrs = nrs
        self.kc_allowed = {nr: self._kc_values(nr) for nr in nrs}
        kcs = sorted({kc for values in self.kc_allowed.values() for kc in values})
        self.kcs = kcs
        self.mc_allowed = {kc: self._mc_values(kc) for kc in kcs}
        self.nc_allowed = {kc: self._nc_values(kc) for kc in kcs}
        cores = max(1, target.cores)
        self.threads = tuple(sorted({1, cores}))
        self.pars = ("ic", "jc") if cores > 1 else ("ic",)

    def kc_model(self, mr: int) -> float:
        return self.l1 / 4 / (mr * self.elem)

    def mc_model(self, kc: int) -> float:
        return self.l2 / 2 / (kc * self.elem)

    def nc_model(self, kc: int) -> float:
        return self.l3 / 4 / (kc * self.elem)

    def _kc_values(self, nr: int) -> tuple[int, ...]:
        row = nr * self.elem
        return _ladder(KC_GRID, self.l1 / 4 / row, 4 * self.l1 / row, self.workload.k)

    def _mc_values(self, kc: int) -> tuple[int, ...]:
        row = kc * self.elem
        return _ladder(MC_GRID, self.l2 / 8 / row, 2 * self.l2 / row, self.workload.m)

    def _nc_values(self, kc: int) -> tuple[int, ...]:
        row = kc * self.elem
        return _ladder(NC_GRID, self.l3 / 16 / row, self.l3 / 2 / row, self.workload.n)

    def space(self) -> SearchSpace:
        tiles = {(isa, mr, nr) for isa, pairs in self.tiles.items() for mr, nr in pairs}
        knobs = (
            Knob("ISA", self.isas),
            Knob("MR", tuple(self.mrs)),
            Knob("NR", tuple(self.nrs)),
            Knob("KC", tuple(self.kcs)),
            Knob("MC", tuple(sorted({v for vs in self.mc_allowed.values() for v in vs}))),
            Knob("NC", tuple(sorted({v for vs in self.nc_allowed.values() for v in vs}))),
            Knob("UNROLL", UNROLLS),
            Knob("threads", self.threads),
            Knob("PAR", self.pars),
            Knob("PREFETCH", PREFETCHES),
            Knob("PACKB", (True, False) if self.workload.m <= NOPACK_MAX_M else (True,)),
        )
        constraints = (
            KnobConstraint(("ISA", "MR", "NR"), lambda c: (c["ISA"], c["MR"], c["NR"]) in tiles),
            KnobConstraint(("NR", "KC"), lambda c: c["KC"] in self.kc_allowed[int(c["NR"])]),
            KnobConstraint(("KC", "MC"), lambda c: c["MC"] in self.mc_allowed[int(c["KC"])]),
            KnobConstraint(("KC", "NC"), lambda c: c["NC"] in self.nc_allowed[int(c["KC"])]),
            # One thread has no parallel loop: keep a single spelling of it.
            KnobConstraint(("threads", "PAR"), lambda c: c["threads"] != 1 or c["PAR"] == "ic"),
            KnobConstraint(
                ("PACKB", "PREFETCH"),
                lambda c: c["PREFETCH"] in PACKED_PREFETCHES if c["PACKB"] else c["PREFETCH"] != 0,
            ),
        )
        return SearchSpace(knobs=knobs, constraints=constraints)

    def default(self) -> Config:
        isa = self.isas[0]
        return self.point(isa, *model_tile(isa, self.workload.dtype, self.target))

    def point(self, isa: str, mr: int, nr: int) -> Config:
        """The model's blocking around the ``mr`` x ``nr`` tile, single-threaded, B packed."""
        kc = _nearest(self.kc_allowed[nr], min(self.kc_model(mr), self.workload.k))
        mc = _nearest(self.mc_allowed[kc], min(self.mc_model(kc), self.workload.m))
        nc = _nearest(self.nc_allowed[kc], min(self.nc_model(kc), self.workload.n))
        return Config(
            {
                "ISA": isa,
                "MR": mr,
                "NR": nr,
                "KC": kc,
                "MC": mc,
                "NC": nc,
                "UNROLL": DEFAULT_UNROLL,
                "threads": 1,
                "PAR": "ic",
                "PREFETCH": DEFAULT_PREFETCH,
                "PACKB": True,
            }
        )

    def edge_point(self) -> Config:
        """The model's point for the tile that best fits this M and N: padding M and N up to
        whole tiles wastes FMAs (127 rows in 6-row tiles compute 132), so each tile of the
        space is scored by padded/useful work times (1 + operand loads per FMA)."""
        isa = self.isas[0]
        vl = ISA_VECTOR_BYTES[isa] // ELEMENT_BYTES[self.workload.dtype]
        m, n = self.workload.m, self.workload.n

        def score(tile: tuple[int, int]) -> float:
            mr, nr = tile
            nv = nr // vl
            padded = math.ceil(m / mr) * mr * math.ceil(n / nr) * nr / (m * n)
            return padded * (1 + (mr + nv) / (mr * nv))

        return self.point(isa, *min(self.tiles[isa], key=score))


def params_for(workload: Workload, config: Config) -> BlisParams:
    """The code-generation parameters of ``config``; ValueError if a knob is missing or bad."""
    missing = [name for name in KNOBS if name not in config]
    extra = sorted(set(config) - set(KNOBS))
    if missing or extra:
        raise ValueError(f"config knobs: missing {missing}, unknown {extra}")

    def as_int(name: str) -> int:
        value = config[name]
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name} must be an integer, got {value!r}")
        return value

    def as_bool(name: str) -> bool:
        value = config[name]
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be true or false, got {value!r}")
        return value

    return BlisParams(
        dtype=workload.dtype,
        epilogue=workload.epilogue,
        isa=str(config["ISA"]),
        mr=as_int("MR"),
        nr=as_int("NR"),
        kc=as_int("KC"),
        mc=as_int("MC"),
        nc=as_int("NC"),
        unroll=as_int("UNROLL"),
        threads=as_int("threads"),
        par=str(config["PAR"]),
        prefetch=as_int("PREFETCH"),
        packb=as_bool("PACKB"),
    )


@dataclass(frozen=True)
class BenchResult:
    """Per-call seconds of each timed repeat, and how many calls each repeat made."""

    repeat_secs: tuple[float, ...]
    calls_per_repeat: int
    warmup_secs: float
    pinned_cpu: int | None = None  # the CPU a single-threaded kernel was timed on
    # Per repeat: the largest share of it one of the kernel's threads was off its CPU.
    repeat_off_cpu: tuple[float | None, ...] = ()


_I64 = ctypes.c_int64
_PTR = ctypes.c_void_p
_F64 = ctypes.c_double


class GemmKernel:
    """A compiled blis.gemm kernel for one (config, dtype, epilogue); any M, N, K per call.

    >>> kernel = BlisGemmTemplate().compile(workload, target, config, build_dir)  # doctest: +SKIP
    >>> c = kernel(a, b, bias)  # doctest: +SKIP
    """

    def __init__(self, params: BlisParams, library: BuiltLibrary | Path) -> None:
        self.params = params
        self._open(library, params.dtype, params.epilogue in ("bias", "bias_relu"))

    def _open(self, library: BuiltLibrary | Path, dtype: str, has_bias: bool) -> None:
        """Load the library and bind the entry points every generated unit has (tunehub_gemm,
        tunehub_bench, tunehub_release)."""
        self.path = library.path if isinstance(library, BuiltLibrary) else Path(library)
        self.library = library if isinstance(library, BuiltLibrary) else None
        self.dtype = np.dtype(dtype)
        self.has_bias = has_bias
        self._lib = ctypes.CDLL(str(self.path))
        self._gemm = self._lib.tunehub_gemm
        self._gemm.argtypes = [_I64, _I64, _I64, _PTR, _I64, _PTR, _I64, _PTR, _I64, _PTR]
        self._gemm.restype = ctypes.c_int
        self._bench = self._lib.tunehub_bench
        # m, n, k, (A, lda), (B, ldb), (C, ldc), bias, warmup/min/repeat secs, min/max repeats,
        # out secs, out calls, out pinned CPU, out off-CPU shares
        self._bench.argtypes = [
            _I64, _I64, _I64, _PTR, _I64, _PTR, _I64, _PTR, _I64, _PTR,
            _F64, _F64, _F64, _I64, _I64, _PTR, _PTR, _PTR, _PTR,
        ]  # fmt: skip
        self._bench.restype = _I64
        release = self._lib.tunehub_release
        release.argtypes = []
        release.restype = None
        # A long-lived process loads many kernels; each one's packing buffers (up to L3/2)
        # must not outlive it.
        self._finalizer = weakref.finalize(self, release)

    def release_buffers(self) -> None:
        """Free the packing buffers now (of this thread and its OpenMP team); the kernel stays
        usable and allocates them again on its next call. Also done when it is collected."""
        self._lib.tunehub_release()

    def _operands(
        self, a: Array, b: Array, bias: Array | None, out: Array | None
    ) -> tuple[Array, Array, Array | None, Array]:
        for name, x in (("a", a), ("b", b)):
            if x.ndim != 2 or x.dtype != self.dtype:
                raise TypeError(f"{name} must be a 2-D {self.dtype} array, got {x.dtype} {x.shape}")
        a = a if a.strides[1] == self.dtype.itemsize else np.ascontiguousarray(a)
        b = b if b.strides[1] == self.dtype.itemsize else np.ascontiguousarray(b)
        (m, k), (k2, n) = a.shape, b.shape
        if k != k2:
            raise ValueError(f"inner dimensions differ: a is {a.shape}, b is {b.shape}")
        if k < 1:
            raise ValueError("K must be at least 1")
        if self.has_bias:
            if bias is None or bias.shape != (n,) or bias.dtype != self.dtype:
                raise ValueError(f"epilogue {self.params.epilogue} needs a ({n},) bias")
            bias = np.ascontiguousarray(bias)
        else:
            bias = None
        if out is None:
            out = np.empty((m, n), dtype=self.dtype)
        elif (
            out.shape != (m, n)
            or out.dtype != self.dtype
            or out.strides[1] != out.itemsize
            or not out.flags.writeable
        ):
            raise ValueError(
                f"out must be a writeable ({m}, {n}) {self.dtype} array with unit column stride"
            )
        return a, b, bias, out

    def _args(self, a: Array, b: Array, bias: Array | None, out: Array) -> list[Any]:
        size = self.dtype.itemsize
        m, k = a.shape
        n = b.shape[1]
        return [
            m,
            n,
            k,
            a.ctypes.data,
            a.strides[0] // size,
            b.ctypes.data,
            b.strides[0] // size,
            out.ctypes.data,
            out.strides[0] // size,
            bias.ctypes.data if bias is not None else None,
        ]

    def __call__(
        self, a: Array, b: Array, bias: Array | None = None, *, out: Array | None = None
    ) -> Array:
        """``epilogue(a @ b + bias)`` into ``out`` (a new array if None); returns it."""
        a, b, bias, out = self._operands(a, b, bias, out)
        if out.size and self._gemm(*self._args(a, b, bias, out)) != 0:
            raise KernelError("kernel could not allocate its packing buffers")
        return out

    def bench(
        self,
        a: Array,
        b: Array,
        bias: Array | None,
        out: Array,
        *,
        min_secs: float,
        max_repeats: int,
        min_repeats: int = MIN_REPEATS,
        warmup_secs: float = MAX_WARMUP_SECS,
        repeat_min_secs: float = MIN_REPEAT_SECS,
    ) -> BenchResult:
        """Time the kernel with the C timing loop (clock_gettime MONOTONIC).

        Cache policy: warm. Inputs, output and packing buffers stay the same between calls, so
        every repeat runs on cache-warm operands (as a GEMM inside a model's layer loop would,
        and as the numpy baseline is timed). At least one warm-up call for ``warmup_secs``;
        then repeats until ``min_secs`` in total and at least ``min(min_repeats,
        max_repeats)`` repeats, at most ``max_repeats``. A repeat is enough back-to-back calls
        to last ``repeat_min_secs``; its time is reported per call.
        """
        if max_repeats < 1:
            raise ValueError("max_repeats must be at least 1")
        a, b, bias, out = self._operands(a, b, bias, out)
        secs = np.zeros(max_repeats, dtype=np.float64)
        off = np.full(max_repeats, -1.0, dtype=np.float64)
        calls = np.zeros(1, dtype=np.int64)
        cpu = np.full(1, -1, dtype=np.int64)
        done = self._bench(
            *self._args(a, b, bias, out),
            warmup_secs,
            min_secs,
            repeat_min_secs,
            min(min_repeats, max_repeats),
            max_repeats,
            secs.ctypes.data,
            calls.ctypes.data,
            cpu.ctypes.data,
            off.ctypes.data,
        )
        if done < 0:
            raise KernelError("kernel could not allocate its packing buffers")
        pinned = int(cpu[0])
        return BenchResult(
            tuple(float(s) for s in secs[:done]),
            int(calls[0]),
            warmup_secs,
            pinned if pinned >= 0 else None,
            tuple(float(x) if x >= 0 else None for x in off[:done]),
        )


class BlisGemmTemplate(Template):
    """``blis.gemm``: see the module docstring."""

    name = "blis.gemm"
    baseline_template = "numpy.matmul"
    version = 2
    device_kind = "cpu"

    # --- space -----------------------------------------------------------------------------
    def capabilities(self, target: Target) -> Capabilities:
        return Capabilities(
            kinds=("cpu",),
            dtypes=tuple(ELEMENT_BYTES),
            a_layouts=("row_major",),
            b_layouts=("row_major",),
            epilogues=("none", "bias", "bias_relu"),
        )

    def space(self, workload: Workload, target: Target) -> SearchSpace:
        return _space_model(workload, target).space()

    def default_config(self, workload: Workload, target: Target) -> Config:
        """The analytical model's point (see _SpaceModel), single-threaded."""
        return _space_model(workload, target).default()

    def seed_configs(self, workload: Workload, target: Target) -> list[Config]:
        """The model's point, then its variants over the choices the model cannot settle:
        each thread count and parallel loop, B read in place (with prefetch) where the space
        offers it, and the same for the tile that best fits M and N (see edge_point).
        Blocking stays the model's; the search explores around these."""
        model = _space_model(workload, target)
        space = model.space()
        variants = [model.default()]
        for base in (model.default(), model.edge_point()):
            for threads in model.threads:
                for par in model.pars:
                    for packb in (True, False):
                        prefetch = DEFAULT_PREFETCH if packb else NOPACK_PREFETCH
                        variants.append(
                            base.replace(threads=threads, PAR=par, PACKB=packb, PREFETCH=prefetch)
                        )
        seeds: list[Config] = []
        for config in variants:
            if config not in seeds and space.is_valid(config):
                seeds.append(config)
        return seeds

    # --- build -----------------------------------------------------------------------------
    def config_problem(self, workload: Workload, target: Target, config: Config) -> str | None:
        """Why ``config`` cannot be generated for ``workload`` on ``target`` (None if it can).

        Looser than the space: any positive blocking and any register-resident tile of an ISA
        the target has, so integrations and tests can build points the tuner would not try.
        """
        try:
            params = params_for(workload, config)
        except ValueError as exc:
            return str(exc)
        if params.isa not in available_isas(target):
            return f"ISA {params.isa} is not available on {target.label}"
        if not tile_fits(params.isa, params.mr, params.nv, target):
            return (
                f"MR x NR = {params.mr} x {params.nr} needs {params.mr * params.nv} accumulators "
                f"+ {params.nv + 1} operands, more than {vector_registers(params.isa, target)} "
                f"{params.isa} registers"
            )
        return None

    def invalid_reason(self, workload: Workload, target: Target, config: Config) -> str | None:
        if self.space(workload, target).is_valid(config):
            return None
        problem = self.config_problem(workload, target, config)
        return f"config is not in the space of {self.name}" + (f": {problem}" if problem else "")

    def source(self, workload: Workload, config: Config) -> str:
        """The generated C source for ``config`` (shape-independent)."""
        return generate_source(params_for(workload, config))

    def build_library(
        self, workload: Workload, target: Target, config: Config, build_dir: Path
    ) -> tuple[BlisParams, BuiltLibrary]:
        """Generate and compile (or reuse from ``build_dir``) the library of ``config``.

        Raises ValueError for a config that cannot be generated, BuildError if compiling fails.
        """
        problem = self.config_problem(workload, target, config)
        if problem:
            raise ValueError(problem)
        params = params_for(workload, config)
        flags = ("-fopenmp",) if params.threads > 1 else ()
        library = build_shared_library(
            generate_source(params), build_dir=build_dir, flags=flags, stem="blis_gemm"
        )
        return params, library

    def _built_params(
        self, workload: Workload, target: Target, config: Config, build_dir: Path
    ) -> tuple[dict[str, Any], BuiltLibrary]:
        """build_library, with the parameters as the artifact stores them (what load reads)."""
        params, library = self.build_library(workload, target, config, build_dir)
        return dataclasses.asdict(params), library

    def compile(
        self, workload: Workload, target: Target, config: Config, build_dir: Path
    ) -> GemmKernel:
        """Build (or reuse from ``build_dir``) and load the kernel of ``config``.

        Raises ValueError for a config that cannot be generated, BuildError if compiling fails.
        The kernel computes any M, N, K of the workload's dtype and epilogue.
        """
        return GemmKernel(*self.build_library(workload, target, config, build_dir))

    # --- build and run -----------------------------------------------------------------------
    def build(self, request: MeasureRequest, *, build_dir: Path) -> Artifact:
        environment: dict[str, Any] = {"cc": compiler(), "compiler": compiler_version(compiler())}
        problem = self.request_problem(request)
        if problem:
            raise BuildFailed(MeasureStatus.INVALID, problem, environment=environment)
        start = time.perf_counter()
        try:
            params, lib = self._built_params(
                request.workload, request.target, request.config, build_dir
            )
        except (BuildError, ValueError) as exc:
            report = exc.report() if isinstance(exc, BuildError) else str(exc)
            if isinstance(exc, BuildError):
                environment["flags"] = list(exc.flags)
            raise BuildFailed(
                MeasureStatus.BUILD_ERROR,
                report,
                compile_secs=time.perf_counter() - start,
                environment=environment,
            ) from None
        environment.update(flags=list(lib.flags), build_key=lib.key, build_cached=lib.cached)
        return Artifact(
            template=self.name,
            key=lib.key,
            path=str(lib.path),
            data={"params": params},
            compile_secs=lib.compile_secs,
            cached=lib.cached,
            environment=environment,
        )

    def run(
        self, request: MeasureRequest, artifact: Artifact, *, timing: TimingPolicy
    ) -> MeasureResult:
        """Load the library, verify on fresh random inputs into a NaN-poisoned C, then time.

        Timing follows GemmKernel.bench (warm caches). The random seed is recorded in the
        environment so a wrong answer can be replayed.
        """
        environment = measurement_environment()
        environment.update(artifact.environment)
        kernel = self.load(artifact)
        try:
            return self._verify_and_time(
                kernel,
                request.workload,
                artifact.compile_secs,
                environment,
                timing.min_secs,
                timing.max_repeats,
            )
        finally:
            kernel.release_buffers()

    def load(self, artifact: Artifact) -> GemmKernel:
        """The kernel ``build`` made (its library loaded into this process)."""
        return GemmKernel(BlisParams(**artifact.data["params"]), Path(artifact.path))

    def _verify_and_time(
        self,
        kernel: GemmKernel,
        workload: Workload,
        compile_secs: float,
        environment: dict[str, Any],
        min_secs: float,
        max_repeats: int,
    ) -> MeasureResult:
        start = time.perf_counter()
        seed = secrets.randbits(63)
        rng = np.random.default_rng(seed)
        a, b, bias = random_operands(workload, rng)
        c = poisoned_output(workload)
        try:
            kernel(a, b, bias, out=c)
        except KernelError as exc:
            return self._failed(MeasureStatus.RUNTIME_ERROR, str(exc), compile_secs, environment)
        check = check_gemm(
            c,
            a,
            b,
            bias,
            workload.epilogue,
            rows=sample_rows(workload.m, workload.n, workload.k, rng),
        )
        verify_secs = time.perf_counter() - start
        environment.update(seed=seed, verify_rows=check.checked_rows)
        if not check.ok:
            return MeasureResult(
                MeasureStatus.WRONG_ANSWER,
                error=check.message,
                compile_secs=compile_secs,
                verify_secs=verify_secs,
                environment=environment,
            )
        environment.update(max_abs_err=check.max_abs_err, max_err_ratio=check.max_err_ratio)

        start = time.perf_counter()
        try:
            with watch() as machine:
                bench = kernel.bench(
                    a,
                    b,
                    bias,
                    c,
                    min_secs=min_secs,
                    max_repeats=max_repeats,
                    warmup_secs=warmup_secs(min_secs),
                    repeat_min_secs=repeat_min_secs(min_secs, max_repeats),
                )
        except KernelError as exc:
            return self._failed(MeasureStatus.RUNTIME_ERROR, str(exc), compile_secs, environment)
        run_secs = time.perf_counter() - start
        return self._timed(bench, machine, environment, compile_secs, verify_secs, run_secs)

    @staticmethod
    def _timed(
        bench: BenchResult,
        machine: dict[str, Any],
        environment: dict[str, Any],
        compile_secs: float,
        verify_secs: float,
        run_secs: float,
    ) -> MeasureResult:
        """The result of a timing loop: its times, or a runtime error for unusable ones, with
        the machine's state and the loop's own figures in the environment."""
        machine.update(repeat_off_cpu(bench.repeat_off_cpu))
        environment.update(
            machine=machine,
            cache_policy="warm",
            calls_per_repeat=bench.calls_per_repeat,
            warmup_secs=bench.warmup_secs,
            pinned_cpu=bench.pinned_cpu,
        )
        if not bench.repeat_secs or not all(0 < s < math.inf for s in bench.repeat_secs):
            return MeasureResult(
                MeasureStatus.RUNTIME_ERROR,
                error=f"timing loop returned unusable times {bench.repeat_secs[:5]}",
                compile_secs=compile_secs,
                verify_secs=verify_secs,
                run_secs=run_secs,
                environment=environment,
            )
        return MeasureResult(
            MeasureStatus.OK,
            repeat_secs=bench.repeat_secs,
            compile_secs=compile_secs,
            verify_secs=verify_secs,
            run_secs=run_secs,
            environment=environment,
        )

    @staticmethod
    def _failed(
        status: MeasureStatus, error: str, compile_secs: float, environment: dict[str, Any]
    ) -> MeasureResult:
        return MeasureResult(
            status, error=error, compile_secs=compile_secs, environment=environment
        )
