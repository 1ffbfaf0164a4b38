"""Benchmark: split-K in one kernel (``splitk``) against split-K in two (``tiled`` + its reduce
kernel), the best of a few non-split configs, and cuBLAS, side by side on a GPU.

No search: a fixed small set of tiles and split factors a shape (the split factors whose
programs come closest to one wave on the GPU's SMs, within the template's split-K rule), all
compiled first by a pool of GPU-less processes (``triton_kernel_check.precompile_all``), then,
per shape, every contender checked against a float64 reference and timed by tunehub's policy
(``tunehub.kernels.gpu_timing``: L2 flushed before every repeat, CUDA-graph replay, median) in
alternating rounds. Each ``splitk`` contender is also checked to give the same bits on its
last call, after every timed replay, as on its first, with its tile counters back at zero.
Prints a table and writes JSON with the GPU, driver and versions.

    PYTHONPATH=. python3 benchmarks/probes/gpu_splitk.py --out "$OUT/gpu_splitk.json"
    python3 benchmarks/probes/gpu_splitk.py --dry-run                  # the plan, no torch needed
    python3 benchmarks/probes/gpu_splitk.py --interpret --out x.json   # CPU, Triton's interpreter

Shapes (float16, A row-major, B column-major as a linear layer's weight, no epilogue):
256x256x65536, 128x128x32768, 512x512x16384, 64x4096x8192; ``--shape MxNxK`` replaces them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))  # the other probes
sys.path.insert(0, str(HERE.parent))  # benchmarks/ (triton_kernel_check)
sys.path.insert(0, str(ROOT))  # the repository (tunehub)

SHAPES = [(256, 256, 65536), (128, 128, 32768), (512, 512, 16384), (64, 4096, 8192)]
# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages): 64x64x128 s5 led split-K at
# 256x256x65536 on the H100 (benchmarks/notes/triton_gemm_notes.md); 64x128x64 halves the tiles.
SPLIT_TILES = [(64, 64, 128, 4, 5), (64, 128, 64, 4, 4)]
# Non-split contenders: what tunehub found or seeded for these sizes (gpu_gemm-h100-summary).
PLAIN = [
    ("tiled", 64, 64, 128, 4, 5),
    ("persistent", 64, 128, 128, 4, 4),
    ("tma", 64, 128, 128, 4, 3),
    ("tma", 128, 128, 64, 8, 4),
]
SPLITS_PER_TILE = 2
# The same rule as the template's space (triton_gemm.SPLIT_K_MAX_WAVES and K >= 2 x split x BK).
MAX_WAVES = 2
SPLIT_KS = (2, 4, 8, 16, 32, 64)
H100_SMS = 132
# --interpret: small problems and tiles the CPU interpreter gets through in seconds.
INTERPRET_SHAPES = [(32, 48, 640), (16, 64, 384)]
INTERPRET_SPLIT_TILES = [(16, 16, 32, 4, 2), (16, 32, 32, 4, 2)]
INTERPRET_PLAIN = [("tiled", 16, 16, 32, 4, 2), ("persistent", 16, 32, 32, 4, 2)]
INTERPRET_SMS = 4


def config(
    variant: str, bm: int, bn: int, bk: int, warps: int, stages: int, split: int = 1
) -> dict[str, Any]:
    return {
        "variant": variant,
        "BLOCK_M": bm,
        "BLOCK_N": bn,
        "BLOCK_K": bk,
        "GROUP_M": 8,
        "num_warps": warps,
        "num_stages": stages,
        "SPLIT_K": split,
    }


def describe(c: dict[str, Any]) -> str:
    text = (
        f"{c['variant']} {c['BLOCK_M']}x{c['BLOCK_N']}x{c['BLOCK_K']} "
        f"w{c['num_warps']} s{c['num_stages']}"
    )
    return text + (f" k{c['SPLIT_K']}" if c["SPLIT_K"] > 1 else "")


def splits_for(m: int, n: int, k: int, tile: tuple[int, ...], sms: int) -> list[int]:
    """The SPLITS_PER_TILE split factors whose program counts come closest to one wave."""
    bm, bn, bk = tile[:3]
    tiles = math.ceil(m / bm) * math.ceil(n / bn)
    allowed = [s for s in SPLIT_KS if tiles * s <= MAX_WAVES * sms and k >= 2 * s * bk]
    allowed.sort(key=lambda s: abs(math.log(tiles * s / sms)))
    return sorted(allowed[:SPLITS_PER_TILE])


def _pow2_at_least(n: int, floor: int) -> int:
    return max(floor, 1 << max(0, math.ceil(math.log2(max(1, n)))))


@dataclass
class Contender:
    role: str  # "one-kernel split-K", "two-kernel split-K", "non-split", "cuBLAS"
    config: dict[str, Any] | None
    round_secs: list[float] = field(default_factory=list)
    relative_error: float | None = None
    ok: bool = True
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return describe(self.config) if self.config else self.role

    def secs(self) -> float:
        return statistics.median(self.round_secs) if self.round_secs else math.inf

    def record(self, flops: float, **labels: Any) -> dict[str, Any]:
        """The contender as a probe's JSON keeps it: ``labels`` (its name, role), then its
        config, check, round times and TFLOP/s at their median, and what else it measured."""
        return {
            **labels,
            "config": self.config,
            "ok": self.ok,
            "note": self.note,
            "relative_error": self.relative_error,
            "round_secs": self.round_secs,
            "tflops": flops / self.secs() / 1e12 if self.round_secs else None,
            **self.extra,
        }


ROLES = ("one-kernel split-K", "two-kernel split-K", "non-split", "cuBLAS")


def plan(
    shapes: list[tuple[int, int, int]], sms: int, interpret: bool
) -> list[tuple[tuple[int, int, int], list[Contender]]]:
    """Per shape, the contenders: each split tile x split factor in both modes, the non-split
    configs that fit the shape and the H100 (or the interpreter), and cuBLAS."""
    from tunehub.kernels import triton_gemm_limits as limits

    props: dict[str, Any] = (
        {"interpreter": True}
        if interpret
        else {
            "compute_capability": 90,
            "smem_per_block_bytes": 232448,
            "regs_per_sm": 65536,
            "sm_count": sms,
        }
    )
    split_tiles = INTERPRET_SPLIT_TILES if interpret else SPLIT_TILES
    plain = INTERPRET_PLAIN if interpret else PLAIN
    out = []
    for m, n, k in shapes:
        contenders: list[Contender] = []

        def fits(c: dict[str, Any], m: int = m, n: int = n, k: int = k) -> bool:
            return (
                c["BLOCK_M"] <= _pow2_at_least(m, 16)
                and c["BLOCK_N"] <= _pow2_at_least(n, 32)
                and limits.config_problem(c, "float16", props) is None
                and not limits.workload_problem(c["variant"], m, n, k, "float16", "row", "col")
            )

        for tile in split_tiles:
            for split in splits_for(m, n, k, tile, sms):
                for variant, role in (("splitk", ROLES[0]), ("tiled", ROLES[1])):
                    c = config(variant, *tile, split=split)
                    if fits(c):
                        contenders.append(Contender(role, c))
        for variant, *tile in plain:
            c = config(variant, *tile)
            if fits(c):
                contenders.append(Contender(ROLES[2], c))
        contenders.append(Contender(ROLES[3], None))
        out.append(((m, n, k), contenders))
    return out


def precompile(
    planned: list[tuple[tuple[Any, ...], list[Contender]]],
    capability: int,
    sms: int,
    workers: int,
    *,
    skip: Any = None,
) -> dict[str, Any]:
    """Compile the template configs of every contender of ``planned`` (shapes (M, N, K) in
    float16, or (M, N, K, dtype)) in a pool of GPU-less processes; a contender whose build
    fails is marked not ok, the others get their registers and stack. ``skip(contender)``
    leaves one out (a probe's own kernel, compiled at its first call)."""
    import triton_kernel_check as check

    specs, owners = [], []
    for shape, contenders in planned:
        m, n, k, *rest = shape
        dtype = rest[0] if rest else "float16"
        for c in contenders:
            if c.config is not None and not (skip and skip(c)):
                specs.append(check.job("probe", c.config, m, n, k, dtype, "none"))
                owners.append(c)
    built, secs = check.precompile_all(specs, capability, sms, workers)
    for c, b in zip(owners, built, strict=True):
        if not b["ok"]:
            c.ok = False
            c.note = f"build: {b['error'][-300:]}"
        else:
            c.extra.update(registers=b.get("registers"), stack=b.get("stack"))
    return {"problems": len(specs), "wall_secs": secs, "workers": workers}


def run_shape(
    shape: tuple[int, int, int],
    contenders: list[Contender],
    *,
    rounds: int,
    min_secs: float,
    sms: int,
    device: Any,
    dtype: str = "float16",
    binder: Any = None,
) -> None:
    """Check each contender against a float64 reference, then time them in alternating
    rounds. ``binder(a, b, out, config, sms)`` makes a config's launch (default: the
    template's ``bind``); a launch with ``counts`` (tile counters) is checked to repeat its
    bits (unless its ``deterministic`` is False, or its config not ``bit_reproducible``:
    atomics sum in arrival order) and to leave the counters, the buffers it lists in
    ``zeroed`` and an atomic split's sum at zero."""
    import torch

    from tunehub.core import Workload
    from tunehub.kernels import gpu_reference as ref
    from tunehub.kernels import triton_gemm_kernels as kernels
    from tunehub.kernels.gpu_timing import time_gpu
    from tunehub.kernels.triton_gemm_limits import bit_reproducible

    m, n, k = shape
    workload = Workload(m=m, n=n, k=k, dtype=dtype, b_layout="col_major")
    ops = ref.operands(workload, device, seed=1234)
    expected = ref.reference(ops, workload.epilogue)
    calls: list[tuple[Contender, Any, Any]] = []
    for c in contenders:
        if not c.ok:
            continue
        out = torch.full_like(ops.out, math.nan)
        try:
            if c.config is None:

                def call(out: Any = out) -> Any:
                    return torch.matmul(ops.a, ops.b, out=out)

                bound = None
            else:
                if binder is None:
                    bound = kernels.bind(ops.a, ops.b, None, out, config=c.config, num_sms=sms)
                else:
                    bound = binder(ops.a, ops.b, out, c.config, sms)
                call = bound
            call()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        except Exception as exc:  # a contender's failure is data here
            c.ok, c.note = False, f"{type(exc).__name__}: {str(exc)[-300:]}"
            continue
        checked = ref.check(out, expected, workload)
        c.relative_error = checked.relative_error
        if not checked.ok:
            c.ok, c.note = False, checked.message
            continue
        if bound is not None:
            c.extra["launches"] = len(bound.launches)
        calls.append((c, call, (bound, out.clone(), out)))
    for _ in range(rounds):
        for c, call, _state in calls:
            timed = time_gpu(call, min_secs=min_secs, max_repeats=200, device=device)
            c.round_secs.append(statistics.median(timed.repeat_secs))
            c.extra["graph"] = timed.graph
    for c, _call, (bound, first, out) in calls:
        if bound is None or bound.counts is None:
            continue
        # After every timed replay: the same bits as the first call (where the launch sums in
        # a fixed order), counters and any accumulators it keeps zeroed at zero (a probe's
        # launch says so itself; the template's by its config, its sum being the workspace).
        exact = getattr(bound, "deterministic", bit_reproducible(c.config))
        c.extra["repeatable"] = bool(torch.equal(out, first)) if exact else None
        zeroed = [bound.counts, *getattr(bound, "zeroed", ())]
        if not exact and isinstance(bound, kernels.GemmLaunch) and bound.workspace is not None:
            zeroed.append(bound.workspace)
        c.extra["counters_zero"] = not any(bool(t.any()) for t in zeroed)
        if not ((c.extra["repeatable"] or not exact) and c.extra["counters_zero"]):
            c.ok, c.note = False, f"not repeatable or counters left set: {c.extra}"


def probe_device(name: str) -> tuple[Any, int, int]:
    """A probe's GPU, its SM count and compute capability (90 for sm_90), with Triton's
    cache in a fresh directory named after the probe unless TRITON_CACHE_DIR is set."""
    import tempfile

    os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix=f"tunehub-{name}-"))
    import torch

    device = torch.device("cuda", torch.cuda.current_device())
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    major, minor = torch.cuda.get_device_capability(device)
    return device, sms, major * 10 + minor


