"""Timing in Python with the policy of the generated C timing loop, for library baselines, and
the check-then-time path of the CPU library baselines (``measure_library_call``)."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tunehub.core import MeasureResult, MeasureStatus
from tunehub.kernels.base import TimingPolicy
from tunehub.kernels.machine import watch

# Same defaults as blis.gemm's C loop (tunehub_bench), so both sides are timed alike.
MIN_REPEATS = 3
MAX_WARMUP_SECS = 0.1
MIN_REPEAT_SECS = 2e-4


def warmup_secs(min_secs: float) -> float:
    """How long to warm up before timing: a quarter of the timing, at most MAX_WARMUP_SECS."""
    return min(MAX_WARMUP_SECS, max(min_secs / 4, 0.0))


def repeat_min_secs(min_secs: float, max_repeats: int) -> float:
    """How long one repeat lasts at least (tiny calls are batched into it)."""
    return max(MIN_REPEAT_SECS, min_secs / max(max_repeats, 1))


@dataclass(frozen=True)
class Timing:
    repeat_secs: tuple[float, ...]  # seconds per call, one entry per repeat
    calls_per_repeat: int


def time_calls(
    call: Callable[[], object],
    *,
    min_secs: float,
    max_repeats: int,
    min_repeats: int = MIN_REPEATS,
) -> Timing:
    """Time ``call`` as ``tunehub_bench`` times a generated kernel.

    Cache policy: warm (the caller passes the same inputs and output every call). Warm up for
    ``min(0.1 s, min_secs / 4)`` (at least one call); a repeat is enough back-to-back calls to
    last ``max(2e-4 s, min_secs / max_repeats)``, reported per call; repeats continue until
    ``min_secs`` in total and at least ``min(min_repeats, max_repeats)`` of them, at most
    ``max_repeats``. ``time.perf_counter`` is the monotonic clock; Python's call overhead
    (about a microsecond) is inside the timed region, as the ctypes-free C loop's is not, which
    favours neither side noticeably for GEMMs of 10 µs or more.
    """
    if max_repeats < 1:
        raise ValueError("max_repeats must be at least 1")
    warmup = warmup_secs(min_secs)
    repeat_min = repeat_min_secs(min_secs, max_repeats)
    clock = time.perf_counter
    start = clock()
    warm = 0
    while True:
        call()
        warm += 1
        elapsed = clock() - start
        if elapsed >= warmup:
            break
    per_call = elapsed / warm
    calls = int(repeat_min / per_call) + 1 if 0 < per_call < repeat_min else 1
    secs: list[float] = []
    total = 0.0
    min_repeats = min(min_repeats, max_repeats)
    while len(secs) < max_repeats and (len(secs) < min_repeats or total < min_secs):
        s = clock()
        for _ in range(calls):
            call()
        e = clock() - s
        secs.append(e / calls)
        total += e
    return Timing(tuple(secs), calls)


def current_cpu() -> int | None:
    """The CPU the calling thread runs on now (Linux), or None where that cannot be read."""
    try:
        stat = Path("/proc/thread-self/stat").read_text()
    except OSError:
        return None
    # Field 39 ("processor"), counted after the parenthesised command name, which may hold spaces.
    fields = stat.rpartition(")")[2].split()
    try:
        return int(fields[36])
    except (IndexError, ValueError):
        return None


@contextlib.contextmanager
def pinned_to_current_cpu() -> Iterator[int | None]:
    """Pin the calling thread to the CPU it is on, as the generated C loop pins a single-threaded
    kernel, and restore its affinity afterwards. Yields the CPU, or None if pinning failed."""
    cpu = current_cpu()
    if cpu is None or not hasattr(os, "sched_setaffinity"):
        yield None
        return
    saved = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {cpu})
    except OSError:
        yield None
        return
    try:
        yield cpu
    finally:
        os.sched_setaffinity(0, saved)


@dataclass(frozen=True)
class LibraryCheck:
    """A CPU baseline's output against the reference: the verdict, and what the environment
    records of it (``recorded`` whatever the verdict, ``recorded_if_ok`` only when it passed)."""

    ok: bool
    message: str
    recorded: dict[str, Any] = field(default_factory=dict)
    recorded_if_ok: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of_sampled(cls, outcome: tuple[bool, int, float, float, str]) -> LibraryCheck:
        """From ``check_bmm``'s and ``check_conv``'s (ok, rows, max abs error, max error
        ratio, message)."""
        ok, rows, max_abs, max_ratio, message = outcome
        return cls(
            ok,
            message,
            {"verify_rows": rows},
            {"max_abs_err": max_abs, "max_err_ratio": max_ratio},
        )


def measure_library_call(
    call: Callable[[], object],
    check: Callable[[], LibraryCheck],
    *,
    environment: dict[str, Any],
    seed: int,
    threads: int,
    timing: TimingPolicy,
    first: Callable[[], object] | None = None,
) -> MeasureResult:
    """Check, then time, a CPU library baseline's ``call``, as ``blis.gemm`` checks and times
    its kernel: ``first`` (default ``call``) writes the NaN-poisoned output once and ``check``
    compares it with the reference (together, ``verify_secs``); a wrong answer is a status;
    then ``time_calls`` with warm caches, pinned to one CPU when single-threaded, the machine
    watched around it. The caller sets the library's thread count around this call.
    ``environment`` (the caller's, host and library already in it) gains the seed, the
    threads, the check's entries and the timing's."""
    start = time.perf_counter()
    (first or call)()
    verdict = check()
    verify_secs = time.perf_counter() - start
    environment.update(seed=seed, threads=threads)
    environment.update(verdict.recorded)
    if not verdict.ok:
        return MeasureResult(
            MeasureStatus.WRONG_ANSWER,
            error=verdict.message,
            verify_secs=verify_secs,
            environment=environment,
        )
    environment.update(verdict.recorded_if_ok)
    # One thread is pinned while timed, as blis.gemm's C loop pins its kernel.
    pin = pinned_to_current_cpu() if threads == 1 else contextlib.nullcontext(None)
    with pin as cpu, watch() as machine:
        start = time.perf_counter()
        timed = time_calls(call, min_secs=timing.min_secs, max_repeats=timing.max_repeats)
        run_secs = time.perf_counter() - start
    environment.update(calls_per_repeat=timed.calls_per_repeat, pinned_cpu=cpu, machine=machine)
    return MeasureResult(
        MeasureStatus.OK,
        repeat_secs=timed.repeat_secs,
        verify_secs=verify_secs,
        run_secs=run_secs,
        environment=environment,
    )
