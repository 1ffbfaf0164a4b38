"""Triton kernels of ``triton.bmm`` and ``triton.grouped_mm`` (imports torch and Triton).

``bmm_kernel``: one program per (batch entry, output tile); the batch is in the grid, folded
with the tiles into its first axis (``BATCH_MAJOR``: every tile of entry 0 first, so an entry's
A stays in L2; else every entry of tile 0 first, so a broadcast B's tile does). B's batch
stride may be 0 (one B for every entry). Tiles within an entry are swizzled ``GROUP_M`` rows
of tiles at a time, as in Triton's matmul tutorial.

``bmm_tma_kernel`` (``TMA``, Hopper and newer): one program per SM looping over the same
(entry, tile) order, operands and C through TMA descriptors, the tile and K loops flattened
so a tile's store overlaps the next tile's loads.

``grouped_kernel``: the groups' tiles are one flat list, group by group (an empty group has
none), each group's in ``GROUP_M`` swizzled order. The group offsets stay on the device (a
mixture-of-experts layer's router writes them there): each program finds its tile's group by
a scan of the ``G + 1`` offsets, and the grid is an upper bound on the tiles (``cdiv(m,
BLOCK_M) + G`` rows of tiles), so launching needs no copy of the sizes to the host.
``PERSISTENT``: a grid of ``PROGRAMS`` programs looping over the list instead of one program
per tile.

Both accumulate in fp32 (``tl.dot``: TF32 only where the workload allows it) and write C in
the operands' dtype. ``compile_for`` compiles either for a GPU's compute capability without
one (the build sandbox), as ``triton_gemm_kernels.precompile`` does for ``triton.gemm``.
"""

# mypy: disable-error-code="untyped-decorator,no-untyped-def"
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import triton
import triton.language as tl

from tunehub.kernels.triton_gemm_kernels import (
    Launch,
    _compile_like_jit,
    _FakeTensor,
    _tile_coords,
    sm_count,
)


@triton.jit
def _tile(a_ptr, b_ptr, c_ptr, rows, N, K, sam, sak, sbk, sbn, scm, scn, pid_m, pid_n,
          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
          PRECISION: tl.constexpr):  # fmt: skip
    # One BLOCK_M x BLOCK_N tile of C[:rows, :N] = A[:rows, :K] @ B[:K, :N].
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rm[:, None].to(tl.int64) * sam + rk[None, :] * sak
    b_ptrs = b_ptr + rk[:, None].to(tl.int64) * sbk + rn[None, :] * sbn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kk in range(0, tl.cdiv(K, BLOCK_K)):
        left = K - kk * BLOCK_K
        a = tl.load(a_ptrs, mask=(rm[:, None] < rows) & (rk[None, :] < left), other=0.0)
        b = tl.load(b_ptrs, mask=(rk[:, None] < left) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptrs += BLOCK_K * sak
        b_ptrs += BLOCK_K * sbk
    c_ptrs = c_ptr + rm[:, None].to(tl.int64) * scm + rn[None, :] * scn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rm[:, None] < rows) & (rn[None, :] < N))


@triton.jit
def bmm_kernel(a_ptr, b_ptr, c_ptr, M, N, K, BATCH,
               sab, sam, sak, sbb, sbk, sbn, scb, scm, scn,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               GROUP_M: tl.constexpr, BATCH_MAJOR: tl.constexpr,
               PRECISION: tl.constexpr):  # fmt: skip
    pid = tl.program_id(0)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    if BATCH_MAJOR:
        entry = pid // (grid_m * grid_n)
        tile = pid % (grid_m * grid_n)
    else:
        entry = pid % BATCH
        tile = pid // BATCH
    pid_m, pid_n = _tile_coords(tile, grid_m, grid_n, GROUP_M)
    e = entry.to(tl.int64)
    _tile(a_ptr + e * sab, b_ptr + e * sbb, c_ptr + e * scb, M, N, K, sam, sak, sbk, sbn,
          scm, scn, pid_m, pid_n, BLOCK_M, BLOCK_N, BLOCK_K, PRECISION)  # fmt: skip


