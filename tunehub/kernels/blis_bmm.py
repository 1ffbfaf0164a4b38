"""The ``blis.bmm`` template: batched GEMM on CPUs, ``batch`` products over the blis.gemm kernel.

Every knob of ``blis.gemm`` (its micro-kernel, blocking, threads, parallel loop, packing), and
``BPAR``: which loop the threads split. ``batch``: the threads take whole batch entries (an
OpenMP loop over the batch; each thread runs the serial loop nest with its own packing
buffers: no barriers, but idle threads when the batch is smaller than the team); ``inner``:
the entries run one after the other, each split over the threads as ``PAR`` says (``ic`` or
``jc``). One thread has one spelling (``inner``). B is either one per entry (batch stride
k*n) or shared by every entry (``b_broadcast``: stride 0), as ``torch.bmm`` of an expanded B;
a shared B makes the batch one GEMM of batch*m rows (A and C entries lie back to back), so
its blocks are packed once, not once per entry, and a small m still fills MC (the threads of
``BPAR=batch`` split those rows).

The batch loop and its timing are C (``blis_codegen.generate_source(..., bmm=BPAR)``): the
timed call is one whole bmm, so a small entry pays no Python per entry.

>>> from tunehub.core import Target, Workload
>>> target = Target(kind="cpu", name="x", arch=("avx2", "fma"), cores=4, l1d_bytes=32768,
...                 l2_bytes=1 << 20, l3_bytes=32 << 20, machine="x86_64")
>>> w = Workload(op="bmm", m=64, n=64, k=64, params={"batch": 8})
>>> sorted(BlisBmmTemplate().space(w, target).points[0])[:3]
['BPAR', 'ISA', 'KC']
"""

from __future__ import annotations

import ctypes
import secrets
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from tunehub.core import Capabilities, Config, MeasureResult, MeasureStatus, Target, Workload
from tunehub.kernels.blis_codegen import ELEMENT_BYTES, BlisParams, generate_source
from tunehub.kernels.blis_gemm import (
    BenchResult,
    BlisGemmTemplate,
    GemmKernel,
    KernelError,
    _SpaceModel,
    params_for,
)
from tunehub.kernels.build import BuiltLibrary, build_shared_library
from tunehub.kernels.machine import watch
from tunehub.kernels.reference import check_gemm, sample_rows
from tunehub.kernels.space import Knob, KnobConstraint, SearchSpace
from tunehub.kernels.timing import MIN_REPEATS, repeat_min_secs, warmup_secs

Array = npt.NDArray[np.floating]

BPARS = ("batch", "inner")
_I64 = ctypes.c_int64
_PTR = ctypes.c_void_p


def gemm_config(config: Config) -> Config:
    """``config`` without BPAR: the blis.gemm config of each entry."""
    return Config({name: value for name, value in config.items() if name != "BPAR"})


def bmm_operands(workload: Workload, rng: np.random.Generator) -> tuple[Array, Array]:
    """Fresh A (batch x m x k) and B (batch x k x n, or k x n when broadcast), uniform in
    [-1, 1), in the workload's dtype."""
    dtype = np.dtype(workload.dtype)
    batch = int(workload.param("batch"))
    a = rng.uniform(-1.0, 1.0, (batch, workload.m, workload.k)).astype(dtype)
    b_shape: tuple[int, ...] = (workload.k, workload.n)
    if not workload.param("b_broadcast"):
        b_shape = (batch, *b_shape)
    b = rng.uniform(-1.0, 1.0, b_shape).astype(dtype)
    return a, b


def check_bmm(
    c: Array, a: Array, b: Array, rng: np.random.Generator
) -> tuple[bool, int, float, float, str]:
    """Every entry of ``c`` against the float64 reference (``check_gemm``, on a row sample
    where an entry is large): (ok, rows checked, max abs error, max error ratio, message)."""
    batch, m, k = a.shape
    n = b.shape[-1]
    rows_checked, max_abs, max_ratio = 0, 0.0, 0.0
    for i in range(batch):
        bi = b if b.ndim == 2 else b[i]
        check = check_gemm(c[i], a[i], bi, None, "none", rows=sample_rows(m, n, k, rng))
        rows_checked += check.checked_rows
        if not check.ok:
            return (
                False,
                rows_checked,
                check.max_abs_err,
                check.max_err_ratio,
                (f"batch entry {i}: {check.message}"),
            )
        max_abs = max(max_abs, check.max_abs_err)
        max_ratio = max(max_ratio, check.max_err_ratio)
    return True, rows_checked, max_abs, max_ratio, ""


