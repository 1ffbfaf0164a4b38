"""Operators: what a workload computes, each with its own shape fields, validation and counts.

A Workload is an operator name plus the fields every operator shares (``m``, ``n``, ``k`` — the
operator's GEMM view, which the cost model and the lookup tiers compare shapes by — ``dtype``,
operand layouts, ``epilogue``, ``allow_tf32``) and the operator's own fields (``params``:
``batch`` for ``bmm``, ``group_sizes`` for ``grouped_mm``). An Operator says which own
fields it has (names, types, defaults, limits), which epilogues it fuses, and how many flops
and operand bytes a workload of it moves. The API, the store, the lookup tiers, the client
and the CLI handle every operator through this spec; adding an operator adds its spec here
(or through the ``tunehub.operators`` entry points / ``$TUNEHUB_OPERATOR_MODULES``), its
templates (``tunehub.kernels``) and its features (``tunehub.cost_model.features``).

>>> get_operator("bmm").field("batch").check(4)
4
>>> get_operator("bmm").field("batch").check(0)
Traceback (most recent call last):
...
tunehub.core.errors.InvalidSpec: batch: must be >= 1, got 0
>>> get_operator("conv3d")
Traceback (most recent call last):
...
tunehub.core.registry.UnknownName: unknown op 'conv3d'; known: attention, bmm, conv2d, \
grouped_mm, matmul
>>> get_operator("grouped_mm").field("group_sizes").parse("3,0,5")
(3, 0, 5)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from tunehub.core.errors import InvalidSpec
from tunehub.core.registry import Registry

if TYPE_CHECKING:
    from tunehub.core.workload import Workload

PLUGINS_ENV = "TUNEHUB_OPERATOR_MODULES"

ParamValue = int | bool | str | tuple[int, ...]
Params = tuple[tuple[str, ParamValue], ...]

ALL_EPILOGUES = ("none", "bias", "bias_relu", "bias_gelu")


@dataclass(frozen=True)
class Field:
    """One of an operator's own shape fields: an integer in [lo, hi], a boolean, a list of
    ``min_len`` to ``max_len`` integers each in [lo, hi] (``ints``, kept as a tuple), or one
    of the names in ``choices`` (``choice``)."""

    name: str
    kind: str  # "int", "bool", "ints" or "choice"
    default: ParamValue
    description: str
    lo: int = 1
    hi: int = 1 << 16
    min_len: int = 1
    max_len: int = 64
    choices: tuple[str, ...] = ()

    def check(self, value: object) -> ParamValue:
        """``value`` if it is valid (no coercion: ``True`` is not an int, ``"4"`` not 4)."""
        if self.kind == "bool":
            if not isinstance(value, bool):
                raise InvalidSpec(self.name, f"must be true or false, got {value!r}")
            return value
        if self.kind == "ints":
            return self._check_ints(value)
        if self.kind == "choice":
            if not isinstance(value, str) or value not in self.choices:
                raise InvalidSpec(
                    self.name, f"must be one of {', '.join(self.choices)}, got {value!r}"
                )
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidSpec(self.name, f"must be an integer, got {value!r}")
        if value < self.lo:
            raise InvalidSpec(self.name, f"must be >= {self.lo}, got {value}")
        if value > self.hi:
            raise InvalidSpec(self.name, f"must be <= {self.hi}, got {value}")
        return value

    def _check_ints(self, value: object) -> tuple[int, ...]:
        if not isinstance(value, list | tuple):
            raise InvalidSpec(self.name, f"must be a list of integers, got {value!r}")
        if not self.min_len <= len(value) <= self.max_len:
            raise InvalidSpec(
                self.name,
                f"must have {self.min_len} to {self.max_len} entries, got {len(value)}",
            )
        for i, item in enumerate(value):
            if isinstance(item, bool) or not isinstance(item, int):
                raise InvalidSpec(self.name, f"entry {i} must be an integer, got {item!r}")
            if not self.lo <= item <= self.hi:
                raise InvalidSpec(
                    self.name, f"entry {i} must be in [{self.lo}, {self.hi}], got {item}"
                )
        return tuple(value)

    def parse(self, text: str) -> ParamValue:
        """A query-string value (``"8"``, ``"true"``, ``"3,0,5"``) checked as ``check`` does."""
        if self.kind == "ints":
            try:
                items = [int(part) for part in text.split(",")] if text.strip() else []
            except ValueError:
                raise InvalidSpec(
                    self.name, f"must be comma-separated integers, got {text!r}"
                ) from None
            return self._check_ints(items)
        if self.kind == "choice":
            return self.check(text.strip())
        if self.kind == "bool":
            lowered = text.strip().lower()
            if lowered not in ("true", "false", "1", "0"):
                raise InvalidSpec(self.name, f"must be true or false, got {text!r}")
            return lowered in ("true", "1")
        try:
            number = int(text)
        except ValueError:
            raise InvalidSpec(self.name, f"must be an integer, got {text!r}") from None
        return self.check(number)

    def to_dict(self) -> dict[str, object]:
        kind = {"bool": "boolean", "int": "integer", "ints": "array", "choice": "string"}[self.kind]
        out: dict[str, object] = {
            "name": self.name,
            "type": kind,
            "default": list(self.default) if isinstance(self.default, tuple) else self.default,
            "description": self.description,
        }
        if self.kind == "int":
            out.update(minimum=self.lo, maximum=self.hi)
        if self.kind == "choice":
            out.update(enum=list(self.choices))
        if self.kind == "ints":
            out.update(
                items={"type": "integer", "minimum": self.lo, "maximum": self.hi},
                minItems=self.min_len,
                maxItems=self.max_len,
            )
        return out


class Operator:
    """An operator's spec. Subclasses set ``name``, ``description``, ``fields``,
    ``epilogues`` and ``gemm`` (what m, n, k mean), and count flops and operand bytes."""

    name: ClassVar[str]
    description: ClassVar[str]
    fields: ClassVar[tuple[Field, ...]] = ()
    epilogues: ClassVar[tuple[str, ...]] = ALL_EPILOGUES
    gemm: ClassVar[str] = "C[m, n] = A[m, k] @ B[k, n]"
    # Names users may reach for that the operator spells as m, n or k (attention's q_len is
    # m): a workload naming one is refused with the name to use instead.
    aliases: ClassVar[tuple[tuple[str, str], ...]] = ()
    # The template a job of this operator gets when it names none, per target kind (by name:
    # the kernels register below this layer). Kinds not listed take the first template, by
    # name, that runs the workload there.
    default_templates: ClassVar[Mapping[str, str]] = {}

    def field(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise InvalidSpec(name, self._not_a_field(name))

    def _not_a_field(self, name: str) -> str:
        for alias, common in self.aliases:
            if alias == name:
                return f"op {self.name} takes {name} as {common} ({self.gemm.split(':')[0]})"
        own = ", ".join(f.name for f in self.fields) or "none"
        return f"not a field of op {self.name} (its own fields: {own})"

    def params(self, given: Mapping[str, object]) -> Params:
        """Every own field's value, in the spec's order: given ones checked, others defaults.

        InvalidSpec naming the field for an unknown name or a bad value."""
        names = {f.name for f in self.fields}
        for name in given:
            if name not in names:
                raise InvalidSpec(name, self._not_a_field(name))
        return tuple(
            (f.name, f.check(given[f.name]) if f.name in given else f.default) for f in self.fields
        )

    def derived_shape(self, params: Mapping[str, object]) -> tuple[int, int, int] | None:
        """m, n, k as the operator's own fields give them, for an operator whose GEMM view
        follows from its fields (conv2d); None where m, n, k are given (matmul, bmm). A
        workload of such an operator may leave m, n, k out (``Workload.from_dict``, the API,
        the CLI); given, they must be these. InvalidSpec naming a field when the fields do
        not make a shape (a kernel larger than the padded image)."""
        return None

    def multiplicity(self, workload: Workload) -> int:
        """How many m x n x k products the workload is (``batch`` for bmm)."""
        return 1

    def flops(self, workload: Workload) -> int:
        """Floating-point operations (2·m·n·k per product; epilogues are not counted)."""
        return 2 * workload.m * workload.n * workload.k * self.multiplicity(workload)

    def operand_bytes(self, workload: Workload, elem: int, out_elem: int) -> int:
        """Bytes of the operands and the output together."""
        count = self.multiplicity(workload)
        inputs = (workload.m * workload.k + workload.k * workload.n) * count * elem
        return inputs + workload.m * workload.n * count * out_elem

    def shape_text(self, workload: Workload) -> str:
        """The shape part of a workload's label (``256x256x256``)."""
        return f"{workload.m}x{workload.n}x{workload.k}"

    def check(self, workload: Workload) -> None:
        """Rules that span fields (the common ones are checked by Workload)."""
        if workload.epilogue not in self.epilogues:
            raise InvalidSpec(
                "epilogue",
                f"op {self.name} fuses no {workload.epilogue} epilogue "
                f"(supported: {', '.join(self.epilogues)})",
            )

    def to_dict(self) -> dict[str, object]:
        """What ``GET /api/v1/operators`` says of it."""
        return {
            "name": self.name,
            "description": self.description,
            "gemm": self.gemm,
            "fields": [f.to_dict() for f in self.fields],
            "epilogues": list(self.epilogues),
        }


