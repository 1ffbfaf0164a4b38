"""Capabilities: what a template can compute on a kind of target, and the one check against it."""

from __future__ import annotations

from dataclasses import dataclass

from tunehub.core.errors import InvalidSpec
from tunehub.core.target import Target
from tunehub.core.workload import DTYPES, EPILOGUES, LAYOUTS, Workload


class Unsupported(InvalidSpec):
    """A valid workload that a template cannot run on a target; ``field`` names the reason
    (``workload.dtype``, ``target``, …), so the API answers 422 pointing at it."""


@dataclass(frozen=True)
class Capabilities:
    """The workloads a template can run on one target.

    >>> caps = Capabilities(kinds=("cpu",), dtypes=("float32", "float64"))
    >>> from tunehub.core.target import Target
    >>> cpu = Target(kind="cpu", name="x", arch=(), cores=1)
    >>> caps.check("blis.gemm", Workload(m=8, n=8, k=8, dtype="float16"), cpu)
    Traceback (most recent call last):
    ...
    tunehub.core.capabilities.Unsupported: workload.dtype: blis.gemm has no float16 kernel \
on cpu x (supported: float32, float64)
    """

    kinds: tuple[str, ...]
    # The operators it computes: a template names each (a new operator is no template's).
    ops: tuple[str, ...] = ("matmul",)
    dtypes: tuple[str, ...] = DTYPES
    a_layouts: tuple[str, ...] = LAYOUTS
    b_layouts: tuple[str, ...] = LAYOUTS
    epilogues: tuple[str, ...] = EPILOGUES
    tf32: bool = False  # whether allow_tf32 workloads are accepted

    def problem(self, template: str, workload: Workload, target: Target) -> Unsupported | None:
        """The first reason ``template`` cannot run ``workload`` on ``target``, or None."""
        where = f"on {target.kind} {target.name}"
        if target.kind not in self.kinds:
            return Unsupported(
                "target", f"{template} runs on {', '.join(self.kinds)}, not {target.kind}"
            )
        checks = (
            ("op", workload.op, self.ops, "computes no"),
            ("dtype", workload.dtype, self.dtypes, "has no"),
            ("a_layout", workload.a_layout, self.a_layouts, "reads no"),
            ("b_layout", workload.b_layout, self.b_layouts, "reads no"),
            ("epilogue", workload.epilogue, self.epilogues, "fuses no"),
        )
        for name, value, allowed, verb in checks:
            if value not in allowed:
                noun = {"dtype": "kernel", "op": "op", "epilogue": "epilogue"}.get(name, "layout")
                if name in ("a_layout", "b_layout"):
                    noun = f"{name[0].upper()} layout"
                return Unsupported(
                    f"workload.{name}",
                    f"{template} {verb} {value} {noun} {where} (supported: {', '.join(allowed)})",
                )
        if workload.allow_tf32 and not self.tf32:
            return Unsupported(
                "workload.allow_tf32", f"{template} has no TensorFloat-32 kernels {where}"
            )
        return None

    def check(self, template: str, workload: Workload, target: Target) -> None:
        """Raise Unsupported (an InvalidSpec naming the field) if the workload cannot run."""
        problem = self.problem(template, workload, target)
        if problem is not None:
            raise problem
