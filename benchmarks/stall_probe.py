"""Where a serving process's time goes under load: a ``sitecustomize`` for a served tree (issue
27's uncached-lookup tail; docs/benchmarks.md).

Copy it as ``sitecustomize.py`` into the root of a tree that ``lookup_uncached.py --tree``
serves (``git archive HEAD | tar -x -C /tmp/probe && cp benchmarks/stall_probe.py
/tmp/probe/sitecustomize.py``) and set ``STALL_PROBE_DIR`` to a directory: every process of
that tree then writes ``<pid>.json`` there every second and at exit (a worker process that
uvicorn stops may end without its exit handlers: its figures are then those of its last
write), holding

- ``gc``: each collection over 2 ms (time, generation, ms) and counts and ms by generation;
- ``stall``: each time the event loop woke more than 5 ms late from a 2 ms sleep (time, ms
  late, and the loop thread's ms running and ms runnable but waiting for a core meanwhile,
  from ``/proc/thread-self/schedstat``: the rest was waiting for the interpreter or the
  kernel);
- ``req_hist``: ``FastMiss``'s time per answer, answers by whole ms (100: 100 ms or more);
- ``mmap_slow``: each multiprocess-metrics ``mmap`` write over 2 ms;
- ``sched``: each thread's ms running and waiting for a core so far.

Only for measuring: it wraps ``FastMiss.__call__`` and ``MmapedDict.write_value`` and adds a
thread and a task of its own (whose cost shows in the figures).
"""

from __future__ import annotations

import asyncio
import atexit
import gc
import importlib.abc
import importlib.machinery
import json
import os
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from time import perf_counter
from types import ModuleType
from typing import Any

DIR = os.environ.get("STALL_PROBE_DIR")
DATA: dict[str, Any] = {
    "pid": os.getpid(),
    "argv": sys.argv,
    "gc": [],
    "gc_count": {0: 0, 1: 0, 2: 0},
    "gc_ms": {0: 0.0, 1: 0.0, 2: 0.0},
    "stall": [],
    "req_n": 0,
    "req_hist": {},
    "mmap_n": 0,
    "mmap_slow": [],
}
_gc_started = [0.0]
_loop_watched = [False]


def _on_gc(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _gc_started[0] = perf_counter()
        return
    ms = (perf_counter() - _gc_started[0]) * 1e3
    generation = info["generation"]
    DATA["gc_count"][generation] += 1
    DATA["gc_ms"][generation] += ms
    if ms > 2:
        DATA["gc"].append((time.time(), generation, round(ms, 2)))


def _threads() -> dict[str, dict[str, float]]:
    found = {}
    for tid in os.listdir(f"/proc/{os.getpid()}/task"):
        try:
            stat = Path(f"/proc/{os.getpid()}/task/{tid}/schedstat").read_text()
            run, wait, _ = stat.split()
        except OSError:
            continue
        found[tid] = {"run_ms": int(run) / 1e6, "wait_ms": int(wait) / 1e6}
    return found


def _dump() -> None:
    DATA["sched"] = _threads()
    DATA["gc_frozen"] = gc.get_freeze_count()
    try:
        with open(os.path.join(str(DIR), f"{os.getpid()}.json"), "w") as out:
            json.dump(DATA, out)
    except OSError:
        pass


def _dump_every(secs: float) -> None:
    while True:
        time.sleep(secs)
        _dump()


async def _watch_loop() -> None:
    fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)

    def sched() -> tuple[float, float]:
        run, wait, _ = os.pread(fd, 100, 0).split()
        return int(run) / 1e6, int(wait) / 1e6

    while True:
        run0, wait0 = sched()
        started = perf_counter()
        await asyncio.sleep(0.002)
        late = (perf_counter() - started) * 1e3 - 2
        if late > 5:
            run1, wait1 = sched()
            DATA["stall"].append(
                (time.time(), round(late, 2), round(run1 - run0, 2), round(wait1 - wait0, 2))
            )


def _wrap_fast_miss(module: ModuleType) -> None:
    original = module.FastMiss.__call__

    async def timed(self: Any, scope: Any, receive: Any, send: Any) -> None:
        if not _loop_watched[0]:
            _loop_watched[0] = True
            asyncio.get_running_loop().create_task(_watch_loop())
        started = perf_counter()
        await original(self, scope, receive, send)
        ms = (perf_counter() - started) * 1e3
        DATA["req_n"] += 1
        bucket = str(min(int(ms), 100))
        DATA["req_hist"][bucket] = DATA["req_hist"].get(bucket, 0) + 1

    module.FastMiss.__call__ = timed


def _wrap_mmap() -> None:
    from prometheus_client import mmap_dict

    original = mmap_dict.MmapedDict.write_value

    def write_value(self: Any, key: Any, value: Any, timestamp: Any) -> None:
        started = perf_counter()
        original(self, key, value, timestamp)
        ms = (perf_counter() - started) * 1e3
        DATA["mmap_n"] += 1
        if ms > 2:
            DATA["mmap_slow"].append((time.time(), round(ms, 2)))

    mmap_dict.MmapedDict.write_value = write_value


class _Finder(importlib.abc.MetaPathFinder):
    """Wraps ``FastMiss`` once ``tunehub.service.lookup_miss`` is executed."""

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name == "tunehub.service.metrics":
            _wrap_mmap()
        if name != "tunehub.service.lookup_miss":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        loader: Any = spec.loader
        execute = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            execute(module)
            _wrap_fast_miss(module)

        loader.exec_module = exec_module
        return spec


if DIR:
    gc.callbacks.append(_on_gc)
    threading.Thread(target=_dump_every, args=(1.0,), daemon=True, name="stall-probe").start()
    atexit.register(_dump)
    sys.meta_path.insert(0, _Finder())
