"""GPU check of the Triton GEMM kernels: correctness matrix, cross-process precompile, timings.

Run on a CUDA machine from the repository root::

    PYTHONPATH=. python3 benchmarks/triton_kernel_check.py --out "$OUT"

Phases (each writes its part of ``triton_kernel_check.json`` as soon as it ends, so a run cut
short keeps what it did):

1. ``precompile``: every kernel the later phases launch is compiled by a pool of CPU processes
   that never touch the GPU (``CUDA_VISIBLE_DEVICES=""``), into one ``TRITON_CACHE_DIR``.
2. ``correctness``: every variant x dtype (tf32 and ieee float32 apart) x epilogue x layout on
   a shape with partial tiles, pointer variants also on odd shapes, plus edge shapes and
   split-K; fresh random operands, NaN-poisoned output, float64 reference, per-dtype tolerance
   on ||C - ref|| / ||ref||. Launches in this process count Triton cache hits and misses: a
   miss means precompile did not produce what the launch asked for.
3. ``cross_process``: one config first-launched in a fresh process with an empty cache, and in
   a fresh process after a GPU-less process precompiled it into the cache it shares.
4. ``timing``: ``triton.testing.do_bench`` medians (L2 flushed before each repeat) of a config
   sweep per variant against ``torch.matmul`` (cuBLAS), float16, B column-major (nn.Linear).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import math
import multiprocessing as mp
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) per variant for the timing sweep; the
# last few suit small M.
TILED = [
    (128, 256, 64, 8, 3),
    (256, 128, 64, 8, 3),
    (128, 128, 64, 4, 4),
    (128, 128, 64, 8, 4),
    (128, 128, 128, 8, 3),
    (64, 128, 64, 4, 4),
    (128, 64, 64, 4, 4),
    (64, 64, 64, 4, 5),
    (64, 64, 128, 4, 4),
    (32, 64, 128, 4, 4),
    (16, 64, 128, 4, 5),
    (16, 128, 128, 4, 4),
]
PERSISTENT = [
    (128, 256, 64, 8, 3),
    (128, 128, 64, 4, 4),
    (128, 128, 64, 8, 4),
    (64, 128, 64, 4, 4),
    (128, 64, 64, 4, 4),
    (64, 64, 128, 4, 4),
    (16, 64, 128, 4, 5),
]
TMA = [
    (128, 256, 64, 8, 3),
    (256, 128, 64, 8, 3),
    (128, 256, 64, 8, 4),
    (128, 128, 64, 4, 4),
    (128, 128, 64, 8, 4),
    (64, 128, 64, 4, 4),
    (128, 64, 64, 4, 5),
    (64, 64, 128, 4, 4),
]
WS = [
    (128, 256, 64, 4, 3),
    (128, 256, 64, 4, 4),
    (256, 128, 64, 4, 3),
    (128, 128, 64, 4, 4),
    (128, 128, 64, 4, 5),
    (64, 128, 64, 4, 4),
    (128, 64, 64, 4, 5),
    (64, 64, 128, 4, 4),
]
SPLIT_K = [(64, 64, 128, 4, 4, 4), (64, 64, 128, 4, 4, 8), (64, 64, 128, 4, 4, 16),
           (128, 128, 64, 4, 4, 4), (128, 128, 64, 8, 4, 8), (32, 64, 128, 4, 4, 4),
           (16, 64, 128, 4, 4, 8), (64, 128, 128, 4, 3, 32)]  # fmt: skip

TIMING_SHAPES = [
    (4096, 4096, 4096),
    (16, 4096, 4096),
    (64, 14336, 4096),
    (1000, 3000, 777),
    (127, 5000, 2048),
    (256, 256, 65536),
    (8192, 8192, 8192),
]


def cfg(
    variant: str,
    bm: int,
    bn: int,
    bk: int,
    warps: int,
    stages: int,
    split_k: int = 1,
    group_m: int = 8,
    **extra: Any,
) -> dict[str, Any]:
    return {
        "variant": variant,
        "BLOCK_M": bm,
        "BLOCK_N": bn,
        "BLOCK_K": bk,
        "GROUP_M": group_m,
        "num_warps": warps,
        "num_stages": stages,
        "SPLIT_K": split_k,
        **extra,
    }


def label(c: dict[str, Any]) -> str:
    text = (
        f"{c['variant']} {c['BLOCK_M']}x{c['BLOCK_N']}x{c['BLOCK_K']} g{c['GROUP_M']} "
        f"w{c['num_warps']} s{c['num_stages']}"
    )
    if c["SPLIT_K"] > 1:
        text += f" k{c['SPLIT_K']}"
    if "FLATTEN" in c:
        text += f" f{int(c['FLATTEN'])}"
    if c.get("PAD_K"):
        text += " padK"
    return text


# --------------------------------------------------------------------------------------------
# Jobs: one GEMM problem + config
# --------------------------------------------------------------------------------------------


def job(
    phase: str,
    config: dict[str, Any],
    m: int,
    n: int,
    k: int,
    dtype: str = "float16",
    epilogue: str = "none",
    layouts: tuple[str, str] = ("row", "col"),
    tf32: bool = False,
) -> dict[str, Any]:
    return {
        "phase": phase,
        "config": config,
        "m": m,
        "n": n,
        "k": k,
        "dtype": dtype,
        "epilogue": epilogue,
        "layouts": list(layouts),
        "tf32": tf32,
    }


def correctness_jobs(tg: Any) -> list[dict[str, Any]]:
    jobs = []
    layout_pairs = [("row", "row"), ("row", "col"), ("col", "row"), ("col", "col")]
    dtypes = [("float16", False), ("bfloat16", False), ("float32", False), ("float32", True),
              ("float8_e4m3fn", False)]  # fmt: skip
    configs = {
        "tiled": cfg("tiled", 64, 64, 32, 4, 3, group_m=4),
        "persistent": cfg("persistent", 64, 64, 32, 4, 3, group_m=4),
        "tma": cfg("tma", 64, 64, 32, 4, 3, group_m=4),
        "ws": cfg("ws", 128, 64, 32, 4, 3, group_m=4),
        # 7 K tiles of 32 over 3 splits: 3, 3 and a ragged 1.
        "splitk": cfg("splitk", 64, 64, 32, 4, 3, split_k=3, group_m=4),
        "splitk_atomic": cfg("splitk_atomic", 64, 64, 32, 4, 3, split_k=3, group_m=4),
    }
    # Every variant x dtype x epilogue x layout on a shape that suits TMA (16-byte leading
    # dimensions for every dtype) yet has partial tiles in M, N and K.
    # Composite tiles (192 rows: a 128- and a 64-row block) in 'tiled' and 'tma'.
    matrix = [
        *configs.items(),
        ("tiled", cfg("tiled", 192, 64, 32, 4, 3, group_m=4)),
        ("tma", cfg("tma", 192, 64, 32, 4, 3, group_m=4)),
        ("tma", cfg("tma", 64, 80, 32, 4, 3, group_m=4)),
        ("tma", cfg("tma", 64, 144, 32, 4, 3, group_m=4)),
    ]
    for variant, c in matrix:
        for (dtype, tf32), layouts, epilogue in _product(dtypes, layout_pairs, tg.EPILOGUES):
            if tg.workload_problem(variant, 272, 336, 208, dtype, *layouts):
                continue
            jobs.append(job("matrix", c, 272, 336, 208, dtype, epilogue, layouts, tf32))
    # PAD_K: K = 211 leaves every dtype's rows along K unaligned; the padding launch copies A
    # and B (a row-major or a column-major copy, zeros past K) before the GEMM.
    padded = [
        ("tma", cfg("tma", 64, 64, 32, 4, 3, group_m=4, PAD_K=True)),
        ("tiled", cfg("tiled", 64, 64, 32, 4, 3, group_m=4, PAD_K=True)),
    ]
    for i, ((dtype, tf32), layouts, epilogue) in enumerate(
        _product(dtypes, layout_pairs, tg.EPILOGUES)
    ):
        for variant, c in padded:
            if variant == "tiled" and i % 4:
                continue  # the pointer kernel on a quarter of them: the copy is the same
            k = tg.padded_k(211, dtype)
            if not tg.workload_problem(variant, 272, 336, k, dtype, *layouts):
                jobs.append(job("padded", c, 272, 336, 211, dtype, epilogue, layouts, tf32))
    # Odd sizes for the pointer variants (no % 16 specialisation, ragged K): every dtype x
    # layout, epilogues rotated.
    for i, ((dtype, tf32), layouts) in enumerate(_product(dtypes, layout_pairs)):
        for variant in ("tiled", "persistent", "splitk", "splitk_atomic"):
            epilogue = tg.EPILOGUES[i % 4]
            jobs.append(job("odd", configs[variant], 257, 333, 211, dtype, epilogue, layouts, tf32))
    # Edge shapes and bigger tiles.
    edge = [
        (cfg("tiled", 16, 64, 64, 4, 4), 1, 256, 512),
        (cfg("persistent", 16, 64, 64, 4, 4), 1, 256, 512),
        (cfg("tma", 64, 128, 64, 4, 3), 1, 256, 512),
        (cfg("ws", 64, 128, 64, 4, 3), 1, 256, 512),
        (cfg("tiled", 64, 64, 64, 4, 3), 96, 80, 16),
        (cfg("tma", 64, 64, 64, 4, 3), 96, 80, 16),
        (cfg("tiled", 128, 256, 64, 8, 3), 1000, 3000, 777),
        (cfg("persistent", 128, 256, 64, 8, 3), 1000, 3000, 777),
        (cfg("tma", 128, 256, 64, 8, 3), 1000, 3000, 776),
        (cfg("ws", 128, 256, 64, 4, 3), 1000, 3000, 776),
        (cfg("tiled", 64, 64, 128, 4, 4, split_k=8), 256, 256, 8192),
        (cfg("tiled", 32, 64, 128, 4, 4, split_k=5), 100, 300, 1000),
        (cfg("tiled", 64, 64, 64, 4, 3, split_k=7), 64, 64, 200),
        # One-kernel split-K: the benchmark's tile, uneven and empty splits, many tiles (and
        # counters) at once, an 8-warp tile.
        (cfg("splitk", 64, 64, 128, 4, 5, split_k=8), 256, 256, 8192),
        (cfg("splitk", 32, 64, 128, 4, 4, split_k=5), 100, 300, 1000),
        (cfg("splitk", 64, 64, 64, 4, 3, split_k=7), 64, 64, 200),
        (cfg("splitk", 64, 128, 64, 4, 4, split_k=2), 1000, 3000, 777),
        (cfg("splitk", 128, 128, 64, 8, 4, split_k=16), 128, 128, 32768),
        # Split-K by atomics: the seeded tiles, uneven and empty splits, 128-row tiles (whose
        # loads and stores map threads differently), an 8-warp tile, many tiles.
        (cfg("splitk_atomic", 64, 64, 128, 4, 6, split_k=8), 256, 256, 65536),
        (cfg("splitk_atomic", 64, 128, 128, 4, 4, split_k=4), 512, 512, 16384),
        (cfg("splitk_atomic", 32, 64, 128, 4, 4, split_k=5), 100, 300, 1000),
        (cfg("splitk_atomic", 64, 64, 64, 4, 3, split_k=7), 64, 64, 200),
        (cfg("splitk_atomic", 64, 128, 64, 4, 4, split_k=2), 1000, 3000, 777),
        (cfg("splitk_atomic", 128, 128, 128, 8, 3, split_k=32), 256, 256, 65536),
        (cfg("splitk_atomic", 128, 64, 128, 4, 4, split_k=16), 128, 128, 32768),
        (cfg("persistent", 128, 128, 64, 4, 4, FLATTEN=True), 300, 500, 400),
        (cfg("tma", 128, 128, 64, 8, 4, FLATTEN=False), 304, 496, 400),
        # Composite tiles: the seeded 192x128 on the shapes it is for, rows that divide (the
        # contiguity hints) and odd, ragged ones.
        (cfg("tiled", 192, 128, 64, 4, 4), 3000, 1000, 4000),
        (cfg("tiled", 192, 128, 64, 4, 4), 1536, 1536, 1536),
        (cfg("tiled", 192, 128, 64, 4, 4), 384, 256, 512),
        (cfg("tiled", 192, 64, 32, 4, 3), 257, 333, 211),
        (cfg("tiled", 192, 128, 64, 8, 4), 200, 100, 80),
        (cfg("tma", 192, 128, 64, 4, 4), 3000, 1000, 4000),
        (cfg("tma", 192, 128, 64, 8, 4, FLATTEN=True), 1536, 1536, 1536),
        (cfg("tma", 192, 128, 64, 8, 4, FLATTEN=False), 200, 104, 80),
        (cfg("tma", 192, 256, 64, 8, 3), 1000, 3000, 776),
        (cfg("tma", 64, 80, 128, 4, 6), 127, 5000, 2048),
        (cfg("tma", 64, 80, 128, 8, 4, FLATTEN=True), 1000, 3000, 776),
        (cfg("tma", 128, 80, 64, 8, 4, FLATTEN=False), 200, 104, 80),
        # Composite columns 144 = 128 + 16 (1536^3's one wave of tiles) and 192 = 128 + 64.
        (cfg("tma", 128, 144, 64, 4, 4), 1536, 1536, 1536),
        (cfg("tma", 128, 144, 64, 8, 4, FLATTEN=True), 200, 300, 80),
        (cfg("tma", 64, 144, 128, 4, 4), 127, 5000, 2048),
        (cfg("tma", 128, 192, 64, 4, 4), 1000, 3000, 776),
        (cfg("tma", 128, 192, 64, 8, 3, FLATTEN=True), 300, 200, 208),
        # PAD_K on the suites' odd shapes, and one row of A (a 2-row block, one row copied).
        (cfg("tma", 128, 256, 32, 8, 4, group_m=16, FLATTEN=True, PAD_K=True), 1000, 3000, 777),
        (cfg("tma", 128, 192, 64, 8, 3, FLATTEN=True, PAD_K=True), 1000, 3000, 777),
        (cfg("tma", 128, 128, 64, 4, 4, group_m=16, FLATTEN=True, PAD_K=True), 333, 4444, 1111),
        (cfg("tiled", 128, 128, 64, 8, 4, PAD_K=True), 1000, 3000, 777),
        (cfg("persistent", 64, 128, 64, 4, 4, FLATTEN=True, PAD_K=True), 1, 256, 777),
    ]
    for c, m, n, k in edge:
        for epilogue in ("none", "bias_gelu"):
            for dtype, layouts in (("float16", ("row", "col")), ("bfloat16", ("col", "row"))):
                # e.g. a column-major A of 127 rows: no TMA descriptor takes it.
                kk = tg.padded_k(k, dtype) if c.get("PAD_K") else k
                if not tg.workload_problem(c["variant"], m, n, kk, dtype, *layouts):
                    jobs.append(job("edge", c, m, n, k, dtype, epilogue, layouts))
    return jobs


def timing_jobs(tg: Any, sm_count: int) -> list[dict[str, Any]]:
    jobs = []
    for m, n, k in TIMING_SHAPES:
        configs = [cfg("tiled", *p) for p in TILED]
        configs += [cfg("persistent", *p) for p in PERSISTENT]
        configs += [cfg("persistent", *p, FLATTEN=True) for p in PERSISTENT[:3]]
        configs += [cfg("tma", *p) for p in TMA]
        configs += [cfg("tma", *p, FLATTEN=False) for p in TMA[:3]]
        configs += [cfg("ws", *p) for p in WS]
        if (m, n, k) == (8192, 8192, 8192):
            configs += [cfg("tiled", 128, 256, 64, 8, 3, group_m=1)]
            configs += [cfg("ws", 128, 256, 64, 4, 3, group_m=1)]
        few_tiles = math.ceil(m / 128) * math.ceil(n / 128) < 2 * sm_count
        if few_tiles:
            configs += [cfg("tiled", *p) for p in SPLIT_K]
        for c in configs:
            if tg.workload_problem(c["variant"], m, n, k, "float16", "row", "col"):
                continue
            jobs.append(job("timing", c, m, n, k))
    # Layout: the same GEMM with a row-major B (x @ W with W stored K x N).
    row_b = [cfg("tiled", *TILED[0]), cfg("tiled", *TILED[2]), cfg("persistent", *PERSISTENT[0])]
    row_b += [cfg("tma", *TMA[0]), cfg("tma", *TMA[3]), cfg("ws", *WS[0]), cfg("ws", *WS[3])]
    for c in row_b:
        jobs.append(job("timing", c, 4096, 4096, 4096, layouts=("row", "row")))
    return jobs


def followup_correctness_jobs(tg: Any) -> list[dict[str, Any]]:
    """Where 'ws' breaks with deep pipelines: stages 2-6 per tile, 'tma' alongside."""
    jobs = []
    for variant in ("ws", "tma"):
        for bm, bn, bk in ((128, 128, 64), (64, 128, 64), (128, 64, 64), (64, 64, 128)):
            for stages in (2, 3, 4, 5, 6):
                c = cfg(variant, bm, bn, bk, 4, stages)
                for m, n, k in ((512, 512, 512), (1024, 1024, 1024)):
                    jobs.append(job("stages", c, m, n, k, "float16", "bias", ("row", "col")))
                jobs.append(job("stages", c, 512, 512, 512, "bfloat16", "none", ("col", "row")))
    return jobs


def followup_timing_jobs(tg: Any) -> list[dict[str, Any]]:
    jobs = []

    def add(shape: tuple[int, int, int], configs: list[dict[str, Any]], **kw: Any) -> None:
        for c in configs:
            jobs.append(job("timing", c, *shape, **kw))

    split_k_long = [
        (64, 64, 128, 4, 4, 8), (64, 64, 128, 4, 5, 8), (64, 64, 64, 4, 5, 8),
        (64, 64, 128, 8, 4, 8), (128, 64, 64, 4, 4, 16), (64, 128, 64, 4, 4, 16),
        (128, 128, 64, 8, 4, 32), (128, 128, 64, 4, 4, 32), (128, 128, 128, 8, 3, 32),
        (64, 64, 128, 4, 4, 6), (128, 128, 64, 8, 4, 16), (64, 64, 256, 4, 3, 8),
    ]  # fmt: skip
    add((256, 256, 65536), [cfg("tiled", *p) for p in split_k_long])
    small_m = [
        (16, 64, 128, 4, 5), (16, 32, 128, 4, 5), (16, 64, 256, 4, 4), (16, 64, 128, 4, 5, 2),
        (16, 32, 128, 4, 5, 2), (16, 64, 128, 4, 6), (16, 128, 128, 4, 5, 2),
        (32, 64, 128, 4, 5, 2), (16, 64, 128, 2, 5), (16, 32, 256, 4, 4, 2),
    ]  # fmt: skip
    add((16, 4096, 4096), [cfg("tiled", *p) for p in small_m])
    ragged_m = [
        (64, 64, 64, 4, 5), (128, 64, 64, 4, 5), (128, 32, 64, 4, 5), (64, 64, 64, 4, 6),
        (128, 64, 64, 4, 4, 2), (128, 128, 64, 8, 4, 2), (64, 32, 128, 4, 5),
    ]  # fmt: skip
    others = [
        cfg("persistent", 64, 64, 64, 4, 5),
        cfg("tma", 128, 64, 64, 4, 5),
        cfg("tma", 64, 64, 64, 4, 5),
        cfg("tma", 128, 32, 64, 4, 5),
    ]
    add((127, 5000, 2048), [cfg("tiled", *p) for p in ragged_m] + others)
    best = [
        cfg("persistent", 128, 256, 64, 8, 3, FLATTEN=True),
        cfg("tma", 128, 256, 64, 8, 3),
        cfg("tma", 128, 256, 64, 8, 4, FLATTEN=False),
        cfg("ws", 256, 128, 64, 4, 3),
        cfg("tiled", 256, 128, 64, 8, 3),
        cfg("tma", 128, 256, 64, 8, 3, group_m=16),
        cfg("tma", 128, 256, 64, 8, 3, group_m=4),
        cfg("tma", 256, 128, 64, 8, 4, FLATTEN=False),
    ]
    for round_ in range(3):
        for shape in ((4096, 4096, 4096), (8192, 8192, 8192)):
            for c in best:
                jobs.append({**job("timing", c, *shape), "round": round_})
    fp8 = [
        cfg("tma", 128, 256, 128, 8, 3), cfg("tma", 128, 256, 64, 8, 4),
        cfg("ws", 128, 256, 128, 4, 3), cfg("ws", 128, 256, 64, 4, 4),
        cfg("tiled", 128, 256, 128, 8, 3), cfg("persistent", 128, 256, 128, 8, 3, FLATTEN=True),
        cfg("tma", 128, 128, 128, 4, 4),
    ]  # fmt: skip
    add((4096, 4096, 4096), fp8, dtype="float8_e4m3fn")
    tf32 = [
        cfg("tma", 128, 256, 32, 8, 3, FLATTEN=False), cfg("tma", 128, 128, 32, 4, 4),
        cfg("tiled", 128, 256, 32, 8, 3), cfg("persistent", 128, 256, 32, 8, 3),
        cfg("ws", 128, 256, 32, 4, 2), cfg("ws", 128, 128, 32, 4, 4),
    ]  # fmt: skip
    add((4096, 4096, 4096), tf32, dtype="float32", tf32=True)
    bf16 = [
        cfg("tma", 128, 256, 64, 8, 3),
        cfg("persistent", 128, 256, 64, 8, 3, FLATTEN=True),
        cfg("ws", 256, 128, 64, 4, 3),
    ]
    add((4096, 4096, 4096), bf16, dtype="bfloat16")
    return jobs


def _product(*items: Iterable[Any]) -> list[tuple[Any, ...]]:
    import itertools

    return list(itertools.product(*items))


# --------------------------------------------------------------------------------------------
# Phase 1: precompile in GPU-less processes
# --------------------------------------------------------------------------------------------


def _precompile_one(spec: dict[str, Any], capability: int, num_sms: int) -> dict[str, Any]:
    from tunehub.kernels import triton_gemm_kernels as tg

    start = time.perf_counter()
    try:
        kernels = tg.precompile(
            config=spec["config"],
            dtype=spec["dtype"],
            epilogue=spec["epilogue"],
            allow_tf32=spec["tf32"],
            m=spec["m"],
            n=spec["n"],
            k=spec["k"],
            a_layout=spec["layouts"][0],
            b_layout=spec["layouts"][1],
            capability=capability,
            num_sms=num_sms,
        )
    except Exception as exc:  # a config's failure is data here
        return {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[-400:]}"}
    return {
        "ok": True,
        "secs": time.perf_counter() - start,
        "hits": [p.cache_hit for p in kernels],
        "shared": [p.shared_bytes for p in kernels],
        "launcher": [p.launcher_cached for p in kernels],
        "registers": [p.registers for p in kernels],
        "stack": [p.stack_bytes for p in kernels],
    }


def _pool_init() -> None:
    os.environ["CUDA_VISIBLE_DEVICES"] = ""


def precompile_all(
    specs: list[dict[str, Any]], capability: int, num_sms: int, workers: int
) -> tuple[list[dict[str, Any]], float]:
    start = time.perf_counter()
    results: list[dict[str, Any] | None] = [None] * len(specs)
    pending = list(range(len(specs)))
    for _attempt in range(2):
        # A compiler crash (an assertion abort) breaks the pool: re-run what was left once.
        broken: list[int] = []
        ctx = mp.get_context("spawn")
        with cf.ProcessPoolExecutor(workers, mp_context=ctx, initializer=_pool_init) as pool:
            futures = {
                pool.submit(_precompile_one, specs[i], capability, num_sms): i for i in pending
            }
            for future in cf.as_completed(futures):
                i = futures[future]
                try:
                    results[i] = future.result()
                except cf.process.BrokenProcessPool:
                    broken.append(i)
        pending = broken
        if not pending:
            break
    for i in pending:
        results[i] = {"ok": False, "error": "the compiling process died (twice)"}
    return [r or {"ok": False, "error": "lost"} for r in results], time.perf_counter() - start


# --------------------------------------------------------------------------------------------
# GPU helpers
# --------------------------------------------------------------------------------------------


class CacheCounter:
    """Counts Triton compile() calls in this process: hits loaded a precompiled binary."""

    def __init__(self, triton: Any) -> None:
        self.hits = 0
        self.misses: list[str] = []
        triton.knobs.compilation.listener = self

    def __call__(self, *, src: Any, cache_hit: bool, **_: Any) -> None:
        if cache_hit:
            self.hits += 1
        else:
            self.misses.append(getattr(src, "name", "?"))


def make_operands(torch: Any, tg: Any, spec: dict[str, Any], gen: Any) -> tuple[Any, ...]:
    m, n, k = spec["m"], spec["n"], spec["k"]
    dtype = getattr(torch, spec["dtype"])
    out_dtype = getattr(torch, tg.OUT_DTYPE[spec["dtype"]])

    def operand(rows: int, cols: int, layout: str) -> Any:
        shape = (rows, cols) if layout == "row" else (cols, rows)
        x = torch.randn(shape, device="cuda", generator=gen).to(dtype)
        return x if layout == "row" else x.t()

    a = operand(m, k, spec["layouts"][0])
    b = operand(k, n, spec["layouts"][1])
    bias = None
    if spec["epilogue"] != "none":
        bias = torch.randn(n, device="cuda", generator=gen).to(out_dtype)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=out_dtype)
    return a, b, bias, out


def kernel_stats(bound: Any) -> list[dict[str, Any]]:
    stats = []
    for launch in bound.launches:
        kernel = launch.kernel.warmup(*launch.args, grid=launch.grid, **launch.kwargs)
        if getattr(kernel, "n_regs", None) is not None:
            stats.append(
                {
                    "name": kernel.name,
                    "regs": int(kernel.n_regs),
                    "spills": int(kernel.n_spills),
                    "shared": int(kernel.metadata.shared),
                }
            )
    return stats


def gpu_rel_err(torch: Any, out: Any, ref: Any) -> float:
    got = out.float()
    if not bool(torch.isfinite(got).all()):
        return math.inf
    return float(torch.linalg.vector_norm(got - ref) / torch.linalg.vector_norm(ref))


# --------------------------------------------------------------------------------------------
# Phase 2: correctness
# --------------------------------------------------------------------------------------------


def run_correctness(
    torch: Any,
    tg: Any,
    specs: list[dict[str, Any]],
    built: list[dict[str, Any]],
    deadline: float,
    case_secs: float = 0.0,
) -> list[dict[str, Any]]:
    import faulthandler

    gen = torch.Generator(device="cuda").manual_seed(1234)
    rows = []
    for spec, build in zip(specs, built, strict=True):
        if case_secs:
            # A kernel that never finishes leaves nothing else to learn from this process:
            # name the case and show where it waits, then exit.
            print("case", label(spec["config"]), spec["m"], spec["n"], spec["k"], spec["dtype"],
                  spec["epilogue"], spec["layouts"], flush=True)  # fmt: skip
            faulthandler.dump_traceback_later(case_secs, exit=True)
        row: dict[str, Any] = {
            "phase": spec["phase"],
            "variant": spec["config"]["variant"],
            "config": label(spec["config"]),
            "shape": [spec["m"], spec["n"], spec["k"]],
            "dtype": spec["dtype"] + ("+tf32" if spec["tf32"] else ""),
            "epilogue": spec["epilogue"],
            "layouts": "".join(x[0] for x in spec["layouts"]),
        }
        if time.monotonic() > deadline:
            row["status"] = "skipped: time budget"
            rows.append(row)
            continue
        if not build["ok"]:
            row.update(status="build_error", error=build["error"])
            rows.append(row)
            continue
        try:
            a, b, bias, out = make_operands(torch, tg, spec, gen)
            bound = tg.bind(
                a, b, bias, out, epilogue=spec["epilogue"], allow_tf32=spec["tf32"],
                config=spec["config"],
            )  # fmt: skip
            bound()
            torch.cuda.synchronize()
            err = tg.relative_error(out, tg.reference(a, b, bias, spec["epilogue"]))
            tol = tg.tolerance(spec["dtype"], spec["tf32"])
            row.update(
                status="ok" if err <= tol else "wrong_answer",
                err=float(f"{err:.3g}"),
                tol=tol,
                kernels=kernel_stats(bound),
            )
            if err > tol:
                row["nan_frac"] = float(torch.isnan(out.float()).float().mean())
            if bound.counts is not None:
                # The one-kernel split-Ks: their tile counters (and the atomic one's sum) must
                # be back at zero, as the next call's correctness depends on it; a second call
                # must be right again, and give the same bits where the sum has a fixed order.
                first = out.clone()
                out.fill_(float("nan"))
                bound()
                torch.cuda.synchronize()
                again = tg.relative_error(out, tg.reference(a, b, bias, spec["epilogue"]))
                atomic = spec["config"]["variant"] == "splitk_atomic"
                row.update(
                    repeatable=bool(torch.equal(out, first)),
                    counters_zero=not bool(bound.counts.any())
                    and not (atomic and bool(bound.workspace.any())),
                    second_err=float(f"{again:.3g}"),
                )
                exact = row["repeatable"] or atomic
                if not (exact and row["counters_zero"] and again <= tol):
                    row["status"] = "wrong_answer"
        except Exception as exc:
            row.update(status="runtime_error", error=f"{type(exc).__name__}: {str(exc)[-400:]}")
        rows.append(row)
    faulthandler.cancel_dump_traceback_later()
    return rows


# --------------------------------------------------------------------------------------------
# Phase 3: first launch in a fresh process, with and without precompile
# --------------------------------------------------------------------------------------------

CHILD = r"""
import json, os, sys, time
t0 = time.perf_counter()
specs, mode, capability, num_sms = json.loads(sys.argv[1])
import torch, triton
from tunehub.kernels import triton_gemm_kernels as tg
imported = time.perf_counter() - t0
events = []
triton.knobs.compilation.listener = lambda *, src, cache_hit, **_: events.append(
    [getattr(src, "name", "?"), cache_hit])