class Matmul(Operator):
    name = "matmul"
    description = "GEMM C[m, n] = epilogue(A[m, k] @ B[k, n] + bias[n])"
    default_templates = {"cpu": "blis.gemm", "cuda": "triton.gemm"}


class Bmm(Operator):
    """Batched GEMM: ``batch`` independent products, or one B shared by every entry."""

    name = "bmm"
    default_templates = {"cpu": "blis.bmm", "cuda": "triton.bmm"}
    description = (
        "batched GEMM C[b, m, n] = A[b, m, k] @ B[b, k, n] for b < batch; with b_broadcast, "
        "one B[k, n] serves every entry"
    )
    gemm = "each entry: C[b, m, n] = A[b, m, k] @ B[b, k, n]"
    fields = (
        Field("batch", "int", 1, "Number of products (A and C are batch x m x k, batch x m x n)."),
        Field(
            "b_broadcast",
            "bool",
            False,
            "One B (k x n) for every batch entry (as torch.bmm of a B expanded along the batch); "
            "else B is batch x k x n.",
        ),
    )
    epilogues = ("none",)

    def multiplicity(self, workload: Workload) -> int:
        return int(workload.param("batch"))

    def operand_bytes(self, workload: Workload, elem: int, out_elem: int) -> int:
        batch = int(workload.param("batch"))
        b_count = 1 if workload.param("b_broadcast") else batch
        m, n, k = workload.m, workload.n, workload.k
        return (m * k * batch + k * n * b_count) * elem + m * n * batch * out_elem

    def shape_text(self, workload: Workload) -> str:
        text = f"{workload.param('batch')}x{workload.m}x{workload.n}x{workload.k}"
        return text + (" B:bcast" if workload.param("b_broadcast") else "")


