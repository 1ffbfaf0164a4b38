"""The operators benchmark suite (issue 24): per operator, shapes from real models tuned by a
tunehub service, then the tuned kernel, the vendor library and (on GPUs, where it applies)
Inductor's max-autotune timed side by side in the same run.

Operators and their templates come from the registries (``tunehub.core.operators``,
``tunehub.kernels.registry``): an operator is benchmarked on this machine's device kind when
it has a suite of shapes below and a tuned template that runs there (the operator's default
template for the kind, else the first by name), compared with that template's
``baseline_template``. An operator or template registered later (``conv2d``'s) joins without
editing this file, as long as its shapes are here.

Steps, each through the same machinery as ``compile_models.py``: a ``tunehub serve`` of its
own (``local_service``: SQLite in ``--home``, a write key), one tuning job per shape at the
budget (``--trials``, issue default 64), a lookup per shape (what a compiler is served: the
tuned kernel, or the vendor library where the answer says ``baseline_faster``), then
``--rounds`` rounds timing the tuned config and every vendor config the template is compared
with (``baseline_configs``: torch on one and on every core, each SDPA backend), alternately,
through one LocalMeasurer (fresh checked inputs, the templates' own timing). On CUDA a
worker process also times ``torch.compile(mode="max-autotune-no-cudagraphs")`` of the vendor
call and the eager vendor call with ``triton.testing.do_bench``; Inductor's time enters as
that ratio times the vendor's side-by-side time (both harnesses agree on the eager call).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/operators.py
    python benchmarks/operators.py --operators attention --shapes full     # one GPU step
    python benchmarks/operators.py --merge a.json b.json --out all.json    # join steps

The JSON (``benchmarks/results/operators-<machine>-<date>.json`` unless ``--out``) holds each
case and a ``summary`` per operator: ``geomean_vs_vendor`` and ``min_vs_vendor`` (vendor time
/ tuned time: above 1 the tuned kernel is faster), ``served_over_best`` (geomean of best time /
served time, best the faster of vendor and Inductor where measured; 1.0 is the best served)
with ``min_served_over_best``, and ``compared``: what each figure compares.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from local_service import REPO, job_outcomes, local_service, lookup, machine, tune_shapes

from tunehub.core import Config, MeasureRequest, MeasureStatus, Target, Workload
from tunehub.core.errors import InvalidSpec
from tunehub.core.operators import get_operator, operator_names
from tunehub.core.registry import UnknownName
from tunehub.kernels.base import Template, TimingPolicy
from tunehub.kernels.registry import get_template, template_names

RESULTS = REPO / "benchmarks" / "results"
DTYPES = {"cpu": "float32", "cuda": "float16"}
SHAPE_SETS = ("tiny", "small", "full")
# A key queues at most 20 jobs at once (the service's per-key limit).
JOBS_AT_ONCE = 15


@dataclass(frozen=True)
class Shape:
    """One case of a suite: the operator's fields (no dtype: the device's), where it comes
    from, and the smallest shape set it belongs to (``tiny`` ⊂ ``small`` ⊂ ``full``)."""

    name: str
    fields: dict[str, Any]
    source: str
    size: str = "full"
    kinds: tuple[str, ...] = ("cpu", "cuda")


def _uneven(total: int, groups: int, seed: int) -> list[int]:
    """``total`` rows over ``groups`` experts unevenly, as a router's top-k leaves them (a
    fixed pseudo-random split, one expert near empty), summing to ``total``."""
    weights = [((seed * 7919 + g * 104729) % 997) / 997 + 0.05 for g in range(groups)]
    weights[seed % groups] = 0.002
    sizes = [int(total * w / sum(weights)) for w in weights]
    sizes[(seed + 1) % groups] += total - sum(sizes)
    return sizes


def _scores(name: str, heads: int, seq: int, dim: int, size: str, src: str, **kw: Any) -> Shape:
    return Shape(name, {"op": "bmm", "batch": heads, "m": seq, "n": seq, "k": dim}, src, size,
                 **kw)  # fmt: skip


def _values(name: str, heads: int, seq: int, dim: int, size: str, src: str, **kw: Any) -> Shape:
    return Shape(name, {"op": "bmm", "batch": heads, "m": seq, "n": dim, "k": seq}, src, size,
                 **kw)  # fmt: skip


def _grouped(name: str, sizes: list[int], n: int, k: int, src: str, size: str) -> Shape:
    fields = {"op": "grouped_mm", "m": sum(sizes), "n": n, "k": k, "group_sizes": sizes}
    return Shape(name, fields, src, size, kinds=("cuda",))


def _conv(name: str, size: str, src: str, c: int, o: int, hw: int, r: int, **kw: Any) -> Shape:
    fields = {"op": "conv2d", "batch": kw.pop("batch", 1), "in_channels": c, "out_channels": o,
              "height": hw, "width": hw, "kernel_h": r, "kernel_w": r, "pad_h": r // 2,
              "pad_w": r // 2, "data_layout": kw.pop("layout", "nchw")}  # fmt: skip
    stride = kw.pop("stride", 1)
    fields.update(stride_h=stride, stride_w=stride, groups=kw.pop("groups", 1))
    return Shape(name, fields, src, size, **kw)


LLAMA = "LLaMA-2-7B (32 heads, head dim 128)"
MIXTRAL = "Mixtral-8x7B (8 experts, hidden 4096, FFN 14336, top-2)"
QWEN_MOE = "Qwen1.5-MoE-A2.7B (60 experts, hidden 2048, expert FFN 1408, top-4)"

SUITES: dict[str, list[Shape]] = {
    "bmm": [
        _scores("tiny", 4, 24, 16, "tiny", "a test's size"),
        _scores("bert-scores-128", 12, 128, 64, "small", "BERT-base scores, 12 heads x 128"),
        _values("bert-values-128", 12, 128, 64, "small", "BERT-base P.V, 12 heads x 128"),
        _scores("llama-scores-512", 32, 512, 128, "small", f"{LLAMA} scores Q.K^T, 512 tokens"),
        _values("llama-values-512", 32, 512, 128, "small", f"{LLAMA} P.V, 512 tokens"),
        Shape(
            "shared-weight",
            {"op": "bmm", "batch": 8, "m": 64, "n": 512, "k": 512, "b_broadcast": True},
            "one weight for 8 sequences (broadcast B)",
            "small",
        ),
        *(
            # 8192 tokens: 16 of the 32 heads (A, B and C of all 32 pass the 4 GiB limit).
            f(
                f"llama-{kind}-{seq}",
                32 if seq < 8192 else 16,
                seq,
                128,
                "full",
                f"{LLAMA} {kind}, {seq} tokens",
                kinds=("cuda",),
            )
            for seq in (1024, 2048, 4096, 8192)
            for kind, f in (("scores", _scores), ("values", _values))
        ),
    ],
    "grouped_mm": [
        _grouped("tiny", [5, 0, 19], 32, 16, "a test's size", "tiny"),
        *(
            _grouped(
                f"mixtral-{part}-{tokens}",
                _uneven(2 * tokens, 8, tokens),
                n,
                k,
                f"{MIXTRAL} {part}, {tokens} tokens",
                "small" if tokens == 512 else "full",
            )
            for tokens in (512, 2048)
            for part, n, k in (("up", 14336, 4096), ("down", 4096, 14336))
        ),
        *(
            _grouped(
                f"qwen-moe-{part}-{tokens}",
                _uneven(4 * tokens, 60, tokens),
                n,
                k,
                f"{QWEN_MOE} {part}, {tokens} tokens",
                "full",
            )
            for tokens in (1024, 4096)
            for part, n, k in (("up", 1408, 2048), ("down", 2048, 1408))
        ),
    ],
    "attention": [
        Shape(
            "tiny",
            {"op": "attention", "batch": 1, "heads": 2, "m": 32, "n": 32, "k": 64},
            "a test's size",
            "tiny",
            ("cuda",),
        ),
        *(
            Shape(
                f"llama-causal-{seq}",
                {
                    "op": "attention",
                    "batch": max(1, 4096 // seq),
                    "heads": 32,
                    "m": seq,
                    "n": seq,
                    "k": 128,
                    "causal": True,
                },
                f"{LLAMA} prefill, causal, {seq} tokens",
                "small" if seq in (512, 2048) else "full",
                ("cuda",),
            )
            for seq in (512, 1024, 2048, 4096, 8192)
        ),
        Shape(
            "mistral-decode-8192",
            {"op": "attention", "batch": 8, "heads": 32, "m": 16, "n": 8192, "k": 128},
            "Mistral-7B chunked decode: 16 new tokens over an 8192-token "
            "cache (K/V heads expanded to 32)",
            "full",
            ("cuda",),
        ),
        Shape(
            "vit-l-257",
            {"op": "attention", "batch": 32, "heads": 16, "m": 257, "n": 257, "k": 64},
            "ViT-L/14 encoder (16 heads, head dim 64), 257 tokens",
            "small",
            ("cuda",),
        ),
    ],
    "conv2d": [
        _conv("tiny", "tiny", "a test's size", 8, 16, 12, 3),
        _conv("resnet50-conv1", "full", "ResNet-50 stem 7x7/2, 224x224", 3, 64, 224, 7, stride=2),
        _conv("resnet50-3x3-56", "small", "ResNet-50 layer1 3x3, 56x56", 64, 64, 56, 3),
        _conv("resnet50-1x1-56", "small", "ResNet-50 layer1 1x1 expand, 56x56", 64, 256, 56, 1),
        _conv("resnet50-3x3-28", "small", "ResNet-50 layer2 3x3, 28x28", 128, 128, 28, 3),
        _conv("resnet50-3x3-14", "full", "ResNet-50 layer3 3x3, 14x14", 256, 256, 14, 3),
        _conv("resnet50-1x1-14", "full", "ResNet-50 layer3 1x1 reduce, 14x14", 1024, 256, 14, 1),
        _conv("resnet50-3x3-7", "small", "ResNet-50 layer4 3x3, 7x7", 512, 512, 7, 3),
        _conv(
            "convnext-dw-56",
            "small",
            "ConvNeXt-T stage 1 depthwise 7x7, 56x56",
            96,
            96,
            56,
            7,
            groups=96,
        ),
        _conv(
            "convnext-dw-14",
            "full",
            "ConvNeXt-T stage 3 depthwise 7x7, 14x14",
            384,
            384,
            14,
            7,
            groups=384,
        ),
    ],
}
# Batch per device kind for the image models (a GPU step runs a realistic batch).
CONV_BATCH = {"cpu": 1, "cuda": 32}


def shapes_for(op: str, kind: str, size: str) -> list[Shape]:
    """The suite's shapes of ``op`` in shape set ``size`` that run on ``kind``."""
    order = SHAPE_SETS.index(size)
    if size == "tiny":
        return [s for s in SUITES.get(op, []) if s.size == "tiny" and kind in s.kinds]
    return [
        s
        for s in SUITES.get(op, [])
        if s.size != "tiny" and SHAPE_SETS.index(s.size) <= order and kind in s.kinds
    ]


