"""Features of (workload, target, config) for cost models: per template, named and versioned.

A FeatureSet turns a batch of configs of one workload on one target into a float matrix, one
row per config, one column per name in ``names``. A model saves the set's ``key`` and names
with itself and refuses features it was not trained on (another version, another list).

Each template's set holds its knobs, the workload, and derived analytical quantities that a
tree model cannot build from raw knobs in a few splits: for ``blis.gemm`` register-tile use,
the L1/L2/L3 footprints of the packed panels, edge waste in M, N and K, FLOPs per byte of the
blocking, packing overheads and the split of the parallel loop; for ``triton.gemm`` padding
waste per dimension, tiles and waves over the SMs and the last wave's fill, shared memory and
register estimates, K iterations and split-K cost. Templates without a set of their own get
``generic`` features (each knob's value, strings by their position among the values seen).

Columns are computed with numpy over the whole batch: a lookup scores every point of a
34,000-config space in a few tens of milliseconds.

>>> from tunehub.core import Config, Target, Workload
>>> t = Target("cpu", "x", ("avx2", "fma"), 1, l1d_bytes=32768, l2_bytes=1 << 20,
...            l3_bytes=8 << 20, machine="x86_64")
>>> c = Config({"ISA": "avx2", "MR": 6, "NR": 16, "KC": 256, "MC": 128, "NC": 4096,
...             "UNROLL": 4, "threads": 1, "PAR": "ic", "PREFETCH": 0, "PACKB": True})
>>> fs = feature_set("blis.gemm")
>>> x = fs.matrix(Workload(m=100, n=100, k=100), t, [c])
>>> x.shape == (1, len(fs.names)), round(float(x[0, fs.names.index("edge_m")]), 3)
(True, 0.02)
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from tunehub.core import Config, KnobValue, Target, Workload
from tunehub.core.operators import Conv2d
from tunehub.core.workload import DTYPE_BYTES

Matrix = npt.NDArray[np.float64]
Column = npt.NDArray[np.float64]
FeatureFn = Callable[[Workload, Target, Sequence[Config]], dict[str, Column]]

# Knob values and derived counts span decades: trees split on log2 as well as on raw values.
_EPS = 1e-12


@dataclass(frozen=True)
class FeatureSet:
    """A template's features: ``key`` (``"<template>/<version>"``) names the list a model was
    trained on; ``matrix`` computes it for a batch of configs. ``consensus`` is how many of
    the best-scored points a zero-trial pick takes the medoid of (see predict.pick_config):
    how far a model on these features can be trusted at its single top point.
    ``default_margin`` is how much faster than the template's analytical default a model on
    these features must predict its own choice before the pick prefers it (0.05: 5%)."""

    template: str
    version: int
    names: tuple[str, ...]
    compute: FeatureFn
    consensus: int = 20
    default_margin: float = 0.0

    @property
    def key(self) -> str:
        return f"{self.template}/{self.version}"

    def matrix(self, workload: Workload, target: Target, configs: Sequence[Config]) -> Matrix:
        """One row per config, the columns of ``names`` in order (float64)."""
        if not configs:
            return np.zeros((0, len(self.names)))
        columns = self.compute(workload, target, configs)
        n = len(configs)
        out = np.empty((n, len(self.names)))
        for j, name in enumerate(self.names):
            out[:, j] = columns[name]  # a column, or one value for every row
        return out


def _knob(configs: Sequence[Config], name: str, default: KnobValue = 0) -> Column:
    return np.array([_number(c.get(name, default)) for c in configs], dtype=np.float64)


def _number(value: KnobValue) -> float:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int):
        return float(value)
    return float("nan")


def _strings(configs: Sequence[Config], name: str, default: str = "") -> list[str]:
    return [str(c.get(name, default)) for c in configs]


def _log2(x: Column | float) -> Column:
    out: Column = np.log2(np.maximum(np.asarray(x, dtype=np.float64), _EPS))
    return out


def _ceil_div(a: Column | float, b: Column | float) -> Column:
    out: Column = np.ceil(np.asarray(a, dtype=np.float64) / np.maximum(b, 1.0))
    return out


def _pad_waste(size: float, block: Column) -> Column:
    """Share of a padded dimension that is padding: ceil(size/block)*block vs size."""
    padded = _ceil_div(size, block) * block
    out: Column = (padded - size) / np.maximum(padded, 1.0)
    return out


def _workload_columns(workload: Workload) -> dict[str, Column]:
    values = {
        "log2_m": math.log2(workload.m),
        "log2_n": math.log2(workload.n),
        "log2_k": math.log2(workload.k),
        "log2_flops": math.log2(workload.flops),
        "dtype_bytes": float(DTYPE_BYTES[workload.dtype]),
        "epilogue_bias": float(workload.epilogue != "none"),
        "epilogue_act": float(workload.epilogue in ("bias_relu", "bias_gelu")),
        "b_col_major": float(workload.b_layout == "col_major"),
    }
    return {name: np.asarray(value, dtype=np.float64) for name, value in values.items()}


WORKLOAD_NAMES = tuple(_workload_columns(Workload(m=1, n=1, k=1)))


# --- blis.gemm -------------------------------------------------------------------------------
# Vector bytes and registers per ISA (as tunehub.kernels.blis_codegen has them; copied so this
# module reads no kernel code and the lookup path imports nothing that compiles).
BLIS_VECTOR_BYTES = {"avx512": 64, "avx2": 32, "generic": 16}
BLIS_REGISTERS = {"avx512": 32, "avx2": 16, "generic": 16}
FALLBACK_L1, FALLBACK_L2, FALLBACK_L3 = 32 << 10, 256 << 10, 8 << 20

BLIS_NAMES = (
    *WORKLOAD_NAMES,
    # knobs
    "MR", "NR", "nv", "KC", "MC", "NC", "log2_KC", "log2_MC", "log2_NC", "UNROLL",
    "threads", "par_jc", "PREFETCH", "PACKB", "isa_vector_bytes",
    # register tile
    "tile_regs_used", "accumulators", "loads_per_fma",
    # cache footprints of the blocks actually used (capped by the shape)
    "kc_eff", "mc_eff", "nc_eff",
    "a_micropanel_l1", "b_micropanel_l1", "micropanels_l1", "a_block_l2", "b_panel_l2",
    "b_panel_l3",
    # edges: padding of the register tile and the part-filled last blocks
    "edge_m", "edge_n", "edge_k_block", "edge_m_block", "edge_n_block",
    "kc_blocks", "mc_blocks", "nc_blocks", "log2_micro_tiles_per_block",
    # traffic
    "flops_per_byte_tile", "flops_per_byte_block", "c_passes_per_flop", "pack_a_per_flop",
    "pack_b_per_flop", "nopack_b_stride_pages",
    # threads
    "threads_per_core", "parallel_units", "parallel_balance",
    # shape-invariant summaries: useful share of the padded work, the vector width it keeps,
    # and each block against the analytical model's choice (log2 ratio)
    "useful_fraction", "effective_vector_bytes", "kc_vs_model", "mc_vs_model", "nc_vs_model",
)  # fmt: skip


def _blis(workload: Workload, target: Target, configs: Sequence[Config]) -> dict[str, Column]:
    m, n, k = float(workload.m), float(workload.n), float(workload.k)
    elem = float(DTYPE_BYTES[workload.dtype])
    l1 = float(target.l1d_bytes or FALLBACK_L1)
    l2 = float(target.l2_bytes or FALLBACK_L2)
    l3 = float(target.l3_bytes or FALLBACK_L3)
    isas = _strings(configs, "ISA", "generic")
    vbytes = np.array([BLIS_VECTOR_BYTES.get(i, 16) for i in isas], dtype=np.float64)
    regs = np.array([BLIS_REGISTERS.get(i, 16) for i in isas], dtype=np.float64)
    mr, nr = _knob(configs, "MR", 1), _knob(configs, "NR", 1)
    kc, mc, nc = _knob(configs, "KC", 1), _knob(configs, "MC", 1), _knob(configs, "NC", 1)
    threads = np.maximum(_knob(configs, "threads", 1), 1.0)
    par_jc = np.array([p == "jc" for p in _strings(configs, "PAR", "ic")], dtype=np.float64)
    packb = _knob(configs, "PACKB", True)
    nv = np.maximum(nr * elem / vbytes, 1.0)
    kc_eff, mc_eff, nc_eff = np.minimum(kc, k), np.minimum(mc, m), np.minimum(nc, n)
    flops = 2.0 * m * n * k
    kc_blocks, mc_blocks, nc_blocks = _ceil_div(k, kc), _ceil_div(m, mc), _ceil_div(n, nc)
    # Parallel loop: ic splits each NC panel's MC blocks, jc splits N into NR-aligned ranges.
    units = np.where(par_jc > 0, _ceil_div(n, nr), mc_blocks)
    balance = units / (_ceil_div(units, threads) * threads)
    cores = float(max(1, target.cores))
    useful = (1.0 - _pad_waste(m, mr)) * (1.0 - _pad_waste(n, nr))
    # The analytical model (tunehub.kernels.blis_gemm._SpaceModel): A micro-panel in L1/4,
    # A block in L2/2, B panel in L3/4, each capped by the shape.
    kc_model = np.minimum(l1 / 4.0 / (mr * elem), k)
    mc_model = np.minimum(l2 / 2.0 / (kc_eff * elem), m)
    nc_model = np.minimum(l3 / 4.0 / (kc_eff * elem), n)
    return {
        **_workload_columns(workload),
        "MR": mr,
        "NR": nr,
        "nv": nv,
        "KC": kc,
        "MC": mc,
        "NC": nc,
        "log2_KC": _log2(kc),
        "log2_MC": _log2(mc),
        "log2_NC": _log2(nc),
        "UNROLL": _knob(configs, "UNROLL", 1),
        "threads": threads,
        "par_jc": par_jc,
        "PREFETCH": _knob(configs, "PREFETCH", 0),
        "PACKB": packb,
        "isa_vector_bytes": vbytes,
        "tile_regs_used": (mr * nv + nv + 1) / regs,
        "accumulators": mr * nv,
        "loads_per_fma": (mr + nv) / (mr * nv),
        "kc_eff": kc_eff,
        "mc_eff": mc_eff,
        "nc_eff": nc_eff,
        "a_micropanel_l1": mr * kc_eff * elem / l1,
        "b_micropanel_l1": kc_eff * nr * elem / l1,
        "micropanels_l1": (mr + nr) * kc_eff * elem / l1,
        "a_block_l2": mc_eff * kc_eff * elem / l2,
        "b_panel_l2": kc_eff * nr * elem * np.where(packb > 0, 1.0, 16.0) / l2,
        "b_panel_l3": kc_eff * nc_eff * elem / l3,
        "edge_m": _pad_waste(m, mr),
        "edge_n": _pad_waste(n, nr),
        "edge_k_block": _pad_waste(k, kc),
        "edge_m_block": _pad_waste(m, mc),
        "edge_n_block": _pad_waste(n, nc),
        "kc_blocks": kc_blocks,
        "mc_blocks": mc_blocks,
        "nc_blocks": nc_blocks,
        "log2_micro_tiles_per_block": _log2(_ceil_div(mc_eff, mr) * _ceil_div(nc_eff, nr)),
        "flops_per_byte_tile": 2.0 * mr * nr / ((mr + nr) * elem),
        "flops_per_byte_block": 2.0
        * mc_eff
        * nc_eff
        * kc_eff
        / ((mc_eff * kc_eff + kc_eff * nc_eff + 2.0 * mc_eff * nc_eff) * elem),
        "c_passes_per_flop": kc_blocks * m * n / flops,
        "pack_a_per_flop": nc_blocks * m * k / flops,
        "pack_b_per_flop": np.where(packb > 0, k * n / flops, 0.0),
        "nopack_b_stride_pages": np.where(packb > 0, 0.0, n * elem / 4096.0),
        "threads_per_core": threads / cores,
        "parallel_units": units,
        "parallel_balance": balance,
        "useful_fraction": useful,
        "effective_vector_bytes": vbytes * useful,
        "kc_vs_model": _log2(kc_eff / kc_model),
        "mc_vs_model": _log2(mc_eff / mc_model),
        "nc_vs_model": _log2(nc_eff / nc_model),
    }


# --- triton.gemm -------------------------------------------------------------------------------
TRITON_VARIANTS = ("tiled", "persistent", "tma", "ws", "splitk", "splitk_atomic")
# H100 values where the target's properties do not say.
FALLBACK_SMEM_PER_BLOCK = 232448
FALLBACK_REGS_PER_SM = 65536
MAX_WARPS_PER_SM = 64

TRITON_NAMES = (
    *WORKLOAD_NAMES,
    "BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages", "SPLIT_K",
    *(f"variant_{v}" for v in TRITON_VARIANTS),
    "log2_tile_area",
    "pad_m", "pad_n", "pad_k",
    "tiles", "log2_tiles", "waves", "last_wave_fill", "programs_per_sm",
    "smem_per_block", "smem_blocks_per_sm", "acc_regs_per_thread", "regs_per_sm_used",
    "warps_per_sm", "k_iters", "flops_per_byte_tile", "split_k_bytes_per_flop",
    "group_m_rows", "FLATTEN", "PAD_K", "unaligned_rows", "pad_copy_bytes_per_flop",
    "kernel_launches",
)  # fmt: skip


def _triton(workload: Workload, target: Target, configs: Sequence[Config]) -> dict[str, Column]:
    m, n, k = float(workload.m), float(workload.n), float(workload.k)
    elem = float(DTYPE_BYTES[workload.dtype])
    sms = float(max(1, target.cores))
    smem_limit = float(target.prop("smem_per_block_bytes", FALLBACK_SMEM_PER_BLOCK))
    smem_sm = float(target.prop("smem_per_sm_bytes", int(smem_limit)))
    regs_sm = float(target.prop("regs_per_sm", FALLBACK_REGS_PER_SM))
    bm, bn, bk = (
        _knob(configs, "BLOCK_M", 64),
        _knob(configs, "BLOCK_N", 64),
        _knob(configs, "BLOCK_K", 32),
    )
    warps = np.maximum(_knob(configs, "num_warps", 4), 1.0)
    stages = np.maximum(_knob(configs, "num_stages", 2), 1.0)
    split = np.maximum(_knob(configs, "SPLIT_K", 1), 1.0)
    group = np.maximum(_knob(configs, "GROUP_M", 1), 1.0)
    variants = _strings(configs, "variant", "tiled")
    persistent = np.array([v in ("persistent", "tma", "ws") for v in variants], dtype=np.float64)
    fused_split = np.array([v in ("splitk", "splitk_atomic") for v in variants], dtype=bool)
    atomic_split = np.array([v == "splitk_atomic" for v in variants], dtype=bool)
    tiles = _ceil_div(m, bm) * _ceil_div(n, bn) * split
    # A persistent kernel launches one program per SM and loops over tiles; either way the
    # tiles run in waves of one per SM (per program slot).
    smem = stages * (bm * bk + bk * bn) * elem
    blocks_sm = np.maximum(np.floor(smem_sm / np.maximum(smem, 1.0)), 0.0)
    acc_regs = bm * bn / (warps * 32.0)  # fp32 accumulators per thread
    regs_thread = np.minimum(acc_regs + 32.0, 255.0)
    resident = np.maximum(
        np.minimum(blocks_sm, np.floor(regs_sm / (regs_thread * warps * 32.0))), 1.0
    )
    slots = sms * resident
    waves = tiles / slots
    full_waves = np.floor(waves)
    last = waves - full_waves
    last_fill = np.where(last > 0, last, 1.0)
    k_per_split = _ceil_div(k, split)
    out: dict[str, Column] = {
        **_workload_columns(workload),
        "BLOCK_M": bm,
        "BLOCK_N": bn,
        "BLOCK_K": bk,
        "GROUP_M": group,
        "num_warps": warps,
        "num_stages": stages,
        "SPLIT_K": split,
        "log2_tile_area": _log2(bm * bn),
        "pad_m": _pad_waste(m, bm),
        "pad_n": _pad_waste(n, bn),
        "pad_k": (_ceil_div(k_per_split, bk) * bk * split - k)
        / np.maximum(_ceil_div(k_per_split, bk) * bk * split, 1.0),
        "tiles": tiles,
        "log2_tiles": _log2(tiles),
        "waves": waves,
        "last_wave_fill": last_fill,
        "programs_per_sm": np.where(persistent > 0, np.ceil(waves), resident),
        "smem_per_block": smem / smem_limit,
        "smem_blocks_per_sm": blocks_sm,
        "acc_regs_per_thread": acc_regs,
        "regs_per_sm_used": regs_thread * warps * 32.0 * resident / regs_sm,
        "warps_per_sm": warps * resident / MAX_WARPS_PER_SM,
        "k_iters": _ceil_div(k_per_split, bk),
        "flops_per_byte_tile": 2.0 * bm * bn / ((bm + bn) * elem),
        # split-K writes SPLIT_K partial fp32 C's and reads them back once: ``tiled`` to a
        # workspace its reduce kernel sums, ``splitk`` as whole tiles (edges padded);
        # ``splitk_atomic`` adds them into one C in L2, read and zeroed once.
        "split_k_bytes_per_flop": np.where(
            split > 1,
            np.where(
                atomic_split,
                (split + 2.0) * m * n * 4.0,
                split
                * np.where(fused_split, _ceil_div(m, bm) * bm * _ceil_div(n, bn) * bn, m * n)
                * 4.0
                * 2.0,
            )
            / (2.0 * m * n * k),
            0.0,
        ),
        "group_m_rows": np.minimum(group * bm, m) / m,
    }
    for v in TRITON_VARIANTS:
        out[f"variant_{v}"] = np.array([x == v for x in variants], dtype=np.float64)
    # Rows read along K that are not 16-byte aligned cost vectorised loads (and TMA); PAD_K
    # buys them back for a copy of A and B every call.
    pad = np.array([bool(c.get("PAD_K", False)) for c in configs], dtype=np.float64)
    unaligned = float((workload.k * elem) % 16 != 0) and float(
        workload.a_layout == "row_major" or workload.b_layout == "col_major"
    )
    out["FLATTEN"] = np.array([bool(c.get("FLATTEN", False)) for c in configs], dtype=np.float64)
    out["PAD_K"] = pad
    out["unaligned_rows"] = unaligned * (1.0 - pad)
    out["pad_copy_bytes_per_flop"] = pad * 2.0 * (m * k + k * n) * elem / (2.0 * m * n * k)
    # Each launch costs a few microseconds whatever it does: ``tiled`` split-K adds its
    # reduce kernel, ``PAD_K`` its padding launch; the one-kernel split-Ks reduce in theirs.
    two_pass = (split > 1) & ~fused_split
    out["kernel_launches"] = 1.0 + two_pass.astype(np.float64) + pad
    return out


# --- blis.bmm --------------------------------------------------------------------------------
# blis.gemm's columns for one batch entry (m, n, k are an entry's), and the batch: its size,
# whether B is shared, which loop the threads split (BPAR) and how evenly the batch split fills
# the threads (the last round of entries keeps some idle). Shapes of bmm share one model.
BMM_NAMES = (
    *BLIS_NAMES,
    "log2_batch", "b_broadcast", "bpar_batch", "batch_fill", "log2_entry_flops",
)  # fmt: skip


def _blis_bmm(workload: Workload, target: Target, configs: Sequence[Config]) -> dict[str, Column]:
    out = _blis(workload, target, configs)
    batch = float(workload.param("batch"))
    threads = np.maximum(_knob(configs, "threads", 1), 1.0)
    split = np.array([str(c.get("BPAR", "inner")) == "batch" for c in configs], dtype=np.float64)
    rounds = _ceil_div(batch, threads)
    out["log2_batch"] = np.asarray(math.log2(batch), dtype=np.float64)
    out["b_broadcast"] = np.asarray(float(bool(workload.param("b_broadcast"))), dtype=np.float64)
    out["bpar_batch"] = split
    out["batch_fill"] = np.where(split > 0, batch / np.maximum(rounds * threads, 1.0), 1.0)
    out["log2_entry_flops"] = np.asarray(
        math.log2(2.0 * workload.m * workload.n * workload.k), dtype=np.float64
    )
    return out


# --- triton.attention ------------------------------------------------------------------------
# The workload through its operator (sequence lengths, head_dim, batch x heads, causal, flops),
# the knobs, and what the tiles make of it: programs (query tiles x batch x heads) over the
# SMs and the last wave's fill, padding of the query and key tiles, key blocks each program
# walks (about half when causal), shared memory and fp32 values per thread (as
# tunehub.kernels.triton_attention estimates them; copied so this module reads no kernel code),
# and which kernel loads how: TMA, Triton's warp specialisation, the Gluon kernel.
ATTENTION_NAMES = (
    "log2_q_len", "log2_kv_len", "head_dim", "log2_heads_batch", "causal", "log2_flops",
    "dtype_bytes", "block_m", "block_n", "log2_block_m", "log2_block_n", "num_warps",
    "num_stages", "log2_programs", "waves", "last_wave_fill", "pad_m", "pad_n",
    "log2_key_blocks", "smem_kib", "values_per_thread", "log2_flops_per_program",
    "tma", "warp_specialize", "gluon",
)  # fmt: skip


def _attention(workload: Workload, target: Target, configs: Sequence[Config]) -> dict[str, Column]:
    q, kv, d = float(workload.m), float(workload.n), float(workload.k)
    pairs = float(workload.operator.multiplicity(workload))
    causal = bool(workload.param("causal"))
    sms = float(max(1, target.cores))
    bm = _knob(configs, "BLOCK_M", 64)
    bn = _knob(configs, "BLOCK_N", 64)
    warps = np.maximum(_knob(configs, "num_warps", 4), 1.0)
    stages = np.maximum(_knob(configs, "num_stages", 2), 1.0)
    programs = _ceil_div(q, bm) * pairs
    waves = _ceil_div(programs, sms)
    key_blocks = _ceil_div(kv, bn)
    if causal:
        # A query tile walks the key blocks up to its last row: about half of them on average.
        key_blocks = np.minimum(key_blocks, _ceil_div(np.minimum(q, kv) + bm, 2.0 * bn))
    out: dict[str, Column] = {
        name: np.asarray(value, dtype=np.float64)
        for name, value in {
            "log2_q_len": math.log2(q),
            "log2_kv_len": math.log2(kv),
            "head_dim": d,
            "log2_heads_batch": math.log2(pairs),
            "causal": float(causal),
            "log2_flops": math.log2(workload.flops),
            "dtype_bytes": float(DTYPE_BYTES[workload.dtype]),
        }.items()
    }
    out.update(
        block_m=bm,
        block_n=bn,
        log2_block_m=_log2(bm),
        log2_block_n=_log2(bn),
        num_warps=warps,
        num_stages=stages,
        log2_programs=_log2(programs),
        waves=waves,
        last_wave_fill=programs / np.maximum(waves * sms, 1.0),
        pad_m=_pad_waste(q, bm),
        pad_n=_pad_waste(kv, bn),
        log2_key_blocks=_log2(key_blocks),
        smem_kib=2.0 * d * (bm + 2.0 * stages * bn) / 1024.0,
        values_per_thread=bm * (d + bn) / (32.0 * warps),
        log2_flops_per_program=_log2(4.0 * bm * bn * d * key_blocks),
        **{
            name: np.array([bool(c.get(key, False)) for c in configs], dtype=np.float64)
            for name, key in (
                ("tma", "TMA"),
                ("warp_specialize", "WARP_SPECIALIZE"),
                ("gluon", "GLUON"),
            )
        },
    )
    return out


# --- triton.bmm and triton.grouped_mm ----------------------------------------------------------
# triton.gemm's columns of one product's tile (m, n, k: an entry's for bmm, all groups' rows for
# grouped_mm), their tiles and waves counted over the whole launch, and each operator's own:
# the batch, a shared B, the grid's batch order and the persistent TMA kernel (bmm); the
# groups, the empty ones, the rows the groups' own edge tiles pad, and the group schedule
# (grouped_mm). Shapes of one operator share one model.
TRITON_BMM_NAMES = (
    *TRITON_NAMES,
    "log2_batch", "b_broadcast", "batch_major", "batch_tiles", "tma",
)  # fmt: skip
TRITON_GROUPED_NAMES = (
    *TRITON_NAMES,
    "log2_groups", "empty_groups", "largest_group_share", "group_tiles", "group_pad_m",
    "persistent_schedule", "programs_per_sm_knob", "tma",
)  # fmt: skip


def _rewave(out: dict[str, Column], tiles: Column) -> None:
    """Tiles, waves and the last wave's fill for ``tiles`` tiles in the launch."""
    waves = out["waves"] * tiles / np.maximum(out["tiles"], 1.0)
    last = waves - np.floor(waves)
    out["tiles"] = tiles
    out["log2_tiles"] = _log2(tiles)
    out["waves"] = waves
    out["last_wave_fill"] = np.where(last > 0, last, 1.0)


