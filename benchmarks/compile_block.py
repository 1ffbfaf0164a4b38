"""``torch.compile(backend="tunehub")`` on a transformer block against ``torch.compile``'s default
and ``mode="max-autotune"``: time per step and compile time, prefill and decode.

The block is LLaMA-shaped (RMSNorm, fused QKV projection, scaled-dot-product attention with a KV
cache for decode, output projection, SwiGLU MLP; no rotary embedding), with LLM-sized linear
layers (default hidden 4096, MLP 11008, 32 heads, float16). Cases: ``prefill`` (1 x 2048
tokens, causal) and ``decode`` (16 sequences x 1 token over a 1024-token cache).

    python benchmarks/compile_block.py --out benchmarks/results/compile_block-h100.json
    python benchmarks/compile_block.py --mlp 14336 --dtype bfloat16 --trials 24
    python benchmarks/compile_block.py --url http://host:8000 --skip-tune   # a tuned fleet
    python benchmarks/compile_block.py --dry-run      # CPU, a tiny block, blis.gemm

Within a 10-minute command limit, in three commands (``--home`` keeps the service's database
and write key between them):

    python benchmarks/compile_block.py --home /tmp/cb --contenders none --trials 12 --job-secs 25
    python benchmarks/compile_block.py --home /tmp/cb --skip-tune --cases prefill --out $OUT/p.json
    python benchmarks/compile_block.py --home /tmp/cb --skip-tune --cases decode --out $OUT/d.json

Steps: (1) start ``tunehub serve`` (SQLite in a temp dir, this GPU as its worker) unless
``--url``; (2) tune the block's GEMM shapes there (``--trials``/``--job-secs`` per shape;
``--skip-tune`` when the service has them) and show what a lookup answers for each; (3) run
every (case, contender) in a fresh subprocess with cold Inductor, Triton and tunehub caches, so
each compile time is a cold compile (tunehub's includes its lookups). Time per step: CUDA-graph
replay of the compiled step where it can be captured (``max-autotune`` captures its own graphs;
its time is measured around its own replays), and the plain launch time (events) beside it;
medians of ``--rounds``. Prints the table and the ratios (above 1: tunehub faster), writes JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from local_service import REPO, local_service, lookup, machine, tune_shapes

CONTENDERS = ("default", "max-autotune", "tunehub")


# --------------------------------------------------------------------------------------------
# The block (built in the worker processes)
# --------------------------------------------------------------------------------------------


def make_block(hidden: int, mlp: int, heads: int, context: int, batch: int) -> Any:
    import torch
    import torch.nn.functional as F

    class RMSNorm(torch.nn.Module):
        def __init__(self, dim: int) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(dim))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            scale = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)
            return (x.float() * scale).to(x.dtype) * self.weight

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.heads = heads
            self.norm1 = RMSNorm(hidden)
            self.qkv = torch.nn.Linear(hidden, 3 * hidden, bias=False)
            self.o = torch.nn.Linear(hidden, hidden, bias=False)
            self.norm2 = RMSNorm(hidden)
            self.gate = torch.nn.Linear(hidden, mlp, bias=False)
            self.up = torch.nn.Linear(hidden, mlp, bias=False)
            self.down = torch.nn.Linear(mlp, hidden, bias=False)
            hd = hidden // heads
            # The decode case's KV cache (filled with random keys and values).
            self.register_buffer("k_cache", torch.randn(batch, heads, context, hd) * 0.1)
            self.register_buffer("v_cache", torch.randn(batch, heads, context, hd) * 0.1)
            self.use_cache = context > 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, s, h = x.shape
            hd = h // self.heads
            q, k, v = self.qkv(self.norm1(x)).split(h, dim=-1)
            q, k, v = (t.view(b, s, self.heads, hd).transpose(1, 2) for t in (q, k, v))
            if self.use_cache:
                k = torch.cat([self.k_cache, k], dim=2)
                v = torch.cat([self.v_cache, v], dim=2)
            att = F.scaled_dot_product_attention(q, k, v, is_causal=not self.use_cache)
            x = x + self.o(att.transpose(1, 2).reshape(b, s, h))
            y = self.norm2(x)
            return x + self.down(F.silu(self.gate(y)) * self.up(y))

    return Block()


def case_dims(args: argparse.Namespace, case: str) -> tuple[int, int, int]:
    """(batch, sequence, context) of a case."""
    if case == "prefill":
        return 1, args.prefill, 0
    return args.decode, 1, args.context


def gemm_workloads(args: argparse.Namespace, case: str, device: str) -> list[dict[str, Any]]:
    """The block's GEMMs as tunehub workloads: x (T x K) times an nn.Linear weight (N x K row
    major, i.e. a column-major K x N B). The CPU kernel reads row-major B (the op copies it)."""
    batch, seq, _ = case_dims(args, case)
    tokens = batch * seq
    h, mlp = args.hidden, args.mlp
    layout = "col_major" if device == "cuda" else "row_major"
    shapes = [(3 * h, h), (h, h), (mlp, h), (h, mlp)]  # qkv, o, gate = up, down
    return [
        {"m": tokens, "n": n, "k": k, "dtype": args.dtype, "b_layout": layout} for n, k in shapes
    ]


# --------------------------------------------------------------------------------------------
# One (case, contender), in its own process
# --------------------------------------------------------------------------------------------


def worker(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    device = spec["device"]
    dtype = getattr(torch, spec["dtype"])
    torch.manual_seed(0)
    batch, seq, context = spec["batch"], spec["seq"], spec["context"]
    block = make_block(spec["hidden"], spec["mlp"], spec["heads"], context, batch)
    block = block.to(device=device, dtype=dtype).eval()
    x = torch.randn(batch, seq, spec["hidden"], device=device, dtype=dtype)
    cuda = device == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    contender = spec["contender"]
    result: dict[str, Any] = {"contender": contender, "case": spec["case"]}
    with torch.no_grad():
        expected = block(x).float()
        torch._dynamo.reset()
        if contender == "eager":
            step = block
        elif contender == "tunehub":
            step = torch.compile(block, backend=_tunehub_backend())
        else:
            step = torch.compile(block, mode=None if contender == "default" else contender)
        sync()
        start = time.perf_counter()
        out = step(x)
        sync()
        result["compile_secs"] = time.perf_counter() - start
        out = step(x)  # max-autotune's CUDA graphs record on a later call
        sync()
        result["rel_err"] = float((out.float() - expected).norm() / expected.norm())
        result["launch_ms"] = _time(step, x, spec, cuda)
        result["graph_ms"] = None
        if cuda and contender not in ("max-autotune",):
            try:
                result["graph_ms"] = _time_graph(step, x, spec)
            except Exception as exc:  # a step that cannot be captured: launch time only
                result["graph_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        result["step_ms"] = result["graph_ms"] or result["launch_ms"]
    if contender == "tunehub":
        from tunehub.client.gemm_choice import CALLS, CHOOSER
        from tunehub.client.torch_backend import REWRITES

        result["tunehub"] = {
            "calls": dict(CALLS),
            "rewrites": dict(REWRITES),
            "lookups": {
                f"{k[0]}x{k[1]}x{k[2]} {k[3]}": {"source": c.source, "library": c.use_library}
                for k, c in CHOOSER._answers.items()
            },
        }
    return result


def _tunehub_backend() -> Any:
    """``"tunehub"`` where the entry point is installed; else the function itself (a checkout
    run through PYTHONPATH has no installed entry points)."""
    from torch._dynamo.backends.registry import lookup_backend

    try:
        lookup_backend("tunehub")
    except Exception:
        from tunehub.client.torch_backend import tunehub_backend

        return tunehub_backend
    return "tunehub"


def _time(step: Any, x: Any, spec: dict[str, Any], cuda: bool) -> float:
    """Median ms per call of back-to-back calls."""
    import torch

    reps, rounds = spec["reps"], spec["rounds"]
    times = []
    for _ in range(rounds):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                step(x)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / reps)
        else:
            t0 = time.perf_counter()
            for _ in range(reps):
                step(x)
            times.append((time.perf_counter() - t0) * 1e3 / reps)
    return statistics.median(times)


def _time_graph(step: Any, x: Any, spec: dict[str, Any]) -> float:
    """Median ms per replay of the step captured in a CUDA graph."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            step(x)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step(x)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(spec["rounds"]):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(spec["reps"]):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / spec["reps"])
    return statistics.median(times)


