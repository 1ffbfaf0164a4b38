"""``triton.attention`` candidate configs against every ``scaled_dot_product_attention`` backend.

For LLaMA/Mistral-style attention shapes (512-8192 tokens, head_dim 64 and 128, causal and
not, float16 and bfloat16), each candidate config of tunehub's flash-attention kernel and
each SDPA backend (flash, efficient, cudnn where this PyTorch has it, and auto) is checked
against the float32 reference on the same inputs (NaN-poisoned output first) and timed
side by side with ``triton.testing.do_bench`` (median of its repeats, L2 flushed between
them). Printed: per shape, each candidate's time and its ratio to the best SDPA backend
(> 1: faster); then each candidate's geomean over the shapes and the best-per-shape geomean
(issue 24 asks >= 0.95x of the best backend). Written: the same, with every repeat quantile,
compile facts and the environment, to ``--out`` (JSON, rewritten after every result).

Run, on a GPU (about 2-4 minutes on an H200; no network needed)::

    python benchmarks/attention_gpu.py --out $OUT/attention_gpu.json

1. Every candidate is compiled first, for sm_XY of the visible GPU, in ``--jobs`` processes
   that need no GPU (``triton_attention_kernels.precompile``), into a shared Triton cache;
   registers, spills and shared memory are recorded, and one that fails to compile or needs
   more shared memory than the GPU has is skipped with the reason.
2. A child process then measures (shape, item) pairs: per shape the SDPA backends and the
   plain candidates, then every warp-specialised candidate at the end. The parent watches
   it: a pair that makes no progress for ``--pair-timeout`` seconds (a hung kernel) or kills
   the child is recorded as ``hung``/``crashed`` and its candidate dropped, and a new child
   goes on with the rest. So one bad kernel costs its own results, not the run's.

``--interpret`` runs the same pieces on the CPU under TRITON_INTERPRET=1 on tiny shapes (what
the tests do); timings there mean nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


@dataclass(frozen=True)
class Shape:
    name: str
    batch: int
    heads: int
    q_len: int
    kv_len: int
    head_dim: int
    causal: bool
    dtype: str

    def workload_dict(self) -> dict[str, Any]:
        return {
            "op": "attention", "m": self.q_len, "n": self.kv_len, "k": self.head_dim,
            "dtype": self.dtype, "batch": self.batch, "heads": self.heads, "causal": self.causal,
        }  # fmt: skip


def _shape(batch: int, heads: int, tokens: int, d: int, causal: bool, dtype: str) -> Shape:
    tag = "causal" if causal else "full"
    name = f"b{batch}h{heads}-{tokens}-d{d}-{tag}-{'fp16' if dtype == 'float16' else 'bf16'}"
    return Shape(name, batch, heads, tokens, tokens, d, causal, dtype)


# LLaMA-2-7B / Mistral-7B attention (32 heads of 128) at 512-8192 tokens, smaller-head models
# (16 heads of 64), and the shape of the first H200 probe (b2 h16 2048 d128).
SHAPES = (
    _shape(2, 16, 2048, 128, False, "float16"),
    _shape(2, 16, 2048, 128, True, "float16"),
    _shape(8, 32, 512, 128, True, "float16"),
    _shape(4, 32, 2048, 128, False, "bfloat16"),
    _shape(4, 32, 2048, 128, True, "bfloat16"),
    _shape(1, 32, 8192, 128, True, "float16"),
    _shape(1, 32, 8192, 128, False, "bfloat16"),
    _shape(16, 16, 1024, 64, True, "float16"),
    _shape(4, 16, 4096, 64, False, "float16"),
    _shape(4, 16, 4096, 64, True, "bfloat16"),
    # benchmarks/operators.py's attention set beyond those: LLaMA-2-7B causal prefill at
    # 1,024 / 2,048 / 4,096 tokens (4,096 tokens a batch), a Mistral-7B chunked decode (16
    # queries over 8,192 cached keys) and ViT-L/14 (257 tokens, head dim 64).
    _shape(4, 32, 1024, 128, True, "float16"),
    _shape(2, 32, 2048, 128, True, "float16"),
    _shape(1, 32, 4096, 128, True, "float16"),
    Shape("b8h32-q16-kv8192-d128-full-fp16", 8, 32, 16, 8192, 128, False, "float16"),
    Shape("b32h16-257-d64-full-fp16", 32, 16, 257, 257, 64, False, "float16"),
    # A prompt of no round length: partial last query and key tiles.
    _shape(4, 32, 1000, 128, True, "float16"),
)
TINY_SHAPES = (
    Shape("tiny-causal", 1, 2, 40, 40, 64, True, "float16"),
    Shape("tiny-full", 2, 1, 32, 48, 64, False, "float16"),
)


def _config(bm: int, bn: int, warps: int, stages: int, loads: str) -> dict[str, Any]:
    return {
        "BLOCK_M": bm, "BLOCK_N": bn, "num_warps": warps, "num_stages": stages,
        "TMA": loads != "ptr", "WARP_SPECIALIZE": loads == "ws", "GLUON": loads == "gluon",
    }  # fmt: skip


# (name, config, head_dims it is meant for). "ptr": pointer loads; "tma": tensor descriptors;
# "ws": tma with Triton's warp specialisation (a producer warpgroup, two consumers); "gluon":
# the Gluon kernel (its softmax overlapping the previous block's P @ V). Every one
# compiles for sm_90 without spilling (benchmarks/notes/attention_hopper.md) and is in the
# template's space on an H100/H200 for the shapes above it is measured on: 16-row tiles on a
# decode's 16 queries, the others on the rest (tests/test_attention_gpu_bench.py).
CANDIDATES: tuple[tuple[str, dict[str, Any], tuple[int, ...]], ...] = (
    ("ptr-64x64-w4-s3", _config(64, 64, 4, 3, "ptr"), (64, 128)),  # the probe's v1 winner
    ("ptr-128x64-w8-s3", _config(128, 64, 8, 3, "ptr"), (64, 128)),  # v1's default
    ("tma-128x64-w8-s3", _config(128, 64, 8, 3, "tma"), (64, 128)),  # v2's d128 default
    ("tma-128x128-w8-s2", _config(128, 128, 8, 2, "tma"), (64, 128)),
    ("tma-128x128-w8-s3", _config(128, 128, 8, 3, "tma"), (64, 128)),
    ("tma-64x64-w4-s3", _config(64, 64, 4, 3, "tma"), (64, 128)),
    ("tma-128x64-w4-s3", _config(128, 64, 4, 3, "tma"), (64,)),  # v2's d64 default
    ("tma-64x128-w4-s3", _config(64, 128, 4, 3, "tma"), (64,)),
    ("ws-128x64-w4-s2", _config(128, 64, 4, 2, "ws"), (64, 128)),
    ("ws-128x128-w4-s2", _config(128, 128, 4, 2, "ws"), (64, 128)),
    ("gluon-64x64-w4-s2", _config(64, 64, 4, 2, "gluon"), (64, 128)),
    ("gluon-64x64-w4-s3", _config(64, 64, 4, 3, "gluon"), (64, 128)),
    ("gluon-64x32-w4-s2", _config(64, 32, 4, 2, "gluon"), (64, 128)),
    ("gluon-64x128-w4-s2", _config(64, 128, 4, 2, "gluon"), (64, 128)),
    ("gluon-64x128-w4-s1", _config(64, 128, 4, 1, "gluon"), (128,)),
    ("gluon-128x64-w8-s2", _config(128, 64, 8, 2, "gluon"), (64, 128)),
    ("gluon-128x128-w8-s2", _config(128, 128, 8, 2, "gluon"), (64, 128)),
    # A decode's 16 queries: one 16-row tile a (batch, head).
    ("ptr-16x64-w4-s4", _config(16, 64, 4, 4, "ptr"), (128,)),
    ("ptr-16x128-w4-s3", _config(16, 128, 4, 3, "ptr"), (128,)),
    ("tma-16x128-w4-s3", _config(16, 128, 4, 3, "tma"), (128,)),
    ("ptr-16x64-w4-s3", _config(16, 64, 4, 3, "ptr"), (128,)),
)
SDPA_BACKENDS = ("flash", "efficient", "cudnn", "auto")
SDP_MEMBER = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
              "cudnn": "CUDNN_ATTENTION"}  # fmt: skip


def candidates_for(shape: Shape, names: Iterable[str] | None = None) -> list[str]:
    wanted = set(names) if names is not None else None
    # 16-row query tiles where the queries are that few (a decode), and only there.
    decode = shape.q_len <= 16
    return [
        name
        for name, config, dims in CANDIDATES
        if shape.head_dim in dims
        and (config["BLOCK_M"] == 16) == decode
        and (wanted is None or name in wanted)
    ]


CONFIGS = {name: config for name, config, _ in CANDIDATES}


# --- compile (no GPU) -----------------------------------------------------------------------
def _compile_one(job: tuple[str, dict[str, Any], dict[str, Any], int]) -> dict[str, Any]:
    _, config, shape, capability = job
    from tunehub.kernels import triton_attention_kernels as ak

    try:
        c = ak.precompile(
            config=config, head_dim=shape["head_dim"], dtype=shape["dtype"],
            causal=shape["causal"], q_len=shape["q_len"], kv_len=shape["kv_len"],
            capability=capability, batch=shape["batch"], heads=shape["heads"],
        )  # fmt: skip
    except Exception as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[-600:]}
    return {"ok": True, **asdict(c)}


def _spec_key(shape: Shape, config: dict[str, Any]) -> tuple[Any, ...]:
    # What the kernel is specialised on besides the config (sizes are runtime arguments).
    return (
        shape.head_dim, shape.causal, shape.dtype,
        shape.q_len % config["BLOCK_M"] == 0, shape.kv_len % config["BLOCK_N"] == 0,
    )  # fmt: skip


def precompile_all(
    shapes: Sequence[Shape], names: Iterable[str] | None, capability: int, jobs: int
) -> dict[tuple[str, str], dict[str, Any]]:
    """Compile facts per (shape name, candidate name), compiling each specialisation once."""
    todo: dict[tuple[Any, ...], tuple[str, dict[str, Any], dict[str, Any], int]] = {}
    which: dict[tuple[str, str], tuple[Any, ...]] = {}
    for shape in shapes:
        for name in candidates_for(shape, names):
            key = (name, *_spec_key(shape, CONFIGS[name]))
            which[(shape.name, name)] = key
            todo.setdefault(key, (name, CONFIGS[name], asdict(shape), capability))
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=max(1, jobs), mp_context=ctx) as pool:
        results = dict(zip(todo, pool.map(_compile_one, todo.values()), strict=True))
    return {pair: results[key] for pair, key in which.items()}


# --- measure (child process, or in-process under the interpreter) -----------------------------
def wall_timer(fn: Callable[[], Any]) -> dict[str, float]:
    """One call timed by the wall clock (the interpreter: checks the plumbing only)."""
    start = time.perf_counter()
    fn()
    ms = (time.perf_counter() - start) * 1e3
    return {"median_ms": ms, "p20_ms": ms, "p80_ms": ms}


def gpu_timer(fn: Callable[[], Any]) -> dict[str, float]:
    import triton.testing

    med, p20, p80 = triton.testing.do_bench(fn, warmup=25, rep=100, quantiles=[0.5, 0.2, 0.8])
    return {"median_ms": float(med), "p20_ms": float(p20), "p80_ms": float(p80)}


class ShapeRunner:
    """Operands and the float32 reference of one shape, made once, and each item measured on
    them: the output poisoned, one call, the check, then the timing."""

    def __init__(self, shape: Shape, device: Any, timer: Callable[..., dict[str, float]]):
        from tunehub.core import Workload
        from tunehub.kernels import triton_attention_kernels as ak

        self.shape, self.timer, self.ak = shape, timer, ak
        self.workload = Workload.from_dict(shape.workload_dict())
        self.ops = ak.operands(self.workload, device, seed=zlib.crc32(shape.name.encode()))
        self.ref = ak.reference(self.ops)

    def _checked(self, run: Callable[[], Any], timed: Callable[[], Any]) -> dict[str, Any]:
        import torch

        self.ops.out.fill_(math.nan)
        start = time.perf_counter()
        run()
        if self.ops.out.is_cuda:
            torch.cuda.synchronize()
        first = time.perf_counter() - start
        check = self.ak.check(self.ops.out, self.ref, self.shape.dtype)
        result: dict[str, Any] = {
            "relative_error": check.relative_error if math.isfinite(check.relative_error) else None,
            "first_call_secs": round(first, 4),
        }
        if not check.ok:
            return {**result, "status": "wrong_answer", "error": check.message}
        timing = self.timer(timed)
        tflops = self.workload.flops / (timing["median_ms"] * 1e-3) / 1e12
        return {**result, "status": "ok", **timing, "tflops": round(tflops, 2)}

    def candidate(self, name: str) -> dict[str, Any]:
        ops = self.ops
        try:
            launch = self.ak.bind(
                ops.q, ops.k, ops.v, ops.out, causal=ops.causal, config=CONFIGS[name]
            )
            return self._checked(launch, launch)
        except Exception as exc:
            text = f"{type(exc).__name__}: {exc}"
            # After a CUDA error the context is lost: the child reports it and leaves.
            fatal = any(s in text for s in ("CUDA error", "illegal", "unspecified launch"))
            return {"status": "runtime_error", "error": text[-800:], "fatal": fatal}

    def sdpa(self, backend: str) -> dict[str, Any]:
        import contextlib
        import warnings

        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        ops = self.ops
        if backend != "auto" and not hasattr(SDPBackend, SDP_MEMBER[backend]):
            return {"status": "invalid", "error": f"this PyTorch has no {backend} backend"}
        forced = (
            contextlib.nullcontext()
            if backend == "auto"
            else sdpa_kernel([getattr(SDPBackend, SDP_MEMBER[backend])])
        )
        sdpa = torch.nn.functional.scaled_dot_product_attention

        def call() -> Any:
            return sdpa(ops.q, ops.k, ops.v, is_causal=ops.causal)

        try:
            # The backend is chosen once, outside the timed calls (as a model would).
            with forced, warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                result = self._checked(lambda: ops.out.copy_(call()), call)
        except RuntimeError as exc:
            text = str(exc)
            cannot = "No available kernel" in text or "No viable backend" in text
            status = "invalid" if cannot else "runtime_error"
            return {"status": status, "error": text[-600:]}
        if backend == "auto":
            from tunehub.kernels.torch_attention import chosen_backend

            result["picked"] = chosen_backend(ops.q, ops.k, ops.v, ops.causal)
        return result


def measure_pairs(
    pairs: Sequence[tuple[str, str]],
    shapes: Sequence[Shape],
    device: Any,
    timer: Callable[..., dict[str, float]],
    emit: Callable[[dict[str, Any]], None],
    on_start: Callable[[str, str], None] | None = None,
) -> None:
    """Measure (shape name, item) pairs in order; an item is ``sdpa:<backend>`` or a candidate
    name. Operands and the reference are made once per run of pairs of one shape."""
    by_name = {s.name: s for s in shapes}
    runner: ShapeRunner | None = None
    for shape_name, item in pairs:
        if on_start is not None:
            on_start(shape_name, item)
        if runner is None or runner.shape.name != shape_name:
            runner = None  # free the last shape's tensors first
            runner = ShapeRunner(by_name[shape_name], device, timer)
        if item.startswith("sdpa:"):
            result = runner.sdpa(item.split(":", 1)[1])
        else:
            result = runner.candidate(item)
        emit({"shape": shape_name, "item": item, **result})
        if result.get("fatal"):
            raise SystemExit(3)


def plan(
    shapes: Sequence[Shape], names: Iterable[str] | None, skip: set[tuple[str, str]]
) -> list[tuple[str, str]]:
    """Per shape the SDPA backends and the plain candidates; then the warp-specialised ones
    (the likeliest to hang), so a hang there cannot cost the rest."""
    names = list(names) if names is not None else None
    first: list[tuple[str, str]] = []
    last: list[tuple[str, str]] = []
    for shape in shapes:
        first += [(shape.name, f"sdpa:{b}") for b in SDPA_BACKENDS]
        for name in candidates_for(shape, names):
            if (shape.name, name) in skip:
                continue
            (last if CONFIGS[name]["WARP_SPECIALIZE"] else first).append((shape.name, name))
    return first + last


# --- summary --------------------------------------------------------------------------------
def _geomean(values: Sequence[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def summarize(shapes: Sequence[Shape], results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per shape: the best SDPA backend and each candidate's ratio to it (its time / theirs,
    inverted: > 1 is faster); overall: each candidate's geomean and the best-per-shape one."""
    per_shape: dict[str, Any] = {}
    by_candidate: dict[str, list[float]] = {}
    best_ratios: list[float] = []
    auto_ratios: list[float] = []
    for shape in shapes:
        rows = [r for r in results if r["shape"] == shape.name and r.get("status") == "ok"]
        sdpa = {r["item"][5:]: r["median_ms"] for r in rows if r["item"].startswith("sdpa:")}
        ours = {r["item"]: r["median_ms"] for r in rows if not r["item"].startswith("sdpa:")}
        if not sdpa or not ours:
            per_shape[shape.name] = {"sdpa": sdpa, "candidates": ours, "complete": False}
            continue
        best_backend = min(sdpa, key=lambda b: sdpa[b])
        ratios = {name: sdpa[best_backend] / ms for name, ms in ours.items()}
        for name, ratio in ratios.items():
            by_candidate.setdefault(name, []).append(ratio)
        best = max(ratios, key=lambda n: ratios[n])
        best_ratios.append(ratios[best])
        if "auto" in sdpa:
            auto_ratios.append(sdpa["auto"] / ours[best])
        per_shape[shape.name] = {
            "sdpa_ms": sdpa, "best_sdpa": best_backend, "candidates_ms": ours,
            "ratio_vs_best_sdpa": {n: round(r, 4) for n, r in ratios.items()},
            "best_candidate": best, "best_ratio": round(ratios[best], 4), "complete": True,
        }  # fmt: skip
    complete = sum(1 for s in per_shape.values() if s["complete"])
    return {
        "shapes": per_shape,
        "geomean_best_candidate_vs_best_sdpa": _geomean(best_ratios),
        "geomean_best_candidate_vs_auto": _geomean(auto_ratios),
        "candidate_geomean_vs_best_sdpa": {
            n: round(g, 4)
            for n, v in by_candidate.items()
            if len(v) == complete and (g := _geomean(v)) is not None
        },
    }


