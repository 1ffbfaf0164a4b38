"""Benchmark: blis.gemm tuned by tunehub against OpenBLAS (through numpy), side by side.

For each case it tunes blis.gemm with a stated budget (the strategy measures the template's
seed configs first, the analytical model's point and its variants, then random configs),
then re-times the best config and numpy's BLAS alternately in the same sandbox worker, the
same way (warm caches, one thread pinned, repeats until a minimum time, medians), and prints
tunehub GFLOP/s, OpenBLAS GFLOP/s, their ratio, and the fraction of the machine's measured
peak. JSON goes to benchmarks/results/.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/cpu_gemm.py
    .venv/bin/python benchmarks/cpu_gemm.py --quick         # three small cases, smoke test
    .venv/bin/python benchmarks/cpu_gemm.py --trials 60 --case 127x5000x2048
    .venv/bin/python benchmarks/cpu_gemm.py --strategy random --history none

The strategy is the jobs' default (``transfer``) unless ``--strategy`` names another. Its
history is what a service that had tuned the replay datasets' workloads would hold: the
datasets under ``--history`` (default benchmarks/datasets) measured on this machine's target
family, minus the case's own workload (its exact measurements are never used); ``--history
none`` tunes with no history at all.

Compare with OpenBLAS at its best: some machines set OPENBLAS_CORETYPE (and OPENBLAS_L2_SIZE),
which pins an older kernel; clear them in the benchmark's own command as above. The kernel
OpenBLAS ran (threadpoolctl's ``architecture``) and those variables are recorded in the JSON,
and the script warns when they are set.

Peak: a C loop of independent FMAs (AVX-512, AVX2 or scalar, whichever the CPU has) gives the
FLOP/cycle x clock product directly; the clock is found separately from a chain of dependent
integer adds (one add per cycle) and printed, so flops/cycle = peak / clock is shown too.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from tunehub.core import (
    Budget,
    Config,
    MeasureRecord,
    MeasureRequest,
    MeasureStatus,
    Target,
    Workload,
    local_cpu_target,
)
from tunehub.core.job import DEFAULT_STRATEGY
from tunehub.db import MemoryScheduleStore
from tunehub.kernels.base import TimingPolicy
from tunehub.kernels.registry import get_template
from tunehub.tuner import HistoryView, Session, StaticHistory, StrategyContext, make_strategy
from tunehub.workers.local import LocalMeasurer
from tunehub.workers.replay import load_datasets

RESULTS = Path(__file__).resolve().parent / "results"
DATASETS = Path(__file__).resolve().parent / "datasets"
SHAPES = [
    (256, 256, 256),
    (512, 512, 512),
    (1024, 1024, 1024),
    (2048, 2048, 2048),
    (1000, 3000, 777),
    (16, 4096, 4096),
    (127, 5000, 2048),
]
FUSED_SHAPES = [(1024, 1024, 1024), (127, 5000, 2048)]
QUICK = [(256, 256, 256), (127, 500, 256), (64, 1000, 512)]

PEAK_C = r"""
#include <immintrin.h>
#include <stdint.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
                          return t.tv_sec + 1e-9 * t.tv_nsec; }
/* Cycles: a chain of dependent register-register adds retires one per cycle on every x86-64
   core. (Not add-immediate: recent Intel cores fold chains of those at rename; an Intel Xeon
   guest, family 6 model 207, read 11.9 GHz from one, against 3.05 from this chain.) */
double clock_hz(int64_t n) {
    int64_t x = 0, one = 1; double t = now();
    __asm__ volatile("" : "+r"(one));
    for (int64_t i = 0; i < n; ++i) __asm__ volatile("add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\t"
                                                      "add %1, %0" : "+r"(x) : "r"(one));
    return 4.0 * (double)n / (now() - t);
}
/* FP32 FMA throughput: 12 independent accumulators (named, so they live in registers) hide
   the FMA latency. */
