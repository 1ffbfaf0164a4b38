"""tunehub's GEMM answers in Inductor's generated code, checked and timed on a GPU.

1. ``check``: an fp16 MLP (linear+bias+GELU, linear+bias, linear) compiled with
   ``TunehubChoices`` and a plan written by hand: every site ``aten``, then every site on
   Inductor's mm template with a named config. Asserts the generated code holds what the plan
   says (the template's constants, the library call, the GELU fused into the template) and the
   output matches eager.
2. ``mapping``: the same config run as tunehub's ``triton.gemm`` ``tiled`` kernel (``bind`` +
   launch) and as Inductor's mm template (a compiled ``a @ b`` planned onto it), with cuBLAS
   beside them: if the two Triton kernels run within a few percent, a tiled config tunehub
   measured is a config Inductor's template runs as fast.
3. ``op``: ``tunehub::triton_gemm`` (tunehub's own kernels, ``tma`` included) compiled by
   Inductor: the kernels launched from the generated code, also under CUDA graphs.
4. ``bmm``: ``bmm`` sites planned ``aten`` and onto Inductor's bmm template, the template timed
   beside ``triton.bmm``'s kernel of the same config and cuBLAS.
5. ``own``: ``backend="tunehub"`` with ``tunehub_kernels`` on small fp16 convolution models
   (NCHW 3x3 repacked and in place, NHWC 3x3, depthwise) and on causal and non-causal
   attention, each site given a measured answer naming ``triton.conv2d``'s /
   ``triton.attention``'s template default (or a given config): the generated code
   launches those kernels (no Python op per call), matches eager, also under CUDA graphs.

    python benchmarks/inductor_route.py --out $OUT/inductor_route.json [--steps check,bmm]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SHAPES = [  # (M, N, K): GPT-2-small GEMMs at 8 x 512 tokens, a square, a skinny
    (4096, 2304, 768),
    (4096, 768, 768),
    (4096, 3072, 768),
    (4096, 768, 3072),
    (4096, 50304, 768),
    (2048, 2048, 2048),
    (64, 4096, 4096),
]
CONFIGS = [
    {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3},
    {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3},
    {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 4, "num_stages": 4},
]


def compile_planned(fn: Any, table: dict[str, Any], *, template: bool) -> Any:
    import torch
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    from tunehub.client.inductor_gemm import with_choices

    def backend(gm: Any, example_inputs: Any) -> Any:
        patches: dict[str, Any] = {"lookup_table.table": table}
        if template:
            patches["max_autotune_gemm"] = True
        return compile_fx(
            gm,
            list(example_inputs),
            inner_compile=with_choices(compile_fx_inner, autotune_rest=False),
            config_patches=patches,
        )

    return torch.compile(fn, backend=backend)


def template_entry(cfg: dict[str, Any], k: int) -> list[dict[str, Any]]:
    from tunehub.client.inductor_gemm import Decision, template_kwargs

    kwargs = template_kwargs({"variant": "tiled", "SPLIT_K": 1, **cfg}, k)
    assert kwargs is not None
    return Decision("template", kwargs, why="probe").entry()


def check(report: dict[str, Any]) -> None:
    import torch
    import torch.nn.functional as F
    from torch._inductor.utils import run_and_get_code

    from tunehub.client import inductor_gemm
    from tunehub.client.inductor_gemm import Decision, GemmSite

    torch.manual_seed(0)
    dev = "cuda"

    class MLP(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = torch.nn.Linear(768, 3072)
            self.fc2 = torch.nn.Linear(3072, 768)
            self.fc3 = torch.nn.Linear(768, 512, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc3(self.fc2(F.gelu(self.fc1(x))))

    model = MLP().to(dev, torch.float16).eval()
    x = torch.randn(8, 512, 768, device=dev, dtype=torch.float16)
    sites = [
        GemmSite("addmm", 4096, 3072, 768, "float16", "row_major", "col_major"),
        GemmSite("addmm", 4096, 768, 3072, "float16", "row_major", "col_major"),
        GemmSite("mm", 4096, 512, 768, "float16", "row_major", "col_major"),
    ]
    cfg = CONFIGS[0]
    cases = {
        "aten": {s.key: Decision("aten", why="probe").entry() for s in sites},
        "template": {s.key: template_entry(cfg, s.k) for s in sites},
    }
    with torch.no_grad():
        expected = model(x)
        for name, table in cases.items():
            torch._dynamo.reset()
            inductor_gemm.DECISIONS.clear()
            compiled = compile_planned(model, table, template=name == "template")
            out, codes = run_and_get_code(compiled, x)
            code = "\n".join(codes)
            err = ((out.float() - expected.float()).norm() / expected.float().norm()).item()
            found = {
                "decisions": dict(inductor_gemm.DECISIONS),
                "rel_err": err,
                "extern_mm": code.count("extern_kernels.mm("),
                "extern_addmm": code.count("extern_kernels.addmm("),
                "template_kernels": code.count("def triton_tem_"),
                "block_m_128": code.count("BLOCK_M : tl.constexpr = 128"),
                "gelu_in_template": any(
                    "erf" in part for part in code.split("def triton_tem_")[1:]
                ),
                "launches_per_call": code.count(".run("),
            }
            report.setdefault("check", {})[name] = found
            print(f"check {name}: {found}")
            assert err < 1e-2, err
            if name == "aten":
                assert found["template_kernels"] == 0
                assert found["extern_mm"] + found["extern_addmm"] == 3
            else:
                assert found["template_kernels"] == 3, found
                assert found["extern_mm"] + found["extern_addmm"] == 0
        (Path(report["_out_dir"]) / "inductor_route_template_code.py").write_text(code)


OP_CONFIGS = [
    {"variant": "tiled", "BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8,
     "SPLIT_K": 1, "num_warps": 8, "num_stages": 3},
    {"variant": "tiled", "BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8,
     "SPLIT_K": 4, "num_warps": 4, "num_stages": 3},
    {"variant": "splitk_atomic", "BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8,
     "SPLIT_K": 4, "num_warps": 4, "num_stages": 3},
    {"variant": "persistent", "BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8,
     "SPLIT_K": 1, "num_warps": 8, "num_stages": 3},
    {"variant": "tma", "BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8,
     "SPLIT_K": 1, "num_warps": 8, "num_stages": 3},
    {"variant": "tma", "BLOCK_M": 128, "BLOCK_N": 192, "BLOCK_K": 64, "GROUP_M": 8,
     "SPLIT_K": 1, "num_warps": 8, "num_stages": 3, "PAD_K": True},
    {"variant": "tma", "BLOCK_M": 64, "BLOCK_N": 80, "BLOCK_K": 128, "GROUP_M": 8,
     "SPLIT_K": 1, "num_warps": 4, "num_stages": 6},
    # Not run by the op (its descriptors are made in the kernel, from scratch memory Triton's
    # allocator gives each launch): probed to see whether Inductor's launch provides it.
    {"variant": "ws", "BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8,
     "SPLIT_K": 1, "num_warps": 4, "num_stages": 3},
]  # fmt: skip


NO_FX_CACHE = bool(os.environ.get("PROBE_NO_FX_CACHE"))


def op(report: dict[str, Any]) -> None:
    rows = []
    configs = OP_CONFIGS[: int(os.environ.get("PROBE_OP_CONFIGS", len(OP_CONFIGS)))]
    only = os.environ.get("PROBE_OP_VARIANTS")
    if only:
        configs = [c for c in configs if c["variant"] in only.split(",")]
    pad_k = next(c for c in OP_CONFIGS if c.get("PAD_K"))
    for (m, n, k), cfg in [((4096, 768, 3072), c) for c in configs] + [
        ((1000, 3000, 777), pad_k),
        ((16, 4096, 4096), OP_CONFIGS[-2]),
    ]:
        try:
            rows.append(op_row(m, n, k, cfg))
        except Exception as exc:  # one config's failure is a finding; go on with the next
            import traceback

            traceback.print_exc()
            rows.append({"shape": [m, n, k], "config": cfg, "error": repr(exc)[:2000]})
            print(f"op {m}x{n}x{k} {cfg['variant']}: FAILED {exc!r}"[:600])
    report["op"] = rows
    failed = [row for row in rows if "error" in row and row["config"]["variant"] != "ws"]
    assert not failed, f"{len(failed)} config(s) failed"


def op_row(m: int, n: int, k: int, cfg: dict[str, Any]) -> dict[str, Any]:
    import torch
    from torch._inductor.utils import run_and_get_code

    from tunehub.client.triton_op import config_json
    from tunehub.kernels import triton_gemm_kernels as tk

    if cfg["variant"] == "ws":
        import triton

        triton.set_allocator(tk._descriptor_scratch)
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    w = torch.randn(n, k, device="cuda", dtype=torch.float16)
    bias = torch.randn(n, device="cuda", dtype=torch.float16)
    text = config_json(cfg)

    def f(a: Any, w: Any, bias: Any, text: str = text) -> Any:
        y = torch.ops.tunehub.triton_gemm(a, w.t(), bias, "bias", text)
        return torch.nn.functional.gelu(y)

    ref = torch.nn.functional.gelu(torch.addmm(bias, a, w.t()).float())
    torch._dynamo.reset()
    compiled = torch.compile(f, options={"fx_graph_cache": not NO_FX_CACHE})
    out, codes = run_and_get_code(compiled, a, w, bias)
    code = "\n".join(codes)
    err = ((out.float() - ref).norm() / ref.norm()).item()
    out_direct = torch.empty(m, n, device="cuda", dtype=torch.float16)
    launch = tk.bind(a, w.t(), bias, out_direct, epilogue="bias", config=cfg)
    row = {
        "shape": [m, n, k],
        "config": cfg,
        "rel_err": err,
        "custom_op_calls_in_code": code.count("torch.ops.tunehub"),
        "kernels_in_code": defined_kernels(code),
        "compiled_us": bench(lambda c=compiled, x=(a, w, bias): c(*x)),
        "bound_launch_us": bench(launch),
        "cublas_addmm_us": bench(lambda x=(a, w, bias): torch.addmm(x[2], x[0], x[1].t())),
    }
    if cfg["variant"] in ("tma", "ws"):
        # The route the backend takes them by: CUDA graphs (mode="reduce-overhead").
        torch._dynamo.reset()
        graphed = torch.compile(f, mode="reduce-overhead")
        for _ in range(3):
            out_g = graphed(a, w, bias)
        torch.cuda.synchronize()
        row["graphs_rel_err"] = ((out_g.float() - ref).norm() / ref.norm()).item()
        row["graphs_us"] = bench(lambda c=graphed, x=(a, w, bias): c(*x))
    print(f"op {m}x{n}x{k} {cfg['variant']}: {row}")
    assert err < 1e-2, err
    assert row.get("graphs_rel_err", 0.0) < 1e-2, row["graphs_rel_err"]
    assert row["custom_op_calls_in_code"] == 0, "the op's Python ran in the compiled code"
    return row


BMM_SHAPES = [  # (batch, M, N, K, B column-major): attention scores Q.K^T and P.V
    (32, 512, 512, 64, True),
    (32, 512, 64, 512, False),
    (12, 128, 128, 64, True),
    (64, 2048, 2048, 128, True),
]
BMM_CONFIGS = [
    {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3},
    {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 4, "num_stages": 4},
]  # fmt: skip


def bmm(report: dict[str, Any]) -> None:
    """``bmm`` sites: a plan of ``aten`` holds the library's bmm; a plan of ``template`` holds
    Inductor's bmm template with the planned config, timed beside tunehub's ``triton.bmm``
    kernel of that config (``BATCH_MAJOR``, the order of Inductor's grid) and cuBLAS."""
    import torch
    from torch._inductor.utils import run_and_get_code

    from tunehub.client.inductor_gemm import Decision, GemmSite, bmm_template_kwargs
    from tunehub.kernels.triton_bmm_kernels import bmm_launch

    rows = []
    for batch, m, n, k, b_col in BMM_SHAPES:
        a = torch.randn(batch, m, k, device="cuda", dtype=torch.float16)
        raw = torch.randn(batch, n, k, device="cuda", dtype=torch.float16)
        b = raw.transpose(1, 2) if b_col else raw.reshape(batch, k, n)
        layout = "col_major" if b_col else "row_major"
        site = GemmSite("bmm", m, n, k, "float16", "row_major", layout, batch)
        ref = torch.bmm(a.float(), b.float())
        cublas_us = bench(lambda a=a, b=b: torch.bmm(a, b))
        plans = {
            "aten": None,
            **{f"template {c['BLOCK_M']}x{c['BLOCK_N']}": c for c in BMM_CONFIGS},
        }
        for name, cfg in plans.items():
            if cfg is None:
                entry = Decision("aten", why="probe").entry()
            else:
                kwargs = bmm_template_kwargs({**cfg, "BATCH_MAJOR": True}, k)
                assert kwargs is not None
                entry = Decision("template", kwargs, why="probe").entry()
            torch._dynamo.reset()
            compiled = compile_planned(
                lambda a, b: torch.bmm(a, b), {site.key: entry}, template=cfg is not None
            )
            out, codes = run_and_get_code(compiled, a, b)
            code = "\n".join(codes)
            row: dict[str, Any] = {
                "shape": [batch, m, n, k],
                "b_layout": layout,
                "plan": name,
                "rel_err": ((out.float() - ref).norm() / ref.norm()).item(),
                "extern_bmm": code.count("extern_kernels.bmm("),
                "template_kernels": code.count("def triton_tem_"),
                "planned_block_m": code.count(
                    f"BLOCK_M : tl.constexpr = {(cfg or {}).get('BLOCK_M')}"
                ),
                "inductor_us": bench(lambda c=compiled, a=a, b=b: c(a, b)),
                "cublas_us": cublas_us,
            }
            if cfg is not None:
                out_t = torch.empty(batch, m, n, device="cuda", dtype=torch.float16)
                launch = bmm_launch(a, b, out_t, {**cfg, "BATCH_MAJOR": True}, False).bind()
                launch()
                row["tunehub_err"] = ((out_t.float() - ref).norm() / ref.norm()).item()
                row["tunehub_bmm_us"] = bench(launch)
                row["inductor_over_tunehub_time"] = row["inductor_us"] / row["tunehub_bmm_us"]
            rows.append(row)
            print(f"bmm {batch}x{m}x{n}x{k} {layout} {name}: {row}")
            assert row["rel_err"] < 1e-2, row
            if cfg is None:
                assert row["extern_bmm"] == 1 and row["template_kernels"] == 0, row
            else:
                assert row["template_kernels"] == 1 and row["planned_block_m"] >= 1, row
    ratios = [r["inductor_over_tunehub_time"] for r in rows if "inductor_over_tunehub_time" in r]
    report["bmm"] = {
        "rows": rows,
        "geomean_inductor_over_tunehub_time": math.exp(statistics.fmean(map(math.log, ratios))),
    }
    geomean = report["bmm"]["geomean_inductor_over_tunehub_time"]
    print(f"bmm: Inductor's template over triton.bmm, time geomean {geomean:.3f}")


def own_convs() -> dict[str, tuple[Any, dict[str, Any] | None, tuple[int, ...]]]:
    """Small fp16 convolution models, one kind of site each, a config override (None: the
    template's default: on Hopper the TMA kernel, for NCHW on channels-last copies made inside
    the op; for a stem on 3 channels the padded-rows order, its copy made inside the op) and
    the input's shape."""
    import torch

    class Conv(torch.nn.Module):
        def __init__(
            self, groups: int = 1, bias: bool = True, nhwc: bool = False, channels: int = 64,
            kernel: int = 3, stride: int = 1,
        ) -> None:  # fmt: skip
            super().__init__()
            self.conv = torch.nn.Conv2d(
                channels, 64, kernel, stride=stride, padding=kernel // 2, groups=groups,
                bias=bias,
            )  # fmt: skip
            self.nhwc = nhwc

        def forward(self, x: Any) -> Any:
            x = torch.relu(x)
            if self.nhwc:
                x = x.contiguous(memory_format=torch.channels_last)
            return self.conv(x) * 0.5

    in_place = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 4,
                "num_stages": 3, "REPACK": False}  # fmt: skip
    flat = {**in_place, "BLOCK_M": 128, "PATCH": "flat"}
    # v7's depthwise strips of 4 output pixels, read in place from NCHW (the default repacks).
    strips = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 1, "num_warps": 4,
              "num_stages": 1, "REPACK": False, "TILE_W": 4, "STRIP": 4}  # fmt: skip
    small, stem = (8, 64, 28, 28), (8, 3, 56, 56)
    return {
        "nchw 3x3 repack": (Conv(), None, small),
        "nchw 3x3 in place": (Conv(), in_place, small),
        "nhwc 3x3": (Conv(nhwc=True), None, small),
        "depthwise 3x3": (Conv(groups=64, bias=False), None, small),
        "depthwise 3x3 strips in place": (Conv(groups=64, bias=False), strips, small),
        "nhwc depthwise 7x7": (Conv(groups=64, bias=False, nhwc=True, kernel=7), None, small),
        "nchw stem 7x7/2 rows": (Conv(channels=3, kernel=7, stride=2), None, stem),
        "nhwc stem 7x7/2 flat": (Conv(channels=3, kernel=7, stride=2, nhwc=True), flat, stem),
    }