class GroupedMm(Operator):
    """Grouped GEMM (a mixture-of-experts layer): ``len(group_sizes)`` products sharing N and K,
    group g multiplying its ``group_sizes[g]`` rows of A by its own B. ``m`` is the rows of all
    groups together (the sum of ``group_sizes``), so flops are 2·m·n·k as for one GEMM."""

    name = "grouped_mm"
    default_templates = {"cuda": "triton.grouped_mm"}
    description = (
        "grouped GEMM: for each group g, C[o_g:o_g+M_g, n] = A[o_g:o_g+M_g, k] @ B[g, k, n], the "
        "M_g given as group_sizes (o_g their running sum); m is their total"
    )
    gemm = "m = sum of group_sizes rows of A and C; B is groups x k x n"
    fields = (
        Field(
            "group_sizes",
            "ints",
            (),
            "Rows of each group (1 to 64 groups, each >= 0, an empty group allowed); their sum "
            "is m. Query parameters spell it 3,0,5.",
            lo=0,
            hi=1 << 16,
            min_len=1,
            max_len=64,
        ),
    )
    epilogues = ("none",)

    def operand_bytes(self, workload: Workload, elem: int, out_elem: int) -> int:
        groups = len(_sizes(workload))
        m, n, k = workload.m, workload.n, workload.k
        return (m * k + groups * k * n) * elem + m * n * out_elem

    def shape_text(self, workload: Workload) -> str:
        return f"{workload.m}x{workload.n}x{workload.k} groups={len(_sizes(workload))}"

    def check(self, workload: Workload) -> None:
        super().check(workload)
        sizes = _sizes(workload)
        if not sizes:
            raise InvalidSpec("group_sizes", "is required (1 to 64 groups' rows)")
        if sum(sizes) != workload.m:
            raise InvalidSpec(
                "m", f"must equal the sum of group_sizes ({sum(sizes)}), got {workload.m}"
            )


