"""``triton.attention``'s kernel, its launch, and attention's operands and reference check.

The kernel is a flash-attention forward of our own: one program per BLOCK_M query rows of one
(batch, head); it walks the keys BLOCK_N at a time, keeping the running row maximum and sum
of the softmax (online softmax, in float32, through exp2 with the scale folded in) and the
float32 output accumulator, and divides once at the end. Causal masking is top-left aligned
(query i sees keys j <= i, as ``scaled_dot_product_attention(is_causal=True)``), and the walk
stops at the last key block a row of the tile can see; keys past ``kv_len`` are masked only
when ``kv_len`` is not a multiple of BLOCK_N. ``num_stages`` pipelines the key loop's loads.

Operands are fresh normal Q, K, V (batch x heads x len x head_dim, contiguous) and a
NaN-poisoned O; the reference is float32 ``softmax(Q K^T / sqrt(d)) V`` on the same device,
a few heads at a time; the check is every element finite and the relative Frobenius error
within the dtype's tolerance. Imports torch and Triton: GPU run sandboxes and tests only.
"""

# Triton kernels take no Python annotations (Triton reads them as its own type hints), so the
# @triton.jit function below is untyped by necessity; everything else is checked strictly.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from tunehub.core import Workload

TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
# Relative Frobenius error allowed against the float32 reference: P is rounded to the
# operands' type before P @ V (about 2^-11 for float16, 2^-8 for bfloat16 per element).
TOLERANCE = {"float16": 3e-3, "bfloat16": 2e-2}
LOG2E = 1.4426950408889634
# The reference's score matrices are held at most this many bytes at a time.
REFERENCE_CHUNK_BYTES = 1 << 30


