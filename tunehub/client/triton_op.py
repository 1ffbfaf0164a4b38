"""tunehub's own Triton GEMM kernels as a ``torch.library.triton_op``: ``tunehub::triton_gemm``.

``triton_gemm(a, b, bias, epilogue, config)`` computes ``epilogue(a @ b + bias)`` for 2-D CUDA
``a`` (M x K) and ``b`` (K x N), each row- or column-major, with ``config`` (a ``triton.gemm``
config as JSON) of the variants ``tiled`` (with split-K, composite tiles or ``PAD_K``),
``splitk``, ``splitk_atomic``, ``persistent`` and ``tma``: kernels Inductor's own templates
cannot express. Its body launches the kernels through ``torch.library.wrap_triton``, so
Inductor traces it and its generated code calls each kernel like one of its own: no custom-op
dispatch or Python per call. Called outside a compile it runs the kernels (on CPU tensors
under ``TRITON_INTERPRET=1``).

``tma``'s kernel takes host TMA descriptors, which ``wrap_triton``'s tracing (the one a
``triton_op`` body gets; torch 2.11 and 2.13) does not capture: it would hand Inductor the
descriptor objects as constants. Dynamo's tracing of a user's kernel call does capture them,
as the descriptor's base tensor plus its block shape ("stable" TMA metadata), from which
Inductor's generated code remakes the descriptor per call. ``launch_traced`` gives the op's
descriptors the same form: each becomes its base tensor (a view with the descriptor's shape
and strides, ``triton_gemm_traced``) and a metadata entry in the kernel's higher-order op.

The ``tunehub`` torch.compile backend puts it in a graph where tunehub measured such a kernel
faster than the library and no gradient flows through the GEMM. Importing this module imports
torch and triton and registers the op.
"""

from __future__ import annotations

import copy
import importlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

import torch
from torch.library import triton_op, wrap_triton

OP = "tunehub::triton_gemm"
# Variants the op runs. Not ``ws``: it builds its descriptors in the kernel from scratch
# memory a launch asks Triton's allocator for, which a traced graph cannot provide.
VARIANTS = ("tiled", "splitk", "splitk_atomic", "persistent", "tma")


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "") not in ("", "0")


def runs(config: dict[str, Any]) -> bool:
    """Whether the op runs this ``triton.gemm`` config."""
    return config.get("variant") in VARIANTS


@triton_op(OP, mutates_args=())
def triton_gemm(
    a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, epilogue: str, config: str
) -> torch.Tensor:
    """``epilogue(a @ b + bias)`` with ``triton.gemm``'s kernels of ``config`` (JSON)."""
    # Looked up per call (and per trace): the tests reload the kernels under the interpreter.
    traced = importlib.import_module("tunehub.kernels.triton_gemm_traced")
    limits = importlib.import_module("tunehub.kernels.triton_gemm_limits")
    kernels = importlib.import_module("tunehub.kernels.triton_gemm_kernels")
    cfg = json.loads(config)
    out = torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device)
    # The persistent variants' programs a wave, as the template's runs launch them.
    num_sms = limits._INTERPRETER_NUM_SMS if _interpreting() else kernels.sm_count(a.device)
    launches = traced.traced_launches(
        a,
        b,
        bias,
        out,
        epilogue=epilogue,
        allow_tf32=a.dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32,
        config=cfg,
        num_sms=num_sms,
    )
    for launch in launches:
        launch_traced(launch)
    return out


def launch_traced(launch: Any) -> None:
    """A launch (``traced_launches``', ``conv_launches``') through ``wrap_triton``; host TMA
    descriptors among its arguments go into the traced kernel call as base tensor + block
    shape (``traceable``)."""
    from torch._higher_order_ops.triton_kernel_wrap import TraceableTritonKernelWrapper
    from triton.tools.tensor_descriptor import TensorDescriptor

    from tunehub.kernels.triton_gemm_traced import traceable

    kernel = wrap_triton(launch.kernel)  # traceable only while tracing, and not interpreted
    args = tuple(traceable(arg) for arg in launch.args)
    values = (*args, *launch.kwargs.values())
    if isinstance(kernel, TraceableTritonKernelWrapper) and any(
        isinstance(v, TensorDescriptor) for v in values
    ):
        _hopifier().call_triton_kernel(kernel[launch.grid], list(args), dict(launch.kwargs), None)
    else:  # run (or interpreted): the kernel takes the descriptors themselves
        kernel[launch.grid](*args, **launch.kwargs)