@triton.jit
def _entry_box(desc, entry, i0, j0, ROWS: tl.constexpr, COLS: tl.constexpr,
               SHARED: tl.constexpr):  # fmt: skip
    # The ROWS x COLS box at (i0, j0) of one entry's matrix as stored (row-major): a 3-D
    # descriptor's box of that entry, or a 2-D one's where every entry is the same matrix.
    return desc.load([i0, j0]) if SHARED else desc.load([entry, i0, j0]).reshape(ROWS, COLS)


@triton.jit
def bmm_tma_kernel(a_desc, b_desc, c_desc, M, N, K, BATCH,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   GROUP_M: tl.constexpr, BATCH_MAJOR: tl.constexpr, A_COL: tl.constexpr,
                   B_COL: tl.constexpr, A_SHARED: tl.constexpr, B_SHARED: tl.constexpr,
                   PRECISION: tl.constexpr):  # fmt: skip
    # Persistent: each program loops over (entry, tile) pairs, and the loop is flattened with
    # the K loop, so the next tile's TMA loads run while this tile's C goes out through a TMA
    # store (LLaMA's Q.K^T, whose output is 16-64x its inputs' bytes, is decided there). A, B
    # and C are 3-D descriptors whose boxes are one batch entry's (a shared A or B a 2-D one); a
    # column-major operand is described as its row-major transpose and each box transposed
    # back. TMA zero-fills boxes past the edges and clips the store: no masks.
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    per_entry = grid_m * grid_n
    for t in tl.range(tl.program_id(0), per_entry * BATCH, tl.num_programs(0), flatten=True):
        if BATCH_MAJOR:
            entry = t // per_entry
            tile = t % per_entry
        else:
            entry = t % BATCH
            tile = t // BATCH
        pid_m, pid_n = _tile_coords(tile, grid_m, grid_n, GROUP_M)
        m0 = pid_m * BLOCK_M
        n0 = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kk in range(0, tl.cdiv(K, BLOCK_K)):
            k0 = kk * BLOCK_K
            if A_COL:
                a = _entry_box(a_desc, entry, k0, m0, BLOCK_K, BLOCK_M, A_SHARED).T
            else:
                a = _entry_box(a_desc, entry, m0, k0, BLOCK_M, BLOCK_K, A_SHARED)
            if B_COL:
                b = _entry_box(b_desc, entry, n0, k0, BLOCK_N, BLOCK_K, B_SHARED).T
            else:
                b = _entry_box(b_desc, entry, k0, n0, BLOCK_K, BLOCK_N, B_SHARED)
            acc = tl.dot(a, b, acc, input_precision=PRECISION)
        c_desc.store([entry, m0, n0], acc.to(c_desc.dtype).reshape(1, BLOCK_M, BLOCK_N))


@triton.jit
def _group_of(tile, offs_ptr, G, grid_n, BLOCK_M: tl.constexpr):
    # The tile's group in the flat list: a scan of the G + 1 offsets (they stay in L1). Its
    # group, the group's first tile, first row and rows, and the tiles of all groups.
    group = tile * 0
    first = tile * 0
    row0 = tile * 0
    rows = tile * 0
    seen = tile * 0
    for g in range(0, G):
        lo = tl.load(offs_ptr + g)
        hi = tl.load(offs_ptr + g + 1)
        count = tl.cdiv(hi - lo, BLOCK_M) * grid_n
        inside = (tile >= seen) & (tile < seen + count)
        group = tl.where(inside, g, group)
        first = tl.where(inside, seen, first)
        row0 = tl.where(inside, lo, row0)
        rows = tl.where(inside, hi - lo, rows)
        seen += count
    return group, first, row0, rows, seen


