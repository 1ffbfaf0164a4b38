"""Triton GEMM kernels of the ``triton.gemm`` template, with their launch, limits and precompile.

``C[m, n] = epilogue(A[m, k] @ B[k, n] + bias[n])``, accumulated in float32, for float16,
bfloat16, float32 (tf32 or exact ieee dot) and float8 e4m3 operands (C in float16), with A and
B row- or column-major and C row-major. Four variants:

- ``tiled``: one program per output tile in grouped (L2-friendly) order; ``SPLIT_K > 1`` splits
  K over programs that write fp32 partials to a workspace, and a second kernel sums them in a
  fixed order (deterministic) and applies the epilogue once.
- ``persistent``: ``min(#tiles, NUM_SMS)`` programs that loop over tiles.
- ``tma``: persistent, operands loaded through device-side TMA tensor descriptors (Hopper+).
- ``ws``: ``tma`` with ``tl.range(..., warp_specialize=True)`` on the tile loop, which Triton
  3.6 turns into a producer warpgroup and two wgmma consumer warpgroups on sm_90, but only
  for an unflattened loop, ``num_warps=4`` and BLOCK_M >= 64 (otherwise it silently compiles
  plain ``tma``), and it fails or computes NaN outside the limits ``config_problem`` and
  ``workload_problem`` spell out.

The optional knob ``FLATTEN`` (persistent variants) fuses the tile and K loops so the next
tile's loads overlap this tile's epilogue; defaults: on for ``tma``, off elsewhere.

Import this module only where torch and triton are installed (GPU processes, tests); set
``TRITON_INTERPRET=1`` before importing it to run the kernels on CPU tensors through Triton's
interpreter.

Precompilation (``precompile``) compiles exactly what a later ``gemm``/``bind`` launch of the
same problem will ask for into ``TRITON_CACHE_DIR``, in a process that needs no GPU; the launch
in another process that shares the cache then loads the binary instead of compiling. It relies
on the launch seeing the same specialisation, which ``bind`` guarantees for operands it accepts:
strides are canonicalised (a size-1 dimension's stride is set to its dense value), integer
arguments specialise on ``== 1`` and ``% 16`` from the shape alone, and pointers are assumed
16-byte aligned (true of fresh torch allocations; an offset view would compile a second,
correct binary at launch).
"""

# Triton kernels take no Python annotations (Triton reads them as its own type hints), so the
# @triton.jit functions below are untyped by necessity; everything else is checked strictly.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import math
import re
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

VARIANTS: tuple[str, ...] = ("tiled", "persistent", "tma", "ws")
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

# Optional knobs and their defaults per variant; a space may leave them out.
OPTIONAL_CONFIG_KEYS: tuple[str, ...] = ("FLATTEN",)
_FLATTEN_DEFAULT = {"persistent": False, "tma": True, "ws": False}

_SPLIT_K_VARIANTS = ("tiled",)
_PERSISTENT_VARIANTS = ("persistent", "tma", "ws")
_DESCRIPTOR_VARIANTS = ("tma", "ws")
# Smallest K step of the tensor-core MMA per operand width (Hopper wgmma k: 8 tf32, 16 f16/bf16,
# 32 fp8); tl.dot needs at least 16 in every dimension on any GPU.
_MIN_BLOCK_K = {"float16": 16, "bfloat16": 16, "float32": 16, "float8_e4m3fn": 32}
_MAX_REGS_PER_THREAD = 255
# What setmaxnreg gives ws's consumer warpgroups (12 warps share the 64K register file).
_MAX_REGS_WS = 232
_INT32_MAX = 2**31 - 1
# Tile of the split-K reduce kernel: 4096 fp32 per program keeps it memory bound.
_REDUCE_BLOCK_M = 32
_REDUCE_BLOCK_N = 128
# Programs per "SM" when the interpreter runs persistent kernels on CPU tensors: small and odd,
# so a program loops over several tiles.
_INTERPRETER_NUM_SMS = 3

_TORCH_DTYPES: dict[str, torch.dtype] = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float8_e4m3fn": torch.float8_e4m3fn,
}


