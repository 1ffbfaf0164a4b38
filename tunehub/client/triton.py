"""Triton drop-ins: ``matmul`` (tunehub's ``triton.gemm`` kernel with the looked-up config) and
``autotune`` (``triton.autotune`` whose results are shared through the service).

``matmul(a, b, bias=None, activation=None)`` computes ``activation(a @ b + bias)`` like
``torch.matmul`` (and ``F.linear(x, w, bias)`` as ``matmul(x, w.t(), bias)``) on CUDA tensors,
or on CPU tensors under ``TRITON_INTERPRET=1``. The config comes from the lookup for that
shape, dtype, layouts (from the strides), epilogue and GPU, once per shape per process; where
the service measured cuBLAS faster it runs ``torch.matmul``; compiled kernels stay in Triton's
own cache, one per config and specialisation. A call is keyed by everything its launch
depends on (shapes, strides, dtypes, devices, bias and activation, each pointer's 16-byte
alignment, TF32 and deterministic modes, current device and stream): a key's first call makes
every check, the lookup, the binding and a launch through Triton's JIT; the key's later calls
are a dict lookup, the output's allocation and the compiled kernel's launcher with the new
pointers (``GemmLauncher``), a few microseconds. Anything the kernel does not take (other
dtypes, broadcast batch shapes, a bias that is not a vector of N, inputs that need
gradients) runs through torch, so it is always safe to call. Under
``torch.use_deterministic_algorithms(True)`` a looked-up kernel that is not bit-reproducible
(``splitk_atomic``) is not run either: ``torch.matmul`` is.

``autotune``: see ``tunehub.client.triton_autotune``.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from functools import lru_cache
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from tunehub.client.gemm_choice import (
    CALLS,
    CHOOSER,
    allow_tf32,
    device_target,
    interpreter_target,
    ready_defaults,
)
from tunehub.client.triton_autotune import Autotuner, autotune
from tunehub.core import Workload
from tunehub.kernels.triton_gemm_limits import _DESCRIPTOR_VARIANTS, bit_reproducible

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)
# A first call may run a template's default config: its code is loaded now, not in the call.
ready_defaults()

TEMPLATE = "triton.gemm"
_DTYPES = ("float16", "bfloat16", "float32")
_ACTIVATIONS = {None: "none", "none": "none", "relu": "relu", "gelu": "gelu"}
_EPILOGUE = {"none": "bias", "relu": "bias_relu", "gelu": "bias_gelu"}

__all__ = ["Autotuner", "autotune", "interpreter_target", "matmul"]


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "") not in ("", "0")


def _kernels() -> Any:
    # Looked up per call: the tests reload the module to switch the interpreter on.
    import importlib

    return importlib.import_module("tunehub.kernels.triton_gemm_kernels")


def _library(
    a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, activation: str
) -> torch.Tensor:
    import torch
    import torch.nn.functional as F

    CALLS["library"] += 1
    out = torch.matmul(a, b)
    if bias is not None:
        out = out + bias
    if activation == "relu":
        return torch.relu(out)
    if activation == "gelu":
        return F.gelu(out)
    return out


def triton_epilogue(has_bias: bool, activation: str) -> str:
    """The triton.gemm epilogue a GEMM runs (and is looked up with); an activation without a
    bias runs the bias epilogue with a zero bias."""
    return "none" if not has_bias and activation == "none" else _EPILOGUE[activation]


def _layout(t: torch.Tensor) -> str | None:
    rows, cols = t.shape
    if cols == 1 or t.stride(1) == 1:
        return "row_major"
    if rows == 1 or t.stride(0) == 1:
        return "col_major"
    return None


def matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
) -> torch.Tensor:
    """``activation(a @ b + bias)``; ``activation`` is None, ``"relu"`` or ``"gelu"`` (erf).

    ``a`` is (M, K) or (..., M, K) and ``b`` (K, N) (a batch of ``b`` matching ``a``'s
    batch runs one GEMM per entry); ``bias`` has N elements.
    """
    import torch

    if activation not in _ACTIVATIONS:
        raise ValueError(f"activation must be None, 'relu' or 'gelu', got {activation!r}")
    act = _ACTIVATIONS[activation]
    if torch.is_grad_enabled() and (
        a.requires_grad or b.requires_grad or (bias is not None and bias.requires_grad)
    ):
        return _library(a, b, bias, act)  # keeps autograd's graph
    if b.dim() == 2:
        if a.dim() == 2:
            return gemm_2d(a, b, bias, act)
        if a.dim() > 2:
            k = a.shape[-1]
            out = gemm_2d(a.reshape(-1, k), b, bias, act)
            return out.reshape(*a.shape[:-1], b.shape[1])
    if a.dim() == 3 and b.dim() == 3 and a.shape[0] == b.shape[0]:
        return torch.stack([gemm_2d(a[i], b[i], bias, act) for i in range(a.shape[0])])
    return _library(a, b, bias, act)


@lru_cache(maxsize=4096)
def _workload(
    m: int,
    n: int,
    k: int,
    dtype: str,
    a_layout: str,
    b_layout: str,
    epilogue: str,
    allow_tf32: bool,
) -> Workload:
    # gemm_call reads the workload's layouts and K; one object per shape, built once.
    return Workload(
        m=m,
        n=n,
        k=k,
        dtype=dtype,
        a_layout=a_layout,
        b_layout=b_layout,
        epilogue=epilogue,
        allow_tf32=allow_tf32,
    )


# --------------------------------------------------------------------------------------------
# Per call: one dict lookup, then the bound launch
# --------------------------------------------------------------------------------------------

# What a GEMM of one key runs, decided (looked up, checked, bound, launched) on the key's first
# call: every later call with the same key pays the key, this dict's lookup and the launch.
_PLANS: dict[tuple[Any, ...], _LibraryPlan | _KernelPlan] = {}
MAX_PLANS = 4096  # distinct keys kept; past it the memo starts again (dynamic shapes)
# Device memory the kept plans may hold in buffers of their own (PAD_K's padded copies, tiled
# split-K's workspace, a zero bias): past it the memo starts again, so that many shapes (a
# dynamic M) cannot pin memory that one call at a time would have freed.
MAX_PLAN_BYTES = 512 << 20
_plan_bytes = 0


@dataclass(slots=True, eq=False)
class _LibraryPlan:
    """A key torch runs (see ``_first_call`` for why)."""

    activation: str
    generation: int  # CHOOSER.generation it was decided under

    def __call__(
        self, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, stream: int | None
    ) -> torch.Tensor:
        return _library(a, b, bias, self.activation)


@dataclass(slots=True, eq=False)
class _KernelPlan:
    """A key's triton.gemm launch: what the first call did to its operands (copies of
    layouts the kernel does not take, the bias as the kernel takes it), then the bound launch
    (``GemmLauncher``) into a fresh output."""

    a_copy: bool
    b_copy: bool
    bias_mode: str  # "none", "as-is", "zeros" (no bias, an activation) or "convert"
    zeros: torch.Tensor | None
    m: int
    n: int
    dtype: torch.dtype
    device: torch.device
    launch: Any  # tunehub.kernels.triton_gemm_kernels.GemmLauncher
    empty: Any  # torch.empty
    generation: int
    own_bytes: int = 0  # device memory held by the plan's own buffers

    def __call__(
        self, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, stream: int | None
    ) -> torch.Tensor:
        if self.a_copy:
            a = a.contiguous()
        if self.b_copy:
            b = b.contiguous()
        mode = self.bias_mode
        if mode == "as-is":
            kernel_bias = bias
        elif mode == "zeros":
            kernel_bias = self.zeros  # read only: shared by every call
        elif mode == "convert":
            assert bias is not None
            kernel_bias = bias.reshape(self.n).to(self.dtype).contiguous()
        else:
            kernel_bias = None
        out: torch.Tensor = self.empty((self.m, self.n), dtype=self.dtype, device=self.device)
        self.launch(a, b, kernel_bias, out, stream)
        CALLS[TEMPLATE] += 1
        return out


def gemm_2d(
    a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, activation: str
) -> torch.Tensor:
    """The 2-D case of ``matmul`` (``activation`` spelled ``"none"``/``"relu"``/``"gelu"``).

    Keyed by everything the launch depends on (shapes, strides, dtypes, devices, the bias's
    layout, the activation, each pointer's 16-byte alignment, TF32 and deterministic modes,
    the current device and stream): a key seen before runs its plan at once; a new one is
    checked, looked up and bound by ``_first_call``.
    """
    import torch

    if a.is_cuda:
        device = _cuda_device()
        where: Any = (device, _cuda_stream(device))
        stream = where[1]
        tf32 = a.dtype is torch.float32 and torch.backends.cuda.matmul.allow_tf32
    else:
        where = _interpreting()
        stream = None
        tf32 = False
    key = (
        a.shape,
        a.stride(),
        b.shape,
        b.stride(),
        a.dtype,
        b.dtype,
        a.device,
        b.device,
        None
        if bias is None
        else (bias.shape, bias.stride(), bias.dtype, bias.device, bias.data_ptr() % 16),
        activation,
        a.data_ptr() % 16,
        b.data_ptr() % 16,
        tf32,
        torch.are_deterministic_algorithms_enabled(),
        where,
    )
    plan = _PLANS.get(key)
    if plan is not None and plan.generation == CHOOSER.generation:
        return plan(a, b, bias, stream)
    return _first_call(key, a, b, bias, activation, stream)


def _cuda_device() -> int:
    import torch

    return int(torch.cuda.current_device())


def _cuda_stream(device: int) -> int:
    # The raw handle of torch's current stream, as Triton's launch and Inductor's wrapper get it.
    import torch

    return int(torch._C._cuda_getCurrentRawStream(device))


def clear_plans() -> None:
    """Forget every key's plan: each key's next call is a first call again."""
    global _plan_bytes
    _PLANS.clear()
    _plan_bytes = 0


def _remember(key: tuple[Any, ...], plan: _LibraryPlan | _KernelPlan) -> None:
    global _plan_bytes
    held = plan.own_bytes if isinstance(plan, _KernelPlan) else 0
    if len(_PLANS) >= MAX_PLANS or _plan_bytes + held > MAX_PLAN_BYTES:
        clear_plans()
    old = _PLANS.get(key)
    if isinstance(old, _KernelPlan):
        _plan_bytes -= old.own_bytes
    _PLANS[key] = plan
    _plan_bytes += held


def _first_call(
    key: tuple[Any, ...],
    a: torch.Tensor,
    b: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str,
    stream: int | None,
) -> torch.Tensor:
    """A key's first call: every check, the lookup, ``bind`` and the launch through Triton's
    JIT; what it decided is kept for the key's later calls."""
    import torch

    generation = CHOOSER.generation
    library = _LibraryPlan(activation, generation)
    dtype = str(a.dtype).removeprefix("torch.")
    on_device = a.device.type == "cuda" or (a.device.type == "cpu" and _interpreting())
    if (
        not on_device
        or dtype not in _DTYPES
        or b.dtype != a.dtype
        or a.device != b.device
        or a.dim() != 2
        or b.dim() != 2
        or a.shape[1] != b.shape[0]
        or 0 in (a.shape[0], a.shape[1], b.shape[1])
        or (bias is not None and (bias.numel() != b.shape[1] or bias.device != a.device))
        or (a.device.type == "cuda" and a.device.index != key[-1][0])
    ):
        # (The last: tensors on another GPU than the current one; torch guards the device.)
        _remember(key, library)
        return library(a, b, bias, stream)
    m, k = a.shape
    n = b.shape[1]
    a_layout, b_layout = _layout(a), _layout(b)
    a_copy, b_copy = a_layout is None, b_layout is None
    if a_copy:
        a, a_layout = a.contiguous(), "row_major"
    if b_copy:
        b, b_layout = b.contiguous(), "row_major"
    if b is a:  # a @ a: the launcher tells operands apart by object, so bind a view as b
        b = a.view(a.shape)
    assert a_layout is not None and b_layout is not None
    epilogue = triton_epilogue(bias is not None, activation)
    kernel_bias, bias_mode, zeros = None, "none", None
    if epilogue != "none":
        if bias is None:
            kernel_bias = zeros = torch.zeros(n, dtype=a.dtype, device=a.device)
            bias_mode = "zeros"
        else:
            kernel_bias = bias.reshape(n).to(a.dtype).contiguous()
            same = kernel_bias is bias or kernel_bias.data_ptr() == bias.data_ptr()
            bias_mode = "as-is" if same and bias.dim() == 1 else "convert"
    tf32 = allow_tf32(dtype, a.device.type)
    target = device_target(a.device)
    choice = CHOOSER.choose_shape(
        m, n, k, dtype, a_layout, b_layout, epilogue, tf32, target, TEMPLATE
    )
    for _ in range(2):
        generation = CHOOSER.generation
        library = _LibraryPlan(activation, generation)
        if choice is None or choice.use_library:
            break
        if not bit_reproducible(choice.config) and torch.are_deterministic_algorithms_enabled():
            # Under torch.use_deterministic_algorithms(True), a kernel whose bits may differ
            # from call to call (split-K summed by atomics) is not taken: torch.matmul is.
            break
        if choice.config.get("variant") in _DESCRIPTOR_VARIANTS and (
            a.data_ptr() % 16 or b.data_ptr() % 16
        ):
            # TMA needs 16-byte aligned operands: these are not (an offset view), which says
            # nothing against the config: torch runs this key, the config stays.
            break
        out = torch.empty((m, n), dtype=a.dtype, device=a.device)
        workload = _workload(m, n, k, dtype, a_layout, b_layout, epilogue, tf32)
        try:
            from tunehub.kernels.triton_gemm import gemm_call

            ops = SimpleNamespace(a=a, b=b, bias=kernel_bias, out=out)
            launch = gemm_call(_kernels(), ops, workload, choice.config, None).launcher()
            launch(a, b, kernel_bias, out, stream)
        except Exception as exc:  # a config this GPU cannot run: the default, then torch
            choice = CHOOSER.demote(workload, target, TEMPLATE, f"{type(exc).__name__}: {exc}")
            continue
        plan = _KernelPlan(
            a_copy=a_copy,
            b_copy=b_copy,
            bias_mode=bias_mode,
            zeros=zeros,
            m=m,
            n=n,
            dtype=a.dtype,
            device=a.device,
            launch=launch,
            empty=torch.empty,
            generation=generation,
            own_bytes=launch.own_bytes + (0 if zeros is None else zeros.nbytes),
        )
        _remember(key, plan)
        CALLS[TEMPLATE] += 1
        return out
    _remember(key, library)
    return library(a, b, bias, stream)