@triton.jit
def _attend(
    acc,
    l_i,
    m_i,
    q,
    k,
    v,
    rows,
    keys,
    kv_len,
    scale_log2,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    start_m=0,
    offs_m=None,
    SPLIT_ROWS: tl.constexpr = False,
):
    # One key block of the online softmax, in base 2. ``k`` is BLOCK_N x HEAD_DIM (rows of K);
    # the tile's query rows are ``rows`` (= start_m + offs_m).
    s = tl.dot(q, tl.trans(k))
    if MASKED:
        # A block on the diagonal (causal) or past kv_len: only these few pay for the masks.
        ok = keys[None, :] < kv_len
        if CAUSAL:
            if SPLIT_ROWS:
                # Key j <= query row start_m + r, compared as (j - start_m) <= r: the form
                # Triton 3.6's warp specialisation splits right. It gives each consumer
                # warpgroup its half of the tile by moving both start_m and the offsets'
                # range, so ``rows`` came out BLOCK_M / 2 too far down in the second half
                # (its causal outputs were wrong); start_m on the keys' side stays put.
                ok = ok & ((keys - start_m)[None, :] <= offs_m[:, None])
            else:
                ok = ok & (keys[None, :] <= rows[:, None])
        s = tl.where(ok, s * scale_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
    else:
        # The scale is positive, so the row maximum of the raw scores is taken first and the
        # scale and the subtraction meet in one fused multiply-add per score.
        m_new = tl.maximum(m_i, tl.max(s, 1) * scale_log2)
        p = tl.math.exp2(s * scale_log2 - m_new[:, None])
    # Every row sees key 0 in the first block it walks, so m_new is finite from there on and
    # alpha is 0 on that first block (m_i = -inf), 1 wherever the maximum held.
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, l_i, m_new


@triton.jit
def _attention_fwd(
    Q,
    K,
    V,
    Out,
    scale_log2,
    stride_qb,
    stride_qh,
    stride_qm,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_ob,
    stride_oh,
    stride_om,
    q_len,
    kv_len,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    EVEN_M: tl.constexpr,
    EVEN_N: tl.constexpr,
    TMA: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
):
    # Triton's launcher passes a Python float as float32, Inductor's (a user kernel in its
    # generated code) as float64, which would carry the scores and the accumulator to float64.
    scale_log2 = tl.cast(scale_log2, tl.float32)
    pid_m = tl.program_id(0)
    if CAUSAL:
        # Query tiles further down walk more key blocks: launch those first, so the short
        # ones fill the last wave instead of leaving a long tail.
        pid_m = tl.num_programs(0) - 1 - pid_m
    head = tl.program_id(1).to(tl.int64)
    batch = tl.program_id(2).to(tl.int64)
    q_base = Q + batch * stride_qb + head * stride_qh
    k_base = K + batch * stride_kb + head * stride_kh
    v_base = V + batch * stride_vb + head * stride_vh
    o_base = Out + batch * stride_ob + head * stride_oh
    start_m = pid_m * BLOCK_M
    offs_m = tl.arange(0, BLOCK_M)
    rows = start_m + offs_m
    cols = tl.arange(0, BLOCK_N)
    dims = tl.arange(0, HEAD_DIM)
    if TMA:
        # One (batch, head)'s Q, K, V and O as 2-D tensors of exactly their lengths: TMA
        # zero-fills boxes past the end and clips stores there, so no load or store is masked.
        q_desc = tl.make_tensor_descriptor(
            q_base, shape=[q_len, HEAD_DIM], strides=[stride_qm, 1], block_shape=[BLOCK_M, HEAD_DIM]
        )
        k_desc = tl.make_tensor_descriptor(
            k_base,
            shape=[kv_len, HEAD_DIM],
            strides=[stride_kn, 1],
            block_shape=[BLOCK_N, HEAD_DIM],
        )
        v_desc = tl.make_tensor_descriptor(
            v_base,
            shape=[kv_len, HEAD_DIM],
            strides=[stride_vn, 1],
            block_shape=[BLOCK_N, HEAD_DIM],
        )
        q = q_desc.load([start_m, 0])
    elif EVEN_M:
        q = tl.load(q_base + rows[:, None] * stride_qm + dims[None, :])
    else:
        q = tl.load(
            q_base + rows[:, None] * stride_qm + dims[None, :],
            mask=rows[:, None] < q_len,
            other=0.0,
        )
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    # Key blocks [0, full) need no mask: wholly before kv_len and, when causal, wholly at or
    # before the tile's first row. Blocks [full, hi) are masked: the diagonal (causal) and a
    # partial last block. Blocks past hi (above the diagonal) are never touched.
    full = (kv_len // BLOCK_N) * BLOCK_N
    hi = kv_len
    if CAUSAL:
        full = tl.minimum(full, (start_m // BLOCK_N) * BLOCK_N)
        hi = tl.minimum(kv_len, start_m + BLOCK_M)
    if WARP_SPECIALIZE and (CAUSAL or not EVEN_N):
        # Triton 3.6's Hopper warp specialisation takes one loop per kernel, without
        # branches (a second loop, or a masked block before the loop, crashes its pass; a
        # branch turns it off): every block is masked.
        for start_n in tl.range(0, hi, BLOCK_N, warp_specialize=True):
            start_n = tl.multiple_of(start_n, BLOCK_N)
            k = k_desc.load([start_n, 0])
            v = v_desc.load([start_n, 0])
            acc, l_i, m_i = _attend(
                acc, l_i, m_i, q, k, v, rows, start_n + cols, kv_len, scale_log2,
                MASKED=True, CAUSAL=CAUSAL, start_m=start_m, offs_m=offs_m, SPLIT_ROWS=True,
            )  # fmt: skip
    else:
        for start_n in tl.range(0, full, BLOCK_N, warp_specialize=WARP_SPECIALIZE):
            start_n = tl.multiple_of(start_n, BLOCK_N)
            keys = start_n + cols
            if TMA:
                k = k_desc.load([start_n, 0])
                v = v_desc.load([start_n, 0])
            else:
                k = tl.load(k_base + keys[:, None] * stride_kn + dims[None, :])
                v = tl.load(v_base + keys[:, None] * stride_vn + dims[None, :])
            acc, l_i, m_i = _attend(
                acc, l_i, m_i, q, k, v, rows, keys, kv_len, scale_log2, MASKED=False, CAUSAL=CAUSAL
            )
        if CAUSAL or not EVEN_N:
            for start_n in range(full, hi, BLOCK_N):
                start_n = tl.multiple_of(start_n, BLOCK_N)
                keys = start_n + cols
                if TMA:
                    k = k_desc.load([start_n, 0])
                    v = v_desc.load([start_n, 0])
                else:
                    in_kv = keys[:, None] < kv_len
                    k = tl.load(
                        k_base + keys[:, None] * stride_kn + dims[None, :], mask=in_kv, other=0.0
                    )
                    v = tl.load(
                        v_base + keys[:, None] * stride_vn + dims[None, :], mask=in_kv, other=0.0
                    )
                acc, l_i, m_i = _attend(
                    acc,
                    l_i,
                    m_i,
                    q,
                    k,
                    v,
                    rows,
                    keys,
                    kv_len,
                    scale_log2,
                    MASKED=True,
                    CAUSAL=CAUSAL,
                )
    out = (acc * (1.0 / l_i)[:, None]).to(Out.dtype.element_ty)
    if TMA:
        o_desc = tl.make_tensor_descriptor(
            o_base, shape=[q_len, HEAD_DIM], strides=[stride_om, 1], block_shape=[BLOCK_M, HEAD_DIM]
        )
        o_desc.store([start_m, 0], out)
    elif EVEN_M:
        tl.store(o_base + rows[:, None] * stride_om + dims[None, :], out)
    else:
        tl.store(
            o_base + rows[:, None] * stride_om + dims[None, :], out, mask=rows[:, None] < q_len
        )


CONFIG_KEYS = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")
# Knobs a config may leave out (configs stored before they existed): off when absent.
OPTIONAL_CONFIG_KEYS = ("TMA", "WARP_SPECIALIZE", "GLUON")


def config_problem(config: Mapping[str, Any]) -> str | None:
    """Why ``config`` cannot run at all (a missing key, WARP_SPECIALIZE without TMA, GLUON
    without TMA or beside WARP_SPECIALIZE), or None."""
    missing = [key for key in CONFIG_KEYS if key not in config]
    if missing:
        return f"config lacks {missing}"
    unknown = sorted(set(config) - set(CONFIG_KEYS) - set(OPTIONAL_CONFIG_KEYS))
    if unknown:
        return f"config has unknown keys {unknown}"
    if bool(config.get("WARP_SPECIALIZE", False)) and not bool(config.get("TMA", False)):
        return "WARP_SPECIALIZE needs TMA (the warp-specialised loop is fed by TMA loads)"
    if bool(config.get("GLUON", False)) and (
        not bool(config.get("TMA", False)) or bool(config.get("WARP_SPECIALIZE", False))
    ):
        return "GLUON needs TMA and WARP_SPECIALIZE off (its kernel loads through TMA itself)"
    return None


def tma_problem(*tensors: torch.Tensor) -> str | None:
    """Why TMA cannot describe these batch x heads x len x head_dim tensors, or None: each
    (batch, head)'s base address and row stride must be 16-byte multiples."""
    for t in tensors:
        elem = t.element_size()
        if t.data_ptr() % 16:
            return "a tensor's data is not 16-byte aligned"
        for dim in (0, 1, 2):
            if t.shape[dim] > 1 and (t.stride(dim) * elem) % 16:
                return f"stride {t.stride(dim)} of dimension {dim} is not a 16-byte multiple"
    return None


def _descriptor_scratch(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    # TMA descriptors made in the kernel are written to global scratch the launch asks for.
    del alignment, stream
    return torch.empty(size, dtype=torch.int8, device=torch.cuda.current_device())


def launch_args(
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    shapes: tuple[int, int, int, int, int],
    strides: tuple[tuple[int, ...], ...],
    causal: bool,
    config: Mapping[str, Any],
) -> tuple[tuple[int, int, int], tuple[Any, ...], dict[str, Any]]:
    """The grid, arguments and keywords of one launch: the one place bind, precompile and
    ``tunehub::triton_attention`` get them from, so a precompiled binary is the one the
    launch looks up."""
    batch, heads, q_len, kv_len, head_dim = shapes
    block_m, block_n = int(config["BLOCK_M"]), int(config["BLOCK_N"])
    grid = (triton.cdiv(q_len, block_m), heads, batch)
    args: tuple[Any, ...] = (q, k, v, out, LOG2E / math.sqrt(head_dim))
    for s in strides:
        args += tuple(s[:3])
    args += (q_len, kv_len)
    kwargs = {
        "HEAD_DIM": head_dim,
        "BLOCK_M": block_m,
        "BLOCK_N": block_n,
        "CAUSAL": bool(causal),
        "EVEN_M": q_len % block_m == 0,
        "EVEN_N": kv_len % block_n == 0,
        "TMA": bool(config.get("TMA", False)),
        "WARP_SPECIALIZE": bool(config.get("WARP_SPECIALIZE", False)),
        "num_warps": int(config["num_warps"]),
        "num_stages": int(config["num_stages"]),
    }
    return grid, args, kwargs


def bind(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    *,
    causal: bool,
    config: Mapping[str, Any],
) -> Callable[[], None]:
    """A callable writing ``out = attention(q, k, v)`` with ``config`` (BLOCK_M, BLOCK_N,
    num_warps, num_stages; TMA, WARP_SPECIALIZE and GLUON off unless given). Tensors are
    batch x heads x len x head_dim, last dim contiguous; with TMA each (batch, head)'s rows
    must also start and step on 16-byte multiples (``tma_problem``); GLUON (the Gluon
    kernel, ``triton_attention_gluon``) needs contiguous tensors and a Hopper GPU."""
    batch, heads, q_len, head_dim = q.shape
    kv_len = k.shape[2]
    if head_dim not in (16, 32, 64, 128, 256) or k.shape[3] != head_dim:
        raise ValueError(f"head_dim {head_dim} is not a power of two in [16, 256]")
    for name, t in (("q", q), ("k", k), ("v", v), ("out", out)):
        if t.stride(3) != 1:
            raise ValueError(f"{name}'s last dimension is not contiguous")
    problem = config_problem(config)
    if problem:
        raise ValueError(f"invalid config {dict(config)}: {problem}")
    tma = bool(config.get("TMA", False))
    interpreting = bool(triton.knobs.runtime.interpret)
    if tma:
        problem = tma_problem(q, k, v, out)
        if problem:
            raise ValueError(f"TMA cannot load these operands: {problem}")
    if bool(config.get("GLUON", False)):
        return _bind_gluon(q, k, v, out, causal=causal, config=config)
    grid, args, kwargs = launch_args(
        q, k, v, out, (batch, heads, q_len, kv_len, head_dim),
        (q.stride(), k.stride(), v.stride(), out.stride()), causal, config,
    )  # fmt: skip
    kernel = _attention_fwd[grid]

    def call() -> None:
        if tma and not interpreting:
            triton.set_allocator(_descriptor_scratch)
        kernel(*args, **kwargs)

    return call


def _bind_gluon(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    *,
    causal: bool,
    config: Mapping[str, Any],
) -> Callable[[], None]:
    if triton.knobs.runtime.interpret or q.device.type != "cuda":
        raise ValueError("GLUON runs on a Hopper GPU only (Triton's interpreter has no Gluon)")
    from tunehub.kernels import triton_attention_gluon as gk

    shapes = (*q.shape[:3], k.shape[2], q.shape[3])
    contiguous = all(t.is_contiguous() for t in (q, k, v, out))
    problem = gk.problem(config, contiguous)
    if problem:
        raise ValueError(problem)
    grid, args, kwargs = gk.launch_args(q, k, v, out, shapes, causal, config)
    kernel = gk._gluon_attention_fwd[grid]

    def call() -> None:
        kernel(*args, **kwargs)

    return call


@dataclass(frozen=True)
class Compiled:
    """What the compiler made of one config for one GPU, read without running it."""

    name: str
    hash: str  # the binary's key in Triton's cache
    shared_bytes: int
    num_warps: int
    registers: int | None
    stack_bytes: int | None  # ptxas's stack frame: where spilled registers go
    warp_specialized: bool  # Triton split the key loop into producer and consumer warps
    wgmma: bool  # Hopper's warpgroup MMA, not the Ampere-style mma.sync
    tma: bool  # bulk tensor copies
    compile_secs: float


def precompile(
    *,
    config: Mapping[str, Any],
    head_dim: int,
    dtype: str,
    causal: bool,
    q_len: int,
    kv_len: int,
    capability: int,
    batch: int = 1,
    heads: int = 1,
) -> Compiled:
    """Compile, without a GPU, the kernel ``bind`` launches for dense operands of this shape
    on a GPU of compute ``capability`` (90 for H100/H200) into TRITON_CACHE_DIR (and, where
    the host has the CUDA driver, its C launcher), and report its shared memory, registers
    and spills. Raises ValueError for a config the kernel cannot take and the compiler's own
    error when it fails."""
    if triton.knobs.runtime.interpret:
        raise RuntimeError("precompile needs Triton's compiler; TRITON_INTERPRET=1 is set")
    from triton.backends.compiler import GPUTarget

    from tunehub.kernels.triton_gemm_kernels import (
        _compile_like_jit,
        _FakeTensor,
        _resource_usage,
    )

    problem = config_problem(config)
    if problem:
        raise ValueError(f"invalid config {dict(config)}: {problem}")
    torch_dtype = TORCH_DTYPES[dtype]
    q_strides = (heads * q_len * head_dim, q_len * head_dim, head_dim, 1)
    kv_strides = (heads * kv_len * head_dim, kv_len * head_dim, head_dim, 1)
    q, k, v, out = (_FakeTensor(torch_dtype) for _ in range(4))
    shapes = (batch, heads, q_len, kv_len, head_dim)
    kernel: Any = _attention_fwd
    if bool(config.get("GLUON", False)):
        from tunehub.kernels import triton_attention_gluon as gk

        problem = gk.problem(config)
        if problem:
            raise ValueError(problem)
        kernel = gk._gluon_attention_fwd
        _, args, kwargs = gk.launch_args(q, k, v, out, shapes, causal, config)
    else:
        _, args, kwargs = launch_args(
            q, k, v, out, shapes, (q_strides, kv_strides, kv_strides, q_strides), causal, config
        )
    target = GPUTarget("cuda", capability, 32)
    start = time.perf_counter()
    compiled, _ = _compile_like_jit(kernel, target, args, kwargs)
    secs = time.perf_counter() - start
    registers, stack = _resource_usage(compiled.asm["cubin"])
    ttgir = str(compiled.asm.get("ttgir", ""))
    ptx = str(compiled.asm.get("ptx", ""))
    return Compiled(
        name=compiled.name,
        hash=str(compiled.hash),
        shared_bytes=int(compiled.metadata.shared),
        num_warps=int(compiled.metadata.num_warps),
        registers=registers,
        stack_bytes=stack,
        warp_specialized="ttg.warp_specialize" in ttgir,
        wgmma="wgmma.mma_async" in ptx,
        tma="cp.async.bulk.tensor" in ptx,
        compile_secs=secs,
    )


# --- operands, reference, check ----------------------------------------------------------------
@dataclass
class AttentionOperands:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    out: torch.Tensor
    causal: bool
    seed: int


def _count(workload: Workload, name: str) -> int:
    value = workload.param(name)
    if not isinstance(value, int):
        raise TypeError(f"{name} of {workload.label} is not an integer")
    return value


def operands(workload: Workload, device: torch.device, seed: int) -> AttentionOperands:
    """Fresh standard-normal Q, K, V and a NaN-poisoned O for ``workload`` on ``device``."""
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    dtype = TORCH_DTYPES[workload.dtype]
    batch, heads = (_count(workload, "batch"), _count(workload, "heads"))
    q_shape = (batch, heads, workload.m, workload.k)
    kv_shape = (batch, heads, workload.n, workload.k)

    def draw(shape: tuple[int, ...]) -> torch.Tensor:
        return torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(dtype)

    q, k, v = draw(q_shape), draw(kv_shape), draw(kv_shape)
    out = torch.full(q_shape, math.nan, dtype=dtype, device=device)
    return AttentionOperands(q, k, v, out, bool(workload.param("causal")), seed)


def reference(ops: AttentionOperands) -> torch.Tensor:
    """float32 ``softmax(Q K^T / sqrt(d)) V`` (causal: key j > query i masked), a few
    (batch, head) pairs at a time so the score matrices stay within REFERENCE_CHUNK_BYTES."""
    batch, heads, q_len, d = ops.q.shape
    kv_len = ops.k.shape[2]
    q = ops.q.reshape(batch * heads, q_len, d)
    k = ops.k.reshape(batch * heads, kv_len, d)
    v = ops.v.reshape(batch * heads, kv_len, d)
    out = torch.empty((batch * heads, q_len, d), dtype=torch.float32, device=q.device)
    step = max(1, REFERENCE_CHUNK_BYTES // max(1, q_len * kv_len * 4))
    mask = None
    if ops.causal:
        mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=q.device).tril()
    for lo in range(0, batch * heads, step):
        hi = min(lo + step, batch * heads)
        s = q[lo:hi].float() @ k[lo:hi].float().transpose(1, 2) / math.sqrt(d)
        if mask is not None:
            s.masked_fill_(~mask, float("-inf"))
        out[lo:hi] = torch.softmax(s, dim=-1) @ v[lo:hi].float()
    return out.reshape(batch, heads, q_len, d)


@dataclass(frozen=True)
class AttentionCheck:
    ok: bool
    relative_error: float
    tolerance: float
    message: str


def check(out: torch.Tensor, ref: torch.Tensor, dtype: str) -> AttentionCheck:
    """Every element of O finite, and ``||O - ref|| / ||ref||`` within the dtype's tolerance."""
    tol = TOLERANCE[dtype]
    finite = torch.isfinite(out)
    bad = int((~finite).sum())
    if bad:
        where = torch.nonzero(~finite)[0].tolist()
        return AttentionCheck(
            False,
            math.inf,
            tol,
            f"{bad} of {out.numel()} elements are not finite (first at O{where}): unwritten or "
            "overflowed",
        )
    diff = (out.float() - ref).flatten()
    scale = float(torch.linalg.vector_norm(ref))
    rel = float(torch.linalg.vector_norm(diff)) / scale if scale > 0 else 0.0
    if rel > tol:
        worst = int(torch.argmax(diff.abs()))
        where = list(torch.unravel_index(torch.tensor(worst), out.shape))
        index = tuple(int(i) for i in where)
        return AttentionCheck(
            False,
            rel,
            tol,
            f"relative error {rel:.3g} over the {dtype} tolerance {tol:.3g}; worst at "
            f"O{list(index)} = {out[index].item()!r}, expected {ref[index].item()!r}",
        )
    return AttentionCheck(True, rel, tol, "")