def _interpreting() -> bool:
    return bool(triton.knobs.runtime.interpret)


# --------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------


@triton.jit
def _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    # GROUP_M row-tiles are walked column by column, so programs running together share the
    # same few A row panels and B column panels in L2.
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = tile_id // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (tile_id % num_pid_in_group) % group_size_m
    pid_n = (tile_id % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def _epilogue(acc, bias_ptr, offs_n, N, EPILOGUE: tl.constexpr):
    if EPILOGUE != "none":
        bias = tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0)
        acc = acc + bias.to(tl.float32)[None, :]
        if EPILOGUE == "bias_relu":
            acc = tl.maximum(acc, 0.0)
        elif EPILOGUE == "bias_gelu":
            acc = 0.5 * acc * (1.0 + tl.math.erf(acc * 0.7071067811865476))
    return acc


@triton.jit
def _store_tile(c_ptr, acc, offs_m, offs_n, M, N, stride_cm):
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :]
    tl.store(ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gemm_tiled_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    bias_ptr,
    ws_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    EPILOGUE: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = _tile_coords(pid, num_pid_m, num_pid_n, GROUP_M)
    # Rows and columns past the edge wrap round to valid ones, so the loads need no M/N mask
    # (the store drops them); `% M` keeps the contiguity Triton derives when M % 16 == 0.
    offs_am = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_bn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    k_tiles = tl.cdiv(K, BLOCK_K)
    if SPLIT_K == 1:
        kt_start = 0
        kt_end = k_tiles
    else:
        # Whole BLOCK_K tiles per split, so EVEN_K holds in every split alike.
        tiles_per_split = tl.cdiv(k_tiles, SPLIT_K)
        kt_start = pid_k * tiles_per_split
        kt_end = tl.minimum(kt_start + tiles_per_split, k_tiles)
    offs_kk = kt_start * BLOCK_K + offs_k
    a_ptrs = a_ptr + offs_am[:, None] * stride_am + offs_kk[None, :] * stride_ak
    b_ptrs = b_ptr + offs_kk[:, None] * stride_bk + offs_bn[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(kt_start, kt_end):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_left = K - kt * BLOCK_K
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if SPLIT_K == 1:
        acc = _epilogue(acc, bias_ptr, offs_n, N, EPILOGUE)
        _store_tile(c_ptr, acc, offs_m, offs_n, M, N, stride_cm)
    else:
        # The epilogue is not linear: it runs once, on the full sum, in the reduce kernel.
        part_ptr = ws_ptr + pid_k.to(tl.int64) * M * N
        _store_tile(part_ptr, acc, offs_m, offs_n, M, N, N)


@triton.jit
def _splitk_reduce_kernel(
    ws_ptr,
    c_ptr,
    bias_ptr,
    M,
    N,
    stride_cm,
    SPLIT_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    EPILOGUE: tl.constexpr,
):
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    offs_m = (pid // num_pid_n) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = (pid % num_pid_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    ptrs = ws_ptr + offs_m[:, None] * N + offs_n[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # Fixed summation order: the same inputs give the same bits on every run. The pointer
    # steps by M * N, which fits int32 where SPLIT_K * M * N might not.
    for _ in range(SPLIT_K):
        acc += tl.load(ptrs, mask=mask, other=0.0)
        ptrs += M * N
    acc = _epilogue(acc, bias_ptr, offs_n, N, EPILOGUE)
    _store_tile(c_ptr, acc, offs_m, offs_n, M, N, stride_cm)


@triton.jit
def _gemm_persistent_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    bias_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
    NUM_SMS: tl.constexpr,
    EPILOGUE: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    FLATTEN: tl.constexpr,
):
    start_pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    num_tiles = num_pid_m * num_pid_n
    offs_k = tl.arange(0, BLOCK_K)
    # The epilogue recomputes its tile from its own counter, not from the loop variable: a
    # value shared by the prologue and the epilogue of a flattened loop breaks its pipelining.
    # Flattening (tile and K loops fused, so the next tile's loads overlap this epilogue)
    # also drops the cp.async pipeline for a column-major A with a row-major B in Triton 3.6.
    tile_id_c = start_pid - NUM_SMS
    for tile_id in tl.range(start_pid, num_tiles, NUM_SMS, flatten=FLATTEN):
        pid_m, pid_n = _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        offs_am = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
        offs_bn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kt in range(k_tiles):
            offs_kk = kt * BLOCK_K + offs_k
            a_ptrs = a_ptr + offs_am[:, None] * stride_am + offs_kk[None, :] * stride_ak
            b_ptrs = b_ptr + offs_kk[:, None] * stride_bk + offs_bn[None, :] * stride_bn
            if EVEN_K:
                a = tl.load(a_ptrs)
                b = tl.load(b_ptrs)
            else:
                a = tl.load(a_ptrs, mask=offs_kk[None, :] < K, other=0.0)
                b = tl.load(b_ptrs, mask=offs_kk[:, None] < K, other=0.0)
            acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        tile_id_c += NUM_SMS
        pid_m, pid_n = _tile_coords(tile_id_c, num_pid_m, num_pid_n, GROUP_M)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = _epilogue(acc, bias_ptr, offs_n, N, EPILOGUE)
        _store_tile(c_ptr, acc, offs_m, offs_n, M, N, stride_cm)


@triton.jit
def _gemm_tma_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    bias_ptr,
    M,
    N,
    K,
    lda,
    ldb,
    stride_cm,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    A_COL: tl.constexpr,
    B_COL: tl.constexpr,
    NUM_SMS: tl.constexpr,
    EPILOGUE: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
    FLATTEN: tl.constexpr,
):
    # TMA needs the innermost dimension contiguous: a column-major operand is described as
    # its row-major transpose and each loaded tile is transposed back (a view, not a copy).
    # Out-of-bounds boxes are zero-filled, so no masks are needed on the loads.
    if A_COL:
        a_desc = tl.make_tensor_descriptor(
            a_ptr, shape=[K, M], strides=[lda, 1], block_shape=[BLOCK_K, BLOCK_M]
        )
    else:
        a_desc = tl.make_tensor_descriptor(
            a_ptr, shape=[M, K], strides=[lda, 1], block_shape=[BLOCK_M, BLOCK_K]
        )
    if B_COL:
        b_desc = tl.make_tensor_descriptor(
            b_ptr, shape=[N, K], strides=[ldb, 1], block_shape=[BLOCK_N, BLOCK_K]
        )
    else:
        b_desc = tl.make_tensor_descriptor(
            b_ptr, shape=[K, N], strides=[ldb, 1], block_shape=[BLOCK_K, BLOCK_N]
        )
    start_pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    num_tiles = num_pid_m * num_pid_n
    tile_id_c = start_pid - NUM_SMS
    # Triton 3.6's Hopper warp specialisation (a TMA producer warpgroup, two wgmma consumer
    # warpgroups, setmaxnreg) applies only to an unflattened loop with num_warps=4; otherwise
    # it silently compiles the plain software-pipelined kernel.
    for tile_id in tl.range(
        start_pid, num_tiles, NUM_SMS, flatten=FLATTEN, warp_specialize=WARP_SPECIALIZE
    ):
        pid_m, pid_n = _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kt in range(k_tiles):
            off_k = kt * BLOCK_K
            a = a_desc.load([off_k, off_m]).T if A_COL else a_desc.load([off_m, off_k])
            b = b_desc.load([off_n, off_k]).T if B_COL else b_desc.load([off_k, off_n])
            acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        tile_id_c += NUM_SMS
        pid_m, pid_n = _tile_coords(tile_id_c, num_pid_m, num_pid_n, GROUP_M)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = _epilogue(acc, bias_ptr, offs_n, N, EPILOGUE)
        _store_tile(c_ptr, acc, offs_m, offs_n, M, N, stride_cm)


# --------------------------------------------------------------------------------------------
# What can run where
# --------------------------------------------------------------------------------------------


def variants() -> tuple[str, ...]:
    """The kernel variants, in the order a space lists them."""
    return VARIANTS


def dtype_name(dtype: str | torch.dtype) -> str:
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


def dtype_problem(
    dtype: str | torch.dtype, capability: int | None, interpreter: bool = False
) -> str | None:
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
    dtype: str | torch.dtype,
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


def smem_bytes(config: Mapping[str, Any], dtype: str | torch.dtype) -> int:
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


def regs_per_thread(config: Mapping[str, Any], dtype: str | torch.dtype) -> int:
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
    split-K)."""
    split_k = _int_knob(config, "SPLIT_K") if "SPLIT_K" in config else 1
    return 0 if split_k <= 1 else split_k * m * n * 4


def config_problem(
    config: Mapping[str, Any], dtype: str | torch.dtype, device_props: Mapping[str, Any]
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
    if knobs["SPLIT_K"] > 1 and variant not in _SPLIT_K_VARIANTS:
        return f"SPLIT_K={knobs['SPLIT_K']}: only {', '.join(_SPLIT_K_VARIANTS)} splits K"
    if "FLATTEN" in config:
        if not isinstance(config["FLATTEN"], bool | int) or config["FLATTEN"] not in (0, 1):
            return f"FLATTEN={config['FLATTEN']!r} must be a bool"
        if variant not in _PERSISTENT_VARIANTS:
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


def tolerance(dtype: str | torch.dtype, allow_tf32: bool = False) -> float:
    """Largest ``relative_error`` a correct result of these operands shows."""
    name = dtype_name(dtype)
    return TOLERANCE["tf32"] if name == "float32" and allow_tf32 else TOLERANCE[name]


# --------------------------------------------------------------------------------------------
# Reference and comparison
# --------------------------------------------------------------------------------------------


def reference(
    a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, epilogue: str
) -> torch.Tensor:
    """float64 ``epilogue(a @ b + bias)`` on the CPU, from the operands as stored."""
    out = a.detach().to("cpu", torch.float64) @ b.detach().to("cpu", torch.float64)
    if epilogue != "none":
        if bias is None:
            raise ValueError(f"epilogue {epilogue!r} needs a bias")
        out = out + bias.detach().to("cpu", torch.float64)[None, :]
    if epilogue == "bias_relu":
        out = torch.relu(out)
    elif epilogue == "bias_gelu":
        out = torch.nn.functional.gelu(out)
    elif epilogue not in ("none", "bias"):
        raise ValueError(f"unknown epilogue {epilogue!r}")
    return out


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``||out - ref|| / ||ref||`` in float64; ``inf`` when ``out`` holds a NaN or an infinity
    (an unwritten element of a NaN-poisoned output, say), so it never passes a tolerance."""
    got = out.detach().to("cpu", torch.float64)
    want = ref.detach().to("cpu", torch.float64)
    if got.shape != want.shape:
        raise ValueError(f"shape {tuple(got.shape)} != reference {tuple(want.shape)}")
    if not bool(torch.isfinite(got).all()):
        return math.inf
    scale = float(torch.linalg.vector_norm(want))
    diff = float(torch.linalg.vector_norm(got - want))
    return diff / scale if scale > 0 else diff


