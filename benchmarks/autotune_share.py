"""``tunehub.triton.autotune`` across processes: the first process on a GPU benchmarks a user
kernel's configs and uploads the result; a second process (fresh caches, same GPU) gets the
config from the service and benchmarks nothing. Plain ``triton.autotune`` in a fresh process
is the reference (it benchmarks every config, every time a process starts cold).

    python benchmarks/autotune_share.py --out benchmarks/results/autotune_share-h100.json
    python benchmarks/autotune_share.py --dry-run     # CPU, Triton's interpreter, tiny shapes

Starts its own ``tunehub serve`` (SQLite in a temp dir) unless ``--url`` (and a write key in
``--api-key`` or ``$TUNEHUB_API_KEY``) names one. Each process is a real subprocess with its
own ``TUNEHUB_CACHE_DIR`` and ``TRITON_CACHE_DIR``, so only the service can carry the result.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from local_service import REPO, local_service, machine

# The user's kernel: a tiled matmul (written for this benchmark) with the configs a user
# would list, tuned per (M, N, K).
KERNEL = """
import os
import triton
import triton.language as tl

BENCH_CALLS = [0]


def counting(bench):
    def do_bench(fn, quantiles=None, **kwargs):
        BENCH_CALLS[0] += 1
        return bench(fn, quantiles=quantiles, **kwargs)
    return do_bench


if os.environ.get("TRITON_INTERPRET") == "1":
    from tunehub.client.triton_autotune import cpu_do_bench as _bench
    CONFIGS = [triton.Config({"BM": 16, "BN": 16, "BK": 16}, num_warps=1),
               triton.Config({"BM": 32, "BN": 32, "BK": 16}, num_warps=1)]
else:
    from triton.testing import do_bench as _bench
    CONFIGS = [
        triton.Config({"BM": bm, "BN": bn, "BK": bk}, num_warps=w, num_stages=s)
        for bm, bn, bk, w, s in [
            (128, 256, 64, 8, 3), (256, 128, 64, 8, 3), (128, 128, 64, 4, 4),
            (128, 128, 32, 4, 4), (64, 256, 32, 4, 4), (128, 64, 32, 4, 4),
            (64, 128, 32, 4, 4), (64, 64, 64, 4, 5), (32, 64, 64, 4, 5),
            (128, 128, 128, 8, 3), (64, 128, 64, 4, 3), (256, 64, 64, 8, 3),
        ]
    ]

if os.environ.get("AUTOTUNER") == "triton":
    autotune = triton.autotune
else:
    import tunehub.triton
    autotune = tunehub.triton.autotune


