"""Nsight Compute for the GPU probes: run a probe's child under ``ncu`` and print what matters.

A probe (``gpu_profile.py``, ``gpu_streamk.py``, ``gpu_atomic.py``) re-runs itself as a child
under ``ncu`` with ``--profile-from-start off``: the child compiles and warms its kernels, then
launches the ones to profile between ``cudaProfilerStart``/``Stop``. Clocks are left alone
(``--clock-control none``, as in the timed runs) and caches flushed between kernels (ncu's
default), so the DRAM figures are those of a cold L2, like the benchmarks' timing.
"""

from __future__ import annotations

import csv
import io
import subprocess
import sys
import time
from pathlib import Path

SECTIONS = ("SpeedOfLight", "LaunchStats", "Occupancy", "MemoryWorkloadAnalysis",
            "WarpStateStats", "SchedulerStats")  # fmt: skip
# The metrics ``summarize`` prints (a metric is printed where its name contains one of these).
WANT = (
    "Duration",
    "Registers Per Thread",
    "Dynamic Shared Memory Per Block",
    "Achieved Occupancy",
    "Throughput",
    "L2 Hit Rate",
    "Executed Instructions",
    "Warp Cycles Per Issued Instruction",
    "Issued Warp Per Scheduler",
    "Eligible Warps Per Scheduler",
    "Grid Size",
)


def find_ncu() -> str:
    for cand in ("/usr/local/cuda/bin/ncu", "/opt/nvidia/nsight-compute/2025.3.1/ncu"):
        if Path(cand).exists():
            return cand
    return "ncu"


def profile(
    script: str,
    child_args: list[str],
    kernels: str,
    csv_out: Path,
    *,
    sections: tuple[str, ...] = SECTIONS,
    timeout: float = 300,
) -> int:
    """Run ``python script *child_args`` under ncu, profiling the kernels whose names match the
    regex ``kernels``; write ncu's CSV to ``csv_out`` (its stderr beside it where it failed),
    print a summary and return ncu's exit status."""
    cmd = [find_ncu(), "--clock-control", "none", "--profile-from-start", "off", "--csv",
           "--page", "details", "-k", f"regex:{kernels}"]  # fmt: skip
    for section in sections:
        cmd += ["--section", section]
    cmd += [sys.executable, script, *child_args]
    start = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    csv_out.parent.mkdir(parents=True, exist_ok=True)
    csv_out.write_text(done.stdout)
    if done.returncode:
        csv_out.with_suffix(".err").write_text(done.stderr[-20000:])
        print(done.stderr[-3000:])
    print(f"# ncu rc={done.returncode} in {time.monotonic() - start:.0f} s, "
          f"{len(done.stdout.splitlines())} CSV lines -> {csv_out.name}")  # fmt: skip
    summarize(done.stdout)
    return done.returncode


def summarize(text: str, want: tuple[str, ...] = WANT) -> None:
    """Print the telling metrics of each profiled launch from ncu's CSV (rows carry fewer
    fields than the header where no rule fired)."""
    rows = list(csv.reader(io.StringIO(text[text.find('"ID"') :])))
    if not rows:
        return
    idx = {h: i for i, h in enumerate(rows[0])}
    launches: dict[str, dict[str, str]] = {}
    for r in rows[1:]:
        if len(r) <= idx["Metric Value"]:
            continue
        key = f"{r[idx['ID']]} {r[idx['Kernel Name']][:60]}"
        unit = r[idx["Metric Unit"]] if "Metric Unit" in idx else ""
        launches.setdefault(key, {})[r[idx["Metric Name"]]] = f"{r[idx['Metric Value']]} {unit}"
    for key, metrics in launches.items():
        print(key)
        for name, value in metrics.items():
            if any(w in name for w in want):
                print(f"    {name:>44} {value.strip()}")


if __name__ == "__main__":
    # python3 benchmarks/probes/ncu.py FILE.csv: summarise a CSV written earlier.
    for path in sys.argv[1:]:
        print(f"== {path}")
        summarize(Path(path).read_text())
