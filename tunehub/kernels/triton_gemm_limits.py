"""Limits of the ``triton.gemm`` kernels, in pure Python: which variant, dtype, layout and config
can run on which GPU, and their shared-memory, register and workspace needs.

Kept apart from ``triton_gemm_kernels`` (which imports torch and Triton) so the template's
space, built in the service and the CPU-only tests, needs neither. Measured limits of Triton
3.6 on sm_90 are explained in ``benchmarks/notes/triton_gemm_notes.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

VARIANTS: tuple[str, ...] = ("tiled", "persistent", "tma", "ws", "splitk", "splitk_atomic")
EPILOGUES: tuple[str, ...] = ("none", "bias", "bias_relu", "bias_gelu")
LAYOUTS: tuple[str, ...] = ("row", "col")
DTYPES: tuple[str, ...] = ("float16", "bfloat16", "float32", "float8_e4m3fn")
CONFIG_KEYS: tuple[str, ...] = (
    "variant",
    "BLOCK_M",
    "BLOCK_N",
    "BLOCK_K",
    "GROUP_M",
    "num_warps",
    "num_stages",
    "SPLIT_K",
)

ELEMENT_BYTES: dict[str, int] = {"float16": 2, "bfloat16": 2, "float32": 4, "float8_e4m3fn": 1}
# C (and bias) dtype per operand dtype: fp8 results do not fit e4m3's range and precision.
OUT_DTYPE: dict[str, str] = {
    "float16": "float16",
    "bfloat16": "bfloat16",
    "float32": "float32",
    "float8_e4m3fn": "float16",
}
# ||C - ref|| / ||ref|| a correct kernel stays under, for K up to a few thousand.
TOLERANCE: dict[str, float] = {
    "float16": 2e-3,
    "bfloat16": 1.5e-2,
    "float32": 1e-5,
    "tf32": 5e-3,
    "float8_e4m3fn": 6e-2,
}

# Optional knobs and their defaults per variant; a space may leave them out. ``PAD_K``: copy
# A and B into buffers whose rows along K are 16-byte aligned (one launch before the GEMM's),
# so TMA and vectorised loads work where K's rows are not (K = 777 in fp16).
OPTIONAL_CONFIG_KEYS: tuple[str, ...] = ("FLATTEN", "PAD_K")
_FLATTEN_DEFAULT = {"persistent": False, "tma": True, "ws": False}

SPLIT_K_VARIANTS = ("tiled", "splitk", "splitk_atomic")
# Split-K in one launch (split-K is what they are: SPLIT_K >= 2).
ONE_KERNEL_SPLIT_VARIANTS = ("splitk", "splitk_atomic")
_PERSISTENT_VARIANTS = ("persistent", "tma", "ws")
_DESCRIPTOR_VARIANTS = ("tma", "ws")
# Smallest K step of the tensor-core MMA per operand width (Hopper wgmma k: 8 tf32, 16 f16/bf16,
# 32 fp8); tl.dot needs at least 16 in every dimension on any GPU.
_MIN_BLOCK_K = {"float16": 16, "bfloat16": 16, "float32": 16, "float8_e4m3fn": 32}
_MAX_REGS_PER_THREAD = 255
# What setmaxnreg gives ws's consumer warpgroups (12 warps share the 64K register file).
_MAX_REGS_WS = 232
# The estimate a composite tile with 16-bit operands may reach: Triton 3.6 compiled 192x128x64
# w4 s4 (estimated 272) to 255 registers and 360 bytes of stack with a GELU epilogue, and it
# ran 3000x1000x4000 at 1.09x the best power-of-two tile on the H100 (1536^3: 1.04x;
# benchmarks/results/gpu_composite-h100-20261125T020706.log). With float32 operands the same
# tile went to 15 KB of stack, so they keep the plain cap.
_MAX_REGS_COMPOSITE_EST = 280
_INT32_MAX = 2**31 - 1
# Tile of the split-K reduce kernel (triton_gemm_kernels): 4096 fp32 per program keeps it
# memory bound.
_REDUCE_BLOCK_M = 32
_REDUCE_BLOCK_N = 128
# Programs per "SM" when the interpreter runs persistent kernels on CPU tensors: small and odd,
# so a program loops over several tiles.
_INTERPRETER_NUM_SMS = 3


# Row counts of composite tiles: ``tiled`` runs BLOCK_M = 192 as a 128-row and a 64-row block
# that share each B tile (two dots a K step), since Triton's blocks are powers of two. cuBLAS
# answers 3000x1000x4000 with 192x128 tiles: 128 tiles for 132 SMs where 128x256 makes 96
# (benchmarks/notes/gpu_kernels_v2.md, "Composite tiles").
COMPOSITE_BLOCK_MS: tuple[int, ...] = (96, 192)
# The variants that take them: ``tiled`` (two pointer blocks) and ``tma`` (two descriptors).
_COMPOSITE_VARIANTS = ("tiled", "tma")
# Column counts of composite tiles, ``tma`` only (two descriptors of B): cuBLAS runs
# 127x5000x2048 with 64x80 tiles (126 for 132 SMs where 64x128 makes 80); on the H100, 64x80
# through TMA with 6 stages ran it 1.04x faster than the search's 64x128 pick
# (benchmarks/results/gpu_skinny-h100-20261125T051002-deep.log).
# cuBLAS's tile for 1536^3 is 128x144 in our orientation (its kernel name's first edge runs
# along our N): 132 tiles, one full wave, where 128x128 makes 144 and 128x256 72; 144 = 128 +
# 16 columns keeps wgmma's 64-row M whole (a 144-row M-composite did not, and lost). 192 = 128
# + 64 columns: 128 tiles of 1000x3000 where 128x256 makes 96.
COMPOSITE_BLOCK_NS: tuple[int, ...] = (80, 144, 192)
_COMPOSITE_REST = {96: 32, 192: 64, 80: 16, 144: 16}


def composite_rest(edge: int) -> int:
    """Rows (columns) of a composite tile edge's second block: 64 of 192, 32 of 96, 16 of 80
    and of 144; 0 for a power of two."""
    return _COMPOSITE_REST.get(edge, 0)


def padded_k(k: int, dtype: Any) -> int:
    """K rounded up so a row of K elements is a multiple of 16 bytes (what ``PAD_K`` pads to)."""
    per = 16 // ELEMENT_BYTES[dtype_name(dtype)]
    return -(-k // per) * per


def variants() -> tuple[str, ...]:
    """The kernel variants, in the order a space lists them."""
    return VARIANTS


def bit_reproducible(config: Mapping[str, Any]) -> bool:
    """Whether ``config``'s kernel gives the same bits on every call with the same inputs:
    all but ``splitk_atomic``, whose partials are summed in the order they arrive."""
    return config.get("variant") != "splitk_atomic"


def dtype_name(dtype: Any) -> str:
    """``"float16"`` for ``torch.float16`` or ``"float16"``; ValueError for others."""
    name = dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")
    if name not in ELEMENT_BYTES:
        raise ValueError(f"unsupported dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    return name


def variant_problem(variant: str, capability: int | None, interpreter: bool = False) -> str | None:
    """Why ``variant`` cannot run on a GPU of compute ``capability`` (e.g. 90) or under the
    interpreter, or None when it can."""
    if variant not in VARIANTS:
        return f"unknown variant {variant!r}: expected one of {', '.join(VARIANTS)}"
    if interpreter:
        return None
    if capability is None:
        return "no GPU compute capability given and not running under the Triton interpreter"
    if capability < 80:
        return f"sm_{capability}: these kernels need sm_80+ (bf16 and tf32 tensor cores)"
    if variant in _DESCRIPTOR_VARIANTS and capability < 90:
        return f"variant {variant!r} loads through TMA tensor descriptors, which need sm_90+"
    if variant == "ws" and capability != 90:
        return (
            f"variant 'ws' was checked only on sm_90 (Triton 3.6's Hopper warp-specialisation "
            f"pass); sm_{capability} takes another pass with other limits"
        )
    return None


def dtype_problem(dtype: Any, capability: int | None, interpreter: bool = False) -> str | None:
    """Why operands of ``dtype`` cannot be multiplied on this GPU or interpreter, or None."""
    name = dtype_name(dtype)
    if name == "float8_e4m3fn" and not interpreter and (capability is None or capability < 89):
        return f"float8 e4m3 tensor-core dots need sm_89+, not sm_{capability}"
    return None


def workload_problem(
    variant: str,
    m: int,
    n: int,
    k: int,
    dtype: Any,
    a_layout: str = "row",
    b_layout: str = "row",
) -> str | None:
    """Why ``variant`` cannot compute this problem with dense operands, or None.

    TMA descriptors need a 16-byte aligned leading dimension, so ``tma``/``ws`` refuse e.g. a
    row-major float16 A with K = 777; ``ws`` also needs K-major operands (row-major A,
    column-major B) for float32 and float8, whose wgmma cannot read an MN-major tile.
    """
    name = dtype_name(dtype)
    if a_layout not in LAYOUTS or b_layout not in LAYOUTS:
        return f"layouts {a_layout!r}, {b_layout!r}: expected 'row' or 'col'"
    if min(m, n, k) < 1:
        return f"empty problem {m}x{n}x{k}"
    for what, rows, cols in (("A", m, k), ("B", k, n), ("C", m, n)):
        if rows * cols > _INT32_MAX:
            return f"{what} has {rows * cols} elements: the kernels index with int32"
    if variant in _DESCRIPTOR_VARIANTS:
        elem = ELEMENT_BYTES[name]
        for what, (_, s0, s1) in (
            ("A", _canonical(m, k, _dense_strides(m, k, a_layout), "a")),
            ("B", _canonical(k, n, _dense_strides(k, n, b_layout), "b")),
        ):
            lead = max(s0, s1)
            if lead * elem % 16:
                return (
                    f"{what}'s leading dimension is {lead * elem} bytes; TMA descriptors "
                    f"({variant!r}) need a multiple of 16"
                )
    if variant == "ws":
        return _ws_layout_problem(
            name,
            _canonical(m, k, _dense_strides(m, k, a_layout), "a")[0],
            _canonical(k, n, _dense_strides(k, n, b_layout), "b")[0],
        )
    return None


def _ws_layout_problem(name: str, a_layout: str, b_layout: str) -> str | None:
    if name in ("float32", "float8_e4m3fn") and (a_layout, b_layout) != ("row", "col"):
        return (
            f"'ws' with {name} needs K-major operands (a row-major A and a column-major B): "
            f"Triton 3.6 fails to lower its warp-specialised wgmma from an MN-major tile"
        )
    return None


# --------------------------------------------------------------------------------------------
# Resource estimates
# --------------------------------------------------------------------------------------------


def _int_knob(config: Mapping[str, Any], key: str) -> int:
    value = config[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"config[{key!r}] must be an int, not {value!r}")
    return value


def flatten(config: Mapping[str, Any]) -> bool:
    """Whether the persistent tile loop is flattened into the K loop: ``config["FLATTEN"]``,
    else the variant's default (on for ``tma`` only)."""
    value = config.get("FLATTEN", _FLATTEN_DEFAULT.get(str(config.get("variant")), False))
    return bool(value)


