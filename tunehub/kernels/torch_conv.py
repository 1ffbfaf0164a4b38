"""``torch.conv2d`` and ``torch.conv2d_gpu``: conv2d's Baseline templates, PyTorch's
``torch.nn.functional.conv2d`` (oneDNN on CPUs where the build has it, cuDNN on GPUs), timed like
a tuned kernel.

What a PyTorch user writes: ``F.conv2d(x, w, stride=..., padding=..., dilation=...,
groups=...)`` on tensors in the workload's memory layout (``channels_last`` for nhwc).
conv2d has no ``out=``: the check copies the first result into the NaN-poisoned output; the
timed calls are conv2d's alone (its output allocation included, as the user pays it). CPU:
one knob, ``threads`` (one or every core, as the tuned template offers), checked against the
float64 reference of ``conv2d_reference``. GPU: ``benchmark`` (cuDNN's algorithm search on or
off), checked against the float64 conv on the device. Imports torch only to run.
"""

from __future__ import annotations

import secrets
from typing import Any

import numpy as np

from tunehub.core import (
    Capabilities,
    Config,
    MeasureRequest,
    MeasureResult,
    Target,
    Workload,
)
from tunehub.kernels.base import Artifact, GpuLibraryBaseline, ThreadedCpuBaseline, TimingPolicy
from tunehub.kernels.conv2d_reference import (
    check_conv,
    conv_dims,
    conv_operands,
    conv_output,
    is_nhwc,
)
from tunehub.kernels.environment import measurement_environment
from tunehub.kernels.space import Knob, SearchSpace
from tunehub.kernels.timing import LibraryCheck, measure_library_call
from tunehub.kernels.torch_bmm import torch_description, torch_threads


def conv_kwargs(workload: Workload) -> dict[str, Any]:
    """``torch.nn.functional.conv2d``'s keyword arguments for the workload."""
    d = conv_dims(workload)
    return {
        "stride": (d["stride_h"], d["stride_w"]),
        "padding": (d["pad_h"], d["pad_w"]),
        "dilation": (d["dilation_h"], d["dilation_w"]),
        "groups": d["groups"],
    }


class TorchConv2dBaseline(ThreadedCpuBaseline):
    """PyTorch's CPU conv2d; see the module docstring."""

    name = "torch.conv2d"
    version = 1
    library_key = "torch"

    def capabilities(self, target: Target) -> Capabilities:
        return Capabilities(
            kinds=("cpu",), ops=("conv2d",), dtypes=("float32", "float64"), epilogues=("none",)
        )

    def run(
        self, request: MeasureRequest, artifact: Artifact, *, timing: TimingPolicy
    ) -> MeasureResult:
        import torch

        workload = request.workload
        environment = measurement_environment()
        environment.update(torch_description())
        threads = int(request.config["threads"])
        seed = secrets.randbits(63)
        rng = np.random.default_rng(seed)
        x_np, w_np = conv_operands(workload, rng)
        y_np = conv_output(workload)
        x, w, y = (torch.from_numpy(a) for a in (x_np, w_np, y_np))
        if is_nhwc(workload):  # the stored (N, H, W, C) arrays as channels_last NCHW tensors
            x, w, y = (t.permute(0, 3, 1, 2) for t in (x, w, y))
        kwargs = conv_kwargs(workload)

        def call() -> Any:
            return torch.nn.functional.conv2d(x, w, **kwargs)

        def check() -> LibraryCheck:
            return LibraryCheck.of_sampled(check_conv(y_np, x_np, w_np, workload, rng))

        # conv2d has no out=: the first result is copied into the poisoned output.
        with torch_threads(threads), torch.no_grad():
            return measure_library_call(
                call,
                check,
                environment=environment,
                seed=seed,
                threads=threads,
                timing=timing,
                first=lambda: y.copy_(call()),
            )


class TorchConv2dGpuBaseline(GpuLibraryBaseline):
    """PyTorch's GPU conv2d (cuDNN); see the module docstring."""

    name = "torch.conv2d_gpu"
    version = 1
    library_key = "cudnn"
    slowest_gflops = 20.0

    def capabilities(self, target: Target) -> Capabilities:
        return Capabilities(
            kinds=("cuda",),
            ops=("conv2d",),
            dtypes=("float16", "bfloat16", "float32"),
            epilogues=("none",),
        )

    def space(self, workload: Workload, target: Target) -> SearchSpace:
        return SearchSpace(knobs=(Knob("benchmark", (True, False)),))

    def default_config(self, workload: Workload, target: Target) -> Config:
        return Config({"benchmark": True})

    def baseline_configs(self, workload: Workload, target: Target) -> list[Config]:
        return [Config({"benchmark": True}), Config({"benchmark": False})]

    def run(
        self, request: MeasureRequest, artifact: Artifact, *, timing: TimingPolicy
    ) -> MeasureResult:
        import torch

        from tunehub.kernels import triton_conv_kernels as kernels
        from tunehub.kernels.gpu_timing import LIBRARY_FAILURES as failures
        from tunehub.kernels.gpu_timing import check_then_time, run_environment
        from tunehub.kernels.triton_gemm import _device

        workload = request.workload
        device = _device()
        environment, seed = run_environment(device)
        benchmark = bool(request.config["benchmark"])
        environment.update(
            library="torch.nn.functional.conv2d",
            library_version=f"torch {torch.__version__}, cuDNN {_cudnn_version(torch)}",
            cudnn_benchmark=benchmark,
        )
        saved = torch.backends.cudnn.benchmark
        torch.backends.cudnn.benchmark = benchmark
        try:
            ops = kernels.operands(workload, device, seed)
            kwargs = conv_kwargs(workload)

            def call() -> Any:
                return torch.nn.functional.conv2d(ops.x, ops.w, **kwargs)

            with torch.no_grad():
                return check_then_time(
                    call,
                    lambda _: kernels.check(ops.out, kernels.reference(ops), workload.dtype),
                    device=device,
                    environment=environment,
                    timing=timing,
                    first=lambda: ops.out.copy_(call()),  # conv2d has no out=
                )
        except failures.catch as exc:
            return failures.record(exc, environment)
        finally:
            torch.backends.cudnn.benchmark = saved


def _cudnn_version(torch: Any) -> object:
    """cuDNN's version as torch reports it (torch leaves the function untyped)."""
    return torch.backends.cudnn.version()