def in_layouts(shapes: list[Shape], layouts: list[str]) -> list[Shape]:
    """Each conv2d shape in each data layout (a name gains the layout where it is not nchw)."""
    return [
        dataclasses.replace(
            s,
            name=s.name if layout == "nchw" else f"{s.name}-{layout}",
            fields={**s.fields, "data_layout": layout},
        )
        for s in shapes
        for layout in layouts
    ]


def workload_dict(shape: Shape, kind: str) -> dict[str, Any]:
    """The shape as a job's workload on a device of ``kind``."""
    fields = {**shape.fields, "dtype": DTYPES[kind]}
    if fields["op"] == "conv2d" and shape.size != "tiny":
        fields["batch"] = CONV_BATCH[kind]
    return fields


def query_dict(workload: dict[str, Any]) -> dict[str, Any]:
    """A workload as lookup query parameters (a list as ``3,0,5``)."""
    return {
        k: ",".join(str(x) for x in v) if isinstance(v, list | tuple) else v
        for k, v in workload.items()
    }


def pick_templates(op: str, target: Target) -> tuple[Template, Template] | str:
    """(tuned template, vendor template) for ``op`` on ``target``, or why there is none."""
    try:
        operator = get_operator(op)
    except UnknownName:
        return f"operator {op} is not registered here"
    names = [operator.default_templates.get(target.kind, "")]
    names += [n for n in template_names() if n not in names]
    for name in names:
        with contextlib.suppress(UnknownName, ImportError):
            template = get_template(name) if name else None
            if template is None or template.baseline or template.device_kind != target.kind:
                continue
            if op not in template.capabilities(target).ops or not template.baseline_template:
                continue
            return template, get_template(template.baseline_template)
    return f"no template runs {op} on {target.kind} with a vendor baseline"


