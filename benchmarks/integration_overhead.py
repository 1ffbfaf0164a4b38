"""What the compiler integrations add per GEMM call once a shape is known, on the CPU: the config
memo hit (``CHOOSER.choose_shape``), and a whole ``tunehub::mm`` call (custom-op dispatch, memo,
blis.gemm kernel) against ``torch.mm`` on the same small shapes, where the overhead shows most.

    python benchmarks/integration_overhead.py --out benchmarks/results/integration_overhead-vm.json

No service (``TUNEHUB_URL`` empty): the template's default config. Medians of ``--rounds``
rounds; the contenders alternate within each round. The machine is shared: read the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from local_service import machine


def per_call_us(fn: Any, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    os.environ["TUNEHUB_URL"] = ""
    os.environ.setdefault("TUNEHUB_CACHE_DIR", tempfile.mkdtemp(prefix="tunehub-overhead-"))

    import torch

    from tunehub.client import torch_ops
    from tunehub.client.gemm_choice import CHOOSER
    from tunehub.core import local_cpu_target

    torch.set_num_threads(1)  # the default configs are single-threaded
    target = local_cpu_target()
    fields = (64, 64, 64, "float32", "row_major", "row_major", "none", False, target, "blis.gemm")
    CHOOSER.choose_shape(*fields)
    memo = [per_call_us(lambda: CHOOSER.choose_shape(*fields), args.calls * 50)
            for _ in range(args.rounds)]  # fmt: skip
    rows: list[dict[str, Any]] = []
    print(f"config memo hit: {statistics.median(memo):.2f} us (median of {args.rounds})")
    print(f"\n{'M x N x K':>14s} {'tunehub::mm us':>15s} {'torch.mm us':>12s} {'ratio':>7s}")
    # The overload, as the code Inductor generates calls it (the packet, torch.ops.tunehub.mm,
    # resolves the overload per call: about 35 us more here).
    op = torch.ops.tunehub.mm.default
    for m, n, k in [(1, 64, 64), (16, 256, 256), (64, 64, 64), (128, 512, 512)]:
        a, b = torch.randn(m, k), torch.randn(k, n)
        torch.testing.assert_close(op(a, b, None, "none"), a @ b, rtol=1e-4, atol=1e-4)
        mine, theirs = [], []
        for _ in range(args.rounds):
            mine.append(per_call_us(lambda a=a, b=b: op(a, b, None, "none"), args.calls))
            theirs.append(per_call_us(lambda a=a, b=b: torch.mm(a, b), args.calls))
        row = {
            "shape": [m, n, k],
            "tunehub_us": statistics.median(mine),
            "torch_us": statistics.median(theirs),
        }
        row["torch_over_tunehub"] = row["torch_us"] / row["tunehub_us"]
        rows.append(row)
        print(f"{m:>4d}x{n:>4d}x{k:<4d} {row['tunehub_us']:>15.1f} {row['torch_us']:>12.1f} "
              f"{row['torch_over_tunehub']:>7.2f}")  # fmt: skip
    assert torch_ops.CALLS["library"] == 0, torch_ops.CALLS
    print("\nratio: torch.mm time / tunehub::mm time (above 1: tunehub's call is cheaper)")
    result = {"machine": machine(), "memo_hit_us": statistics.median(memo), "rows": rows,
              "load_average": os.getloadavg()}  # fmt: skip
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