def print_summary(summary: dict[str, Any]) -> None:
    out = sys.stdout.write
    for name, s in summary["shapes"].items():
        if not s["complete"]:
            out(f"\n{name}: incomplete\n")
            continue
        sd = ", ".join(f"{b} {ms * 1e3:.0f}us" for b, ms in sorted(s["sdpa_ms"].items()))
        out(f"\n{name}  sdpa: {sd}  (best {s['best_sdpa']})\n")
        for cand, ratio in sorted(s["ratio_vs_best_sdpa"].items(), key=lambda kv: -kv[1]):
            out(f"  {cand:22s} {s['candidates_ms'][cand] * 1e3:9.1f}us  {ratio:6.3f}x\n")
    g = summary["geomean_best_candidate_vs_best_sdpa"]
    a = summary["geomean_best_candidate_vs_auto"]
    out("\nper-candidate geomean vs best sdpa backend:\n")
    for cand, ratio in sorted(
        summary["candidate_geomean_vs_best_sdpa"].items(), key=lambda kv: -kv[1]
    ):
        out(f"  {cand:22s} {ratio:6.3f}x\n")
    if g is not None:
        out(f"best candidate per shape, geomean: {g:.3f}x of best sdpa, {a or 0:.3f}x of auto\n")


# --- driver ---------------------------------------------------------------------------------
def _select_shapes(args: argparse.Namespace) -> list[Shape]:
    pool = TINY_SHAPES if args.interpret else SHAPES
    if not args.shapes:
        return list(pool)
    wanted = args.shapes.split(",")
    unknown = set(wanted) - {s.name for s in pool}
    if unknown:
        raise SystemExit(f"unknown shapes {sorted(unknown)}; known: {[s.name for s in pool]}")
    return [s for s in pool if s.name in wanted]


