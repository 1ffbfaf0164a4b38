"""SearchSpace enumeration (with knob-scoped pruning) and the blis.gemm space and default."""

from __future__ import annotations

import itertools
import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tunehub.core import Config, Target, Workload, local_cpu_target
from tunehub.kernels.blis_codegen import ELEMENT_BYTES, ISA_VECTOR_BYTES
from tunehub.kernels.blis_gemm import (
    BlisGemmTemplate,
    available_isas,
    model_tile,
    params_for,
    vector_registers,
)
from tunehub.kernels.space import Knob, KnobConstraint, SearchSpace

TEMPLATE = BlisGemmTemplate()
MAX_POINTS = 50_000


# --- SearchSpace ------------------------------------------------------------------------------
def brute_force(space: SearchSpace) -> list[Config]:
    out = []
    for combo in itertools.product(*(k.values for k in space.knobs)):
        config = Config(dict(zip(space.names, combo, strict=True)))
        if all(check(config) for check in space.constraints):
            out.append(config)
    return out


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 4), min_size=1, max_size=4),
    seed=st.integers(0, 10_000),
)
def test_pruned_enumeration_equals_the_filtered_product(sizes: list[int], seed: int) -> None:
    rng = random.Random(seed)
    knobs = tuple(Knob(f"k{i}", tuple(range(size))) for i, size in enumerate(sizes))
    names = [k.name for k in knobs]
    constraints = []
    for _ in range(rng.randint(0, 3)):
        read = tuple(rng.sample(names, rng.randint(1, len(names))))
        limit = rng.randint(0, 2 * len(read))
        check = (lambda r, lim: lambda c: sum(int(c[n]) for n in r) <= lim)(read, limit)
        scoped = rng.random() < 0.7
        constraints.append(KnobConstraint(read, check) if scoped else check)
    space = SearchSpace(knobs=knobs, constraints=tuple(constraints))
    assert list(space.points) == brute_force(space)
    for point in space.points:
        assert space.is_valid(point)


def test_space_without_knobs_has_one_empty_point() -> None:
    assert list(SearchSpace(knobs=()).points) == [Config({})]


# --- blis.gemm --------------------------------------------------------------------------------
def cpu(
    name: str, arch: tuple[str, ...], cores: int, l1: int, l2: int, l3: int, machine: str
) -> Target:
    return Target(
        kind="cpu",
        name=name,
        arch=arch,
        cores=cores,
        l1d_bytes=l1,
        l2_bytes=l2,
        l3_bytes=l3,
        machine=machine,
    )


TARGETS = {
    "host": local_cpu_target(),
    "skylake-x": cpu("skx", ("avx2", "fma", "avx512f"), 8, 32 << 10, 1 << 20, 11 << 20, "x86_64"),
    "haswell": cpu("hsw", ("avx", "avx2", "fma"), 4, 32 << 10, 256 << 10, 8 << 20, "x86_64"),
    "old-x86": cpu("sse", ("sse4_2",), 1, 32 << 10, 256 << 10, 0, "x86_64"),
    "graviton": cpu("neoverse", ("neon", "asimd"), 64, 64 << 10, 1 << 20, 32 << 20, "aarch64"),
    "no-caches": cpu("vm", ("avx2", "fma"), 2, 0, 0, 0, "x86_64"),
    "huge": cpu("big", ("avx2", "fma", "avx512f"), 128, 48 << 10, 2 << 20, 256 << 20, "x86_64"),
}
WORKLOADS = [
    Workload(m=1, n=1, k=1),
    Workload(m=7, n=300, k=5, dtype="float64", epilogue="bias"),
    Workload(m=512, n=512, k=512),
    Workload(m=1024, n=1024, k=1024, dtype="float64"),
    Workload(m=4096, n=16384, k=8192, epilogue="bias_relu"),
    Workload(m=16384, n=16384, k=1024, dtype="float64"),
]


def check_point(config: Config, workload: Workload, target: Target) -> None:
    p = params_for(workload, config)
    assert TEMPLATE.config_problem(workload, target, config) is None
    assert p.isa in available_isas(target)
    vl = ISA_VECTOR_BYTES[p.isa] // ELEMENT_BYTES[workload.dtype]
    assert p.nr % vl == 0
    nv = p.nr // vl
    assert p.mr * nv + nv + 1 <= vector_registers(p.isa, target)  # C tile + operands in regs
    assert p.kc <= workload.k and p.mc <= workload.m and p.nc <= workload.n
    assert p.threads <= max(1, target.cores)
    assert p.threads > 1 or p.par == "ic"


@pytest.mark.parametrize("target_name", sorted(TARGETS))
def test_every_point_is_valid_and_spaces_stay_enumerable(target_name: str) -> None:
    target = TARGETS[target_name]
    for workload in WORKLOADS:
        start = time.perf_counter()
        space = TEMPLATE.space(workload, target)
        points = space.points
        assert time.perf_counter() - start < 5.0
        assert 1 <= len(points) <= MAX_POINTS, (workload.label, len(points))
        assert len(set(points)) == len(points)
        for config in random.Random(0).sample(list(points), min(300, len(points))):
            check_point(config, workload, target)
            assert space.is_valid(config)
        default = TEMPLATE.default_config(workload, target)
        assert space.is_valid(default), (workload.label, default)
        check_point(default, workload, target)
        for neighbour in space.neighbours(default):
            assert space.is_valid(neighbour)