@triton.jit
def grouped_kernel(a_ptr, b_ptr, c_ptr, offs_ptr, N, K, G, TILE_BOUND,
                   sam, sak, sbg, sbk, sbn, scm, scn,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   GROUP_M: tl.constexpr, PRECISION: tl.constexpr):  # fmt: skip
    grid_n = tl.cdiv(N, BLOCK_N)
    for tile in range(tl.program_id(0), TILE_BOUND, tl.num_programs(0)):
        group, first, row0, rows, seen = _group_of(tile, offs_ptr, G, grid_n, BLOCK_M)
        if tile < seen:
            pid_m, pid_n = _tile_coords(tile - first, tl.cdiv(rows, BLOCK_M), grid_n, GROUP_M)
            r0 = tl.cast(row0, tl.int64)
            _tile(a_ptr + r0 * sam, b_ptr + tl.cast(group, tl.int64) * sbg, c_ptr + r0 * scm, rows,
                  N, K, sam, sak, sbk, sbn, scm, scn, pid_m, pid_n, BLOCK_M, BLOCK_N, BLOCK_K,
                  PRECISION)  # fmt: skip


@triton.jit
def grouped_tma_kernel(a_desc, b_desc, c_ptr, offs_ptr, N, K, G, TILE_BOUND, scm, scn,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       GROUP_M: tl.constexpr, PRECISION: tl.constexpr):  # fmt: skip
    # ``grouped_kernel`` with A (M x K) and B (G x K x N) read through TMA descriptors: no
    # masks or address math in the K loop, and B's box of one group feeds the tensor cores
    # from shared memory. A tile's rows past its group are the next group's (or zeros past
    # A): multiplied, never stored.
    grid_n = tl.cdiv(N, BLOCK_N)
    for tile in range(tl.program_id(0), TILE_BOUND, tl.num_programs(0)):
        group, first, row0, rows, seen = _group_of(tile, offs_ptr, G, grid_n, BLOCK_M)
        if tile < seen:
            pid_m, pid_n = _tile_coords(tile - first, tl.cdiv(rows, BLOCK_M), grid_n, GROUP_M)
            m0 = row0 + pid_m * BLOCK_M
            n0 = pid_n * BLOCK_N
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for kk in range(0, tl.cdiv(K, BLOCK_K)):
                a = a_desc.load([m0, kk * BLOCK_K])
                b = b_desc.load([group, kk * BLOCK_K, n0]).reshape(BLOCK_K, BLOCK_N)
                acc = tl.dot(a, b, acc, input_precision=PRECISION)
            rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            rn = n0 + tl.arange(0, BLOCK_N)
            c = c_ptr + (row0 + rm)[:, None].to(tl.int64) * scm + rn[None, :] * scn
            ok = (rm[:, None] < rows) & (rn[None, :] < N)
            tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=ok)


def precision(dtype: torch.dtype, allow_tf32: bool) -> str:
    """``tl.dot``'s input precision: TF32 only for a float32 workload that allows it."""
    return "tf32" if dtype == torch.float32 and allow_tf32 else "ieee"


def _meta(config: dict[str, Any]) -> dict[str, Any]:
    return {
        "BLOCK_M": int(config["BLOCK_M"]),
        "BLOCK_N": int(config["BLOCK_N"]),
        "BLOCK_K": int(config["BLOCK_K"]),
        "GROUP_M": int(config["GROUP_M"]),
        "num_warps": int(config["num_warps"]),
        "num_stages": int(config["num_stages"]),
    }


def bmm_launch(
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    config: dict[str, Any],
    allow_tf32: bool,
    num_sms: int = 0,
) -> Launch:
    """The launch computing ``out[i] = a[i] @ b[i]`` (``a`` or ``b`` of batch stride 0 when
    one matrix serves every entry, ``b`` also of batch size 1) with ``config``; ``num_sms``
    (the persistent ``TMA`` kernel's programs) defaults to the device's SMs. ``.bind()`` it
    for a call that a timer repeats."""
    batch, m, k = a.shape
    n = b.shape[-1]
    if b.shape[-2] != k or out.shape != (batch, m, n) or b.shape[0] not in (1, batch):
        raise ValueError(f"a {tuple(a.shape)}, b {tuple(b.shape)}, out {tuple(out.shape)}")
    meta = _meta(config)
    tiles = triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"])
    sbb = 0 if b.shape[0] == 1 else b.stride(0)
    dims = (m, n, k, batch, *a.stride(), sbb, b.stride(1), b.stride(2), *out.stride())
    extra = {
        "BATCH_MAJOR": bool(config["BATCH_MAJOR"]),
        "PRECISION": precision(a.dtype, allow_tf32),
    }
    if not config.get("TMA", False):
        return Launch(bmm_kernel, (tiles * batch,), (a, b, out, *dims), {**meta, **extra})
    if num_sms <= 0:
        num_sms = sm_count(out.device)
    descs, flags = bmm_descriptors(a, b, out, dims, meta)
    grid = (max(1, min(tiles * batch, num_sms)),)
    return Launch(bmm_tma_kernel, grid, (*descs, m, n, k, batch), {**meta, **extra, **flags})