def _select_candidates(args: argparse.Namespace) -> list[str] | None:
    if not args.candidates:
        return None
    wanted: list[str] = str(args.candidates).split(",")
    unknown = set(wanted) - set(CONFIGS)
    if unknown:
        raise SystemExit(f"unknown candidates {sorted(unknown)}; known: {sorted(CONFIGS)}")
    return wanted


def _child(args: argparse.Namespace) -> int:
    """Measure the pairs listed in the file ``--child`` names, one JSON line per event into
    ``<that file>.jsonl``: ``{"start": [shape, item]}`` before each pair, then its result."""
    import torch

    shapes = _select_shapes(args)
    pairs = [(str(a), str(b)) for a, b in json.loads(Path(args.child).read_text())]
    torch.backends.cuda.matmul.allow_tf32 = False  # the float32 reference stays float32
    with open(args.child + ".jsonl", "a") as sink:

        def emit(row: dict[str, Any]) -> None:
            sink.write(json.dumps(row) + "\n")
            sink.flush()

        def on_start(shape: str, item: str) -> None:
            emit({"start": [shape, item]})

        measure_pairs(pairs, shapes, torch.device("cuda", 0), gpu_timer, emit, on_start)
    return 0


def _read_events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a line cut off by a kill
    return events


def run_children(
    pairs: list[tuple[str, str]], args: argparse.Namespace, workdir: Path, record: Any
) -> None:
    """Measure ``pairs`` in child processes, restarting past a pair that hangs or crashes
    (that candidate's remaining pairs are dropped; an SDPA backend's, only that pair)."""
    remaining = list(pairs)
    attempt = 0
    ws_failures = 0
    while remaining and attempt < args.max_restarts + 1:
        attempt += 1
        plan_file = workdir / f"plan{attempt}.json"
        plan_file.write_text(json.dumps(remaining))
        events_file = Path(str(plan_file) + ".jsonl")
        command = [sys.executable, __file__, "--child", str(plan_file)]
        if args.shapes:
            command += ["--shapes", args.shapes]
        with open(workdir / f"child{attempt}.err", "w") as stderr:
            child = subprocess.Popen(command, stdout=stderr, stderr=stderr, cwd=REPO)
            seen, last_progress, killed = 0, time.monotonic(), False
            while child.poll() is None:
                time.sleep(0.5)
                events = _read_events(events_file)
                if len(events) != seen:
                    for event in events[seen:]:
                        if "start" not in event:
                            record(event)
                    seen, last_progress = len(events), time.monotonic()
                elif time.monotonic() - last_progress > args.pair_timeout:
                    child.kill()
                    killed = True
            child.wait()
        events = _read_events(events_file)
        for event in events[seen:]:
            if "start" not in event:
                record(event)
        rows = [e for e in events if "start" not in e]
        done = {(e["shape"], e["item"]) for e in rows}
        started = [tuple(e["start"]) for e in events if "start" in e]
        remaining = [p for p in remaining if p not in done]
        if not remaining:
            break
        tail = (workdir / f"child{attempt}.err").read_text()[-1500:]
        if rows and rows[-1].get("fatal") and (not started or started[-1] in done):
            # The child left after a CUDA error (its context is lost): drop that candidate.
            _drop(remaining, rows[-1]["shape"], rows[-1]["item"], "runtime_error", record)
            remaining = [p for p in remaining if p[1] != rows[-1]["item"]]
            continue
        culprit = started[-1] if started and started[-1] not in done else remaining[0]
        status = "hung" if killed else "crashed"
        why = (
            f"no progress for {args.pair_timeout:.0f}s: killed"
            if killed
            else f"child exited {child.returncode}"
        )
        record({"shape": culprit[0], "item": culprit[1], "status": status,
                "error": f"{why}; its stderr ends: {tail}"})  # fmt: skip
        if culprit[1].startswith("sdpa:"):
            remaining = [p for p in remaining if p != culprit]
            continue
        _drop(remaining, culprit[0], culprit[1], status, record)
        remaining = [p for p in remaining if p[1] != culprit[1]]
        if CONFIGS[culprit[1]]["WARP_SPECIALIZE"]:
            ws_failures += 1
            if ws_failures >= 2:
                # Two warp-specialised configs hung or crashed: the rest likely will too, and
                # each costs --pair-timeout; they are dropped to keep the run's time bounded.
                for p in remaining:
                    if CONFIGS.get(p[1], {}).get("WARP_SPECIALIZE"):
                        why = "two warp-specialised configs failed before it"
                        record({"shape": p[0], "item": p[1], "status": "skipped", "error": why})
                remaining = [
                    p for p in remaining if not CONFIGS.get(p[1], {}).get("WARP_SPECIALIZE")
                ]


