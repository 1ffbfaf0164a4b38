"""The ``tunehub`` torch.compile backend: tunehub's measured GEMM kernels in Inductor's own
generated code on GPUs, tunehub's ``blis.gemm`` custom ops on CPUs.

``torch.compile(model, backend="tunehub")`` finds it through the ``torch_dynamo_backends``
entry point (no import needed).

CUDA graphs are not rewritten. Their GEMMs are looked up in one batch at compile time and the
answers handed to Inductor (``tunehub.client.inductor_gemm``): where tunehub measured its
``tiled`` kernel fastest, Inductor's own Triton mm template runs that config (Inductor fuses
the bias, activations and what follows into it); where it measured the library faster,
Inductor's library call runs; every other GEMM (nothing measured, the service unreachable,
dynamic sizes, a winner Inductor's template cannot express) compiles exactly as Inductor
would on its own. The compiled call then costs what Inductor's own costs: no Python per call.
Forward and backward graphs alike; autocast and training as Inductor handles them.

CPU graphs: ``F.linear`` (``nn.Linear``), ``torch.mm``, ``torch.matmul``/``@`` of two 2-D
operands, ``torch.addmm`` with a 1-D bias and unit ``beta``/``alpha``, each with a following
ReLU or (exact, erf) GELU folded into the kernel's epilogue when the GEMM's only user is that
activation, and ``torch.bmm`` (and 3-D ``@``), become tunehub's custom ops (``tunehub::linear``,
``tunehub::mm``, ``tunehub::bmm``) that run the generated ``blis.gemm`` C kernel of the
looked-up config (float32, float64; a GEMM whose result dtype differs from its inputs', as
under autocast, stays Inductor's). The ops look their config up per concrete shape when they
run (once per shape per process, then a dict lookup), so dynamic shapes need no recompile.

tunehub's own kernels that Inductor's templates cannot express (split-K, persistent, tma; the
``tunehub::triton_gemm`` ``triton_op``) go into the graph where its steps are replayed as CUDA
graphs (``mode="reduce-overhead"``, or ``options={"tunehub_kernels": True}``), and in plain
launch only where the measured kernel runs at least ``PLAIN_LAUNCH_MIN_SECS`` (40 us; never
with ``options={"tunehub_kernels": False}``, whose code is Inductor's own): Inductor
launches a user-defined Triton kernel through Triton's own Python launcher, which on an H200
cost a LLaMA decode step (its kernel of 34 us) 0.87-0.96x of the faster Inductor in plain
launch mode and gained 1.02x under CUDA graphs (docs/compilers.md). A linear with a bias whose
only user is a ReLU or an exact GELU, through which no gradient flows, is measured as that
fused workload (``bias_gelu``: tunehub's kernel with the GELU in its epilogue against the
library with its separate pass) and, on such a kernel, runs the activation in it. ``bmm``
sites (``torch.bmm``, 3-D ``@``) get ``triton.bmm``'s answer the same way: Inductor's bmm
template with the tuned config where it runs it, the library where that measured faster,
``tunehub::triton_bmm`` (under the same rule) for a winner the template cannot run (the
persistent TMA kernel, the batch-interleaved order), Inductor's own choice otherwise.
Convolutions (``F.conv2d``) and ``F.scaled_dot_product_attention`` calls of static sizes,
through which no gradient flows, go onto ``tunehub::triton_conv2d`` and
``tunehub::triton_attention`` under the same rule where ``triton.conv2d``'s or
``triton.attention``'s measured winner beat the vendor's (cuDNN; the best SDPA backend).

Options (``torch.compile(..., backend="tunehub", options={...})``): ``"inductor": False`` runs
the (CPU-rewritten) graph eagerly instead of handing it to Inductor; ``"tune": True`` asks the
service to queue tuning for the shapes it has no schedule for (in the background; needs a write
key in ``$TUNEHUB_API_KEY``; the compile does not wait); ``"tunehub_kernels"``: True puts every
measured win on tunehub's own kernels, False none (Inductor's own code only, and its compile
time); ``"compile_aside"``: False compiles tunehub's kernels in the compiling thread, as
Inductor would, instead of on a thread beside it (``tunehub.client.compile_aside``); every
other key is an Inductor config patch; ``mode`` is Inductor's mode (with
``"max-autotune"``, GEMMs tunehub has no answer for are autotuned by Inductor as that mode
does; those it has an answer for are not).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
import math
import operator
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

log = logging.getLogger(__name__)

# What the last compile rewrote into custom ops (CPU), by op ("linear", "linear+relu", ...).
REWRITES: Counter[str] = Counter()
# What the last compile planned for its CUDA GEMMs: site key -> "template"/"aten"/"inductor".
PLANNED: dict[str, str] = {}
# Where the last compile's time went: "tunehub" (the backend's imports, lookups and rewriting,
# before Inductor) and "inductor" (Inductor's compile of the rewritten graph), in seconds.
COMPILE_SECS: dict[str, float] = {}

_DTYPES = {"cpu": ("float32", "float64"), "cuda": ("float16", "bfloat16", "float32")}
# Which GEMMs ``plan_cuda_gemms`` may put on tunehub's own kernels.
KERNEL_ROUTES = ("all", "long", "none")


def tunehub_backend(
    gm: Any,
    example_inputs: Sequence[Any],
    *,
    mode: str | None = None,
    options: dict[str, Any] | None = None,
) -> Callable[..., Any]:
    """A torch.compile backend: plan the GPU GEMMs and rewrite the CPU ones, then compile
    with Inductor."""
    start = time.perf_counter()
    COMPILE_SECS.clear()
    options = dict(options or {})
    use_inductor = bool(options.pop("inductor", True))
    if use_inductor:
        _prepare_inductor()
    if "tune" in options:
        from tunehub.client.gemm_choice import CHOOSER

        CHOOSER.tune = bool(options.pop("tune"))
    counts = rewrite_gemms(gm)
    log.info("tunehub backend rewrote %s", dict(counts) or "no CPU GEMM")
    if not use_inductor:
        COMPILE_SECS["tunehub"] = time.perf_counter() - start
        return gm.forward  # type: ignore[no-any-return]
    from torch._inductor import list_mode_options
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    own = options.pop("tunehub_kernels", None)
    aside = bool(options.pop("compile_aside", True))
    patches = {**(list_mode_options(mode) if mode and mode != "default" else {}), **options}
    graphs = bool(patches.get("triton.cudagraphs"))
    # tunehub's own kernels: every measured win where steps replay as CUDA graphs (or asked
    # for), none when turned off (Inductor's own code only, and its compile time), else the
    # wins whose kernels run long enough to hide their launch; GEMMs, convolutions and
    # attention alike.
    kernels = "none" if own is False else "all" if own or graphs else "long"
    table = plan_cuda_gemms(gm, kernels=kernels)
    plan_convs(gm, kernels=kernels)
    plan_attention(gm, kernels=kernels)
    autotune_rest = (
        bool(patches.get("max_autotune") or patches.get("max_autotune_gemm"))
        or _inductor_autotunes()
    )
    inner = compile_fx_inner
    if table:
        from tunehub.client.inductor_gemm import with_choices

        user_table = patches.get("lookup_table.table") or {}
        patches["lookup_table.table"] = {**user_table, **table}
        if any(rows[0]["template_id"] == "template" for rows in table.values()) and not (
            _has_convolution(gm)
        ):
            # Inductor offers its mm template only when it may autotune GEMMs; the handler
            # leaves one candidate per planned GEMM, so nothing is benchmarked. Not where the
            # graph convolves: Inductor's convolutions add their templates without asking the
            # handler, and would be autotuned (their planned GEMMs get the library instead).
            patches["max_autotune_gemm"] = True
        inner = with_choices(compile_fx_inner, autotune_rest=autotune_rest)
    kernel_compile = contextlib.ExitStack()
    if "kernel" in PLANNED.values():
        from tunehub.client.triton_op import one_analysis_per_kernel

        kernel_compile.enter_context(one_analysis_per_kernel())
        if aside:
            from tunehub.client import compile_aside

            kernel_compile.enter_context(compile_aside.compiling_aside())
    handed_over = time.perf_counter()
    COMPILE_SECS["tunehub"] = handed_over - start
    with kernel_compile:
        compiled: Callable[..., Any] = compile_fx(  # type: ignore[assignment]
            gm, list(example_inputs), inner_compile=inner, config_patches=patches or None
        )
    COMPILE_SECS["inductor"] = time.perf_counter() - handed_over
    return compiled


def _prepare_inductor() -> None:
    """What Inductor's own backend and compile workers do before compiling; never raises.

    Its compile workers start now, as its backend starts them first thing (they take seconds
    to come up, and kernels met before they are ready compile in this process, one by one).
    And torch's own ptxas (where torch ships one) is named for this process before anything
    compiles, as Inductor's workers name it: Triton keys its cache of compiled kernels by the
    ptxas's version, and without this a tunehub kernel compiled in one run was looked up under
    another key in the next and compiled again, 2 s of a 3.4 s cached compile (torch 2.11 on
    an H200: CUDA 13.0's ptxas in torch, 12.8's in Triton)."""
    try:
        from torch._inductor.async_compile import maybe_warm_pool

        maybe_warm_pool()
    except Exception as exc:  # an older or newer torch: Inductor starts them when it needs them
        log.debug("tunehub: Inductor's compile workers not started early: %s", exc)
    try:
        from torch._inductor.runtime.compile_tasks import _set_triton_ptxas_path

        _set_triton_ptxas_path()
    except Exception as exc:
        log.debug("tunehub: ptxas left as Triton finds it: %s", exc)


def _has_convolution(gm: Any) -> bool:
    return any(
        node.op == "call_function" and "conv" in getattr(node.target, "__name__", "")
        for node in gm.graph.nodes
    )


def _inductor_autotunes() -> bool:
    from torch._inductor import config

    return bool(config.max_autotune or config.max_autotune_gemm)


def _check_route(kernels: str) -> None:
    if kernels not in KERNEL_ROUTES:
        raise ValueError(f"kernels must be one of {', '.join(KERNEL_ROUTES)}, not {kernels!r}")


def plan_cuda_gemms(
    gm: Any, *, kernels: str = "long", devices: tuple[str, ...] = ("cuda",)
) -> dict[str, list[dict[str, Any]]]:
    """tunehub's plan for the CUDA GEMMs of ``gm``, looked up in one batch: Inductor's
    ``mm``/``addmm`` sites (from the graph's static shapes) and what its lowering should offer
    for each (the returned table; empty when the graph has none). A GEMM whose measured
    winner is one of tunehub's own kernels (split-K, persistent, ...) and through which no
    gradient flows is rewritten in place into ``tunehub::triton_gemm`` with that config (its
    ReLU or GELU, where the site's answer measured it fused, in the kernel's epilogue):
    ``kernels`` ``all`` (steps replayed as CUDA graphs) every such GEMM, ``long`` those whose
    kernel was measured to run long enough to hide its launch (``PLAIN_LAUNCH_MIN_SECS``),
    ``none`` none. (``devices``: the tests plan CPU graphs, whose kernels run under
    ``TRITON_INTERPRET=1``.)"""
    _check_route(kernels)
    from tunehub.client.inductor_gemm import kernel_config, lookup, plan_table

    found = []
    for node in gm.graph.nodes:
        site = gemm_site(node)
        if site is not None and site[1].type in devices:
            found.append((node, *site))
    PLANNED.clear()
    if not found:
        return {}
    table = plan_table([site for _, site, _ in found], found[0][2])
    PLANNED.update({key: rows[0]["template_id"] for key, rows in table.items()})
    rewritten = 0
    for node, site, device in found if kernels != "none" else ():
        if getattr(_meta(node), "requires_grad", True):
            continue  # a training graph: Inductor differentiates its own GEMMs
        config = kernel_config(lookup(site, device), site, graphs=kernels == "all")
        if config is not None:
            if site.op == "bmm":
                _to_triton_bmm(gm.graph, node, config)
            else:
                _to_triton_op(gm.graph, node, site, config)
            PLANNED[site.key] = "kernel"
            rewritten += 1
    if rewritten:
        gm.graph.lint()
        gm.recompile()
    log.info("tunehub planned %s", Counter(PLANNED.values()))
    return table


def conv_site(node: Any) -> tuple[Any, Any] | None:
    """(the ``conv2d`` Workload, the device) of a 2-D convolution node with static sizes,
    dense 4-D operands of one dtype and numeric padding; None for anything else."""
    import torch
    import torch.nn.functional as F

    if node.op != "call_function" or node.target not in (torch.conv2d, F.conv2d):
        return None
    from tunehub.client.triton_conv_op import conv_workload, is_nhwc
    from tunehub.core import InvalidSpec

    given = _named_args(node, CONV_ARGS)
    x, weight = given.get("input"), given.get("weight")
    if not _supported(x, weight, dims=(4, 4)):
        return None
    if _static_shape(x) is None or _static_shape(weight) is None:
        return None
    pairs = []
    for name, default in (("stride", 1), ("padding", 0), ("dilation", 1)):
        value = given.get(name, default)
        value = (value, value) if isinstance(value, int) else tuple(value)
        if len(value) != 2 or not all(isinstance(v, int) for v in value):
            return None  # "same"/"valid" padding, symbolic sizes
        pairs.append(value)
    groups = given.get("groups", 1)
    xv, wv = _meta(x), _meta(weight)
    if not isinstance(groups, int) or xv.dtype != wv.dtype:
        return None
    try:
        stride, padding, dilation = pairs
        workload = conv_workload(
            xv.shape, wv.shape, stride, padding, dilation, groups, xv.dtype, is_nhwc(xv)
        )
    except (InvalidSpec, ValueError):
        return None
    return workload, xv.device


CONV_ARGS = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale")


def _named_args(node: Any, names: tuple[str, ...]) -> dict[str, Any]:
    """A call node's arguments by name (its positional ones named in order by ``names``)."""
    return dict(zip(names, node.args, strict=False)) | dict(node.kwargs)


def attention_site(node: Any) -> tuple[Any, Any] | None:
    """(the ``attention`` Workload, the device) of a ``scaled_dot_product_attention`` node of
    static sizes with 4-D Q, K and V of one dtype and head count, no mask, dropout, scale or
    grouped heads; None for anything else."""
    import torch.nn.functional as F

    if node.op != "call_function" or node.target is not F.scaled_dot_product_attention:
        return None
    from tunehub.client.triton_attention_op import attention_workload
    from tunehub.core import InvalidSpec

    given = _named_args(node, SDPA_ARGS)
    q, k, v = given.get("query"), given.get("key"), given.get("value")
    if not _supported(q, k, v, dims=(4, 4, 4)) or any(_static_shape(t) is None for t in (q, k, v)):
        return None
    plain = {"attn_mask": None, "dropout_p": 0.0, "scale": None, "enable_gqa": False}
    if any(given.get(name, value) != value for name, value in plain.items()):
        return None
    causal = given.get("is_causal", False)
    qv, kv, vv = _meta(q), _meta(k), _meta(v)
    same = kv.shape == vv.shape and qv.shape[:2] == kv.shape[:2] and qv.shape[3] == kv.shape[3]
    if not isinstance(causal, bool) or not same or len({qv.dtype, kv.dtype, vv.dtype}) != 1:
        return None
    try:
        workload = attention_workload(qv.shape, kv.shape[2], causal, qv.dtype)
    except (InvalidSpec, ValueError):
        return None
    return workload, qv.device


def _conv_call(node: Any, workload: Any, config: str) -> tuple[Any, tuple[Any, ...], Any]:
    """``tunehub::triton_conv2d``'s call replacing a conv2d node, and its bias."""
    import torch

    from tunehub.kernels.conv2d_reference import conv_dims

    p, given = conv_dims(workload), _named_args(node, CONV_ARGS)
    args = (
        given["input"], given["weight"], [p["stride_h"], p["stride_w"]], [p["pad_h"], p["pad_w"]],
        [p["dilation_h"], p["dilation_w"]], p["groups"], config,
    )  # fmt: skip
    return torch.ops.tunehub.triton_conv2d.default, args, given.get("bias")


def _attention_call(node: Any, workload: Any, config: str) -> tuple[Any, tuple[Any, ...], Any]:
    """``tunehub::triton_attention``'s call replacing an SDPA node (no bias)."""
    import torch

    given = _named_args(node, SDPA_ARGS)
    args = (given["query"], given["key"], given["value"], bool(workload.param("causal")), config)
    return torch.ops.tunehub.triton_attention.default, args, None


def plan_convs(gm: Any, *, kernels: str = "long", devices: tuple[str, ...] = ("cuda",)) -> int:
    """``plan_own_kernels`` for the graph's convolutions: ``tunehub::triton_conv2d``
    (``triton.conv2d``'s implicit-GEMM and depthwise kernels; a bias added after it, which
    Inductor fuses). Pointwise NHWC winners are triton.gemm's and stay Inductor's."""
    return plan_own_kernels(
        gm, "triton.conv2d", conv_site, "tunehub.client.triton_conv_op", _conv_call,
        kernels=kernels, devices=devices,
    )  # fmt: skip


def plan_attention(gm: Any, *, kernels: str = "long", devices: tuple[str, ...] = ("cuda",)) -> int:
    """``plan_own_kernels`` for the graph's ``scaled_dot_product_attention`` calls:
    ``tunehub::triton_attention`` (``triton.attention``'s kernel through pointer loads)."""
    return plan_own_kernels(
        gm, "triton.attention", attention_site, "tunehub.client.triton_attention_op",
        _attention_call, kernels=kernels, devices=devices,
    )  # fmt: skip


def plan_own_kernels(
    gm: Any,
    template: str,
    site_of_node: Callable[[Any], tuple[Any, Any] | None],
    op_module: str,
    call: Callable[[Any, Any, str], tuple[Any, tuple[Any, ...], Any]],
    *,
    kernels: str = "long",
    devices: tuple[str, ...] = ("cuda",),
) -> int:
    """Rewrite, in place, each node of ``gm`` on ``devices`` that ``site_of_node`` names a
    workload of, through which no gradient flows and whose measured winner (an ``exact`` or
    ``family`` answer of ``template`` faster than the vendor's) the op runs (``runs`` of
    ``op_module``, which registers the op; imported only for a graph with such a node), into
    that op with that config (``call``: the op, its arguments and a bias to add).
    ``kernels`` as for ``plan_cuda_gemms``: ``all`` (steps replayed as CUDA graphs) every
    such winner, ``long`` those measured to run long enough to hide their launch, ``none``
    none (and no lookup). The others stay as Inductor compiles them. One batch lookup a
    device first. Returns how many were rewritten. (``devices``: the tests run the ops on the
    CPU under ``TRITON_INTERPRET=1``.)"""
    import torch

    from tunehub.client.gemm_choice import CHOOSER, device_target
    from tunehub.client.inductor_gemm import MEASURED, hides_its_launch

    _check_route(kernels)
    if kernels == "none":
        return 0
    found = []
    for node in list(gm.graph.nodes):
        site = site_of_node(node)
        if site is None or site[1].type not in devices:
            continue
        if getattr(_meta(node), "requires_grad", True):
            continue  # a training graph: Inductor differentiates its own
        found.append((node, *site))
    if not found:
        return 0
    from tunehub.client.triton_op import config_json

    op_runs = importlib.import_module(op_module).runs
    by_device: dict[Any, list[Any]] = {}
    for _, workload, device in found:
        by_device.setdefault(device, []).append(workload)
    for device, workloads in by_device.items():  # one round trip a device, not one a node
        try:
            CHOOSER.prefetch(workloads, device_target(device), template)
        except Exception as exc:  # looked up one by one below
            log.info("tunehub: batch lookup for %s failed: %s", template, exc)
    rewritten = 0
    for node, workload, device in found:
        try:
            choice = CHOOSER.choose(workload, device_target(device), template)
        except Exception as exc:  # never into the compile: Inductor decides
            log.info("tunehub: no answer for %s: %s", workload.label, exc)
            continue
        config = choice.config.to_dict()
        if choice.source not in MEASURED or choice.use_library or not op_runs(config):
            continue
        if not hides_its_launch(choice, graphs=kernels == "all"):
            continue
        graph = gm.graph
        with graph.inserting_before(node):
            op, args, bias = call(node, workload, config_json(config))
            new = graph.call_function(op, args)
            if bias is not None:
                shaped = graph.call_function(torch.reshape, (bias, (1, -1, 1, 1)))
                new = graph.call_function(torch.add, (new, shaped))
        new.meta.update(node.meta)
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        PLANNED[workload.key] = "kernel"
        rewritten += 1
    if rewritten:
        gm.graph.lint()
        gm.recompile()
        log.info("tunehub put %d %s call(s) on its own kernels", rewritten, template)
    return rewritten


def _to_triton_op(graph: Any, node: Any, site: Any, config: dict[str, Any]) -> None:
    """Replace a linear/mm/addmm node (and the activation after it where the site names one)
    with ``tunehub::triton_gemm`` running ``config`` with the site's epilogue."""
    import torch
    import torch.nn.functional as F

    from tunehub.client.triton_op import config_json

    op = torch.ops.tunehub.triton_gemm.default
    epilogue = site.epilogue
    end = _fuse_activation(node)[0] if site.activation != "none" else node
    with graph.inserting_before(node):
        if node.target is F.linear or node.target is torch._C._nn.linear:
            x, weight, *rest = (*node.args, None)[:3]
            bias = node.kwargs.get("bias", rest[0] if rest else None)
            k = _meta(weight).shape[1]
            lead = tuple(_meta(x).shape[:-1])
            a = graph.call_function(torch.reshape, (x, (-1, k)))
            b = graph.call_function(torch.t, (weight,))
            gemm = graph.call_function(op, (a, b, bias, epilogue, config_json(config)))
            new = graph.call_function(torch.reshape, (gemm, (*lead, -1)))
        else:
            if node.target is torch.addmm:
                bias, a, b = node.args[:3]
            else:
                (a, b), bias = node.args[:2], None
            new = graph.call_function(op, (a, b, bias, epilogue, config_json(config)))
    new.meta.update(end.meta)
    end.replace_all_uses_with(new)
    if end is not node:
        graph.erase_node(end)
    graph.erase_node(node)


def _to_triton_bmm(graph: Any, node: Any, config: dict[str, Any]) -> None:
    """Replace a bmm node (``torch.bmm``, 3-D ``@``) with ``tunehub::triton_bmm`` running
    ``config``."""
    import torch

    import tunehub.client.triton_bmm_op  # noqa: F401  (registers the op)
    from tunehub.client.triton_op import config_json

    a, b = node.args[:2]
    with graph.inserting_before(node):
        new = graph.call_function(torch.ops.tunehub.triton_bmm.default, (a, b, config_json(config)))
    new.meta.update(node.meta)
    node.replace_all_uses_with(new)
    graph.erase_node(node)


def gemm_site(node: Any) -> tuple[Any, Any] | None:
    """(the Inductor ``mm``/``addmm`` site, its device) that a GEMM node of the graph lowers
    to, for static sizes and dense operands; None for anything else."""
    import torch
    import torch.nn.functional as F

    from tunehub.client.inductor_gemm import site_of

    if node.op != "call_function":
        return None
    target = node.target
    if target is F.linear or target is torch._C._nn.linear:
        x, weight, *rest = (*node.args, None)[:3]
        bias = node.kwargs.get("bias", rest[0] if rest else None)
        if not _supported(x, weight, dims=(-1, 2)):
            return None
        xv, wv = _meta(x), _meta(weight)
        shape = _static_shape(x)
        if shape is None or _static_shape(weight) is None or not xv.is_contiguous():
            return None
        m, k, n = math.prod(shape[:-1]), shape[-1], wv.shape[0]
        # Inductor sees x as (M, K) row-major and B as the weight transposed.
        site = site_of(
            "addmm" if bias is not None else "mm",
            (xv.dtype, wv.dtype),
            ((m, k), (k, n)),
            ((k, 1), (wv.stride(1), wv.stride(0))),
        )
        return (_with_activation(site, node), xv.device) if site is not None else None
    if target is torch.bmm or (
        target in (torch.matmul, operator.matmul) and _supported(*node.args[:2], dims=(3, 3))
    ):
        a, b = node.args[:2]
        if node.kwargs or not _supported(a, b, dims=(3, 3)):
            return None
        if _static_shape(a) is None or _static_shape(b) is None:
            return None
        av, bv = _meta(a), _meta(b)
        site = site_of(
            "bmm",
            (av.dtype, bv.dtype),
            (tuple(av.shape), tuple(bv.shape)),
            (tuple(av.stride()), tuple(bv.stride())),
        )
        return (site, av.device) if site is not None else None
    if target not in (torch.mm, torch.matmul, operator.matmul, torch.addmm):
        return None
    if set(node.kwargs) - {"beta", "alpha"} or any(
        node.kwargs.get(key, 1) != 1 for key in ("beta", "alpha")
    ):
        return None
    a, b = node.args[1:3] if target is torch.addmm else node.args[:2]
    if not _supported(a, b, dims=(2, 2)):
        return None
    if _static_shape(a) is None or _static_shape(b) is None:
        return None
    av, bv = _meta(a), _meta(b)
    site = site_of(
        "addmm" if target is torch.addmm else "mm",
        (av.dtype, bv.dtype),
        (tuple(av.shape), tuple(bv.shape)),
        (tuple(av.stride()), tuple(bv.stride())),
    )
    return (_with_activation(site, node), av.device) if site is not None else None


def _with_activation(site: Any, node: Any) -> Any:
    """``site`` naming the ReLU or GELU that is its node's only user, for an ``addmm``
    through which no gradient flows (a training graph keeps the GEMM's own output for the
    backward, so the activation cannot go into its epilogue)."""
    if site.op != "addmm" or getattr(_meta(node), "requires_grad", True):
        return site
    activation = _fuse_activation(node)[1]
    return dataclasses.replace(site, activation=activation) if activation != "none" else site


def _meta(node: Any) -> Any:
    value = node.meta.get("example_value") if hasattr(node, "meta") else None
    if value is None and hasattr(node, "meta"):
        value = node.meta.get("val")
    return value


def _supported(*nodes: Any, dims: Sequence[int]) -> bool:
    """The nodes' values are tensors of a dtype a tunehub kernel takes, on one device, with
    the given numbers of dimensions (``-1``: any, at least 2)."""
    devices = set()
    for node, dim in zip(nodes, dims, strict=True):
        value = _meta(node)
        if value is None or not hasattr(value, "dtype"):
            return False
        device = value.device.type
        devices.add(device)
        if str(value.dtype).removeprefix("torch.") not in _DTYPES.get(device, ()):
            return False
        if (dim == -1 and value.dim() < 2) or (dim >= 0 and value.dim() != dim):
            return False
    return len(devices) == 1


def _activation_of(node: Any) -> str | None:
    """ "relu"/"gelu" if ``node`` applies that activation (out of place) to its first input."""
    import torch
    import torch.nn.functional as F

    if node.op == "call_function":
        if node.target in (torch.relu, F.relu) and not node.kwargs.get("inplace", False):
            return "relu" if len(node.args) == 1 else None
        if node.target is F.gelu and len(node.args) == 1:
            return "gelu" if node.kwargs.get("approximate", "none") == "none" else None
    if node.op == "call_method" and node.target == "relu" and len(node.args) == 1:
        return "relu"
    return None


def _fuse_activation(node: Any) -> tuple[Any, str]:
    """The node that ends the GEMM (its activation, if that is its only user) and which."""
    users = list(node.users)
    if len(users) == 1:
        activation = _activation_of(users[0])
        if activation is not None and users[0].args[0] is node:
            return users[0], activation
    return node, "none"


def _static_shape(node: Any) -> tuple[int, ...] | None:
    value = _meta(node)
    shape = tuple(value.shape)
    return shape if all(type(d) is int for d in shape) else None


def planned_workload(name: str, args: tuple[Any, ...], activation: str) -> tuple[Any, ...] | None:
    """(workload, target, template) the rewritten CPU op will look up when it runs, from the
    graph's static shapes; None where a size is symbolic (then the op looks it up itself)."""
    from tunehub.client.torch_ops import cpu_epilogue
    from tunehub.core import Workload, local_cpu_target

    first = _meta(args[0])
    dtype = str(first.dtype).removeprefix("torch.")
    bias = args[2] if name != "bmm" else None
    a_shape, b_shape = _static_shape(args[0]), _static_shape(args[1])
    if a_shape is None or b_shape is None:
        return None
    if name == "linear":
        m, k, n = math.prod(a_shape[:-1]), a_shape[-1], b_shape[0]
    elif name == "bmm":
        (_, m, k), n = a_shape, b_shape[2]
    else:
        (m, k), n = a_shape, b_shape[1]
    epilogue = cpu_epilogue(bias is not None, activation)
    return (
        Workload(m=m, n=n, k=k, dtype=dtype, epilogue=epilogue),
        local_cpu_target(),
        "blis.gemm",
    )


def prefetch(planned: list[tuple[str, tuple[Any, ...], str]]) -> int:
    """Look up every GEMM of a compiled graph in one batch per (target, template), so its first
    run finds them all in the memo; never raises. Returns how many were looked up."""
    from tunehub.client.gemm_choice import CHOOSER

    groups: dict[tuple[str, str], tuple[Any, list[Any]]] = {}
    for name, args, activation in planned:
        try:
            found = planned_workload(name, args, activation)
        except Exception as exc:  # a shape no Workload takes: the op decides when it runs
            log.debug("tunehub: no lookup planned for %s: %s", name, exc)
            continue
        if found is None:
            continue
        workload, target, template = found
        groups.setdefault((target.target_key, template), (target, []))[1].append(workload)
    looked_up = 0
    for (_, template), (target, workloads) in groups.items():
        looked_up += CHOOSER.prefetch(workloads, target, template)
    return looked_up


def rewrite_gemms(gm: Any) -> Counter[str]:
    """Replace the CPU GEMM nodes of ``gm`` (in place) with tunehub ops; returns what
    changed."""
    import torch
    import torch.nn.functional as F

    graph = gm.graph
    counts: Counter[str] = Counter()
    planned: list[tuple[str, tuple[Any, ...], str]] = []
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        target = node.target
        replacement: tuple[str, tuple[Any, ...]] | None = None
        name = ""
        if target is F.linear or target is torch._C._nn.linear:
            x, weight, *rest = (*node.args, None)[:3]
            bias = node.kwargs.get("bias", rest[0] if rest else None)
            if _supported(x, weight, dims=(-1, 2)) and (
                bias is None or _supported(bias, dims=(1,))
            ):
                replacement, name = ("linear", (x, weight, bias)), "linear"
        elif target in (torch.mm, torch.matmul, operator.matmul) and not node.kwargs:
            a, b = node.args[:2]
            if _supported(a, b, dims=(2, 2)):
                replacement, name = ("mm", (a, b, None)), "mm"
            elif (
                target is not torch.mm
                and _supported(a, b, dims=(3, 3))
                and _meta(a).device.type == "cpu"
            ):
                replacement, name = ("bmm", (a, b)), "bmm"
        elif target is torch.addmm:
            bias, a, b = node.args[:3]
            plain = all(node.kwargs.get(k, 1) == 1 for k in ("beta", "alpha"))
            if (
                plain
                and set(node.kwargs) <= {"beta", "alpha"}
                and _supported(a, b, bias, dims=(2, 2, 1))
            ):
                replacement, name = ("mm", (a, b, bias)), "addmm"
        elif target is torch.bmm and not node.kwargs:
            a, b = node.args[:2]
            if _supported(a, b, dims=(3, 3)) and _meta(a).device.type == "cpu":
                replacement, name = ("bmm", (a, b)), "bmm"
        if replacement is None:
            continue
        op_name, args = replacement
        first = _meta(args[0])
        if first.device.type != "cpu" or getattr(_meta(node), "dtype", None) != first.dtype:
            # GPU GEMMs stay in the graph for Inductor (``plan_cuda_gemms``); so does a GEMM
            # whose result dtype differs from its operands' (autocast).
            continue
        import tunehub.client.torch_ops  # noqa: F401  (registers the ops, once, where needed)

        op = getattr(torch.ops.tunehub, op_name).default
        end, activation = (node, "none") if name == "bmm" else _fuse_activation(node)
        if name != "bmm":
            args = (*args, activation)
        with graph.inserting_after(end):
            new = graph.call_function(op, args)
        new.meta.update(end.meta)
        end.replace_all_uses_with(new)
        if end is not node:
            graph.erase_node(end)
        graph.erase_node(node)
        counts[name if activation == "none" else f"{name}+{activation}"] += 1
        planned.append((name, args, activation))
    if counts:
        graph.lint()
        gm.recompile()
        prefetch(planned)
    REWRITES.clear()
    REWRITES.update(counts)
    return counts