def run_worker(spec: dict[str, Any], env: dict[str, str], timeout: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="compile-block-") as tmp:
        environment = {
            **os.environ,
            "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            # Cold caches: every compile time is a first compile.
            "TORCHINDUCTOR_CACHE_DIR": str(Path(tmp) / "inductor"),
            "TRITON_CACHE_DIR": str(Path(tmp) / "triton"),
            "TUNEHUB_CACHE_DIR": str(Path(tmp) / "tunehub"),
            **env,
        }
        try:
            done = subprocess.run(
                [sys.executable, __file__, "--worker", json.dumps(spec)],
                env=environment,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            return {**spec, "error": f"timed out after {timeout:.0f} s"}
    if done.returncode != 0:
        return {**spec, "error": done.stderr[-3000:]}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# --------------------------------------------------------------------------------------------
# The orchestration
# --------------------------------------------------------------------------------------------


def geomean(values: list[float]) -> float | None:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def print_table(results: list[dict[str, Any]], cases: list[str]) -> dict[str, Any]:
    print()
    print(f"{'case':8s} {'contender':14s} {'step ms':>9s} {'graph ms':>9s} {'launch ms':>10s} "
          f"{'compile s':>10s} {'rel err':>9s}  tunehub kernels")  # fmt: skip
    for r in results:
        if "error" in r:
            print(f"{r['case']:8s} {r['contender']:14s} FAILED: {r['error'][-300:]}")
            continue
        graph = f"{r['graph_ms']:.3f}" if r.get("graph_ms") else "-"
        extra = ""
        if "tunehub" in r:
            sources = sorted({v["source"] for v in r["tunehub"]["lookups"].values()})
            extra = f"{r['tunehub']['calls']} lookups: {','.join(sources)}"
        print(f"{r['case']:8s} {r['contender']:14s} {r['step_ms']:>9.3f} {graph:>9s} "
              f"{r['launch_ms']:>10.3f} {r['compile_secs']:>10.1f} {r['rel_err']:>9.2e}  "
              f"{extra}")  # fmt: skip
    ok = {(r["case"], r["contender"]): r for r in results if "error" not in r}
    summary: dict[str, Any] = {}
    print()
    for other in ("default", "max-autotune"):
        speedups, compile_ratios = [], []
        for case in cases:
            mine, theirs = ok.get((case, "tunehub")), ok.get((case, other))
            if not mine or not theirs:
                continue
            speedup = theirs["step_ms"] / mine["step_ms"]
            compile_ratio = mine["compile_secs"] / theirs["compile_secs"]
            speedups.append(speedup)
            compile_ratios.append(compile_ratio)
            print(
                f"{case:8s} tunehub vs {other:13s}: {speedup:6.3f}x step speed "
                f"(above 1: tunehub faster), compile time {compile_ratio:6.3f}x of theirs"
            )
        gm = geomean(speedups)
        if gm is not None:
            print(f"{'geomean':8s} tunehub vs {other:13s}: {gm:6.3f}x step speed, compile "
                  f"{geomean(compile_ratios) or 0:6.3f}x")  # fmt: skip
        summary[other] = {"speedups": speedups, "geomean_speedup": gm,
                          "compile_ratios": compile_ratios}  # fmt: skip
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--url", help="a tunehub service that has (or will tune) the shapes")
    parser.add_argument("--api-key", help="write key for --url (default $TUNEHUB_API_KEY)")
    parser.add_argument("--target", default=None, help="target to tune and look up on "
                        "(default local-cuda:0; local-cpu in --dry-run)")  # fmt: skip
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--mlp", type=int, default=11008)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--dtype", default="float16", choices=("float16", "bfloat16", "float32"))
    parser.add_argument("--prefill", type=int, default=2048, help="prefill tokens")
    parser.add_argument("--decode", type=int, default=16, help="decode batch (1 token each)")
    parser.add_argument("--context", type=int, default=1024, help="decode KV cache length")
    parser.add_argument("--cases", default="prefill,decode")
    parser.add_argument(
        "--contenders", default=",".join(CONTENDERS), help="comma-separated; none: tune only"
    )
    parser.add_argument("--home", type=Path, help="keep the started service's data here")
    parser.add_argument("--trials", type=int, default=16, help="tuning trials per GEMM shape")
    parser.add_argument("--job-secs", type=float, default=45.0, help="tuning secs per shape")
    parser.add_argument("--skip-tune", action="store_true", help="the service has the shapes")
    parser.add_argument("--reps", type=int, default=20, help="calls per timing round")
    parser.add_argument("--rounds", type=int, default=7, help="timing rounds (median)")
    parser.add_argument("--timeout", type=float, default=900.0, help="per worker, seconds")
    parser.add_argument("--dry-run", action="store_true", help="CPU, a tiny block, blis.gemm")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return 0

    device = "cuda"
    if args.dry_run:
        device = "cpu"
        args.hidden, args.mlp, args.heads = 64, 96, 4
        args.prefill, args.decode, args.context = 32, 4, 16
        args.dtype, args.trials, args.job_secs = "float32", 2, 30.0
        args.reps, args.rounds = 3, 3
        if args.contenders == ",".join(CONTENDERS):
            args.contenders = "default,tunehub"
    target = args.target or ("local-cpu" if device == "cpu" else "local-cuda:0")
    template = "blis.gemm" if device == "cpu" else "triton.gemm"
    cases = [c for c in args.cases.split(",") if c]
    contenders = [c for c in args.contenders.split(",") if c and c != "none"]
    results: dict[str, Any] = {
        "machine": machine(),
        "args": {k: v for k, v in vars(args).items() if k not in ("worker", "api_key", "out")},
        "target": target,
        "template": template,
    }
    runs: list[dict[str, Any]] = []
    gpus = "none" if device == "cpu" else "auto"
    with local_service(args.url, args.api_key, gpus=gpus, home=args.home) as service:
        workloads = [w for case in cases for w in gemm_workloads(args, case, device)]
        unique = [dict(t) for t in dict.fromkeys(tuple(sorted(w.items())) for w in workloads)]
        if not args.skip_tune:
            print(f"tuning {len(unique)} GEMM shapes on {target} ({args.trials} trials, "
                  f"{args.job_secs:.0f} s each, one after another: up to about "
                  f"{len(unique) * args.job_secs / 60:.0f} min) ...", flush=True)  # fmt: skip
            start = time.perf_counter()
            jobs = tune_shapes(service, unique, target=target, template=template,
                               max_trials=args.trials, max_secs=args.job_secs)  # fmt: skip
            results["tuning_secs"] = time.perf_counter() - start
            results["jobs"] = [{k: j.get(k) for k in ("id", "state", "trials_done", "error")}
                               for j in jobs]  # fmt: skip
        print(f"\n{'GEMM (m x n x k)':22s} {'source':>10s} {'vs library':>11s}  config")
        answers = []
        for w in unique:
            answer = lookup(service, w, target=target, template=template)
            answers.append({"workload": w, "answer": answer})
            speed = answer.get("speedup_vs_baseline")
            vs = f"{speed:.3f}x" if speed else "-"
            print(
                f"{w['m']:>6d}x{w['n']}x{w['k']:<8d} {answer.get('source', '?'):>10s} "
                f"{vs:>11s}  {answer.get('config')}"
            )
        results["lookups"] = answers
        env = {"TUNEHUB_URL": service.url, "TUNEHUB_CLIENT_DEADLINE_SECS": "5"}
        for case in cases:
            batch, seq, context = case_dims(args, case)
            for contender in contenders:
                spec = {
                    "case": case, "contender": contender, "device": device,
                    "dtype": args.dtype, "hidden": args.hidden, "mlp": args.mlp,
                    "heads": args.heads, "batch": batch, "seq": seq, "context": context,
                    "reps": args.reps, "rounds": args.rounds,
                }  # fmt: skip
                print(f"... {case} {contender}", flush=True)
                runs.append(run_worker(spec, env, args.timeout))
    results["runs"] = runs
    results["summary"] = print_table(runs, cases)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1, default=str))
        print(f"wrote {args.out}")
    return 0 if all("error" not in r for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
