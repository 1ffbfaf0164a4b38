"""Triton GEMM kernels of the ``triton.gemm`` template, with their launch, limits and precompile.

``C[m, n] = epilogue(A[m, k] @ B[k, n] + bias[n])``, accumulated in float32, for float16,
bfloat16, float32 (tf32 or exact ieee dot) and float8 e4m3 operands (C in float16), with A and
B row- or column-major and C row-major. Six variants:

- ``tiled``: one program per output tile in grouped (L2-friendly) order; ``SPLIT_K > 1`` splits
  K over programs that write fp32 partials to a workspace, and a second kernel sums them in a
  fixed order (deterministic) and applies the epilogue once. Without split-K it also takes a
  composite BLOCK_M of 192 (or 96): a 128- and a 64-row block sharing each B tile, for shapes
  whose power-of-two tiles leave SMs idle.
- ``splitk``: ``tiled``'s split of K (``SPLIT_K >= 2``) in one launch: the program that
  arrives last at a tile (an int32 counter per tile, reset by that program) sums the tile's
  fp32 partials in a fixed order, applies the epilogue once and stores C. Its workspace and
  counters are cached per device and stream, so a call allocates and clears nothing.
- ``splitk_atomic``: ``splitk`` whose partials meet by fp32 atomic adds into one M x N sum
  (in L2, over every program) instead of the last arrival reading SPLIT_K slots; the last
  arrival reads the sum once, zeroes it and stores C. Faster on long K (the H100: 1.04-1.47x
  ``splitk`` at the same tile), but the adds land in arrival order: not bit-reproducible.
- ``persistent``: ``min(#tiles, NUM_SMS)`` programs that loop over tiles.
- ``tma``: persistent, operands loaded through TMA tensor descriptors (Hopper+), built on the
  host and passed by value. It takes ``tiled``'s composite BLOCK_M (192 = 128 + 64 rows, two
  descriptors of A) too, and composite BLOCK_Ns (80 = 64 + 16, 144 = 128 + 16 and 192 = 128 +
  64 columns, two descriptors of B).
- ``ws``: ``tma`` (descriptors built in the kernel: host-side ones hung it) with
  ``tl.range(..., warp_specialize=True)`` on the tile loop, which Triton
  3.6 turns into a producer warpgroup and two wgmma consumer warpgroups on sm_90, but only
  for an unflattened loop, ``num_warps=4`` and BLOCK_M >= 64 (otherwise it silently compiles
  plain ``tma``), and it fails or computes NaN outside the limits ``config_problem`` and
  ``workload_problem`` spell out.

The optional knob ``FLATTEN`` (persistent variants) fuses the tile and K loops so the next
tile's loads overlap this tile's epilogue; defaults: on for ``tma``, off elsewhere. The
optional knob ``PAD_K`` (any variant) puts a launch before the GEMM's that copies A and B into
buffers whose K is padded to a 16-byte multiple (zeros past K), for problems whose rows along
K are not aligned (no TMA, no vectorised loads otherwise); where K is aligned it adds nothing.

Import this module only where torch and triton are installed (GPU processes, tests); set
``TRITON_INTERPRET=1`` before importing it to run the kernels on CPU tensors through Triton's
interpreter.

Precompilation (``precompile``) compiles exactly what a later ``gemm``/``bind`` launch of the
same problem will ask for into ``TRITON_CACHE_DIR``, in a process that needs no GPU; the launch
in another process that shares the cache then loads the binary instead of compiling. It relies
on the launch seeing the same specialisation, which ``bind`` guarantees for operands it accepts:
the problem's sizes and strides are compile-time constants (as Inductor bakes them into its
templates: the K loop's trip count, the wrap of partial tiles and the address arithmetic fold
away), strides are canonicalised (a size-1 dimension's stride is set to its dense value), and
pointers are assumed 16-byte aligned (true of fresh torch allocations; an offset view would
compile a second, correct binary at launch). So one binary serves one problem shape.
"""

# Triton kernels take no Python annotations (Triton reads them as its own type hints), so the
# @triton.jit functions below are untyped by necessity; everything else is checked strictly.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import functools
import math
import re
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from tunehub.kernels.triton_gemm_limits import (
    _DESCRIPTOR_VARIANTS,
    _INT32_MAX,
    _INTERPRETER_NUM_SMS,
    _PERSISTENT_VARIANTS,
    _REDUCE_BLOCK_M,
    _REDUCE_BLOCK_N,
    CONFIG_KEYS,
    DTYPES,
    ELEMENT_BYTES,
    EPILOGUES,
    LAYOUTS,
    ONE_KERNEL_SPLIT_VARIANTS,
    OPTIONAL_CONFIG_KEYS,
    OUT_DTYPE,
    TOLERANCE,
    VARIANTS,
    _canonical,
    _dense_strides,
    _ws_layout_problem,
    composite_rest,
    config_problem,
    dtype_name,
    dtype_problem,
    flatten,
    padded_k,
    regs_per_thread,
    smem_bytes,
    splitk_workspace_elems,
    tolerance,
    variant_problem,
    variants,
    workload_problem,
    workspace_bytes,
)

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
def _load_offsets(pid, SIZE: tl.constexpr, BLOCK: tl.constexpr):
    # Rows (or columns) of an operand tile. Past the edge they wrap round to valid ones, so
    # the loads need no M/N mask (the store drops them); where the tiles divide the size
    # nothing wraps and the hints tell the compiler the offsets are whole aligned runs.
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    if SIZE % BLOCK == 0:
        offs = tl.max_contiguous(tl.multiple_of(offs, BLOCK), BLOCK)
    else:
        offs = offs % SIZE
    return offs