# --------------------------------------------------------------------------------------------
# Launch
# --------------------------------------------------------------------------------------------


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


@dataclass(frozen=True)
class _Launch:
    kernel: Any
    grid: tuple[int, ...]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class _Problem:
    m: int
    n: int
    k: int
    dtype: str
    epilogue: str
    allow_tf32: bool
    a_strides: tuple[int, int]
    b_strides: tuple[int, int]
    a_layout: str
    b_layout: str


def _launches(
    problem: _Problem,
    config: Mapping[str, Any],
    ptrs: tuple[Any, Any, Any, Any, Any],
    num_sms: int,
) -> list[_Launch]:
    """The kernel launches of one GEMM: the one place both ``bind`` and ``precompile`` get
    their kernel arguments from, so the two specialise identically."""
    a, b, c, bias, ws = ptrs
    m, n, k = problem.m, problem.n, problem.k
    variant = config["variant"]
    bm, bn, bk = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    split_k = config["SPLIT_K"]
    precision = "tf32" if problem.dtype != "float32" or problem.allow_tf32 else "ieee"
    options = {"num_warps": config["num_warps"], "num_stages": config["num_stages"]}
    common = {
        "BLOCK_M": bm,
        "BLOCK_N": bn,
        "BLOCK_K": bk,
        "GROUP_M": config["GROUP_M"],
        "EPILOGUE": problem.epilogue,
        "INPUT_PRECISION": precision,
    }
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    (sam, sak), (sbk, sbn) = problem.a_strides, problem.b_strides
    scalars = (m, n, k, sam, sak, sbk, sbn, n)
    even_k = k % bk == 0
    if variant == "tiled":
        launches = [
            _Launch(
                _gemm_tiled_kernel,
                (tiles, split_k),
                (a, b, c, bias, ws, *scalars),
                {**common, "SPLIT_K": split_k, "EVEN_K": even_k, **options},
            )
        ]
        if split_k > 1:
            reduce_tiles = triton.cdiv(m, _REDUCE_BLOCK_M) * triton.cdiv(n, _REDUCE_BLOCK_N)
            launches.append(
                _Launch(
                    _splitk_reduce_kernel,
                    (reduce_tiles,),
                    (ws, c, bias, m, n, n),
                    {
                        "SPLIT_K": split_k,
                        "BLOCK_M": _REDUCE_BLOCK_M,
                        "BLOCK_N": _REDUCE_BLOCK_N,
                        "EPILOGUE": problem.epilogue,
                        "num_warps": 4,
                        "num_stages": 1,
                    },
                )
            )
        return launches
    grid = (min(tiles, num_sms),)
    if variant == "persistent":
        kwargs = {
            **common,
            "EVEN_K": even_k,
            "NUM_SMS": num_sms,
            "FLATTEN": flatten(config),
            **options,
        }
        return [_Launch(_gemm_persistent_kernel, grid, (a, b, c, bias, *scalars), kwargs)]
    kwargs = {
        **common,
        "A_COL": problem.a_layout == "col",
        "B_COL": problem.b_layout == "col",
        "NUM_SMS": num_sms,
        "WARP_SPECIALIZE": variant == "ws",
        "FLATTEN": flatten(config),
        **options,
    }
    lda = sak if problem.a_layout == "col" else sam
    ldb = sbn if problem.b_layout == "col" else sbk
    return [_Launch(_gemm_tma_kernel, grid, (a, b, c, bias, m, n, k, lda, ldb, n), kwargs)]


