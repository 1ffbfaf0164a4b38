"""The machine's state around a timing: who else ran on the timed cores, steal, load, GPU clocks.

A timing is only as good as the machine was quiet while it ran. ``watch`` samples the kernel's
counters before and after the timed region and says, as plain JSON for the record's
``environment["machine"]``:

- ``own_wait_secs``: how long this process's threads were ready to run but waited for a CPU
  (``/proc/self/task/*/schedstat``, nanoseconds). The direct signal: a 2-thread kernel whose
  threads sync every few microseconds loses far more than this time when one of them waits
  (its partner spins or sleeps meanwhile), so a timing where ``wait_share`` is more than a few
  percent is not the config's speed;
- ``others_cpu_secs``: CPU time spent on the timed cores by anything but this process (the
  cores' busy ticks from ``/proc/stat`` less this process's own CPU time; tick resolution,
  10 ms on most kernels);
- ``steal_secs``: time the hypervisor gave the timed cores' vCPUs to someone else;
- ``load1`` and ``procs_running`` before and after (``/proc/loadavg``, ``/proc/stat``);
- where the timing loop reads its threads' CPU clocks around each repeat (blis.gemm's C loop,
  ``repeat_off_cpu``): each repeat's largest share one of them spent off its CPU, and how
  many were ``clean_repeats`` (at most ``CLEAN_REPEAT_OFF_CPU_SHARE``). Beside one busy
  process on a 2-core VM, the 2-thread blis.gemm repeats whose threads waited under 1% of
  the time ran at 192-198 GFLOP/s, 4% at 183, 9% at 160, 25% at 100, and over half the time
  at 0.3-7: a clean repeat is the config's time, and a median over mostly clean repeats is a
  clean repeat's;
- on a GPU (``gpu_state``): SM and memory clocks and the reasons NVML gives for lowering them.

Every reading is best-effort: where a file or NVML is missing the field is absent, never a
made-up value. Reading everything costs tens of microseconds.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_TICK_SECS = 1.0 / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)
# A repeat whose threads were each off their CPU at most this share of it is clean.
CLEAN_REPEAT_OFF_CPU_SHARE = 0.02
_PROC = Path("/proc")


@dataclass(frozen=True)
class CpuSnapshot:
    """The counters ``watch`` compares (see the module docstring)."""

    at: float  # time.perf_counter()
    own_cpu_secs: float  # this process, every thread, also those that exited
    own_wait_secs: float | None  # run-queue wait of this process's live threads
    busy_ticks: dict[int, int] = field(default_factory=dict)  # per core: user..softirq
    steal_ticks: dict[int, int] = field(default_factory=dict)
    procs_running: int | None = None
    load1: float | None = None


def _own_wait_secs() -> float | None:
    total = 0
    try:
        tasks = os.listdir(_PROC / "self" / "task")
    except OSError:
        return None
    for tid in tasks:
        try:
            fields = (_PROC / "self" / "task" / tid / "schedstat").read_text().split()
            total += int(fields[1])
        except (OSError, IndexError, ValueError):
            continue  # a thread that exited meanwhile
    return total / 1e9


def _proc_stat() -> tuple[dict[int, int], dict[int, int], int | None]:
    busy: dict[int, int] = {}
    steal: dict[int, int] = {}
    running = None
    try:
        text = (_PROC / "stat").read_text()
    except OSError:
        return busy, steal, running
    for line in text.splitlines():
        if line.startswith("cpu") and len(line) > 3 and line[3].isdigit():
            name, *values = line.split()
            try:
                ticks = [int(v) for v in values]
                core = int(name[3:])
            except ValueError:
                continue
            # user nice system idle iowait irq softirq steal ...
            busy[core] = sum(ticks[0:3]) + sum(ticks[5:7])
            steal[core] = ticks[7] if len(ticks) > 7 else 0
        elif line.startswith("procs_running"):
            with contextlib.suppress(ValueError, IndexError):
                running = int(line.split()[1])
    return busy, steal, running


def _load1() -> float | None:
    try:
        return float((_PROC / "loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def snapshot() -> CpuSnapshot:
    """The counters now."""
    busy, steal, running = _proc_stat()
    return CpuSnapshot(
        at=time.perf_counter(),
        own_cpu_secs=time.process_time(),
        own_wait_secs=_own_wait_secs(),
        busy_ticks=busy,
        steal_ticks=steal,
        procs_running=running,
        load1=_load1(),
    )


def _share(secs: float, wall: float, cores: int) -> float:
    return round(max(0.0, secs) / (wall * cores), 4) if wall > 0 and cores > 0 else 0.0


def compare(before: CpuSnapshot, after: CpuSnapshot, cores: Sequence[int]) -> dict[str, Any]:
    """What happened on ``cores`` between two snapshots (JSON-friendly; see the module
    docstring). ``*_share`` fields are fractions of the timed cores' wall time."""
    wall = after.at - before.at
    own = after.own_cpu_secs - before.own_cpu_secs
    timed = [c for c in cores if c in before.busy_ticks and c in after.busy_ticks]
    n = max(1, len(cores))
    state: dict[str, Any] = {
        "cores": list(cores),
        "wall_secs": round(wall, 6),
        "own_cpu_secs": round(own, 6),
    }
    if before.own_wait_secs is not None and after.own_wait_secs is not None:
        # A thread that exited in between takes its waits along; never below zero.
        wait = max(0.0, after.own_wait_secs - before.own_wait_secs)
        state.update(own_wait_secs=round(wait, 6), wait_share=_share(wait, wall, n))
    if timed:
        busy = sum(after.busy_ticks[c] - before.busy_ticks[c] for c in timed) * _TICK_SECS
        steal = sum(after.steal_ticks[c] - before.steal_ticks[c] for c in timed) * _TICK_SECS
        others = max(0.0, busy - own)
        state.update(
            others_cpu_secs=round(others, 4),
            others_share=_share(others, wall, n),
            steal_secs=round(steal, 4),
            steal_share=_share(steal, wall, n),
        )
    if before.load1 is not None:
        state["load1"] = before.load1
    if before.procs_running is not None:
        state["procs_running_before"] = before.procs_running
    if after.procs_running is not None:
        state["procs_running_after"] = after.procs_running
    return state