def _triton_bmm(workload: Workload, target: Target, configs: Sequence[Config]) -> dict[str, Column]:
    out = _triton(workload, target, configs)
    batch = float(workload.param("batch"))
    _rewave(out, out["tiles"] * batch)
    major = np.array([bool(c.get("BATCH_MAJOR", True)) for c in configs], dtype=np.float64)
    out["log2_batch"] = np.asarray(math.log2(batch), dtype=np.float64)
    out["b_broadcast"] = np.asarray(float(bool(workload.param("b_broadcast"))), dtype=np.float64)
    out["batch_major"] = major
    out["batch_tiles"] = out["tiles"]
    out["tma"] = np.array([bool(c.get("TMA", False)) for c in configs], dtype=np.float64)
    return out


def _triton_grouped(
    workload: Workload, target: Target, configs: Sequence[Config]
) -> dict[str, Column]:
    out = _triton(workload, target, configs)
    value = workload.param("group_sizes")
    sizes = np.asarray(value if isinstance(value, tuple) else (workload.m,), dtype=np.float64)
    bm = _knob(configs, "BLOCK_M", 64)
    bn = _knob(configs, "BLOCK_N", 64)
    rows_of_tiles = np.ceil(sizes[None, :] / bm[:, None]).sum(axis=1)
    tiles = rows_of_tiles * _ceil_div(float(workload.n), bn)
    _rewave(out, tiles)
    persistent = np.array([c.get("SCHEDULE") == "persistent" for c in configs], dtype=np.float64)
    out["log2_groups"] = np.asarray(math.log2(len(sizes)), dtype=np.float64)
    out["empty_groups"] = np.asarray(float((sizes == 0).mean()), dtype=np.float64)
    out["largest_group_share"] = np.asarray(float(sizes.max() / workload.m), dtype=np.float64)
    out["group_tiles"] = tiles
    out["group_pad_m"] = 1.0 - workload.m / np.maximum(rows_of_tiles * bm, 1.0)
    out["persistent_schedule"] = persistent
    out["programs_per_sm_knob"] = persistent * _knob(configs, "PROGRAMS", 1)
    out["tma"] = np.array([bool(c.get("TMA", False)) for c in configs], dtype=np.float64)
    return out


