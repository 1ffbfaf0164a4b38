"""blis.gemm: generated kernels against numpy on odd shapes, the check, build errors, measure."""

from __future__ import annotations

import itertools
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tunehub.core import (
    Config,
    MeasureRequest,
    MeasureStatus,
    Target,
    Workload,
    local_cpu_target,
)
from tunehub.kernels.base import TimingPolicy
from tunehub.kernels.blis_codegen import BlisParams, generate_source
from tunehub.kernels.blis_gemm import BlisGemmTemplate, GemmKernel
from tunehub.kernels.build import BuildError, build_shared_library
from tunehub.kernels.reference import check_gemm, random_operands, reference_gemm
from tunehub.kernels.registry import UnknownTemplate, get_template, template_names

HOST = local_cpu_target()
TEMPLATE = BlisGemmTemplate()
DTYPES = ("float32", "float64")
EPILOGUES = ("none", "bias", "bias_relu")
# The portable (GCC vector extension) kernel is what a CPU without AVX2 gets: a target
# without x86 ISA flags selects it, and it compiles and runs on this host too.
GENERIC = Target(
    kind="cpu",
    name="portable",
    arch=(),
    cores=2,
    l1d_bytes=32 << 10,
    l2_bytes=1 << 20,
    l3_bytes=8 << 20,
    machine=HOST.machine,
)
VECTOR_BYTES = {"avx512": 64, "avx2": 32, "generic": 16}

needs_avx512 = pytest.mark.skipif(not HOST.has("avx512f"), reason="host has no AVX-512")
needs_avx2 = pytest.mark.skipif(
    not (HOST.has("avx2") and HOST.has("fma")), reason="host has no AVX2+FMA"
)

# (name, ISA, MR, vectors per row, KC, MC, NC, UNROLL, threads, PAR, PREFETCH, PACKB).
# Blockings are small so that 1..300 shapes cross every loop's edge: partial KC, MC and NC
# blocks and partial tiles (masked N edges, short M edges). MR 9, 12 and 16 put a partial
# 8-row group after a full one in the vectorised A packing.
KERNELS = [
    ("avx512-6x4v", "avx512", 6, 4, 32, 24, 3, 4, 1, "ic", 0, True),
    ("avx512-5x3v-pf-nopack", "avx512", 5, 3, 48, 40, 2, 2, 1, "ic", 8, False),
    ("avx512-12x2v-pf", "avx512", 12, 2, 29, 36, 3, 4, 1, "ic", 32, True),
    ("avx512-16x1v-nopack", "avx512", 16, 1, 24, 32, 5, 1, 1, "ic", 0, False),
    ("avx2-6x2v", "avx2", 6, 2, 64, 30, 5, 1, 1, "ic", 0, True),
    ("avx2-2x4v-nopack", "avx2", 2, 4, 17, 9, 1, 3, 1, "ic", 8, False),
    ("avx2-9x1v", "avx2", 9, 1, 40, 18, 6, 2, 1, "ic", 0, True),
    ("generic-4x3v", "generic", 4, 3, 40, 16, 4, 4, 1, "ic", 0, True),
    ("generic-3x2v-pf-nopack", "generic", 3, 2, 23, 12, 3, 2, 1, "ic", 8, False),
    ("avx2-6x2v-2t-ic", "avx2", 6, 2, 64, 24, 4, 4, 2, "ic", 0, True),
    ("avx2-6x2v-2t-jc", "avx2", 6, 2, 64, 24, 2, 4, 2, "jc", 0, True),
    ("avx512-8x3v-2t-ic-nopack", "avx512", 8, 3, 32, 16, 2, 4, 2, "ic", 32, False),
]
KERNEL_NAMES = [k[0] for k in KERNELS]