#define CHAINS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#if defined(__AVX512F__)
typedef __m512 V;
#define LANES 16
#define FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define SET1(x) _mm512_set1_ps(x)
#define ADD(a, b) _mm512_add_ps(a, b)
#elif defined(__AVX2__) && defined(__FMA__)
typedef __m256 V;
#define LANES 8
#define FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define SET1(x) _mm256_set1_ps(x)
#define ADD(a, b) _mm256_add_ps(a, b)
#endif
double fma_flops(int64_t n) {
#ifdef LANES
#define DECL(j) V a##j = SET1((float)j);
#define STEP(j) a##j = FMA(a##j, b, c);
#define SUM(j) s = ADD(s, a##j);
    V b = SET1(0.999f), c = SET1(1e-6f), s = SET1(0.f);
    CHAINS(DECL)
    double t = now();
    for (int64_t i = 0; i < n; ++i) { CHAINS(STEP) }
    t = now() - t;
    CHAINS(SUM)
    __asm__ volatile("" :: "x"(s));
    return 2.0 * LANES * 12 * (double)n / t;
#else
    return 0.0;
#endif
}
"""


@dataclass
class Peak:
    clock_ghz: float
    fp32_gflops_per_core: float
    flops_per_cycle_fp32: float
    method: str


def measure_peak(workdir: Path) -> Peak:
    src = workdir / "peak.c"
    lib = workdir / "peak.so"
    src.write_text(PEAK_C)
    subprocess.run(
        ["cc", "-O3", "-march=native", "-fPIC", "-shared", str(src), "-o", str(lib)], check=True
    )
    dll = ctypes.CDLL(str(lib))
    dll.clock_hz.restype = dll.fma_flops.restype = ctypes.c_double
    dll.clock_hz.argtypes = dll.fma_flops.argtypes = [ctypes.c_int64]
    hz = statistics.median(dll.clock_hz(50_000_000) for _ in range(5))
    flops = statistics.median(dll.fma_flops(20_000_000) for _ in range(5))
    return Peak(
        clock_ghz=hz / 1e9,
        fp32_gflops_per_core=flops / 1e9,
        flops_per_cycle_fp32=flops / hz,
        method="clock: dependent register-register add chain (1/cycle); peak: 12 independent "
        "FMA chains of the widest vector ISA, fp32, one core; fp64 peak taken as half",
    )


@dataclass
class CaseResult:
    shape: str
    dtype: str
    epilogue: str
    threads: int
    tunehub_gflops: float
    openblas_gflops: float
    ratio: float
    peak_fraction: float
    tuned_trials: int
    tuning_secs: float
    config: dict[str, Any]
    tunehub_repeat_medians: list[float]
    openblas_repeat_medians: list[float]
    openblas_kernel: str


def restricted_space(template: Any, workload: Workload, target: Target, threads: int) -> Any:
    space = template.space(workload, target)
    return space.fix(threads=threads) if "threads" in space.names else space


class SimilarOnly(HistoryView):
    """Another workload's history only: the case's own measurements are not shown."""

    def __init__(self, inner: HistoryView) -> None:
        self.inner = inner

    def records(self) -> list[MeasureRecord]:
        return []

    def similar(self) -> list[MeasureRecord]:
        return list(self.inner.similar())


def request_for(template: Any, workload: Workload, target: Target, config: Config) -> Any:
    return MeasureRequest(workload, target, template.name, template.version, config)


def side_by_side(
    measurer: LocalMeasurer, ours: MeasureRequest, theirs: MeasureRequest, rounds: int
) -> tuple[list[float], list[float], str]:
    """Alternate ours and theirs ``rounds`` times; each entry is one measurement's median.
    Also returns the OpenBLAS kernel that ran (threadpoolctl's architecture)."""
    a: list[float] = []
    b: list[float] = []
    kernel = ""
    for _ in range(rounds):
        for req, out in ((ours, a), (theirs, b)):
            (res,) = measurer.measure([req])
            if res.status is not MeasureStatus.OK or res.median_secs is None:
                raise RuntimeError(f"{req.template} {dict(req.config)}: {res.status} {res.error}")
            out.append(res.median_secs)
            if req is theirs:
                kernel = str(res.environment.get("blas_architecture", ""))
    return a, b, kernel


def run_case(
    shape: tuple[int, int, int],
    dtype: str,
    epilogue: str,
    threads: int,
    *,
    trials: int,
    tune_secs: float,
    rounds: int,
    measurer: LocalMeasurer,
    confirm: LocalMeasurer,
    target: Target,
    peak: Peak,
    seed: int,
    strategy: str,
    history: list[MeasureRecord],
) -> CaseResult:
    m, n, k = shape
    workload = Workload(m=m, n=n, k=k, dtype=dtype, epilogue=epilogue)
    template = get_template("blis.gemm")
    baseline = get_template("numpy.matmul")
    space = restricted_space(template, workload, target, threads)
    prior = [c for c in template.seed_configs(workload, target) if space.is_valid(c)]
    store = MemoryScheduleStore()
    start = time.monotonic()
    view = SimilarOnly(StaticHistory(history, workload, target, template.name, template.version))
    context = StrategyContext(
        space=space,
        workload=workload,
        target=target,
        template=template,
        history=view,
        seed=seed,
        prior=prior,
    )
    session = Session(
        store=store,
        measurer=measurer,
        template=template,
        strategy=make_strategy(strategy, context),
        workload=workload,
        target=target,
        budget=Budget(max_trials=trials, max_secs=tune_secs),
        history=view,
        confirm_top=0,  # the side-by-side below is this benchmark's confirmation
    )
    result = session.run()
    tuning_secs = time.monotonic() - start
    best: MeasureRecord | None = result.best
    if best is None:
        raise RuntimeError(f"{workload.label}: no config measured ok in {trials} trials")
    ours = request_for(template, workload, target, best.config)
    theirs = request_for(baseline, workload, target, Config({"threads": threads}))
    a, b, kernel = side_by_side(confirm, ours, theirs, rounds)
    ours_secs, theirs_secs = statistics.median(a), statistics.median(b)
    gflops = workload.gflops(ours_secs)
    per_core = peak.fp32_gflops_per_core * (1.0 if dtype == "float32" else 0.5)
    return CaseResult(
        shape=f"{m}x{n}x{k}",
        dtype=dtype,
        epilogue=epilogue,
        threads=threads,
        tunehub_gflops=gflops,
        openblas_gflops=workload.gflops(theirs_secs),
        ratio=theirs_secs / ours_secs,
        peak_fraction=gflops / (per_core * threads) if per_core else math.nan,
        tuned_trials=result.trials_done,
        tuning_secs=tuning_secs,
        config=best.config.to_dict(),
        tunehub_repeat_medians=a,
        openblas_repeat_medians=b,
        openblas_kernel=kernel,
    )


def git_commit() -> str:
    """The checkout's commit (with ``+dirty`` if it has changes), or '' outside git."""
    repo = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=repo,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""
    return head + ("+dirty" if dirty else "")


def parse_shape(text: str) -> tuple[int, int, int]:
    m, n, k = (int(x) for x in text.lower().split("x"))
    return m, n, k


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=40, help="tuning budget per case")
    parser.add_argument("--tune-secs", type=float, default=240.0, help="time budget per case")
    parser.add_argument("--tune-min-secs", type=float, default=0.1, help="timing per trial")
    parser.add_argument("--confirm-min-secs", type=float, default=0.5, help="final timing")
    parser.add_argument("--rounds", type=int, default=3, help="alternations ours/theirs")
    parser.add_argument("--quick", action="store_true", help="three small cases only")
    parser.add_argument("--case", action="append", default=[], help="MxNxK (repeatable)")
    parser.add_argument("--threads", type=int, action="append", default=[], help="1 and/or N")
    parser.add_argument("--no-fused", action="store_true", help="skip the bias_relu cases")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--strategy", default=DEFAULT_STRATEGY, help="search strategy (registry name)"
    )
    parser.add_argument(
        "--history",
        default=str(DATASETS),
        help="replay datasets the strategy may learn from (other workloads only), or 'none'",
    )
    parser.add_argument("--out", type=Path, default=None, help="JSON path")
    args = parser.parse_args()

    target = local_cpu_target()
    thread_counts = args.threads or sorted({1, target.cores})
    shapes = [parse_shape(c) for c in args.case] or (QUICK if args.quick else SHAPES)
    cases = [(s, "none") for s in shapes]
    if not args.no_fused and not args.quick and not args.case:
        cases += [(s, "bias_relu") for s in FUSED_SHAPES]

    history = (
        []
        if args.history == "none"
        else [r for d in load_datasets(Path(args.history)) for r in d.records]
    )
    work = Path(tempfile.mkdtemp(prefix="tunehub-bench-"))
    peak = measure_peak(work)
    forced = {
        k: os.environ[k] for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE") if k in os.environ
    }
    print(f"# {target.label}")
    if forced:
        print(
            f"# WARNING: {forced} forces an OpenBLAS kernel; run with "
            "`env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE` to compare with its native one"
        )
    print(
        f"# clock {peak.clock_ghz:.2f} GHz (measured), fp32 peak {peak.fp32_gflops_per_core:.1f}"
        f" GFLOP/s/core = {peak.flops_per_cycle_fp32:.1f} flop/cycle; budget {args.trials} "
        f"trials/case; OpenBLAS = numpy {np.__version__} matmul (+ separate bias, ReLU)"
    )
    header = (
        f"{'shape':>16} {'dtype':>7} {'thr':>3} {'epilogue':>9} {'tunehub':>9} {'OpenBLAS':>9}"
        f" {'ratio':>6} {'%peak':>6}  config"
    )
    print(header)
    results: list[CaseResult] = []
    with (
        LocalMeasurer(
            build_dir=work / "build", timing=TimingPolicy(min_secs=args.tune_min_secs)
        ) as measurer,
        LocalMeasurer(
            build_dir=work / "build", timing=TimingPolicy(min_secs=args.confirm_min_secs)
        ) as confirm,
    ):
        for threads in thread_counts:
            for shape, epilogue in cases:
                r = run_case(
                    shape,
                    "float32",
                    epilogue,
                    threads,
                    trials=args.trials,
                    tune_secs=args.tune_secs,
                    rounds=args.rounds,
                    measurer=measurer,
                    confirm=confirm,
                    target=target,
                    peak=peak,
                    seed=args.seed,
                    strategy=args.strategy,
                    history=history,
                )
                results.append(r)
                knobs = " ".join(f"{k}={v}" for k, v in r.config.items())
                print(
                    f"{r.shape:>16} {r.dtype:>7} {r.threads:>3} {r.epilogue:>9}"
                    f" {r.tunehub_gflops:9.1f} {r.openblas_gflops:9.1f} {r.ratio:6.2f}"
                    f" {100 * r.peak_fraction:5.1f}%  [{r.openblas_kernel}]  {knobs}",
                    flush=True,
                )

    summary: dict[str, Any] = {}
    for threads in thread_counts:
        plain = [r.ratio for r in results if r.threads == threads and r.epilogue == "none"]
        fused = [r.ratio for r in results if r.threads == threads and r.epilogue != "none"]
        summary[f"threads={threads}"] = {
            "geomean_ratio": geomean(plain),
            "min_ratio": min(plain) if plain else math.nan,
            "fused_geomean_ratio": geomean(fused),
        }
        for r in results:
            if r.threads != threads or r.epilogue == "none":
                continue
            twin = next(
                (
                    p
                    for p in results
                    if (p.shape, p.threads, p.epilogue) == (r.shape, threads, "none")
                ),
                None,
            )
            if twin is not None:
                # numpy's separate bias + ReLU passes cost this share of its matmul: fusing can
                # save at most that, so the fused ratio is bounded by plain ratio x (1 + share).
                share = twin.openblas_gflops / r.openblas_gflops - 1
                print(
                    f"# {r.shape} threads={threads} {r.epilogue}: numpy's separate epilogue adds "
                    f"{100 * share:.1f}% to its matmul; fused ratio {r.ratio:.2f} vs plain "
                    f"{twin.ratio:.2f}"
                )
                summary.setdefault("epilogue_share", {})[f"{r.shape}/threads={threads}"] = share
        print(
            f"# threads={threads}: geomean ratio {geomean(plain):.3f}, min "
            f"{min(plain) if plain else math.nan:.3f}"
            + (f"; fused bias_relu geomean {geomean(fused):.3f}" if fused else "")
        )
    stamp = datetime.now(UTC)
    out = args.out or RESULTS / f"cpu_gemm-{platform.node()}-{stamp:%Y%m%dT%H%M}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "benchmark": "cpu_gemm",
                "date": stamp.isoformat(),
                "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
                "commit": git_commit(),
                "machine": {
                    "cpu": target.name,
                    "flags": list(target.arch),
                    "cores": target.cores,
                    "l1d_bytes": target.l1d_bytes,
                    "l2_bytes": target.l2_bytes,
                    "l3_bytes": target.l3_bytes,
                    "compiler": target.toolchain.get("cc", ""),
                    "numpy": np.__version__,
                    "host": platform.node(),
                    "openblas_kernels": sorted({r.openblas_kernel for r in results}),
                    "openblas_env": forced,
                },
                "peak": asdict(peak),
                "budget": {"trials": args.trials, "tune_secs": args.tune_secs},
                "strategy": args.strategy,
                "history": args.history,
                "history_records": len(history),
                "summary": summary,
                "cases": [asdict(r) for r in results],
            },
            indent=2,
        )
    )
    print(f"# wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
