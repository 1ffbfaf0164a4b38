"""Benchmark: the cost models' quality gate on the committed replay datasets (issue 23's
target: no registered model whose first pick is worse than the analytical default on held-out
workloads).

Every record of ``benchmarks/datasets/<kind>/`` goes into an in-memory store, as jobs would
have stored them, and each (target family, template, template version) the datasets hold is
trained per the normal path: ``tunehub.cost_model.registry.train_global_model`` (held-out
workloads, the gate, registration), as the service's trainer calls it. Reported per model:
the gate's verdict, its reason, and each held-out workload's figures (the model's first pick
and the analytical default, as shares of the workload's best).

Two checks beyond the gate's own:

- ``all held out``: each accepted model's family, every workload held out in turn (the gate
  holds out at most 5): the first pick's geometric mean must still be at least the
  default's.
- ``issue 23 replay``: the CPU datasets re-measured as on the busy machine of issue 23 (half
  of each workload's fastest configs stored ``ok`` at 30-100x their time; the one-thread
  default untouched, as there): the gate must refuse the model.

    .venv/bin/python benchmarks/model_gate.py                  # cpu and gpu datasets
    .venv/bin/python benchmarks/model_gate.py --kind cpu --out /tmp/gate.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import platform
import random
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # when loaded by path (the tests)
from cpu_gemm import git_commit

from tunehub.core import MeasureRecord, ModelInfo
from tunehub.cost_model.registry import (
    HeldOut,
    geomean,
    held_out_workloads,
    template_default,
    train_global_model,
)
from tunehub.db import MemoryScheduleStore
from tunehub.workers.replay import load_datasets

ROOT = Path(__file__).resolve().parent
DATASETS = ROOT / "datasets"
RESULTS = ROOT / "results"
KINDS = ("cpu", "gpu")


def cpu_model() -> str:
    """``lscpu``'s model name (the machine the replay ran on; the datasets name their own)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or "unknown"
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def busy_machine(records: Sequence[MeasureRecord], seed: int = 0) -> list[MeasureRecord]:
    """``records`` measured again a day later on issue 23's busy machine: in each workload,
    half of the fastest half of the configs (there, the multi-thread ones sharing the cores
    with a build) stored ``ok`` at 30-100x their time, every repeat alike; the analytical
    default (one thread there) untouched."""
    rng = random.Random(seed)
    by_workload: dict[tuple[str, str], list[MeasureRecord]] = {}
    for r in records:
        if r.median_secs is not None:
            by_workload.setdefault((r.request.workload.key, r.request.template), []).append(r)
    hit: set[str] = set()
    for group in by_workload.values():
        req = group[0].request
        default = template_default(req.template)(req.workload, req.target)
        fast = sorted(group, key=lambda r: r.median_secs or 0.0)[: len(group) // 2]
        hit |= {
            r.uid
            for r in fast
            if (default is None or r.config.key != default.key) and rng.random() < 0.5
        }
    out = []
    for r in records:
        result = r.result
        if r.uid in hit:
            factor = rng.uniform(30, 100)
            result = dataclasses.replace(
                result, repeat_secs=tuple(s * factor for s in result.repeat_secs)
            )
        later = r.created_at + timedelta(days=1)
        out.append(dataclasses.replace(r, uid=_uid(rng), created_at=later, result=result, seq=None))
    return out


def _uid(rng: random.Random) -> str:
    """A record uid drawn from ``rng``: the same run to run (a store orders records by uid
    within a batch, and a model's row order changes its boosters' subsamples)."""
    return uuid.UUID(int=rng.getrandbits(128)).hex


def row(held: HeldOut) -> dict[str, Any]:
    return {
        "workload": held.workload.label,
        "configs": held.configs,
        "spearman": held.spearman,
        "first_pick_share": held.top1,
        "default_share": held.default,
        "time_log2_error": held.time_log2_error,
    }


def fmt_share(value: float | None) -> str:
    return "      -" if value is None else f"{100 * value:6.1f}%"


def report_rows(rows: Sequence[HeldOut], lines: list[str]) -> None:
    lines.append(f"    {'held-out workload':<44} {'pick':>7} {'default':>7} {'Spearman':>8}")
    for r in rows:
        mark = "  < default" if r.default is not None and r.top1 < r.default else ""
        lines.append(
            f"    {r.workload.label:<44} {fmt_share(r.top1)} {fmt_share(r.default)} "
            f"{r.spearman:8.3f}{mark}"
        )


def compare(rows: Sequence[HeldOut]) -> dict[str, Any]:
    """First pick against the default over the rows where the default was measured."""
    paired = [r for r in rows if r.default is not None]
    if not paired:
        return {"compared_workloads": 0}
    pick = geomean([r.top1 for r in paired])
    default = geomean([r.default for r in paired if r.default is not None])
    return {
        "compared_workloads": len(paired),
        "first_pick_geomean": pick,
        "default_geomean": default,
        "below_default": [
            r.workload.label for r in paired if r.default is not None and r.top1 < r.default
        ],
        "first_pick_at_least_default": pick >= default,
    }


def train_family(
    store: MemoryScheduleStore, records: list[MeasureRecord], lines: list[str], label: str
) -> list[tuple[ModelInfo, list[HeldOut], float]]:
    """Train every (family, template, version) of ``records`` per the normal path; returns
    each registered model with the held-out workloads behind the gate's verdict and the
    seconds its training took (held-out models included)."""
    store.commit_records(records)
    targets = {r.request.target.family_key: r.request.target for r in records}
    keys = sorted(
        {
            (r.request.target.family_key, r.request.template, r.request.template_version)
            for r in records
        }
    )
    out = []
    for family, template, version in keys:
        rows: list[HeldOut] = []
        start = time.perf_counter()
        info = train_global_model(
            store,
            family_key=family,
            template=template,
            template_version=version,
            target_label=targets[family].label,
            held_out=rows,
        )
        secs = time.perf_counter() - start
        if info is None:
            lines.append(f"{label} {template}@{version} {family[:8]}: nothing to learn")
            continue
        out.append((info, rows, secs))
    return out


def finite(value: Any) -> Any:
    """``value`` with NaN and infinities as None (strict JSON)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", type=Path, default=DATASETS)
    parser.add_argument("--kind", action="append", choices=KINDS, help="repeatable; default both")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (and .txt beside it)")
    args = parser.parse_args()
    kinds = args.kind or list(KINDS)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out_path = args.out or RESULTS / f"model_gate-vm-{stamp}.json"
    lines: list[str] = [
        f"model gate on the replay datasets, {stamp}, commit {git_commit()}",
        f"machine: {cpu_model()} ({platform.machine()}), the datasets' records replayed",
    ]
    report: dict[str, Any] = {
        "benchmark": "model_gate",
        "created_at": stamp,
        "commit": git_commit(),
        "machine": {"cpu": cpu_model(), "arch": platform.machine()},
        "models": [],
    }
    ok = True
    for kind in kinds:
        directory = args.datasets / kind
        if not directory.is_dir():
            print(f"no datasets in {directory}", file=sys.stderr)
            return 2
        datasets = load_datasets(directory)
        records = [r for d in datasets for r in d.records]
        lines.append("")
        lines.append(f"== {kind}: {len(datasets)} datasets, {len(records)} records")
        store = MemoryScheduleStore()
        for info, rows, secs in train_family(store, records, lines, kind):
            verdict = "ACCEPTED" if info.accepted else "REFUSED"
            lines.append(
                f"  {info.label} ({info.target_label.split(' [')[0]}): {verdict}, "
                f"{info.workloads_used} workloads, {info.records_used} records, {secs:.0f} s"
            )
            lines.append(f"    {info.reason}")
            report_rows(rows, lines)
            entry: dict[str, Any] = {
                "kind": kind,
                "model": info.label,
                "target": info.target_label,
                "accepted": info.accepted,
                "reason": info.reason,
                "metrics": info.metrics,
                "held_out": [row(r) for r in rows],
                "train_secs": secs,
            }
            if info.accepted:
                template = info.template
                # As the trainer reads them (the same records in the same order: a model's
                # row order changes its boosters' subsamples, so its picks).
                family_records = store.family_records(
                    family_key=info.family_key,
                    template=template,
                    template_version=info.template_version,
                )
                every = held_out_workloads(
                    template,
                    [r for r in family_records if r.verdict],
                    holdout=None,
                    default=template_default(template),
                )
                checked = compare(every)
                entry["all_held_out"] = {**checked, "rows": [row(r) for r in every]}
                good = bool(checked.get("first_pick_at_least_default"))
                ok &= good
                below = checked.get("below_default") or []
                lines.append(
                    f"    all {len(every)} held out in turn: first pick "
                    f"{fmt_share(checked.get('first_pick_geomean')).strip()} of the best, the "
                    f"default {fmt_share(checked.get('default_geomean')).strip()} (geomean over "
                    f"{checked['compared_workloads']}); below the default on {len(below)}"
                    + (f" ({', '.join(below)})" if below else "")
                    + ("" if good else "  TARGET MISSED")
                )
            report["models"].append(entry)
        if kind == "cpu":
            lines.append("")
            lines.append("== issue 23 replay: the cpu datasets re-measured on a busy machine")
            bad = records + busy_machine(records)
            for info, rows, secs in train_family(MemoryScheduleStore(), bad, lines, "cpu busy"):
                verdict = "ACCEPTED" if info.accepted else "REFUSED"
                refused = info.accepted is False
                ok &= refused
                lines.append(
                    f"  {info.label}: {verdict}{'' if refused else '  TARGET MISSED'}, {secs:.0f} s"
                )
                lines.append(f"    {info.reason}")
                report_rows(rows, lines)
                report["models"].append(
                    {
                        "kind": "cpu, issue 23 replay",
                        "model": info.label,
                        "accepted": info.accepted,
                        "reason": info.reason,
                        "metrics": info.metrics,
                        "held_out": [row(r) for r in rows],
                        "train_secs": secs,
                    }
                )
    lines.append("")
    lines.append(
        "target: no accepted model whose first pick is worse than the analytical default on "
        f"held-out workloads (and the busy-machine model refused): {'met' if ok else 'MISSED'}"
    )
    report["target_met"] = ok
    text = "\n".join(lines)
    print(text)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(finite(report), indent=1, allow_nan=False) + "\n")
    out_path.with_suffix(".txt").write_text(text + "\n")
    print(f"\nwrote {out_path} and {out_path.with_suffix('.txt').name}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