def own(report: dict[str, Any]) -> None:
    """tunehub::triton_conv2d, tunehub::triton_attention and tunehub::triton_bmm from
    Inductor's generated code."""
    import torch
    import torch.nn.functional as F
    from torch._inductor.utils import run_and_get_code

    import tunehub.client.torch_ops  # noqa: F401  (registers the ops)
    from tunehub.client.gemm_choice import CHOOSER, GemmChoice, choice_key, device_target
    from tunehub.client.torch_backend import (
        PLANNED,
        attention_site,
        conv_site,
        gemm_site,
        tunehub_backend,
    )
    from tunehub.core import Config
    from tunehub.kernels.registry import get_template

    target = device_target(torch.device("cuda"))
    rows: list[dict[str, Any]] = []

    def answer_all(
        fn: Any, args: tuple[Any, ...], site_of: Any, template: str, override: Any
    ) -> list[Any]:
        """Give every site of ``fn``'s graph an ``exact`` answer: ``override``, else the
        template's default."""
        found: list[Any] = []

        def collect(gm: Any, example_inputs: Any) -> Any:
            found.extend(s[0] for n in gm.graph.nodes if (s := site_of(n)) is not None)
            return gm.forward

        torch._dynamo.reset()
        torch.compile(fn, backend=collect)(*args)
        tpl = get_template(template)
        for workload in found:
            config = Config(override) if override else tpl.default_config(workload, target)
            key = choice_key(workload, target, template)
            CHOOSER._answers[key] = GemmChoice(template, config, "exact")
        return found

    def run(
        name: str,
        fn: Any,
        args: tuple[Any, ...],
        site_of: Any,
        template: str,
        override: dict[str, Any] | None = None,
    ) -> None:
        try:
            run_case(name, fn, args, site_of, template, override)
        except Exception as exc:  # one case's failure is a finding; go on with the next
            import traceback

            traceback.print_exc()
            rows.append({"case": name, "error": repr(exc)[:3000]})
            print(f"own {name}: FAILED {exc!r}"[:800])

    def run_case(
        name: str,
        fn: Any,
        args: tuple[Any, ...],
        site_of: Any,
        template: str,
        override: dict[str, Any] | None,
    ) -> None:
        CHOOSER.clear()
        PLANNED.clear()
        with torch.no_grad():
            # Attention against float32 (fp16 SDPA rounds); convolutions against eager.
            ref = fn(*[a.float() for a in args]) if template == "triton.attention" else None
            workloads = answer_all(fn, args, site_of, template, override)
            eager = fn(*args)
            if ref is None:
                ref = eager.float()
            torch._dynamo.reset()
            default = torch.compile(fn)
            default(*args)
            default_us = bench(lambda: default(*args))
            for mode in ("plain", "reduce-overhead"):
                torch._dynamo.reset()
                PLANNED.clear()
                # reduce-overhead turns tunehub_kernels on itself (torch.compile takes mode or
                # options, not both).
                compiled = torch.compile(
                    fn,
                    backend=tunehub_backend,
                    mode=None if mode == "plain" else mode,
                    options={"tunehub_kernels": True} if mode == "plain" else None,
                )
                out, codes = run_and_get_code(compiled, *args)
                for _ in range(3):
                    out = compiled(*args)
                torch.cuda.synchronize()
                code = "\n".join(codes)
                row = {
                    "case": name,
                    "mode": mode,
                    "sites": [w.label for w in workloads],
                    "configs": [
                        CHOOSER._answers[choice_key(w, target, template)].config.to_dict()
                        for w in workloads
                    ],
                    "planned_kernels": sum(v == "kernel" for v in PLANNED.values()),
                    "rel_err": ((out.float() - ref).norm() / ref.norm()).item(),
                    "eager_rel_err": ((eager.float() - ref).norm() / ref.norm()).item(),
                    "custom_op_calls_in_code": code.count("torch.ops.tunehub"),
                    "kernels_in_code": defined_kernels(code, "_kernel", "_fwd"),
                    "tunehub_us": bench(lambda c=compiled: c(*args)),
                    "inductor_default_us": default_us,
                    "eager_us": bench(lambda: fn(*args)),
                }
                rows.append(row)
                print(f"own {name} {mode}: {row}")

    only = [c for c in report.get("own_cases", "").split(",") if c]

    def wanted(name: str) -> bool:
        return not only or any(c in name for c in only)

    for name, (net, override, shape) in own_convs().items():
        if wanted(name):
            x = torch.randn(shape, device="cuda", dtype=torch.float16)
            net = net.to("cuda", torch.float16).eval()
            run(name, net, (x,), conv_site, "triton.conv2d", override)
    for causal in (False, True) if wanted("sdpa") else ():
        q, k, v = (
            torch.randn(2, 16, 1024, 64, device="cuda", dtype=torch.float16) for _ in range(3)
        )

        def attend(q: Any, k: Any, v: Any, causal: bool = causal) -> Any:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal) * 2.0

        # The template's Hopper default loads through TMA, which the op does not run.
        ptr = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3}
        run(f"sdpa causal={causal}", attend, (q, k, v), attention_site, "triton.attention", ptr)

    # Q, K and V as a model makes them: one projection, split, heads transposed (strided
    # views of Inductor's own buffers, not graph inputs).
    def project(x: Any, w: Any) -> Any:
        batch, tokens, heads = x.shape[0], x.shape[1], 12
        q, k, v = (x @ w).split(768, dim=-1)
        q, k, v = (t.view(batch, tokens, heads, 64).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return out.transpose(1, 2).reshape(batch, tokens, 768)

    xs = torch.randn(4, 512, 768, device="cuda", dtype=torch.float16)
    ws = torch.randn(768, 3 * 768, device="cuda", dtype=torch.float16) / 28
    ptr = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3}
    if wanted("sdpa projected"):
        run("sdpa projected", project, (xs, ws), attention_site, "triton.attention", ptr)

    # Attention scores as an explicit bmm (Q.K^T, K^T a transposed view) on triton.bmm's
    # persistent TMA kernel, which Inductor's bmm template cannot run: tunehub::triton_bmm.
    def bmm_site(node: Any) -> Any:
        found = gemm_site(node)
        if found is None or found[0].op != "bmm":
            return None
        return found[0].workload(False), found[1]

    def scores(q: Any, k: Any) -> Any:
        return torch.bmm(q, k.transpose(1, 2)) * 0.125

    if wanted("bmm"):
        qk = [torch.randn(32, 1024, 128, device="cuda", dtype=torch.float16) for _ in range(2)]
        tma = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8,
               "num_stages": 3, "BATCH_MAJOR": True, "TMA": True}  # fmt: skip
        run("bmm scores tma", scores, tuple(qk), bmm_site, "triton.bmm", tma)
    CHOOSER.clear()
    PLANNED.clear()
    report["own"] = rows
    bad = [
        r
        for r in rows
        if "error" in r
        or r["rel_err"] > 1e-2
        or r["custom_op_calls_in_code"]
        or not r["planned_kernels"]
    ]
    assert not bad, f"{len(bad)} row(s) off: {bad}"