def test_blocking_follows_the_cache_model_on_a_known_target() -> None:
    target = TARGETS["skylake-x"]
    workload = Workload(m=2048, n=2048, k=2048)
    space = TEMPLATE.space(workload, target)
    for config in space.points:
        p = params_for(workload, config)
        elem = ELEMENT_BYTES[workload.dtype]
        assert target.l1d_bytes / 4 <= p.kc * p.nr * elem <= 4 * target.l1d_bytes  # B micro-panel
        assert target.l2_bytes / 8 <= p.mc * p.kc * elem <= 2 * target.l2_bytes  # A block
        assert p.kc * p.nc * elem <= target.l3_bytes / 2  # B panel
    # a range around the model, not only its point
    kcs = {c["KC"] for c in space.points}
    mcs = {c["MC"] for c in space.points}
    assert len(kcs) >= 5 and len(mcs) >= 5
    assert {c["ISA"] for c in space.points} == {"avx512", "avx2"}
    assert {c["threads"] for c in space.points} == {1, 8}


def test_default_is_the_analytical_point() -> None:
    target = TARGETS["skylake-x"]
    workload = Workload(m=2048, n=2048, k=2048)
    default = TEMPLATE.default_config(workload, target)
    # AVX-512 fp32: 6 x 4 vectors loads (6 + 4) operands per 24 FMAs, the fewest of any tile
    # that fits 32 registers.
    assert (default["ISA"], default["MR"], default["NR"]) == ("avx512", 6, 64)
    assert model_tile("avx512", "float64", target) == (6, 32)
    assert model_tile("avx2", "float32", TARGETS["haswell"]) == (4, 24)
    # the 6 x KC x 4-byte A micro-panel fills a quarter of the 32 KiB L1 (341 -> 384)
    assert default["KC"] == 384
    # MC x KC x 4 bytes is half of the 1 MiB L2 (341 -> 384)
    assert default["MC"] == 384
    assert default["threads"] == 1 and default["UNROLL"] in (1, 2, 4)
    assert default["PACKB"] is True and default["PREFETCH"] == 0


def test_unpacked_b_is_offered_only_for_small_m_and_always_prefetched() -> None:
    target = TARGETS["skylake-x"]
    skinny = TEMPLATE.space(Workload(m=16, n=4096, k=4096), target).points
    assert {c["PACKB"] for c in skinny} == {True, False}
    assert all(int(c["PREFETCH"]) > 0 for c in skinny if not c["PACKB"])
    assert {c["PREFETCH"] for c in skinny if c["PACKB"]} == {0, 8}
    square = TEMPLATE.space(Workload(m=2048, n=2048, k=2048), target).points
    assert {c["PACKB"] for c in square} == {True}


def test_blocks_are_capped_to_small_workloads() -> None:
    target = TARGETS["host"]
    workload = Workload(m=20, n=9, k=3)
    space = TEMPLATE.space(workload, target)
    assert {c["KC"] for c in space.points} == {3}
    assert {c["MC"] for c in space.points} == {20}
    assert {c["NC"] for c in space.points} == {9}


def test_portable_kernel_where_there_is_no_avx2() -> None:
    for name in ("old-x86", "graviton"):
        target = TARGETS[name]
        space = TEMPLATE.space(Workload(m=64, n=64, k=64), target)
        assert {c["ISA"] for c in space.points} == {"generic"}
    # aarch64 has 32 NEON registers, so bigger tiles fit there than on SSE
    arm = {
        (int(c["MR"]), int(c["NR"]))
        for c in TEMPLATE.space(Workload(m=64, n=64, k=64), TARGETS["graviton"]).points
    }
    sse = {
        (int(c["MR"]), int(c["NR"]))
        for c in TEMPLATE.space(Workload(m=64, n=64, k=64), TARGETS["old-x86"]).points
    }
    assert max(m * n for m, n in arm) > max(m * n for m, n in sse)


def test_seed_configs_start_with_the_model_point_and_are_all_valid() -> None:
    template = BlisGemmTemplate()
    target = local_cpu_target()
    for workload in (Workload(m=127, n=5000, k=2048), Workload(m=1024, n=1024, k=1024)):
        seeds = template.seed_configs(workload, target)
        space = template.space(workload, target)
        assert seeds[0] == template.default_config(workload, target)
        assert all(space.is_valid(c) for c in seeds)
        assert len({c.key for c in seeds}) == len(seeds)
        assert {c["threads"] for c in seeds} == {1, target.cores}


def test_the_edge_seed_fits_an_odd_m_better_than_the_model_tile() -> None:
    # A named AVX-512 target, not the host: an AVX2-only host's model tile (4 rows) already
    # fits 127 rows best and seeds one tile (checked below).
    template = BlisGemmTemplate()
    workload = Workload(m=127, n=5000, k=2048)
    target = TARGETS["skylake-x"]
    seeds = template.seed_configs(workload, target)
    tiles = {(int(c["MR"]), int(c["NR"])) for c in seeds}
    assert len(tiles) == 2

    def padded_rows(mr: int) -> int:
        return -(-workload.m // mr) * mr

    model = template.default_config(workload, target)
    (edge,) = tiles - {(int(model["MR"]), int(model["NR"]))}
    assert padded_rows(edge[0]) < padded_rows(int(model["MR"]))

    avx2 = TARGETS["haswell"]
    avx2_model = template.default_config(workload, avx2)
    assert padded_rows(int(avx2_model["MR"])) == 128
    avx2_tiles = {(int(c["MR"]), int(c["NR"])) for c in template.seed_configs(workload, avx2)}
    assert avx2_tiles == {(int(avx2_model["MR"]), int(avx2_model["NR"]))}
