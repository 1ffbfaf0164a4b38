"""tunehub's GEMM custom ops for torch (``tunehub::linear``, ``tunehub::mm``, ``tunehub::bmm``):
``blis.gemm`` on CPU tensors, ``triton.gemm`` on CUDA tensors, each with the looked-up config.

The ops are ``torch.library.custom_op``s with fake implementations (so Dynamo and Inductor see
their shapes) and autograd formulas (so a training graph that contains them still has a
backward). The CPU path builds the generated C kernel of the looked-up config once per
(config, dtype, epilogue), loads it with ctypes and calls it on the tensors' memory; anything
it cannot take (a dtype other than float32/float64, an empty or oversized shape, a kernel that
fails to build) runs through torch instead. ``CALLS`` counts which path ran.

Importing this module imports torch and registers the ops.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from tunehub.client.gemm_choice import CALLS, CHOOSER, cache_dir, ready_defaults
from tunehub.core import Config, Workload, local_cpu_target

log = logging.getLogger(__name__)
# A first call may run a template's default config: its code is loaded now, not in the call.
ready_defaults()

ACTIVATIONS = ("none", "relu", "gelu")
CPU_DTYPES = {torch.float32: "float32", torch.float64: "float64"}
BLIS = "blis.gemm"
TRITON = "triton.gemm"
LIBRARY = "library"


# --------------------------------------------------------------------------------------------
# The CPU kernel: blis.gemm, built per config and cached
# --------------------------------------------------------------------------------------------


def build_dir() -> Path:
    """Where CPU kernels are built and cached: ``$TUNEHUB_BUILD_DIR``, else
    ``$TUNEHUB_CACHE_DIR/build``, else the user's cache directory."""
    explicit = os.environ.get("TUNEHUB_BUILD_DIR")
    if explicit:
        return Path(explicit)
    return cache_dir() / "build"


_KERNELS: dict[tuple[str, str, str], Any] = {}
_KERNELS_LOCK = threading.Lock()


def _blis_kernel(workload: Workload, config: Config) -> Any:
    """The loaded kernel of ``config`` for the workload's dtype and epilogue (any shape)."""
    key = (config.key, workload.dtype, workload.epilogue)
    kernel = _KERNELS.get(key)
    if kernel is None:
        from tunehub.kernels.blis_gemm import BlisGemmTemplate

        with _KERNELS_LOCK:
            kernel = _KERNELS.get(key)
            if kernel is None:
                kernel = BlisGemmTemplate().compile(
                    workload, local_cpu_target(), config, build_dir()
                )
                _KERNELS[key] = kernel
    return kernel


# (dtype, epilogue, id(choice)) -> (choice, kernel): the steady state skips hashing the config.
# The entry holds the choice, so its id is not reused while the entry exists.
_BY_CHOICE: dict[tuple[str, str, int], tuple[Any, Any]] = {}


def _kernel_for(choice: Any, dtype: str, epilogue: str) -> Any:
    memo = _BY_CHOICE.get((dtype, epilogue, id(choice)))
    if memo is not None and memo[0] is choice:
        return memo[1]
    kernel = _blis_kernel(Workload(m=1, n=1, k=1, dtype=dtype, epilogue=epilogue), choice.config)
    _BY_CHOICE[(dtype, epilogue, id(choice))] = (choice, kernel)
    return kernel


def _activate(out: torch.Tensor, activation: str) -> torch.Tensor:
    if activation == "relu":
        return out.relu_()
    if activation == "gelu":
        return F.gelu(out)
    return out


def _library_gemm(
    a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, activation: str
) -> torch.Tensor:
    CALLS[LIBRARY] += 1
    out = torch.addmm(bias, a, b) if bias is not None else torch.mm(a, b)
    return _activate(out, activation)


def cpu_epilogue(has_bias: bool, activation: str) -> str:
    """The blis.gemm epilogue a CPU GEMM runs (and is looked up with)."""
    if activation == "relu":
        return "bias_relu"  # a zero bias when there is none
    # No GELU epilogue in blis.gemm: its bias epilogue, then torch's GELU.
    return "bias" if has_bias else "none"


def cpu_gemm(
    a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, activation: str
) -> torch.Tensor:
    """``activation(a @ b + bias)`` of 2-D CPU tensors with blis.gemm where it applies."""
    dtype = CPU_DTYPES.get(a.dtype)
    if dtype is None or b.dtype != a.dtype or (bias is not None and bias.dtype != a.dtype):
        return _library_gemm(a, b, bias, activation)
    m, k = a.shape
    n = b.shape[1]
    epilogue = cpu_epilogue(bias is not None, activation)
    target = local_cpu_target()
    # The kernel reads row-major operands (B is copied to row-major when it is not), so the
    # row-major workload is the one to look up.
    row = "row_major"
    choice = CHOOSER.choose_shape(m, n, k, dtype, row, row, epilogue, False, target, BLIS)
    for _ in range(2):
        if choice is None or choice.use_library:
            return _library_gemm(a, b, bias, activation)
        try:
            kernel = _kernel_for(choice, dtype, epilogue)
        except Exception as exc:  # a config this host cannot build: the default, then torch
            workload = Workload(m=m, n=n, k=k, dtype=dtype, epilogue=epilogue)
            choice = CHOOSER.demote(workload, target, BLIS, f"kernel does not build: {exc}")
            continue
        if epilogue == "bias_relu" and bias is None:
            bias = torch.zeros(n, dtype=a.dtype)
        out = torch.empty((m, n), dtype=a.dtype)
        kernel(
            a.detach().numpy(),
            b.detach().numpy(),
            None if bias is None or epilogue == "none" else bias.detach().contiguous().numpy(),
            out=out.numpy(),
        )
        CALLS[BLIS] += 1
        return _activate(out, "gelu") if activation == "gelu" else out
    return _library_gemm(a, b, bias, activation)


