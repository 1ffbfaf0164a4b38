"""The trust guard: whether a timing is stored as the config's speed, re-measured later, or noisy.

Every timing carries the machine's state around it (``environment["machine"]``, see
``tunehub.kernels.machine``; a template that does not watch its timed region gets its whole run
watched, ``scope: run``, which is recorded but not judged). The guard judges each attempt twice:

- *disturbed*: the machine says the timing is not the config's speed. On a 2-core VM a
  2-thread blis.gemm beside one busy process ran at 0.9-3.6 GFLOP/s where it runs at 180-200,
  every repeat alike, so neither the median nor the repeats' spread shows it; but its threads
  waited for a CPU. Over the whole timing, a timing on two or more cores (threads that meet
  at barriers) is suspect when they waited more than ``max_wait_share``; a one-core timing
  survives waits (its short repeats are preempted whole and the median skips them), so only
  waiting most of the time makes it suspect. Where the timing loop read its threads' CPU
  clocks around each repeat (``clean_repeats`` of ``repeats``), a suspect timing is still
  trusted when most repeats were clean: then the median is a clean repeat's. Steal time, and
  a GPU whose clocks were lowered by heat or a power brake, disturb too.
- *far off*: slower than what the same config measured before (``same_config_factor``), than
  the cost model predicted (``predicted_factor``), or than its measured neighbours
  (``neighbour_factor``) — wide factors: a re-measure is cheap, a wrong record is not.

A clean attempt that is not far off is accepted. A clean attempt that is far off is accepted
once another clean attempt agrees with it (within ``agree``): it is the config's real speed.
Anything else is re-measured later, interleaved with other work (``retry_after_secs``), up to
``max_attempts``; a config that has not settled by then is ``noisy``, with the reason, and
each attempt's time and machine state in ``environment["guard"]``.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from tunehub.core import MeasureResult, MeasureStatus
from tunehub.kernels.machine import GPU_DISTURBING_REASONS


@dataclass(frozen=True)
class GuardPolicy:
    """The guard's thresholds (see the module docstring)."""

    max_wait_share: float = 0.05  # timings on 2+ cores
    max_wait_share_one_core: float = 0.5
    max_steal_share: float = 0.10
    same_config_factor: float = 1.5
    predicted_factor: float = 4.0
    neighbour_factor: float = 4.0
    agree: float = 0.15
    max_attempts: int = 4
    # Before the 2nd, 3rd, 4th… attempt (the last value repeats): long enough for a build or a
    # burst of other work to pass, and the attempts spread over a quarter of a minute.
    retry_after_secs: tuple[float, ...] = (1.0, 3.0, 9.0)

    def delay(self, attempts: int) -> float:
        """How long to wait before the next attempt, after ``attempts`` of them."""
        if not self.retry_after_secs:
            return 0.0
        return self.retry_after_secs[min(attempts, len(self.retry_after_secs)) - 1]


@dataclass(frozen=True)
class References:
    """What a config's time is compared with: its own earlier times, the model's estimate,
    its measured neighbours' times (seconds)."""

    same_config_secs: tuple[float, ...] = ()
    predicted_secs: float | None = None
    neighbour_secs: tuple[float, ...] = ()


def disturbance(result: MeasureResult, policy: GuardPolicy | None = None) -> str | None:
    """Why the machine's state makes ``result``'s timing untrustworthy (None: it does not, or
    the result records no machine state)."""
    policy = policy or GuardPolicy()
    machine = result.environment.get("machine")
    if not isinstance(machine, Mapping) or machine.get("scope") == "run":
        # None recorded; or only around the whole run (a template that does not watch its
        # timed region): its reference check and set-up would be judged with the timing.
        return None
    reasons = []
    cores = len(machine.get("cores") or ()) or 1
    wait = _number(machine.get("wait_share"))
    others = _number(machine.get("others_share"))
    busy = f", other processes took {others:.0%} of them" if others is not None else ""
    clean, repeats = _number(machine.get("clean_repeats")), _number(machine.get("repeats"))
    limit = policy.max_wait_share if cores > 1 else policy.max_wait_share_one_core
    if wait is not None and wait > limit:
        if clean is not None and repeats:
            # Each repeat is known: the median is a clean repeat's when most are clean. (A
            # repeat whose threads slept, as passive OpenMP waiting does, is not clean either;
            # but without waits for a CPU over the timing, that sleep was the kernel's own.)
            if clean <= repeats / 2:
                reasons.append(
                    f"only {clean:.0f} of {repeats:.0f} repeats had every thread on its CPU; "
                    f"they waited for one {wait:.0%} of the time on {cores} timed core(s){busy}"
                )
        else:
            reasons.append(
                f"its threads waited for a CPU {wait:.0%} of the time on {cores} timed "
                f"core(s){busy}"
            )
    steal = _number(machine.get("steal_share"))
    if steal is not None and steal > policy.max_steal_share:
        reasons.append(f"the hypervisor stole {steal:.0%} of the timed cores")
    lowered = sorted(
        {
            reason
            for key in ("gpu_before", "gpu_after")
            for reason in (machine.get(key) or {}).get("clock_reasons", ())
            if reason in GPU_DISTURBING_REASONS
        }
    )
    if lowered:
        reasons.append(f"the GPU's clocks were lowered ({', '.join(lowered)})")
    return "; ".join(reasons) or None


