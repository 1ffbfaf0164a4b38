"""Collect replay datasets: real measurements of ``blis.gemm`` configs on this machine's CPU.

For each workload it samples configs of the template's space uniformly, measures every one with
the LocalMeasurer (build, check against the reference, time) and writes every record, failures
included, as one JSON line into ``<out>/<name>.jsonl.gz``. The replay measurer answers from these
files, so search strategies and cost models can be compared without hardware.

    .venv/bin/python benchmarks/collect_cpu_dataset.py                      # all 7 workloads
    .venv/bin/python benchmarks/collect_cpu_dataset.py --workload odd       # one of them
    .venv/bin/python benchmarks/collect_cpu_dataset.py --workload odd --limit 10 --out /tmp/x

Sampling: the space for ``local_cpu_target()`` fixed to one thread, ``--configs`` (800) points
drawn without replacement by ``random.Random(seed).sample``, plus the template's default config
(the analytical model's point, single-threaded) if the sample missed it; the same generator then
shuffles the measuring order, so drift over time (clock, the neighbours' load) does not line up
with the order in which the space enumerates configs. ``--limit`` measures only the first N of
that shuffled plan (smoke runs; the default may then be absent).

Why one thread: the development VM has 2 cores that other work shares (test suites run on the
other one). A single-threaded kernel, pinned by the timing loop to the core it starts on, is the
only timing here that does not depend on what runs beside it; a 2-thread kernel would measure
the neighbour's load as much as the config.

Timing (identical for every dataset): ``min_secs=0.1``, ``max_repeats=20`` (see GemmKernel.bench:
warm caches, a warm-up, then repeats until 0.1 s and at least 3 repeats); every repeat is kept.

Restarting: records go to ``<name>.jsonl.partial`` as they are measured (flushed per record,
fsynced per batch). A restart reads it back, drops a torn last line, skips the configs already
in it and goes on; when the plan is done the file is gzipped into ``<name>.jsonl.gz`` and the
partial removed. A finished dataset is not measured again. ``MANIFEST.json`` is rewritten from
the finished files at the end of every run (machine, versions, per-dataset summary, the runs).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import logging
import os
import platform
import random
import shlex
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from cpu_gemm import git_commit

from tunehub.core import (
    RECORD_FORMAT,
    Config,
    MeasureRecord,
    MeasureRequest,
    MeasureStatus,
    Target,
    Workload,
    local_cpu_target,
    record_to_json,
    utc_now,
)
from tunehub.kernels.base import TimingPolicy
from tunehub.kernels.blis_gemm import BlisGemmTemplate
from tunehub.kernels.build import compiler, compiler_version
from tunehub.kernels.timing import MIN_REPEATS, repeat_min_secs, warmup_secs
from tunehub.workers.local import LocalMeasurer

log = logging.getLogger("collect_cpu_dataset")

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "benchmarks" / "datasets" / "cpu"
TEMPLATE = "blis.gemm"
ERROR_CHARS = 2000
# Fixed for every dataset, so records of different files compare.
MIN_SECS = 0.1
MAX_REPEATS = 20
THREADS = 1

WORKLOADS: dict[str, Workload] = {
    "square_512": Workload(m=512, n=512, k=512),
    "square_1024": Workload(m=1024, n=1024, k=1024),
    "skinny_m": Workload(m=16, n=2048, k=2048),
    "skinny_n": Workload(m=2048, n=16, k=2048),
    "long_k": Workload(m=128, n=128, k=16384),
    "odd": Workload(m=333, n=777, k=555),
    "fused_1024": Workload(m=1024, n=1024, k=1024, epilogue="bias_relu"),
}


@dataclass(frozen=True)
class Plan:
    """What one dataset measures: its configs in measuring order, and where they go."""

    name: str
    workload: Workload
    space_size: int
    default: Config
    default_sampled: bool
    configs: list[Config]


def make_plan(
    name: str, template: BlisGemmTemplate, target: Target, *, configs: int, seed: int
) -> Plan:
    """Sample ``configs`` single-threaded points, add the model default, shuffle (see module)."""
    workload = WORKLOADS[name]
    space = template.space(workload, target).fix(threads=THREADS)
    points = list(space.points)
    rng = random.Random(seed)
    chosen = rng.sample(points, min(configs, len(points)))
    default = template.default_config(workload, target).replace(threads=THREADS)
    if not space.is_valid(default):
        raise SystemExit(f"{name}: the default config {default} is not in the 1-thread space")
    sampled = default in chosen
    if not sampled:
        chosen.append(default)
    rng.shuffle(chosen)
    return Plan(name, workload, len(points), default, sampled, chosen)


def record_line(record: MeasureRecord) -> str:
    """One record as the dataset's JSON line (format ``tunehub.record/1``), its error cut to
    ``ERROR_CHARS``."""
    data = record_to_json(record)
    data["error"] = data["error"][:ERROR_CHARS]
    return json.dumps(data, sort_keys=False, default=str)


def read_partial(path: Path) -> list[dict[str, Any]]:
    """The records of a partial file; a torn last line (a killed run) is cut off the file."""
    if not path.exists():
        return []
    raw = path.read_bytes()
    good_end = raw.rfind(b"\n") + 1
    if good_end < len(raw):
        log.warning("%s: dropping a torn last line (%d bytes)", path.name, len(raw) - good_end)
        with path.open("r+b") as f:
            f.truncate(good_end)
    return [json.loads(line) for line in raw[:good_end].splitlines() if line.strip()]


def read_dataset(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def check_same_setup(
    records: Sequence[dict[str, Any]], plan: Plan, target: Target, version: int
) -> None:
    """Refuse to resume onto records taken for another workload, machine or template version."""
    for rec in records:
        if (
            rec["workload"] != plan.workload.to_dict()
            or rec["target"] != target.to_dict()
            or rec["template_version"] != version
        ):
            raise SystemExit(
                f"{plan.name}: the partial file holds a record ({rec['uid']}) for another "
                "workload, target or template version; move it away to start over"
            )


def compress(partial: Path, final: Path) -> None:
    """gzip ``partial`` into ``final`` atomically (fixed mtime: same input, same bytes)."""
    tmp = final.with_suffix(final.suffix + ".tmp")
    with partial.open("rb") as src, tmp.open("wb") as raw:
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9, mtime=0) as gz:
            while chunk := src.read(1 << 20):
                gz.write(chunk)
        raw.flush()
        os.fsync(raw.fileno())
    tmp.replace(final)
    partial.unlink()


def gflops_of(rec: dict[str, Any]) -> float | None:
    if rec["status"] != MeasureStatus.OK.value or not rec["repeat_secs"]:
        return None
    return Workload.from_dict(rec["workload"]).gflops(statistics.median(rec["repeat_secs"]))


def collect(
    plan: Plan,
    *,
    out: Path,
    target: Target,
    template: BlisGemmTemplate,
    measurer: LocalMeasurer,
    batch: int,
    limit: int | None,
) -> bool:
    """Measure what ``plan`` still lacks into the partial file; True once the dataset is final."""
    final = out / f"{plan.name}.jsonl.gz"
    partial = out / f"{plan.name}.jsonl.partial"
    if final.exists():
        log.info("%s: %s exists, skipping", plan.name, final.name)
        return True
    done = read_partial(partial)
    check_same_setup(done, plan, target, template.version)
    done_keys = {Config(rec["config"]).key for rec in done}
    todo_configs = plan.configs[:limit] if limit is not None else plan.configs
    todo = [c for c in todo_configs if c.key not in done_keys]
    statuses = Counter(rec["status"] for rec in done)
    best = max((g for rec in done if (g := gflops_of(rec)) is not None), default=0.0)
    log.info(
        "%s: %s, %d configs in the 1-thread space, plan %d (default %s), %d already measured,"
        " %d to go",
        plan.name,
        plan.workload.label,
        plan.space_size,
        len(todo_configs),
        "sampled" if plan.default_sampled else "added",
        len(done),
        len(todo),
    )
    requests = [MeasureRequest(plan.workload, target, TEMPLATE, template.version, c) for c in todo]
    start = time.monotonic()
    with partial.open("a", encoding="utf-8") as f:
        for i in range(0, len(requests), batch):
            chunk = requests[i : i + batch]
            futures = [measurer.submit(request) for request in chunk]
            # Each record is made as its result arrives, so created_at is when it finished.
            for req, fut in zip(chunk, futures, strict=True):
                record = MeasureRecord(req, fut.result())
                request, result = record.request, record.result
                f.write(record_line(record) + "\n")
                f.flush()
                statuses[result.status.value] += 1
                if record.gflops is not None:
                    best = max(best, record.gflops)
                if result.status is not MeasureStatus.OK:
                    lines = result.error.strip().splitlines()
                    log.warning(
                        "%s: %s for %s: %s",
                        plan.name,
                        result.status.value,
                        request.config.to_dict(),
                        lines[-1] if lines else "",
                    )
            os.fsync(f.fileno())
            measured = i + len(chunk)
            elapsed = time.monotonic() - start
            per_config = elapsed / measured
            log.info(
                "%s: %d/%d  %s  best %.1f GFLOP/s  %.2f s/config  eta %.0f min",
                plan.name,
                len(done) + measured,
                len(done) + len(requests),
                " ".join(f"{k}={v}" for k, v in sorted(statuses.items())),
                best,
                per_config,
                per_config * (len(requests) - measured) / 60,
            )
    if limit is not None and len(todo_configs) < len(plan.configs):
        log.info("%s: --limit %d reached; left as %s", plan.name, limit, partial.name)
        return False
    compress(partial, final)
    log.info("%s: wrote %s (%d bytes)", plan.name, final.name, final.stat().st_size)
    return True


# --- the manifest ------------------------------------------------------------------------------


def dataset_summary(path: Path, plan: Plan) -> dict[str, Any]:
    """Counts, best and default GFLOP/s of one finished dataset (read back from its file)."""
    records = read_dataset(path)
    statuses = Counter(rec["status"] for rec in records)
    scored = sorted(
        ((g, rec) for rec in records if (g := gflops_of(rec)) is not None),
        key=lambda pair: -pair[0],
    )
    default = plan.default.to_dict()
    default_at = [i for i, (_, rec) in enumerate(scored) if rec["config"] == default]
    default_rec = next((rec for rec in records if rec["config"] == default), None)
    spreads = [
        (max(r["repeat_secs"]) - min(r["repeat_secs"])) / statistics.median(r["repeat_secs"])
        for _, r in scored
    ]
    times = [rec["created_at"] for rec in records]
    return {
        "file": path.name,
        "bytes": path.stat().st_size,
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "workload": plan.workload.to_dict(),
        "workload_label": plan.workload.label,
        "space_size_threads_1": plan.space_size,
        "records": len(records),
        "configs": len({Config(rec["config"]).key for rec in records}),
        "ok": statuses.get(MeasureStatus.OK.value, 0),
        "failed": len(records) - statuses.get(MeasureStatus.OK.value, 0),
        "statuses": dict(sorted(statuses.items())),
        "best_gflops": scored[0][0] if scored else None,
        "best_config": scored[0][1]["config"] if scored else None,
        "median_gflops": statistics.median(g for g, _ in scored) if scored else None,
        "default_config": default,
        "default_sampled": plan.default_sampled,
        "default_status": default_rec["status"] if default_rec else None,
        "default_gflops": scored[default_at[0]][0] if default_at else None,
        "default_rank": default_at[0] + 1 if default_at else None,
        "default_rank_of": len(scored),
        "median_repeat_spread": statistics.median(spreads) if spreads else None,
        "first_measured_at": min(times) if times else None,
        "last_measured_at": max(times) if times else None,
    }


def _run(args: Sequence[str]) -> str:
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def machine_info(target: Target) -> dict[str, Any]:
    lscpu = {}
    for line in _run(["lscpu"]).splitlines():
        key, sep, value = line.partition(":")
        if sep:
            lscpu[key.strip()] = value.strip()
    keep = (
        "Architecture", "Vendor ID", "Model name", "CPU family", "Model", "Stepping",
        "CPU(s)", "Thread(s) per core", "Core(s) per socket", "Socket(s)", "Hypervisor vendor",
        "Virtualization type", "L1d cache", "L1i cache", "L2 cache", "L3 cache", "BogoMIPS",
    )  # fmt: skip
    cpu_flags: list[str] = []
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            cpu_flags = value.split()
            break
    return {
        "host": socket.gethostname(),
        "cpu": target.name,
        "isa_flags": list(target.arch),
        "cpu_flags": cpu_flags,
        "lscpu": {k: lscpu[k] for k in keep if k in lscpu},
        "cores": target.cores,
        "l1d_bytes": target.l1d_bytes,
        "l2_bytes": target.l2_bytes,
        "l3_bytes": target.l3_bytes,
        "compiler": compiler_version(compiler()),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "target": target.to_dict(),
        "target_key": target.target_key,
    }


def blas_info() -> dict[str, Any]:
    info: dict[str, Any] = {"numpy": np.__version__}
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        info["blas_build"] = {k: blas.get(k) for k in ("name", "version", "openblas configuration")}
    except Exception as exc:  # the layout of show_config differs across numpy versions
        info["blas_build"] = f"unavailable: {exc}"
    try:
        from threadpoolctl import threadpool_info

        info["blas_runtime"] = [
            {k: pool.get(k) for k in ("internal_api", "version", "architecture", "num_threads")}
            for pool in threadpool_info()
        ]
    except ImportError:
        pass
    return info


def write_manifest(
    out: Path,
    plans: dict[str, Plan],
    target: Target,
    run: dict[str, Any],
    args: argparse.Namespace,
) -> None:
    """Rewrite MANIFEST.json from the finished datasets in ``out``; keep earlier runs' entries."""
    path = out / "MANIFEST.json"
    runs: list[dict[str, Any]] = []
    if path.exists():
        runs = json.loads(path.read_text()).get("runs", [])
    runs.append(run)
    datasets = {
        name: dataset_summary(out / f"{name}.jsonl.gz", plan)
        for name, plan in plans.items()
        if (out / f"{name}.jsonl.gz").exists()
    }
    script = Path(__file__).resolve()
    manifest = {
        "format": RECORD_FORMAT,
        "template": TEMPLATE,
        "template_version": BlisGemmTemplate.version,
        "sampling": {
            "space": "BlisGemmTemplate().space(workload, local_cpu_target()).fix(threads=1)",
            "configs_per_dataset": args.configs,
            "seed": args.seed,
            "method": "random.Random(seed).sample(points, n) + default_config if missing, "
            "then the same generator shuffles the measuring order",
        },
        "timing": {
            "measurer": "tunehub.workers.local.LocalMeasurer (sandbox subprocess, sequential)",
            "threads": THREADS,
            "min_secs": MIN_SECS,
            "max_repeats": MAX_REPEATS,
            "min_repeats": MIN_REPEATS,
            "warmup_secs": warmup_secs(MIN_SECS),
            "repeat_min_secs": repeat_min_secs(MIN_SECS, MAX_REPEATS),
            "cache_policy": "warm (same operands every call)",
            "pinning": "the C timing loop pins a 1-thread kernel to the core it starts on",
            "gflops": "2*M*N*K / median(repeat_secs); the epilogue is not counted",
            "reference": "numpy (OpenBLAS) checks each output in the sandbox, which runs "
            "OPENBLAS_NUM_THREADS=1; it is never timed",
        },
        "machine": machine_info(target),
        "blas": blas_info(),
        "script": {
            "path": str(script.relative_to(REPO)),
            "sha256": hashlib.sha256(script.read_bytes()).hexdigest(),
        },
        "datasets": datasets,
        "runs": runs,
    }
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    tmp.replace(path)
    log.info("wrote %s (%d datasets)", path, len(datasets))


