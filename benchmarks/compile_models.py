"""Whole models under ``torch.compile(backend="tunehub")`` against eager, Inductor's default and
max-autotune: time per step in plain launch and under CUDA graphs, compile time, and which
kernel each GEMM ran.

Models (fp16 unless said): ``gpt2`` (a GPT-2-small-shaped decoder: 4 layers, hidden 768, 12
heads, vocabulary 50,304; cases ``b8`` = 8 x 512 tokens, ``b1`` = 1 x 512), ``llama`` (a
LLaMA-shaped block, hidden 4096, MLP 11008, 32 heads; ``prefill`` = 1 x 2048 tokens, causal,
``decode`` = 16 sequences x 1 token over a 1024-token cache), ``vit`` (ViT-B-shaped
MLP-heavy encoder: 4 blocks of LayerNorm + attention + 768 -> 3072 -> 768 GELU MLP; ``b64`` = 64
images x 197 tokens, ``b8``). Extra cases with ``--extras``: ``gpt2/train-fp32`` and
``gpt2/train-bf16`` (2 layers, 4 x 256, forward + backward + SGD step; bf16 under
``torch.autocast``), ``gpt2/offline`` (b8 with no service: every GEMM as Inductor's default),
``gpt2/dynamic`` (``dynamic=True`` over 5 sequence lengths: compile time). Optional
contenders (``--contenders``), reported beside tunehub: ``tunehub-kernels`` (tunehub's own
kernels on, as under CUDA graphs) and ``tunehub-inline`` (its kernels compiled in the
compiling thread, ``compile_aside`` off: the summary's ``inline_compile_over_default``).

    python benchmarks/compile_models.py --home /tmp/cm --tune-only          # tune the shapes
    python benchmarks/compile_models.py --home /tmp/cm --models gpt2 --out $OUT/a.json
    python benchmarks/compile_models.py --dry-run                            # CPU, tiny

On a GPU the models' attention (their ``scaled_dot_product_attention`` calls, as the backend
plans them) is tuned and looked up with their GEMMs (``--no-attention``: GEMMs only), and the
generated code's SDPA calls and tunehub attention kernels are counted beside its GEMMs.

Each (case, contender) runs in a fresh process with cold Inductor and Triton caches (so every
compile time is a cold compile; tunehub's includes its lookups), on the same half of the
machine's cores (from 8 cores up; the service runs on the other half and only answers
lookups). Plain launch: median of ``--rounds`` event-timed rounds of back-to-back steps;
graphs: the compiled step captured in one CUDA graph (max-autotune compiled without its own
graphs, so all four are captured the same way). The JSON's ``summary`` holds, per (model,
case, mode), ``tunehub_over_best_inductor`` (tunehub's speed over the faster of default and
max-autotune; above 1: tunehub faster) and their geomean. ``--warm`` times each compile
again in a second fresh process that finds the caches the first left (what a user's next run
of the same script pays: ``warm_compile_secs``, and what Inductor's caches did). Each tunehub
run records where its compile went (``tunehub.compile_secs``: the backend's own share before
Inductor, and Inductor's); every compiled contender records its first call's phases
(``compile_phases``: before Inductor, in Inductor's ``compile_fx``, after it).
``COMPILE_MODELS_PROFILE=DIR`` writes a cProfile of each worker's
compile (its first call) to DIR, and the code Inductor generated beside it
(``COMPILE_MODELS_CODE=DIR``: the code alone). ``--kernel-times`` profiles the compiled steps'
GPU kernels: each kernel's median time in launch order (``kernel_us``), so a GEMM's time inside
the model stands beside its time measured alone; the summary's plain-launch rows then add the
kernels summed (``gpu_ms``, ``tunehub_gpu_over_default``), what the GPU did where the host
bounds the step.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from local_service import REPO, local_service, lookup, machine, tune_shapes

CONTENDERS = ("eager", "default", "max-autotune", "tunehub")
# Also measured on request (--contenders), reported beside tunehub, never in its place: the
# backend with tunehub's own kernels on, as under CUDA graphs; and the backend compiling its
# kernels in the compiling thread, as Inductor would (``compile_aside`` off: the route's A/B).
OPTIONAL_CONTENDERS = ("tunehub-kernels", "tunehub-inline")
CASES = {
    "gpt2": {"b8": (8, 512), "b1": (1, 512)},
    "llama": {"prefill": (1, 2048), "decode": (16, 1)},
    "vit": {"b64": (64, 197), "b8": (8, 197)},
}
TUNEHUB_KERNELS = (
    "_gemm_tiled_kernel",
    "_gemm_splitk_kernel",
    "_gemm_persistent_kernel",
    "_gemm_tma_kernel",
)
EXTRAS = ("train-fp32", "train-bf16", "offline", "dynamic")
DYNAMIC_LENGTHS = (128, 192, 256, 384, 512)


# --------------------------------------------------------------------------------------------
# The models (built in the worker processes)
# --------------------------------------------------------------------------------------------


def make_model(name: str, dims: dict[str, int], batch: int) -> Any:
    import torch
    import torch.nn.functional as F

    class Attention(torch.nn.Module):
        def __init__(self, hidden: int, heads: int, bias: bool, causal: bool) -> None:
            super().__init__()
            self.heads, self.causal = heads, causal
            self.qkv = torch.nn.Linear(hidden, 3 * hidden, bias=bias)
            self.proj = torch.nn.Linear(hidden, hidden, bias=bias)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, s, h = x.shape
            q, k, v = self.qkv(x).split(h, dim=-1)
            q, k, v = (t.view(b, s, self.heads, h // self.heads).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
            return self.proj(y.transpose(1, 2).reshape(b, s, h))

    class Encoder(torch.nn.Module):
        """GPT-2 (causal, with an LM head) or ViT (bidirectional) blocks, pre-LayerNorm."""

        def __init__(self, layers: int, hidden: int, heads: int, vocab: int, causal: bool):
            super().__init__()
            self.blocks = torch.nn.ModuleList()
            for _ in range(layers):
                block = torch.nn.ModuleDict(
                    {
                        "ln1": torch.nn.LayerNorm(hidden),
                        "attn": Attention(hidden, heads, True, causal),
                        "ln2": torch.nn.LayerNorm(hidden),
                        "fc": torch.nn.Linear(hidden, 4 * hidden),
                        "out": torch.nn.Linear(4 * hidden, hidden),
                    }
                )
                self.blocks.append(block)
            self.ln = torch.nn.LayerNorm(hidden)
            self.head = torch.nn.Linear(hidden, vocab, bias=False) if vocab else None

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for blk in self.blocks:
                x = x + blk["attn"](blk["ln1"](x))
                x = x + blk["out"](F.gelu(blk["fc"](blk["ln2"](x))))
            x = self.ln(x)
            return self.head(x) if self.head is not None else x

    if name in ("gpt2", "vit"):
        hidden = dims["hidden"]
        vocab = dims["vocab"] if name == "gpt2" else 0
        return Encoder(dims["layers"], hidden, max(1, hidden // 64), vocab, causal=name == "gpt2")
    return make_llama_block(dims["hidden"], dims["mlp"], dims["heads"], dims["context"], batch)


def make_llama_block(hidden: int, mlp: int, heads: int, context: int, batch: int) -> Any:
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


def model_dims(args: argparse.Namespace, model: str, case: str) -> dict[str, int]:
    if model == "llama":
        return {
            "hidden": args.llama_hidden,
            "mlp": args.llama_mlp,
            "heads": args.llama_heads,
            "context": args.llama_context if case == "decode" else 0,
        }
    layers = 2 if case.startswith("train") else args.layers
    return {"layers": layers}


def case_shape(args: argparse.Namespace, model: str, case: str) -> tuple[int, int]:
    """(batch, sequence) of a case."""
    if case.startswith("train"):
        return 4, 256
    if case in ("offline", "dynamic"):
        return CASES["gpt2"]["b8"]
    batch, seq = CASES[model][case]
    if args.dry_run:
        return min(batch, 2), min(seq, 16)
    return batch, seq


def gemm_workloads(args: argparse.Namespace, model: str, case: str) -> list[dict[str, Any]]:
    """The case's GEMMs as tunehub workloads, as the backend plans them: x (T x K) times an
    nn.Linear weight (a column-major K x N B), ``bias`` where the layer has one, ``bias_gelu``
    for the MLP's first layer, whose only user is its GELU (not in training: the backward
    needs the GEMM's own output)."""
    batch, seq = case_shape(args, model, case)
    t = batch * seq
    training = case in ("train-fp32", "train-bf16")
    if model == "llama":
        h, mlp = args.llama_hidden, args.llama_mlp
        shapes = [(3 * h, h, "none"), (h, h, "none"), (mlp, h, "none"), (h, mlp, "none")]
    else:
        h = args.hidden
        up = "bias" if training else "bias_gelu"
        shapes = [(3 * h, h, "bias"), (h, h, "bias"), (4 * h, h, up), (h, 4 * h, "bias")]
        if model == "gpt2":
            shapes.append((args.vocab, h, "none"))
    dtype = {"train-fp32": "float32", "train-bf16": "bfloat16"}.get(case, args.dtype)
    return [
        {"m": t, "n": n, "k": k, "dtype": dtype, "b_layout": "col_major", "epilogue": epilogue}
        for n, k, epilogue in shapes
    ]