def _sizes(workload: Workload) -> tuple[int, ...]:
    value = workload.param("group_sizes")
    return value if isinstance(value, tuple) else ()


class Attention(Operator):
    """Scaled dot-product attention, forward: for every (batch, head),
    ``O = softmax(Q @ K^T / sqrt(head_dim)) @ V``, causal (query i sees keys j <= i, the
    mask ``scaled_dot_product_attention(is_causal=True)`` applies) or not. Q and O are
    batch x heads x q_len x head_dim, K and V batch x heads x kv_len x head_dim, each
    contiguous. m, n, k are q_len, kv_len, head_dim."""

    name = "attention"
    default_templates = {"cuda": "triton.attention"}
    description = (
        "attention forward O[b, h] = softmax(Q[b, h] @ K[b, h]^T / sqrt(head_dim)) @ V[b, h]: "
        "m = q_len, n = kv_len, k = head_dim (64 or 128), float16 or bfloat16; causal masks "
        "key j > query i"
    )
    gemm = "m = q_len, n = kv_len, k = head_dim: S[m, n] = Q[m, k] @ K[n, k]^T, O = P[m, n] @ V"
    fields = (
        Field("batch", "int", 1, "Batch size (Q, K, V and O are batch x heads x len x head_dim).",
              hi=65535),
        Field("heads", "int", 1, "Attention heads (query heads = key/value heads).", hi=1024),
        Field("causal", "bool", False, "Query i attends to keys j <= i (top-left aligned)."),
    )  # fmt: skip
    epilogues = ("none",)
    aliases = (("q_len", "m"), ("kv_len", "n"), ("head_dim", "k"))
    HEAD_DIMS = (64, 128)
    DTYPES = ("float16", "bfloat16")

    def multiplicity(self, workload: Workload) -> int:
        return int(workload.param("batch")) * int(workload.param("heads"))

    def flops(self, workload: Workload) -> int:
        """4·q_len·kv_len·head_dim per (batch, head) (Q @ K^T and P @ V), halved when causal
        (the convention FlashAttention's benchmarks count by; softmax is not counted)."""
        full = 4 * workload.m * workload.n * workload.k * self.multiplicity(workload)
        return full // 2 if workload.param("causal") else full

    def operand_bytes(self, workload: Workload, elem: int, out_elem: int) -> int:
        count = self.multiplicity(workload)
        q, kv, d = workload.m, workload.n, workload.k
        return count * d * (q * elem + 2 * kv * elem + q * out_elem)

    def shape_text(self, workload: Workload) -> str:
        text = (
            f"b{workload.param('batch')} h{workload.param('heads')} q{workload.m} "
            f"kv{workload.n} d{workload.k}"
        )
        return text + (" causal" if workload.param("causal") else "")

    def check(self, workload: Workload) -> None:
        super().check(workload)
        if workload.k not in self.HEAD_DIMS:
            raise InvalidSpec(
                "k", f"head_dim (k) of op attention must be 64 or 128, got {workload.k}"
            )
        if workload.dtype not in self.DTYPES:
            raise InvalidSpec(
                "dtype", f"op attention takes float16 or bfloat16, not {workload.dtype}"
            )
        for name in ("a_layout", "b_layout"):
            if getattr(workload, name) != "row_major":
                raise InvalidSpec(name, "op attention reads Q, K and V contiguous (row_major) only")