def geomean(values: list[float]) -> float | None:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def summarize(cases: list[dict[str, Any]]) -> dict[str, Any]:
    """Per operator: the tuned kernel over the vendor and what the lookup serves over the
    best of vendor and Inductor (cases that errored are counted, not averaged)."""
    summary: dict[str, Any] = {}
    for op in dict.fromkeys(c["op"] for c in cases):
        mine = [c for c in cases if c["op"] == op]
        ok = [c for c in mine if "vs_vendor" in c]
        vs = [c["vs_vendor"] for c in ok]
        served = [c["served_over_best"] for c in ok]
        inductor = [c for c in ok if c.get("inductor_secs")]
        summary[op] = {
            "cases": len(ok),
            "errors": len(mine) - len(ok),
            "geomean_vs_vendor": geomean(vs),
            "min_vs_vendor": min(vs) if vs else None,
            "served_over_best": geomean(served),
            "min_served_over_best": min(served) if served else None,
            "served_vendor": sum(1 for c in ok if c["served"] == "vendor"),
            "templates": sorted({f"{c['template']} vs {c['vendor']}" for c in ok}),
            "compared": (
                "vs_vendor = vendor secs / tuned secs (the looked-up config, timed alternately "
                "with the fastest of the vendor configs the template is compared with); "
                "served_over_best = min(vendor, Inductor max-autotune where measured) secs / "
                "secs of what the lookup serves (vendor where it says baseline_faster)"
                + (f"; Inductor measured for {len(inductor)} of {len(ok)}" if ok else "")
            ),
        }
    return summary


