"""Benchmark: triton.gemm tuned by tunehub against cuBLAS and torch.compile max-autotune, on a GPU.

For each case it tunes ``triton.gemm`` with a stated budget through tunehub's real pipeline
(build sandboxes compiling ahead on the CPU cores, the GPU's run sandbox checking and timing,
a SQLite store, the winner confirmed at the end), then times, in this process and in
alternating rounds, the schedule's config, cuBLAS (``torch.matmul`` / ``torch.addmm``) and
``torch.compile(mode="max-autotune-no-cudagraphs")`` of the same function, each by the same
policy (tunehub.kernels.gpu_timing: L2 flushed before every repeat, CUDA-graph replay, median),
after checking each one's output against a float64 reference. It prints TFLOP/s, the ratios
and the config found, and writes JSON with the GPU, driver and versions.

    python3 benchmarks/gpu_gemm.py --out results.json                  # the issue's suite
    python3 benchmarks/gpu_gemm.py --case 4096x4096x4096 --trials 32   # one case
    python3 benchmarks/gpu_gemm.py --no-compile                        # skip torch.compile

Cases (M x N x K, float16, A row-major, B column-major as a linear layer's weight): 1024³,
2048³, 4096³, 8192³, 16x4096x4096, 64x14336x4096, 4096x4096x14336, 1000x3000x777,
3000x1000x4000, 256x256x65536, 127x5000x2048; and bfloat16 for 4096³, 16x4096x4096 and
1000x3000x777.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from cpu_gemm import git_commit  # noqa: E402

from tunehub.core import Budget, Config, JobSpec, Workload  # noqa: E402
from tunehub.core.job import DEFAULT_STRATEGY  # noqa: E402
from tunehub.db import SqlScheduleStore, upgrade  # noqa: E402
from tunehub.kernels import gpu_reference as ref  # noqa: E402
from tunehub.kernels import triton_gemm_kernels as kernels  # noqa: E402
from tunehub.kernels.base import TimingPolicy  # noqa: E402
from tunehub.kernels.gpu_timing import gpu_environment, time_gpu  # noqa: E402
from tunehub.kernels.registry import get_template  # noqa: E402
from tunehub.kernels.triton_gemm import gemm_call  # noqa: E402
from tunehub.tuner import find_schedule, session_for_job  # noqa: E402
from tunehub.workers.local import LocalMeasurer  # noqa: E402
from tunehub.workers.locks import CoreLocks  # noqa: E402

RESULTS = HERE / "results"
FP16 = [
    (1024, 1024, 1024),
    (2048, 2048, 2048),
    (4096, 4096, 4096),
    (8192, 8192, 8192),
    (16, 4096, 4096),
    (64, 14336, 4096),
    (4096, 4096, 14336),
    (1000, 3000, 777),
    (3000, 1000, 4000),
    (256, 256, 65536),
    (127, 5000, 2048),
]
BF16 = [(4096, 4096, 4096), (16, 4096, 4096), (1000, 3000, 777)]
# The broader suite (--suite broad): linear layers of a Llama-3-8B-sized model (hidden 4096,
# fused QKV 6144, MLP 14336) at a prefill batch of 2048 tokens and a decode batch of 8, with
# and without a bias epilogue; mid-size squares; odd sizes; fp16 and bf16.
BROAD = [
    "2048x6144x4096:float16:bias",
    "2048x4096x14336:bfloat16",
    "8x6144x4096:float16:bias",
    "8x4096x14336:bfloat16",
    "512x512x512:float16",
    "1536x1536x1536:bfloat16",
    "1000x1000x1000:float16:bias_relu",
    "2048x2048x2048:bfloat16:bias_gelu",
    "333x4444x1111:float16",
]
log = logging.getLogger("gpu_gemm")


@dataclass
class Side:
    """One contender's times (per-round medians) and its check."""

    name: str
    round_medians: list[float] = field(default_factory=list)
    relative_error: float = math.nan
    graph: bool = False
    detail: str = ""

    @property
    def secs(self) -> float:
        return statistics.median(self.round_medians) if self.round_medians else math.nan