def _drop(
    remaining: Sequence[tuple[str, str]], shape: str, item: str, why: str, record: Any
) -> None:
    for p in remaining:
        if p[1] == item and p[0] != shape:
            record({"shape": p[0], "item": p[1], "status": "skipped",
                    "error": f"{item} {why} on {shape}"})  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="JSON results path")
    parser.add_argument("--shapes", help="comma-separated shape names (default: all)")
    parser.add_argument("--candidates", help="comma-separated candidate names (default: all)")
    parser.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1),
                        help="compile processes")  # fmt: skip
    parser.add_argument("--pair-timeout", type=float, default=45.0,
                        help="seconds without progress before a hung child is killed")  # fmt: skip
    parser.add_argument("--max-restarts", type=int, default=6)
    parser.add_argument("--interpret", action="store_true",
                        help="CPU, TRITON_INTERPRET=1, tiny shapes: the plumbing only")  # fmt: skip
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return _child(args)
    shapes = _select_shapes(args)
    names = _select_candidates(args)
    started = time.time()
    report: dict[str, Any] = {
        "what": "triton.attention candidates vs scaled_dot_product_attention backends "
        "(benchmarks/attention_gpu.py): median of triton.testing.do_bench, L2 flushed",
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "shapes": [asdict(s) for s in shapes],
        "candidates": {n: CONFIGS[n] for n in (names or CONFIGS)},
        "compile": {},
        "results": [],
    }

    def save() -> None:
        report["summary"] = summarize(shapes, report["results"])
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(args.out + ".tmp")
            tmp.write_text(json.dumps(report, indent=1, default=str))
            os.replace(tmp, args.out)

    def record(row: dict[str, Any]) -> None:
        report["results"].append(row)
        extra = f" {row['median_ms'] * 1e3:.1f}us" if row.get("status") == "ok" else ""
        err = f" {row.get('error', '')[:160]}" if row.get("status") != "ok" else ""
        sys.stdout.write(f"{row['shape']:30s} {row['item']:22s} {row.get('status')}{extra}{err}\n")
        sys.stdout.flush()
        save()

    if args.interpret:
        os.environ["TRITON_INTERPRET"] = "1"
        import torch

        report["environment"] = {"device": "cpu (Triton interpreter)", "torch": torch.__version__}
        measure_pairs(plan(shapes, names, set()), shapes, torch.device("cpu"), wall_timer, record)
    else:
        os.environ.pop("TRITON_INTERPRET", None)  # the compile processes inherit this
        import torch

        from tunehub.kernels.gpu_timing import gpu_environment

        device = torch.device("cuda", 0)
        report["environment"] = gpu_environment(device)
        props = torch.cuda.get_device_properties(device)
        capability = props.major * 10 + props.minor
        smem = int(getattr(props, "shared_memory_per_block_optin", 0) or 0)
        compiled = precompile_all(shapes, names, capability, args.jobs)
        skip: set[tuple[str, str]] = set()
        for (shape_name, name), facts in compiled.items():
            report["compile"].setdefault(name, {})[shape_name] = facts
            reason = None
            if not facts["ok"]:
                reason = f"compile failed: {facts['error']}"
            elif smem and facts["shared_bytes"] > smem:
                reason = f"needs {facts['shared_bytes']} bytes of shared memory, has {smem}"
            if reason:
                skip.add((shape_name, name))
                record({"shape": shape_name, "item": name, "status": "build_error",
                        "error": reason})  # fmt: skip
        sys.stdout.write(f"compiled in {time.time() - started:.0f}s\n")
        with tempfile.TemporaryDirectory(prefix="attention_gpu_") as tmp:
            run_children(plan(shapes, names, skip), args, Path(tmp), record)
    report["wall_secs"] = round(time.time() - started, 1)
    save()
    print_summary(report["summary"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
