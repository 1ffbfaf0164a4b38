"""Probe: how long Inductor's compile workers take to become ready after they are started.

Starts them as Inductor's backend does (``maybe_warm_pool``), then asks every 0.1 s whether
they are ready (``AsyncCompile.use_process_pool``), the main thread sleeping (``idle``) or
spinning (``busy``, as a compile keeps it). Run on the GPU machine, on all cores and pinned to
half (as ``compile_models.py`` pins its workers):

    for mode in idle busy; do python3 pool.py $mode; taskset -c 8-15 python3 pool.py $mode; done
"""

import json
import os
import sys
import time

busy = sys.argv[1] == "busy"
t0 = time.perf_counter()
import torch  # noqa: E402, F401
from torch._inductor import config  # noqa: E402
from torch._inductor.async_compile import AsyncCompile, maybe_warm_pool  # noqa: E402

t1 = time.perf_counter()
maybe_warm_pool()
t2 = time.perf_counter()
ready = None
asks = 0
while time.perf_counter() - t2 < 45:
    asks += 1
    if AsyncCompile.use_process_pool():
        ready = time.perf_counter() - t2
        break
    if busy:
        end = time.perf_counter() + 0.1
        while time.perf_counter() < end:
            sum(range(1000))
    else:
        time.sleep(0.1)
result = {
    "mode": sys.argv[1],
    "affinity": len(os.sched_getaffinity(0)),
    "compile_threads": config.compile_threads,
    "worker_start": config.worker_start_method,
    "import_s": t1 - t0,
    "warm_s": t2 - t1,
    "ready_after_s": ready,
    "asks": asks,
}
print(json.dumps(result), flush=True)
