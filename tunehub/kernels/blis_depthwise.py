"""blis.conv2d's depthwise path: a direct convolution vectorised over channels (NHWC) or along
the output row (NCHW), for ``groups == in_channels`` (one input channel per group; any channel
multiplier ``out_channels / groups``).

As implicit GEMM a depthwise convolution is one GEMM per channel with a single output column
(N = multiplier, K = KH·KW): a register tile of MR x NR computes one useful column in NR, and
the packing costs as much as the arithmetic. This path computes it directly.

A unit of work is one image, one block of channels and a block of output rows. Its input rows
(with their halo) are copied once into a zero-padded buffer, so the inner loop has no bounds
checks, and stride, dilation and multiplier are handled by the copy:

- ``nhwc``: the buffer holds the block's ``CB`` channels of every padded input pixel (output
  channel o reads input channel o / multiplier: the copy repeats each channel that many
  times), so one aligned vector load is ``VL`` channels of one pixel. A micro-tile is ``WB``
  output pixels of one row x ``CB`` channels in ``WB·CB/VL`` accumulators; for each filter
  row, the ``KW·CB/VL`` filter vectors are loaded once and each input pixel the tile touches
  is loaded once and used by every (pixel, tap) that reads it (stride 1, 7 taps, WB = 8: 14
  loads for 56 FMAs). The filter's width, stride and dilation along W are compile-time, so
  that reuse is unrolled.
- ``nchw``: one output channel's plane; the buffer holds its input rows split by column
  phase (column ``iw`` goes to phase ``iw % SW``), so the taps of a strided filter read
  contiguous runs too. A micro-tile is ``WB`` vectors along one output row; each tap is one
  broadcast weight and one unaligned load per vector.

The last micro-tile of a row is moved back to end at the row's end (it recomputes a few
outputs and writes the same values), so no row needs a masked tail unless it is narrower than
one tile.

Knobs: ``ISA``, ``CB`` (channels per unit: 1-4 vectors in nhwc, 1 in nchw), ``WB`` (output
pixels per micro-tile in nhwc, vectors in nchw), ``RB`` (output rows per unit: with CB, the
size of the padded buffer, and how many units the threads share) and ``threads``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tunehub.core import Config, Target, Workload
from tunehub.kernels.blis_codegen import (
    _TIMER,
    ABI_VERSION,
    C_TYPES,
    ELEMENT_BYTES,
    ISA_VECTOR_BYTES,
)
from tunehub.kernels.conv2d_reference import conv_dims, is_nhwc
from tunehub.kernels.space import Knob, KnobConstraint, SearchSpace

# Knob values (the space keeps those that fit the workload and the target's registers).
CB_VECTORS = (1, 2, 3, 4)
WB_NHWC = (1, 2, 3, 4, 6, 7, 8, 10, 12, 14, 16, 20, 24, 28)
WB_NCHW = (1, 2, 3, 4, 6, 8, 12)
RB_LADDER = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_ACCUMULATORS = 8
DEPTHWISE_KNOBS = ("ISA", "CB", "WB", "RR", "RB", "threads")
RR_NCHW = (1, 2, 3, 4, 6, 8)


def vector_length(isa: str, dtype: str) -> int:
    return ISA_VECTOR_BYTES[isa] // ELEMENT_BYTES[dtype]


@dataclass(frozen=True)
class DepthwiseParams:
    """Everything the generated depthwise source depends on: the knobs, the dtype and layout,
    and the filter's width, stride and dilation along W (unrolled). The rest of the shape is
    set per call."""

    dtype: str
    isa: str
    nhwc: bool
    cb: int
    wb: int
    rb: int
    threads: int
    kernel_w: int
    stride_w: int
    dilation_w: int
    kernel_h: int
    stride_h: int
    dilation_h: int
    rr: int = 1
    epilogue: str = "none"

    def __post_init__(self) -> None:
        problem = self.problem()
        if problem:
            raise ValueError(problem)

    @property
    def vl(self) -> int:
        return vector_length(self.isa, self.dtype)

    def problem(self) -> str | None:
        if self.dtype not in C_TYPES:
            return f"unsupported dtype {self.dtype!r}"
        if self.isa not in ISA_VECTOR_BYTES:
            return f"unknown ISA {self.isa!r}"
        for name in ("cb", "wb", "rr", "rb", "threads", "kernel_w", "stride_w", "dilation_w",
                     "kernel_h", "stride_h", "dilation_h"):  # fmt: skip
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                return f"{name.upper()} must be a positive integer, got {value!r}"
        if self.nhwc and self.cb % self.vl:
            return f"CB={self.cb} is not a multiple of the {self.isa} vector length {self.vl}"
        if not self.nhwc and self.cb != 1:
            return f"CB must be 1 for nchw (one plane per unit), got {self.cb}"
        if self.nhwc and self.rr != 1:
            return f"RR must be 1 for nhwc (a micro-tile is one output row), got {self.rr}"
        return None

    def accumulators(self) -> int:
        return self.wb * (self.cb // self.vl if self.nhwc else self.rr)


def depthwise_params(workload: Workload, config: Config) -> DepthwiseParams:
    missing = [k for k in DEPTHWISE_KNOBS if k not in config]
    if missing:
        raise ValueError(f"depthwise config lacks {', '.join(missing)}")
    d = conv_dims(workload)
    return DepthwiseParams(
        dtype=workload.dtype,
        isa=str(config["ISA"]),
        nhwc=is_nhwc(workload),
        cb=config.typed_get("CB", 0),
        wb=config.typed_get("WB", 0),
        rb=config.typed_get("RB", 0),
        threads=config.typed_get("threads", 0),
        kernel_w=d["kernel_w"],
        stride_w=d["stride_w"],
        dilation_w=d["dilation_w"],
        kernel_h=d["kernel_h"],
        stride_h=d["stride_h"],
        dilation_h=d["dilation_h"],
        rr=config.typed_get("RR", 0),
    )


# --- the space ---------------------------------------------------------------------------------
class DepthwiseSpace:
    """The depthwise knobs for one workload and target, and the analytical point.

    - CB (nhwc): the padded buffer's pixel is CB channels; more than one vector per pixel
      multiplies the accumulators (WB·CB/VL of them) and the filter vectors per row.
    - WB: accumulators plus one input vector fit the registers (the filter vectors may be
      re-read from L1); the default takes the widest tile that also keeps a filter row in
      registers, scored by the outputs recomputed at the row's end.
    - RR (nchw): output rows a micro-tile (RR x WB vectors of accumulators): a buffer row
      loaded once serves every (output row, filter row) pair that reads it.
    - RB: the padded buffer (input rows of RB output rows plus the halo, CB channels, padded
      width) is kept within L2/2 by the default.
    """

    def __init__(self, workload: Workload, target: Target, isas: tuple[str, ...],
                 registers: dict[str, int]) -> None:  # fmt: skip
        self.workload = workload
        self.target = target
        self.isas = isas
        self.registers = registers
        self.d = conv_dims(workload)
        self.nhwc = is_nhwc(workload)
        self.elem = ELEMENT_BYTES[workload.dtype]
        cores = max(1, target.cores)
        self.threads = tuple(sorted({1, cores}))
        oh = self.d["oh"]
        self.rbs = tuple(sorted({r for r in RB_LADDER if r < oh} | {oh}))
        self.rrs = (1,) if self.nhwc else tuple(r for r in RR_NCHW if r <= oh)

    def _cbs(self, isa: str) -> tuple[int, ...]:
        if not self.nhwc:
            return (1,)
        vl = vector_length(isa, self.workload.dtype)
        channels = math.ceil(self.d["out_channels"] / vl)
        return tuple(vl * v for v in CB_VECTORS if v <= max(1, channels))

    def _fits(self, isa: str, cb: int, wb: int, rr: int) -> bool:
        vectors = cb // vector_length(isa, self.workload.dtype) if self.nhwc else rr
        return wb * vectors + 1 <= self.registers[isa]

    def space(self) -> SearchSpace:
        cbs = sorted({cb for isa in self.isas for cb in self._cbs(isa)})
        wbs = WB_NHWC if self.nhwc else WB_NCHW
        allowed = {isa: set(self._cbs(isa)) for isa in self.isas}
        knobs = (
            Knob("ISA", self.isas),
            Knob("CB", tuple(cbs)),
            Knob("WB", wbs),
            Knob("RR", self.rrs),
            Knob("RB", self.rbs),
            Knob("threads", self.threads),
        )
        constraints = (
            KnobConstraint(("ISA", "CB"), lambda c: c["CB"] in allowed[str(c["ISA"])]),
            KnobConstraint(
                ("ISA", "CB", "WB", "RR"),
                lambda c: self._fits(str(c["ISA"]), int(c["CB"]), int(c["WB"]), int(c["RR"])),
            ),
        )
        return SearchSpace(knobs=knobs, constraints=constraints)

    def buffer_bytes(self, cb: int, rb: int) -> int:
        d = self.d
        rows = (rb - 1) * d["stride_h"] + (d["kernel_h"] - 1) * d["dilation_h"] + 1
        width = (d["ow"] - 1) * d["stride_w"] + (d["kernel_w"] - 1) * d["dilation_w"] + 1
        return rows * width * cb * self.elem

    def default(self) -> Config:
        isa = self.isas[0]
        vl = vector_length(isa, self.workload.dtype)
        regs = self.registers[isa]
        ow, kw = self.d["ow"], self.d["kernel_w"]
        cb = self._cbs(isa)[0]
        vectors = cb // vl if self.nhwc else 1
        wbs = WB_NHWC if self.nhwc else WB_NCHW
        # A filter row in registers beside the tile (nhwc), else one broadcast (nchw), and
        # at most DEFAULT_ACCUMULATORS (measured on Zen 4, 7x7 at 56x56x96 nhwc: WB 7-8
        # ran 1.2x WB 14 and 1.5x WB 16, which the registers would also hold).
        spare = kw * vectors + 1 if self.nhwc else 2
        pixels = vl if not self.nhwc else 1
        fits = [
            w
            for w in wbs
            if w * vectors + spare <= regs
            and w * vectors <= DEFAULT_ACCUMULATORS
            and w * pixels <= max(ow, pixels)
        ]
        fits = fits or [1]

        def waste(wb: int) -> float:
            span = wb * pixels
            tiles = math.ceil(ow / span)
            # recomputed outputs per useful one, plus the loads per FMA of a narrow tile
            return tiles * span / ow + 1.0 / wb

        wb = min(fits, key=waste)
        rr = 1
        if not self.nhwc:
            # nchw: one vector and as many output rows as keep the accumulators and a filter
            # column (KH broadcasts) in the registers (7x7 at 56x56x96 on Zen 4: 8 rows x 1
            # vector ran 1.8x 1 row x 2 vectors, 1.37x 4 rows x 1 vector).
            kh = self.d["kernel_h"]
            wb = 1
            rr = max(r for r in self.rrs if r <= DEFAULT_ACCUMULATORS and r + kh + 1 <= regs)
        l2 = self.target.l2_bytes or (1 << 20)
        rb = max([r for r in self.rbs if self.buffer_bytes(cb, r) <= l2 // 2] or [self.rbs[0]])
        return Config({"ISA": isa, "CB": cb, "WB": wb, "RR": rr, "RB": rb, "threads": 1})

    def seeds(self) -> list[Config]:
        base = self.default()
        space = self.space()
        seeds: list[Config] = []
        variants = [base]
        if self.nhwc and len(self._cbs(str(base["ISA"]))) > 1:
            variants.append(base.replace(CB=self._cbs(str(base["ISA"]))[1], WB=4))
        for config in variants:
            for threads in sorted(self.threads, reverse=True):
                seed = config.replace(threads=threads)
                if seed not in seeds and space.is_valid(seed):
                    seeds.append(seed)
        return seeds


# --- the generated C -----------------------------------------------------------------------------
def _nhwc_tile(p: DepthwiseParams, width: int) -> str:
    """tile_<width>: ``width`` output pixels x CB channels from the padded buffer."""
    vl, cv = p.vl, p.cb // p.vl
    kw, sw, dw = p.kernel_w, p.stride_w, p.dilation_w
    lines = [f"V a{j}_{v} = {{0}};" for j in range(width) for v in range(cv)]
    body = ["const T *wk = wb + kh * (KW * CB);", "const T *in = row + kh * kh_step;"]
    body += [
        f"V w{t}_{v} = *(const V *)(wk + {t * p.cb + v * vl});"
        for t in range(kw)
        for v in range(cv)
    ]
    uses: dict[int, list[tuple[int, int]]] = {}
    for j in range(width):
        for t in range(kw):
            uses.setdefault(j * sw + t * dw, []).append((j, t))
    for col in sorted(uses):
        for v in range(cv):
            body.append(f"{{ V x = *(const V *)(in + {col * p.cb + v * vl});")
            body += [f"  a{j}_{v} += x * w{t}_{v};" for j, t in uses[col]]
            body.append("}")
    full = [
        f"*(VU *)(out + {j} * ldo + {v * vl}) = a{j}_{v};" for j in range(width) for v in range(cv)
    ]
    part = []
    for j in range(width):
        part += [f"*(V *)(tmp + {v * vl}) = a{j}_{v};" for v in range(cv)]
        part.append(f"memcpy(out + {j} * ldo, tmp, sizeof(T) * (size_t)nch);")
    nl = "\n    "
    nl2 = "\n        "
    return f"""
