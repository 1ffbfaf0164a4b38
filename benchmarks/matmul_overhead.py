"""Benchmark: the host time of one ``tunehub.triton.matmul`` call against Triton's own launch of
the same kernel and config, and ``torch.matmul``, per GEMM shape (float16 by default).

Contenders, timed in the same process, alternating within each round:

- ``tunehub``: ``tunehub.triton.matmul(a, b)`` in its steady state (the shape's first call was
  made before timing: the lookup, the checks, the binding, the JIT launch);
- ``launcher``: its bound launch alone (``GemmLauncher``), into a preallocated output;
- ``triton``: Triton's own ``kernel[grid](*args, **kwargs)`` of every launch ``bind`` packed for
  that config (the JIT's binder, specialisation key and cache lookup each call), preallocated
  output;
- ``bind``: ``bind(...)`` and its launch every call (roughly the drop-in's per-call work
  before it kept its bindings);
- ``torch``: ``torch.matmul(a, b)``.

Host time per call: ``--batch`` calls are issued and timed without synchronising (few enough
that the launch queue never fills), then the device is synchronised outside the timing; the
median over ``--rounds`` batches. ``wall`` is ``--calls`` calls back to back and a synchronise,
per call. Each shape is checked first: the output against ``torch.matmul`` (and bit for bit
against the JIT launch of the same config, unless the config sums by atomics).

No service: the template's default config of each shape (``TUNEHUB_URL`` empty), as in the
issue's measurement; ``--url`` asks a service instead. Needs torch and triton only, with the
repository on the path (added here). On a GPU:

    python3 benchmarks/matmul_overhead.py --out $OUT/matmul_overhead.json

On the CPU, under Triton's interpreter (the launches then run the kernel in Python: only the
tunehub-over-launcher difference means anything; a check that the script works):

    python3 benchmarks/matmul_overhead.py --interpret --sizes 16x16x16 --out /tmp/m.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TARGET_OVER_TRITON_US = 5.0  # issue 25: a steady-state call within 5 us of Triton's own launch
DEFAULT_SIZES = "64x64x64,512x512x512,4096x768x768"


def parse_sizes(text: str) -> list[tuple[int, int, int]]:
    sizes = []
    for item in text.split(","):
        m, n, k = (int(v) for v in item.lower().split("x"))
        sizes.append((m, n, k))
    return sizes


def host_us(fn: Callable[[], Any], batch: int, sync: Callable[[], None]) -> float:
    sync()
    start = time.perf_counter()
    for _ in range(batch):
        fn()
    secs = time.perf_counter() - start
    sync()
    return secs / batch * 1e6


def wall_us(fn: Callable[[], Any], calls: int, sync: Callable[[], None]) -> float:
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - start) / calls * 1e6


def machine(torch: Any, triton: Any, device: Any) -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "host": platform.node(),
        "cpu": platform.processor() or platform.machine(),
    }
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(gpu=props.name, sms=props.multi_processor_count, cuda=torch.version.cuda)
    return info


def measure(shape: tuple[int, int, int], device: Any, args: argparse.Namespace) -> dict[str, Any]:
    """One shape's row: its config, the checks, every contender's host time per call."""
    import torch

    import tunehub.triton as tt
    from tunehub.client import triton as client_triton
    from tunehub.client.gemm_choice import CALLS, CHOOSER
    from tunehub.kernels import triton_gemm_kernels as kernels
    from tunehub.kernels.triton_gemm import kernel_config
    from tunehub.kernels.triton_gemm_limits import bit_reproducible

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    m, n, k = shape
    dtype = getattr(torch, args.dtype)
    gen = torch.Generator(device=device).manual_seed(m * 7 + n * 3 + k)
    a = torch.randn(m, k, device=device, dtype=dtype, generator=gen)
    b = torch.randn(k, n, device=device, dtype=dtype, generator=gen)
    CALLS.clear()
    with torch.no_grad():
        out = tt.matmul(a, b)  # the first call: lookup, checks, bind, JIT launch
        sync()
    target = client_triton.device_target(device)
    choice = CHOOSER.choose_shape(
        m, n, k, args.dtype, "row_major", "row_major", "none",
        client_triton.allow_tf32(args.dtype, device.type), target, "triton.gemm",
    )  # fmt: skip
    assert choice is not None
    row: dict[str, Any] = {
        "shape": [m, n, k],
        "dtype": args.dtype,
        "source": choice.source,
        "use_library": choice.use_library,
        "config": dict(choice.config),
    }
    reference = torch.matmul(a, b)
    tol = 1e-4 if args.dtype == "float32" and device.type == "cpu" else 2e-2
    row["correct"] = bool(torch.allclose(out.float(), reference.float(), rtol=tol, atol=tol))
    plans = [p for key, p in client_triton._PLANS.items() if key[0] == a.shape]
    plan = plans[-1] if plans else None
    contenders: dict[str, Callable[[], Any]] = {
        "tunehub": lambda: tt.matmul(a, b),
        "torch": lambda: torch.matmul(a, b),
    }
    if isinstance(plan, client_triton._KernelPlan):
        bound_out = torch.empty((m, n), device=device, dtype=dtype)
        cfg = kernel_config(choice.config)
        bound = kernels.bind(a, b, None, bound_out, config=cfg)
        launches = bound.launches
        stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else None
        launcher = plan.launch
        launcher_out = torch.empty((m, n), device=device, dtype=dtype)
        row["compiled_launch"] = all(step.run is not None for step in launcher._steps)

        def triton_launch() -> None:
            for launch in launches:
                launch.kernel[launch.grid](*launch.args, **launch.kwargs)

        contenders["launcher"] = lambda: launcher(a, b, None, launcher_out, stream)
        contenders["triton"] = triton_launch
        contenders["bind"] = lambda: kernels.bind(a, b, None, launcher_out, config=cfg)()
        # Cached and JIT launches of one config and one input give the same bits (unless the
        # kernel sums by atomics, whose order varies).
        with torch.no_grad():
            cached = tt.matmul(a, b)
        bound()
        sync()
        if bit_reproducible(choice.config):
            row["bitwise_equal_to_jit"] = bool(torch.equal(cached, bound_out))
        row["kernels_per_call"] = len(launches)
    else:
        row["plan"] = type(plan).__name__ if plan is not None else None
    times: dict[str, list[float]] = {name: [] for name in contenders}
    with torch.no_grad():
        for fn in contenders.values():  # warm-up
            for _ in range(min(args.batch, 20)):
                fn()
        sync()
        for _ in range(args.rounds):
            for name, fn in contenders.items():
                times[name].append(host_us(fn, args.batch, sync))
        walls = {name: wall_us(fn, args.calls, sync) for name, fn in contenders.items()}
    for name, values in times.items():
        row[f"{name}_us"] = statistics.median(values)
        row[f"{name}_us_rounds"] = values
    row["wall_us"] = walls
    if "triton_us" in row:
        row["tunehub_over_triton_us"] = row["tunehub_us"] - row["triton_us"]
    row["calls"] = dict(CALLS)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=None, help=f"MxNxK,... (default {DEFAULT_SIZES})")
    parser.add_argument("--dtype", default="float16", choices=("float16", "bfloat16", "float32"))
    parser.add_argument("--batch", type=int, default=200, help="calls per timed batch")
    parser.add_argument("--rounds", type=int, default=10, help="batches per contender")
    parser.add_argument("--calls", type=int, default=2000, help="calls of the wall-time loop")
    parser.add_argument("--interpret", action="store_true", help="CPU, Triton's interpreter")
    parser.add_argument("--url", default="", help="a service to look the shapes up in")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.interpret:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
    os.environ["TUNEHUB_URL"] = args.url
    os.environ.setdefault("TUNEHUB_CACHE_DIR", tempfile.mkdtemp(prefix="tunehub-matmul-"))
    sys.path.insert(0, str(REPO))

    import torch
    import triton

    if args.interpret:
        device = torch.device("cpu")
        default_sizes = "16x16x16,32x48x40"
    elif torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
        default_sizes = DEFAULT_SIZES
    else:
        parser.error("no CUDA GPU here: run on a GPU, or pass --interpret")
    rows = [measure(shape, device, args) for shape in parse_sizes(args.sizes or default_sizes)]
    over = [r["tunehub_over_triton_us"] for r in rows if "tunehub_over_triton_us" in r]
    target_us = TARGET_OVER_TRITON_US
    result = {
        "benchmark": "matmul_overhead",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(torch, triton, device),
        "interpret": args.interpret,
        "batch": args.batch,
        "rounds": args.rounds,
        "calls": args.calls,
        "target_over_triton_us": TARGET_OVER_TRITON_US,
        # Under the interpreter the launches run the kernels in Python: no verdict.
        "meets_target": None if args.interpret else bool(over) and max(over) <= target_us,
        "all_correct": all(r["correct"] and r.get("bitwise_equal_to_jit", True) for r in rows),
        "rows": rows,
    }
    names = ("tunehub", "launcher", "triton", "bind", "torch")
    print(f"host us per call (median of {args.rounds} batches of {args.batch}), "
          f"{args.dtype}, {result['machine'].get('gpu', 'interpreter')}")  # fmt: skip
    header = " ".join(f"{n:>9s}" for n in names)
    print(f"{'M x N x K':>16s} {header}  over triton  ok  config")
    for r in rows:
        cells = " ".join(f"{r[f'{n}_us']:>9.1f}" if f"{n}_us" in r else f"{'-':>9s}" for n in names)
        over_us = r.get("tunehub_over_triton_us")
        over_text = f"{over_us:>+11.1f}" if over_us is not None else f"{'-':>11s}"
        ok = r["correct"] and r.get("bitwise_equal_to_jit", True)
        variant = r["config"].get("variant", "library" if r["use_library"] else "?")
        print(f"{'x'.join(map(str, r['shape'])):>16s} {cells}  {over_text}  {'y' if ok else 'N'}   "
              f"{variant} ({r['source']})")  # fmt: skip
    verdict = {None: "no verdict (interpreter)", True: "met", False: "NOT met"}
    print(f"target, tunehub within {TARGET_OVER_TRITON_US} us of triton: "
          f"{verdict[result['meets_target']]}; all correct: {result['all_correct']}")  # fmt: skip
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0 if result["all_correct"] else 1


if __name__ == "__main__":
    sys.exit(main())