def kernel_config(name: str, dtype: str) -> tuple[Target, Config]:
    _, isa, mr, nv, kc, mc, nc_tiles, unroll, threads, par, prefetch, packb = next(
        k for k in KERNELS if k[0] == name
    )
    nr = nv * VECTOR_BYTES[isa] // np.dtype(dtype).itemsize
    target = GENERIC if isa == "generic" else HOST
    config = Config(
        {
            "ISA": isa,
            "MR": mr,
            "NR": nr,
            "KC": kc,
            "MC": mc,
            "NC": nc_tiles * nr,
            "UNROLL": unroll,
            "threads": threads,
            "PAR": par,
            "PREFETCH": prefetch,
            "PACKB": packb,
        }
    )
    return target, config


def runnable(name: str) -> bool:
    isa = next(k[1] for k in KERNELS if k[0] == name)
    if isa == "avx512":
        return HOST.has("avx512f")
    if isa == "avx2":
        return HOST.has("avx2") and HOST.has("fma")
    return True


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("blis-build")


# The epilogue only changes the C stores, which bias_relu exercises fully (bias, accumulate,
# ReLU): every kernel is built with it, these also with the other two (keeps the builds few).
ALL_EPILOGUES = ("avx512-6x4v", "avx512-5x3v-pf-nopack", "avx2-6x2v", "generic-4x3v")
BUILT = [
    key
    for key in itertools.product(KERNEL_NAMES, DTYPES, EPILOGUES)
    if runnable(key[0]) and (key[2] == "bias_relu" or key[0] in ALL_EPILOGUES)
]


@pytest.fixture(scope="module")
def kernels(build_dir: Path) -> dict[tuple[str, str, str], GemmKernel]:
    """Every (kernel, dtype, epilogue) of BUILT built once, two compilers at a time."""
    keys = BUILT

    def build(key: tuple[str, str, str]) -> GemmKernel:
        name, dtype, epilogue = key
        target, config = kernel_config(name, dtype)
        workload = Workload(m=1, n=1, k=1, dtype=dtype, epilogue=epilogue)
        return TEMPLATE.compile(workload, target, config, build_dir)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(keys, pool.map(build, keys), strict=True))


