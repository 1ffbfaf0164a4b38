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
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

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