def _checked_config(config: Mapping[str, Any], dtype: str) -> dict[str, Any]:
    problem = config_problem(config, dtype, {"interpreter": True})
    if problem:
        raise ValueError(f"invalid config {dict(config)}: {problem}")
    return dict(config)


def _descriptor_scratch(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    # Device-side TMA descriptors are written to global scratch the launch asks for.
    del alignment, stream
    return torch.empty(size, dtype=torch.int8, device=torch.cuda.current_device())


@dataclass(frozen=True)
class GemmLaunch:
    """A validated GEMM, ready to launch again and again (``launch()``), as a timer wants:
    the checks and argument packing happen once, in ``bind``."""

    out: torch.Tensor
    launches: tuple[_Launch, ...]
    workspace: torch.Tensor | None = None
    needs_allocator: bool = False

    def __call__(self) -> torch.Tensor:
        if not _interpreting():
            if self.out.device.type != "cuda":
                raise ValueError(f"operands on {self.out.device}: compiled kernels need CUDA")
            if self.needs_allocator:
                triton.set_allocator(_descriptor_scratch)
        for launch in self.launches:
            launch.kernel[launch.grid](*launch.args, **launch.kwargs)
        return self.out


def bind(
    a: torch.Tensor,
    b: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    *,
    epilogue: str = "none",
    allow_tf32: bool = False,
    config: Mapping[str, Any],
    num_sms: int | None = None,
    workspace: torch.Tensor | None = None,
) -> GemmLaunch:
    """Check operands and config and pack the launch of ``out = epilogue(a @ b + bias)``.

    ``a`` is M x K and ``b`` K x N, each row- or column-major (a column-major ``b`` is the
    transpose of a row-major N x K tensor, like an ``nn.Linear`` weight); ``out`` M x N
    row-major contiguous of ``OUT_DTYPE``; ``bias`` length N of ``out``'s dtype, given exactly
    when ``epilogue`` is not ``"none"``. ``num_sms`` (persistent variants) defaults to the
    device's SM count; ``workspace`` (split-K) to a fresh allocation of
    ``workspace_bytes``. Raises ValueError on anything the kernels cannot take.
    """
    name = dtype_name(a.dtype)
    if b.dtype != a.dtype:
        raise ValueError(f"a is {a.dtype} but b is {b.dtype}")
    if out.dtype != _TORCH_DTYPES[OUT_DTYPE[name]]:
        raise ValueError(f"out must be {OUT_DTYPE[name]} for {name} operands, not {out.dtype}")
    if a.dim() != 2 or b.dim() != 2 or out.dim() != 2:
        raise ValueError("a, b and out must be 2-D")
    m, k = a.shape
    k2, n = b.shape
    if k2 != k or tuple(out.shape) != (m, n):
        raise ValueError(
            f"shapes a {tuple(a.shape)} @ b {tuple(b.shape)} -> out {tuple(out.shape)}"
        )
    if not out.is_contiguous():
        raise ValueError("out must be row-major contiguous")
    devices = {t.device for t in (a, b, out)} | ({bias.device} if bias is not None else set())
    if len(devices) != 1:
        raise ValueError(f"operands on several devices: {sorted(map(str, devices))}")
    device = out.device
    if epilogue not in EPILOGUES:
        raise ValueError(f"unknown epilogue {epilogue!r}: expected one of {', '.join(EPILOGUES)}")
    if epilogue == "none":
        if bias is not None:
            raise ValueError("epilogue 'none' takes no bias")
    elif bias is None or tuple(bias.shape) != (n,) or bias.dtype != out.dtype:
        raise ValueError(
            f"epilogue {epilogue!r} needs a bias of shape ({n},) and dtype {out.dtype}"
        )
    elif bias.stride(0) != 1:
        raise ValueError("bias must be contiguous")
    cfg = _checked_config(config, name)
    a_layout, sam, sak = _canonical(m, k, (a.stride(0), a.stride(1)), "a")
    b_layout, sbk, sbn = _canonical(k, n, (b.stride(0), b.stride(1)), "b")
    for what, t in (("a", a), ("b", b), ("out", out)):
        if t.numel() > _INT32_MAX:
            raise ValueError(f"{what} has {t.numel()} elements: the kernels index with int32")
    if cfg["variant"] == "ws":
        layout_problem = _ws_layout_problem(name, a_layout, b_layout)
        if layout_problem:
            raise ValueError(layout_problem)
    if cfg["variant"] in _DESCRIPTOR_VARIANTS:
        elem = ELEMENT_BYTES[name]
        lead = {"a": max(sam, sak), "b": max(sbk, sbn)}
        for what, t in (("a", a), ("b", b)):
            if t.data_ptr() % 16 or lead[what] * elem % 16:
                raise ValueError(f"{what}: TMA needs a 16-byte aligned base and leading dimension")
    if num_sms is None:
        if device.type == "cuda":
            num_sms = torch.cuda.get_device_properties(device).multi_processor_count
        else:
            num_sms = _INTERPRETER_NUM_SMS
    split_k = cfg["SPLIT_K"]
    if split_k > 1:
        need = (split_k, m, n)
        if workspace is None:
            workspace = torch.empty(need, dtype=torch.float32, device=device)
        elif workspace.dtype != torch.float32 or workspace.numel() < math.prod(need):
            raise ValueError(f"workspace must hold {math.prod(need)} float32, got {workspace}")
        elif not workspace.is_contiguous() or workspace.device != device:
            raise ValueError("workspace must be contiguous and on the operands' device")
    else:
        workspace = None
    problem = _Problem(
        m, n, k, name, epilogue, allow_tf32, (sam, sak), (sbk, sbn), a_layout, b_layout
    )
    launches = _launches(problem, cfg, (a, b, out, bias, workspace), num_sms)
    return GemmLaunch(
        out, tuple(launches), workspace, needs_allocator=cfg["variant"] in _DESCRIPTOR_VARIANTS
    )


def gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    *,
    epilogue: str = "none",
    allow_tf32: bool = False,
    config: Mapping[str, Any],
    num_sms: int | None = None,
    workspace: torch.Tensor | None = None,
) -> torch.Tensor:
    """``out = epilogue(a @ b + bias)`` once; see ``bind`` for the arguments."""
    return bind(
        a,
        b,
        bias,
        out,
        epilogue=epilogue,
        allow_tf32=allow_tf32,
        config=config,
        num_sms=num_sms,
        workspace=workspace,
    )()