def kwargs(spec):
    return dict(config=spec["config"], dtype=spec["dtype"], epilogue=spec["epilogue"],
                allow_tf32=spec["tf32"], m=spec["m"], n=spec["n"], k=spec["k"],
                a_layout=spec["layouts"][0], b_layout=spec["layouts"][1])
result = {"per_spec": []}
if mode == "build":
    for spec in specs:
        start = time.perf_counter()
        kernels = tg.precompile(capability=capability, num_sms=num_sms, **kwargs(spec))
        result["per_spec"].append({"precompile_secs": time.perf_counter() - start,
            "kernels": [[p.name, p.cache_hit, p.shared_bytes, p.launcher_cached]
                        for p in kernels]})
    result["cuda_initialized"] = torch.cuda.is_initialized()
else:
    # Triton's driver builds (or loads from the cache) its own helper module once per process:
    # time it apart, it is no kernel's compile.
    start = time.perf_counter()
    triton.runtime.driver.active.utils
    result["driver_init_secs"] = time.perf_counter() - start
    for spec in specs:
        dtype = getattr(torch, spec["dtype"])
        out_dtype = getattr(torch, tg.OUT_DTYPE[spec["dtype"]])
        m, n, k = spec["m"], spec["n"], spec["k"]
        a = torch.randn(m, k, device="cuda").to(dtype)
        b = torch.randn(n, k, device="cuda").to(dtype).t()
        bias = torch.randn(n, device="cuda").to(out_dtype) if spec["epilogue"] != "none" else None
        out = torch.empty(m, n, device="cuda", dtype=out_dtype)
        torch.cuda.synchronize()
        times = []
        for _ in range(3):
            start = time.perf_counter()
            tg.gemm(a, b, bias, out, epilogue=spec["epilogue"], allow_tf32=spec["tf32"],
                    config=spec["config"])
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        result["per_spec"].append({"launch_secs": times})
result.update(import_secs=imported, compiles=events)
print("RESULT " + json.dumps(result))
"""


def child(
    specs: list[dict[str, Any]], mode: str, cache: Path, capability: int, num_sms: int
) -> Any:
    env = dict(os.environ, TRITON_CACHE_DIR=str(cache), PYTHONPATH=str(ROOT))
    if mode == "build":
        env["CUDA_VISIBLE_DEVICES"] = ""
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps([specs, mode, capability, num_sms])],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"error": proc.stderr[-1500:], "returncode": proc.returncode}


def run_cross_process(
    capability: int, num_sms: int, scratch: Path, together: bool
) -> list[dict[str, Any]]:
    """Cold: first launches in a fresh process with an empty cache. Warm: the same in a fresh
    process after a GPU-less one precompiled them. ``together``: both specs in one process
    (the second first launch shows the per-kernel cost once the process is warm)."""
    specs = [
        job("xproc", cfg("ws", 128, 256, 64, 4, 3), 4096, 4096, 4096, epilogue="bias_gelu"),
        job("xproc", cfg("tiled", 64, 64, 128, 4, 4, split_k=8), 256, 256, 65536, epilogue="bias"),
    ]
    batches = [specs] if together else [[spec] for spec in specs]
    rows = []
    for i, batch in enumerate(batches):
        cold = child(batch, "launch", scratch / f"cold{i}", capability, num_sms)
        build = child(batch, "build", scratch / f"warm{i}", capability, num_sms)
        warm = child(batch, "launch", scratch / f"warm{i}", capability, num_sms)
        rows.append(
            {"configs": [label(s["config"]) for s in batch],
             "shapes": [[s["m"], s["n"], s["k"]] for s in batch],
             "cold": cold, "build": build, "warm": warm}
        )  # fmt: skip
    return rows


# --------------------------------------------------------------------------------------------
# Phase 4: timings
# --------------------------------------------------------------------------------------------


def run_timing(
    torch: Any,
    tg: Any,
    specs: list[dict[str, Any]],
    built: list[dict[str, Any]],
    deadline: float,
) -> list[dict[str, Any]]:
    from triton.testing import do_bench

    gen = torch.Generator(device="cuda").manual_seed(99)
    rows: list[dict[str, Any]] = []
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, spec in enumerate(specs):
        key = (spec["m"], spec["n"], spec["k"], tuple(spec["layouts"]), spec["dtype"],
               spec["tf32"], spec.get("round", 0))  # fmt: skip
        groups.setdefault(key, []).append(i)

    def bench(fn: Callable[[], Any]) -> float:
        return float(do_bench(fn, warmup=10, rep=50, return_mode="median"))

    for (m, n, k, layouts, dtype, tf32, round_), indices in groups.items():
        base = {"shape": [m, n, k], "layouts": "".join(x[0] for x in layouts),
                "dtype": dtype + ("+tf32" if tf32 else ""), "round": round_}  # fmt: skip
        if time.monotonic() > deadline:
            rows.append({**base, "status": "skipped: time budget"})
            continue
        flops = 2.0 * m * n * k
        spec0 = job("timing", {}, m, n, k, dtype=dtype, layouts=layouts, tf32=tf32)
        a, b, _, out = make_operands(torch, tg, spec0, gen)
        torch.backends.cuda.matmul.allow_tf32 = False
        ref = a.float() @ b.float()
        torch.backends.cuda.matmul.allow_tf32 = tf32
        try:
            ms = bench(vendor_matmul(torch, a, b, out))
            rows.append({**base, "variant": "cublas", "ms": ms, "tflops": flops / ms / 1e9})
        except Exception as exc:
            rows.append({**base, "variant": "cublas", "status": "error", "error": str(exc)[-300:]})
        for i in indices:
            if time.monotonic() > deadline:
                break
            spec, build = specs[i], built[i]
            row = {**base, "variant": spec["config"]["variant"], "config": label(spec["config"])}
            if not build["ok"]:
                rows.append({**row, "status": "build_error", "error": build["error"][-300:]})
                continue
            try:
                out.fill_(float("nan"))
                bound = tg.bind(a, b, None, out, allow_tf32=tf32, config=spec["config"])
                bound()
                torch.cuda.synchronize()
                err = gpu_rel_err(torch, out, ref)
                if not err <= tg.tolerance(dtype, tf32):
                    nan = float(torch.isnan(out.float()).float().mean())
                    rows.append({**row, "status": "wrong_answer", "err": err, "nan_frac": nan})
                    continue
                ms = bench(bound)
                stats = kernel_stats(bound)
                rows.append(
                    {**row, "status": "ok", "ms": ms, "tflops": flops / ms / 1e9,
                     "err": float(f"{err:.3g}"), "kernels": stats}
                )  # fmt: skip
            except Exception as exc:
                rows.append({**row, "status": "runtime_error", "error": str(exc)[-300:]})
        del a, b, out, ref
        torch.cuda.empty_cache()
    torch.backends.cuda.matmul.allow_tf32 = False
    return rows


def vendor_matmul(torch: Any, a: Any, b: Any, out: Any) -> Callable[[], Any]:
    """The vendor library's GEMM on the same operands: cuBLAS(Lt) through torch."""
    if a.dtype == torch.float8_e4m3fn:
        one = torch.ones((), device="cuda")
        return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=out.dtype)
    return lambda: torch.matmul(a, b, out=out)


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def environment(torch: Any, triton: Any) -> dict[str, Any]:
    props = torch.cuda.get_device_properties(0)
    env: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0),
        "capability": list(torch.cuda.get_device_capability(0)),
        "sm_count": props.multi_processor_count,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
    }
    try:
        env["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,clocks.max.sm,"
             "clocks.mem,power.limit,temperature.gpu", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=False,
        ).stdout.strip()  # fmt: skip
    except OSError as exc:
        env["nvidia_smi"] = str(exc)
    return env