def defined_kernels(code: str, *markers: str) -> list[str]:
    """The names of the functions Inductor's generated ``code`` defines whose name holds one
    of ``markers`` (default ``_kernel``): the kernels it launches itself."""
    markers = markers or ("_kernel",)
    heads = (part[:60] for part in code.split("def ")[1:])
    return sorted({head.split("(")[0] for head in heads if any(m in head for m in markers)})


def bench(fn: Any) -> float:
    import triton

    return float(triton.testing.do_bench(fn, warmup=50, rep=200, return_mode="median")) * 1e3


def mapping(report: dict[str, Any]) -> None:
    import torch

    from tunehub.client.inductor_gemm import GemmSite
    from tunehub.kernels import triton_gemm_kernels as tk

    rows = []
    for m, n, k in SHAPES:
        a = torch.randn(m, k, device="cuda", dtype=torch.float16)
        w = torch.randn(n, k, device="cuda", dtype=torch.float16)
        b = w.t()  # column-major B, as nn.Linear's weight
        out = torch.empty(m, n, device="cuda", dtype=torch.float16)
        cublas_us = bench(lambda a=a, b=b: torch.mm(a, b))
        site = GemmSite("mm", m, n, k, "float16", "row_major", "col_major")
        for cfg in CONFIGS:
            launch = tk.bind(a, b, None, out, config={"variant": "tiled", "SPLIT_K": 1, **cfg})
            launch()
            ref = torch.mm(a, b)
            tunehub_err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
            tunehub_us = bench(launch)
            torch._dynamo.reset()
            compiled = compile_planned(
                lambda a, b: a @ b, {site.key: template_entry(cfg, k)}, template=True
            )
            got = compiled(a, b)
            inductor_err = ((got.float() - ref.float()).norm() / ref.float().norm()).item()
            inductor_us = bench(lambda a=a, b=b, c=compiled: c(a, b))
            row = {
                "shape": [m, n, k],
                "config": cfg,
                "tunehub_tiled_us": tunehub_us,
                "inductor_template_us": inductor_us,
                "cublas_us": cublas_us,
                "inductor_over_tunehub_time": inductor_us / tunehub_us,
                "errors": [tunehub_err, inductor_err],
            }
            rows.append(row)
            print(
                f"{m}x{n}x{k} {cfg['BLOCK_M']}x{cfg['BLOCK_N']}x{cfg['BLOCK_K']} "
                f"w{cfg['num_warps']} s{cfg['num_stages']}: tunehub {tunehub_us:.1f} us, "
                f"inductor {inductor_us:.1f} us ({inductor_us / tunehub_us:.3f}x time), "
                f"cuBLAS {cublas_us:.1f} us"
            )
    ratios = [r["inductor_over_tunehub_time"] for r in rows]
    report["mapping"] = {
        "rows": rows,
        "geomean_inductor_over_tunehub_time": math.exp(
            statistics.fmean(math.log(r) for r in ratios)
        ),
        "max_inductor_over_tunehub_time": max(ratios),
        "min_inductor_over_tunehub_time": min(ratios),
    }
    print(json.dumps({k: v for k, v in report["mapping"].items() if k != "rows"}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", default="check,op,mapping")
    parser.add_argument(
        "--own-cases", default="", help="the own step's cases holding these (e.g. stem,sdpa)"
    )
    args = parser.parse_args()
    import torch
    import triton

    report: dict[str, Any] = {
        "_out_dir": str(args.out.parent),
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "own_cases": args.own_cases,
    }
    print(report)
    for step in args.steps.split(","):
        try:
            {"check": check, "mapping": mapping, "op": op, "bmm": bmm, "own": own}[step](report)
        except Exception as exc:  # report what failed, go on with the next step
            import traceback

            traceback.print_exc()
            report.setdefault("failed", {})[step] = repr(exc)
    report.pop("_out_dir")
    args.out.write_text(json.dumps(report, indent=1))
    return 1 if report.get("failed") else 0


if __name__ == "__main__":
    raise SystemExit(main())