def attention_workloads(args: argparse.Namespace, model: str, case: str) -> list[dict[str, Any]]:
    """The case's ``scaled_dot_product_attention`` call as a tunehub ``attention`` workload,
    as the backend plans it; none for the extras (training graphs and dynamic sizes keep
    SDPA; offline has no service). LLaMA's decode attends its token to the cache, not
    causal."""
    if case in EXTRAS:
        return []
    batch, seq = case_shape(args, model, case)
    if model == "llama":
        heads, head_dim = args.llama_heads, args.llama_hidden // args.llama_heads
        kv_len = seq + (args.llama_context if case == "decode" else 0)
        causal = case != "decode"
    else:
        heads = max(1, args.hidden // 64)
        head_dim, kv_len, causal = args.hidden // heads, seq, model == "gpt2"
    return [{"op": "attention", "batch": batch, "heads": heads, "m": seq, "n": kv_len,
             "k": head_dim, "causal": causal, "dtype": args.dtype}]  # fmt: skip


# --------------------------------------------------------------------------------------------
# One (case, contender), in its own process
# --------------------------------------------------------------------------------------------


def worker(spec: dict[str, Any]) -> dict[str, Any]:
    if spec.get("cpus"):
        # The same cores for every contender, apart from the service's: a host-bound step's
        # time moved by up to 2x between fresh processes left to the scheduler (H200 machine).
        os.sched_setaffinity(0, spec["cpus"])
    import torch

    device = spec["device"]
    cuda = device == "cuda"
    dtype = getattr(torch, spec["dtype"])
    torch.manual_seed(0)
    model_name, case, contender = spec["model"], spec["case"], spec["contender"]
    training = case.startswith("train")
    model = make_model(model_name, spec["dims"], spec["batch"])
    model = model.to(device=device, dtype=torch.float32 if training else dtype)
    model.train(training)
    hidden = spec["dims"].get("hidden", 768)
    x = torch.randn(spec["batch"], spec["seq"], hidden, device=device)
    x = x if training else x.to(dtype)
    result: dict[str, Any] = {k: spec[k] for k in ("model", "case", "contender")}

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    torch._dynamo.reset()
    phases = _time_inductor() if contender != "eager" else None
    if contender == "eager":
        compiled = model
    elif contender in ("tunehub", *OPTIONAL_CONTENDERS):
        # tunehub-kernels: what mode="reduce-overhead" gives through the backend (tunehub's own
        # kernels where they measured faster and Inductor's template cannot run them).
        options = dict(spec.get("tunehub_options") or {})
        if contender == "tunehub-kernels":
            options["tunehub_kernels"] = True
        if contender == "tunehub-inline":
            options["compile_aside"] = False
        compiled = torch.compile(
            model, backend=_tunehub_backend(), dynamic=spec["dynamic"], options=options or None
        )
    else:
        mode = None if contender == "default" else "max-autotune-no-cudagraphs"
        compiled = torch.compile(model, mode=mode, dynamic=spec["dynamic"])

    if training:
        autocast = case == "train-bf16"
        opt = torch.optim.SGD(model.parameters(), lr=1e-4)

        def step(inp: Any) -> Any:
            with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
                loss = compiled(inp).float().pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=False)
            return loss

        start = time.perf_counter()
        step(x)
        sync()
        result["compile_secs"] = time.perf_counter() - start
        result["compile_phases"] = _phases(phases, start)
        result["launch_ms"] = _time(step, x, spec, cuda)
        result["graph_ms"] = None
        result["rel_err"] = None
        return _with_kernels(result, contender)

    with torch.no_grad():
        if spec["dynamic"]:
            start = time.perf_counter()
            for seq in DYNAMIC_LENGTHS:
                compiled(torch.randn(spec["batch"], seq, hidden, device=device, dtype=dtype))
            sync()
            result["compile_secs"] = time.perf_counter() - start
            result["compile_phases"] = _phases(phases, start)
            result["launch_ms"] = _time(compiled, x, spec, cuda)
            result["graph_ms"] = None
            result["rel_err"] = None
            return _with_kernels(result, contender)
        expected = model(x).float()
        sync()
        start = time.perf_counter()
        if contender != "eager":
            from torch._inductor.utils import run_and_get_code

            profile_dir = os.environ.get("COMPILE_MODELS_PROFILE")
            code_dir = os.environ.get("COMPILE_MODELS_CODE") or profile_dir
            name = f"{spec['model']}-{spec['case']}-{contender}-{os.getpid()}"
            if profile_dir:  # where a compile's time goes (cProfile slows it: not timed)
                import cProfile

                profiler = cProfile.Profile()
                out, codes = profiler.runcall(run_and_get_code, compiled, x)
                profiler.dump_stats(str(Path(profile_dir) / f"{name}.prof"))
            else:
                out, codes = run_and_get_code(compiled, x)
            if code_dir:
                Path(code_dir, f"{name}.py").write_text("\n\n".join(codes))
            result["kernels"] = _kernel_counts("\n".join(codes))
        else:
            out = compiled(x)
        sync()
        result["compile_secs"] = time.perf_counter() - start
        result["compile_phases"] = _phases(phases, start)
        result["rel_err"] = float((out.float() - expected).norm() / expected.norm())
        result["launch_ms"] = _time(compiled, x, spec, cuda)
        result["graph_ms"] = None
        if cuda and spec.get("kernel_times"):
            result["kernel_us"] = _kernel_times(compiled, x, spec["reps"])
        if cuda:
            try:
                result["graph_ms"] = _time_graph(compiled, x, spec)
            except Exception as exc:  # a step that cannot be captured: launch time only
                result["graph_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    return _with_kernels(result, contender)


def _kernel_times(step: Any, x: Any, steps: int) -> list[list[Any]] | str:
    """The GPU kernels of one step in launch order, each with its median time (us) over
    ``steps`` profiled steps: what each GEMM costs inside the model, beside what it measured
    alone when tuned."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        step(x)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step(x)
        torch.cuda.synchronize()
    kernels = [
        (event.name, event.time_range.start, event.time_range.elapsed_us())
        for event in prof.events()
        if event.device_type == torch.autograd.DeviceType.CUDA
    ]
    return kernels_per_step(kernels, steps)


def kernels_per_step(kernels: list[tuple[str, float, float]], steps: int) -> list[list[Any]] | str:
    """``kernels`` ((name, start, us) of ``steps`` steps' kernels) as one step's: [name, median
    us] in launch order; a message where the steps did not launch the same kernels."""
    ordered = sorted(kernels, key=lambda k: k[1])
    per_step, extra = divmod(len(ordered), steps)
    if not per_step or extra:
        return f"{len(ordered)} kernels in {steps} steps: not the same kernels each step"
    names = [name for name, _, _ in ordered[:per_step]]
    for i in range(steps):
        if [name for name, _, _ in ordered[i * per_step : (i + 1) * per_step]] != names:
            return f"step {i} launched other kernels than step 0"
    times = [[us for _, _, us in ordered[j::per_step]] for j in range(per_step)]
    return [[name[:100], round(statistics.median(times[j]), 2)] for j, name in enumerate(names)]


def _time_inductor() -> list[tuple[float, float]]:
    """Times each outermost call of Inductor's ``compile_fx`` (the default backend's and the
    tunehub backend's both call it): (entered, left) by ``time.perf_counter``."""
    import torch._inductor.compile_fx as compile_fx_module

    calls: list[tuple[float, float]] = []
    inner = compile_fx_module.compile_fx
    depth = [0]

    def timed(*args: Any, **kwargs: Any) -> Any:
        depth[0] += 1
        entered = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            depth[0] -= 1
            if not depth[0]:
                calls.append((entered, time.perf_counter()))

    compile_fx_module.compile_fx = timed
    return calls


def _aside_stats() -> dict[str, int]:
    """What the backend did with its kernels' compiles in this process (``compile_aside``):
    compiled on a thread of their own, here, or here after the thread failed."""
    aside = sys.modules.get("tunehub.client.compile_aside")
    return dict(aside.STATS) if aside is not None else {}


def _phases(calls: list[tuple[float, float]] | None, start: float) -> dict[str, float] | None:
    """Where a first call's time went: before Inductor was handed the graph (Dynamo's trace,
    and a backend's own work), in Inductor, and after it (the first run: kernels loaded,
    launchers built)."""
    if not calls:
        return None
    end = time.perf_counter()
    inductor = sum(left - entered for entered, left in calls)
    return {
        "to_inductor": calls[0][0] - start,
        "inductor": inductor,
        "after_inductor": end - calls[0][0] - inductor,
    }


def _answer_line(workload: dict[str, Any], answer: dict[str, Any]) -> str:
    """One lookup's answer as a line of the tuning table."""
    speed = answer.get("speedup_vs_baseline")
    config = answer.get("config") or {}
    vs = f"{speed:.3f}x" if speed else "-"
    if speed and speed >= 1 and answer.get("baseline_faster"):
        vs = f"tie {vs}"  # within LIBRARY_TIE or the confirmation rounds' spread
    tile = "x".join(str(config[f"BLOCK_{d}"]) for d in "MNK" if f"BLOCK_{d}" in config)
    w = workload
    if w.get("op") == "attention":
        shape = f"{w['batch']}x{w['heads']} {w['m']}x{w['n']}x{w['k']}{' c' if w['causal'] else ''}"
        kind = "gluon" if config.get("GLUON") else "tma" if config.get("TMA") else "ptr"
    else:
        shape, kind = f"{w['m']:>6d}x{w['n']}x{w['k']}", config.get("variant")
    return f"{shape:24s} {answer.get('source', '?'):>8s} {vs:>11s}  {kind} {tile}"


def _kernel_counts(code: str) -> dict[str, int]:
    """What the generated code runs for its GEMMs."""
    return {
        "library_mm": code.count("extern_kernels.mm(") + code.count("extern_kernels.addmm("),
        "library_bmm": code.count("extern_kernels.bmm("),
        "inductor_templates": code.count("def triton_tem_"),
        "tunehub_kernels": sum(code.count(f"def {name}") for name in TUNEHUB_KERNELS),
        "tunehub_custom_op_calls": code.count("torch.ops.tunehub."),
        # Attention: SDPA's own calls (flash, efficient, cuDNN) and tunehub's kernel.
        "library_attention": len(
            re.findall(r"= torch\.ops\.aten\._scaled_dot_product_\w+\.default\(", code)
        ),
        "tunehub_attention": code.count("def _attention_fwd"),
    }


def _with_kernels(result: dict[str, Any], contender: str) -> dict[str, Any]:
    if contender != "eager":
        from torch._dynamo.utils import counters

        # Inductor's FX graph cache and AOTAutograd's cache: hits, misses and bypasses.
        result["caches"] = {
            name: value
            for group in ("inductor", "aot_autograd")
            for name, value in counters[group].items()
            if "cache" in name
        }
    if contender.startswith("tunehub"):
        from tunehub.client.gemm_choice import CALLS, CHOOSER
        from tunehub.client.inductor_gemm import DECISIONS
        from tunehub.client.torch_backend import COMPILE_SECS, PLANNED, REWRITES

        result["tunehub"] = {
            "compile_secs": dict(COMPILE_SECS),
            "planned": dict(PLANNED),
            "lowered": dict(DECISIONS),
            "cpu_rewrites": dict(REWRITES),
            "compile_aside": _aside_stats(),
            "calls": dict(CALLS),
            "lookups": {
                f"{k[10][0] + ' ' if k[10] else ''}{k[0]}x{k[1]}x{k[2]} {k[3]} {k[6]}": {
                    "source": c.source,
                    "library": c.use_library,
                    "variant": c.config.get("variant"),
                }
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

    for _ in range(3):
        step(x)
    times = []
    for _ in range(spec["rounds"]):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(spec["reps"]):
                step(x)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / spec["reps"])
        else:
            t0 = time.perf_counter()
            for _ in range(spec["reps"]):
                step(x)
            times.append((time.perf_counter() - t0) * 1e3 / spec["reps"])
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


def run_worker(
    spec: dict[str, Any], env: dict[str, str], timeout: float, *, warm: bool = False
) -> dict[str, Any]:
    """One (case, contender) in a fresh process with cold caches; with ``warm``, then again in
    a second fresh process with the caches the first left (its compile time as
    ``warm_compile_secs``, what its caches did as ``warm_caches``)."""
    with tempfile.TemporaryDirectory(prefix="compile-models-") as tmp:
        result = _run_in(tmp, spec, env, timeout)
        if warm and "error" not in result:
            again = _run_in(tmp, spec, env, timeout)
            if "error" in again:
                result["warm_error"] = again["error"]
            else:
                result["warm_compile_secs"] = again["compile_secs"]
                result["warm_caches"] = again.get("caches")
                result["warm_compile_phases"] = again.get("compile_phases")
                if "tunehub" in again:
                    result["warm_tunehub_compile_secs"] = again["tunehub"]["compile_secs"]
        return result


def _run_in(tmp: str, spec: dict[str, Any], env: dict[str, str], timeout: float) -> dict[str, Any]:
    """One worker process whose caches live under ``tmp``."""
    environment = {
        **os.environ,
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        # Caches of its own: the first process in it compiles cold.
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


def _medians(runs: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """One row per (model, case, contender): the first run's, with the medians of every
    repeat's times."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault((r["model"], r["case"], r["contender"]), []).append(r)
    out = {}
    for key, group in groups.items():
        row = dict(group[0])
        for field in ("launch_ms", "graph_ms", "compile_secs", "warm_compile_secs"):
            values = [r[field] for r in group if r.get(field)]
            row[field] = statistics.median(values) if values else None
        gpu = [us / 1e3 for r in group if (us := _gpu_us(r)) is not None]
        row["gpu_ms"] = statistics.median(gpu) if gpu else None
        row["repeats"] = len(group)
        out[key] = row
    return out


def _gpu_us(run: dict[str, Any]) -> float | None:
    """--kernel-times: the GPU's time in a step (its kernels summed), whatever the host's."""
    kernels = run.get("kernel_us")
    return sum(us for _, us in kernels) if isinstance(kernels, list) else None


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per (model, case, mode): each contender's ms, tunehub over the faster Inductor, and
    over eager and Inductor's default; the geomeans; compile-time ratios."""
    ok = _medians([r for r in runs if "error" not in r])
    rows: dict[str, Any] = {}
    ratios: dict[str, list[float]] = {"best_inductor": [], "default": [], "eager": []}
    compile_ratios, warm_ratios = [], []
    for (model, case, contender), mine in ok.items():
        if contender != "tunehub":
            continue
        default = ok.get((model, case, "default"))
        if default and mine.get("compile_secs"):
            compile_ratios.append(mine["compile_secs"] / default["compile_secs"])
        if default and mine.get("warm_compile_secs") and default.get("warm_compile_secs"):
            warm_ratios.append(mine["warm_compile_secs"] / default["warm_compile_secs"])
        for mode, field in (("launch", "launch_ms"), ("graphs", "graph_ms")):
            if not mine.get(field):
                continue
            names = CONTENDERS + OPTIONAL_CONTENDERS
            ms = {c: ok[(model, case, c)].get(field) for c in names if (model, case, c) in ok}
            ms = {c: v for c, v in ms.items() if v}
            inductor = [ms[c] for c in ("default", "max-autotune") if c in ms]
            row: dict[str, Any] = {"ms": ms}
            if inductor:
                row["tunehub_over_best_inductor"] = min(inductor) / ms["tunehub"]
                ratios["best_inductor"].append(row["tunehub_over_best_inductor"])
                if "tunehub-kernels" in ms:
                    row["tunehub_kernels_over_best_inductor"] = (
                        min(inductor) / ms["tunehub-kernels"]
                    )
            if "default" in ms:
                row["tunehub_over_default"] = ms["default"] / ms["tunehub"]
                ratios["default"].append(row["tunehub_over_default"])
            if mode == "launch" and default and default.get("gpu_ms") and mine.get("gpu_ms"):
                # The same steps' GPU kernels summed: what the GPU did, where plain launch
                # is host-bound and its step time says more of the host than of the kernels.
                row["gpu_ms"] = {"default": default["gpu_ms"], "tunehub": mine["gpu_ms"]}
                row["tunehub_gpu_over_default"] = default["gpu_ms"] / mine["gpu_ms"]
            if "eager" in ms:
                row["tunehub_over_eager"] = ms["eager"] / ms["tunehub"]
                ratios["eager"].append(row["tunehub_over_eager"])
            if default and default.get("compile_secs"):
                row["compile_over_default"] = mine["compile_secs"] / default["compile_secs"]
            if default and mine.get("warm_compile_secs") and default.get("warm_compile_secs"):
                row["warm_compile_over_default"] = (
                    mine["warm_compile_secs"] / default["warm_compile_secs"]
                )
            inline = ok.get((model, case, "tunehub-inline"))
            if default and default.get("compile_secs") and inline and inline.get("compile_secs"):
                row["inline_compile_over_default"] = (
                    inline["compile_secs"] / default["compile_secs"]
                )
            rows[f"{model}/{case}/{mode}"] = row
    return {
        "rows": rows,
        "geomean_tunehub_over_best_inductor": geomean(ratios["best_inductor"]),
        "min_tunehub_over_best_inductor": min(ratios["best_inductor"], default=None),
        "geomean_tunehub_over_default": geomean(ratios["default"]),
        "min_tunehub_over_eager": min(ratios["eager"], default=None),
        "geomean_compile_over_default": geomean(compile_ratios),
        "max_compile_over_default": max(compile_ratios, default=None),
        "geomean_warm_compile_over_default": geomean(warm_ratios),
    }


def print_table(runs: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    print()
    print(f"{'model/case':20s} {'contender':13s} {'launch ms':>10s} {'graph ms':>9s} "
          f"{'compile s':>10s} {'rel err':>9s}  GEMM kernels")  # fmt: skip
    for r in runs:
        label = f"{r['model']}/{r['case']}"
        if "error" in r:
            print(f"{label:20s} {r['contender']:13s} FAILED: {r['error'][-400:]}")
            continue
        graph = f"{r['graph_ms']:.3f}" if r.get("graph_ms") else "-"
        err = f"{r['rel_err']:.1e}" if r.get("rel_err") is not None else "-"
        kernels = r.get("kernels", "")
        if r.get("warm_compile_secs"):
            kernels = f"warm compile {r['warm_compile_secs']:.1f} s; {kernels}"
        if "tunehub" in r:
            kernels = f"{kernels} planned {sorted(r['tunehub']['planned'].values())}"
        print(f"{label:20s} {r['contender']:13s} {r['launch_ms']:>10.3f} {graph:>9s} "
              f"{r['compile_secs']:>10.1f} {err:>9s}  {kernels}")  # fmt: skip
    for r in runs:
        total = _gpu_us(r)
        if total is not None:
            print(f"\n{r['model']}/{r['case']} {r['contender']}: GPU kernels in launch order, "
                  f"median us ({total:.1f} us in all)")  # fmt: skip
            for name, us in r["kernel_us"]:
                print(f"  {us:9.2f}  {name}")
        elif r.get("kernel_us"):
            print(f"\n{r['model']}/{r['case']} {r['contender']}: {r['kernel_us']}")
    print()
    for key, row in summary["rows"].items():
        parts = [f"{name} {row[name]:.3f}x" for name in
                 ("tunehub_over_best_inductor", "tunehub_kernels_over_best_inductor",
                  "tunehub_over_default", "tunehub_gpu_over_default", "tunehub_over_eager",
                  "compile_over_default", "warm_compile_over_default")
                 if name in row]  # fmt: skip
        print(f"{key:28s} " + ", ".join(parts))
    print(
        "geomean tunehub over the faster Inductor: "
        f"{summary['geomean_tunehub_over_best_inductor'] or 0:.3f}x "
        f"(min {summary['min_tunehub_over_best_inductor'] or 0:.3f}x); compile time "
        f"{summary['geomean_compile_over_default'] or 0:.3f}x of default's "
        f"(max {summary['max_compile_over_default'] or 0:.3f}x)"
    )


def merge(parts: list[dict[str, Any]], paths: list[Path]) -> dict[str, Any]:
    """One result of several steps' results: every run (each tagged with its file), the
    tuning step's lookups, one summary over all runs. Refuses steps of different GPUs."""
    gpus = {str(p.get("machine", {}).get("gpu")) for p in parts}
    if len(gpus) > 1:
        raise SystemExit(f"--merge: the steps ran on different GPUs: {sorted(gpus)}")
    runs = [{**run, "from": path.name} for part, path in zip(parts, paths, strict=True)
            for run in part.get("runs", [])]  # fmt: skip
    merged: dict[str, Any] = {
        "machine": parts[0].get("machine"),
        "target": parts[0].get("target"),
        "steps": [
            {"file": path.name, "args": part.get("args")}
            for part, path in zip(parts, paths, strict=True)
        ],
    }
    # The tuning step's lookups (the others' only repeat them).
    for part in sorted(parts, key=lambda p: "tuning_secs" in p):
        if part.get("lookups"):
            merged.update({k: part[k] for k in ("lookups", "tuning_secs", "jobs") if k in part})
    merged["runs"] = runs
    merged["summary"] = summarize(runs)
    return merged


def write(path: Path, results: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=1, default=str))
    tmp.replace(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--url", help="a tunehub service that has (or will tune) the shapes")
    parser.add_argument("--api-key", help="write key for --url (default $TUNEHUB_API_KEY)")
    parser.add_argument("--target", default=None, help="target to tune and look up on")
    parser.add_argument("--models", default="gpt2,llama,vit")
    parser.add_argument("--cases", default="", help="only these cases (e.g. b8,prefill)")
    parser.add_argument("--extras", default="", help=f"comma-separated of {', '.join(EXTRAS)}")
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--vocab", type=int, default=50304)
    parser.add_argument("--llama-hidden", type=int, default=4096)
    parser.add_argument("--llama-mlp", type=int, default=11008)
    parser.add_argument("--llama-heads", type=int, default=32)
    parser.add_argument("--llama-context", type=int, default=1024)
    parser.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    parser.add_argument("--home", type=Path, help="keep the started service's data here")
    parser.add_argument("--trials", type=int, default=16, help="tuning trials per shape")
    parser.add_argument("--attention", action=argparse.BooleanOptionalAction, default=True,
                        help="tune and look up the models' attention too (GPU)")  # fmt: skip
    parser.add_argument("--job-secs", type=float, default=20.0, help="tuning secs per shape")
    parser.add_argument("--tune-only", action="store_true", help="tune the shapes, run nothing")
    parser.add_argument("--skip-tune", action="store_true", help="the service has the shapes")
    parser.add_argument("--reps", type=int, default=20, help="calls per timing round")
    parser.add_argument("--rounds", type=int, default=7, help="timing rounds (median)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="fresh processes per (case, contender), in turn (median)")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=600.0, help="per worker, seconds")
    parser.add_argument("--warm", action="store_true",
                        help="also time each compile again in a second fresh process with the "
                             "caches the first left (a user's next run)")  # fmt: skip
    parser.add_argument("--tunehub-options", type=json.loads, default=None, metavar="JSON",
                        help="the tunehub contenders' backend options, e.g. "
                             "'{\"fx_graph_cache\": true}'")  # fmt: skip
    parser.add_argument("--kernel-times", action="store_true",
                        help="profile each compiled step's GPU kernels (their times in "
                             "launch order, the JSON's kernel_us)")  # fmt: skip
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny models")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("--merge", type=Path, nargs="+", metavar="JSON",
                        help="combine the runs of earlier --out files (steps of one GPU "
                             "machine kind) into --out, with one summary")  # fmt: skip
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return 0
    if args.merge:
        if not args.out:
            parser.error("--merge needs --out")
        merged = merge([json.loads(path.read_text()) for path in args.merge], args.merge)
        print_table(merged["runs"], merged["summary"])
        write(args.out, merged)
        print(f"wrote {args.out}")
        return 0

    device = "cuda"
    if args.dry_run:
        device = "cpu"
        args.layers, args.hidden, args.vocab = 1, 64, 96
        args.llama_hidden, args.llama_mlp, args.llama_heads, args.llama_context = 64, 96, 4, 16
        args.dtype, args.trials, args.job_secs, args.reps, args.rounds = "float32", 2, 30, 2, 2
    models = [m for m in args.models.split(",") if m]
    only = {c for c in args.cases.split(",") if c}
    cases = [(m, c) for m in models for c in CASES[m] if not only or c in only]
    cases += [("gpt2", e) for e in args.extras.split(",") if e]
    contenders = [c for c in args.contenders.split(",") if c]
    unknown = set(contenders) - set(CONTENDERS + OPTIONAL_CONTENDERS)
    if unknown:
        parser.error(f"unknown contender(s) {sorted(unknown)}: choose from "
                     f"{', '.join(CONTENDERS + OPTIONAL_CONTENDERS)}")  # fmt: skip
    target = args.target or ("local-cpu" if device == "cpu" else "local-cuda:0")
    template = "blis.gemm" if device == "cpu" else "triton.gemm"
    results: dict[str, Any] = {
        "machine": machine(),
        "args": {k: v for k, v in vars(args).items() if k not in ("worker", "api_key", "out")},
        "target": target,
    }
    runs: list[dict[str, Any]] = []
    # No background trainer: nothing of the service but its answers competes with the timed
    # steps for the host's cores (a fleet's service runs elsewhere). Its GPU worker stays: the
    # service knows the GPU's target ("local-cuda:0") by it.
    gpus = "none" if args.dry_run else "auto"
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    worker_cpus = cores[len(cores) // 2 :] if len(cores) >= 8 else []
    if worker_cpus:  # the service (started next) inherits the other half
        os.sched_setaffinity(0, cores[: len(cores) // 2])
    with local_service(args.url, args.api_key, gpus=gpus, home=args.home,
                       TUNEHUB_TRAIN_MODELS="false") as service:  # fmt: skip
        workloads = [w for m, c in cases if c not in ("offline",) for w in
                     gemm_workloads(args, m, c)]  # fmt: skip
        if device == "cpu":
            workloads = [{**w, "b_layout": "row_major", "epilogue": "none"} for w in workloads]
        unique = [dict(t) for t in dict.fromkeys(tuple(sorted(w.items())) for w in workloads)]
        attention = []
        if args.attention and device == "cuda":
            attention = [w for m, c in cases for w in attention_workloads(args, m, c)]
            attention = [dict(t) for t in dict.fromkeys(tuple(sorted(w.items()))
                                                        for w in attention)]  # fmt: skip
        batches = [(unique, template), (attention, "triton.attention")]
        if not args.skip_tune:
            start = time.perf_counter()
            jobs = []
            for shapes, name in batches:
                if shapes:
                    print(f"tuning {len(shapes)} {name} shapes on {target} "
                          f"({args.trials} trials, {args.job_secs:.0f} s at most each) ...",
                          flush=True)  # fmt: skip
                for first in range(0, len(shapes), 15):  # a key queues at most 20 jobs
                    jobs += tune_shapes(service, shapes[first : first + 15], target=target,
                                        template=name, max_trials=args.trials,
                                        max_secs=args.job_secs)  # fmt: skip
            results["tuning_secs"] = time.perf_counter() - start
            results["jobs"] = [{k: j.get(k) for k in ("id", "state", "trials_done", "error")}
                               for j in jobs]  # fmt: skip
        answers = []
        for shapes, name in batches:
            if shapes:
                label = "GEMM (m x n x k)" if name == template else "attention (b h m n k)"
                print(f"\n{label:24s} {'source':>8s} {'vs library':>11s}  winner")
            for w in shapes:
                answer = lookup(service, w, target=target, template=name)
                answers.append({"workload": w, "template": name, "answer": answer})
                print(_answer_line(w, answer))
        results["lookups"] = answers
        if args.tune_only:
            contenders = []
        for model, case in cases:
            batch, seq = case_shape(args, model, case)
            for contender in [c for _ in range(args.repeats) for c in contenders]:
                if case in EXTRAS and contender in ("eager", "max-autotune", *OPTIONAL_CONTENDERS):
                    continue  # the extras compare tunehub with Inductor's default
                online = not (case == "offline" and contender == "tunehub")
                env = {"TUNEHUB_URL": service.url if online else "",
                       "TUNEHUB_CLIENT_DEADLINE_SECS": "5" if online else "0.05"}  # fmt: skip
                spec = {
                    "model": model, "case": case, "contender": contender, "device": device,
                    "dtype": args.dtype, "dims": model_dims(args, model, case),
                    "batch": batch, "seq": seq, "dynamic": case == "dynamic",
                    "reps": args.reps, "rounds": args.rounds, "cpus": worker_cpus,
                    "tunehub_options": args.tunehub_options,
                    "kernel_times": args.kernel_times,
                }  # fmt: skip
                if model != "llama":
                    spec["dims"].update(hidden=args.hidden, vocab=args.vocab)
                else:
                    spec["dims"]["hidden"] = args.llama_hidden
                print(f"... {model}/{case} {contender}", flush=True)
                runs.append(run_worker(spec, env, args.timeout, warm=args.warm))
                if args.out:  # what is measured so far outlives a command stopped at its limit
                    write(args.out, {**results, "runs": runs, "summary": summarize(runs)})
    results["runs"] = runs
    results["summary"] = summarize(runs)
    if runs:
        print_table(runs, results["summary"])
    if args.out:
        write(args.out, results)
        print(f"wrote {args.out}")
    return 0 if all("error" not in r for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
