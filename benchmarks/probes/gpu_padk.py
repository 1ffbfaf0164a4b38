"""Probe: what ``PAD_K`` costs on shapes whose rows along K are not 16-byte aligned, and how much
of it one padding launch saves against two torch copies.

For each shape (A row-major, B column-major, K odd) and each GEMM config, four ways to compute
C, each checked against a float64 reference into a NaN-poisoned C and timed by tunehub's
policy (``tunehub.kernels.gpu_timing``: L2 flushed before each repeat, CUDA-graph replay,
median) in alternating rounds (``gpu_splitk.run_shape``):

- ``fused``: the template's ``PAD_K`` (``bind`` with ``PAD_K``: one Triton launch copies A and
  B into K-padded buffers, whole padded rows, then the GEMM);
- ``copies``: the way ``PAD_K`` ran before: zeroed padded buffers made once, two
  ``Tensor.copy_`` into their first K columns each call, then the GEMM;
- ``prepadded``: the GEMM alone on operands padded once, outside the timed call (not a way to
  compute C from A and B: the floor any padding scheme sits on);
- cuBLAS (``torch.matmul``) on the unpadded operands.

Then ``torch.profiler`` over eager calls of ``fused`` and ``copies`` with the first config:
kernels a call and their device time each.

    PYTHONPATH=. python3 benchmarks/probes/gpu_padk.py --out "$OUT/gpu_padk.json"
    python3 benchmarks/probes/gpu_padk.py --dry-run
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the other probes
sys.path.insert(0, str(HERE.parent))  # benchmarks/ (triton_kernel_check)
sys.path.insert(0, str(HERE.parents[1]))  # the repository (tunehub)

from gpu_splitk import (  # noqa: E402
    Contender,
    precompile,
    probe_device,
    report_head,
    run_shape,
    write_report,
)
from gpu_tiles import parse_config  # noqa: E402

SHAPES = ["1000x3000x777:float16", "1000x3000x777:bfloat16", "333x4444x1111:float16"]
CONFIGS = {
    # the search's picks (gpu_gemm-h100-summary.txt), then tiles that fill more SMs: 128x192
    # (a 128- and a 64-column block) makes 128 tiles of 1000x3000 where 128x256 makes 96.
    "1000x3000x777": [
        "tma 128x256x32 w8 s4 g16 F",
        "tma 128x256x64 w8 s3 g16 F",
        "tma 128x192x64 w8 s3 g8 F",
        "tma 128x192x64 w8 s4 g8",
        "tma 128x192x64 w4 s4 g8",
        "tma 128x192x32 w8 s5 g16 F",
        "tma 128x128x64 w4 s4 g16 F",
    ],
    "333x4444x1111": [
        "tma 128x128x64 w4 s4 g16 F",
        "tma 128x128x64 w4 s5 g8 F",
        "tma 64x128x64 w4 s4 g8 F",
        "tma 128x80x64 w4 s4 g8",
        "tma 64x80x128 w4 s5 g8",
    ],
}
MODES = ("fused", "copies", "prepadded")


class CopiesLaunch:
    """``PAD_K`` as it ran before this probe's change: zeroed padded buffers made once, the
    operands copied into their first K columns (two ``copy_``) each call, then the GEMM."""

    def __init__(self, a: Any, b: Any, out: Any, config: dict[str, Any], sms: int) -> None:
        import torch

        from tunehub.kernels import triton_gemm_kernels as kernels
        from tunehub.kernels.triton_gemm_limits import padded_k

        m, k = a.shape
        n = b.shape[1]
        kp = padded_k(k, str(a.dtype).removeprefix("torch."))
        a_pad = torch.zeros((m, kp), dtype=a.dtype, device=a.device)
        b_pad = torch.zeros((n, kp), dtype=b.dtype, device=b.device).t()  # column-major B
        self.copies = [(a_pad[:, :k], a), (b_pad[:k, :], b)]
        gemm = {key: value for key, value in config.items() if key != "PAD_K"}
        self.gemm = kernels.bind(a_pad, b_pad, None, out, config=gemm, num_sms=sms)
        self.launches = self.gemm.launches
        self.counts = None

    def __call__(self) -> Any:
        for dst, src in self.copies:
            dst.copy_(src)
        return self.gemm()


def prepadded(a: Any, b: Any, out: Any, config: dict[str, Any], sms: int) -> Any:
    """The GEMM alone on operands padded here, once."""
    copies = CopiesLaunch(a, b, out, config, sms)
    for dst, src in copies.copies:
        dst.copy_(src)
    return copies.gemm


def fused(a: Any, b: Any, out: Any, config: dict[str, Any], sms: int) -> Any:
    from tunehub.kernels import triton_gemm_kernels as kernels

    return kernels.bind(a, b, None, out, config={**config, "PAD_K": True}, num_sms=sms)


BINDERS = {"fused": fused, "copies": CopiesLaunch, "prepadded": prepadded}
# Each contender's mode, by its config's identity (``run_shape`` hands the binder the config).
MODE_OF: dict[int, str] = {}


def binder(a: Any, b: Any, out: Any, config: dict[str, Any], sms: int) -> Any:
    return BINDERS[MODE_OF[id(config)]](a, b, out, config, sms)


def plan(shapes: list[str]) -> list[tuple[tuple[int, int, int, str], list[Contender]]]:
    from tunehub.kernels import triton_gemm_limits as limits

    props = {"compute_capability": 90, "smem_per_block_bytes": 232448, "regs_per_sm": 65536}
    out = []
    for spec in shapes:
        size, dtype = spec.split(":")
        m, n, k = (int(x) for x in size.split("x"))
        kp = limits.padded_k(k, dtype)
        contenders = []
        for text in CONFIGS.get(size, CONFIGS["1000x3000x777"]):
            c = parse_config(text)
            if limits.config_problem(c, dtype, props) or limits.workload_problem(
                c["variant"], m, n, kp, dtype, "row", "col"
            ):
                continue
            for mode in MODES:
                config = {**c, "PAD_K": True}
                MODE_OF[id(config)] = mode
                contenders.append(Contender(mode, config, extra={"text": text}))
        contenders.append(Contender("cuBLAS", None))
        out.append(((m, n, k, dtype), contenders))
    return out


def profile(a: Any, b: Any, out: Any, config: dict[str, Any], sms: int) -> dict[str, Any]:
    """Kernels a call and their mean device microseconds, over 20 eager calls of each mode."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    found: dict[str, Any] = {}
    for mode in ("fused", "copies"):
        call = BINDERS[mode](a, b, out, config, sms)
        for _ in range(5):
            call()
        torch.cuda.synchronize()
        with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                call()
            torch.cuda.synchronize()
        kernels: dict[str, list[float]] = defaultdict(list)
        for event in prof.events():
            if event.device_type == torch.autograd.DeviceType.CUDA:
                kernels[event.name].append(event.device_time)
        found[mode] = {
            name[:90]: {"per_call": len(times) / 20, "mean_us": statistics.mean(times)}
            for name, times in kernels.items()
        }
        found[mode]["_sum_us_per_call"] = sum(sum(t) for t in kernels.values()) / 20
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", action="append", default=[], help="MxNxK:dtype (repeatable)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--min-secs", type=float, default=0.05)
    parser.add_argument("--budget-secs", type=float, default=200.0)
    parser.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    start = time.monotonic()
    planned = plan(args.shape or SHAPES)
    if args.dry_run:
        for shape, contenders in planned:
            print("x".join(map(str, shape)))
            for c in contenders:
                print(f"  {c.role} {c.extra.get('text', '')}")
        return 0
    device, sms, capability = probe_device("padk")
    import torch

    from tunehub.core import Workload
    from tunehub.kernels import gpu_reference as ref

    # Every GEMM config with PAD_K: precompile builds the padding launch and the GEMM at the
    # padded K, which the three modes share.
    unique = [(shape, [c for c in cs if c.role in ("fused", "cuBLAS")]) for shape, cs in planned]
    built = precompile(unique, capability, sms, args.workers)
    print(f"# precompiled {built}", flush=True)
    for _shape, contenders in planned:
        # The three modes of a config run the same GEMM binary: a failed build fails all.
        failed = {c.extra["text"]: c.note for c in contenders if c.role == "fused" and not c.ok}
        for c in contenders:
            if c.extra.get("text") in failed:
                c.ok, c.note = False, failed[c.extra["text"]]
    report = report_head("gpu_padk", device, args.rounds, args.min_secs)
    report["cases"] = []
    for (m, n, k, dtype), contenders in planned:
        if time.monotonic() - start > args.budget_secs:
            print(f"# {m}x{n}x{k}: skipped, past --budget-secs", flush=True)
            continue
        run_shape((m, n, k), contenders, rounds=args.rounds, min_secs=args.min_secs, sms=sms,
                  device=device, dtype=dtype, binder=binder)  # fmt: skip
        lib = next(c for c in contenders if c.config is None)
        torch.cuda.empty_cache()
        flops = 2.0 * m * n * k
        print(f"{m}x{n}x{k} {dtype}", flush=True)
        for c in sorted(contenders, key=Contender.secs):
            rounds = " ".join(f"{flops / s / 1e12:.0f}" for s in c.round_secs)
            tf = flops / c.secs() / 1e12 if c.round_secs else math.nan
            print(f"  {c.role:>9} {c.extra.get('text', ''):28} {tf:7.1f} TFLOP/s"
                  f"  x cuBLAS {lib.secs() / c.secs():5.3f}"
                  f"  {c.secs() * 1e6:7.2f} us  rounds [{rounds}] {'' if c.ok else c.note}",
                  flush=True)  # fmt: skip
        workload = Workload(m=m, n=n, k=k, dtype=dtype, b_layout="col_major")
        ops = ref.operands(workload, device, seed=99)
        first = parse_config(CONFIGS.get(f"{m}x{n}x{k}", CONFIGS["1000x3000x777"])[0])
        prof = profile(ops.a, ops.b, ops.out, first, sms)
        for mode, kernels in prof.items():
            print(f"  profile {mode}: {kernels['_sum_us_per_call']:.2f} us of kernels a call")
            for name, row in kernels.items():
                if not name.startswith("_"):
                    print(f"    {row['per_call']:.0f}x {row['mean_us']:7.2f} us  {name}")
        report["cases"].append(
            {
                "shape": [m, n, k],
                "dtype": dtype,
                "contenders": [c.record(flops, mode=c.role) for c in contenders],
                "profile": prof,
            }
        )
    write_report(report, args.out, start)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