def far_off(secs: float, refs: References, policy: GuardPolicy | None = None) -> str | None:
    """Why ``secs`` is too slow to believe at once, given ``refs`` (None: it is not)."""
    policy = policy or GuardPolicy()
    reasons = []
    if refs.same_config_secs:
        ref = statistics.median(refs.same_config_secs)
        if secs > policy.same_config_factor * ref:
            reasons.append(f"{secs / ref:.1f}x slower than the same config measured before")
    if refs.predicted_secs and secs > policy.predicted_factor * refs.predicted_secs:
        reasons.append(f"{secs / refs.predicted_secs:.1f}x slower than the model predicted")
    if refs.neighbour_secs:
        ref = statistics.median(refs.neighbour_secs)
        if secs > policy.neighbour_factor * ref:
            reasons.append(
                f"{secs / ref:.1f}x slower than its {len(refs.neighbour_secs)} measured "
                "neighbour(s)"
            )
    return "; ".join(reasons) or None


@dataclass(frozen=True)
class Attempt:
    """One timing of a config, as the guard saw it."""

    result: MeasureResult
    disturbed: str | None = None
    far: str | None = None

    @property
    def ok(self) -> bool:
        return self.result.status is MeasureStatus.OK and self.result.median_secs is not None

    @property
    def clean(self) -> bool:
        return self.ok and self.disturbed is None

    @property
    def reason(self) -> str:
        return "; ".join(r for r in (self.disturbed, self.far) if r)

    def to_json(self) -> dict[str, Any]:
        machine = self.result.environment.get("machine")
        summary: dict[str, Any] = {"status": self.result.status.value}
        if self.result.median_secs is not None:
            summary["median_secs"] = self.result.median_secs
        if self.disturbed:
            summary["disturbed"] = self.disturbed
        if self.far:
            summary["far_off"] = self.far
        if isinstance(machine, Mapping):
            summary["machine"] = dict(machine)
        return summary


Action = Literal["accept", "retry", "noisy"]


@dataclass(frozen=True)
class Decision:
    """What to do with a config's attempts: ``accept`` stores ``result`` (the attempt that
    settled, with the guard's notes); ``retry`` measures again after ``retry_after_secs``;
    ``noisy`` stores ``result``, a ``noisy`` result with the reason."""

    action: Action
    result: MeasureResult
    reason: str = ""
    retry_after_secs: float = 0.0
    attempts: tuple[Attempt, ...] = field(default=())


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _agree(a: float, b: float, tolerance: float) -> bool:
    return abs(a - b) <= tolerance * min(a, b)


def assess(result: MeasureResult, refs: References, policy: GuardPolicy | None = None) -> Attempt:
    """One attempt, judged (see the module docstring)."""
    policy = policy or GuardPolicy()
    if result.status is not MeasureStatus.OK or result.median_secs is None:
        return Attempt(result)
    return Attempt(result, disturbance(result, policy), far_off(result.median_secs, refs, policy))


def judge(
    results: Sequence[MeasureResult], refs: References, policy: GuardPolicy | None = None
) -> Decision:
    """Decide on a config's attempts so far (oldest first; at least one)."""
    policy = policy or GuardPolicy()
    if not results:
        raise ValueError("judge needs at least one attempt")
    attempts = tuple(assess(r, refs, policy) for r in results)
    last = attempts[-1]
    if not last.ok:  # a failure is a verdict (or the machine's, which says so itself)
        return Decision("accept", _noted(last.result, attempts, ""), attempts=attempts)
    if last.clean:
        agreeing = [
            a
            for a in attempts[:-1]
            if a.clean
            and _agree(a.result.median_secs or 0.0, last.result.median_secs or 0.0, policy.agree)
        ]
        if last.far is None or agreeing:
            first = next((a.reason for a in attempts if a.reason), "")
            return Decision("accept", _noted(last.result, attempts, first), attempts=attempts)
    if len(attempts) >= policy.max_attempts:
        return noisy(attempts, f"did not settle in {len(attempts)} attempts")
    return Decision(
        "retry",
        last.result,
        reason=last.reason or "its times disagree",
        retry_after_secs=policy.delay(len(attempts)),
        attempts=attempts,
    )


def noisy(attempts: Sequence[Attempt], why: str) -> Decision:
    """The ``noisy`` decision for attempts that did not settle, ``why`` leading the reason."""
    if not attempts:
        raise ValueError("noisy needs at least one attempt")
    details = []
    for attempt in attempts:
        secs = attempt.result.median_secs
        time = f"{secs:.4g}s" if secs is not None else attempt.result.status.value
        details.append(f"{time} ({attempt.reason or 'clean'})")
    reason = f"{why}: " + "; ".join(details)
    last = attempts[-1].result
    result = MeasureResult(
        MeasureStatus.NOISY,
        error=reason,
        compile_secs=last.compile_secs,
        verify_secs=last.verify_secs,
        run_secs=sum(a.result.run_secs for a in attempts),
        environment={**last.environment, "guard": _notes(attempts, reason)},
    )
    return Decision("noisy", result, reason=reason, attempts=tuple(attempts))


def _notes(attempts: Sequence[Attempt], reason: str) -> dict[str, Any]:
    notes: dict[str, Any] = {"attempts": len(attempts)}
    if reason:
        notes["reason"] = reason
    if len(attempts) > 1 or reason:
        notes["tried"] = [a.to_json() for a in attempts]
    return notes


def _noted(result: MeasureResult, attempts: Sequence[Attempt], reason: str) -> MeasureResult:
    return MeasureResult(
        result.status,
        repeat_secs=result.repeat_secs,
        error=result.error,
        compile_secs=result.compile_secs,
        verify_secs=result.verify_secs,
        run_secs=result.run_secs,
        environment={**result.environment, "guard": _notes(attempts, reason)},
    )
