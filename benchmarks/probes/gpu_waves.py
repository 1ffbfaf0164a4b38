"""Probe: the shapes whose tiles leave the H100's SMs idle, timed with configs the template's
space leaves out (split-K past two waves of programs) and with small tiles several of which
share an SM, side by side with the config tunehub's search found and with cuBLAS.

Issue 15's remaining losses to cuBLAS are wave-quantisation shapes: 3000x1000x4000 (96 tiles
of 128x256 on 132 SMs), 127x5000x2048, 1536^3 bf16, and the long-K 256x256x65536. The space
allows ``SPLIT_K`` only while tiles x split stays within two waves
(``triton_gemm.SPLIT_K_MAX_WAVES``); 96 tiles split 4 make 384 programs (2.9 waves, 97 % of
the last one busy) and are never tried. This script asks whether such configs, or tiles small
enough for three programs an SM, beat what the search found, before the space is widened.

No search: a fixed list of contenders a shape (``CASES``), compiled first by a pool of GPU-less
processes (``triton_kernel_check.precompile_all``), each checked against a float64 reference
on fresh inputs into a NaN-poisoned C, then timed by tunehub's policy
(``tunehub.kernels.gpu_timing``: L2 flushed before every repeat, CUDA-graph replay, median) in
alternating rounds. Prints a table (TFLOP/s, x cuBLAS, x the search's pick) and writes JSON.

    PYTHONPATH=. python3 benchmarks/probes/gpu_waves.py --out "$OUT/gpu_waves.json"
    python3 benchmarks/probes/gpu_waves.py --dry-run   # the plan (and which configs the space has)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))  # the other probes
sys.path.insert(0, str(HERE.parent))  # benchmarks/ (triton_kernel_check)
sys.path.insert(0, str(ROOT))  # the repository (tunehub)

from cpu_gemm import git_commit  # noqa: E402
from gpu_splitk import Contender as ProbeContender  # noqa: E402
from gpu_splitk import precompile, run_shape  # noqa: E402

H100_SMS = 132

# (variant, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages, SPLIT_K)
Spec = tuple[str, int, int, int, int, int, int, int]

# Per case: the search's pick in the run of 2026-11-24 (gpu_gemm-h100-20261124T22*.json) first,
# then the contenders. Shapes are (M, N, K, dtype); B is column-major, as a linear layer's.
CASES: list[tuple[tuple[int, int, int, str], list[Spec]]] = [
    (
        (3000, 1000, 4000, "float16"),
        [
            ("tma", 128, 256, 64, 8, 8, 4, 1),
            ("splitk", 128, 256, 64, 8, 8, 4, 2),
            ("splitk", 128, 256, 64, 8, 8, 3, 4),
            ("splitk", 128, 256, 64, 8, 8, 4, 4),
            ("splitk", 256, 128, 64, 8, 8, 4, 4),
            ("splitk", 128, 128, 64, 8, 8, 4, 2),
            ("splitk", 128, 128, 64, 8, 4, 4, 2),
            ("tiled", 128, 64, 64, 8, 4, 3, 1),
            ("tiled", 128, 64, 64, 8, 4, 4, 1),
            ("tiled", 64, 128, 64, 8, 4, 3, 1),
        ],
    ),
    (
        (127, 5000, 2048, "float16"),
        [
            ("tiled", 64, 64, 64, 8, 4, 6, 1),
            ("tiled", 128, 64, 64, 8, 4, 4, 1),
            ("tiled", 128, 32, 128, 8, 4, 4, 1),
            ("splitk", 128, 64, 64, 8, 4, 4, 2),
            ("splitk", 128, 64, 128, 8, 4, 4, 2),
            ("splitk", 128, 128, 64, 8, 8, 4, 4),
            ("splitk", 128, 128, 64, 8, 4, 4, 2),
            ("splitk", 64, 64, 64, 8, 4, 6, 2),
            ("splitk", 128, 32, 128, 8, 4, 4, 2),
        ],
    ),
    (
        (1536, 1536, 1536, "bfloat16"),
        [
            ("tiled", 64, 128, 64, 4, 4, 3, 1),
            ("tiled", 128, 64, 64, 8, 4, 3, 1),
            ("tiled", 64, 64, 64, 8, 4, 4, 1),
            ("splitk", 128, 256, 64, 8, 8, 3, 2),
            ("splitk", 128, 256, 64, 8, 8, 3, 4),
            ("splitk", 128, 128, 64, 8, 8, 4, 2),
            ("splitk", 128, 128, 64, 8, 4, 4, 2),
            ("splitk", 256, 128, 64, 8, 8, 3, 2),
        ],
    ),
    (
        (256, 256, 65536, "float16"),
        [
            ("splitk", 64, 64, 128, 16, 4, 6, 8),
            ("splitk", 128, 128, 64, 8, 8, 4, 32),
            ("splitk", 128, 128, 128, 8, 8, 3, 32),
            ("splitk", 128, 128, 64, 8, 4, 4, 32),
            ("splitk", 64, 128, 128, 8, 4, 4, 16),
            ("splitk", 128, 64, 128, 8, 4, 4, 16),
            ("splitk", 64, 64, 128, 8, 4, 5, 16),
            ("splitk", 256, 128, 64, 8, 8, 3, 64),
        ],
    ),
    (
        (1024, 1024, 1024, "float16"),
        [
            ("tiled", 64, 128, 64, 4, 4, 6, 1),
            ("tiled", 64, 128, 128, 8, 4, 4, 1),
            ("splitk", 128, 128, 64, 8, 8, 4, 2),
            ("splitk", 128, 256, 64, 8, 8, 3, 4),
            ("splitk", 128, 128, 64, 8, 4, 4, 2),
            ("tiled", 128, 64, 64, 8, 4, 3, 1),
        ],
    ),
]
INTERPRET_CASES: list[tuple[tuple[int, int, int, str], list[Spec]]] = [
    (
        (40, 72, 256, "float16"),
        [("tiled", 16, 32, 32, 4, 4, 2, 1), ("splitk", 16, 32, 32, 4, 4, 2, 4)],
    ),
]


def config(spec: Spec) -> dict[str, Any]:
    variant, bm, bn, bk, group, warps, stages, split = spec
    c: dict[str, Any] = {
        "variant": variant,
        "BLOCK_M": bm,
        "BLOCK_N": bn,
        "BLOCK_K": bk,
        "GROUP_M": group,
        "num_warps": warps,
        "num_stages": stages,
        "SPLIT_K": split,
    }
    if variant in ("persistent", "tma", "ws"):
        c["FLATTEN"] = False
    return c


def describe(c: dict[str, Any]) -> str:
    text = (
        f"{c['variant']} {c['BLOCK_M']}x{c['BLOCK_N']}x{c['BLOCK_K']} "
        f"g{c['GROUP_M']} w{c['num_warps']} s{c['num_stages']}"
    )
    return text + (f" k{c['SPLIT_K']}" if c["SPLIT_K"] > 1 else "")


def programs(m: int, n: int, c: dict[str, Any]) -> int:
    return math.ceil(m / c["BLOCK_M"]) * math.ceil(n / c["BLOCK_N"]) * c["SPLIT_K"]


def in_space(m: int, n: int, k: int, dtype: str, c: dict[str, Any], sms: int) -> bool:
    """Whether the template's space for this workload on an H100 holds the config."""
    from tunehub.core import Workload
    from tunehub.kernels.triton_gemm import TritonGemmTemplate

    workload = Workload(m=m, n=n, k=k, dtype=dtype, b_layout="col_major")
    space = TritonGemmTemplate().space(workload, h100_target(sms))
    wanted = {key: c[key] for key in c if key != "FLATTEN"}
    return any({key: point.get(key) for key in wanted} == wanted for point in space.points)


