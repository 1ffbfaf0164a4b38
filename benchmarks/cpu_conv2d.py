"""Benchmark: blis.conv2d tuned by tunehub against torch's conv2d (oneDNN) on this CPU, side by side
(issue 24: CPU conv2d >= 0.9x torch's geomean).

For each case (ResNet-50 and ConvNeXt-T convolutions at batch 1, NCHW and NHWC) it tunes
blis.conv2d with a stated budget (the jobs' default strategy, no history), then re-times the best
config and ``torch.conv2d`` (``torch.nn.functional.conv2d``, channels_last tensors for NHWC)
alternately in the same sandbox worker, the same way (fresh checked inputs, warm caches, one
thread pinned, repeats until a minimum time), ``--rounds`` times each, and prints both medians,
their ratio (torch time / tunehub time: above 1 is tunehub faster) and the geomean per layout.
JSON goes to benchmarks/results/.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/cpu_conv2d.py
    .venv/bin/python benchmarks/cpu_conv2d.py --quick   # two cases, smoke test

The CPU is named in the output and the JSON (with torch's version and its MKL / oneDNN build
flags); the script warns when OPENBLAS_CORETYPE or OPENBLAS_L2_SIZE are set.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cpu_bmm import geomean, git_commit, tune_and_compare

from tunehub.core import Workload, local_cpu_target
from tunehub.core.job import DEFAULT_STRATEGY
from tunehub.kernels.base import TimingPolicy
from tunehub.workers.local import LocalMeasurer

RESULTS = Path(__file__).resolve().parent / "results"
# (name, in channels, out channels, image size, filter, stride, groups)
CASES = [
    ("resnet50 layer1 3x3", 64, 64, 56, 3, 1, 1),
    ("resnet50 layer1 1x1 expand", 64, 256, 56, 1, 1, 1),
    ("resnet50 layer2 3x3 stride 2", 128, 128, 56, 3, 2, 1),
    ("resnet50 layer3 3x3", 256, 256, 14, 3, 1, 1),
    ("resnet50 layer4 3x3", 512, 512, 7, 3, 1, 1),
    ("convnext-t stage1 depthwise 7x7", 96, 96, 56, 7, 1, 96),
    ("convnext-t downsample 2x2 stride 2", 96, 192, 56, 2, 2, 1),
]
QUICK = [CASES[3], CASES[5]]


def conv_workload(case: tuple[str, int, int, int, int, int, int], layout: str) -> Workload:
    _, c, o, hw, r, stride, groups = case
    pad = r // 2 if r % 2 else 0
    return Workload.from_dict(
        {"op": "conv2d", "batch": 1, "in_channels": c, "out_channels": o, "height": hw,
         "width": hw, "kernel_h": r, "kernel_w": r, "stride_h": stride, "stride_w": stride,
         "pad_h": pad, "pad_w": pad, "groups": groups, "data_layout": layout}
    )  # fmt: skip


def run_case(
    case: tuple[str, int, int, int, int, int, int],
    layout: str,
    threads: int,
    args: argparse.Namespace,
    measurer: LocalMeasurer,
    confirm: LocalMeasurer,
) -> dict[str, Any]:
    what = case[0]
    workload = conv_workload(case, layout)
    row = tune_and_compare(
        workload, what, "blis.conv2d", "torch.conv2d", threads, args, measurer, confirm
    )
    return {**row, "layout": layout}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--tune-secs", type=float, default=120.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, nargs="*", default=[1])
    parser.add_argument("--layouts", nargs="*", default=["nchw", "nhwc"])
    parser.add_argument("--strategy", default=DEFAULT_STRATEGY)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tune-min-secs", type=float, default=0.05)
    parser.add_argument("--confirm-min-secs", type=float, default=0.2)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    forced = {
        k: os.environ[k] for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE") if k in os.environ
    }
    if forced:
        print(f"# warning: {forced} set; run under `env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE`")
    target = local_cpu_target()
    print(f"# CPU: {target.name}, {target.cores} cores, flags {' '.join(target.arch)}")
    print(f"# {'case':<52} {'thr':>3} {'tunehub':>9} {'torch':>9} {'ratio':>6}  config")
    results = []
    with tempfile.TemporaryDirectory(prefix="tunehub-conv2d-") as tmp:
        work = Path(tmp)
        with (
            LocalMeasurer(
                build_dir=work / "build", timing=TimingPolicy(min_secs=args.tune_min_secs)
            ) as measurer,
            LocalMeasurer(
                build_dir=work / "build", timing=TimingPolicy(min_secs=args.confirm_min_secs)
            ) as confirm,
        ):
            for threads in args.threads:
                for layout in args.layouts:
                    for case in QUICK if args.quick else CASES:
                        r = run_case(case, layout, threads, args, measurer, confirm)
                        results.append(r)
                        knobs = " ".join(f"{k}={v}" for k, v in r["config"].items())
                        print(
                            f"  {r['case']:<52} {threads:>3} {r['tunehub_gflops']:9.1f}"
                            f" {r['torch_gflops']:9.1f} {r['ratio']:6.2f}  {knobs}",
                            flush=True,
                        )
    summary = {}
    for threads in args.threads:
        groups = {f"threads={threads}": [r for r in results if r["threads"] == threads]}
        for layout in args.layouts:
            groups[f"threads={threads} {layout}"] = [
                r for r in results if r["threads"] == threads and r["layout"] == layout
            ]
        groups[f"threads={threads} dense"] = [
            r for r in results if r["threads"] == threads and "depthwise" not in r["what"]
        ]
        for name, rows in groups.items():
            ratios = [r["ratio"] for r in rows]
            if ratios:
                summary[name] = {"geomean_vs_torch": geomean(ratios), "min": min(ratios)}
                print(f"# {name}: geomean {geomean(ratios):.3f}, min {min(ratios):.3f}")
    stamp = datetime.now(UTC)
    out = args.out or RESULTS / f"cpu_conv2d-{platform.node()}-{stamp:%Y%m%dT%H%M}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "benchmark": "cpu_conv2d",
                "date": stamp.isoformat(),
                "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
                "commit": git_commit(),
                "machine": {
                    "cpu": target.name,
                    "cores": target.cores,
                    "flags": list(target.arch),
                    "l2_bytes": target.l2_bytes,
                    "l3_bytes": target.l3_bytes,
                    "host": platform.node(),
                    "openblas_env": forced,
                    "loadavg": list(os.getloadavg()),
                },
                "budget": {"trials": args.trials, "tune_secs": args.tune_secs},
                "strategy": args.strategy,
                "summary": summary,
                "results": results,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"# wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