# --------------------------------------------------------------------------------------------
# Precompilation
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PrecompiledKernel:
    """One kernel ``precompile`` put in (or found in) Triton's cache."""

    name: str
    cache_key: str
    shared_bytes: int
    num_warps: int
    num_stages: int
    cache_hit: bool
    compile_secs: float
    launcher_cached: bool
    registers: int | None
    stack_bytes: int | None


class _FakeTensor:
    """Stands in for a tensor in the kernel binder: its dtype and a 16-byte aligned address
    are all the specialisation looks at (``triton.runtime.jit.MockTensor`` does the same)."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    @staticmethod
    def data_ptr() -> int:
        return 0


def _specialize(
    kernel: Any, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Any, Any]:
    # Mirrors JITFunction.run of Triton 3.6 (binder -> _pack_args -> ASTSource -> compile) with
    # an explicit target instead of the current device's, so the cache key is the one the
    # launch computes and no CUDA context is needed.
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    kwargs = dict(kwargs)
    kwargs["debug"] = kwargs.get("debug", kernel.debug) or triton.knobs.runtime.debug
    kwargs["instrumentation_mode"] = triton.knobs.compilation.instrumentation_mode
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound_args, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(
        backend, kwargs, bound_args, specialization, options
    )
    return ASTSource(kernel, signature, constexprs, attrs), options


def _compile_like_jit(
    kernel: Any, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Any, bool]:
    source, options = _specialize(kernel, target, args, kwargs)
    compiled = triton.compile(source, target=target, options=options.__dict__)
    return compiled, _build_launcher(source, compiled)


def _build_launcher(source: Any, compiled: Any) -> bool:
    # A kernel's first launch also builds a small C launcher for its signature (gcc, about a
    # second), cached in TRITON_CACHE_DIR under a hash of its source; building it here spares
    # the timing process that. It links libcuda, so a host without the driver cannot: then
    # the launch builds it, once per signature.
    try:
        from triton.backends.nvidia.driver import CudaLauncher

        CudaLauncher(source, compiled.metadata)
    except Exception:
        return False
    return True


def _resource_usage(cubin: bytes) -> tuple[int | None, int | None]:
    # ptxas's registers per thread and stack frame (where spills go), read back from the
    # cubin with the cuobjdump Triton ships, so a build learns of spills without a GPU.
    try:
        with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
            file.write(cubin)
            file.flush()
            text = subprocess.run(
                [triton.knobs.nvidia.cuobjdump.path, "--dump-resource-usage", file.name],
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            ).stdout
    except (OSError, subprocess.SubprocessError):
        return None, None
    registers = re.search(r"REG:(\d+)", text)
    stack = re.search(r"STACK:(\d+)", text)
    return (
        int(registers.group(1)) if registers else None,
        int(stack.group(1)) if stack else None,
    )


def precompile(
    *,
    config: Mapping[str, Any],
    dtype: str | torch.dtype,
    epilogue: str,
    allow_tf32: bool,
    m: int,
    n: int,
    k: int,
    a_layout: str = "row",
    b_layout: str = "row",
    capability: int,
    num_sms: int | None = None,
) -> list[PrecompiledKernel]:
    """Compile, without a GPU, every kernel ``gemm`` will launch for this problem on a GPU of
    compute ``capability`` (90 for H100), into ``TRITON_CACHE_DIR``.

    ``num_sms`` (persistent variants) must be what the launch will use (the device's SM count
    by default). Dense, 16-byte aligned operands of the given layouts are assumed. Raises
    ValueError for a config or problem the kernels cannot take, and Triton's CompilationError
    (or another exception) when the compiler fails.
    """
    if _interpreting():
        raise RuntimeError("precompile needs Triton's compiler; TRITON_INTERPRET=1 is set")
    from triton.backends.compiler import GPUTarget

    name = dtype_name(dtype)
    cfg = _checked_config(config, name)
    problem_text = variant_problem(cfg["variant"], capability) or dtype_problem(name, capability)
    problem_text = problem_text or workload_problem(
        cfg["variant"], m, n, k, name, a_layout, b_layout
    )
    if problem_text:
        raise ValueError(problem_text)
    if epilogue not in EPILOGUES:
        raise ValueError(f"unknown epilogue {epilogue!r}")
    if cfg["variant"] in _PERSISTENT_VARIANTS and num_sms is None:
        raise ValueError(f"variant {cfg['variant']!r} needs num_sms (the device's SM count)")
    a_lay, sam, sak = _canonical(m, k, _dense_strides(m, k, a_layout), "a")
    b_lay, sbk, sbn = _canonical(k, n, _dense_strides(k, n, b_layout), "b")
    problem = _Problem(m, n, k, name, epilogue, allow_tf32, (sam, sak), (sbk, sbn), a_lay, b_lay)
    torch_dtype = _TORCH_DTYPES[name]
    out_dtype = _TORCH_DTYPES[OUT_DTYPE[name]]
    ptrs = (
        _FakeTensor(torch_dtype),
        _FakeTensor(torch_dtype),
        _FakeTensor(out_dtype),
        _FakeTensor(out_dtype) if epilogue != "none" else None,
        _FakeTensor(torch.float32) if cfg["SPLIT_K"] > 1 else None,
    )
    target = GPUTarget("cuda", capability, 32)
    hits: list[bool] = []

    def record(*, cache_hit: bool, **_: Any) -> None:
        hits.append(cache_hit)

    results = []
    listener = triton.knobs.compilation.listener
    triton.knobs.compilation.listener = record
    try:
        for launch in _launches(problem, cfg, ptrs, num_sms or 1):
            hits.clear()
            start = time.perf_counter()
            compiled, launcher = _compile_like_jit(
                launch.kernel, target, launch.args, launch.kwargs
            )
            registers, stack = _resource_usage(compiled.asm["cubin"])
            results.append(
                PrecompiledKernel(
                    name=compiled.name,
                    cache_key=compiled.hash,
                    shared_bytes=int(compiled.metadata.shared),
                    num_warps=int(compiled.metadata.num_warps),
                    num_stages=int(compiled.metadata.num_stages),
                    cache_hit=bool(hits and hits[-1]),
                    compile_secs=time.perf_counter() - start,
                    launcher_cached=launcher,
                    registers=registers,
                    stack_bytes=stack,
                )
            )
    finally:
        triton.knobs.compilation.listener = listener
    return results


__all__ = [
    "CONFIG_KEYS",
    "DTYPES",
    "ELEMENT_BYTES",
    "EPILOGUES",
    "LAYOUTS",
    "OPTIONAL_CONFIG_KEYS",
    "OUT_DTYPE",
    "TOLERANCE",
    "VARIANTS",
    "GemmLaunch",
    "PrecompiledKernel",
    "bind",
    "config_problem",
    "dtype_name",
    "dtype_problem",
    "flatten",
    "gemm",
    "precompile",
    "reference",
    "regs_per_thread",
    "relative_error",
    "smem_bytes",
    "tolerance",
    "variant_problem",
    "variants",
    "workload_problem",
    "workspace_bytes",
]