@lru_cache(maxsize=1)
def _hopifier() -> Any:
    """``wrap_triton``'s tracer, except that the kernel call it records carries the host TMA
    descriptors among the arguments as Dynamo's tracing records them (the class is made on
    first use: it subclasses torch's private tracer, imported only when a graph needs it)."""
    from torch._higher_order_ops.triton_kernel_wrap import (
        TracingTritonHOPifier,
        create_tma_stable_metadata,
        triton_kernel_wrapper_mutation,
    )
    from triton.tools.tensor_descriptor import TensorDescriptor

    class DescriptorHOPifier(TracingTritonHOPifier):
        def call_HOP(self, variable: Any, grids: Any, combined_args: Any, tx: Any) -> Any:
            args: dict[str, Any] = {}
            metadata: dict[str, Any] = {}
            for name, value in combined_args.items():
                if isinstance(value, TensorDescriptor):
                    args[name] = value.base
                    metadata[name] = create_tma_stable_metadata(list(value.block_shape))
                else:
                    args[name] = value
            graphable, constant_args_idx = self.store_non_graphable_args(args)
            return triton_kernel_wrapper_mutation(
                kernel_idx=variable.kernel_idx,
                constant_args_idx=constant_args_idx,
                grid=grids,
                tma_descriptor_metadata=metadata,
                kwargs=graphable,
            )

    return DescriptorHOPifier()


# The functions of torch that analyse a user-defined Triton kernel's accesses (each call
# generates the kernel's TTIR): ``identify_accessed_tensors`` (torch 2.13),
# ``identify_mutated_tensors`` (older), all taking (kernel, kwargs, tma_descriptor_metadata).
_ANALYSES = ("identify_accessed_tensors", "identify_mutated_tensors")


@contextmanager
def one_analysis_per_kernel() -> Iterator[None]:
    """While compiling: torch's analysis of which tensors a tunehub kernel reads and writes is
    made once per kernel and argument signature, not once per call site.

    Inductor analyses every call of a user-defined Triton kernel (when it functionalises the
    graph, and again when it lowers the call), each time generating the kernel's TTIR in this
    process: tens of ms for a GEMM kernel, paid per site (a model's layers call one kernel
    many times). The analysis depends only on the kernel and on what TTIR generation sees of
    the arguments (each tensor's dtype, each other value, the TMA block shapes), which is the
    key here with the kernel's function and source; kernels other than tunehub's are analysed
    as torch does."""
    try:
        from torch._higher_order_ops import triton_kernel_wrap as wrap
    except ImportError:
        yield
        return
    originals = {name: getattr(wrap, name) for name in _ANALYSES if hasattr(wrap, name)}
    memo: dict[tuple[Any, ...], Any] = {}

    def memoised(name: str, analyse: Any) -> Any:
        def analysis(kernel: Any, kwargs: dict[str, Any], *rest: Any) -> Any:
            key = _analysis_key(kernel, kwargs, rest)
            if key is None:
                return analyse(kernel, kwargs, *rest)
            if (name, *key) not in memo:
                memo[(name, *key)] = analyse(kernel, kwargs, *rest)
            return copy.deepcopy(memo[(name, *key)])  # callers own what they are given

        return analysis

    for name, analyse in originals.items():
        setattr(wrap, name, memoised(name, analyse))
    try:
        yield
    finally:
        for name, analyse in originals.items():
            setattr(wrap, name, analyse)


def _analysis_key(kernel: Any, kwargs: dict[str, Any], rest: tuple[Any, ...]) -> Any:
    """What TTIR generation sees of a tunehub kernel's call, hashable; None for any other
    kernel, or an argument of a kind not known here (then torch analyses the call)."""
    fn = getattr(kernel, "fn", None)
    fn = getattr(fn, "fn", fn)  # an Autotuner's JITFunction's function
    if fn is None or not getattr(fn, "__module__", "").startswith("tunehub."):
        return None
    import sympy

    parts: list[tuple[Any, ...]] = []
    for name, value in sorted(kwargs.items()):
        if value is None or isinstance(value, (bool, int, float, str)):
            parts.append((name, type(value).__name__, value))
        elif isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool, sympy.Expr)):
            parts.append((name, "symbolic"))
        elif isinstance(value, torch.Tensor):  # fake, functional or real: its dtype alone
            parts.append((name, "tensor", str(value.dtype)))
        elif callable(getattr(value, "get_dtype", None)):  # Inductor's IR: a TensorBox is a
            # tensor to the analysis, another node (a view) is not
            box = type(value).__name__ == "TensorBox"
            parts.append((name, "tensor" if box else "node", str(value.get_dtype())))
        else:
            return None
    # The function by name and source, not the kernel object: Inductor hands each call site's
    # analysis a kernel object of its own (copies of one JITFunction).
    source = getattr(kernel, "src", None) or getattr(getattr(kernel, "fn", None), "src", "")
    return (fn.__module__, fn.__qualname__, source, tuple(parts), repr(rest))


def config_json(config: dict[str, Any]) -> str:
    """The op's ``config`` argument: canonical JSON (one graph, one compiled kernel)."""
    return json.dumps(dict(config), sort_keys=True, separators=(",", ":"))
