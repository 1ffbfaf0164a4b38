"""Benchmark: the first schedule lookup of a fresh process, with the service up, down or slow.

Each case runs ``--processes`` fresh Python processes. Each one imports what a compiler
integration imports (``tunehub.client.gemm_choice``, and ``ready_defaults``, which the
integrations that may run a default call when imported), then makes its first lookup through
``CHOOSER.choose`` (what ``tunehub.triton.matmul`` and the torch.compile backend call), a
``blis.gemm`` float32 GEMM on this machine's CPU, with the client's default deadline (50 ms)
and a cache directory of its own (no disk hit). ``cold``: the call right after the import;
``settled``: the call ``--settle-secs`` after it (the process did other work first, as a
compiler does between importing and its first lookup). Then a second shape (a miss) and the
first shape again (a memo hit).

- ``up``: a real ``tunehub serve`` on loopback (asked for the shape once beforehand, so its
  own first-request costs are not counted);
- ``down``: a closed loopback port (connection refused);
- ``slow``: a loopback socket that accepts connections and never answers.

Printed and written as JSON: per case and mode, the median, the spread and the slowest first
call (ms), the import time, and what the first call answered (the service's tier, or the
client's fallback). The machine is shared and noisy: the load average is recorded.

    .venv/bin/python benchmarks/client_first_call.py \
        --out benchmarks/results/client_first_call-<cpu>-<UTC time>.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

# The process under test: everything it does is timed on its own clock and printed as JSON.
CHILD = r"""
import faulthandler, json, os, sys, time
faulthandler.dump_traceback_later(120, exit=True)  # a hang shows where, instead of a timeout
settle = float(sys.argv[1])
started = time.perf_counter()
if sys.argv[2] == "torch":
    import torch  # noqa: F401  (a compiler process has torch imported already)
torch_done = time.perf_counter()
from tunehub.client.gemm_choice import CHOOSER, ready_defaults
from tunehub.core import Workload, local_cpu_target
ready_defaults()  # as the integrations that may run a default (the CPU ops) do at import
imported = time.perf_counter()
target = local_cpu_target()  # the integration's fingerprint, cached there: not the lookup's
if settle:
    time.sleep(settle)
workload = Workload(m=512, n=512, k=512, dtype="float32")
t0 = time.perf_counter()
choice = CHOOSER.choose(workload, target, "blis.gemm")
t1 = time.perf_counter()
CHOOSER.choose(Workload(m=384, n=512, k=512, dtype="float32"), target, "blis.gemm")
t2 = time.perf_counter()
again = CHOOSER.choose(workload, target, "blis.gemm")
t3 = time.perf_counter()
print(json.dumps({
    "torch_import_ms": (torch_done - started) * 1e3,
    "import_ms": (imported - torch_done) * 1e3,
    "first_ms": (t1 - t0) * 1e3,
    "second_shape_ms": (t2 - t1) * 1e3,
    "hit_us": (t3 - t2) * 1e6,
    "source": choice.source,
    "use_library": choice.use_library,
    "fallback": bool(choice.detail.get("fallback")),
    "reason": choice.detail.get("reason", ""),
    "later_source": again.source,
}))
"""


def cpu_model() -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.startswith("Model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


@contextlib.contextmanager
def silent_server() -> Iterator[str]:
    """A loopback port that accepts every connection and never answers on it."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                held.append(listener.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(2)
        for conn in held:
            conn.close()
        listener.close()


def closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@contextlib.contextmanager
def live_service() -> Iterator[str]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from local_service import local_service

    with local_service(gpus="none", TUNEHUB_TRAIN_MODELS="false") as service:
        yield service.url


def run_child(url: str, settle: float, torch: bool) -> dict[str, Any]:
    env = dict(os.environ)
    env.pop("TUNEHUB_CLIENT_DEADLINE_SECS", None)
    env.pop("TUNEHUB_OFFLINE", None)
    with tempfile.TemporaryDirectory(prefix="tunehub-first-call-") as cache:
        env.update(
            TUNEHUB_URL=url,
            TUNEHUB_CACHE_DIR=cache,
            PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
        )
        done = subprocess.run(
            [sys.executable, "-c", CHILD, str(settle), "torch" if torch else "-"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            cwd=REPO,
        )
    if done.returncode != 0:
        raise RuntimeError(f"the child failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    first = [r["first_ms"] for r in rows]
    return {
        "first_ms_median": statistics.median(first),
        "first_ms_min": min(first),
        "first_ms_max": max(first),
        "import_ms_median": statistics.median(r["import_ms"] for r in rows),
        "second_shape_ms_median": statistics.median(r["second_shape_ms"] for r in rows),
        "hit_us_median": statistics.median(r["hit_us"] for r in rows),
        "sources": sorted({r["source"] for r in rows}),
        "later_sources": sorted({r["later_source"] for r in rows}),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=7, help="fresh processes per case")
    parser.add_argument("--settle-secs", type=float, default=1.0)
    parser.add_argument("--cases", default="up,down,slow")
    parser.add_argument("--torch", action="store_true", help="import torch first, as a compiler")
    parser.add_argument("--label", default="", help="a note kept in the JSON (e.g. the commit)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    cases = args.cases.split(",")
    results: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        urls = {}
        if "up" in cases:
            urls["up"] = stack.enter_context(live_service())
            run_child(urls["up"], 0.0, False)  # the service's own first request, not counted
        if "down" in cases:
            urls["down"] = closed_port()
        if "slow" in cases:
            urls["slow"] = stack.enter_context(silent_server())
        for mode, settle in (("cold", 0.0), ("settled", args.settle_secs)):
            for case in cases:
                rows = [run_child(urls[case], settle, args.torch) for _ in range(args.processes)]
                results[f"{case}/{mode}"] = {"summary": summary(rows), "processes": rows}
    print(f"first call of a process, deadline 50 ms, {args.processes} processes each "
          f"(cpu: {cpu_model()}, load {os.getloadavg()[0]:.2f})")  # fmt: skip
    header = f"{'case':14s} {'median ms':>10s} {'min':>7s} {'max':>7s} {'import ms':>10s}  answer"
    print(header)
    for name, result in results.items():
        s = result["summary"]
        print(f"{name:14s} {s['first_ms_median']:>10.1f} {s['first_ms_min']:>7.1f} "
              f"{s['first_ms_max']:>7.1f} {s['import_ms_median']:>10.1f}  "
              f"{'/'.join(s['sources'])} -> later {'/'.join(s['later_sources'])}")  # fmt: skip
    document = {
        "benchmark": "client_first_call",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "python": sys.version.split()[0],
        "load_average": os.getloadavg(),
        "deadline_secs": 0.05,
        "processes": args.processes,
        "settle_secs": args.settle_secs,
        "torch_imported_first": args.torch,
        "label": args.label,
        "results": results,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(document, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