@triton.jit
def _block_offsets(start, SIZE: tl.constexpr, TILE: tl.constexpr, BLOCK: tl.constexpr):
    # Rows of one block of a composite tile (``_load_offsets`` for a tile of two blocks): the
    # same wrap past the edge; where whole tiles divide the size, each block's rows are one
    # run whose start is a multiple of the smaller block (64 for 192 = 128 + 64).
    offs = start + tl.arange(0, BLOCK)
    if SIZE % TILE == 0:
        offs = tl.max_contiguous(tl.multiple_of(offs, TILE // 3), BLOCK)
    else:
        offs = offs % SIZE
    return offs


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
    M: tl.constexpr,
    N: tl.constexpr,
    K: tl.constexpr,
    stride_am: tl.constexpr,
    stride_ak: tl.constexpr,
    stride_bk: tl.constexpr,
    stride_bn: tl.constexpr,
    stride_cm: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    EPILOGUE: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    BM1: tl.constexpr,
):
    # BM1 > 0: a composite tile of BLOCK_M = BM0 + BM1 rows (192 = 128 + 64; no split-K),
    # held as two blocks that share each B tile, as Triton's blocks are powers of two.
    BM0: tl.constexpr = BLOCK_M - BM1
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = _tile_coords(pid, num_pid_m, num_pid_n, GROUP_M)
    if BM1 == 0:
        offs_am = _load_offsets(pid_m, M, BLOCK_M)
    else:
        offs_am = _block_offsets(pid_m * BLOCK_M, M, BLOCK_M, BM0)
        offs_am1 = _block_offsets(pid_m * BLOCK_M + BM0, M, BLOCK_M, BM1)
        a_rows1 = a_ptr + offs_am1[:, None] * stride_am
        acc1 = tl.zeros((BM1, BLOCK_N), dtype=tl.float32)
    offs_bn = _load_offsets(pid_n, N, BLOCK_N)
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
    # Addresses from the loop index rather than pointers stepped each iteration: with the
    # sizes constant, the compiler folds them (as in Inductor's template).
    a_rows = a_ptr + offs_am[:, None] * stride_am
    b_cols = b_ptr + offs_bn[None, :] * stride_bn
    acc = tl.zeros((BM0, BLOCK_N), dtype=tl.float32)
    for kt in range(kt_start, kt_end):
        offs_kk = kt * BLOCK_K + offs_k
        a_ptrs = a_rows + offs_kk[None, :] * stride_ak
        b_ptrs = b_cols + offs_kk[:, None] * stride_bk
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            a = tl.load(a_ptrs, mask=offs_kk[None, :] < K, other=0.0)
            b = tl.load(b_ptrs, mask=offs_kk[:, None] < K, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        if BM1 > 0:
            a1_ptrs = a_rows1 + offs_kk[None, :] * stride_ak
            if EVEN_K:
                a1 = tl.load(a1_ptrs)
            else:
                a1 = tl.load(a1_ptrs, mask=offs_kk[None, :] < K, other=0.0)
            acc1 = tl.dot(a1, b, acc1, input_precision=INPUT_PRECISION)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BM0)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if SPLIT_K == 1:
        acc = _epilogue(acc, bias_ptr, offs_n, N, EPILOGUE)
        _store_tile(c_ptr, acc, offs_m, offs_n, M, N, stride_cm)
        if BM1 > 0:
            acc1 = _epilogue(acc1, bias_ptr, offs_n, N, EPILOGUE)
            offs_m1 = pid_m * BLOCK_M + BM0 + tl.arange(0, BM1)
            _store_tile(c_ptr, acc1, offs_m1, offs_n, M, N, stride_cm)
    else:
        # The epilogue is not linear: it runs once, on the full sum, in the reduce kernel.
        part_ptr = ws_ptr + pid_k.to(tl.int64) * M * N
        _store_tile(part_ptr, acc, offs_m, offs_n, M, N, N)


@triton.jit
def _splitk_reduce_kernel(
    ws_ptr,
    c_ptr,
    bias_ptr,
    M: tl.constexpr,
    N: tl.constexpr,
    stride_cm: tl.constexpr,
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
def _pad_block(
    src,
    dst,
    pid,
    SRC_ROWS: tl.constexpr,
    SRC_COLS: tl.constexpr,
    SRC_LD: tl.constexpr,
    DST_ROWS: tl.constexpr,
    DST_COLS: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    # One BLOCK_R x BLOCK_C block of a padded operand: rows of SRC_COLS contiguous elements,
    # SRC_LD apart, into rows of DST_COLS (dense, 16-byte multiples), zeros where the source
    # has no element (columns past SRC_COLS, rows past SRC_ROWS). Whole padded rows are
    # written, so the stores vectorise and the buffer needs no clearing first; the loads of an
    # unaligned row are element-wide but coalesced.
    col_blocks: tl.constexpr = (DST_COLS + BLOCK_C - 1) // BLOCK_C
    rows = (pid // col_blocks) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = (pid % col_blocks) * BLOCK_C + tl.arange(0, BLOCK_C)
    values = tl.load(
        src + rows[:, None] * SRC_LD + cols[None, :],
        mask=(rows[:, None] < SRC_ROWS) & (cols[None, :] < SRC_COLS),
        other=0.0,
    )
    tl.store(
        dst + rows[:, None] * DST_COLS + cols[None, :],
        values,
        mask=(rows[:, None] < DST_ROWS) & (cols[None, :] < DST_COLS),
    )


@triton.jit
def _pad_k_kernel(
    a_ptr,
    a_pad_ptr,
    b_ptr,
    b_pad_ptr,
    A_ROWS: tl.constexpr,
    A_COLS: tl.constexpr,
    A_LD: tl.constexpr,
    A_DST_ROWS: tl.constexpr,
    A_DST_COLS: tl.constexpr,
    A_BLOCK_R: tl.constexpr,
    A_BLOCK_C: tl.constexpr,
    A_BLOCKS: tl.constexpr,
    B_ROWS: tl.constexpr,
    B_COLS: tl.constexpr,
    B_LD: tl.constexpr,
    B_DST_ROWS: tl.constexpr,
    B_DST_COLS: tl.constexpr,
    B_BLOCK_R: tl.constexpr,
    B_BLOCK_C: tl.constexpr,
):
    # ``PAD_K``: A and B into their K-padded buffers in one launch (the first A_BLOCKS
    # programs copy A, the rest B), so the GEMM after it reads 16-byte aligned rows.
    pid = tl.program_id(0)
    if pid < A_BLOCKS:
        _pad_block(a_ptr, a_pad_ptr, pid, A_ROWS, A_COLS, A_LD, A_DST_ROWS, A_DST_COLS,
                   A_BLOCK_R, A_BLOCK_C)  # fmt: skip
    else:
        _pad_block(b_ptr, b_pad_ptr, pid - A_BLOCKS, B_ROWS, B_COLS, B_LD, B_DST_ROWS,
                   B_DST_COLS, B_BLOCK_R, B_BLOCK_C)  # fmt: skip


@triton.jit
def _gemm_splitk_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    bias_ptr,
    ws_ptr,
    counts_ptr,
    M: tl.constexpr,
    N: tl.constexpr,
    K: tl.constexpr,
    stride_am: tl.constexpr,
    stride_ak: tl.constexpr,
    stride_bk: tl.constexpr,
    stride_bn: tl.constexpr,
    stride_cm: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    EPILOGUE: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    ATOMIC: tl.constexpr,
):
    # ATOMIC (``splitk_atomic``): see the branch at the end. Otherwise (``splitk``):
    # split-K in one launch: every program writes its K slice's fp32 partial tile to its own
    # workspace slot and counts itself in at the tile's counter; the program that arrives
    # last sums the tile's SPLIT_K slots in slot order (the same bits whichever program that
    # is), applies the epilogue once, casts and stores C, and sets the counter back to zero,
    # so the counters stay zeroed between launches and no call needs a memset.
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = _tile_coords(pid, num_pid_m, num_pid_n, GROUP_M)
    offs_am = _load_offsets(pid_m, M, BLOCK_M)
    offs_bn = _load_offsets(pid_n, N, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    k_tiles = tl.cdiv(K, BLOCK_K)
    # Whole BLOCK_K tiles per split (EVEN_K holds in every split alike); with an uneven
    # share the last splits get fewer tiles, or none, and count in with a zero partial.
    tiles_per_split = tl.cdiv(k_tiles, SPLIT_K)
    kt_start = pid_k * tiles_per_split
    kt_end = tl.minimum(kt_start + tiles_per_split, k_tiles)
    a_rows = a_ptr + offs_am[:, None] * stride_am
    b_cols = b_ptr + offs_bn[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(kt_start, kt_end):
        offs_kk = kt * BLOCK_K + offs_k
        a_ptrs = a_rows + offs_kk[None, :] * stride_ak
        b_ptrs = b_cols + offs_kk[:, None] * stride_bk
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            a = tl.load(a_ptrs, mask=offs_kk[None, :] < K, other=0.0)
            b = tl.load(b_ptrs, mask=offs_kk[:, None] < K, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
    if ATOMIC:
        # ws_ptr is an M x N fp32 sum, zero between launches. Every program adds its partial
        # into it (``red.add``: the sum happens in L2, spread over all programs, where the
        # slots leave one program to read SPLIT_K partials) and counts in; the last arrival
        # reads the sum once, leaves zeros and a zero counter for the next launch, applies the
        # epilogue and stores C. The order of the adds is the order of arrival, so the bits
        # may differ from call to call (within the dtype's tolerance like any order).
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        sum_ptrs = ws_ptr + offs_m[:, None] * N + offs_n[None, :]
        tl.atomic_add(sum_ptrs, acc, mask=mask, sem="relaxed")
        # Every thread's adds are issued before one thread counts the program in (acq_rel
        # at GPU scope, as below).
        tl.debug_barrier()
        arrived = tl.atomic_add(counts_ptr + pid, 1)
        if arrived == SPLIT_K - 1:
            tl.debug_barrier()
            acc = tl.load(sum_ptrs, mask=mask, other=0.0, cache_modifier=".cg")
            # Every thread has read before any writes zeros: the store may map threads to
            # elements differently from the load (without this barrier, 128-row tiles on an
            # H100 stored zeros into C).
            tl.debug_barrier()
            tl.store(sum_ptrs, tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), mask=mask)
            tl.atomic_xchg(counts_ptr + pid, 0)
            acc = _epilogue(acc, bias_ptr, offs_n, N, EPILOGUE)
            _store_tile(c_ptr, acc, offs_m, offs_n, M, N, stride_cm)
    else:
        # A tile's slots are adjacent (slot = tile * SPLIT_K + split) and whole tiles, so the
        # partial stores and the reducer's loads need no masks.
        slot_offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        tile_ws = ws_ptr + pid.to(tl.int64) * (SPLIT_K * BLOCK_M * BLOCK_N)
        tl.store(tile_ws + pid_k * (BLOCK_M * BLOCK_N) + slot_offs, acc)
        # Every thread's partial is written before one thread counts the program in (the atomic
        # is acq_rel at GPU scope, so the last arrival sees every earlier program's partial).
        tl.debug_barrier()
        arrived = tl.atomic_add(counts_ptr + pid, 1)
        if arrived == SPLIT_K - 1:
            tl.debug_barrier()
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for s in range(SPLIT_K):
                # .cg: read through L2, where the other SMs' partials are, not a stale L1.
                acc += tl.load(tile_ws + s * (BLOCK_M * BLOCK_N) + slot_offs, cache_modifier=".cg")
            tl.atomic_xchg(counts_ptr + pid, 0)
            offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            acc = _epilogue(acc, bias_ptr, offs_n, N, EPILOGUE)
            _store_tile(c_ptr, acc, offs_m, offs_n, M, N, stride_cm)


@triton.jit
def _gemm_persistent_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    bias_ptr,
    M: tl.constexpr,
    N: tl.constexpr,
    K: tl.constexpr,
    stride_am: tl.constexpr,
    stride_ak: tl.constexpr,
    stride_bk: tl.constexpr,
    stride_bn: tl.constexpr,
    stride_cm: tl.constexpr,
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
        offs_am = _load_offsets(pid_m, M, BLOCK_M)
        offs_bn = _load_offsets(pid_n, N, BLOCK_N)
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
    a_desc,
    a1_desc,
    b_desc,
    b1_desc,
    c_ptr,
    bias_ptr,
    M: tl.constexpr,
    N: tl.constexpr,
    K: tl.constexpr,
    stride_cm: tl.constexpr,
    LDA: tl.constexpr,
    LDB: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    DEVICE_DESC: tl.constexpr,
    A_COL: tl.constexpr,
    B_COL: tl.constexpr,
    NUM_SMS: tl.constexpr,
    EPILOGUE: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
    FLATTEN: tl.constexpr,
    BM1: tl.constexpr,
    BN1: tl.constexpr,
):
    # BM1 > 0: a composite tile of BLOCK_M = BM0 + BM1 rows (192 = 128 + 64), as in ``tiled``:
    # ``a_desc`` loads the first BM0 rows and ``a1_desc`` (the same tensor, a BM1-row box) the
    # next BM1, and both blocks share each B tile. BN1 > 0: the same along N (80 = 64 + 16,
    # ``b1_desc`` the second box), both blocks sharing each A tile. At most one is non-zero.
    BM0: tl.constexpr = BLOCK_M - BM1
    BN0: tl.constexpr = BLOCK_N - BN1
    # The descriptors are built on the host (``_descriptor``) and passed by value: building
    # them in the kernel cost every program a global write and a proxy fence before its first
    # load, about a microsecond a call (benchmarks/notes/gpu_kernels_v2.md). TMA needs the
    # innermost dimension contiguous: a column-major operand is described as its row-major
    # transpose and each loaded tile is transposed back (a view, not a copy). Out-of-bounds
    # boxes are zero-filled, so no masks are needed on the loads.
    if DEVICE_DESC:
        # `ws` gets the operands' pointers and builds the descriptors here, as before: with
        # host-side descriptors Triton 3.6's Hopper warp-specialised loop never finished (the
        # first ws case of the H100 check matrix hung in synchronize, 2026-11-24).
        if A_COL:
            a_desc = tl.make_tensor_descriptor(
                a_desc, shape=[K, M], strides=[LDA, 1], block_shape=[BLOCK_K, BLOCK_M]
            )
        else:
            a_desc = tl.make_tensor_descriptor(
                a_desc, shape=[M, K], strides=[LDA, 1], block_shape=[BLOCK_M, BLOCK_K]
            )
        if B_COL:
            b_desc = tl.make_tensor_descriptor(
                b_desc, shape=[N, K], strides=[LDB, 1], block_shape=[BLOCK_N, BLOCK_K]
            )
        else:
            b_desc = tl.make_tensor_descriptor(
                b_desc, shape=[K, N], strides=[LDB, 1], block_shape=[BLOCK_K, BLOCK_N]
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
        acc = tl.zeros((BM0, BN0), dtype=tl.float32)
        if BM1 > 0:
            acc1 = tl.zeros((BM1, BN0), dtype=tl.float32)
        if BN1 > 0:
            acc2 = tl.zeros((BM0, BN1), dtype=tl.float32)
        for kt in range(k_tiles):
            off_k = kt * BLOCK_K
            a = a_desc.load([off_k, off_m]).T if A_COL else a_desc.load([off_m, off_k])
            b = b_desc.load([off_n, off_k]).T if B_COL else b_desc.load([off_k, off_n])
            acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
            if BM1 > 0:
                off_m1 = off_m + BM0
                a1 = a1_desc.load([off_k, off_m1]).T if A_COL else a1_desc.load([off_m1, off_k])
                acc1 = tl.dot(a1, b, acc1, input_precision=INPUT_PRECISION)
            if BN1 > 0:
                off_n1 = off_n + BN0
                b1 = b1_desc.load([off_n1, off_k]).T if B_COL else b1_desc.load([off_k, off_n1])
                acc2 = tl.dot(a, b1, acc2, input_precision=INPUT_PRECISION)
        tile_id_c += NUM_SMS
        pid_m, pid_n = _tile_coords(tile_id_c, num_pid_m, num_pid_n, GROUP_M)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BM0)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BN0)
        acc = _epilogue(acc, bias_ptr, offs_n, N, EPILOGUE)
        _store_tile(c_ptr, acc, offs_m, offs_n, M, N, stride_cm)
        if BM1 > 0:
            offs_m1 = pid_m * BLOCK_M + BM0 + tl.arange(0, BM1)
            acc1 = _epilogue(acc1, bias_ptr, offs_n, N, EPILOGUE)
            _store_tile(c_ptr, acc1, offs_m1, offs_n, M, N, stride_cm)
        if BN1 > 0:
            offs_n2 = pid_n * BLOCK_N + BN0 + tl.arange(0, BN1)
            acc2 = _epilogue(acc2, bias_ptr, offs_n2, N, EPILOGUE)
            _store_tile(c_ptr, acc2, offs_m, offs_n2, M, N, stride_cm)


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


@dataclass(frozen=True)
class Launch:
    """One kernel launch: ``kernel[grid](*args, **kwargs)``."""

    kernel: Any
    grid: tuple[int, ...]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    def bind(self) -> Callable[[], None]:
        """The launch as a call, its kernel indexed by the grid once (a timer's loop)."""
        kernel, args, kwargs = self.kernel[self.grid], self.args, self.kwargs

        def run() -> None:
            kernel(*args, **kwargs)

        return run


def sm_count(device: torch.device) -> int:
    """Programs a persistent kernel launches per wave: the GPU's SMs (read once per GPU), or
    under the interpreter (CPU tensors) a few, so a program loops over several tiles."""
    if device.type != "cuda":
        return _INTERPRETER_NUM_SMS
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _cuda_sm_count(index)


@functools.lru_cache(maxsize=16)
def _cuda_sm_count(index: int) -> int:
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


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
    ptrs: tuple[Any, Any, Any, Any, Any, Any],
    num_sms: int,
) -> list[Launch]:
    """The kernel launches of one GEMM: the one place both ``bind`` and ``precompile`` get
    their kernel arguments from, so the two specialise identically."""
    a, b, c, bias, ws, counts = ptrs
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
            Launch(
                _gemm_tiled_kernel,
                (tiles, split_k),
                (a, b, c, bias, ws, *scalars),
                {
                    **common,
                    "SPLIT_K": split_k,
                    "EVEN_K": even_k,
                    "BM1": composite_rest(bm),
                    **options,
                },
            )
        ]
        if split_k > 1:
            reduce_tiles = triton.cdiv(m, _REDUCE_BLOCK_M) * triton.cdiv(n, _REDUCE_BLOCK_N)
            launches.append(
                Launch(
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
    if variant in ONE_KERNEL_SPLIT_VARIANTS:
        return [
            Launch(
                _gemm_splitk_kernel,
                (tiles, split_k),
                (a, b, c, bias, ws, counts, *scalars),
                {
                    **common,
                    "SPLIT_K": split_k,
                    "EVEN_K": even_k,
                    "ATOMIC": variant == "splitk_atomic",
                    **options,
                },
            )
        ]
    grid = (min(tiles, num_sms),)
    if variant == "persistent":
        kwargs = {
            **common,
            "EVEN_K": even_k,
            "NUM_SMS": num_sms,
            "FLATTEN": flatten(config),
            **options,
        }
        return [Launch(_gemm_persistent_kernel, grid, (a, b, c, bias, *scalars), kwargs)]
    kwargs = {
        **common,
        "A_COL": problem.a_layout == "col",
        "B_COL": problem.b_layout == "col",
        "NUM_SMS": num_sms,
        "WARP_SPECIALIZE": variant == "ws",
        "DEVICE_DESC": variant == "ws",
        "FLATTEN": flatten(config),
        "BM1": composite_rest(bm),
        "BN1": composite_rest(bn),
        **options,
    }
    lda = sak if problem.a_layout == "col" else sam
    ldb = sbn if problem.b_layout == "col" else sbk
    a_desc, b_desc = a, b  # ws: the kernel builds its descriptors from the pointers
    a1_desc, b1_desc = a_desc, b_desc
    if variant == "tma":
        a_col, b_col = problem.a_layout == "col", problem.b_layout == "col"
        bm1 = composite_rest(bm)
        a_shape = [k, m] if a_col else [m, k]

        def a_box(rows: int) -> list[int]:
            return [bk, rows] if a_col else [rows, bk]

        a_desc = _descriptor(a, a_shape, [lda, 1], a_box(bm - bm1))
        a1_desc = _descriptor(a, a_shape, [lda, 1], a_box(bm1)) if bm1 else a_desc
        bn1 = composite_rest(bn)
        b_shape = [n, k] if b_col else [k, n]

        def b_box(cols: int) -> list[int]:
            return [cols, bk] if b_col else [bk, cols]

        b_desc = _descriptor(b, b_shape, [ldb, 1], b_box(bn - bn1))
        b1_desc = _descriptor(b, b_shape, [ldb, 1], b_box(bn1)) if bn1 else b_desc
    args = (a_desc, a1_desc, b_desc, b1_desc, c, bias, m, n, k, n, lda, ldb)
    return [Launch(_gemm_tma_kernel, grid, args, kwargs)]


def _descriptor(base: Any, shape: list[int], strides: list[int], block: list[int]) -> Any:
    """A host-side TMA descriptor of ``base`` (a tensor, or precompile's stand-in for one)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor(base, shape, strides, block)


# Elements one program of the padding copy moves.
_PAD_BLOCK_ELEMS = 4096


def _pad_operand(
    rows: int, cols: int, layout: str, ld: int, padded_rows: int, padded_cols: int
) -> dict[str, int]:
    """``_pad_block``'s constants for one operand of ``rows`` x ``cols`` in ``layout`` whose
    leading dimension is ``ld``, padded to ``padded_rows`` x ``padded_cols``: a row-major
    operand is copied row by row, a column-major one as its row-major transpose."""
    if layout == "col":
        rows, cols, padded_rows, padded_cols = cols, rows, padded_cols, padded_rows
    block_c = max(16, min(1024, triton.next_power_of_2(padded_cols)))
    block_r = max(2, min(_PAD_BLOCK_ELEMS // block_c, triton.next_power_of_2(padded_rows)))
    return {
        "ROWS": rows,
        "COLS": cols,
        "LD": ld,
        "DST_ROWS": padded_rows,
        "DST_COLS": padded_cols,
        "BLOCK_R": block_r,
        "BLOCK_C": block_c,
    }


def _pad_launch(
    m: int,
    n: int,
    k: int,
    kp: int,
    a_spec: tuple[str, int, int],
    b_spec: tuple[str, int, int],
    ptrs: tuple[Any, Any, Any, Any],
) -> Launch:
    """The ``PAD_K`` launch: A (M x K) and B (K x N), each ``(layout, stride0, stride1)``,
    into dense buffers of the same layouts with K padded to ``kp`` (``ptrs``: a, a_pad, b,
    b_pad). The one place ``bind`` and ``precompile`` get its arguments from."""
    a_layout, sam, sak = a_spec
    b_layout, sbk, sbn = b_spec
    a_ops = _pad_operand(m, k, a_layout, sak if a_layout == "col" else sam, m, kp)
    b_ops = _pad_operand(k, n, b_layout, sbn if b_layout == "col" else sbk, kp, n)
    blocks = {}
    for name, ops in (("A", a_ops), ("B", b_ops)):
        blocks[name] = triton.cdiv(ops["DST_ROWS"], ops["BLOCK_R"]) * triton.cdiv(
            ops["DST_COLS"], ops["BLOCK_C"]
        )
    kwargs: dict[str, Any] = {f"A_{key}": value for key, value in a_ops.items()}
    kwargs.update({f"B_{key}": value for key, value in b_ops.items()})
    kwargs.update(A_BLOCKS=blocks["A"], num_warps=4, num_stages=1)
    return Launch(_pad_k_kernel, (blocks["A"] + blocks["B"],), ptrs, kwargs)


def _padded_buffer(rows: int, cols: int, layout: str, like: torch.Tensor) -> torch.Tensor:
    """A dense ``rows`` x ``cols`` buffer of ``layout`` (column-major: a transposed row-major
    one), ``like``'s dtype and device, left unwritten: the padding launch writes all of it."""
    if layout == "col":
        return torch.empty((cols, rows), dtype=like.dtype, device=like.device).t()
    return torch.empty((rows, cols), dtype=like.dtype, device=like.device)


def _checked_config(config: Mapping[str, Any], dtype: str) -> dict[str, Any]:
    problem = config_problem(config, dtype, {"interpreter": True})
    if problem:
        raise ValueError(f"invalid config {dict(config)}: {problem}")
    return dict(config)


def _descriptor_scratch(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    # Device-side TMA descriptors (``ws``) are written to global scratch the launch asks for.
    del alignment, stream
    return torch.empty(size, dtype=torch.int8, device=torch.cuda.current_device())


@dataclass(frozen=True)
class GemmLaunch:
    """A validated GEMM, ready to launch again and again (``launch()``), as a timer wants:
    the checks and argument packing happen once, in ``bind``."""

    out: torch.Tensor
    launches: tuple[Launch, ...]
    workspace: torch.Tensor | None = None
    needs_allocator: bool = False
    counts: torch.Tensor | None = None
    # The a, b and bias given to ``bind`` (before any PAD_K copy): what ``launcher`` swaps.
    operands: tuple[torch.Tensor | None, ...] = ()
    # Bytes of the buffers made for this binding alone (PAD_K's copies, tiled split-K's
    # workspace): what keeping the binding keeps allocated.
    own_bytes: int = 0

    def __call__(self) -> torch.Tensor:
        if not _interpreting():
            if self.out.device.type != "cuda":
                raise ValueError(f"operands on {self.out.device}: compiled kernels need CUDA")
            if self.needs_allocator:
                triton.set_allocator(_descriptor_scratch)
        for launch in self.launches:
            launch.kernel[launch.grid](*launch.args, **launch.kwargs)
        return self.out

    def launcher(self) -> GemmLauncher:
        """These launches as a callable taking other operands (see ``GemmLauncher``)."""
        return GemmLauncher(self)


class GemmLauncher:
    """A bound GEMM's launches again, on other operands: ``launcher(a, b, bias, out, stream)``.

    For a caller that binds once per key and keys its memo on everything ``bind`` checked and
    Triton specialised on: every later call's a, b, bias and out must have the bound ones'
    shapes, strides, dtypes and device, each pointer the same 16-byte alignment (Triton
    compiled for it; TMA needs it), and run on the same device and stream (PAD_K's copies and
    split-K's workspace belong to the binding). Nothing of that is checked here, per call.

    The first call launches through Triton's JIT (``kernel[grid](...)``: binding,
    specialisation, cache lookup or compile) and keeps the compiled kernels it returns; later
    calls go straight to each compiled kernel's launcher with the operands swapped in, which
    is what ``JITFunction.run`` does after its cache lookup. Under the interpreter each call
    goes through ``kernel[grid]``. It holds none of the operands it was bound with, only the
    binding's own buffers.
    """

    def __init__(self, bound: GemmLaunch) -> None:
        if len(bound.operands) != 3:
            raise ValueError("a GemmLaunch made by bind (with its operands) is needed")
        # Which operand each argument was, by identity: 0 a, 1 b, 2 bias, 3 out.
        slots = {id(t): i for i, t in enumerate((*bound.operands, bound.out)) if t is not None}
        if len(slots) != sum(t is not None for t in (*bound.operands, bound.out)):
            raise ValueError("bind one tensor object per operand (a view of a repeated one)")
        self._steps = tuple(_Relaunch(launch, slots) for launch in bound.launches)
        self._needs_allocator = bound.needs_allocator
        self.own_bytes = bound.own_bytes

    def __call__(
        self,
        a: torch.Tensor,
        b: torch.Tensor,
        bias: torch.Tensor | None,
        out: torch.Tensor,
        stream: int | None,
    ) -> torch.Tensor:
        operands = (a, b, bias, out)
        if self._needs_allocator and not _interpreting():
            triton.set_allocator(_descriptor_scratch)
        for step in self._steps:
            step(operands, stream)
        return out


class _Relaunch:
    """One ``Launch`` with its operand arguments left open; see ``GemmLauncher``."""

    def __init__(self, launch: Launch, slots: Mapping[int, int]) -> None:
        from triton.tools.tensor_descriptor import TensorDescriptor

        self.kernel = launch.kernel
        self.grid = launch.grid
        self.kwargs = launch.kwargs
        self.args: list[Any] = list(launch.args)
        self.swaps: list[tuple[int, int]] = []
        # A host-side TMA descriptor of an operand: rebuilt on the new operand each call.
        self.descriptors: list[tuple[int, int, dict[str, Any]]] = []
        for i, arg in enumerate(launch.args):
            if id(arg) in slots:
                self.swaps.append((i, slots[id(arg)]))
                self.args[i] = None
            elif isinstance(arg, TensorDescriptor) and id(arg.base) in slots:
                fields = {k: v for k, v in vars(arg).items() if k != "base"}
                self.descriptors.append((i, slots[id(arg.base)], fields))
                self.args[i] = None
        self.descriptor_type = TensorDescriptor
        self.tail: list[Any] | None = None  # the keyword arguments in the kernel's order
        self.compiled: Any = None
        self.run: Any = None
        self.function: Any = None
        self.packed_metadata: Any = None
        grid = (*launch.grid, 1, 1)
        self.grid_xyz = (grid[0], grid[1], grid[2])

    def __call__(self, operands: tuple[Any, ...], stream: int | None) -> None:
        args = self.args.copy()
        for i, slot in self.swaps:
            args[i] = operands[slot]
        for i, slot, fields in self.descriptors:
            # Not TensorDescriptor(...): its checks (alignment, strides) passed at bind.
            descriptor = self.descriptor_type.__new__(self.descriptor_type)
            descriptor.__dict__.update(fields)
            descriptor.base = operands[slot]
            args[i] = descriptor
        if self.run is None:
            self._first(args)
            return
        values = args + self.tail  # type: ignore[operator]
        enter = triton.knobs.runtime.launch_enter_hook
        leave = triton.knobs.runtime.launch_exit_hook
        metadata = None
        if _hooked(enter) or _hooked(leave):
            metadata = self.compiled.launch_metadata(self.grid, stream, *values)
        else:
            enter = leave = None
        x, y, z = self.grid_xyz
        self.run(x, y, z, stream, self.function, self.packed_metadata, metadata, enter, leave,
                 *values)  # fmt: skip

    def _first(self, args: list[Any]) -> None:
        compiled = self.kernel[self.grid](*args, **self.kwargs)
        if compiled is None or _interpreting():
            return  # the interpreter: every call goes through kernel[grid]
        if hasattr(compiled, "result"):  # an asynchronous compile's future
            compiled = compiled.result()
        names = list(self.kernel.arg_names)[len(args) :]
        if any(name not in self.kwargs for name in names):
            return  # a parameter left to its default: keep Triton's own binding
        self.tail = [self.kwargs[name] for name in names]
        self.compiled = compiled
        self.function = compiled.function
        self.packed_metadata = compiled.packed_metadata
        self.run = compiled.run


def _hooked(hook: Any) -> bool:
    # Triton 3.6's launch hooks are HookChains, empty unless a profiler added one.
    return hook is not None and bool(getattr(hook, "calls", True))


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
    ``workspace_bytes`` (``tiled``) or to the buffer cached for this device and stream
    (``splitk`` and ``splitk_atomic``, whose tile counters always come from that cache; a
    ``splitk_atomic`` workspace given here must hold zeros, and each launch leaves it so).
    With ``config["PAD_K"]`` (and K unaligned) the padded copies of A and B are allocated here
    and filled by the first launch of every call. Raises ValueError on anything the kernels
    cannot take.
    """
    name = dtype_name(a.dtype)
    operands = (a, b, bias)
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
    pad: list[Launch] = []
    own_bytes = 0
    kp = padded_k(k, name)
    if cfg.get("PAD_K") and kp != k:
        # The GEMM runs on K-padded copies (zeros past K) that one launch fills each call.
        if max(m, n) * kp > _INT32_MAX:
            raise ValueError(f"K padded to {kp}: over {_INT32_MAX} elements, past int32")
        a_pad = _padded_buffer(m, kp, a_layout, a)
        b_pad = _padded_buffer(kp, n, b_layout, b)
        own_bytes += (a_pad.numel() + b_pad.numel()) * a.element_size()
        specs = ((a_layout, sam, sak), (b_layout, sbk, sbn))
        pad.append(_pad_launch(m, n, k, kp, *specs, (a, a_pad, b, b_pad)))
        a, b, k = a_pad, b_pad, kp
        a_layout, sam, sak = _canonical(m, k, (a.stride(0), a.stride(1)), "a")
        b_layout, sbk, sbn = _canonical(k, n, (b.stride(0), b.stride(1)), "b")
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
        num_sms = sm_count(device)
    split_k = cfg["SPLIT_K"]
    counts = None
    if cfg["variant"] in ONE_KERNEL_SPLIT_VARIANTS:
        workspace, counts = _splitk_buffers(device, m, n, cfg, workspace)
    elif split_k > 1:
        need = (split_k, m, n)
        if workspace is None:
            workspace = torch.empty(need, dtype=torch.float32, device=device)
            own_bytes += workspace.numel() * 4
        elif workspace.dtype != torch.float32 or workspace.numel() < math.prod(need):
            raise ValueError(f"workspace must hold {math.prod(need)} float32, got {workspace}")
        elif not workspace.is_contiguous() or workspace.device != device:
            raise ValueError("workspace must be contiguous and on the operands' device")
    else:
        workspace = None
    problem = _Problem(
        m, n, k, name, epilogue, allow_tf32, (sam, sak), (sbk, sbn), a_layout, b_layout
    )
    launches = pad + _launches(problem, cfg, (a, b, out, bias, workspace, counts), num_sms)
    return GemmLaunch(
        out,
        tuple(launches),
        workspace,
        needs_allocator=cfg["variant"] == "ws",
        counts=counts,
        operands=operands,
        own_bytes=own_bytes,
    )


# The one-kernel split-Ks' fp32 buffers (``splitk``'s partial slots, ``splitk_atomic``'s sum,
# which must be zero) and int32 tile counters, per (device, stream, variant) of the binding:
# every launch leaves the counters (and the sum) at zero, so launches one after another on a
# stream share them (a memset only when a buffer is first made or grows); launches on
# different streams get their own, as they may run at once. A buffer outgrown is kept, not
# freed: a CUDA graph captured earlier may still launch on it. Sizes grow by powers of two, so
# what is kept stays under twice the largest.
_SPLITK_BUFFERS: dict[tuple[str, int, str], tuple[torch.Tensor, torch.Tensor]] = {}
_SPLITK_OUTGROWN: list[tuple[torch.Tensor, torch.Tensor]] = []


def _splitk_buffers(
    device: torch.device,
    m: int,
    n: int,
    config: Mapping[str, Any],
    workspace: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    need = splitk_workspace_elems(m, n, config)
    tiles = triton.cdiv(m, config["BLOCK_M"]) * triton.cdiv(n, config["BLOCK_N"])
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (str(device), int(stream), config["variant"])
    cached = _SPLITK_BUFFERS.get(key)
    if cached is None or cached[0].numel() < need or cached[1].numel() < tiles:
        if cached is not None:
            _SPLITK_OUTGROWN.append(cached)
        size = max(triton.next_power_of_2(need), cached[0].numel() if cached else 0)
        slots = max(triton.next_power_of_2(tiles), cached[1].numel() if cached else 0)
        make = torch.zeros if config["variant"] == "splitk_atomic" else torch.empty
        cached = (
            make(size, dtype=torch.float32, device=device),
            torch.zeros(slots, dtype=torch.int32, device=device),
        )
        _SPLITK_BUFFERS[key] = cached
    if workspace is None:
        return cached
    if workspace.dtype != torch.float32 or workspace.numel() < need:
        raise ValueError(f"workspace must hold {need} float32, got {workspace}")
    if not workspace.is_contiguous() or workspace.device != device:
        raise ValueError("workspace must be contiguous and on the operands' device")
    return workspace, cached[1]


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
    if kernel.is_gluon():  # Gluon's source sets the module's warp count
        from triton.experimental.gluon._runtime import GluonASTSource

        return GluonASTSource(kernel, signature, constexprs, attrs), options
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
    by default). Dense, 16-byte aligned operands of the given layouts are assumed; ``k`` is
    the problem's (with ``PAD_K``, the padding launch and the GEMM at the padded K are built).
    Raises ValueError for a config or problem the kernels cannot take, and Triton's
    CompilationError (or another exception) when the compiler fails.
    """
    if _interpreting():
        raise RuntimeError("precompile needs Triton's compiler; TRITON_INTERPRET=1 is set")
    from triton.backends.compiler import GPUTarget

    name = dtype_name(dtype)
    cfg = _checked_config(config, name)
    kp = padded_k(k, name)
    pad = bool(cfg.get("PAD_K")) and kp != k
    problem_text = variant_problem(cfg["variant"], capability) or dtype_problem(name, capability)
    problem_text = problem_text or workload_problem(
        cfg["variant"], m, n, kp if pad else k, name, a_layout, b_layout
    )
    if problem_text:
        raise ValueError(problem_text)
    if epilogue not in EPILOGUES:
        raise ValueError(f"unknown epilogue {epilogue!r}")
    if cfg["variant"] in _PERSISTENT_VARIANTS and num_sms is None:
        raise ValueError(f"variant {cfg['variant']!r} needs num_sms (the device's SM count)")
    torch_dtype = _TORCH_DTYPES[name]
    out_dtype = _TORCH_DTYPES[OUT_DTYPE[name]]
    launches: list[Launch] = []
    if pad:
        # What ``bind`` launches first: the copy into K-padded buffers of the same layouts.
        launches.append(
            _pad_launch(
                m, n, k, kp,
                _canonical(m, k, _dense_strides(m, k, a_layout), "a"),
                _canonical(k, n, _dense_strides(k, n, b_layout), "b"),
                tuple(_FakeTensor(torch_dtype) for _ in range(4)),  # type: ignore[arg-type]
            )
        )  # fmt: skip
        k = kp
    a_lay, sam, sak = _canonical(m, k, _dense_strides(m, k, a_layout), "a")
    b_lay, sbk, sbn = _canonical(k, n, _dense_strides(k, n, b_layout), "b")
    problem = _Problem(m, n, k, name, epilogue, allow_tf32, (sam, sak), (sbk, sbn), a_lay, b_lay)
    ptrs = (
        _FakeTensor(torch_dtype),
        _FakeTensor(torch_dtype),
        _FakeTensor(out_dtype),
        _FakeTensor(out_dtype) if epilogue != "none" else None,
        _FakeTensor(torch.float32) if cfg["SPLIT_K"] > 1 else None,
        _FakeTensor(torch.int32) if cfg["variant"] in ONE_KERNEL_SPLIT_VARIANTS else None,
    )
    target = GPUTarget("cuda", capability, 32)
    hits: list[bool] = []

    def record(*, cache_hit: bool, **_: Any) -> None:
        hits.append(cache_hit)

    results = []
    listener = triton.knobs.compilation.listener
    triton.knobs.compilation.listener = record
    try:
        for launch in launches + _launches(problem, cfg, ptrs, num_sms or 1):
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
    "GemmLauncher",
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
