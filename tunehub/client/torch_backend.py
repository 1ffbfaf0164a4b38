"""The ``tunehub`` torch.compile backend: GEMM nodes of the FX graph become tunehub's custom ops
(``tunehub::linear``, ``tunehub::mm``, ``tunehub::bmm``), the rest goes to Inductor.

``torch.compile(model, backend="tunehub")`` finds it through the ``torch_dynamo_backends``
entry point (no import needed). Rewritten: ``F.linear`` (``nn.Linear``), ``torch.mm``,
``torch.matmul``/``@`` of two 2-D operands, ``torch.addmm`` with a 1-D bias and unit
``beta``/``alpha``, each with a following ReLU or (exact, erf) GELU folded into the kernel's
epilogue when the GEMM's only user is that activation; ``torch.bmm`` (and 3-D ``@``) on CPU
tensors. Only dtypes a tunehub kernel takes are rewritten (CPU: float32, float64; CUDA:
float16, bfloat16, float32); everything else is left to Inductor untouched.

Dynamic shapes: the ops look their config up per concrete shape when they run (once per shape
per process, then a dict lookup), so a graph compiled with symbolic sizes needs no recompile;
their fake implementations give Inductor symbolic output shapes.

Options (``torch.compile(..., backend="tunehub", options={...})``): ``"inductor": False`` runs
the rewritten graph eagerly instead of handing it to Inductor; ``"tune": True`` asks the
service to queue tuning for the shapes it has no schedule for (in the background; needs a write
key in ``$TUNEHUB_API_KEY``; the compile does not wait); every other key is an Inductor config
patch; ``mode`` is Inductor's mode (e.g. ``"max-autotune"`` for the rest of the graph).
"""

from __future__ import annotations

import logging
import math
import operator
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

log = logging.getLogger(__name__)

# What the last compile rewrote, by op ("linear", "linear+relu", "mm", "bmm", ...).
REWRITES: Counter[str] = Counter()

_DTYPES = {"cpu": ("float32", "float64"), "cuda": ("float16", "bfloat16", "float32")}


def tunehub_backend(
    gm: Any,
    example_inputs: Sequence[Any],
    *,
    mode: str | None = None,
    options: dict[str, Any] | None = None,
) -> Callable[..., Any]:
    """A torch.compile backend: rewrite the GEMMs into tunehub ops, then compile with Inductor."""
    import tunehub.client.torch_ops  # noqa: F401  (registers the ops)

    options = dict(options or {})
    use_inductor = bool(options.pop("inductor", True))
    if "tune" in options:
        from tunehub.client.gemm_choice import CHOOSER

        CHOOSER.tune = bool(options.pop("tune"))
    counts = rewrite_gemms(gm)
    log.info("tunehub backend rewrote %s", dict(counts) or "no GEMM")
    if not use_inductor:
        return gm.forward  # type: ignore[no-any-return]
    from torch._inductor import list_mode_options
    from torch._inductor.compile_fx import compile_fx

    patches = {**(list_mode_options(mode) if mode and mode != "default" else {}), **options}
    compiled: Callable[..., Any] = compile_fx(  # type: ignore[assignment]
        gm, list(example_inputs), config_patches=patches or None
    )
    return compiled


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


def _fuse_activation(graph: Any, node: Any) -> tuple[Any, str]:
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


def _layout_of(node: Any) -> str:
    """The layout the op will see for a 2-D operand (as ``tunehub.client.triton`` reads it)."""
    value = _meta(node)
    rows, cols = value.shape
    if cols == 1 or value.stride(1) == 1:
        return "row_major"
    if rows == 1 or value.stride(0) == 1:
        return "col_major"
    return "row_major"  # copied to row-major


def planned_workload(name: str, args: tuple[Any, ...], activation: str) -> tuple[Any, ...] | None:
    """(workload, target, template) the rewritten op will look up when it runs, from the
    graph's static shapes; None where a size is symbolic (then the op looks it up itself)."""
    from tunehub.client.torch_ops import cpu_epilogue
    from tunehub.client.triton import allow_tf32, device_target, triton_epilogue
    from tunehub.core import Workload, local_cpu_target

    first = _meta(args[0])
    device, dtype = first.device, str(first.dtype).removeprefix("torch.")
    bias = args[2] if name != "bmm" else None
    a_shape, b_shape = _static_shape(args[0]), _static_shape(args[1])
    if a_shape is None or b_shape is None:
        return None
    if name == "linear":
        m, k, n = math.prod(a_shape[:-1]), a_shape[-1], b_shape[0]
        layouts = ("row_major", "col_major" if _meta(args[1]).stride(1) == 1 else "row_major")
    elif name == "bmm":
        (_, m, k), n = a_shape, b_shape[2]
        layouts = ("row_major", "row_major")
    else:
        (m, k), n = a_shape, b_shape[1]
        layouts = (_layout_of(args[0]), _layout_of(args[1]))
    if device.type == "cpu":
        epilogue = cpu_epilogue(bias is not None, activation)
        return (
            Workload(m=m, n=n, k=k, dtype=dtype, epilogue=epilogue),
            local_cpu_target(),
            "blis.gemm",
        )
    workload = Workload(
        m=m,
        n=n,
        k=k,
        dtype=dtype,
        a_layout=layouts[0],
        b_layout=layouts[1],
        epilogue=triton_epilogue(bias is not None, activation),
        allow_tf32=allow_tf32(dtype, device.type),
    )
    return workload, device_target(device), "triton.gemm"


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
    """Replace the GEMM nodes of ``gm`` (in place) with tunehub ops; returns what changed."""
    import torch
    import torch.nn.functional as F

    ops = torch.ops.tunehub
    graph = gm.graph
    counts: Counter[str] = Counter()
    planned: list[tuple[str, tuple[Any, ...], str]] = []
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        target = node.target
        replacement: tuple[Any, tuple[Any, ...]] | None = None
        name = ""
        if target is F.linear or target is torch._C._nn.linear:
            x, weight, *rest = (*node.args, None)[:3]
            bias = node.kwargs.get("bias", rest[0] if rest else None)
            if _supported(x, weight, dims=(-1, 2)) and (
                bias is None or _supported(bias, dims=(1,))
            ):
                replacement, name = (ops.linear.default, (x, weight, bias)), "linear"
        elif target in (torch.mm, torch.matmul, operator.matmul) and not node.kwargs:
            a, b = node.args[:2]
            if _supported(a, b, dims=(2, 2)):
                replacement, name = (ops.mm.default, (a, b, None)), "mm"
            elif (
                target is not torch.mm
                and _supported(a, b, dims=(3, 3))
                and _meta(a).device.type == "cpu"
            ):
                replacement, name = (ops.bmm.default, (a, b)), "bmm"
        elif target is torch.addmm:
            bias, a, b = node.args[:3]
            plain = all(node.kwargs.get(k, 1) == 1 for k in ("beta", "alpha"))
            if (
                plain
                and set(node.kwargs) <= {"beta", "alpha"}
                and _supported(a, b, bias, dims=(2, 2, 1))
            ):
                replacement, name = (ops.mm.default, (a, b, bias)), "addmm"
        elif target is torch.bmm and not node.kwargs:
            a, b = node.args[:2]
            if _supported(a, b, dims=(3, 3)) and _meta(a).device.type == "cpu":
                replacement, name = (ops.bmm.default, (a, b)), "bmm"
        if replacement is None:
            continue
        op, args = replacement
        end, activation = (node, "none") if name == "bmm" else _fuse_activation(graph, node)
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