def side_by_side(
    measurer: Any,
    workload: Workload,
    target: Target,
    tuned: Template,
    config: Config,
    vendor: Template,
    rounds: int,
) -> dict[str, Any]:
    """Median secs of the tuned config and of each vendor config, timed in turn per round."""
    requests = {"tuned": MeasureRequest(workload, target, tuned.name, tuned.version, config)}
    for vc in vendor.baseline_configs(workload, target):
        label = "vendor " + " ".join(f"{k}={v}" for k, v in vc.items())
        requests[label] = MeasureRequest(workload, target, vendor.name, vendor.version, vc)
    times: dict[str, list[float]] = {label: [] for label in requests}
    errors: dict[str, str] = {}
    for _ in range(rounds):
        for label, request in requests.items():
            if label in errors:
                continue
            (result,) = measurer.measure([request])
            if result.status is MeasureStatus.OK and result.median_secs is not None:
                times[label].append(result.median_secs)
            else:
                errors[label] = f"{result.status.value}: {result.error[:300]}"
    medians = {label: statistics.median(v) for label, v in times.items() if v}
    return {"medians": medians, "rounds": times, "errors": errors}


# --- Inductor max-autotune (CUDA), in a worker process of its own ---------------------------

INDUCTOR_OPS = ("bmm", "grouped_mm", "conv2d")