static inline __attribute__((always_inline)) void tile_{width}(
    const T *restrict row, const T *restrict wb, int64_t kh_n, int64_t kh_step, T *out,
    int64_t ldo, int64_t nch)
{{
    {nl.join(lines)}
    for (int64_t kh = 0; kh < kh_n; ++kh) {{
        {nl2.join(body)}
    }}
    if (nch == CB) {{
        {nl2.join(full)}
    }} else {{
        T tmp[CB] __attribute__((aligned(64)));
        {nl2.join(part)}
    }}
}}
"""


_NHWC_UNIT = r"""
/* One unit: image b, channels o0 .. o0+CB, output rows r0 .. r1. */
static int dw_unit(const conv_t *cv, const T *x, const T *wt, T *y, int64_t b, int64_t o0,
                   int64_t r0, int64_t r1)
{
    int64_t mult = cv->oc / cv->groups, taps = cv->kh * KW;
    int64_t nch = cv->oc - o0 < CB ? cv->oc - o0 : CB;
    int64_t wp = (cv->ow - 1) * SW + (KW - 1) * DW + 1;
    int64_t rows = (r1 - 1 - r0) * cv->sh + (cv->kh - 1) * cv->dh + 1;
    T *buf = scratch((size_t)rows * wp * CB + (size_t)taps * CB);
    if (!buf) return -1;
    T *wb = buf + (size_t)rows * wp * CB;
    for (int64_t t = 0; t < taps; ++t)
        for (int64_t i = 0; i < CB; ++i) wb[t * CB + i] = i < nch ? wt[(o0 + i) * taps + t] : 0;
    int64_t ih0 = r0 * cv->sh - cv->ph;
    for (int64_t r = 0; r < rows; ++r) {
        int64_t ih = ih0 + r;
        T *dst = buf + (size_t)r * wp * CB;
        if (ih < 0 || ih >= cv->h) {
            memset(dst, 0, sizeof(T) * (size_t)(wp * CB));
            continue;
        }
        const T *src = x + ((b * cv->h + ih) * cv->w) * cv->ic;
        for (int64_t q = 0; q < wp; ++q) {
            int64_t iw = q - cv->pw;
            T *d = dst + q * CB;
            if (iw < 0 || iw >= cv->w) {
                memset(d, 0, sizeof(T) * CB);
            } else if (mult == 1 && nch == CB) {
                memcpy(d, src + iw * cv->ic + o0, sizeof(T) * CB);
            } else {
                const T *s = src + iw * cv->ic;
                for (int64_t i = 0; i < CB; ++i) d[i] = i < nch ? s[(o0 + i) / mult] : 0;
            }
        }
    }
    int64_t kh_step = cv->dh * wp * CB, ldo = cv->oc;
    for (int64_t oh = r0; oh < r1; ++oh) {
        const T *row = buf + (oh - r0) * cv->sh * wp * CB;
        T *yrow = y + ((b * cv->oh + oh) * cv->ow) * cv->oc + o0;
        if (cv->ow >= WB) {
            for (int64_t ow0 = 0;; ow0 += WB) {
                if (ow0 + WB > cv->ow) ow0 = cv->ow - WB;
                tile_WB(row + ow0 * SW * CB, wb, cv->kh, kh_step, yrow + ow0 * ldo, ldo, nch);
                if (ow0 + WB == cv->ow) break;
            }
        } else {
            for (int64_t ow0 = 0; ow0 < cv->ow; ++ow0)
                tile_1(row + ow0 * SW * CB, wb, cv->kh, kh_step, yrow + ow0 * ldo, ldo, nch);
        }
    }
    return 0;
}
#define BLOCKS(cv) (((cv)->oc + CB - 1) / CB)
#define BLOCK_START(o) ((o) * CB)
"""


def _nchw_tile(p: DepthwiseParams, rows: int, vectors: int) -> str:
    """tile_<rows>_<vectors>: ``rows`` output rows x ``vectors`` x VL pixels of one plane.
    Filter column by filter column (unrolled): its KH weights are broadcast once, and each
    buffer row the tile reads is loaded once for every (output row, filter row) that reads
    it (KH, SH, DH are compiled in)."""
    vl = p.vl
    kh_n, sh, dh = p.kernel_h, p.stride_h, p.dilation_h
    lines = [f"V a{i}_{v} = {{0}};" for i in range(rows) for v in range(vectors)]
    uses: dict[int, list[tuple[int, int]]] = {}
    for i in range(rows):
        for kh in range(kh_n):
            uses.setdefault(i * sh + kh * dh, []).append((i, kh))
    body = []
    for t in range(p.kernel_w):
        phase, off = (t * p.dilation_w) % p.stride_w, (t * p.dilation_w) // p.stride_w
        body.append(f"{{ const T *s = row + {phase} * phase_step + {off};")
        body += [f"  V w{kh} = (V){{0}} + wt[{kh * p.kernel_w + t}];" for kh in range(kh_n)]
        for r in sorted(uses):
            for v in range(vectors):
                body.append(f"  {{ V x = *(const VU *)(s + {r} * lp + {v * vl});")
                body += [f"    a{i}_{v} += x * w{kh};" for i, kh in uses[r]]
                body.append("  }")
        body.append("}")
    stores = [
        f"*(VU *)(out + {i} * ldo + {v * vl}) = a{i}_{v};"
        for i in range(rows)
        for v in range(vectors)
    ]
    nl = "\n    "
    return f"""
