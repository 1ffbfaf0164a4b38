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

import importlib
import json
import os
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


def config_json(config: dict[str, Any]) -> str:
    """The op's ``config`` argument: canonical JSON (one graph, one compiled kernel)."""
    return json.dumps(dict(config), sort_keys=True, separators=(",", ":"))