def inductor_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Eager vendor call and ``torch.compile(max-autotune)`` of it, both timed with
    ``triton.testing.do_bench`` on fresh tensors: {'eager_ms', 'inductor_ms'} per case."""
    import torch
    from triton.testing import do_bench

    out: dict[str, Any] = {}
    for case in spec["cases"]:
        try:
            torch._dynamo.reset()
            fn, args = _vendor_call(case["workload"])
            eager = do_bench(functools.partial(fn, *args), warmup=25, rep=200)
            compiled = torch.compile(fn, mode="max-autotune-no-cudagraphs", dynamic=False)
            compiled(*args)
            inductor = do_bench(functools.partial(compiled, *args), warmup=25, rep=200)
            out[case["name"]] = {"eager_ms": eager, "inductor_ms": inductor}
        except Exception as exc:  # one case's failure is its result
            out[case["name"]] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    return out


def _vendor_call(w: dict[str, Any]) -> tuple[Any, tuple[Any, ...]]:
    """The eager vendor call of a workload (a function of tensors) and its fresh inputs."""
    import torch
    import torch.nn.functional as F

    dtype, dev = getattr(torch, w["dtype"]), "cuda"

    def rand(*shape: int) -> Any:
        return torch.randn(*shape, device=dev, dtype=dtype)

    if w["op"] == "bmm":
        b = rand(w["k"], w["n"]).expand(w["batch"], -1, -1) if w.get("b_broadcast") else rand(
            w["batch"], w["k"], w["n"])  # fmt: skip
        return torch.bmm, (rand(w["batch"], w["m"], w["k"]), b)
    if w["op"] == "grouped_mm":
        sizes = w["group_sizes"]
        offs = torch.tensor(sizes, device=dev, dtype=torch.int32).cumsum(0).int()
        b = rand(len(sizes), w["n"], w["k"]).transpose(-2, -1)
        return functools.partial(torch._grouped_mm, offs=offs), (rand(sum(sizes), w["k"]), b)
    x = rand(w["batch"], w["in_channels"], w["height"], w["width"])
    wt = rand(w["out_channels"], w["in_channels"] // w["groups"], w["kernel_h"], w["kernel_w"])
    if w.get("data_layout") == "nhwc":
        x, wt = (t.to(memory_format=torch.channels_last) for t in (x, wt))
    conv = functools.partial(F.conv2d, stride=(w["stride_h"], w["stride_w"]),
                             padding=(w["pad_h"], w["pad_w"]), groups=w["groups"])  # fmt: skip
    return conv, (x, wt)


def run_inductor(cases: list[dict[str, Any]], timeout: float) -> dict[str, Any]:
    spec = {"cases": [{"name": c["name"], "workload": c["workload"]} for c in cases]}
    with tempfile.TemporaryDirectory(prefix="tunehub-ops-inductor-") as tmp:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": tmp, "TRITON_CACHE_DIR": tmp + "/t"}
        try:
            done = subprocess.run(
                [sys.executable, __file__, "--inductor-worker", json.dumps(spec)],
                capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            return {c["name"]: {"error": f"no answer within {timeout:.0f} s"} for c in cases}
    try:
        return dict(json.loads(done.stdout.strip().splitlines()[-1]))
    except (IndexError, json.JSONDecodeError):
        error = f"worker exited {done.returncode}: {done.stderr[-500:]}"
        return {c["name"]: {"error": error} for c in cases}


# --- one run ---------------------------------------------------------------------------------


def machine_slug(info: dict[str, str], kind: str) -> str:
    """``h100``, ``h200``, or the CPU's model (``amd-epyc``) for the results' file name."""
    if kind == "cuda":
        found = re.search(r"\b([A-Z]\d{2,3})\b", info.get("gpu", ""))
        return found.group(1).lower() if found else "gpu"
    return re.sub(r"[^a-z0-9]+", "-", info.get("cpu", "cpu").lower()).strip("-")[:24] or "cpu"


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def write(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")


def run(args: argparse.Namespace) -> dict[str, Any]:
    from tunehub.workers.local import LocalMeasurer

    kind = "cpu" if args.cpu or not cuda_available() else "cuda"
    device = "cpu" if kind == "cpu" else "cuda:0"
    target_name = "local-cpu" if kind == "cpu" else "local-cuda:0"
    size = args.shapes or ("full" if kind == "cuda" else "small")
    ops = [o for o in args.operators.split(",") if o] if args.operators else list(SUITES)
    info = machine()
    forced = {k: v for k, v in os.environ.items() if k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    if forced:
        print(f"# warning: {forced} set; run under `env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE`")
    stamp = datetime.now(UTC)
    out = args.out or RESULTS / f"operators-{machine_slug(info, kind)}-{stamp:%Y%m%dT%H%M}.json"
    result: dict[str, Any] = {
        "benchmark": "operators",
        "date": stamp.isoformat(),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "machine": {**info, "host": platform.node(), "openblas_env": forced,
                    "loadavg": list(os.getloadavg())},
        "device_kind": kind,
        "shapes": size,
        "budget": {"trials": args.trials, "job_secs": args.job_secs},
        "rounds": args.rounds,
        "skipped": {},
        "cases": [],
    }  # fmt: skip
    timing = TimingPolicy(min_secs=args.min_secs)
    with (
        LocalMeasurer(device=device, timing=timing) as measurer,
        local_service(args.url, args.api_key, gpus="none" if kind == "cpu" else "auto",
                      home=args.home, TUNEHUB_TRAIN_MODELS="false") as service,
    ):  # fmt: skip
        target = measurer.target
        result["target"] = {"name": target_name, "label": target.label, "key": target.target_key}
        print(f"# {target.label}; shapes {size}; {args.trials} trials a shape", flush=True)
        plan: list[tuple[str, Template, Template, list[Shape]]] = []
        for op in ops:
            picked = pick_templates(op, target)
            shapes = shapes_for(op, kind, size)
            if args.cases:
                wanted = {c for c in args.cases.split(",") if c}
                shapes = [s for s in shapes if s.name in wanted]
            if op == "conv2d":
                shapes = in_layouts(shapes, args.layouts.split(","))
            if isinstance(picked, str) or not shapes:
                why = picked if isinstance(picked, str) else f"no {size} shapes on {kind}"
                result["skipped"][op] = why
                print(f"# {op}: skipped ({why})", flush=True)
                continue
            plan.append((op, *picked, shapes))
        for op, tuned, vendor, shapes in plan:
            workloads = [workload_dict(s, kind) for s in shapes]
            print(f"# {op}: tuning {len(shapes)} shapes with {tuned.name} vs {vendor.name}",
                  flush=True)  # fmt: skip
            start = time.monotonic()
            jobs: list[dict[str, Any]] = []
            if not args.skip_tune:
                for first in range(0, len(workloads), JOBS_AT_ONCE):
                    jobs += tune_shapes(service, workloads[first : first + JOBS_AT_ONCE],
                                        target=target_name, template=tuned.name,
                                        max_trials=args.trials, max_secs=args.job_secs)  # fmt: skip
            tuning_secs = time.monotonic() - start
            op_cases = []
            for i, (shape, wd) in enumerate(zip(shapes, workloads, strict=True)):
                case: dict[str, Any] = {
                    "op": op, "name": shape.name, "source": shape.source, "workload": wd,
                    "template": tuned.name, "vendor": vendor.name,
                }  # fmt: skip
                if jobs:
                    job = jobs[i]
                    case["job"] = {k: job.get(k) for k in ("id", "state", "trials_done", "error")}
                    case["tuning_secs"] = job.get("tuning_secs")
                    case["trials"] = job_outcomes(service, job["id"])
                answer = lookup(service, query_dict(wd), target=target_name, template=tuned.name)
                # The confirmation's spread and the Baseline's time too: where the side-by-side
                # rounds disagree with the job's, how far apart its own rounds were.
                case["lookup"] = {k: answer.get(k) for k in ("source", "config", "median_secs",
                                  "confirmed_median_secs", "confirmed_spread",
                                  "confirmed_rounds", "speedup_vs_baseline", "baseline_faster",
                                  "error")}  # fmt: skip
                case["lookup"]["baseline_secs"] = (answer.get("baseline") or {}).get("median_secs")
                if not answer.get("config"):
                    case["error"] = f"lookup gave no config: {answer.get('error', answer)}"
                    op_cases.append(case)
                    continue
                workload = Workload.from_dict(wd)
                case["label"] = workload.label
                timed = side_by_side(measurer, workload, target, tuned,
                                     Config(answer["config"]), vendor, args.rounds)  # fmt: skip
                case.update(timed)
                medians = timed["medians"]
                vendors = {k: v for k, v in medians.items() if k != "tuned"}
                if "tuned" not in medians or not vendors:
                    case["error"] = "; ".join(f"{k}: {v}" for k, v in timed["errors"].items())
                    op_cases.append(case)
                    continue
                tuned_secs = medians["tuned"]
                vendor_label, vendor_secs = min(vendors.items(), key=lambda kv: kv[1])
                served = "vendor" if answer.get("baseline_faster") else "tuned"
                case.update(
                    tuned_secs=tuned_secs,
                    vendor_secs=vendor_secs,
                    vendor_config=vendor_label,
                    vs_vendor=vendor_secs / tuned_secs,
                    served=served,
                    served_secs=vendor_secs if served == "vendor" else tuned_secs,
                    tuned_gflops=workload.gflops(tuned_secs),
                    vendor_gflops=workload.gflops(vendor_secs),
                )
                op_cases.append(case)
            if kind == "cuda" and op in INDUCTOR_OPS and not args.no_inductor:
                timed_cases = [c for c in op_cases if "vs_vendor" in c]
                found = run_inductor(timed_cases, args.inductor_timeout) if timed_cases else {}
                for c in timed_cases:
                    ind = found.get(c["name"], {})
                    c["inductor"] = ind
                    if ind.get("inductor_ms") and ind.get("eager_ms"):
                        c["inductor_secs"] = c["vendor_secs"] * ind["inductor_ms"] / ind["eager_ms"]
            for c in op_cases:
                if "vs_vendor" in c:
                    best = min(c["vendor_secs"], c.get("inductor_secs") or math.inf)
                    c["served_over_best"] = best / c["served_secs"]
                    print(
                        f"  {op:<10} {c['name']:<22} tuned {c['tuned_gflops']:9.1f} vendor "
                        f"{c['vendor_gflops']:9.1f} GFLOP/s  x{c['vs_vendor']:.3f}  serves "
                        f"{c['served']:<6} {c['served_over_best']:.3f} of best",
                        flush=True,
                    )
                else:
                    print(f"  {op:<10} {c['name']:<22} error: {c.get('error')}", flush=True)
            result["cases"].extend(op_cases)
            result.setdefault("tuning_secs", {})[op] = tuning_secs
            result["summary"] = summarize(result["cases"])
            write(out, result)  # what is measured so far outlives a command stopped at its limit
    result["summary"] = summarize(result["cases"])
    write(out, result)
    for op, s in result["summary"].items():
        print(f"# {op}: geomean vs vendor {s['geomean_vs_vendor'] or 0:.3f}, min "
              f"{s['min_vs_vendor'] or 0:.3f}; served/best {s['served_over_best'] or 0:.3f}, "
              f"min {s['min_served_over_best'] or 0:.3f} ({s['cases']} cases, {s['errors']} "
              "errors)")  # fmt: skip
    print(f"# wrote {out}")
    result["_out"] = str(out)
    return result


def merge(runs: list[dict[str, Any]], paths: list[Path]) -> dict[str, Any]:
    """Steps of one machine (``--operators`` / ``--shapes`` splits) as one result. A case
    (operator and workload) that a later step ran again is taken from the later step; the
    JSON's ``replaced`` names the earlier files' cases it left out."""
    kinds = {r.get("device_kind") for r in runs}
    devices = {r.get("machine", {}).get("gpu") or r.get("machine", {}).get("cpu") for r in runs}
    if len(kinds) > 1 or len(devices) > 1:
        names = sorted(map(str, devices))
        raise SystemExit(f"refusing to merge runs of different machines: {names}")
    merged = {k: v for k, v in runs[0].items() if k not in ("cases", "summary", "skipped")}
    merged["merged_from"] = [p.name for p in paths]
    latest: dict[tuple[str, str], dict[str, Any]] = {}
    replaced = []
    for r, p in zip(runs, paths, strict=True):
        for c in r["cases"]:
            key = (c["op"], c.get("label") or c["name"])
            if key in latest:
                replaced.append({"name": c["name"], "file": latest[key]["file"], "by": p.name})
            latest[key] = {**c, "file": p.name}
    merged["cases"] = list(latest.values())
    merged["replaced"] = replaced
    done = {c["op"] for c in merged["cases"]}
    merged["skipped"] = {op: why for r in runs for op, why in r.get("skipped", {}).items()
                         if op not in done}  # fmt: skip
    merged["summary"] = summarize(merged["cases"])
    return merged


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--operators", default="", help=f"of {','.join(SUITES)} (default: all)")
    parser.add_argument(
        "--shapes",
        choices=SHAPE_SETS,
        default=None,
        help="shape set (default: full on a GPU, small on a CPU)",
    )
    parser.add_argument(
        "--layouts",
        default="nchw",
        help="conv2d data layouts, each shape run in each (e.g. nhwc,nchw; default nchw)",
    )
    parser.add_argument(
        "--cases", default="", help="only the set's shapes of these names (e.g. resnet50-3x3-7)"
    )
    parser.add_argument("--trials", type=int, default=64, help="tuning trials per shape")
    parser.add_argument("--job-secs", type=float, default=300.0, help="tuning secs per shape")
    parser.add_argument("--rounds", type=int, default=5, help="side-by-side rounds (median)")
    parser.add_argument("--min-secs", type=float, default=0.2, help="timing per measurement")
    parser.add_argument("--cpu", action="store_true", help="the CPU's templates even with a GPU")
    parser.add_argument("--home", type=Path, help="keep the started service's data here")
    parser.add_argument("--url", help="a running tunehub service instead of a new one")
    parser.add_argument("--api-key", help="write key for --url (default $TUNEHUB_API_KEY)")
    parser.add_argument("--skip-tune", action="store_true", help="the service has the shapes")
    parser.add_argument("--no-inductor", action="store_true", help="skip max-autotune (GPU)")
    parser.add_argument("--inductor-timeout", type=float, default=400.0)
    parser.add_argument("--out", type=Path, help="write the JSON here")
    parser.add_argument("--merge", type=Path, nargs="+", metavar="JSON")
    parser.add_argument("--inductor-worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inductor_worker:
        print(json.dumps(inductor_worker(json.loads(args.inductor_worker))))
        return 0
    if args.merge:
        if not args.out:
            parser.error("--merge needs --out")
        merged = merge([json.loads(p.read_text()) for p in args.merge], args.merge)
        write(args.out, merged)
        print(json.dumps(merged["summary"], indent=1))
        return 0
    unknown = [o for o in args.operators.split(",") if o and o not in SUITES]
    if unknown:
        parser.error(f"no suite for {unknown}: choose from {', '.join(SUITES)}")
    result = run(args)
    return 0 if all("vs_vendor" in c for c in result["cases"]) else 1


def check_suites() -> list[str]:
    """Every suite shape that is not a valid workload of its (registered) operator."""
    problems = []
    registered = set(operator_names())
    for op, shapes in SUITES.items():
        if op not in registered:
            continue
        for shape in shapes:
            for kind in shape.kinds:
                try:
                    Workload.from_dict(workload_dict(shape, kind))
                except InvalidSpec as exc:
                    problems.append(f"{op} {shape.name} on {kind}: {exc}")
    return problems


if __name__ == "__main__":
    sys.exit(main())