def smem_bytes(config: Mapping[str, Any], dtype: Any) -> int:
    """Shared memory one program needs: the ring of ``num_stages`` A and B tiles, plus the
    tile the epilogue converts the accumulator through, plus mbarriers. An upper bound on
    what Triton 3.6 allocated for sm_90 in 88 of 89 measured configs (a small fp8 ``ws`` tile
    was 3 KiB over), exact for most unflattened ones.

    An unflattened loop (``tiled``, ``persistent``/``tma`` without FLATTEN) reuses the ring for
    the epilogue, a flattened one overlaps the next tile's loads with it and keeps both, and
    ``ws`` stages C beside the ring (BLOCK_M x BLOCK_N bytes, at least 16 KiB, for a 16-bit
    C; the whole tile for fp32).
    """
    name = dtype_name(dtype)
    elem = ELEMENT_BYTES[name]
    out_elem = ELEMENT_BYTES[OUT_DTYPE[name]]
    bm, bn, bk = (_int_knob(config, key) for key in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))
    stages = max(1, _int_knob(config, "num_stages"))
    ring = (bm * bk + bk * bn) * elem * stages
    variant = config.get("variant")
    barriers = 64 if variant == "tma" else 1024 if variant == "ws" else 0
    if variant == "ws":
        return ring + (bm * bn * 4 if out_elem == 4 else max(bm * bn, 16384)) + barriers
    if variant in _PERSISTENT_VARIANTS and flatten(config):
        return ring + bm * bn * out_elem + barriers
    return max(ring, bm * bn * out_elem) + barriers