def workload_of(shape: tuple[int, int, int], dtype: str, epilogue: str = "none") -> Workload:
    m, n, k = shape
    return Workload(m=m, n=n, k=k, dtype=dtype, b_layout="col_major", epilogue=epilogue)


def tune(
    workload: Workload,
    measurer: LocalMeasurer,
    store: SqlScheduleStore,
    trials: int,
    secs: float,
    strategy: str,
) -> dict[str, Any]:
    """Tune through tunehub's Session (as a job on the GPU target) and return what it found."""
    target = measurer.target
    template = get_template("triton.gemm")
    store.put_target(target)
    spec = JobSpec(
        workload=workload,
        target_key=target.target_key,
        template=template.name,
        strategy=strategy,
        budget=Budget(max_trials=trials, max_secs=secs),
    )
    job = store.create_job(spec, claimed=True, owner="gpu_gemm benchmark")
    start = time.monotonic()
    result = session_for_job(
        spec, store=store, measurer=measurer, target=target, job_id=job.id
    ).run()
    wall = time.monotonic() - start
    schedule = store.get_schedule(
        workload_key=workload.key, target_key=target.target_key, template=template.name
    )
    records = store.job_records(job.id)
    statuses: dict[str, int] = {}
    for r in records:
        statuses[r.status.value] = statuses.get(r.status.value, 0) + 1
    if schedule is None:
        raise RuntimeError(f"{workload.label}: nothing measured ok in {trials} trials: {statuses}")
    confirmed = schedule.confirmation
    answer = find_schedule(store, workload, target, template=template.name)
    return {
        # What a compiler asking tunehub is told: the schedule, or the library when the
        # stored measurements say it is faster (baseline_faster).
        "lookup_says_library_faster": bool(answer and answer.to_dict()["baseline_faster"]),
        "config": schedule.config.to_dict(),
        "record_secs": schedule.median_secs,
        "confirmed_secs": confirmed.median_secs if confirmed else None,
        "confirmed_spread": confirmed.spread if confirmed else None,
        "trials": result.trials_done,
        "stopped_by": result.stopped_by,
        "tuning_secs": result.elapsed_secs,
        "wall_secs": wall,
        "statuses": statuses,
        "job_id": job.id,
        "space": len(template.space(workload, target)),
    }


def torch_function(workload: Workload) -> Any:
    """The function a PyTorch user writes for the workload (what torch.compile compiles)."""
    if workload.epilogue == "none":
        return lambda a, b, bias: a @ b
    if workload.epilogue == "bias":
        return lambda a, b, bias: a @ b + bias
    if workload.epilogue == "bias_relu":
        return lambda a, b, bias: torch.relu(a @ b + bias)
    return lambda a, b, bias: torch.nn.functional.gelu(a @ b + bias)