# --- command line ------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--workload",
        action="append",
        choices=sorted(WORKLOADS),
        help="dataset to collect (repeatable; default: all, in the listed order)",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    parser.add_argument("--configs", type=int, default=800, help="sampled configs per dataset")
    parser.add_argument("--seed", type=int, default=0, help="sampling and order seed")
    parser.add_argument("--batch", type=int, default=20, help="requests per measure() call")
    parser.add_argument(
        "--limit", type=int, default=None, help="measure only the first N of each plan (smoke)"
    )
    parser.add_argument(
        "--build-dir",
        type=Path,
        default=None,
        help="kernel build cache (default: $TUNEHUB_HOME/build, else <out>/build)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%Y-%m-%dT%H:%M:%S",
        stream=sys.stdout,
    )
    logging.Formatter.converter = time.gmtime  # the log's timestamps are UTC, like the records
    args = parse_args(argv)
    started_at = utc_now()
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    home = os.environ.get("TUNEHUB_HOME")
    build_dir = args.build_dir or (Path(home).expanduser() / "build" if home else out / "build")
    target = local_cpu_target()
    template = BlisGemmTemplate()
    names = args.workload or list(WORKLOADS)
    log.info(
        "target %s; %s v%d; build cache %s", target.label, TEMPLATE, template.version, build_dir
    )
    plans = {
        name: make_plan(name, template, target, configs=args.configs, seed=args.seed)
        for name in WORKLOADS
    }
    finished: list[str] = []
    with LocalMeasurer(
        build_dir=build_dir, timing=TimingPolicy(min_secs=MIN_SECS, max_repeats=MAX_REPEATS)
    ) as m:
        for name in names:
            if collect(
                plans[name],
                out=out,
                target=target,
                template=template,
                measurer=m,
                batch=args.batch,
                limit=args.limit,
            ):
                finished.append(name)
    run = {
        "command": shlex.join([sys.executable, *sys.argv]),
        "cwd": os.getcwd(),
        "commit": git_commit(),
        "started_at": started_at.isoformat(),
        "ended_at": datetime.now(UTC).isoformat(),
        "datasets": names,
        "finished": finished,
    }
    write_manifest(out, plans, target, run, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
