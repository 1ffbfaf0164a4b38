"""Workload: what to compute (op, shape, dtype, operand layouts, epilogue) and its canonical key.

The operator (``tunehub.core.operators``) says what the shape fields mean, which fields of its
own the workload carries (``params``), and counts its flops and bytes."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from tunehub.core.errors import InvalidSpec
from tunehub.core.keys import canonical_json
from tunehub.core.operators import Operator, Params, get_operator, operator_names
from tunehub.core.registry import UnknownName

# The built-in operators (more may be registered: ``tunehub.core.operators``).
OPS = ("matmul", "bmm", "grouped_mm", "attention", "conv2d")
# The fields every operator has; an operator's own fields are its ``params``.
COMMON_FIELDS = ("op", "m", "n", "k", "dtype", "a_layout", "b_layout", "epilogue", "allow_tf32")
DTYPES = ("float16", "bfloat16", "float32", "float64", "float8_e4m3")
LAYOUTS = ("row_major", "col_major")
EPILOGUES = ("none", "bias", "bias_relu", "bias_gelu")
# Largest single dimension accepted; beyond this a dense GEMM does not fit any worker we run.
MAX_DIM = 1 << 16
# Largest m*n*k accepted (about 2**45 multiply-adds, hours of CPU time).
MAX_VOLUME = 1 << 45

# Bytes per element of A and B.
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "float8_e4m3": 1}
# C's element type: the inputs' own, except float8 products, which are written as float16.
OUTPUT_DTYPE = {"float8_e4m3": "float16"}
# Largest A + B + C accepted: a worker holds them, a NaN-poisoned C and a float64 reference.
MAX_OPERAND_BYTES = 4 << 30


def _derived_shape(op: object, own: Mapping[str, object]) -> tuple[int, int, int] | None:
    """m, n, k from the operator's own fields, if it derives them (None for an unknown op:
    the Workload names it)."""
    if not isinstance(op, str):
        return None
    try:
        operator = get_operator(op)
    except UnknownName:
        return None
    return operator.derived_shape(own)


@dataclass(frozen=True)
class Workload:
    """A GEMM ``C[m, n] = epilogue(A[m, k] @ B[k, n] + bias[n])``.

    A and B are each stored row- or column-major (``a_layout``, ``b_layout``; a column-major B
    is a row-major N x K matrix, as a linear layer's weight is); C is row-major. ``allow_tf32``
    lets a float32 product use TensorFloat-32 arithmetic (10-bit mantissas) where the device
    has it; it is a property of what is asked, so results with and without it never mix.

    >>> w = Workload(m=256, n=256, k=256)
    >>> w.label
    'matmul 256x256x256 float32'
    >>> w.key  # fields at their defaults keep the key the first key format gave
    'eb28581344c06c7dca7206815aeff1f567140b9b6bcba9756ddc1960b49eea11'
    >>> Workload(m=16, n=4096, k=4096, dtype="float16", b_layout="col_major").label
    'matmul 16x4096x4096 float16 B:col'
    >>> Workload(m=64, n=64, k=32, op="bmm", params={"batch": 8}).label
    'bmm 8x64x64x32 float32'

    ``params`` holds the operator's own fields (``batch``, ``b_broadcast`` for bmm), given as
    a mapping or pairs and kept as pairs in the operator's order, each at its default when not
    given; ``param(name)`` reads one.
    """

    m: int
    n: int
    k: int
    dtype: str = "float32"
    op: str = "matmul"
    a_layout: str = "row_major"
    b_layout: str = "row_major"
    epilogue: str = "none"
    allow_tf32: bool = False
    params: Params = ()

    def __post_init__(self) -> None:
        if not isinstance(self.op, str):
            raise InvalidSpec("op", f"must be an operator name, got {self.op!r}")
        try:
            operator = get_operator(self.op)
        except UnknownName:
            known = ", ".join(operator_names())
            raise InvalidSpec("op", f"unknown op {self.op!r}; known: {known}") from None
        raw: object = self.params
        if isinstance(raw, Mapping):
            given: dict[str, object] = dict(raw)
        else:
            try:
                given = dict(raw)  # type: ignore[call-overload]
            except (TypeError, ValueError):
                raise InvalidSpec("params", f"must be name/value pairs, got {raw!r}") from None
        object.__setattr__(self, "params", operator.params(given))
        for name in ("m", "n", "k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidSpec(name, f"must be an integer, got {value!r}")
            if value < 1:
                raise InvalidSpec(name, f"must be >= 1, got {value}")
            if value > MAX_DIM:
                raise InvalidSpec(name, f"must be <= {MAX_DIM}, got {value}")
        volume = self.flops // 2
        if volume > MAX_VOLUME:
            what = "m*n*k" if not self.params else "the multiply-adds"
            raise InvalidSpec("k", f"{what} = {volume} exceeds {MAX_VOLUME}")
        if self.dtype not in DTYPES:
            raise InvalidSpec("dtype", f"unknown dtype {self.dtype!r}; known: {', '.join(DTYPES)}")
        operand_bytes = self.operand_bytes
        if operand_bytes > MAX_OPERAND_BYTES:
            largest = max(("m", "n", "k"), key=lambda name: int(getattr(self, name)))
            raise InvalidSpec(
                largest,
                f"A, B and C take {operand_bytes / 2**30:.1f} GiB; at most "
                f"{MAX_OPERAND_BYTES / 2**30:.0f} GiB are accepted",
            )
        for name in ("a_layout", "b_layout"):
            if getattr(self, name) not in LAYOUTS:
                raise InvalidSpec(
                    name, f"unknown layout {getattr(self, name)!r}; known: {', '.join(LAYOUTS)}"
                )
        if self.epilogue not in EPILOGUES:
            raise InvalidSpec(
                "epilogue", f"unknown epilogue {self.epilogue!r}; known: {', '.join(EPILOGUES)}"
            )
        if not isinstance(self.allow_tf32, bool):
            raise InvalidSpec("allow_tf32", f"must be true or false, got {self.allow_tf32!r}")
        if self.allow_tf32 and self.dtype != "float32":
            raise InvalidSpec("allow_tf32", f"applies to float32 only, not {self.dtype}")
        operator.check(self)

    @property
    def operator(self) -> Operator:
        return get_operator(self.op)

    def param(self, name: str) -> Any:
        """The value of the operator's own field ``name`` (a ``ParamValue``: an int, a bool,
        or a tuple of ints, as the operator's spec says); InvalidSpec if it has none."""
        for key, value in self.params:
            if key == name:
                return value
        raise InvalidSpec(name, f"not a field of op {self.op}")

    @property
    def output_dtype(self) -> str:
        """C's element type."""
        return OUTPUT_DTYPE.get(self.dtype, self.dtype)

    @property
    def operand_bytes(self) -> int:
        """Bytes of the operands and the output together (A, B and C for a GEMM)."""
        return self.operator.operand_bytes(
            self, DTYPE_BYTES[self.dtype], DTYPE_BYTES[self.output_dtype]
        )

    @property
    def has_bias(self) -> bool:
        return self.epilogue != "none"

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "m": self.m,
            "n": self.n,
            "k": self.k,
            "dtype": self.dtype,
            "a_layout": self.a_layout,
            "b_layout": self.b_layout,
            "epilogue": self.epilogue,
            "allow_tf32": self.allow_tf32,
            **dict(self.params),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Workload:
        """The inverse of ``to_dict``; also reads the first format's single ``layout`` field.
        Names beyond the common fields are the operator's own (InvalidSpec naming one it
        does not have). m, n and k may be left out (or None) for an operator that derives
        them from its own fields (conv2d: ``Operator.derived_shape``)."""
        legacy = data.get("layout")
        if legacy not in (None, "row_major"):
            raise InvalidSpec("layout", f"unknown layout {legacy!r}")
        own = {
            name: value
            for name, value in data.items()
            if name not in COMMON_FIELDS and name != "layout"
        }
        op = data.get("op", "matmul")
        shape: dict[str, Any] = {name: data.get(name) for name in ("m", "n", "k")}
        if any(value is None for value in shape.values()):
            derived = _derived_shape(op, own)
            for name, value in zip(("m", "n", "k"), derived or (None,) * 3, strict=True):
                if shape[name] is None:
                    if value is None:
                        raise InvalidSpec(name, "is required")
                    shape[name] = value
        return cls(
            op=op,
            m=shape["m"],
            n=shape["n"],
            k=shape["k"],
            dtype=data.get("dtype", "float32"),
            a_layout=data.get("a_layout", "row_major"),
            b_layout=data.get("b_layout", "row_major"),
            epilogue=data.get("epilogue", "none"),
            allow_tf32=data.get("allow_tf32", False),
            params=tuple(own.items()),
        )

    def key_dict(self) -> dict[str, Any]:
        """What the key hashes. The first format had one ``layout`` field (always
        ``row_major``); fields added since appear only when they differ from their defaults,
        so every workload of that format keeps its key (and its stored schedules). An
        operator's own fields appear under their names (matmul has none)."""
        data: dict[str, Any] = {
            "op": self.op,
            "m": self.m,
            "n": self.n,
            "k": self.k,
            "dtype": self.dtype,
            "layout": "row_major",
            "epilogue": self.epilogue,
        }
        if self.a_layout != "row_major":
            data["a_layout"] = self.a_layout
        if self.b_layout != "row_major":
            data["b_layout"] = self.b_layout
        if self.allow_tf32:
            data["allow_tf32"] = True
        data.update(self.params)
        return data

    @cached_property
    def key(self) -> str:
        """sha256 of the canonical JSON of ``key_dict()``."""
        # The canonical JSON written out in its (sorted) key order, not through json.dumps: a
        # batch lookup keys a thousand workloads, and every value here is an int or one of the
        # plain names checked above, which JSON writes as they are (test_workload holds the
        # text to canonical_json's). An operator's own fields go through canonical_json.
        if self.params:
            return hashlib.sha256(canonical_json(self.key_dict()).encode()).hexdigest()
        head = ""
        if self.a_layout != "row_major":
            head += f'"a_layout":"{self.a_layout}",'
        if self.allow_tf32:
            head += '"allow_tf32":true,'
        if self.b_layout != "row_major":
            head += f'"b_layout":"{self.b_layout}",'
        text = (
            f'{{{head}"dtype":"{self.dtype}","epilogue":"{self.epilogue}","k":{int(self.k)},'
            f'"layout":"row_major","m":{int(self.m)},"n":{int(self.n)},"op":"{self.op}"}}'
        )
        return hashlib.sha256(text.encode()).hexdigest()

    @property
    def label(self) -> str:
        """Readable form, e.g. ``matmul 256x256x256 float32 A:col +bias_relu``."""
        text = f"{self.op} {self.operator.shape_text(self)} {self.dtype}"
        if self.allow_tf32:
            text += " tf32"
        if self.a_layout != "row_major":
            text += " A:col"
        if self.b_layout != "row_major":
            text += " B:col"
        if self.epilogue != "none":
            text += f" +{self.epilogue}"
        return text

    @property
    def flops(self) -> int:
        """Floating-point operations (2·m·n·k per product; the epilogue is not counted)."""
        return self.operator.flops(self)

    def gflops(self, secs: float) -> float:
        return self.flops / secs / 1e9

    def with_shape(self, m: int, n: int, k: int) -> Workload:
        """The same workload at another GEMM shape (its own fields kept)."""
        return Workload.from_dict({**self.to_dict(), "m": m, "n": n, "k": k})