def side_by_side(
    workload: Workload,
    config: Config,
    rounds: int,
    min_secs: float,
    compile_mode: str | None,
    device: torch.device,
) -> tuple[list[Side], dict[str, Any]]:
    """Check, then time in alternating rounds: tunehub's config, cuBLAS, torch.compile."""
    ops = ref.operands(workload, device, seed=1234)
    expected = ref.reference(ops, workload.epilogue)
    extra: dict[str, Any] = {}
    sides: list[tuple[Side, Any]] = []

    launch = gemm_call(
        kernels,
        ops,
        workload,
        config,
        num_sms=torch.cuda.get_device_properties(device).multi_processor_count,
    )
    launch()
    torch.cuda.synchronize(device)
    ours = Side("tunehub", relative_error=ref.check(ops.out, expected, workload).relative_error)
    sides.append((ours, launch))

    cublas_out = torch.empty_like(ops.out)
    if ops.bias is None:

        def cublas() -> Any:
            return torch.matmul(ops.a, ops.b, out=cublas_out)
    else:

        def cublas() -> Any:
            torch.addmm(ops.bias, ops.a, ops.b, out=cublas_out)
            if workload.epilogue == "bias_relu":
                cublas_out.relu_()
            elif workload.epilogue == "bias_gelu":
                torch.ops.aten.gelu_(cublas_out)
            return cublas_out

    cublas()
    torch.cuda.synchronize(device)
    theirs = Side("cuBLAS", relative_error=ref.check(cublas_out, expected, workload).relative_error)
    sides.append((theirs, cublas))

    if compile_mode:
        torch._dynamo.reset()
        start = time.monotonic()
        compiled = torch.compile(torch_function(workload), mode=compile_mode, dynamic=False)
        result = compiled(ops.a, ops.b, ops.bias)
        torch.cuda.synchronize(device)
        extra["compile_secs"] = time.monotonic() - start
        inductor = Side(
            f"torch.compile({compile_mode})",
            relative_error=ref.check(result, expected, workload).relative_error,
        )
        sides.append((inductor, lambda: compiled(ops.a, ops.b, ops.bias)))

    for _ in range(rounds):
        for side, call in sides:
            timed = time_gpu(call, min_secs=min_secs, max_repeats=200, device=device)
            side.round_medians.append(statistics.median(timed.repeat_secs))
            side.graph = timed.graph
    return [s for s, _ in sides], extra


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=64, help="tuning budget per case")
    parser.add_argument("--secs", type=float, default=240.0, help="tuning time budget per case")
    parser.add_argument("--strategy", default=DEFAULT_STRATEGY, help="the jobs' default")
    parser.add_argument(
        "--max-candidate-secs", type=float, default=300.0, help="a candidate's build+run limit"
    )
    parser.add_argument("--rounds", type=int, default=5, help="alternations of the contenders")
    parser.add_argument("--min-secs", type=float, default=0.05, help="timing per round")
    parser.add_argument(
        "--case", action="append", default=[], help="MxNxK[:dtype[:epilogue]] (repeatable)"
    )
    parser.add_argument("--suite", choices=["issue", "broad"], default="issue")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--compile-mode", default="max-autotune-no-cudagraphs")
    parser.add_argument("--home", type=Path, default=Path("/tmp/tunehub-gpu-bench"))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )

    cases: list[tuple[tuple[int, int, int], str, str]] = []
    texts = args.case or (BROAD if args.suite == "broad" else [])
    for text in texts:
        shape, dtype, epilogue = ([*text.split(":"), "", ""])[:3]
        m, n, k = (int(x) for x in shape.lower().split("x"))
        cases.append(((m, n, k), dtype or "float16", epilogue or "none"))
    if not cases:
        cases = [(s, "float16", "none") for s in FP16] + [(s, "bfloat16", "none") for s in BF16]

    args.home.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{args.home / 'tunehub.db'}"
    upgrade(url)
    store = SqlScheduleStore(url)
    device = torch.device("cuda", 0)
    measurer = LocalMeasurer(
        device="cuda:0",
        workdir=args.home / "work",
        build_dir=args.home / "build",
        timing=TimingPolicy(min_secs=0.1, max_repeats=50),
        max_candidate_secs=args.max_candidate_secs,
    )
    target = measurer.target
    env = gpu_environment(device)
    print(f"# {target.label}; {env.get('driver', '?')} driver; torch {torch.__version__}; "
          f"{measurer.builders} build processes; budget {args.trials} trials/case "
          f"({args.strategy})", flush=True)  # fmt: skip
    print(f"{'case':>24} {'tunehub':>8} {'cuBLAS':>8} {'compile':>8} {'x cuBLAS':>8} "
          f"{'x compile':>8}  config", flush=True)  # fmt: skip
    results = []
    locks = CoreLocks()
    try:
        for shape, dtype, epilogue in cases:
            workload = workload_of(shape, dtype, epilogue)
            found = tune(workload, measurer, store, args.trials, args.secs, args.strategy)
            # Time side by side holding the GPU's host-wide lock, as the run sandbox does.
            lock = measurer.fingerprint().lock_name
            with locks.timing(lock, 1):
                sides, extra = side_by_side(
                    workload,
                    Config(found["config"]),
                    args.rounds,
                    args.min_secs,
                    None if args.no_compile else args.compile_mode,
                    device,
                )
            tflops = {s.name: workload.flops / s.secs / 1e12 for s in sides}
            ours, cublas = sides[0], sides[1]
            answer = cublas if found["lookup_says_library_faster"] else ours
            row = {
                "case": f"{shape[0]}x{shape[1]}x{shape[2]}"
                + (f" {epilogue}" if epilogue != "none" else ""),
                "dtype": dtype,
                "workload": workload.to_dict(),
                "tunehub": found,
                "sides": [asdict(s) | {"secs": s.secs} for s in sides],
                "tflops": tflops,
                "ratio_vs_cublas": cublas.secs / ours.secs,
                "ratio_vs_compile": sides[2].secs / ours.secs if len(sides) > 2 else None,
                "answer": answer.name,
                "answer_vs_compile": sides[2].secs / answer.secs if len(sides) > 2 else None,
                **extra,
            }
            results.append(row)
            c = found["config"]
            library = found["lookup_says_library_faster"]
            desc = (f"{c['variant']} {c['BLOCK_M']}x{c['BLOCK_N']}x{c['BLOCK_K']} "
                    f"w{c['num_warps']} s{c['num_stages']} g{c['GROUP_M']} k{c['SPLIT_K']}"
                    f"{' F' if c.get('FLATTEN') else ''}{' padK' if c.get('PAD_K') else ''}"
                    f"{'  [lookup: use cuBLAS]' if library else ''}")  # fmt: skip
            vs_compile = row["ratio_vs_compile"]
            print(
                f"{row['case'] + ' ' + dtype:>34} {tflops['tunehub']:8.1f} "
                f"{tflops['cuBLAS']:8.1f} "
                f"{tflops.get(sides[-1].name, math.nan) if len(sides) > 2 else math.nan:8.1f} "
                f"{row['ratio_vs_cublas']:8.3f} "
                f"{vs_compile if vs_compile is not None else math.nan:8.3f}  {desc}",
                flush=True,
            )
            torch.cuda.empty_cache()
    finally:
        measurer.close()
        store.close()

    fp16 = [r["ratio_vs_cublas"] for r in results if r["dtype"] == "float16"] or [
        r["ratio_vs_cublas"] for r in results
    ]
    summary = {
        "geomean_vs_cublas_fp16": _geomean(fp16),
        "min_vs_cublas_fp16": min(fp16) if fp16 else None,
        "geomean_vs_cublas_all": _geomean([r["ratio_vs_cublas"] for r in results]),
        "min_vs_compile": min(
            (r["ratio_vs_compile"] for r in results if r["ratio_vs_compile"]), default=None
        ),
        "min_answer_vs_compile": min(
            (r["answer_vs_compile"] for r in results if r["answer_vs_compile"]), default=None
        ),
    }
    print(f"# fp16 geomean tunehub/cuBLAS {summary['geomean_vs_cublas_fp16']:.3f}, "
          f"min {summary['min_vs_cublas_fp16']}; min tunehub/compile "
          f"{summary['min_vs_compile']}")  # fmt: skip
    stamp = datetime.now(UTC)
    out = args.out or RESULTS / f"gpu_gemm-{platform.node()}-{stamp:%Y%m%dT%H%M}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "benchmark": "gpu_gemm",
                "date": stamp.isoformat(),
                "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
                # A copy run from inside another checkout (the device tool's) would read that
                # checkout's commit: the caller's TUNEHUB_COMMIT names the code that ran.
                "commit": os.environ.get("TUNEHUB_COMMIT") or git_commit(),
                "gpu": target.to_dict(),
                "environment": env,
                "budget": {"trials": args.trials, "secs": args.secs, "strategy": args.strategy},
                "timing": {"rounds": args.rounds, "min_secs_per_round": args.min_secs},
                "summary": summary,
                "cases": results,
            },
            indent=2,
            default=str,
        )
    )
    print(f"# wrote {out}")
    return 0


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


if __name__ == "__main__":
    sys.exit(main())