def report_head(benchmark: str, device: Any, rounds: int, min_secs: float) -> dict[str, Any]:
    """The fields every probe's JSON starts with: what ran, where, at which commit."""
    from cpu_gemm import git_commit

    from tunehub.kernels.gpu_timing import gpu_environment

    return {
        "benchmark": benchmark,
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "commit": os.environ.get("TUNEHUB_COMMIT") or git_commit(),
        "environment": gpu_environment(device),
        "host": platform.node(),
        "timing": {"rounds": rounds, "min_secs_per_round": min_secs},
    }


def write_report(report: dict[str, Any], out: Path | None, start: float) -> None:
    """Stamp a probe's report with the date and its wall time since ``start`` (monotonic),
    and write it to ``out`` as JSON where one is given."""
    report.update(date=datetime.now(UTC).isoformat(), wall_secs=time.monotonic() - start)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1, default=str))
        print(f"# wrote {out}")


def best(contenders: list[Contender], role: str) -> Contender | None:
    found = [c for c in contenders if c.role == role and c.ok and c.round_secs]
    return min(found, key=Contender.secs) if found else None


def table(
    results: list[tuple[tuple[int, int, int], list[Contender]]],
) -> tuple[str, list[dict[str, Any]]]:
    lines = [
        f"{'shape':>18} {'one-kernel':>10} {'two-kernel':>10} {'non-split':>10} {'cuBLAS':>8}"
        f" {'1k/2k':>6} {'1k/cuBLAS':>9} {'1k/non-split':>12}  one-kernel config | two-kernel"
        " config | non-split config  (TFLOP/s)"
    ]
    rows = []
    for (m, n, k), contenders in results:
        flops = 2.0 * m * n * k
        picked = {role: best(contenders, role) for role in ROLES}
        tf = {r: flops / c.secs() / 1e12 if c else math.nan for r, c in picked.items()}
        one, two, plain, lib = (tf[r] for r in ROLES)
        rows.append(
            {
                "shape": [m, n, k],
                "tflops": tf,
                "best": {r: c.name if c else None for r, c in picked.items()},
                "one_vs_two": one / two,
                "one_vs_cublas": one / lib,
                "one_vs_nonsplit": one / plain,
            }
        )
        names = " | ".join(
            (picked[r].name if picked[r] else "-")  # type: ignore[union-attr]
            for r in ROLES[:3]
        )
        lines.append(
            f"{f'{m}x{n}x{k}':>18} {one:10.1f} {two:10.1f} {plain:10.1f} {lib:8.1f}"
            f" {one / two:6.3f} {one / lib:9.3f} {one / plain:12.3f}  {names}"
        )
    return "\n".join(lines), rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="JSON file to write")
    parser.add_argument("--shape", action="append", default=[], help="MxNxK (repeatable)")
    parser.add_argument("--rounds", type=int, default=3, help="alternations of the contenders")
    parser.add_argument("--min-secs", type=float, default=0.05, help="kernel time a round")
    parser.add_argument("--budget-secs", type=float, default=110.0, help="skip shapes after")
    parser.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    parser.add_argument("--dry-run", action="store_true", help="print the plan and stop")
    parser.add_argument("--interpret", action="store_true", help="CPU, Triton's interpreter")
    parser.add_argument(
        "--compile-only",
        action="store_true",
        help="compile the plan for an H100 (sm_90, 132 SMs) in the CPU pool, no GPU, and stop",
    )
    args = parser.parse_args()
    start = time.monotonic()
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shape] or (
        INTERPRET_SHAPES if args.interpret else SHAPES
    )
    if any(len(s) != 3 for s in shapes):
        parser.error("--shape takes MxNxK, e.g. 256x256x65536")
    if args.interpret:
        os.environ["TRITON_INTERPRET"] = "1"
    else:
        os.environ.pop("TRITON_INTERPRET", None)
    sms = INTERPRET_SMS if args.interpret else H100_SMS
    if args.dry_run:
        planned = plan(shapes, sms, args.interpret)  # type: ignore[arg-type]
        compiles = 0
        for shape, contenders in planned:
            print("x".join(map(str, shape)))
            for c in contenders:
                print(f"  {c.role:>20}  {c.name}")
                if c.config:
                    compiles += 1 + (c.config["variant"] == "tiled" and c.config["SPLIT_K"] > 1)
        print(f"# {compiles} kernels to compile (reduce kernels of equal split counted apart)")
        return 0

    if not args.interpret:
        # The kernels compile into a scratch cache the pool and this process share.
        import tempfile

        os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="tunehub-splitk-"))
    if args.compile_only:
        planned = plan(shapes, sms, False)  # type: ignore[arg-type]
        built = precompile(planned, 90, sms, args.workers)
        bad = [(s, c.name, c.note) for s, cs in planned for c in cs if not c.ok]
        for shape, contenders in planned:
            for c in contenders:
                if c.config and c.ok:
                    print(f"{'x'.join(map(str, shape)):>16} {c.name:>32}  registers "
                          f"{c.extra['registers']} stack {c.extra['stack']}")  # fmt: skip
        print(f"# compiled {built}; failures {bad}")
        return 1 if bad else 0

    import torch

    if args.interpret:
        device = torch.device("cpu")
    else:
        device = torch.device("cuda", torch.cuda.current_device())
        sms = torch.cuda.get_device_properties(device).multi_processor_count
    planned = plan(shapes, sms, args.interpret)  # type: ignore[arg-type]
    report = report_head("gpu_splitk", device, args.rounds, args.min_secs)
    if not args.interpret:
        major, minor = torch.cuda.get_device_capability(device)
        report["precompile"] = precompile(planned, major * 10 + minor, sms, args.workers)
        print(f"# precompile {report['precompile']}", flush=True)
    done = []
    for shape, contenders in planned:
        if time.monotonic() - start > args.budget_secs:
            print(f"# {'x'.join(map(str, shape))}: skipped, past --budget-secs", flush=True)
            continue
        run_shape(
            shape, contenders, rounds=args.rounds, min_secs=args.min_secs, sms=sms, device=device
        )
        done.append((shape, contenders))
        if device.type == "cuda":
            torch.cuda.empty_cache()
    text, rows = table(done)
    print(text)
    failures = [
        {"shape": list(shape), "contender": c.name, "note": c.note}
        for shape, contenders in done
        for c in contenders
        if not c.ok
    ]
    for f in failures:
        print("# failed:", f)
    report.update(
        date=datetime.now(UTC).isoformat(),
        wall_secs=time.monotonic() - start,
        summary=rows,
        failures=failures,
        cases=[
            {
                "shape": list(shape),
                "contenders": [c.record(2.0 * math.prod(shape), role=c.role) for c in contenders],
            }
            for shape, contenders in done
        ],
    )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1, default=str))
        print(f"# wrote {args.out}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