def repeat_off_cpu(shares: Sequence[float | None]) -> dict[str, Any]:
    """Each repeat's largest share of it one of the timing's threads spent off its CPU, and
    how many repeats were clean (``{}`` when the timing loop could not read them)."""
    if not shares or any(s is None for s in shares):
        return {}
    rounded = [round(max(0.0, s or 0.0), 4) for s in shares]
    return {
        "repeat_off_cpu_shares": rounded,
        "clean_repeats": sum(1 for s in rounded if s <= CLEAN_REPEAT_OFF_CPU_SHARE),
        "repeats": len(rounded),
    }


def timed_cores() -> tuple[int, ...]:
    """The cores this process may run on (those a timing here occupies)."""
    if hasattr(os, "sched_getaffinity"):
        return tuple(sorted(os.sched_getaffinity(0)))
    return tuple(range(os.cpu_count() or 1))


@contextlib.contextmanager
def watch(cores: Sequence[int] | None = None) -> Iterator[dict[str, Any]]:
    """Sample the machine around the ``with`` body; the yielded dict is filled on exit.

    >>> with watch() as state:
    ...     pass
    >>> "wall_secs" in state
    True
    """
    chosen = tuple(cores) if cores is not None else timed_cores()
    state: dict[str, Any] = {}
    before = snapshot()
    try:
        yield state
    finally:
        state.update(compare(before, snapshot(), chosen))


# --- GPUs ----------------------------------------------------------------------------------------
# NVML's clock-event reason bits (nvmlClocksEventReason*); the names say why the clocks are low.
GPU_CLOCK_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
# Reasons that mean the GPU ran slower than it can for reasons outside the kernel (heat, power
# brake, another clock setting): a timing taken under them is not the config's speed. The power
# cap is not one of them: a big GEMM reaches it by itself, and it is part of its speed.
GPU_DISTURBING_REASONS = (
    "hw_slowdown",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
)


def gpu_state(index: int | None = None, nvml: Any = None) -> dict[str, Any]:
    """Clocks, temperature, clock-lowering reasons and other processes of a GPU, via NVML
    (``pynvml``, passed in or imported); ``{}`` where NVML is not there. ``index`` is the
    NVML index (default: the first visible device)."""
    if nvml is None:
        try:
            import pynvml
        except ImportError:
            return {}
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except Exception:
        return {}
    state: dict[str, Any] = {}
    try:
        if index is None:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
            index = int(visible) if visible.isdigit() else 0
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        readings: dict[str, Callable[[], Any]] = {
            "sm_clock_mhz": lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM),
            "mem_clock_mhz": lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM),
            "max_sm_clock_mhz": lambda: nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM),
            "temperature_c": lambda: nvml.nvmlDeviceGetTemperature(
                handle, nvml.NVML_TEMPERATURE_GPU
            ),
            "other_processes": lambda: sum(
                1 for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle) if p.pid != os.getpid()
            ),
        }
        for name, read in readings.items():
            with contextlib.suppress(Exception):
                state[name] = int(read())
        with contextlib.suppress(Exception):
            getter: Any = (
                getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
                or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
            )
            bits = int(getter(handle))
            state["clock_reasons"] = [n for b, n in GPU_CLOCK_REASONS.items() if bits & b]
    except Exception:
        pass
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()
    return state


@contextlib.contextmanager
def watch_gpu(index: int | None = None, nvml: Any = None) -> Iterator[dict[str, Any]]:
    """``watch`` for a GPU timing: the launching thread's core as above, and the GPU's state
    before and after (``gpu_before`` / ``gpu_after``), where NVML can be read."""
    before = gpu_state(index, nvml)
    with watch() as state:
        yield state
    after = gpu_state(index, nvml)
    if before:
        state["gpu_before"] = before
    if after:
        state["gpu_after"] = after