def regs_per_thread(config: Mapping[str, Any], dtype: Any) -> int:
    """Estimated 32-bit registers per thread: the fp32 accumulator tile over the threads that
    hold it, the addresses of the pointer variants' vector loads, the operand fragments of a
    register-sourced MMA, and a fixed allowance for indices, loop state and the epilogue.

    Hopper's wgmma reads operands from shared memory (BLOCK_M >= 64); smaller tiles fall back
    to mma.sync, which holds both fragments in registers. ``ws`` keeps the accumulator in two
    consumer warpgroups (256 threads) whatever ``num_warps`` says.
    """
    name = dtype_name(dtype)
    elem = ELEMENT_BYTES[name]
    bm, bn, bk = (_int_knob(config, key) for key in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))
    threads = _int_knob(config, "num_warps") * 32
    variant = config.get("variant")
    if variant == "ws":
        return bm * bn // 256 + 40
    regs = bm * bn // threads + 40
    if variant not in _DESCRIPTOR_VARIANTS:
        # One 16-byte vector per 64-bit address, two registers each.
        regs += 2 * (bm * bk + bk * bn) * elem // 16 // threads
    if bm < 64:
        regs += (bm * bk + bk * bn) * elem // 4 // threads
    return regs


def workspace_bytes(m: int, n: int, config: Mapping[str, Any]) -> int:
    """Bytes of the fp32 split-K workspace ``gemm`` needs for an ``m`` x ``n`` C (0 without
    split-K): ``SPLIT_K`` partial C's for ``tiled``, ``SPLIT_K`` whole-tile slots per output
    tile for ``splitk``, one C for ``splitk_atomic`` (plus their int32 counter per tile, not
    counted here)."""
    if config.get("variant") in ONE_KERNEL_SPLIT_VARIANTS:
        return splitk_workspace_elems(m, n, config) * 4
    split_k = _int_knob(config, "SPLIT_K") if "SPLIT_K" in config else 1
    return 0 if split_k <= 1 else split_k * m * n * 4


