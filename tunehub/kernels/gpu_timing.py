"""Timing GPU kernels (imports torch; only GPU run sandboxes and GPU benchmarks load it).

The policy, for every GPU template and the cuBLAS baseline alike:

- warm up (at least three calls, about 25 ms);
- each repeat: flush the L2 by writing a buffer twice its size, *then* record the start
  event, run the kernel, record the end event; the flush is outside the timed region, and
  while the GPU writes it the CPU has time to enqueue the events and the launch, so a slow
  Python launch does not show up as GPU idle time;
- the kernel runs as a CUDA graph replay when it can be captured (one cheap launch, no
  Python in between), else as a plain call;
- repeats until ``min_secs`` of kernel time and at least ``min(10, max_repeats)`` of them, at
  most ``max_repeats``; every repeat is kept, the median is what is compared.

Under ``TRITON_INTERPRET=1`` on a machine without a GPU (the CPU tests) the same calls are
timed with the host clock; those times only prove the path runs.

``check_then_time`` is the path every GPU template and GPU baseline runs a candidate by (check
the output against the reference, then time it, then the record), and ``GpuFailures`` how an
exception on the way becomes a record.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from tunehub.core import MeasureResult, MeasureStatus
from tunehub.kernels.base import DeviceContextLost, TimingPolicy
from tunehub.kernels.machine import watch, watch_gpu

WARMUP_SECS = 0.025
MIN_REPEATS = 10


@dataclass(frozen=True)
class GpuTiming:
    repeat_secs: tuple[float, ...]
    graph: bool  # timed as CUDA graph replays
    flush_bytes: int
    warmup_calls: int
    # The machine's state around the timing (tunehub.kernels.machine): the launching core,
    # and the GPU's clocks and clock-lowering reasons before and after.
    machine: dict[str, Any] = field(default_factory=dict)


def _flush_buffer(device: torch.device) -> torch.Tensor:
    props = torch.cuda.get_device_properties(device)
    l2 = int(getattr(props, "L2_cache_size", 0)) or 50 << 20
    return torch.empty(2 * l2 // 4, dtype=torch.int32, device=device)


def _capture(call: Callable[[], Any], device: torch.device) -> Callable[[], Any] | None:
    """A CUDA graph of one ``call`` (warmed up on a side stream first, as capture wants), or
    None when the call cannot be captured."""
    try:
        stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            call()
        torch.cuda.current_stream(device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            call()
        torch.cuda.synchronize(device)
    except Exception:
        torch.cuda.synchronize(device)
        return None
    return graph.replay


def time_gpu(
    call: Callable[[], Any],
    *,
    min_secs: float,
    max_repeats: int,
    device: torch.device | None = None,
    use_graph: bool = True,
) -> GpuTiming:
    """Time ``call`` (which launches work on the current stream) by the policy above."""
    if device is None or device.type != "cuda":
        with watch() as machine:
            timed = _time_on_host(call, min_secs=min_secs, max_repeats=max_repeats)
        return dataclasses.replace(timed, machine=machine)
    with watch_gpu(_physical_index()) as machine:
        timed = _time_on_device(
            call, min_secs=min_secs, max_repeats=max_repeats, device=device, use_graph=use_graph
        )
    return dataclasses.replace(timed, machine=machine)


def _time_on_device(
    call: Callable[[], Any],
    *,
    min_secs: float,
    max_repeats: int,
    device: torch.device,
    use_graph: bool,
) -> GpuTiming:
    flush = _flush_buffer(device)
    start = time.perf_counter()
    warm = 0
    while warm < 3 or time.perf_counter() - start < WARMUP_SECS:
        call()
        warm += 1
        if warm % 8 == 0:
            torch.cuda.synchronize(device)
    torch.cuda.synchronize(device)
    replay = _capture(call, device) if use_graph else None
    run = replay or call
    secs: list[float] = []
    least = min(MIN_REPEATS, max_repeats)
    batch = 10
    while len(secs) < max_repeats and (len(secs) < least or sum(secs) < min_secs):
        pairs = []
        for _ in range(min(batch, max_repeats - len(secs))):
            flush.zero_()
            begin = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            begin.record()
            run()
            end.record()
            pairs.append((begin, end))
        torch.cuda.synchronize(device)
        secs.extend(b.elapsed_time(e) / 1e3 for b, e in pairs)
    return GpuTiming(tuple(secs), replay is not None, flush.numel() * 4, warm)


def _time_on_host(call: Callable[[], Any], *, min_secs: float, max_repeats: int) -> GpuTiming:
    call()
    secs: list[float] = []
    least = min(3, max_repeats)
    while len(secs) < max_repeats and (len(secs) < least or sum(secs) < min_secs):
        start = time.perf_counter()
        call()
        secs.append(max(time.perf_counter() - start, 1e-9))
    return GpuTiming(tuple(secs), False, 0, 1)


class OutputCheck(Protocol):
    """What the GPU checks answer (``gpu_reference.check``, the conv and attention kernels')."""

    @property
    def ok(self) -> bool: ...
    @property
    def relative_error(self) -> float: ...
    @property
    def tolerance(self) -> float: ...
    @property
    def message(self) -> str: ...


def check_then_time(
    call: Callable[[], Any],
    check: Callable[[Any], OutputCheck],
    *,
    device: torch.device,
    environment: dict[str, Any],
    timing: TimingPolicy,
    compile_secs: float = 0.0,
    first: Callable[[], Any] | None = None,
    called: bool = False,
    since: float | None = None,
    wrong_answer_note: str = "",
) -> MeasureResult:
    """Check ``call``'s output against the reference, then time it by the policy above.

    ``first`` (default ``call``) writes the NaN-poisoned output once and ``check`` is given
    what it returned; together they are ``verify_secs``, counted from ``since`` where the
    caller's own binding belongs to it. ``called``: the caller has run the first call already
    (a compiling launch, its own ``compile_secs``), so only the check is verification. A wrong
    answer is a status (its message followed by ``wrong_answer_note``), never a time.
    ``environment`` gains the check's error and tolerance and the timing's graph, flush and
    machine state. Exceptions pass through, for the caller's ``GpuFailures``.
    """
    start = time.perf_counter() if since is None else since
    got = None
    if not called:
        got = (first or call)()
        _synchronize(device)
    verdict = check(got)
    verify_secs = time.perf_counter() - start
    # A non-finite output has no finite error; the record says None (stored environments are
    # strict JSON, where infinity is not a value) and the message says which element.
    error = verdict.relative_error if math.isfinite(verdict.relative_error) else None
    environment.update(relative_error=error, tolerance=verdict.tolerance)
    if not verdict.ok:
        note = f"; {wrong_answer_note}" if wrong_answer_note else ""
        return MeasureResult(
            MeasureStatus.WRONG_ANSWER,
            error=verdict.message + note,
            compile_secs=compile_secs,
            verify_secs=verify_secs,
            environment=environment,
        )
    start = time.perf_counter()
    timed = time_gpu(call, min_secs=timing.min_secs, max_repeats=timing.max_repeats, device=device)
    run_secs = time.perf_counter() - start
    environment.update(graph=timed.graph, flush_bytes=timed.flush_bytes, machine=timed.machine)
    return MeasureResult(
        MeasureStatus.OK,
        repeat_secs=timed.repeat_secs,
        compile_secs=compile_secs,
        verify_secs=verify_secs,
        run_secs=run_secs,
        environment=environment,
    )


def first_launch_secs(launch: Callable[[], Any], device: torch.device) -> float:
    """Run a kernel's first launch to its end: the seconds it took, its compile included
    where Triton compiles at first launch (its cache keeps the result)."""
    start = time.perf_counter()
    launch()
    _synchronize(device)
    return time.perf_counter() - start


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class GpuFailures:
    """How an exception out of a GPU run becomes its record: a ``runtime_error``, raised as
    ``DeviceContextLost`` where its text says the CUDA context cannot be trusted. The families
    below word theirs a little apart; each keeps its wording, so that old and new records of a
    template read alike."""

    catch: tuple[type[Exception], ...] = (RuntimeError,)
    out_of_memory: bool = True  # "out of GPU memory: ..." for torch.cuda.OutOfMemoryError
    tail: bool = False  # keep the text's last 3000 characters (a compiler names the cause last)
    lost: tuple[str, ...] = ("CUDA error",)  # words that mean the context is poisoned
    compile_secs: bool = True  # whether a runtime error's record keeps compile_secs

    def record(
        self, exc: Exception, environment: dict[str, Any], compile_secs: float = 0.0
    ) -> MeasureResult:
        """The record of ``exc`` (one of ``catch``); raises DeviceContextLost for a lost one."""
        if self.out_of_memory and isinstance(exc, torch.cuda.OutOfMemoryError):
            return MeasureResult(
                MeasureStatus.RUNTIME_ERROR,
                error=f"out of GPU memory: {exc}"[:2000],
                compile_secs=compile_secs,
                environment=environment,
            )
        text = f"{type(exc).__name__}: {exc}"
        failed = MeasureResult(
            MeasureStatus.RUNTIME_ERROR,
            error=text[-3000:] if self.tail else text[:3000],
            compile_secs=compile_secs if self.compile_secs else 0.0,
            environment=environment,
        )
        if any(word in str(exc) for word in self.lost):
            raise DeviceContextLost(failed) from None
        return failed


# The vendor libraries through PyTorch (cuDNN's conv2d, SDPA).
LIBRARY_FAILURES = GpuFailures()
# torch.matmul (cuBLAS): out of memory is worded as any other runtime error.
MATMUL_FAILURES = GpuFailures(out_of_memory=False)
# Kernels compiled before the run (triton.gemm), and the bmm family's run (triton.bmm,
# triton.grouped_mm and their torch baselines): an illegal address poisons the context too.
TRITON_FAILURES = GpuFailures(lost=("CUDA error", "illegal"))
# Kernels compiled by their first launch in the run (triton.conv2d, triton.attention): any
# exception (a compile failure, out of resources) is the config's runtime error.
FIRST_LAUNCH_FAILURES = GpuFailures(
    catch=(Exception,), tail=True, lost=("CUDA error", "illegal"), compile_secs=False
)


def sm_clock_mhz(index: int = 0) -> int | None:
    """The GPU's SM clock now, from NVML, where it can be read (None otherwise)."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        return int(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))
    except Exception:
        return None


def gpu_environment(device: torch.device | None) -> dict[str, Any]:
    """What a GPU measurement records about where it ran: GPU, SM clock, driver and versions."""
    env: dict[str, Any] = {"torch": torch.__version__, "cuda": str(torch.version.cuda or "")}
    with contextlib.suppress(ImportError):
        import triton

        env["triton"] = triton.__version__
    if device is None or device.type != "cuda":
        env["device"] = "cpu (Triton interpreter)" if os.environ.get("TRITON_INTERPRET") else "cpu"
        return env
    props = torch.cuda.get_device_properties(device)
    env.update(
        gpu=props.name,
        compute_capability=f"{props.major}.{props.minor}",
        sm_count=props.multi_processor_count,
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES", ""),
    )
    clock = sm_clock_mhz(_physical_index())
    if clock is not None:
        env["sm_clock_mhz"] = clock
    from tunehub.kernels.cuda_device import _driver_version

    driver = _driver_version()
    if driver:
        env["driver"] = driver
    return env


def run_environment(device: torch.device, *recorded: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """A GPU run's environment and the seed of its fresh operands: ``gpu_environment``, then
    ``recorded`` (the artifact's build facts, a baseline's library), then ``seed``."""
    environment = gpu_environment(device)
    for entries in recorded:
        environment.update(entries)
    seed = secrets.randbits(62)
    environment["seed"] = seed
    return environment, seed


def _physical_index() -> int:
    """NVML counts GPUs of the host; this process sees the one CUDA_VISIBLE_DEVICES names."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    return int(visible) if visible.isdigit() else 0


@contextlib.contextmanager
def tf32(allowed: bool) -> Iterator[None]:
    """cuBLAS's TF32 switch for float32 products, set for the block and restored after."""
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = allowed
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