def h100_target(sms: int) -> Any:
    from tunehub.core import Target

    return Target(
        kind="cuda",
        name="NVIDIA H100 80GB HBM3",
        arch=("sm_90",),
        cores=sms,
        l2_bytes=52428800,
        properties={
            "compute_capability": 90,
            "max_threads_per_sm": 2048,
            "regs_per_sm": 65536,
            "smem_per_block_bytes": 232448,
            "smem_per_sm_bytes": 233472,
            "warp_size": 32,
        },
    )


@dataclass
class Contender(ProbeContender):
    """A ``gpu_splitk`` contender (role: "waves" or "cuBLAS") that knows whether it is the
    search's pick."""

    picked: bool = False  # the search's pick

    @property
    def name(self) -> str:
        return describe(self.config) if self.config else "cuBLAS"


def plan(interpret: bool) -> list[tuple[tuple[int, int, int, str], list[Contender]]]:
    cases = INTERPRET_CASES if interpret else CASES
    return [
        (
            shape,
            [Contender("waves", config(s), picked=i == 0) for i, s in enumerate(specs)]
            + [Contender("cuBLAS", None)],
        )
        for shape, specs in cases
    ]


def run_case(
    shape: tuple[int, int, int, str],
    contenders: list[Contender],
    *,
    rounds: int,
    min_secs: float,
    sms: int,
    device: Any,
) -> None:
    """``gpu_splitk.run_shape`` (check, then alternating rounds), then the names of the
    kernels cuBLAS launched for the shape."""
    m, n, k, dtype = shape
    run_shape((m, n, k), list(contenders), rounds=rounds, min_secs=min_secs, sms=sms,
              device=device, dtype=dtype)  # fmt: skip
    lib = next((c for c in contenders if c.config is None and c.ok), None)
    if lib is None or device.type != "cuda":
        return
    import torch

    from tunehub.core import Workload
    from tunehub.kernels import gpu_reference as ref

    ops = ref.operands(Workload(m=m, n=n, k=k, dtype=dtype, b_layout="col_major"), device, 4321)
    lib.extra["kernels"] = library_kernels(lambda: torch.matmul(ops.a, ops.b, out=ops.out), device)


