"""Workload: what to compute (op, shape, dtype, layout, epilogue) and its canonical key."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from tunehub.core.errors import InvalidSpec
from tunehub.core.keys import sha256_key

OPS = ("matmul",)
DTYPES = ("float32", "float64")
LAYOUTS = ("row_major",)
EPILOGUES = ("none", "bias", "bias_relu")
# Largest single dimension accepted; beyond this a dense GEMM does not fit any worker we run.
MAX_DIM = 1 << 16
# Largest m*n*k accepted (about 2**45 multiply-adds, hours of CPU time).
MAX_VOLUME = 1 << 45

DTYPE_BYTES = {"float32": 4, "float64": 8}
# Largest A + B + C accepted: a worker holds them, a NaN-poisoned C and a float64 reference.
MAX_OPERAND_BYTES = 4 << 30


@dataclass(frozen=True)
class Workload:
    """A GEMM ``C[m, n] = A[m, k] @ B[k, n]`` (+ epilogue), row-major.

    >>> w = Workload(m=256, n=256, k=256)
    >>> w.label
    'matmul 256x256x256 float32'
    >>> len(w.key)
    64
    """

    m: int
    n: int
    k: int
    dtype: str = "float32"
    op: str = "matmul"
    layout: str = "row_major"
    epilogue: str = "none"

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise InvalidSpec("op", f"unknown op {self.op!r}; known: {', '.join(OPS)}")
        for name in ("m", "n", "k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidSpec(name, f"must be an integer, got {value!r}")
            if value < 1:
                raise InvalidSpec(name, f"must be >= 1, got {value}")
            if value > MAX_DIM:
                raise InvalidSpec(name, f"must be <= {MAX_DIM}, got {value}")
        if self.m * self.n * self.k > MAX_VOLUME:
            raise InvalidSpec("k", f"m*n*k = {self.m * self.n * self.k} exceeds {MAX_VOLUME}")
        if self.dtype not in DTYPES:
            raise InvalidSpec("dtype", f"unknown dtype {self.dtype!r}; known: {', '.join(DTYPES)}")
        operand_bytes = (self.m * self.k + self.k * self.n + self.m * self.n) * DTYPE_BYTES[
            self.dtype
        ]
        if operand_bytes > MAX_OPERAND_BYTES:
            largest = max(("m", "n", "k"), key=lambda name: int(getattr(self, name)))
            raise InvalidSpec(
                largest,
                f"A, B and C take {operand_bytes / 2**30:.1f} GiB; at most "
                f"{MAX_OPERAND_BYTES / 2**30:.0f} GiB are accepted",
            )
        if self.layout not in LAYOUTS:
            raise InvalidSpec(
                "layout", f"unknown layout {self.layout!r}; known: {', '.join(LAYOUTS)}"
            )
        if self.epilogue not in EPILOGUES:
            raise InvalidSpec(
                "epilogue", f"unknown epilogue {self.epilogue!r}; known: {', '.join(EPILOGUES)}"
            )

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "m": self.m,
            "n": self.n,
            "k": self.k,
            "dtype": self.dtype,
            "layout": self.layout,
            "epilogue": self.epilogue,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Workload:
        return cls(
            op=data.get("op", "matmul"),
            m=data["m"],
            n=data["n"],
            k=data["k"],
            dtype=data.get("dtype", "float32"),
            layout=data.get("layout", "row_major"),
            epilogue=data.get("epilogue", "none"),
        )

    @cached_property
    def key(self) -> str:
        """sha256 of the canonical JSON of every field."""
        return sha256_key(self.to_dict())

    @property
    def label(self) -> str:
        """Readable form, e.g. ``matmul 256x256x256 float32 +bias_relu``."""
        text = f"{self.op} {self.m}x{self.n}x{self.k} {self.dtype}"
        if self.layout != "row_major":
            text += f" {self.layout}"
        if self.epilogue != "none":
            text += f" +{self.epilogue}"
        return text

    @property
    def flops(self) -> int:
        """Floating-point operations of the GEMM (2·m·n·k; the epilogue is not counted)."""
        return 2 * self.m * self.n * self.k

    def gflops(self, secs: float) -> float:
        return self.flops / secs / 1e9