class BmmKernel(GemmKernel):
    """A compiled blis.bmm kernel for one (config, dtype); any batch, M, N, K per call."""

    def __init__(self, params: BlisParams, library: BuiltLibrary | Path) -> None:
        super().__init__(params, library)
        self._bmm = self._lib.tunehub_bmm
        self._bmm.argtypes = [_I64, _I64, _I64, _I64, _PTR, _I64, _I64, _PTR, _I64, _I64,
                              _PTR, _I64, _I64]  # fmt: skip
        self._bmm.restype = ctypes.c_int
        self._shape = self._lib.tunehub_bmm_shape
        self._shape.argtypes = [_I64, _I64, _I64, _I64]
        self._shape.restype = None

    def _batched(self, a: Array, b: Array, out: Array | None) -> tuple[Array, Array, Array]:
        if a.ndim != 3 or a.dtype != self.dtype or not a.flags.c_contiguous:
            raise TypeError(f"a must be a C-contiguous 3-D {self.dtype} array, got {a.shape}")
        if b.ndim not in (2, 3) or b.dtype != self.dtype or not b.flags.c_contiguous:
            raise TypeError(f"b must be a C-contiguous 2-D or 3-D {self.dtype} array")
        batch, m, k = a.shape
        n = b.shape[-1]
        if b.shape[-2] != k or (b.ndim == 3 and b.shape[0] != batch):
            raise ValueError(f"a is {a.shape}, b is {b.shape}: they do not multiply")
        if out is None:
            out = np.empty((batch, m, n), dtype=self.dtype)
        elif out.shape != (batch, m, n) or out.dtype != self.dtype or not out.flags.c_contiguous:
            raise ValueError(f"out must be a C-contiguous ({batch}, {m}, {n}) {self.dtype} array")
        return a, b, out

    def bmm(self, a: Array, b: Array, *, out: Array | None = None) -> Array:
        """``a[i] @ b[i]`` (``a[i] @ b`` for a 2-D b) for every i, into ``out``."""
        a, b, out = self._batched(a, b, out)
        batch, m, k = a.shape
        n = b.shape[-1]
        sb = 0 if b.ndim == 2 else k * n
        if out.size and self._bmm(
            batch, m, n, k, a.ctypes.data, k, m * k, b.ctypes.data, n, sb, out.ctypes.data, n,
            m * n,
        ):  # fmt: skip
            raise KernelError("kernel could not allocate its packing buffers")
        return out

    def bench_bmm(
        self, a: Array, b: Array, out: Array, *, min_secs: float, max_repeats: int
    ) -> BenchResult:
        """Time whole bmm calls with the C timing loop (warm caches, as GemmKernel.bench)."""
        a, b, out = self._batched(a, b, out)
        batch, m, k = a.shape
        n = b.shape[-1]
        self._shape(batch, m * k, 0 if b.ndim == 2 else k * n, m * n)
        try:
            return self.bench(
                a[0],
                b if b.ndim == 2 else b[0],
                None,
                out[0],
                min_secs=min_secs,
                max_repeats=max_repeats,
                min_repeats=MIN_REPEATS,
                warmup_secs=warmup_secs(min_secs),
                repeat_min_secs=repeat_min_secs(min_secs, max_repeats),
            )
        finally:
            self._shape(1, 0, 0, 0)