# --- blis.conv2d and triton.conv2d -------------------------------------------------------------
# The GEMM the kernel's loop nest runs (as tunehub.kernels.blis_conv.gemm_view has it; copied so
# this module reads no kernel code): nhwc one per group over the batch (M = N·OH·OW rows, capped
# at 65536), nchw one per image and group transposed (M = O/groups, N = OH·OW); blis.gemm's or
# triton.gemm's columns of it, and the convolution's own: batch, groups, depthwise, the filter's
# taps, stride and dilation, the layout, whether it is a plain (pointwise) GEMM, and for the CPU
# how evenly the units fill the threads. Shapes of conv2d share one model per template.
CONV_OWN_NAMES = (
    "log2_batch", "log2_groups", "depthwise", "taps", "stride", "dilated", "nhwc", "pointwise",
    "log2_channels_per_group",
)  # fmt: skip
# The depthwise path's knobs (blis_depthwise; 0 for implicit-GEMM configs): channels per unit
# in vectors, the micro-tile's width and accumulators (WB x CB vectors in nhwc, RR rows x WB
# vectors in nchw), and the rows per unit as a share of OH.
DEPTHWISE_NAMES = ("dw_cb_vectors", "dw_wb", "dw_accumulators", "dw_rb_share")
BLIS_CONV_NAMES = (*BLIS_NAMES, *CONV_OWN_NAMES, "unit_fill", *DEPTHWISE_NAMES)
TRITON_CONV_NAMES = (
    *TRITON_NAMES, *CONV_OWN_NAMES, "repack", "dw_block_rows", "dw_strip", "tma", "tma_useful",
    "tma_rows", "patch_flat", "patch_rows", "k_useful", "bmm_route",
)  # fmt: skip