def bmm_descriptors(
    a: Any, b: Any, c: Any, dims: tuple[int, ...], meta: dict[str, Any]
) -> tuple[tuple[Any, Any, Any], dict[str, bool]]:
    """Host TMA descriptors of A, B and C for ``bmm_tma_kernel`` and its layout flags;
    ``dims`` are ``bmm_kernel``'s size and stride arguments (``m, n, k, batch, sab, sam, sak,
    sbb, sbk, sbn, scb, scm, scn``), ``a``, ``b`` and ``c`` tensors or precompile's stand-ins.
    A column-major operand is described as its row-major transpose; an operand of batch
    stride 0 is one 2-D matrix."""
    m, n, k, batch, sab, sam, sak, sbb, sbk, sbn, scb, scm, _ = dims
    bm, bn, bk = meta["BLOCK_M"], meta["BLOCK_N"], meta["BLOCK_K"]
    a_col, b_col = sak != 1, sbn != 1
    a_dims = ([k, m], [sak], [bk, bm]) if a_col else ([m, k], [sam], [bm, bk])
    b_dims = ([n, k], [sbn], [bn, bk]) if b_col else ([k, n], [sbk], [bk, bn])
    descs = (
        _batched_descriptor(a, batch, sab, *a_dims),
        _batched_descriptor(b, batch, sbb, *b_dims),
        _batched_descriptor(c, batch, scb, [m, n], [scm], [bm, bn]),
    )
    flags = {"A_COL": a_col, "B_COL": b_col, "A_SHARED": sab == 0, "B_SHARED": sbb == 0}
    return descs, flags


def _batched_descriptor(
    base: Any, batch: int, batch_stride: int, shape: list[int], lead: list[int], box: list[int]
) -> Any:
    """A row-major matrix of ``shape`` (leading stride ``lead``) in each batch entry: a 3-D
    descriptor whose box is one entry's, or a 2-D one where every entry is the same matrix
    (batch stride 0)."""
    from tunehub.kernels.triton_gemm_kernels import _descriptor

    if batch_stride == 0:
        return _descriptor(base, shape, [*lead, 1], box)
    return _descriptor(base, [batch, *shape], [batch_stride, *lead, 1], [1, *box])


def grouped_grid(m: int, n: int, groups: int, config: dict[str, Any], num_sms: int) -> int:
    """Programs launched: one per tile of the bound (``cdiv(m, BLOCK_M) + groups`` rows of
    tiles, more than the groups' own), or ``PROGRAMS`` per SM of them when persistent."""
    bound = (triton.cdiv(m, int(config["BLOCK_M"])) + groups) * triton.cdiv(
        n, int(config["BLOCK_N"])
    )
    if config["SCHEDULE"] == "persistent":
        return int(max(1, min(bound, num_sms * int(config["PROGRAMS"]))))
    return int(bound)