def run_and_check(
    kernel: GemmKernel, m: int, n: int, k: int, dtype: str, epilogue: str, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    a, b, bias = random_operands(Workload(m=m, n=n, k=k, dtype=dtype, epilogue=epilogue), rng)
    # C is a view into a NaN-poisoned frame: partial tiles (masked stores) must write exactly
    # their own elements, none of the frame's.
    frame = np.full((m + 2, n + 19), np.nan, dtype=dtype)
    c = frame[1 : m + 1, 3 : n + 3]
    kernel(a, b, bias, out=c)
    check = check_gemm(c, a, b, bias, epilogue)
    assert check.ok, f"{kernel.params} {m}x{n}x{k}: {check.message}"
    assert check.checked_rows == m
    outside = np.ones(frame.shape, dtype=bool)
    outside[1 : m + 1, 3 : n + 3] = False
    assert np.isnan(frame[outside]).all(), f"{kernel.params} {m}x{n}x{k} wrote outside C"


@settings(max_examples=40, deadline=None)
@given(
    key=st.sampled_from(BUILT),
    m=st.integers(1, 300),
    n=st.integers(1, 300),
    k=st.integers(1, 300),
    seed=st.integers(0, 2**32 - 1),
)
def test_kernels_match_numpy_on_random_shapes(
    kernels: dict[tuple[str, str, str], GemmKernel],
    key: tuple[str, str, str],
    m: int,
    n: int,
    k: int,
    seed: int,
) -> None:
    _, dtype, epilogue = key
    run_and_check(kernels[key], m, n, k, dtype, epilogue, seed)


def test_threaded_kernels_release_and_rebuild_their_buffers(
    kernels: dict[tuple[str, str, str], GemmKernel],
) -> None:
    for name in ("avx2-6x2v-2t-ic", "avx2-6x2v-2t-jc", "avx512-8x3v-2t-ic-nopack"):
        if not runnable(name):
            pytest.skip("ISA not on this host")
        kernel = kernels[name, "float32", "bias_relu"]
        run_and_check(kernel, 130, 70, 150, "float32", "bias_relu", 0)
        kernel.release_buffers()
        run_and_check(kernel, 131, 69, 151, "float32", "bias_relu", 1)


@pytest.mark.parametrize("name", KERNEL_NAMES)
def test_kernels_match_numpy_around_block_edges(
    kernels: dict[tuple[str, str, str], GemmKernel], name: str
) -> None:
    if not runnable(name):
        pytest.skip("ISA not on this host")
    for dtype in DTYPES:
        kernel = kernels[name, dtype, "bias_relu"]
        p = kernel.params
        shapes = [
            (1, 1, 1),
            (p.mr, p.nr, p.kc),
            (p.mr + 1, p.nr - 1, p.kc + 1),
            (p.mc_eff - 1, p.nc_eff + 1, 2 * p.kc - 1),
            (p.mc_eff + 1, p.nc_eff - 1, 1),
            (2 * p.mc_eff + p.mr - 1, 2 * p.nc_eff + 1, 3 * p.kc),
        ]
        for i, (m, n, k) in enumerate(shapes):
            run_and_check(kernel, max(m, 1), max(n, 1), max(k, 1), dtype, "bias_relu", i)


@needs_avx2
def test_kernel_reads_strided_rows_and_writes_into_a_view(build_dir: Path) -> None:
    workload = Workload(m=37, n=45, k=29, dtype="float64", epilogue="bias")
    kernel = TEMPLATE.compile(workload, HOST, TEMPLATE.default_config(workload, HOST), build_dir)
    rng = np.random.default_rng(1)
    big_a = rng.uniform(-1, 1, (37, 50))
    big_b = rng.uniform(-1, 1, (29, 60))
    bias = rng.uniform(-1, 1, 45)
    a, b = big_a[:, :29], big_b[:, 7:52]  # row strides 50 and 60, not the logical widths
    out = np.full((37, 70), np.nan)
    view = out[:, 5:50]
    kernel(a, b, bias, out=view)
    np.testing.assert_allclose(view, reference_gemm(a, b, bias, "bias"), rtol=1e-12, atol=1e-12)
    assert np.isnan(out[:, :5]).all() and np.isnan(out[:, 50:]).all()  # nothing outside C
    # column-strided input is copied, not misread
    c = kernel(np.asfortranarray(a), b, bias)
    np.testing.assert_allclose(c, view, rtol=1e-12, atol=1e-12)
    # freed packing buffers come back on the next call
    kernel.release_buffers()
    np.testing.assert_allclose(kernel(a, b, bias), view, rtol=1e-12, atol=1e-12)


def test_kernel_rejects_mismatched_operands(build_dir: Path) -> None:
    workload = Workload(m=4, n=4, k=4, dtype="float32", epilogue="bias")
    kernel = TEMPLATE.compile(
        workload, GENERIC, TEMPLATE.default_config(workload, GENERIC), build_dir
    )
    a = np.ones((4, 4), np.float32)
    with pytest.raises(TypeError):
        kernel(a.astype(np.float64), a, np.ones(4, np.float32))
    with pytest.raises(ValueError, match="bias"):
        kernel(a, a)
    with pytest.raises(ValueError, match="inner"):
        kernel(a, np.ones((3, 4), np.float32), np.ones(4, np.float32))


# --- the check itself -------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_check_flags_poison_perturbation_and_a_dropped_term(dtype: str) -> None:
    rng = np.random.default_rng(7)
    m, n, k = 40, 50, 300
    a, b, bias = random_operands(Workload(m=m, n=n, k=k, dtype=dtype, epilogue="bias"), rng)
    good = reference_gemm(a, b, bias, "bias").astype(dtype)
    assert check_gemm(good, a, b, bias, "bias").ok

    poisoned = good.copy()
    poisoned[m - 1, n - 1] = np.nan  # one element the kernel never wrote
    result = check_gemm(poisoned, a, b, bias, "bias")
    assert not result.ok and result.bad == 1 and "C[39, 49]" in result.message

    perturbed = good.copy()
    perturbed[3, 4] *= 1 + 1e-3
    perturbed[3, 4] += 1e-3
    assert not check_gemm(perturbed, a, b, bias, "bias").ok

    # a kernel that skipped one product term of a 300-term sum
    dropped = (reference_gemm(a, b, bias, "bias") - np.outer(a[:, 17], b[17, :])).astype(dtype)
    result = check_gemm(dropped, a, b, bias, "bias")
    assert not result.ok and result.bad > m * n // 2

    # the relu is checked too
    assert not check_gemm(good, a, b, bias, "bias_relu").ok


def test_check_samples_rows_of_huge_outputs_but_sees_all_poison() -> None:
    from tunehub.kernels.reference import sample_rows

    rng = np.random.default_rng(0)
    rows = sample_rows(4096, 4096, 4096, rng)
    assert rows is not None and 0 in rows and 4095 in rows and len(rows) < 4096
    assert sample_rows(300, 300, 300, rng) is None
    a = rng.uniform(-1, 1, (600, 8))
    b = rng.uniform(-1, 1, (8, 5))
    c = reference_gemm(a, b, None, "none")
    c[300, 2] = np.nan
    sampled = np.array([0, 1, 599])
    result = check_gemm(c, a, b, None, "none", rows=sampled)
    assert not result.ok and result.checked_rows == 3 and "C[300, 2]" in result.message


# --- building ---------------------------------------------------------------------------------
def test_builds_are_cached_by_source_and_flags(build_dir: Path) -> None:
    workload = Workload(m=8, n=8, k=8, dtype="float32")
    config = TEMPLATE.default_config(workload, GENERIC)
    first = TEMPLATE.compile(workload, GENERIC, config, build_dir)
    again = TEMPLATE.compile(workload, GENERIC, config, build_dir)
    assert again.library.cached and again.library.path == first.library.path
    other = TEMPLATE.compile(workload, GENERIC, config.replace(KC=int(config["KC"]) + 1), build_dir)
    assert other.library.path != first.library.path
    # one build serves every shape: the source does not depend on M, N, K
    assert TEMPLATE.source(workload, config) == TEMPLATE.source(
        Workload(m=300, n=17, k=5, dtype="float32"), config
    )


def test_compiler_errors_carry_the_stderr_tail(tmp_path: Path) -> None:
    with pytest.raises(BuildError) as info:
        build_shared_library("int f(void) { return undeclared_thing; }", build_dir=tmp_path)
    assert "undeclared_thing" in info.value.stderr
    assert not list(tmp_path.glob("*.so"))


def test_codegen_rejects_impossible_parameters() -> None:
    with pytest.raises(ValueError, match="multiple"):
        BlisParams("float32", "none", "avx2", mr=4, nr=12, kc=64, mc=64, nc=64)
    with pytest.raises(ValueError, match="PAR"):
        BlisParams("float32", "none", "avx2", mr=4, nr=16, kc=64, mc=64, nc=64, par="pc")
    with pytest.raises(ValueError, match="PREFETCH"):
        BlisParams("float32", "none", "avx2", mr=4, nr=16, kc=64, mc=64, nc=64, prefetch=-1)
    with pytest.raises(ValueError, match="PACKB"):
        BlisParams("float32", "none", "avx2", 4, 16, 64, 64, 64, packb=1)  # type: ignore[arg-type]
    src = generate_source(BlisParams("float64", "bias_relu", "avx512", 6, 32, 64, 60, 64))
    assert "vfmadd231pd" in src and "%%zmm23" in src and "_mm512_max_pd" in src
    assert "prefetcht0" not in src
    prefetching = generate_source(
        BlisParams("float32", "none", "avx2", 6, 16, 64, 60, 64, prefetch=8, packb=False)
    )
    assert "prefetcht0" in prefetching and "#define PACKB 0" in prefetching
    problem = TEMPLATE.config_problem(
        Workload(m=8, n=8, k=8),
        HOST,
        TEMPLATE.default_config(Workload(m=8, n=8, k=8), HOST).replace(MR=16, NR=64),
    )
    assert problem is not None


# --- measure ----------------------------------------------------------------------------------
def request_for(workload: Workload, target: Target, config: Config | None = None) -> MeasureRequest:
    config = config or TEMPLATE.default_config(workload, target)
    return MeasureRequest(workload, target, TEMPLATE.name, TEMPLATE.version, config)


@pytest.mark.parametrize("epilogue", EPILOGUES)
def test_measure_default_config_is_ok_and_timed(
    build_dir: Path, tmp_path: Path, epilogue: str
) -> None:
    workload = Workload(m=96, n=80, k=72, dtype="float32", epilogue=epilogue)
    template = BlisGemmTemplate()
    result = template.measure(
        request_for(workload, HOST),
        build_dir=build_dir,
        timing=TimingPolicy(min_secs=0.02, max_repeats=20),
    )
    assert result.status is MeasureStatus.OK, result.error
    assert 3 <= len(result.repeat_secs) <= 20
    assert all(0 < s < 0.01 for s in result.repeat_secs)  # a 1 MFLOP GEMM: microseconds
    assert result.compile_secs >= 0 and result.verify_secs > 0 and result.run_secs > 0
    env = result.environment
    for key in ("host", "cpu", "compiler", "flags", "measured_at", "seed", "calls_per_repeat"):
        assert key in env
    assert "-march=native" in env["flags"] and env["cache_policy"] == "warm"
    assert env["max_err_ratio"] <= 1


def test_timing_loop_honours_min_secs_and_max_repeats(build_dir: Path) -> None:
    workload = Workload(m=64, n=64, k=64)
    kernel = TEMPLATE.compile(
        workload, GENERIC, TEMPLATE.default_config(workload, GENERIC), build_dir
    )
    a, b, _ = random_operands(workload, np.random.default_rng(0))
    c = np.empty((64, 64), np.float32)
    capped = kernel.bench(a, b, None, c, min_secs=10.0, max_repeats=4, repeat_min_secs=1e-4)
    assert len(capped.repeat_secs) == 4
    timed = kernel.bench(a, b, None, c, min_secs=0.05, max_repeats=10_000, repeat_min_secs=1e-3)
    total = sum(s * timed.calls_per_repeat for s in timed.repeat_secs)
    assert total >= 0.05 and len(timed.repeat_secs) >= 3 and timed.calls_per_repeat > 1
    assert all(s > 0 for s in timed.repeat_secs)
    quick = kernel.bench(a, b, None, c, min_secs=0.0, max_repeats=50, warmup_secs=0.0)
    assert len(quick.repeat_secs) == 3
    np.testing.assert_allclose(c, reference_gemm(a, b, None, "none"), rtol=1e-4, atol=1e-4)


def test_single_thread_timing_is_pinned_and_affinity_restored(
    kernels: dict[tuple[str, str, str], GemmKernel],
) -> None:
    import os

    a, b, _ = random_operands(Workload(m=40, n=40, k=40), np.random.default_rng(0))
    c = np.empty((40, 40), np.float32)
    before = os.sched_getaffinity(0)
    serial = kernels["generic-4x3v", "float32", "none"]
    timed = serial.bench(a, b, None, c, min_secs=0.0, max_repeats=3, warmup_secs=0.0)
    assert timed.pinned_cpu is not None and timed.pinned_cpu in before
    assert os.sched_getaffinity(0) == before
    np.testing.assert_allclose(c, reference_gemm(a, b, None, "none"), rtol=1e-4, atol=1e-4)
    if runnable("avx2-6x2v-2t-ic"):
        threaded = kernels["avx2-6x2v-2t-ic", "float32", "bias_relu"]
        bias = np.zeros(40, np.float32)
        result = threaded.bench(a, b, bias, c, min_secs=0.0, max_repeats=3, warmup_secs=0.0)
        assert result.pinned_cpu is None and os.sched_getaffinity(0) == before
        expected = reference_gemm(a, b, bias, "bias_relu")
        np.testing.assert_allclose(c, expected, rtol=1e-4, atol=1e-4)


def test_measure_reports_a_wrong_kernel(
    build_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run path turns a kernel whose output is off into wrong_answer, not a time."""
    real_load = BlisGemmTemplate.load

    class OffByOne:
        def __init__(self, kernel: GemmKernel) -> None:
            self.kernel = kernel
            self.dtype = kernel.dtype
            self.library = kernel.library
            self.release_buffers = kernel.release_buffers

        def __call__(self, a, b, bias=None, *, out=None):  # type: ignore[no-untyped-def]
            c = self.kernel(a, b, bias, out=out)
            c[-1, -1] += 1.0
            return c

    monkeypatch.setattr(
        BlisGemmTemplate, "load", lambda self, artifact: OffByOne(real_load(self, artifact))
    )
    template = BlisGemmTemplate()
    result = template.measure(
        request_for(Workload(m=33, n=21, k=13), HOST),
        build_dir=build_dir,
        timing=TimingPolicy(min_secs=0.01, max_repeats=5),
    )
    assert result.status is MeasureStatus.WRONG_ANSWER
    assert "C[32, 20]" in result.error and not result.repeat_secs


def test_measure_reports_build_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", "false")
    template = BlisGemmTemplate()
    result = template.measure(
        request_for(Workload(m=8, n=8, k=8), HOST),
        build_dir=tmp_path / "build",
        timing=TimingPolicy(min_secs=0.01, max_repeats=3),
    )
    assert result.status is MeasureStatus.BUILD_ERROR
    assert "false exited with status 1" in result.error
    assert result.environment["cc"] == "false"


def test_measure_rejects_configs_outside_the_space(tmp_path: Path) -> None:
    workload = Workload(m=8, n=8, k=8)
    default = TEMPLATE.default_config(workload, HOST)
    outside = request_for(workload, HOST, default.replace(KC=7))
    quick = TimingPolicy(min_secs=0.01, max_repeats=3)
    result = TEMPLATE.measure(outside, build_dir=tmp_path, timing=quick)
    assert result.status is MeasureStatus.INVALID and "not in the space" in result.error
    old = MeasureRequest(workload, HOST, TEMPLATE.name, TEMPLATE.version + 1, default)
    result = TEMPLATE.measure(old, build_dir=tmp_path, timing=quick)
    assert result.status is MeasureStatus.INVALID and "v2" in result.error
    gpu = Target(kind="cuda", name="H100", arch=("sm_90",), cores=132)
    problem = TEMPLATE.problem(workload, gpu)
    assert problem is not None and problem.field == "target"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"dtype": "float16"}, "workload.dtype"),
        ({"a_layout": "col_major"}, "workload.a_layout"),
        ({"b_layout": "col_major"}, "workload.b_layout"),
        ({"epilogue": "bias_gelu"}, "workload.epilogue"),
        ({"allow_tf32": True}, "workload.allow_tf32"),
    ],
)
def test_what_blis_cannot_run_is_named_by_field(change: dict[str, object], field: str) -> None:
    workload = Workload.from_dict({**Workload(m=8, n=8, k=8).to_dict(), **change})
    problem = TEMPLATE.problem(workload, HOST)
    assert problem is not None and problem.field == field and "blis.gemm" in problem.reason


def test_registry_finds_blis_and_names_the_known_ones() -> None:
    from importlib.metadata import entry_points

    # The package offers its templates through the same entry points a plugin uses.
    assert {"blis.gemm", "numpy.matmul"} <= {
        e.name for e in entry_points(group="tunehub.templates")
    }
    assert isinstance(get_template("blis.gemm"), BlisGemmTemplate)
    assert "blis.gemm" in template_names()
    with pytest.raises(UnknownTemplate) as info:
        get_template("no.such")
    assert isinstance(info.value, KeyError)
    assert "blis.gemm" in str(info.value) and "no.such" in str(info.value)
