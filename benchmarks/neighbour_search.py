"""Benchmark: the nearest-winners search of an untuned lookup (``predicted`` tier), the full
scan it replaced against ``NeighbourIndex``, with N tuned schedules in a real store.

For each N: a SQLite database seeded by scripts/seed_schedules.py (N shapes on a grid, one
schedule each, this machine's CPU), or for ``--pg-url`` an already seeded PostgreSQL database
(e.g. ``tunehub_lookup_load``, 10^6 schedules; read only). Then, for untuned shapes (off the
grid), in the same process and on the same store:

- ``old``: every schedule and workload read, ``workload_distance`` in Python, sorted (what each
  request paid before; ``--old-runs`` times);
- ``new_build``: a fresh NeighbourIndex's first search (reads the tuned set, builds arrays);
- ``new_warm``: later searches of the same index (``--warm-runs`` shapes);
- ``new_patch``: a search after ``forget`` of one workload (one patch read).

Every answer of the new path is checked equal to the old one's. Printed, and written to
benchmarks/results/neighbour_search-vm-<UTC stamp>.{json,txt} with the CPU model and the
load average before and after.

    PYTHONPATH=. .venv/bin/python benchmarks/neighbour_search.py --sizes 10000 100000 \\
        --pg-url postgresql://postgres@127.0.0.1:5432/tunehub_lookup_load
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tunehub.core import Config, Target, Workload, local_cpu_target
from tunehub.db import ScheduleStore, SqlScheduleStore, make_engine, upgrade
from tunehub.kernels.base import Template
from tunehub.kernels.registry import get_template
from tunehub.tuner.lookup import CHECK_NEIGHBOURS, NeighbourIndex
from tunehub.tuner.model_strategy import workload_distance

ROOT = Path(__file__).resolve().parent
LINES: list[str] = []


def say(line: str) -> None:
    print(line, flush=True)
    LINES.append(line)


sys.path.insert(0, str(ROOT.parent / "scripts"))
from seed_schedules import seed  # noqa: E402


def scan_winners(
    store: ScheduleStore, workload: Workload, target: Target, template: Template
) -> list[Config]:
    """The search NeighbourIndex replaced (tuner/lookup.py before it), verbatim."""
    schedules = [
        s
        for s in store.target_schedules(target_key=target.target_key, template=template.name)
        if s.template_version == template.version
    ]
    workloads = store.get_workloads({s.workload_key for s in schedules})
    tuned = [
        (workloads[s.workload_key], s.config) for s in schedules if s.workload_key in workloads
    ]
    found = [
        (workload_distance(other, workload), config)
        for other, config in tuned
        if other.key != workload.key and other.op == workload.op
    ]
    found.sort(key=lambda t: t[0])
    return [config for _, config in found[:CHECK_NEIGHBOURS]]


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def untuned_shapes(rng: random.Random, count: int) -> list[Workload]:
    """Shapes off the seeded grid (multiples of 16): odd sizes nobody tuned."""
    odd = [rng.randrange(17, 1600, 2) for _ in range(3 * count)]
    return [Workload(m=odd[i], n=odd[i + 1], k=odd[i + 2]) for i in range(0, 3 * count, 3)]


def measure(
    store: ScheduleStore, label: str, args: argparse.Namespace, rng: random.Random
) -> dict[str, Any]:
    template = get_template(args.template)
    targets = store.list_targets()
    assert len(targets) == 1, f"one seeded target expected, found {len(targets)}"
    target = targets[0]
    shapes = untuned_shapes(rng, max(args.old_runs, args.warm_runs))
    old, old_answers = [], []
    for w in shapes[: args.old_runs]:
        t0 = time.perf_counter()
        old_answers.append(scan_winners(store, w, target, template))
        old.append(time.perf_counter() - t0)
    index = NeighbourIndex(store)
    t0 = time.perf_counter()
    first = index.winners(shapes[0], target, template)
    build = time.perf_counter() - t0
    assert first == old_answers[0], "the new search disagrees with the old one"
    warm = []
    for i, w in enumerate(shapes[: args.warm_runs]):
        t0 = time.perf_counter()
        got = index.winners(w, target, template)
        warm.append(time.perf_counter() - t0)
        if i < len(old_answers):
            assert got == old_answers[i], "the new search disagrees with the old one"
    tuned = index.tuned_set(target, template)
    some_key = tuned.keys[len(tuned) // 2].decode()
    patch = []
    for w in shapes[:3]:
        index.forget({some_key})
        t0 = time.perf_counter()
        index.winners(w, target, template)
        patch.append(time.perf_counter() - t0)
    arrays = sum(getattr(tuned, f).nbytes for f in tuned.__dataclass_fields__)
    row = {
        "store": label,
        "n": len(tuned),
        "old_runs": len(old),
        "old_median_s": statistics.median(old),
        "new_build_s": build,
        "warm_runs": len(warm),
        "new_warm_median_s": statistics.median(warm),
        "new_patch_median_s": statistics.median(patch),
        "ratio_old_over_warm": statistics.median(old) / statistics.median(warm),
        "array_bytes": arrays,
        "answers_equal": True,
    }
    say(
        f"N={row['n']:>8} {label:<10} old {row['old_median_s'] * 1e3:10.1f} ms (median of "
        f"{len(old)})  new: build {build * 1e3:9.1f} ms, warm {row['new_warm_median_s'] * 1e3:7.3f}"
        f" ms (median of {len(warm)}), after a change {row['new_patch_median_s'] * 1e3:7.2f} ms"
        f"  old/warm x{row['ratio_old_over_warm']:,.0f}  arrays {arrays / 1e6:.1f} MB"
    )
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[10_000, 100_000])
    parser.add_argument("--pg-url", help="An already seeded PostgreSQL database (read only).")
    parser.add_argument("--template", default="blis.gemm")
    parser.add_argument("--old-runs", type=int, default=3)
    parser.add_argument("--pg-old-runs", type=int, default=2)
    parser.add_argument("--warm-runs", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    load_before = os.getloadavg()
    started = datetime.now(UTC)
    rows = []
    for n in args.sizes:
        with tempfile.TemporaryDirectory() as tmp:
            url = f"sqlite:///{tmp}/bench.db"
            engine = make_engine(url)
            upgrade(engine)
            t0 = time.perf_counter()
            side = math.ceil(n ** (1 / 3) - 1e-9)
            seed(engine, count=n, target=local_cpu_target(), template=args.template, side=side)
            say(f"# seeded {n} schedules in SQLite in {time.perf_counter() - t0:.1f} s")
            store = SqlScheduleStore(engine)
            rows.append(measure(store, "sqlite", args, rng))
            store.close()
    if args.pg_url:
        store = SqlScheduleStore(args.pg_url)
        pg_args = argparse.Namespace(**{**vars(args), "old_runs": args.pg_old_runs})
        rows.append(measure(store, "postgresql", pg_args, rng))
        store.close()
    load_after = os.getloadavg()
    report = {
        "benchmark": "neighbour_search",
        "started": started.isoformat(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "check_neighbours": CHECK_NEIGHBOURS,
        "rows": rows,
    }
    say(
        f"# {report['cpu']}, {report['cores']} cores; load average before "
        f"{' '.join(f'{x:.2f}' for x in load_before)}, after "
        f"{' '.join(f'{x:.2f}' for x in load_after)}"
    )
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    out = ROOT / "results" / f"neighbour_search-vm-{stamp}"
    out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    say(f"# wrote {out}.json and .txt")
    out.with_suffix(".txt").write_text("\n".join(LINES) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