def gemm_2d(
    a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, activation: str
) -> torch.Tensor:
    """Dispatch a 2-D GEMM by device: blis.gemm (CPU), triton.gemm (CUDA), else torch."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    if a.shape[0] == 0 or a.shape[1] == 0 or b.shape[1] == 0:
        return _library_gemm(a, b, bias, activation)
    if a.device.type == "cpu":
        return cpu_gemm(a, b, bias, activation)
    if a.device.type == "cuda":
        # The 2-D kernel path itself: the public matmul sends inputs that need gradients to
        # torch, and inside the op (below autograd) they may still say they do.
        from tunehub.client.triton import gemm_2d as triton_gemm_2d

        return triton_gemm_2d(a, b, bias, activation)
    return _library_gemm(a, b, bias, activation)


# --------------------------------------------------------------------------------------------
# The custom ops
# --------------------------------------------------------------------------------------------


@torch.library.custom_op("tunehub::linear", mutates_args=())
def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, activation: str
) -> torch.Tensor:
    """``activation(F.linear(x, weight, bias))``: x is (..., K), weight (N, K)."""
    n, k = weight.shape
    x2 = x.reshape(-1, k)
    out = gemm_2d(x2, weight.t(), bias, activation)
    return out.reshape(*x.shape[:-1], n)


@linear.register_fake
def _linear_fake(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, activation: str
) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@torch.library.custom_op("tunehub::mm", mutates_args=())
def mm(
    a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, activation: str
) -> torch.Tensor:
    """``activation(a @ b + bias)`` of a (M, K) and b (K, N)."""
    return gemm_2d(a, b, bias, activation)


@mm.register_fake
def _mm_fake(
    a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, activation: str
) -> torch.Tensor:
    return a.new_empty((a.shape[0], b.shape[1]))


@torch.library.custom_op("tunehub::bmm", mutates_args=())
def bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` of a (B, M, K) and b (B, K, N), one tunehub GEMM per batch entry."""
    if a.shape[0] == 0:
        return torch.bmm(a, b)
    return torch.stack([gemm_2d(a[i], b[i], None, "none") for i in range(a.shape[0])])


@bmm.register_fake
def _bmm_fake(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.new_empty((a.shape[0], a.shape[1], b.shape[2]))


# --- autograd: plain torch formulas, so graphs that train keep a backward -----------------------


def _act_grad(grad: torch.Tensor, out: torch.Tensor, pre: Any, activation: str) -> torch.Tensor:
    if activation == "relu":
        return grad * (out > 0)
    if activation == "gelu":
        result: torch.Tensor = torch.ops.aten.gelu_backward(grad, pre())
        return result
    return grad


def _linear_setup(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    x, weight, bias, activation = inputs
    ctx.activation = activation
    ctx.save_for_backward(x, weight, bias, output)


def _linear_backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    x, weight, bias, out = ctx.saved_tensors
    grad = _act_grad(grad, out, lambda: F.linear(x, weight, bias), ctx.activation)
    n, k = weight.shape
    g2 = grad.reshape(-1, n)
    gx = (g2 @ weight).reshape(x.shape)
    gw = g2.t() @ x.reshape(-1, k)
    gb = g2.sum(0) if bias is not None else None
    return gx, gw, gb, None


linear.register_autograd(_linear_backward, setup_context=_linear_setup)


def _mm_setup(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    a, b, bias, activation = inputs
    ctx.activation = activation
    ctx.save_for_backward(a, b, bias, output)


def _mm_backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    a, b, bias, out = ctx.saved_tensors

    def pre() -> torch.Tensor:
        return torch.addmm(bias, a, b) if bias is not None else a @ b

    grad = _act_grad(grad, out, pre, ctx.activation)
    return grad @ b.t(), a.t() @ grad, grad.sum(0) if bias is not None else None, None


mm.register_autograd(_mm_backward, setup_context=_mm_setup)


def _bmm_setup(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    ctx.save_for_backward(*inputs)


def _bmm_backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    a, b = ctx.saved_tensors
    return grad @ b.transpose(1, 2), a.transpose(1, 2) @ grad


bmm.register_autograd(_bmm_backward, setup_context=_bmm_setup)