def _conv_view(workload: Workload, *, cpu: bool) -> Workload:
    batch = int(workload.param("batch"))
    if workload.param("data_layout") == "nhwc" or not cpu:
        m, n = min(1 << 16, batch * workload.m), workload.n
    else:
        m, n = workload.n, workload.m
    return Workload(m=m, n=n, k=workload.k, dtype=workload.dtype)


def _conv_own(workload: Workload) -> dict[str, Column]:
    p: dict[str, Any] = dict(workload.params)
    groups = int(p["groups"])
    values = {
        "log2_batch": math.log2(int(p["batch"])),
        "log2_groups": math.log2(groups),
        "depthwise": float(groups > 1 and workload.n == 1),
        "taps": float(int(p["kernel_h"]) * int(p["kernel_w"])),
        "stride": float(max(int(p["stride_h"]), int(p["stride_w"]))),
        "dilated": float(max(int(p["dilation_h"]), int(p["dilation_w"])) > 1),
        "nhwc": float(p["data_layout"] == "nhwc"),
        "pointwise": float(
            int(p["kernel_h"]) * int(p["kernel_w"]) == 1
            and int(p["stride_h"]) * int(p["stride_w"]) == 1
            and int(p["pad_h"]) + int(p["pad_w"]) == 0
        ),
        "log2_channels_per_group": math.log2(int(p["in_channels"]) // groups),
    }
    return {name: np.asarray(value, dtype=np.float64) for name, value in values.items()}


def _blis_conv(workload: Workload, target: Target, configs: Sequence[Config]) -> dict[str, Column]:
    out = _blis(_conv_view(workload, cpu=True), target, configs)
    out.update(_conv_own(workload))
    # Units: one per GEMM (group; and image for nchw), split into row ranges until every
    # thread has one.
    batch, groups = int(workload.param("batch")), int(workload.param("groups"))
    problems = float(groups if workload.param("data_layout") == "nhwc" else batch * groups)
    threads = np.maximum(_knob(configs, "threads", 1), 1.0)
    units = problems * np.where(problems < threads, _ceil_div(threads, problems), 1.0)
    out["unit_fill"] = units / (_ceil_div(units, threads) * threads)
    # Depthwise configs (CB, WB, RB): units are (image, channel block or plane, row block).
    direct = np.array([("WB" in c) for c in configs], dtype=np.float64)
    nhwc = workload.param("data_layout") == "nhwc"
    lanes = np.array(
        [
            BLIS_VECTOR_BYTES.get(i, 16) / DTYPE_BYTES[workload.dtype]
            for i in _strings(configs, "ISA")
        ],
        dtype=np.float64,
    )
    cb, wb, rb = _knob(configs, "CB", 1), _knob(configs, "WB", 0), _knob(configs, "RB", 1)
    oh = float(Conv2d.output_hw(workload)[0])
    vectors = cb / lanes if nhwc else np.ones(len(configs))
    out["dw_cb_vectors"] = direct * vectors
    out["dw_wb"] = direct * wb
    out["dw_accumulators"] = direct * wb * (vectors if nhwc else _knob(configs, "RR", 1))
    out["dw_rb_share"] = direct * np.minimum(rb, oh) / oh
    if direct.any():
        out_channels = float(workload.param("out_channels"))
        blocks = _ceil_div(out_channels, cb) if nhwc else np.full(len(configs), out_channels)
        dw_units = batch * blocks * _ceil_div(oh, rb)
        fill = dw_units / (_ceil_div(dw_units, threads) * threads)
        out["unit_fill"] = np.where(direct > 0, fill, out["unit_fill"])
    return out


def _triton_conv(
    workload: Workload, target: Target, configs: Sequence[Config]
) -> dict[str, Column]:
    # A pointwise NCHW workload routed to triton.bmm (its configs carry BATCH_MAJOR): the
    # GEMM is each image's (O x H·W x C), its tiles counted over the images.
    bmm = bool(configs) and all("BATCH_MAJOR" in c for c in configs)
    if bmm:
        view = Workload(m=workload.n, n=workload.m, k=workload.k, dtype=workload.dtype)
        out = _triton(view, target, configs)
        _rewave(out, out["tiles"] * float(int(workload.param("batch"))))
    else:
        # A depthwise strip config's program covers BLOCK_M strips of STRIP pixels.
        pixels = [
            Config({**c.to_dict(), "BLOCK_M": int(c["BLOCK_M"]) * int(c["STRIP"])})
            if int(c.get("STRIP", 1)) > 1
            else c
            for c in configs
        ]
        out = _triton(_conv_view(workload, cpu=False), target, pixels)
        _rewave(out, out["tiles"] * float(workload.param("groups")))
    out["bmm_route"] = np.asarray(float(bmm), dtype=np.float64)
    out.update(_conv_own(workload))
    # NCHW read from channels-last copies made in the call (REPACK).
    out["repack"] = np.array([bool(c.get("REPACK", False)) for c in configs], dtype=np.float64)
    # The depthwise kernel's rows a block (BLOCK_M / TILE_W; 0 for implicit-GEMM configs and
    # strips), and its strips' pixels (STRIP; 0 for blocks of rows, which load a tap's window
    # once per pixel where a strip loads each input pixel once).
    tma = np.array([bool(c.get("TMA", False)) for c in configs], dtype=np.float64)
    direct = float(int(workload.param("groups")) == int(workload.param("in_channels")))
    strip = _knob(configs, "STRIP", 1)
    out["dw_block_rows"] = (
        direct
        * np.array(
            [int(c["BLOCK_M"]) / int(c["TILE_W"]) if "TILE_W" in c else 0.0 for c in configs],
            dtype=np.float64,
        )
        * (strip == 1)
    )
    out["dw_strip"] = direct * np.where(strip > 1, strip, 0.0)
    # The TMA kernel's box: the share of its pixels that are real output, and its pixel rows
    # (TILE_H x images; one row feeds the tensor cores from shared memory, more are reshaped
    # in registers first).
    out["tma"] = tma
    out["tma_useful"] = tma * _tma_useful(workload, configs)
    out["tma_rows"] = tma * np.array(
        [int(c["BLOCK_M"]) / int(c.get("TILE_W", 1)) for c in configs], dtype=np.float64
    )
    # The K loop's order (PATCH), and the share of its columns that are real patch: a tap's
    # channels padded to BLOCK_K, the whole patch padded to it, or a filter row of KW pixels
    # of C rounded up to a power of two, padded to it.
    from tunehub.kernels.triton_conv import rows_channels

    order = _strings(configs, "PATCH", "tap")
    flat = np.array([o == "flat" for o in order], dtype=np.float64)
    rows = np.array([o == "rows" for o in order], dtype=np.float64)
    icg = int(workload.param("in_channels")) // int(workload.param("groups"))
    kw = float(int(workload.param("kernel_w")))
    patch = float(icg) * float(int(workload.param("kernel_h"))) * kw
    bk = _knob(configs, "BLOCK_K", 16)
    row = kw * float(rows_channels(icg))
    out["patch_flat"] = flat
    out["patch_rows"] = rows
    out["k_useful"] = np.select(
        [flat > 0, rows > 0],
        [patch / (_ceil_div(patch, bk) * bk), kw * icg / (_ceil_div(row, bk) * bk)],
        float(icg) / (_ceil_div(float(icg), bk) * bk),
    )
    return out


def _tma_useful(workload: Workload, configs: Sequence[Config]) -> Column:
    """Each TMA config's share of real output in its box (0 for the others), computed once
    per distinct box: a space holds thousands of configs over a dozen boxes."""
    from tunehub.kernels.triton_conv import tma_useful

    shares: dict[tuple[int, int, int], float] = {}
    column = np.zeros(len(configs), dtype=np.float64)
    for i, c in enumerate(configs):
        if c.get("TMA", False) and "TILE_H" in c:
            box = (int(c["BLOCK_M"]), int(c["TILE_H"]), int(c["TILE_W"]))
            if box not in shares:
                bm, th, tw = box
                shares[box] = tma_useful(workload, bm // (th * tw), th, tw)
            column[i] = shares[box]
    return column


# --- generic -------------------------------------------------------------------------------
def generic_feature_set(template: str, knob_names: Sequence[str]) -> FeatureSet:
    """Features for a template with no set of its own: the workload, then each knob's value
    (numbers as they are, strings by a stable hash into [0, 1))."""
    knobs = tuple(sorted(knob_names))

    def compute(workload: Workload, target: Target, configs: Sequence[Config]) -> dict[str, Column]:
        out = _workload_columns(workload)
        for name in knobs:
            values = [c.get(name, 0) for c in configs]
            out[f"knob_{name}"] = np.array(
                [
                    (zlib.crc32(v.encode()) % 10007) / 10007.0 if isinstance(v, str) else float(v)
                    for v in values
                ],
                dtype=np.float64,
            )
        return out

    return FeatureSet(
        template=f"generic:{template}",
        version=1,
        names=(*WORKLOAD_NAMES, *(f"knob_{k}" for k in knobs)),
        compute=compute,
    )


FEATURE_SETS: dict[str, FeatureSet] = {
    # Consensus, from leave-one-workload-out on the replay datasets (benchmarks/
    # search_efficiency.py, zero-trial picks): on the 7 CPU datasets the medoid of the top 20
    # reached 0.886 of the best (geomean) and the single argmax 0.774 (it overrates corners:
    # KC=32 for K=16384); on the 21 GPU datasets the argmax reached 0.967 and the medoid of
    # the top 20 0.880, the centre of a top 20 that mixes variants being no good tile at all.
    "blis.gemm": FeatureSet("blis.gemm", 1, BLIS_NAMES, _blis, consensus=20),
    # 3: the ``splitk`` variant's column and ``kernel_launches``. 4: ``tiled`` split-K's
    # bytes count all SPLIT_K partials, written and read back (3 counted SPLIT_K - 1, and
    # ranked a two-kernel split over the one-kernel one on 128x128x32768: 0.81 of the best,
    # 1.0 with 4). 5: the ``splitk_atomic`` variant's column, and its bytes (SPLIT_K adds
    # into one C, read and zeroed once). 6: ``PAD_K`` costs one launch (its copies became one).
    # The default margin: on the 21 H100 datasets (leave-one-out) the time model rated the
    # analytical default of square_1024 4.3% slower than its argmax, which measured 0.77 of
    # the default (the best config there); a margin of 5% takes the default there and costs
    # 0.4-4% on four datasets where the argmax was predicted 1-5% faster and was
    # (benchmarks/notes/gpu_kernels_v2.md, "PAD_K in one launch").
    "triton.gemm": FeatureSet(
        "triton.gemm", 6, TRITON_NAMES, _triton, consensus=1, default_margin=0.05
    ),
    "blis.bmm": FeatureSet("blis.bmm", 1, BMM_NAMES, _blis_bmm, consensus=20),
    # 2: the loads' columns (tma, warp_specialize, gluon).
    "triton.attention": FeatureSet("triton.attention", 2, ATTENTION_NAMES, _attention),
    # 2: the persistent TMA kernel's column (``tma``).
    "triton.bmm": FeatureSet("triton.bmm", 2, TRITON_BMM_NAMES, _triton_bmm, consensus=1),
    "triton.grouped_mm": FeatureSet(
        "triton.grouped_mm", 2, TRITON_GROUPED_NAMES, _triton_grouped, consensus=1
    ),
    # 2: the depthwise path's knobs (DEPTHWISE_NAMES) and its units' fill.
    "blis.conv2d": FeatureSet("blis.conv2d", 2, BLIS_CONV_NAMES, _blis_conv, consensus=20),
    # 5: pointwise NCHW workloads on triton.bmm's configs (``bmm_route``, their GEMM's tiles).
    # 6: the depthwise kernel's strips (``dw_strip``).
    "triton.conv2d": FeatureSet("triton.conv2d", 6, TRITON_CONV_NAMES, _triton_conv, consensus=1),
}


def feature_set(template: str, knob_names: Sequence[str] = ()) -> FeatureSet:
    """The template's feature set, or the generic one over ``knob_names``."""
    found = FEATURE_SETS.get(template)
    return found if found is not None else generic_feature_set(template, knob_names)


def register_feature_set(features: FeatureSet) -> FeatureSet:
    """Offer ``features`` for its template (a template plugin calls this at import)."""
    FEATURE_SETS[features.template] = features
    return features