def splitk_workspace_elems(m: int, n: int, config: Mapping[str, Any]) -> int:
    """float32 elements of a one-kernel split-K's buffer: ``splitk``'s partial slots,
    ``SPLIT_K`` whole tiles for each output tile (edge tiles padded, so its stores and loads
    need no masks); ``splitk_atomic``'s sum, one M x N C."""
    if config.get("variant") == "splitk_atomic":
        return m * n
    bm, bn = _int_knob(config, "BLOCK_M"), _int_knob(config, "BLOCK_N")
    tiles = -(-m // bm) * -(-n // bn)
    return tiles * _int_knob(config, "SPLIT_K") * bm * bn


def config_problem(
    config: Mapping[str, Any], dtype: Any, device_props: Mapping[str, Any]
) -> str | None:
    """Why ``config`` cannot run ``dtype`` operands on this device, or None.

    ``device_props``: ``smem_per_block_bytes`` (opt-in maximum, H100: 232448),
    ``regs_per_sm`` (65536), ``compute_capability`` (90), ``sm_count`` (132); missing keys
    skip their checks. Under the interpreter pass ``{"interpreter": True}`` (resource limits
    are then not checked).
    """
    try:
        name = dtype_name(dtype)
    except ValueError as exc:
        return str(exc)
    missing = [key for key in CONFIG_KEYS if key not in config]
    if missing:
        return f"config lacks {', '.join(missing)}"
    unknown = sorted(set(config) - set(CONFIG_KEYS) - set(OPTIONAL_CONFIG_KEYS))
    if unknown:
        return f"unknown config keys {', '.join(unknown)}"
    variant = config["variant"]
    if variant not in VARIANTS:
        return f"unknown variant {variant!r}: expected one of {', '.join(VARIANTS)}"
    try:
        knobs = {key: _int_knob(config, key) for key in CONFIG_KEYS if key != "variant"}
    except TypeError as exc:
        return str(exc)
    for key in ("BLOCK_M", "BLOCK_N", "BLOCK_K"):
        value = knobs[key]
        if key == "BLOCK_M" and value in COMPOSITE_BLOCK_MS:
            if variant not in _COMPOSITE_VARIANTS or knobs["SPLIT_K"] != 1:
                return (
                    f"BLOCK_M={value} (a {value - composite_rest(value)}- and a "
                    f"{composite_rest(value)}-row block) is for "
                    f"{' and '.join(map(repr, _COMPOSITE_VARIANTS))} without split-K only"
                )
            continue
        if key == "BLOCK_N" and value in COMPOSITE_BLOCK_NS:
            if variant != "tma" or knobs["BLOCK_M"] in COMPOSITE_BLOCK_MS:
                return (
                    f"BLOCK_N={value} (a {value - composite_rest(value)}- and a "
                    f"{composite_rest(value)}-column block) is for 'tma' with a power-of-two "
                    f"BLOCK_M only"
                )
            continue
        if value < 16 or value & (value - 1):
            return f"{key}={value}: tl.dot needs a power of two >= 16"
    if knobs["BLOCK_K"] < _MIN_BLOCK_K[name]:
        return f"BLOCK_K={knobs['BLOCK_K']} is below the {name} MMA's K of {_MIN_BLOCK_K[name]}"
    if knobs["num_warps"] not in (1, 2, 4, 8, 16):
        return f"num_warps={knobs['num_warps']}: Triton needs a power of two up to 16"
    if variant in _DESCRIPTOR_VARIANTS and knobs["num_warps"] not in (4, 8):
        return f"num_warps={knobs['num_warps']}: {variant!r} issues wgmma per warpgroup; use 4 or 8"
    if knobs["num_stages"] < 1:
        return f"num_stages={knobs['num_stages']} must be >= 1"
    if knobs["GROUP_M"] < 1:
        return f"GROUP_M={knobs['GROUP_M']} must be >= 1"
    if knobs["SPLIT_K"] < 1:
        return f"SPLIT_K={knobs['SPLIT_K']} must be >= 1"
    if knobs["SPLIT_K"] > 1 and variant not in SPLIT_K_VARIANTS:
        return f"SPLIT_K={knobs['SPLIT_K']}: only {', '.join(SPLIT_K_VARIANTS)} splits K"
    if variant in ONE_KERNEL_SPLIT_VARIANTS and knobs["SPLIT_K"] < 2:
        return f"{variant!r} needs SPLIT_K >= 2 (with 1 it is 'tiled' plus a counter)"
    for key in OPTIONAL_CONFIG_KEYS:  # each a bool
        if key in config and (not isinstance(config[key], bool | int) or config[key] not in (0, 1)):
            return f"{key}={config[key]!r} must be a bool"
    if "FLATTEN" in config and variant not in _PERSISTENT_VARIANTS:
        return f"FLATTEN applies to the persistent variants, not {variant!r}"
    if variant == "ws":
        # Each a case where Triton 3.6 on sm_90 drops warp specialisation without a word,
        # trips a compiler assertion (which can abort the build process) or computes NaN.
        if knobs["num_warps"] != 4:
            return "'ws' needs num_warps=4: with 8, Triton 3.6 silently skips warp specialisation"
        if flatten(config):
            return "'ws' needs FLATTEN off: Triton 3.6 does not warp-specialise a flattened loop"
        if knobs["BLOCK_M"] < 64:
            return f"'ws' needs BLOCK_M >= 64 (wgmma); BLOCK_M={knobs['BLOCK_M']} falls back"
        if knobs["BLOCK_M"] == 64 and knobs["BLOCK_N"] >= 256:
            return "'ws' with BLOCK_M=64, BLOCK_N>=256 trips a wgmma assertion in Triton 3.6"
        if knobs["BLOCK_M"] >= 128 and knobs["num_stages"] >= 5:
            return (
                "'ws' with BLOCK_M>=128 and num_stages>=5 leaves NaN in C on H100 "
                "(Triton 3.6; 64-row tiles and 'tma' are right at the same depth)"
            )
    interpreter = bool(device_props.get("interpreter", False))
    capability = device_props.get("compute_capability")
    problem = variant_problem(variant, capability, interpreter) or dtype_problem(
        name, capability, interpreter
    )
    if problem:
        return problem
    if interpreter:
        return None
    smem = smem_bytes(config, name)
    limit = device_props.get("smem_per_block_bytes")
    if limit is not None and smem > limit:
        return f"needs ~{smem} bytes of shared memory per block, over the device's {limit}"
    regs = regs_per_thread(config, name)
    cap = _MAX_REGS_WS if variant == "ws" else _MAX_REGS_PER_THREAD
    if knobs["BLOCK_M"] in COMPOSITE_BLOCK_MS and ELEMENT_BYTES[name] == 2:
        cap = _MAX_REGS_COMPOSITE_EST
    if regs > cap:
        return (
            f"~{regs} registers per thread (fp32 accumulator {knobs['BLOCK_M']}x"
            f"{knobs['BLOCK_N']} over {knobs['num_warps']} warps) exceeds {cap}: it would spill"
        )
    regs_per_sm = device_props.get("regs_per_sm")
    threads = knobs["num_warps"] * 32
    if regs_per_sm is not None and variant != "ws" and regs * threads > regs_per_sm:
        return f"~{regs} registers x {threads} threads exceeds {regs_per_sm} per SM"
    return None


def tolerance(dtype: Any, allow_tf32: bool = False) -> float:
    """Largest ``relative_error`` a correct result of these operands shows."""
    name = dtype_name(dtype)
    return TOLERANCE["tf32"] if name == "float32" and allow_tf32 else TOLERANCE[name]


def _dense_strides(rows: int, cols: int, layout: str) -> tuple[int, int]:
    if layout == "row":
        return (cols, 1)
    if layout == "col":
        return (1, rows)
    raise ValueError(f"unknown layout {layout!r}: expected 'row' or 'col'")


def _canonical(rows: int, cols: int, strides: tuple[int, int], what: str) -> tuple[str, int, int]:
    """(layout, stride0, stride1) of a 2-D operand, with the stride of a size-1 dimension
    replaced by its dense value: such a stride is never used, and leaving it as torch made it
    would make the same problem specialise (and compile) differently."""
    s0, s1 = strides
    if cols == 1 or s1 == 1:
        lead = cols if rows == 1 else s0
        if lead < cols:
            raise ValueError(f"{what} row stride {s0} < {cols} columns: overlapping rows")
        return "row", lead, 1
    if rows == 1 or s0 == 1:
        lead = rows if cols == 1 else s1
        if lead < rows:
            raise ValueError(f"{what} column stride {s1} < {rows} rows: overlapping columns")
        return "col", 1, lead
    raise ValueError(f"{what} strides {strides} are neither row- nor column-major")