@autotune(configs=CONFIGS, key=["M", "N", "K"], do_bench=counting(_bench))
@triton.jit
def matmul_kernel(a, b, c, M, N, K, sam, sak, sbk, sbn, scm, scn,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        ka = k0 + rk
        x = tl.load(a + rm[:, None] * sam + ka[None, :] * sak,
                    mask=(rm[:, None] < M) & (ka[None, :] < K), other=0.0)
        y = tl.load(b + ka[:, None] * sbk + rn[None, :] * sbn,
                    mask=(ka[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(x, y)
    tl.store(c + rm[:, None] * scm + rn[None, :] * scn, acc.to(c.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def matmul(x, y):
    import torch
    M, K = x.shape
    N = y.shape[1]
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    grid = lambda meta: (triton.cdiv(M, meta["BM"]), triton.cdiv(N, meta["BN"]))
    matmul_kernel[grid](x, y, out, M, N, K, x.stride(0), x.stride(1), y.stride(0),
                        y.stride(1), out.stride(0), out.stride(1))
    return out
"""

PROCESS = """
import json, sys, time
start = time.perf_counter()
import torch
sys.path.insert(0, sys.argv[1])
import user_kernel
shapes = json.loads(sys.argv[2])
device = "cuda" if torch.cuda.is_available() else "cpu"
dtype = torch.float16 if device == "cuda" else torch.float32
rows = []
for m, n, k in shapes:
    a = torch.randn(m, k, device=device, dtype=dtype)
    b = torch.randn(k, n, device=device, dtype=dtype)
    before = user_kernel.BENCH_CALLS[0]
    tuner = user_kernel.matmul_kernel
    sources_before = dict(getattr(tuner, "sources", {}))
    t0 = time.perf_counter()
    out = user_kernel.matmul(a, b)
    if device == "cuda":
        torch.cuda.synchronize()
    first = time.perf_counter() - t0
    err = float(((out.float() - a.float() @ b.float()).norm() / (a.float() @ b.float()).norm()))
    sources = {k: v - sources_before.get(k, 0) for k, v in getattr(tuner, "sources", {}).items()}
    rows.append({"shape": [m, n, k], "bench_calls": user_kernel.BENCH_CALLS[0] - before,
                 "first_call_secs": first, "best": str(tuner.best_config), "rel_err": err,
                 "sources": {k: v for k, v in sources.items() if v}})
print(json.dumps({"rows": rows, "bench_calls": user_kernel.BENCH_CALLS[0],
                  "process_secs": time.perf_counter() - start}))
"""


def run_process(
    label: str, kernel_dir: Path, shapes: list[list[int]], env: dict[str, str], timeout: float
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"autotune-{label}-") as tmp:
        environment = {
            **os.environ,
            "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "TUNEHUB_CACHE_DIR": str(Path(tmp) / "tunehub"),
            "TRITON_CACHE_DIR": str(Path(tmp) / "triton"),
            **env,
        }
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-c", PROCESS, str(kernel_dir), json.dumps(shapes)],
            env=environment,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        wall = time.perf_counter() - start
    if done.returncode != 0:
        return {"label": label, "error": done.stderr[-3000:], "wall_secs": wall}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result.update(label=label, wall_secs=wall)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running tunehub service (default: start one)")
    parser.add_argument("--api-key", help="write key for --url (default $TUNEHUB_API_KEY)")
    parser.add_argument(
        "--shape", action="append", default=[], help="MxNxK (repeatable; default LLM-ish ones)"
    )
    parser.add_argument("--dry-run", action="store_true", help="CPU, interpreter, tiny shapes")
    parser.add_argument("--timeout", type=float, default=540.0, help="per process, seconds")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args()

    env: dict[str, str] = {}
    if args.dry_run:
        env["TRITON_INTERPRET"] = "1"
        shapes = [[48, 40, 32], [20, 64, 16]]
    else:
        shapes = [[4096, 4096, 4096], [2048, 11008, 4096], [16, 4096, 11008]]
    if args.shape:
        shapes = [[int(v) for v in s.lower().split("x")] for s in args.shape]

    results: dict[str, Any] = {"machine": machine(), "shapes": shapes, "dry_run": args.dry_run}
    with tempfile.TemporaryDirectory(prefix="autotune-kernel-") as kernel_dir:
        (Path(kernel_dir) / "user_kernel.py").write_text(KERNEL)
        with local_service(args.url, args.api_key, gpus="none") as service:
            common = {**env, "TUNEHUB_URL": service.url}
            runs = [
                ("triton.autotune (cold)", {**common, "AUTOTUNER": "triton"}),
                ("tunehub first", {**common, "TUNEHUB_API_KEY": service.key}),
                ("tunehub second", {**common, "TUNEHUB_API_KEY": ""}),
            ]
            processes = []
            for label, extra in runs:
                print(f"... {label}", flush=True)
                processes.append(run_process(label, Path(kernel_dir), shapes, extra, args.timeout))
    results["processes"] = processes

    print()
    print(f"{'process':24s} {'shape':>18s} {'do_bench':>9s} {'first call s':>13s} "
          f"{'source':>10s}  best config")  # fmt: skip
    for proc in processes:
        if "error" in proc:
            print(f"{proc['label']:24s} FAILED: {proc['error'][-400:]}")
            continue
        for row in proc["rows"]:
            shape = "x".join(map(str, row["shape"]))
            source = ",".join(row["sources"]) or "-"
            print(f"{proc['label']:24s} {shape:>18s} {row['bench_calls']:>9d} "
                  f"{row['first_call_secs']:>13.3f} {source:>10s}  {row['best']}")  # fmt: skip
    ok = [p for p in processes if "error" not in p]
    by_label = {p["label"]: p for p in ok}
    second = by_label.get("tunehub second")
    first = by_label.get("tunehub first")
    if first and second:
        same = all(
            a["best"] == b["best"] for a, b in zip(first["rows"], second["rows"], strict=True)
        )
        print()
        print(f"do_bench calls: first process {first['bench_calls']}, "
              f"second process {second['bench_calls']}; same configs: {same}")  # fmt: skip
        cold = by_label.get("triton.autotune (cold)")
        if cold:
            t_cold = sum(r["first_call_secs"] for r in cold["rows"])
            t_second = sum(r["first_call_secs"] for r in second["rows"])
            print(f"first calls, all shapes: triton.autotune {t_cold:.3f} s, tunehub second "
                  f"process {t_second:.3f} s ({t_cold / max(t_second, 1e-9):.1f}x)")  # fmt: skip
        results["summary"] = {
            "first_bench_calls": first["bench_calls"],
            "second_bench_calls": second["bench_calls"],
            "same_configs": same,
        }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1))
        print(f"wrote {args.out}")
    return 0 if len(ok) == len(processes) and second and second["bench_calls"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