def library_kernels(call: Any, device: Any) -> list[str]:
    """The names of the kernels cuBLAS launches for one call (its tile and split choices)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize(device)
    return [e.name for e in prof.events() if e.device_type.name == "CUDA"]


def table(results: list[Any], sms: int) -> str:
    lines = []
    for (m, n, k, dtype), contenders in results:
        flops = 2.0 * m * n * k
        lib = next(c for c in contenders if c.config is None)
        pick = next((c for c in contenders if c.picked), None)
        lines.append(f"== {m}x{n}x{k} {dtype}  (cuBLAS {flops / lib.secs() / 1e12:.1f} TFLOP/s)")
        for name in lib.extra.get("kernels", []):
            lines.append(f"   cuBLAS kernel: {name[:150]}")
        for c in sorted(contenders, key=Contender.secs):
            if not c.round_secs:
                lines.append(f"   {c.name:>36}  failed: {c.note[:120]}")
                continue
            tf = flops / c.secs() / 1e12
            waves = programs(m, n, c.config) / sms if c.config else math.nan
            mark = "*" if c.picked else (" " if c.extra.get("in_space", True) else "+")
            lines.append(
                f" {mark} {c.name:>36} {tf:7.1f} TFLOP/s  x cuBLAS {lib.secs() / c.secs():5.3f}"
                f"  x pick {pick.secs() / c.secs() if pick else math.nan:5.3f}"
                f"  programs/SMs {waves:4.2f}  rounds "
                + " ".join(f"{s * 1e6:.1f}" for s in c.round_secs)
            )
    lines.append("(* the search's pick; + outside the template's space; times in us)")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="JSON file to write")
    parser.add_argument("--rounds", type=int, default=5, help="alternations of the contenders")
    parser.add_argument("--min-secs", type=float, default=0.05, help="kernel time a round")
    parser.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    parser.add_argument("--dry-run", action="store_true", help="print the plan and stop")
    parser.add_argument("--interpret", action="store_true", help="CPU, Triton's interpreter")
    args = parser.parse_args()
    start = time.monotonic()
    if args.interpret:
        os.environ["TRITON_INTERPRET"] = "1"
    else:
        os.environ.pop("TRITON_INTERPRET", None)
    planned = plan(args.interpret)
    sms = 4 if args.interpret else H100_SMS
    for (m, n, k, dtype), contenders in planned:
        for c in contenders:
            if c.config is not None and not args.interpret:
                c.extra["in_space"] = in_space(m, n, k, dtype, c.config, sms)
    if args.dry_run:
        for (m, n, k, dtype), contenders in planned:
            print(f"{m}x{n}x{k} {dtype}")
            for c in contenders:
                waves = programs(m, n, c.config) / sms if c.config else math.nan
                where = "in space" if c.extra.get("in_space", True) else "outside the space"
                print(f"  {c.name:>36}  programs/SMs {waves:4.2f}  {where}")
        return 0
    if not args.interpret:
        import tempfile

        os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="tunehub-waves-"))

    import torch

    from tunehub.kernels.gpu_timing import gpu_environment

    if args.interpret:
        device = torch.device("cpu")
    else:
        device = torch.device("cuda", torch.cuda.current_device())
        sms = torch.cuda.get_device_properties(device).multi_processor_count
    report: dict[str, Any] = {
        "benchmark": "gpu_waves",
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "commit": os.environ.get("TUNEHUB_COMMIT") or git_commit(),
        "environment": gpu_environment(device),
        "host": platform.node(),
        "timing": {"rounds": args.rounds, "min_secs_per_round": args.min_secs},
    }
    if not args.interpret:
        major, minor = torch.cuda.get_device_capability(device)
        report["precompile"] = precompile(planned, major * 10 + minor, sms, args.workers)
        print(f"# precompile {report['precompile']}", flush=True)
    for shape, contenders in planned:
        run_case(
            shape, contenders, rounds=args.rounds, min_secs=args.min_secs, sms=sms, device=device
        )
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print(table(planned, sms))
    report.update(
        date=datetime.now(UTC).isoformat(),
        wall_secs=time.monotonic() - start,
        cases=[
            {
                "shape": list(shape),
                "contenders": [
                    {
                        "config": c.config,
                        "picked": c.picked,
                        "ok": c.ok,
                        "note": c.note,
                        "relative_error": c.relative_error,
                        "round_secs": c.round_secs,
                        "tflops": (
                            2.0 * math.prod(shape[:3]) / c.secs() / 1e12 if c.round_secs else None
                        ),
                        **c.extra,
                    }
                    for c in contenders
                ],
            }
            for shape, contenders in planned
        ],
    )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1, default=str))
    return 0 if all(c.ok for _, cs in planned for c in cs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
