"""One best everywhere: a job's best is the schedule the lookup serves for its workload.

A job's fastest single trial is not what compilers get: the lookup serves the Schedule, which a
job's end re-times against the runners-up (the confirmation) and may move to another config
(the issue-23 demo: best trial 310.2 GFLOP/s, confirmed winner 304.9, another config). So the
job list, the job page, ``tunehub jobs``, ``tunehub tune`` and the API's job object all show
the Schedule the lookup answers with for the job's workload, target and template, with its
speedup over the Baseline; until a job confirms it, it is the best trial so far and says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tunehub.core import Job, Target
from tunehub.db.store import ScheduleStore
from tunehub.tuner.lookup import (
    LIBRARY_TIE,
    LookupAnswer,
    LookupQuery,
    baseline_dict,
    find_schedules,
)


def job_bests(
    store: ScheduleStore, jobs: Sequence[Job], targets: Mapping[str, Target | None]
) -> list[LookupAnswer | None]:
    """For each job, the answer the lookup gives for its workload on its target (``targets``
    by key; None for a target not stored) among its template's schedules: None where nothing
    is tuned yet. A bounded number of store reads however many jobs (``find_schedules``)."""
    asked = [(i, targets.get(job.spec.target_key)) for i, job in enumerate(jobs)]
    queries = [
        LookupQuery(jobs[i].spec.workload, target, jobs[i].spec.template)
        for i, target in asked
        if target is not None
    ]
    answers = iter(find_schedules(store, queries))
    return [next(answers) if target is not None else None for _, target in asked]


def best_dict(answer: LookupAnswer) -> dict[str, Any]:
    """The served schedule as a job shows it (the API's ``JobOut.best``): the figure to quote
    (the confirmed median where confirmed), whether it is confirmed, and the Baseline."""
    s = answer.schedule
    c = s.confirmation
    secs = answer.best_secs
    baseline = answer.baseline
    speedup = answer.speedup_vs_baseline
    library = (baseline_dict(baseline) or {}).get("library")
    return {
        "config": s.config.to_dict(),
        "template": s.template,
        "template_version": s.template_version,
        "gflops": answer.workload.gflops(secs),
        "median_secs": secs,
        "confirmed": c is not None,
        "confirmed_spread": c.spread if c else None,
        "confirmed_rounds": c.rounds if c else None,
        "confirmed_at": c.confirmed_at.isoformat() if c else None,
        "library": library,
        "baseline_gflops": baseline.gflops if baseline is not None else None,
        "speedup_vs_baseline": speedup,
        "library_tie": None if speedup is None else answer.library_tie,
        "baseline_faster": answer.baseline_faster,
        "source": answer.source,
        "record_id": s.record_uid,
        "target_key": s.target_key,
    }


def best_line(best: Mapping[str, Any] | None, workload_label: str, target_label: str) -> str:
    """One human line for a best (``best_dict``'s shape, or the API's ``best``), e.g.
    ``matmul 256x256x256 float32 on cpu AMD EPYC x2: 304.9 GFLOP/s, 1.12x OpenBLAS 0.3.21
    (blis.gemm MR=6 NR=64 ...)``; the best trial so far says it is unconfirmed.

    >>> print(best_line({"gflops": 304.94, "speedup_vs_baseline": 1.123, "library": "OpenBLAS",
    ...                  "template": "blis.gemm", "config": {"MR": 6, "NR": 64},
    ...                  "confirmed": True}, "matmul 256", "cpu AMD EPYC x2 [avx2]"))
    matmul 256 on cpu AMD EPYC x2: 304.9 GFLOP/s, 1.12x OpenBLAS (blis.gemm MR=6 NR=64)
    >>> print(best_line({"gflops": 714.1, "speedup_vs_baseline": 1.069, "library": "cuBLAS",
    ...                  "library_tie": 1.077, "template": "t", "config": {"v": 1},
    ...                  "confirmed": True}, "mm", "H100"))
    mm on H100: 714.1 GFLOP/s, 1.07x cuBLAS: a tie (within the rounds' 7.7% spread), use ...
    """
    where = f"{workload_label} on {target_label.split(' [')[0]}"
    if not best:
        return f"{where}: nothing measured ok yet"
    knobs = " ".join(f"{k}={v}" for k, v in best["config"].items())
    parts = [f"{best['gflops']:.1f} GFLOP/s"]
    speedup = best.get("speedup_vs_baseline")
    if speedup is not None:
        library = best.get("library") or "the library"
        tie = best.get("library_tie") or LIBRARY_TIE
        noise = f" (within the rounds' {tie - 1:.1%} spread)" if tie > LIBRARY_TIE else ""
        verdict = (
            "" if speedup >= tie else f": a tie{noise}, use the library" if speedup >= 1
            else ": the library is faster, use it"
        )  # fmt: skip
        parts.append(f"{speedup:.2f}x {library}{verdict}")
    line = f"{where}: {', '.join(parts)} ({best['template']} {knobs})"
    if not best.get("confirmed"):
        line += "; best trial so far (unconfirmed)"
    return line