class BlisBmmTemplate(BlisGemmTemplate):
    """``blis.bmm``: see the module docstring."""

    name = "blis.bmm"
    baseline_template = "torch.bmm"
    # 2: a broadcast B runs the batch as one GEMM of batch*m rows (B packed once).
    version = 2
    device_kind = "cpu"

    def capabilities(self, target: Target) -> Capabilities:
        return Capabilities(
            kinds=("cpu",),
            ops=("bmm",),
            dtypes=tuple(ELEMENT_BYTES),
            a_layouts=("row_major",),
            b_layouts=("row_major",),
            epilogues=("none",),
        )

    def space(self, workload: Workload, target: Target) -> SearchSpace:
        gemm = _SpaceModel(workload, target).space()
        return SearchSpace(
            knobs=(Knob("BPAR", BPARS), *gemm.knobs),
            constraints=(
                *gemm.constraints,
                # One thread splits nothing; the batch split has no inner parallel loop.
                KnobConstraint(
                    ("BPAR", "threads", "PAR"),
                    lambda c: (
                        c["BPAR"] == "inner"
                        if c["threads"] == 1
                        else c["BPAR"] == "inner" or c["PAR"] == "ic"
                    ),
                ),
            ),
        )

    def default_config(self, workload: Workload, target: Target) -> Config:
        """blis.gemm's analytical point for one entry, single-threaded."""
        return Config({"BPAR": "inner", **_SpaceModel(workload, target).default().to_dict()})

    def seed_configs(self, workload: Workload, target: Target) -> list[Config]:
        """blis.gemm's seeds for one entry, each with the threads over the batch and within
        each entry."""
        space = self.space(workload, target)
        seeds: list[Config] = []
        for gemm in super().seed_configs(workload, target):
            for bpar in BPARS:
                config = Config({"BPAR": bpar, **gemm.to_dict()})
                if bpar == "batch":
                    config = config.replace(PAR="ic")
                if config not in seeds and space.is_valid(config):
                    seeds.append(config)
        return seeds

    def config_problem(self, workload: Workload, target: Target, config: Config) -> str | None:
        if config.get("BPAR") not in BPARS:
            return f"BPAR must be one of {BPARS}, got {config.get('BPAR')!r}"
        return super().config_problem(workload, target, gemm_config(config))

    def source(self, workload: Workload, config: Config) -> str:
        return generate_source(params_for(workload, gemm_config(config)), bmm=str(config["BPAR"]))

    def build_library(
        self, workload: Workload, target: Target, config: Config, build_dir: Path
    ) -> tuple[BlisParams, BuiltLibrary]:
        problem = self.config_problem(workload, target, config)
        if problem:
            raise ValueError(problem)
        params = params_for(workload, gemm_config(config))
        flags = ("-fopenmp",) if params.threads > 1 else ()
        library = build_shared_library(
            self.source(workload, config), build_dir=build_dir, flags=flags, stem="blis_bmm"
        )
        return params, library

    def compile(
        self, workload: Workload, target: Target, config: Config, build_dir: Path
    ) -> BmmKernel:
        return BmmKernel(*self.build_library(workload, target, config, build_dir))

    def load(self, artifact: Any) -> BmmKernel:
        return BmmKernel(BlisParams(**artifact.data["params"]), Path(artifact.path))

    def _verify_and_time(
        self,
        kernel: GemmKernel,
        workload: Workload,
        compile_secs: float,
        environment: dict[str, Any],
        min_secs: float,
        max_repeats: int,
    ) -> MeasureResult:
        assert isinstance(kernel, BmmKernel)
        start = time.perf_counter()
        seed = secrets.randbits(63)
        rng = np.random.default_rng(seed)
        a, b = bmm_operands(workload, rng)
        batch = int(workload.param("batch"))
        c = np.full((batch, workload.m, workload.n), np.nan, dtype=np.dtype(workload.dtype))
        try:
            kernel.bmm(a, b, out=c)
        except KernelError as exc:
            return self._failed(MeasureStatus.RUNTIME_ERROR, str(exc), compile_secs, environment)
        ok, rows, max_abs, max_ratio, message = check_bmm(c, a, b, rng)
        verify_secs = time.perf_counter() - start
        environment.update(seed=seed, verify_rows=rows)
        if not ok:
            return MeasureResult(
                MeasureStatus.WRONG_ANSWER,
                error=message,
                compile_secs=compile_secs,
                verify_secs=verify_secs,
                environment=environment,
            )
        environment.update(max_abs_err=max_abs, max_err_ratio=max_ratio)
        start = time.perf_counter()
        try:
            with watch() as machine:
                bench = kernel.bench_bmm(a, b, c, min_secs=min_secs, max_repeats=max_repeats)
        except KernelError as exc:
            return self._failed(MeasureStatus.RUNTIME_ERROR, str(exc), compile_secs, environment)
        run_secs = time.perf_counter() - start
        return self._timed(bench, machine, environment, compile_secs, verify_secs, run_secs)
