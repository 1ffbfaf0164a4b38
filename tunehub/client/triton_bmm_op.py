"""tunehub's batched GEMM kernels as a ``torch.library.triton_op``: ``tunehub::triton_bmm``.

``triton_bmm(a, b, config)`` computes ``torch.bmm(a, b)`` for 3-D ``a`` (batch x M x K) and
``b`` (batch x K x N, or one K x N matrix expanded along the batch), each entry row- or
column-major, with ``config`` (a ``triton.bmm`` config as JSON): ``bmm_kernel`` on pointer
loads, or the persistent ``bmm_tma_kernel`` (its host TMA descriptors handed to the trace as
``launch_traced`` does for ``tunehub::triton_gemm``). Its body launches the kernel through
``torch.library.wrap_triton``, so Inductor traces it and its generated code calls the kernel
like one of its own. Called outside a compile it runs the kernel (on CPU tensors under
``TRITON_INTERPRET=1``).

The ``tunehub`` torch.compile backend puts it in a graph, under CUDA graphs, where tunehub
measured a ``triton.bmm`` config faster than cuBLAS that Inductor's own bmm template cannot
run (the TMA kernel, or the batch-interleaved order) and no gradient flows through the
product. Importing this module imports torch and triton and registers the op.
"""

from __future__ import annotations

import importlib
import json
from typing import Any

import torch
from torch.library import triton_op

from tunehub.client.triton_op import launch_traced

OP = "tunehub::triton_bmm"


def runs(config: dict[str, Any]) -> bool:
    """Whether the op runs this config: any ``triton.bmm`` config (it has ``BATCH_MAJOR``)."""
    return "BATCH_MAJOR" in config


@triton_op(OP, mutates_args=())
def triton_bmm(a: torch.Tensor, b: torch.Tensor, config: str) -> torch.Tensor:
    """``torch.bmm(a, b)`` with ``triton.bmm``'s kernel of ``config`` (JSON)."""
    # Looked up per call (and per trace): the tests reload the kernels under the interpreter.
    kernels = importlib.import_module("tunehub.kernels.triton_bmm_kernels")
    cfg = json.loads(config)
    if not runs(cfg):
        raise ValueError(f"{OP} runs triton.bmm's configs, not {config}")
    out = torch.empty((a.shape[0], a.shape[1], b.shape[2]), dtype=a.dtype, device=a.device)
    allow_tf32 = a.dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32
    launch_traced(kernels.bmm_launch(a, b, out, cfg, allow_tf32))  # the device's SMs
    return out