static inline __attribute__((always_inline)) void tile_{rows}_{vectors}(
    const T *restrict row, const T *restrict wt, int64_t lp, int64_t phase_step, T *out,
    int64_t ldo)
{{
    {nl.join(lines)}
    {nl.join(body)}
    {nl.join(stores)}
}}
"""


def _nchw_rows(rows: int) -> str:
    """row_group_<rows>: ``rows`` output rows of a plane, tile by tile along them (the last
    tile moved back to end at the row's end; rows narrower than a vector through a buffer)."""
    return f"""
static void row_group_{rows}(const T *row, const T *w, int64_t lp, int64_t phase_step,
                           T *yrow, int64_t ow)
{{
    int64_t span = WB * VL;
    if (ow >= span) {{
        for (int64_t ow0 = 0;; ow0 += span) {{
            if (ow0 + span > ow) ow0 = ow - span;
            tile_{rows}_WB(row + ow0, w, lp, phase_step, yrow + ow0, ow);
            if (ow0 + span == ow) break;
        }}
    }} else if (ow >= VL) {{
        for (int64_t ow0 = 0;; ow0 += VL) {{
            if (ow0 + VL > ow) ow0 = ow - VL;
            tile_{rows}_1(row + ow0, w, lp, phase_step, yrow + ow0, ow);
            if (ow0 + VL == ow) break;
        }}
    }} else {{
        T tmp[{rows} * VL] __attribute__((aligned(64)));
        tile_{rows}_1(row, w, lp, phase_step, tmp, VL);
        for (int64_t i = 0; i < {rows}; ++i)
            memcpy(yrow + i * ow, tmp + i * VL, sizeof(T) * (size_t)ow);
    }}
}}
"""


_NCHW_UNIT = r"""
/* One unit: image b, output channel o, output rows r0 .. r1. */
static int dw_unit(const conv_t *cv, const T *x, const T *wt, T *y, int64_t b, int64_t o,
                   int64_t r0, int64_t r1)
{
    int64_t mult = cv->oc / cv->groups, taps = KH * KW;
    int64_t owr = cv->ow > VL ? cv->ow : VL;
    int64_t lp = owr + ((KW - 1) * DW) / SW + 1;
    int64_t rows = (r1 - 1 - r0) * SH + (KH - 1) * DH + 1;
    T *buf = scratch((size_t)SW * rows * lp);
    if (!buf) return -1;
    const T *plane = x + (b * cv->ic + o / mult) * cv->h * cv->w;
    int64_t ih0 = r0 * SH - cv->ph;
    for (int64_t p = 0; p < SW; ++p)
        for (int64_t r = 0; r < rows; ++r) {
            int64_t ih = ih0 + r;
            T *dst = buf + (p * rows + r) * lp;
            if (ih < 0 || ih >= cv->h) {
                memset(dst, 0, sizeof(T) * (size_t)lp);
                continue;
            }
            const T *src = plane + ih * cv->w;
            if (SW == 1) {
                /* column t is iw = t - pw */
                int64_t lo = cv->pw < lp ? cv->pw : lp;
                int64_t hi = cv->pw + cv->w < lp ? cv->pw + cv->w : lp;
                memset(dst, 0, sizeof(T) * (size_t)lo);
                if (hi > lo) memcpy(dst + lo, src + (lo - cv->pw), sizeof(T) * (size_t)(hi - lo));
                if (hi < lp) memset(dst + hi, 0, sizeof(T) * (size_t)(lp - (hi > lo ? hi : lo)));
            } else {
                for (int64_t t = 0; t < lp; ++t) {
                    int64_t iw = t * SW + p - cv->pw;
                    dst[t] = iw >= 0 && iw < cv->w ? src[iw] : 0;
                }
            }
        }
    const T *w = wt + o * taps;
    int64_t phase_step = rows * lp, oh = r0;
    for (; oh + RR <= r1; oh += RR)
        row_group_RR(buf + (oh - r0) * SH * lp, w, lp, phase_step,
                     y + ((b * cv->oc + o) * cv->oh + oh) * cv->ow, cv->ow);
    for (; oh < r1; ++oh)
        row_group_1(buf + (oh - r0) * SH * lp, w, lp, phase_step,
                    y + ((b * cv->oc + o) * cv->oh + oh) * cv->ow, cv->ow);
    return 0;
}
#define BLOCKS(cv) ((cv)->oc)
#define BLOCK_START(o) (o)
"""

_DRIVER = r"""
/* Y = conv2d(X, W) for the shape tunehub_conv_shape set: units (image, channel block, row
   block) split statically over the threads; 0, or -1 when a buffer cannot be allocated. */
int tunehub_conv(const T *x, const T *wt, T *y)
{
    const conv_t *cv = &g_cv;
    int64_t blocks = BLOCKS(cv), rblocks = (cv->oh + RB - 1) / RB;
    int64_t units = cv->batch * blocks * rblocks;
    int failed = 0;
#if THREADS > 1
    #pragma omp parallel for num_threads(THREADS) schedule(static) reduction(|:failed)
#endif
    for (int64_t u = 0; u < units; ++u) {
        int64_t rb = u % rblocks, blk = u / rblocks % blocks, b = u / rblocks / blocks;
        int64_t r0 = rb * RB, r1 = r0 + RB < cv->oh ? r0 + RB : cv->oh;
        failed |= dw_unit(cv, x, wt, y, b, BLOCK_START(blk), r0, r1) != 0;
    }
    return failed ? -1 : 0;
}

/* What tunehub_bench times: one whole convolution (A, B, C are X, W, Y). */
int tunehub_gemm(int64_t m, int64_t n, int64_t k, const T *a, int64_t lda, const T *b,
                 int64_t ldb, T *c, int64_t ldc, const T *bias)
{
    (void)m; (void)n; (void)k; (void)lda; (void)ldb; (void)ldc; (void)bias;
    return tunehub_conv(a, b, c);
}
"""

_HEAD = r"""
typedef struct {
    int64_t batch, ic, oc, h, w, kh, kw, sh, sw, ph, pw, dh, dw, groups, oh, ow;
} conv_t;
static conv_t g_cv;

void tunehub_conv_shape(const int64_t *s)
{
    conv_t c = {s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8], s[9], s[10], s[11],
                s[12], s[13], s[14], s[15]};
    g_cv = c;
}

/* Each thread's padded input (and filter) buffer, grown as a unit needs; tl_b is unused
   (tunehub_release frees both, as blis.gemm's buffers). */
static __thread T *tl_a;
static __thread T *tl_b;
static __thread size_t tl_a_cap;

static T *scratch(size_t elems)
{
    if (elems > tl_a_cap) {
        free(tl_a);
        tl_a = 0;
        tl_a_cap = 0;
        if (posix_memalign((void **)&tl_a, 64, sizeof(T) * elems)) return tl_a = 0;
        tl_a_cap = elems;
    }
    return tl_a;
}
"""


def generate_depthwise_source(p: DepthwiseParams) -> str:
    """The C translation unit of blis.conv2d's depthwise path for ``p``: the same entry points
    as the implicit-GEMM unit (``tunehub_conv_shape``, ``tunehub_conv``, ``tunehub_bench``,
    ``tunehub_release``, ``tunehub_abi_version``)."""
    headers = ["pthread.h", "sched.h", "stdint.h", "stdlib.h", "string.h", "time.h"]
    if p.threads > 1:
        headers.append("omp.h")
    vb = ISA_VECTOR_BYTES[p.isa]
    layout = "nhwc" if p.nhwc else "nchw"
    parts = [
        f"/* generated by tunehub (blis.conv2d depthwise {layout}): {p.dtype} {p.isa} "
        f"CB={p.cb} WB={p.wb} RR={p.rr} RB={p.rb} threads={p.threads} KH={p.kernel_h} "
        f"KW={p.kernel_w} SH={p.stride_h} SW={p.stride_w} DH={p.dilation_h} "
        f"DW={p.dilation_w} */",
        "#define _GNU_SOURCE",
        *(f"#include <{h}>" for h in headers),
        f"typedef {C_TYPES[p.dtype]} T;",
        f"typedef T V __attribute__((vector_size({vb})));",
        f"typedef T VU __attribute__((vector_size({vb}), aligned({ELEMENT_BYTES[p.dtype]}),"
        " may_alias));",
        f"#define VL {p.vl}",
        f"#define CB {p.cb}",
        f"#define WB {p.wb}",
        f"#define RB {p.rb}",
        f"#define KW {p.kernel_w}",
        f"#define SW {p.stride_w}",
        f"#define DW {p.dilation_w}",
        f"#define KH {p.kernel_h}",
        f"#define SH {p.stride_h}",
        f"#define DH {p.dilation_h}",
        f"#define RR {p.rr}",
        f"#define THREADS {p.threads}",
        f"#define ABI_VERSION {ABI_VERSION}",
        _HEAD,
    ]
    if p.nhwc:
        parts += [_nhwc_tile(p, w) for w in sorted({1, p.wb})]
        parts.append(f"#define tile_WB tile_{p.wb}")
        parts.append(_NHWC_UNIT)
    else:
        for rows in sorted({1, p.rr}):
            parts += [_nchw_tile(p, rows, v) for v in sorted({1, p.wb})]
            parts.append(f"#define tile_{rows}_WB tile_{rows}_{p.wb}")
            parts.append(_nchw_rows(rows))
        parts.append(f"#define row_group_RR row_group_{p.rr}")
        parts.append(_NCHW_UNIT)
    parts.append(_DRIVER)
    timer = _TIMER.replace("tl_a = 0;", "tl_a = 0;\n        tl_a_cap = 0;")
    parts.append(timer)
    return "\n".join(parts) + "\n"
