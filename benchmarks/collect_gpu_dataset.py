"""Collect GPU replay datasets: real measurements of ``triton.gemm`` configs on this host's GPU.

For each workload it samples configs of the template's space uniformly (``--configs``, 800 by
default, or the whole space when it is smaller), always adds the template's seed configs (the
default first among them),
shuffles the measuring order, and measures every one through tunehub's pipeline (build
sandboxes compiling in parallel on the CPU cores, the GPU's run sandbox checking and timing).
Every record, failures included, is one ``tunehub.record/1`` JSON line in
``<out>/<name>.jsonl.gz``; ``MANIFEST.json`` beside them says how they were made.

    python3 benchmarks/collect_gpu_dataset.py --out benchmarks/datasets/gpu
    python3 benchmarks/collect_gpu_dataset.py --workload square_4096 --deadline-secs 400

``--deadline-secs`` stops submitting at that point and keeps what was measured (the manifest
says how many); a later run with the same seed measures the rest (configs already in the file
are skipped). Timing per config: ``min_secs=0.02``, at most 20 repeats (the L2 flushed before
each; see tunehub.kernels.gpu_timing).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import random
import sys
import time
from concurrent.futures import FIRST_COMPLETED, wait
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from cpu_gemm import git_commit  # noqa: E402

from tunehub.core import (  # noqa: E402
    Config,
    MeasureRecord,
    MeasureRequest,
    MeasureStatus,
    Workload,
    record_from_json,
    record_to_json,
)
from tunehub.kernels.base import TimingPolicy  # noqa: E402
from tunehub.kernels.registry import get_template  # noqa: E402
from tunehub.workers.local import LocalMeasurer  # noqa: E402

WORKLOADS = {
    "square_4096": Workload(m=4096, n=4096, k=4096, dtype="float16", b_layout="col_major"),
    "odd_1000x3000x777": Workload(m=1000, n=3000, k=777, dtype="float16", b_layout="col_major"),
    "skinny_127x5000x2048": Workload(m=127, n=5000, k=2048, dtype="float16", b_layout="col_major"),
    "long_k_256x256x65536": Workload(m=256, n=256, k=65536, dtype="float16", b_layout="col_major"),
    "decode_16x4096x4096": Workload(m=16, n=4096, k=4096, dtype="float16", b_layout="col_major"),
    # Since template version 2: more shapes for the cost model to learn across (a square the
    # suite's kernels run in ~10 us, wave quantisation, an LLM layer, bf16, a bias epilogue).
    "square_1024": Workload(m=1024, n=1024, k=1024, dtype="float16", b_layout="col_major"),
    "waves_3000x1000x4000": Workload(m=3000, n=1000, k=4000, dtype="float16", b_layout="col_major"),
    "mlp_64x14336x4096": Workload(m=64, n=14336, k=4096, dtype="float16", b_layout="col_major"),
    "square_1536_bf16": Workload(m=1536, n=1536, k=1536, dtype="bfloat16", b_layout="col_major"),
    "qkv_bias_2048x6144x4096": Workload(
        m=2048, n=6144, k=4096, dtype="float16", b_layout="col_major", epilogue="bias"
    ),
    # Second and third examples of what a held-out workload could not learn from the others
    # (a K whose rows are not 16-byte aligned, long K, decode batches, bf16, epilogues): with
    # one example each, leave-one-out has none to learn them from.
    "odd_333x4444x1111": Workload(m=333, n=4444, k=1111, dtype="float16", b_layout="col_major"),
    "odd_777x1555x999_bf16": Workload(m=777, n=1555, k=999, dtype="bfloat16", b_layout="col_major"),
    "long_k_128x128x32768": Workload(m=128, n=128, k=32768, dtype="float16", b_layout="col_major"),
    "long_k_512x512x16384": Workload(m=512, n=512, k=16384, dtype="float16", b_layout="col_major"),
    "long_k_64x4096x8192": Workload(m=64, n=4096, k=8192, dtype="float16", b_layout="col_major"),
    "decode_8x6144x4096_bias": Workload(
        m=8, n=6144, k=4096, dtype="float16", b_layout="col_major", epilogue="bias"
    ),
    "decode_8x4096x14336_bf16": Workload(
        m=8, n=4096, k=14336, dtype="bfloat16", b_layout="col_major"
    ),
    "square_512": Workload(m=512, n=512, k=512, dtype="float16", b_layout="col_major"),
    "square_2048": Workload(m=2048, n=2048, k=2048, dtype="float16", b_layout="col_major"),
    "bias_relu_1000": Workload(
        m=1000, n=1000, k=1000, dtype="float16", b_layout="col_major", epilogue="bias_relu"
    ),
    "prefill_2048x4096x14336_bf16": Workload(
        m=2048, n=4096, k=14336, dtype="bfloat16", b_layout="col_major"
    ),
}
TIMING = TimingPolicy(min_secs=0.02, max_repeats=20)


def plan(workload: Workload, target: Any, count: int, seed: int) -> list[Config]:
    template = get_template("triton.gemm")
    points = list(template.space(workload, target).points)
    rng = random.Random(seed)
    chosen = points if len(points) <= count else rng.sample(points, count)
    # The default and every other seed: what a zero-trial pick is compared with, and what a
    # better default could be chosen among, all measured.
    for seed_config in template.seed_configs(workload, target):
        if seed_config not in chosen:
            chosen.append(seed_config)
    rng.shuffle(chosen)
    return chosen


def collect(
    name: str,
    workload: Workload,
    measurer: LocalMeasurer,
    out: Path,
    count: int,
    seed: int,
    deadline: float,
) -> dict[str, Any]:
    template = get_template("triton.gemm")
    target = measurer.target
    configs = plan(workload, target, count, seed)
    path = out / f"{name}.jsonl.gz"
    done: list[MeasureRecord] = []
    if path.exists():
        with gzip.open(path, "rt") as f:
            done = [record_from_json(json.loads(line)) for line in f if line.strip()]
    measured = {r.config.key for r in done if r.verdict}
    todo = [c for c in configs if c.key not in measured]
    print(f"# {name}: {workload.label}: space {len(template.space(workload, target))}, "
          f"plan {len(configs)}, {len(todo)} to measure", flush=True)  # fmt: skip
    start = time.monotonic()
    futures = {
        measurer.submit(MeasureRequest(workload, target, template.name, template.version, c)): c
        for c in todo
    }
    requests = {f: c for f, c in futures.items()}
    pending = set(futures)
    fresh: list[MeasureRecord] = []
    while pending:
        finished, pending = wait(pending, timeout=1.0, return_when=FIRST_COMPLETED)
        for future in finished:
            result = future.result()
            config = requests[future]
            request = MeasureRequest(workload, target, template.name, template.version, config)
            if result.status is not MeasureStatus.CANCELLED:
                fresh.append(MeasureRecord(request, result))
        if time.monotonic() > deadline and pending:
            print(f"# {name}: deadline: cancelling {len(pending)}", flush=True)
            measurer.cancel(pending)
        if len(fresh) % 100 == 0 and finished:
            ok = sum(1 for r in fresh if r.status is MeasureStatus.OK)
            print(f"#   {len(fresh)}/{len(todo)} ({ok} ok) in {time.monotonic() - start:.0f}s",
                  flush=True)  # fmt: skip
    records = done + fresh
    with gzip.open(path, "wt") as f:
        for record in records:
            f.write(json.dumps(record_to_json(record), default=str) + "\n")
    statuses: dict[str, int] = {}
    for r in records:
        statuses[r.status.value] = statuses.get(r.status.value, 0) + 1
    ok = [r for r in records if r.status is MeasureStatus.OK and r.median_secs]
    best = min(ok, key=lambda r: r.median_secs or 0.0) if ok else None
    default = template.default_config(workload, target)
    ranked = sorted(ok, key=lambda r: r.median_secs or 0.0)
    default_rank = next((i + 1 for i, r in enumerate(ranked) if r.config == default), None)
    return {
        "workload": workload.to_dict(),
        "label": workload.label,
        "space": len(template.space(workload, target)),
        "planned": len(configs),
        "records": len(records),
        "statuses": statuses,
        "best_tflops": best.gflops / 1e3 if best and best.gflops else None,
        "best_config": best.config.to_dict() if best else None,
        "default_tflops": next(((r.gflops or 0) / 1e3 for r in ok if r.config == default), None),
        "default_rank": default_rank,
        "secs": time.monotonic() - start,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", action="append", default=[], choices=sorted(WORKLOADS))
    parser.add_argument("--configs", type=int, default=800)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=HERE / "datasets" / "gpu")
    parser.add_argument("--home", type=Path, default=Path("/tmp/tunehub-gpu-dataset"))
    parser.add_argument("--deadline-secs", type=float, default=1e9)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.deadline_secs
    names = args.workload or list(WORKLOADS)
    manifest_path = args.out / "MANIFEST.json"
    manifest: dict[str, Any] = (
        json.loads(manifest_path.read_text()) if manifest_path.exists() else {"datasets": {}}
    )
    with LocalMeasurer(
        device="cuda:0",
        workdir=args.home / "work",
        build_dir=args.home / "build",
        timing=TIMING,
        max_candidate_secs=120,
    ) as measurer:
        target = measurer.target
        print(f"# {target.label}: {measurer.builders} build processes", flush=True)
        for name in names:
            if time.monotonic() > deadline:
                break
            summary = collect(
                name, WORKLOADS[name], measurer, args.out, args.configs, args.seed, deadline
            )
            # Per dataset: a later call with other options must not relabel this one's.
            summary["sampled"] = f"{args.configs} configs, random.Random({args.seed})"
            summary["command"] = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])
            summary["commit"] = os.environ.get("TUNEHUB_COMMIT") or git_commit()
            manifest["datasets"][name] = summary
            print(f"# {name}: {summary['records']} records, best {summary['best_tflops']} "
                  f"TFLOP/s, default rank {summary['default_rank']}", flush=True)  # fmt: skip
    manifest.update(
        target=target.to_dict(),
        template="triton.gemm",
        timing={"min_secs": TIMING.min_secs, "max_repeats": TIMING.max_repeats},
        sampling=f"{args.configs} configs uniformly (random.Random({args.seed}).sample) or the "
        "whole space, plus the template's seed configs; measuring order shuffled",
        updated=datetime.now(UTC).isoformat(),
        command=" ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        commit=os.environ.get("TUNEHUB_COMMIT") or git_commit(),
        host=platform.node(),
    )
    manifest_path.write_text(json.dumps(manifest, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