class Conv2d(Operator):
    """2-D convolution, forward, as implicit GEMM: for every image and group, C[out_h·out_w,
    out_channels/groups] = A[out_h·out_w, (in_channels/groups)·kernel_h·kernel_w] @ B, A the
    input's patches (gathered, never stored), B the group's filters. m, n, k are that GEMM's
    (per image and group: ``multiplicity`` is batch·groups) and follow from the fields, so a
    workload may leave them out. ``data_layout`` (TVM's name; ``layout`` is a workload's
    legacy field) is the memory layout of the input, the filters
    and the output together, as PyTorch spells them: ``nchw`` (input N, C, H, W; filters O,
    I/groups, KH, KW; output N, O, OH, OW) or ``nhwc`` (``channels_last``: input N, H, W, C;
    filters O, KH, KW, I/groups; output N, OH, OW, O). Depthwise is groups = in_channels.

    >>> op = get_operator("conv2d")
    >>> op.derived_shape({"in_channels": 64, "out_channels": 128, "height": 56, "width": 56,
    ...                   "kernel_h": 3, "kernel_w": 3, "stride_h": 2, "stride_w": 2,
    ...                   "pad_h": 1, "pad_w": 1})
    (784, 128, 576)
    >>> op.derived_shape({"in_channels": 6, "out_channels": 4, "height": 8, "width": 8,
    ...                   "kernel_h": 1, "kernel_w": 1, "groups": 4})
    Traceback (most recent call last):
    ...
    tunehub.core.errors.InvalidSpec: groups: must divide in_channels (6) and out_channels (4), got 4
    """

    name = "conv2d"
    default_templates = {"cpu": "blis.conv2d", "cuda": "triton.conv2d"}
    description = (
        "2-D convolution Y = conv2d(X, W) with stride, padding, dilation and groups (depthwise "
        "too), NCHW or NHWC, as implicit GEMM per image and group: m = out_h*out_w, n = "
        "out_channels/groups, k = in_channels/groups*kernel_h*kernel_w (derived from the fields)"
    )
    gemm = (
        "per image and group: C[m = out_h*out_w, n = out_channels/groups] = "
        "patches[m, k = in_channels/groups*kernel_h*kernel_w] @ filters[k, n]"
    )
    REQUIRED = ("in_channels", "out_channels", "height", "width", "kernel_h", "kernel_w")
    LAYOUTS = ("nchw", "nhwc")
    DTYPES = ("float16", "bfloat16", "float32", "float64")
    fields = (
        Field("batch", "int", 1, "Images (N).", hi=65535),
        Field("in_channels", "int", 0, "Input channels (C); required.", lo=1),
        Field("out_channels", "int", 0, "Output channels (O, filters); required.", lo=1),
        Field("height", "int", 0, "Input height (H); required.", lo=1),
        Field("width", "int", 0, "Input width (W); required.", lo=1),
        Field("kernel_h", "int", 0, "Filter height (KH); required.", lo=1, hi=64),
        Field("kernel_w", "int", 0, "Filter width (KW); required.", lo=1, hi=64),
        Field("stride_h", "int", 1, "Vertical stride.", hi=64),
        Field("stride_w", "int", 1, "Horizontal stride.", hi=64),
        Field("pad_h", "int", 0, "Zero padding above and below.", lo=0, hi=64),
        Field("pad_w", "int", 0, "Zero padding left and right.", lo=0, hi=64),
        Field("dilation_h", "int", 1, "Vertical dilation (1: dense filter).", hi=64),
        Field("dilation_w", "int", 1, "Horizontal dilation.", hi=64),
        Field("groups", "int", 1, "Groups: must divide both channel counts (depthwise: "
              "groups = in_channels).", lo=1),
        Field("data_layout", "choice", "nchw", "Memory layout of input, filters and output: nchw "
              "(PyTorch's default) or nhwc (channels_last).", choices=LAYOUTS),
    )  # fmt: skip
    epilogues = ("none",)

    def derived_shape(self, params: Mapping[str, object]) -> tuple[int, int, int]:
        p: dict[str, Any] = dict(self.params(params))
        for name in self.REQUIRED:
            if p[name] == 0:
                raise InvalidSpec(name, "is required (a positive integer)")
        ic, oc, groups = int(p["in_channels"]), int(p["out_channels"]), int(p["groups"])
        if ic % groups or oc % groups:
            raise InvalidSpec(
                "groups", f"must divide in_channels ({ic}) and out_channels ({oc}), got {groups}"
            )
        out: list[int] = []
        for axis, size in (("h", "height"), ("w", "width")):
            extent = int(p[f"dilation_{axis}"]) * (int(p[f"kernel_{axis}"]) - 1) + 1
            padded = int(p[size]) + 2 * int(p[f"pad_{axis}"])
            if extent > padded:
                raise InvalidSpec(
                    f"kernel_{axis}",
                    f"the (dilated) filter spans {extent} rows/columns, more than the padded "
                    f"{size} {padded}",
                )
            out.append((padded - extent) // int(p[f"stride_{axis}"]) + 1)
        m = out[0] * out[1]
        if m > _MAX_GEMM_DIM:
            raise InvalidSpec(
                "height",
                f"the output image has {out[0]}x{out[1]} = {m} pixels, more than "
                f"{_MAX_GEMM_DIM} (the GEMM view's m)",
            )
        k = ic // groups * int(p["kernel_h"]) * int(p["kernel_w"])
        if k > _MAX_GEMM_DIM:
            raise InvalidSpec(
                "in_channels",
                f"in_channels/groups x kernel_h x kernel_w = {k} is more than "
                f"{_MAX_GEMM_DIM} (the GEMM view's k)",
            )
        return m, oc // groups, k

    @staticmethod
    def output_hw(workload: Workload) -> tuple[int, int]:
        """The output's height and width."""
        p: dict[str, Any] = dict(workload.params)
        sizes = []
        for axis, size in (("h", "height"), ("w", "width")):
            extent = int(p[f"dilation_{axis}"]) * (int(p[f"kernel_{axis}"]) - 1) + 1
            padded = int(p[size]) + 2 * int(p[f"pad_{axis}"])
            sizes.append((padded - extent) // int(p[f"stride_{axis}"]) + 1)
        return sizes[0], sizes[1]

    def multiplicity(self, workload: Workload) -> int:
        return int(workload.param("batch")) * int(workload.param("groups"))

    def operand_bytes(self, workload: Workload, elem: int, out_elem: int) -> int:
        p: dict[str, Any] = dict(workload.params)
        batch, ic, oc = int(p["batch"]), int(p["in_channels"]), int(p["out_channels"])
        image = batch * ic * int(p["height"]) * int(p["width"])
        filters = oc * workload.k
        return (image + filters) * elem + batch * oc * workload.m * out_elem

    def shape_text(self, workload: Workload) -> str:
        p: dict[str, Any] = dict(workload.params)
        text = (
            f"{p['batch']}x{p['in_channels']}x{p['height']}x{p['width']} -> {p['out_channels']} "
            f"k{p['kernel_h']}x{p['kernel_w']}"
        )
        for label, name in (("s", "stride"), ("p", "pad"), ("d", "dilation")):
            h, w = p[f"{name}_h"], p[f"{name}_w"]
            if (h, w) != (0 if name == "pad" else 1,) * 2:
                text += f" {label}{h}" if h == w else f" {label}{h}x{w}"
        if p["groups"] != 1:
            text += f" g{p['groups']}"
        return f"{text} {p['data_layout']}"

    def check(self, workload: Workload) -> None:
        super().check(workload)
        m, n, k = self.derived_shape(dict(workload.params))
        for name, want in (("m", m), ("n", n), ("k", k)):
            got = getattr(workload, name)
            if got != want:
                raise InvalidSpec(
                    name,
                    f"op conv2d derives {name} = {want} from its fields ({self.gemm}), got "
                    f"{got}; leave m, n and k out",
                )
        if workload.dtype not in self.DTYPES:
            raise InvalidSpec("dtype", f"op conv2d takes {', '.join(self.DTYPES)}, not "
                              f"{workload.dtype}")  # fmt: skip
        for name in ("a_layout", "b_layout"):
            if getattr(workload, name) != "row_major":
                raise InvalidSpec(
                    name, "op conv2d takes its memory layout from its field data_layout"
                )


# The GEMM view's largest dimension (``tunehub.core.workload.MAX_DIM``, which imports this).
_MAX_GEMM_DIM = 1 << 16


def _as_operator(loaded: object) -> Operator:
    item = loaded() if isinstance(loaded, type) else loaded
    if not isinstance(item, Operator):
        raise TypeError(f"{loaded!r} is not a tunehub Operator")
    return item


OPERATORS: Registry[Operator] = Registry(
    "tunehub.operators", kind="op", env_var=PLUGINS_ENV, coerce=_as_operator
)


def register_operator(operator: Operator) -> Operator:
    """Make ``operator`` available under its name (a plugin module calls this at import)."""
    return OPERATORS.register(operator.name, operator)


def get_operator(name: str) -> Operator:
    """The operator named ``name``; UnknownName (a KeyError) if none."""
    return OPERATORS.get(name)


def operator_names() -> tuple[str, ...]:
    return OPERATORS.names()


register_operator(Matmul())
register_operator(Bmm())
register_operator(Attention())
register_operator(GroupedMm())
register_operator(Conv2d())