def summary(rows: list[dict[str, Any]]) -> str:
    lines = ["shape layouts | cuBLAS TFLOP/s | best per variant: TFLOP/s (x cuBLAS) config"]
    by_shape: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row in rows:
        if "ms" in row:
            key = (tuple(row["shape"]), row["layouts"], row.get("dtype"), row.get("round", 0))
            by_shape.setdefault(key, []).append(row)
    for (shape, layouts, dtype, round_), group in by_shape.items():
        base = next((r for r in group if r["variant"] == "cublas"), None)
        base_tf = base["tflops"] if base else float("nan")
        parts = []
        for variant in ("tiled", "persistent", "tma", "ws"):
            cands = [r for r in group if r["variant"] == variant]
            if cands:
                best = max(cands, key=lambda r: r["tflops"])
                cfg_text = best["config"].split(" ", 1)[1]
                ratio = best["tflops"] / base_tf
                parts.append(f"{variant} {best['tflops']:.0f} ({ratio:.2f}) [{cfg_text}]")
        head = f"{'x'.join(map(str, shape))} {layouts} {dtype} r{round_}"
        lines.append(f"{head} | {base_tf:.0f} | " + "; ".join(parts))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")))
    parser.add_argument("--budget-secs", type=float, default=380.0)
    parser.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    parser.add_argument("--skip", nargs="*", default=[], help="phases to skip")
    parser.add_argument("--variants", nargs="*", default=[], help="only these variants")
    parser.add_argument(
        "--match",
        nargs="*",
        default=[],
        help="only configs whose label contains one of these (e.g. padK 'x144x')",
    )
    parser.add_argument(
        "--case-secs",
        type=float,
        default=0.0,
        help="dump the stack and exit when one correctness case takes longer (a hung kernel)",
    )
    parser.add_argument(
        "--suite",
        choices=["main", "followup"],
        default="main",
        help="main: the full matrix and sweep; followup: ws stages, split-K, repeats, fp8/tf32",
    )
    args = parser.parse_args()
    start = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="tunehub-triton-"))
    os.environ["TRITON_CACHE_DIR"] = str(scratch / "cache")
    os.environ.pop("TRITON_INTERPRET", None)
    sys.path.insert(0, str(ROOT))

    import torch
    import triton

    from tunehub.kernels import triton_gemm_kernels as tg

    report: dict[str, Any] = {"command": sys.argv, "environment": environment(torch, triton)}
    path = args.out / f"triton_kernel_check-{args.suite}.json"

    def save() -> None:
        path.write_text(json.dumps(report, indent=None, separators=(",", ":")))

    major, minor = torch.cuda.get_device_capability(0)
    capability = major * 10 + minor
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(report["environment"], flush=True)

    followup = args.suite == "followup"
    correct, timing = [], []
    if "correctness" not in args.skip:
        correct = followup_correctness_jobs(tg) if followup else correctness_jobs(tg)
    if "timing" not in args.skip:
        timing = followup_timing_jobs(tg) if followup else timing_jobs(tg, num_sms)
    if args.variants:
        correct = [s for s in correct if s["config"]["variant"] in args.variants]
        timing = [s for s in timing if s["config"]["variant"] in args.variants]
    if args.match:
        correct = [s for s in correct if any(w in label(s["config"]) for w in args.match)]
        timing = [s for s in timing if any(w in label(s["config"]) for w in args.match)]
    specs = correct + timing
    print(f"precompiling {len(specs)} problems on {args.workers} processes", flush=True)
    built, secs = precompile_all(specs, capability, num_sms, args.workers)
    report["precompile"] = {
        "built": [
            {"config": label(s["config"]), "dtype": s["dtype"], **b}
            for s, b in zip(specs, built, strict=True) if b["ok"]
        ] if followup else [],
        "problems": len(specs),
        "workers": args.workers,
        "wall_secs": secs,
        "compile_secs_sum": sum(b.get("secs", 0.0) for b in built),
        "failures": [
            {"config": label(s["config"]), "dtype": s["dtype"], "layouts": s["layouts"],
             "shape": [s["m"], s["n"], s["k"]], "error": b["error"]}
            for s, b in zip(specs, built, strict=True) if not b["ok"]
        ],
    }  # fmt: skip
    save()
    print(f"precompile: {secs:.0f} s, {len(report['precompile']['failures'])} failures", flush=True)

    counter = CacheCounter(triton)
    deadline = start + args.budget_secs
    if correct:
        rows = run_correctness(
            torch, tg, correct, built[: len(correct)], deadline - 150, args.case_secs
        )
        report["correctness"] = rows
        report["correctness_cache"] = {"hits": counter.hits, "misses": counter.misses[:50]}
        save()
        bad = [r for r in rows if r.get("status") != "ok"]
        print(f"correctness: {len(rows) - len(bad)}/{len(rows)} ok", flush=True)
        for row in bad[:40]:
            print("  ", {k: v for k, v in row.items() if k != "kernels"}, flush=True)
    if "xproc" not in args.skip:
        report["cross_process"] = run_cross_process(capability, num_sms, scratch, followup)
        save()
        for row in report["cross_process"]:
            print("xproc", json.dumps(row)[:1500], flush=True)
    if timing:
        hits_before = counter.hits
        rows = run_timing(torch, tg, timing, built[len(correct) :], deadline)
        report["timing"] = rows
        report["timing_cache"] = {"hits": counter.hits - hits_before, "misses": counter.misses[:50]}
        save()
        print(summary(rows), flush=True)
        for row in rows:
            if row.get("status") not in (None, "ok"):
                print("  ", {k: v for k, v in row.items() if k != "kernels"}, flush=True)
    report["wall_secs"] = time.monotonic() - start
    save()
    print(f"done in {report['wall_secs']:.0f} s; misses {len(counter.misses)}", flush=True)


if __name__ == "__main__":
    main()