def grouped_launch(
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    offsets: torch.Tensor,
    config: dict[str, Any],
    allow_tf32: bool,
    num_sms: int,
) -> Callable[[], None]:
    """A bound launch of ``out[o_g:o_(g+1)] = a[o_g:o_(g+1)] @ b[g]`` for each group g, ``offsets``
    (int32, G + 1 entries, on the device) the groups' running row sums from 0."""
    m, k = a.shape
    groups, _, n = b.shape
    if b.shape[1] != k or out.shape != (m, n) or offsets.numel() != groups + 1:
        raise ValueError(
            f"a {tuple(a.shape)}, b {tuple(b.shape)}, out {tuple(out.shape)}, "
            f"{offsets.numel()} offsets"
        )
    meta = _meta(config)
    bound = (triton.cdiv(m, meta["BLOCK_M"]) + groups) * triton.cdiv(n, meta["BLOCK_N"])
    grid = (grouped_grid(m, n, groups, config, num_sms),)
    prec = precision(a.dtype, allow_tf32)
    if config.get("TMA", False):
        if a.stride(1) != 1 or b.stride(2) != 1:
            raise ValueError("the TMA kernel reads a row-major A and row-major B groups")
        descs = grouped_descriptors(a, (a.shape, a.stride()), b, (b.shape, b.stride()), meta)
        args: tuple[Any, ...] = (*descs, out, offsets, n, k, groups, bound, *out.stride())
        kernel: Any = grouped_tma_kernel
    else:
        args = (a, b, out, offsets, n, k, groups, bound, *a.stride(), *b.stride(), *out.stride())
        kernel = grouped_kernel

    def launch() -> None:
        kernel[grid](*args, **meta, PRECISION=prec)

    return launch


def grouped_descriptors(
    a: Any, a_dims: tuple[Any, Any], b: Any, b_dims: tuple[Any, Any], meta: dict[str, Any]
) -> tuple[Any, Any]:
    """Host TMA descriptors of A (M x K, a BLOCK_M x BLOCK_K box) and B (G x K x N, a box of
    one group's BLOCK_K x BLOCK_N), each of (shape, strides) ``*_dims``; ``a`` and ``b``
    tensors or the precompile's stand-ins."""
    from tunehub.kernels.triton_gemm_kernels import _descriptor

    bm, bn, bk = meta["BLOCK_M"], meta["BLOCK_N"], meta["BLOCK_K"]
    return (
        _descriptor(a, list(a_dims[0]), list(a_dims[1]), [bm, bk]),
        _descriptor(b, list(b_dims[0]), list(b_dims[1]), [1, bk, bn]),
    )


def compile_for(
    op: str,
    config: dict[str, Any],
    dtype: torch.dtype,
    allow_tf32: bool,
    capability: int,
    strides: tuple[int, ...],
) -> Any:
    """Compile ``op``'s kernel (``bmm`` or ``grouped_mm``) for a GPU of compute
    ``capability`` into TRITON_CACHE_DIR, without a GPU: the compiled kernel (``.hash``,
    ``.metadata.shared``). ``strides`` are the launch's, in the kernel's order (they decide
    its specialisation, as sizes divisible by 16 do)."""
    from triton.backends.compiler import GPUTarget

    meta = _meta(config)
    fake = _FakeTensor(dtype)
    prec = precision(dtype, allow_tf32)
    if op == "bmm":
        m, n, k, batch = strides[:4]
        kwargs = {**meta, "BATCH_MAJOR": bool(config["BATCH_MAJOR"]), "PRECISION": prec}
        if config.get("TMA", False):
            descs, flags = bmm_descriptors(fake, fake, fake, strides, meta)
            args: tuple[Any, ...] = (*descs, m, n, k, batch)
            kwargs.update(flags)
            kernel = bmm_tma_kernel
        else:
            args = (fake, fake, fake, m, n, k, batch, *strides[4:])
            kernel = bmm_kernel
    elif config.get("TMA", False):
        # (n, k, groups, bound, m): dense row-major operands, described as the launch does.
        n, k, groups, bound, m = strides[:5]
        a_desc, b_desc = grouped_descriptors(
            fake, ((m, k), (k, 1)), fake, ((groups, k, n), (k * n, n, 1)), meta
        )
        offsets = _FakeTensor(torch.int32)
        args = (a_desc, b_desc, fake, offsets, n, k, groups, bound, n, 1)
        kwargs = {**meta, "PRECISION": prec}
        kernel = grouped_tma_kernel
    else:
        n, k, groups, bound = strides[:4]
        offsets = _FakeTensor(torch.int32)
        args = (fake, fake, fake, offsets, n, k, groups, bound, *strides[4:])
        kwargs = {**meta, "PRECISION": prec}
        kernel = grouped_kernel
    compiled, _ = _compile_like_jit(kernel, GPUTarget("cuda", capability, 32), args, kwargs)
    return compiled
