"""The ``blis.conv2d`` template: 2-D convolution on CPUs as implicit GEMM over the blis.gemm kernel.

The loop nest, blocking, packing buffers and micro-kernel are blis.gemm's (its knobs, its
generated C: ``blis_codegen``); what changes is where the panels come from. Nothing is
unfolded into memory (no im2col): the packing routines gather them from the image.

- ``nhwc``: one GEMM per group over the whole batch, C[N·OH·OW, O/groups] = patches @ filters,
  whose rows are the output's rows (ldc = O). The A panel is gathered from the input: each
  MR-row micro-panel walks k = (kh, kw, c), a run of channels contiguous in the input for
  each (kh, kw), transposed into the panel eight rows at a time in AVX2 registers (rows in
  the padding read a zero row). B is the group's filters (O, KH, KW, C/groups: k-contiguous
  rows), packed transposed.
- ``nchw``: one GEMM per image and group, C[O/groups, OH·OW] = filters @ patchesᵀ, whose rows
  are the output's channel planes (ldc = OH·OW). A is the filters (O, C/groups·KH·KW,
  row-major: blis.gemm's own pack), B is gathered from the image: each k = (c, kh, kw) row
  of a micro-panel is NR output pixels, copied as one run where they lie on one output row
  inside the image, else one by one with the padding as zeros.
- A 1x1 filter with stride 1 and no padding is a plain GEMM on the input as it is stored:
  blis.gemm's packing reads it directly.

- Depthwise (``groups == in_channels``, any channel multiplier): not a GEMM worth tiling (one
  output column per group), so the template's space for such a workload is the direct path's
  (``blis_depthwise``: a padded buffer per unit, vectors over channels in nhwc and along the
  output row in nchw; knobs ISA, CB, WB, RB, threads) and ``compile`` builds that unit.

Threads (``threads``): the GEMMs (groups, and images for nchw) are split into units, each a
range of MR-aligned rows of one GEMM, as many as needed to give every thread one; each thread
runs the serial loop nest on its units with its own packing buffers (no barriers). ``PAR``
and ``PACKB`` are fixed (``ic``, packed): both choose between ways of reading a stored B,
which a gathered panel does not have.

>>> from tunehub.core import Target, Workload
>>> target = Target(kind="cpu", name="x", arch=("avx2", "fma"), cores=2, l1d_bytes=32768,
...                 l2_bytes=1 << 20, l3_bytes=32 << 20, machine="x86_64")
>>> w = Workload.from_dict({"op": "conv2d", "in_channels": 64, "out_channels": 64,
...     "height": 56, "width": 56, "kernel_h": 3, "kernel_w": 3, "pad_h": 1, "pad_w": 1})
>>> BlisConv2dTemplate().default_config(w, target)["PACKB"]
True
"""

from __future__ import annotations

import ctypes
import dataclasses
import secrets
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from tunehub.core import Capabilities, Config, MeasureResult, MeasureStatus, Target, Workload
from tunehub.core.workload import MAX_DIM
from tunehub.kernels.blis_codegen import (
    _ENTRY_SERIAL,
    _TIMER,
    ELEMENT_BYTES,
    BlisParams,
    _transpose,
    generate_source,
)
from tunehub.kernels.blis_depthwise import (
    DepthwiseParams,
    DepthwiseSpace,
    depthwise_params,
    generate_depthwise_source,
)
from tunehub.kernels.blis_gemm import (
    PACKED_PREFETCHES,
    BenchResult,
    BlisGemmTemplate,
    GemmKernel,
    KernelError,
    _SpaceModel,
    available_isas,
    params_for,
    vector_registers,
)
from tunehub.kernels.build import BuiltLibrary, build_shared_library
from tunehub.kernels.conv2d_reference import (
    check_conv,
    conv_dims,
    conv_operands,
    conv_output,
    conv_shapes,
    is_depthwise,
    is_nhwc,
)
from tunehub.kernels.machine import watch
from tunehub.kernels.space import KnobConstraint, SearchSpace
from tunehub.kernels.timing import MIN_REPEATS, repeat_min_secs, warmup_secs

Array = npt.NDArray[np.floating]

_I64 = ctypes.c_int64
_PTR = ctypes.c_void_p
_F64 = ctypes.c_double
# The order of tunehub_conv_shape's array.
SHAPE_FIELDS = (
    "batch", "in_channels", "out_channels", "height", "width", "kernel_h", "kernel_w",
    "stride_h", "stride_w", "pad_h", "pad_w", "dilation_h", "dilation_w", "groups", "oh", "ow",
)  # fmt: skip


def gemm_view(workload: Workload) -> Workload:
    """The GEMM one thread's loop nest runs (its M capped at MAX_DIM): what the blocking is
    modelled on. nhwc: M = N·OH·OW, N = O/groups; nchw: M = O/groups, N = OH·OW."""
    d = conv_dims(workload)
    if is_nhwc(workload):
        m, n = min(MAX_DIM, d["batch"] * d["oh"] * d["ow"]), d["ocg"]
    else:
        m, n = d["ocg"], d["oh"] * d["ow"]
    return Workload(m=m, n=n, k=workload.k, dtype=workload.dtype)


def _pack_rows(p: BlisParams, name: str = "pack_rows", count: str = "MR") -> str:
    """pack_rows: ``len`` elements from each of MR row pointers into an MR-row micro-panel
    (``ap[q*MR + i] = src[i][q]``), W x W at a time through blis.gemm's register transpose
    where the ISA has AVX2 (as its pack_a: a group of fewer than W rows stores a whole
    vector, overwritten afterwards; the last one spills into the buffer's slack). With
    ``count="NR"``, the same for NR rows (the nhwc filters into B's micro-panels)."""
    n = p.mr if count == "MR" else p.nr
    vector = ""
    if p.isa != "generic":
        w = 32 // ELEMENT_BYTES[p.dtype]
        vt = "__m256" if p.dtype == "float32" else "__m256d"
        sfx = "ps" if p.dtype == "float32" else "pd"
        groups = []
        for g in reversed(range(0, n, w)):
            rows = min(w, n - g)
            body = [
                f"{vt} r{i} = _mm256_loadu_{sfx}(src[{g + i}] + q);"
                if i < rows
                else f"{vt} r{i} = _mm256_setzero_{sfx}();"
                for i in range(w)
            ]
            body += _transpose(p)
            body += [
                f"_mm256_storeu_{sfx}(ap + (q + {j}) * {count} + {g}, o{j});" for j in range(w)
            ]
            groups.append("        { " + "\n          ".join(body) + " }")
        vector = f"""
    for (; q + {w} <= len; q += {w}) {{
{chr(10).join(groups)}
    }}"""
    return f"""
static void {name}(const T *const *src, int64_t len, T *restrict ap)
{{
    int64_t q = 0;{vector}
    for (; q < len; ++q)
        for (int64_t i = 0; i < {count}; ++i) ap[q * {count} + i] = src[i][q];
}}
"""


_CONV = r"""
/* conv2d as implicit GEMM (blis.conv2d): the shape set by tunehub_conv_shape. */
typedef struct {
    int64_t batch, ic, oc, h, w, kh, kw, sh, sw, ph, pw, dh, dw, groups, oh, ow;
} conv_t;
static conv_t g_cv;
/* A zero row for patch rows in the padding (a run is at most KC long). */
static const T conv_zeros[KC + 64] __attribute__((aligned(64)));

void tunehub_conv_shape(const int64_t *s)
{
    conv_t c = {s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8], s[9], s[10], s[11],
                s[12], s[13], s[14], s[15]};
    g_cv = c;
}

PACK_ROWS
/* nhwc: rows m0 .. m0+mc of the patches (row = (image, oh, ow) over the batch), columns
   pc .. pc+kc (k = (kh, kw, c)) of group g, into MR-row micro-panels. */
static void pack_a_nhwc(const conv_t *cv, const T *x, int64_t g, int64_t m0, int64_t mc,
                        int64_t pc, int64_t kc, T *restrict ap)
{
    int64_t icg = cv->ic / cv->groups, ohw = cv->oh * cv->ow;
    for (int64_t ir = 0; ir < mc; ir += MR) {
        int64_t img[MR], ih0[MR], iw0[MR];
        for (int64_t i = 0; i < MR; ++i) {
            int64_t r = m0 + ir + i;
            if (ir + i < mc) {
                int64_t pix = r % ohw;
                img[i] = r / ohw;
                ih0[i] = pix / cv->ow * cv->sh - cv->ph;
                iw0[i] = pix % cv->ow * cv->sw - cv->pw;
            } else {
                img[i] = -1;
                ih0[i] = iw0[i] = 0;
            }
        }
        int64_t tap = pc / icg, c = pc % icg;
        for (int64_t q = 0; q < kc; ++tap, c = 0) {
            int64_t len = icg - c < kc - q ? icg - c : kc - q;
            int64_t fh = tap / cv->kw * cv->dh, fw = tap % cv->kw * cv->dw;
            const T *src[MR];
            for (int64_t i = 0; i < MR; ++i) {
                int64_t ih = ih0[i] + fh, iw = iw0[i] + fw;
                src[i] = img[i] >= 0 && ih >= 0 && ih < cv->h && iw >= 0 && iw < cv->w
                             ? x + ((img[i] * cv->h + ih) * cv->w + iw) * cv->ic + g * icg + c
                             : conv_zeros;
            }
            pack_rows(src, len, ap + q * MR);
            q += len;
        }
        ap += MR * kc;
    }
}

/* nhwc: the filters of group g (O, KH, KW, C/groups: a k-contiguous row per output channel),
   columns n0 .. n0+nc, rows pc .. pc+kc, into NR-column micro-panels. */
static void pack_b_nhwc(const conv_t *cv, const T *wt, int64_t g, int64_t n0, int64_t nc,
                        int64_t pc, int64_t kc, T *restrict bp)
{
    int64_t ocg = cv->oc / cv->groups, k = cv->ic / cv->groups * cv->kh * cv->kw;
    for (int64_t jr = 0; jr < nc; jr += NR) {
        int64_t nr = nc - jr < NR ? nc - jr : NR;
        const T *src[NR];
        for (int64_t j = 0; j < NR; ++j)
            src[j] = j < nr ? wt + (g * ocg + n0 + jr + j) * k + pc : conv_zeros;
        pack_cols(src, kc, bp);
        bp += NR * kc;
    }
}

/* nchw: rows pc .. pc+kc (k = (c, kh, kw)) and columns n0 .. n0+nc (output pixels) of image
   b's patches of group g, transposed, into NR-column micro-panels. A micro-panel row is NR
   output pixels: split into runs along output rows, each run is a copy of the input row's
   pixels that lie inside the image (one memcpy at stride 1) between zeros for the padding. */
static void pack_b_nchw(const conv_t *cv, const T *x, int64_t b, int64_t g, int64_t n0,
                        int64_t nc, int64_t pc, int64_t kc, T *restrict bp)
{
    int64_t icg = cv->ic / cv->groups, hw = cv->h * cv->w, taps = cv->kh * cv->kw;
    const T *xg = x + (b * cv->ic + g * icg) * hw;
    for (int64_t jr = 0; jr < nc; jr += NR) {
        int64_t nr = nc - jr < NR ? nc - jr : NR;
        int64_t j0 = n0 + jr, oh0 = j0 / cv->ow, ow0 = j0 % cv->ow;
        int64_t c = pc / taps, tap = pc % taps;
        for (int64_t q = 0; q < kc; ++q) {
            int64_t fh = tap / cv->kw * cv->dh, fw = tap % cv->kw * cv->dw;
            const T *plane = xg + c * hw;
            T *restrict dst = bp + q * NR;
            int64_t t = 0, oh = oh0, ow = ow0;
            while (t < nr) {
                int64_t run = nr - t < cv->ow - ow ? nr - t : cv->ow - ow;
                int64_t ih = oh * cv->sh - cv->ph + fh;
                int64_t lo = 0, hi = 0;
                if (ih >= 0 && ih < cv->h) {
                    int64_t iw0 = ow * cv->sw - cv->pw + fw; /* input column of the run's first */
                    lo = iw0 >= 0 ? 0 : (-iw0 + cv->sw - 1) / cv->sw;
                    hi = iw0 < cv->w ? (cv->w - 1 - iw0) / cv->sw + 1 : 0;
                    hi = hi < run ? hi : run;
                    if (lo > hi) lo = hi;
                    const T *src = plane + ih * cv->w + iw0;
                    if (cv->sw == 1)
                        memcpy(dst + t + lo, src + lo, sizeof(T) * (size_t)(hi - lo));
                    else
                        for (int64_t i = lo; i < hi; ++i) dst[t + i] = src[i * cv->sw];
                }
                for (int64_t i = 0; i < lo; ++i) dst[t + i] = 0;
                for (int64_t i = hi; i < run; ++i) dst[t + i] = 0;
                t += run;
                ow = 0;
                ++oh;
            }
            for (; t < NR; ++t) dst[t] = 0;
            if (++tap == taps) { tap = 0; ++c; }
        }
        bp += NR * kc;
    }
}

/* Rows m0 .. m1 of one GEMM (group g; image b for nchw): blis.gemm's serial jc -> pc -> ic
   nest with the gathering packs. */
static int conv_unit(const conv_t *cv, const T *x, const T *wt, T *y, int64_t g, int64_t b,
                     int64_t m0, int64_t m1, int nhwc)
{
    T *ap = buffer_a(), *bp = buffer_b();
    if (!ap || !bp) return -1;
    int64_t icg = cv->ic / cv->groups, ocg = cv->oc / cv->groups, ohw = cv->oh * cv->ow;
    int64_t k = icg * cv->kh * cv->kw, hw = cv->h * cv->w;
    int pointwise = cv->kh == 1 && cv->kw == 1 && cv->sh == 1 && cv->sw == 1 && cv->ph == 0
                    && cv->pw == 0;
    int64_t n = nhwc ? ocg : ohw, ldc = nhwc ? cv->oc : ohw;
    T *c0 = nhwc ? y + g * ocg : y + (b * cv->oc + g * ocg) * ohw;
    for (int64_t jc = 0; jc < n; jc += NC_EFF) {
        int64_t nc = n - jc < NC_EFF ? n - jc : NC_EFF;
        int64_t kc_step = balanced(k, KC, 1);
        for (int64_t pc = 0; pc < k; pc += kc_step) {
            int64_t kc = k - pc < kc_step ? k - pc : kc_step;
            int first = pc == 0, last = pc + kc == k;
            if (nhwc)
                pack_b_nhwc(cv, wt, g, jc, nc, pc, kc, bp);
            else if (pointwise)
                pack_b(kc, nc, x + (b * cv->ic + g * icg + pc) * hw + jc, hw, bp);
            else
                pack_b_nchw(cv, x, b, g, jc, nc, pc, kc, bp);
            int64_t mc_step = balanced(m1 - m0, MC_EFF, MR);
            for (int64_t i0 = m0; i0 < m1; i0 += mc_step) {
                int64_t mc = m1 - i0 < mc_step ? m1 - i0 : mc_step;
                if (!nhwc)
                    pack_a(mc, kc, wt + (g * ocg + i0) * k + pc, k, ap);
                else if (pointwise)
                    pack_a(mc, kc, x + i0 * cv->ic + g * icg + pc, cv->ic, ap);
                else
                    pack_a_nhwc(cv, x, g, i0, mc, pc, kc, ap);
                macro_kernel(mc, nc, kc, ap, bp, 0, 0, c0 + i0 * ldc + jc, ldc, 0, first, last);
            }
        }
    }
    return 0;
}

/* Y = conv2d(X, W) for the shape tunehub_conv_shape set; 0, or -1 when a packing buffer
   cannot be allocated. */
int tunehub_conv(const T *x, const T *wt, T *y)
{
    const conv_t *cv = &g_cv;
    int nhwc = NHWC;
    int64_t problems = nhwc ? cv->groups : cv->batch * cv->groups;
    int64_t rows = nhwc ? cv->batch * cv->oh * cv->ow : cv->oc / cv->groups;
    int64_t chunks = problems < THREADS ? (THREADS + problems - 1) / problems : 1;
    int64_t units = problems * chunks;
    int failed = 0;
#if THREADS > 1
    #pragma omp parallel for num_threads(THREADS) schedule(static) reduction(|:failed)
#endif
    for (int64_t u = 0; u < units; ++u) {
        int64_t problem = u / chunks, lo, hi;
        split_range(rows, chunks, MR, u % chunks, &lo, &hi);
        if (lo < hi)
            failed |= conv_unit(cv, x, wt, y, problem % cv->groups, problem / cv->groups, lo,
                                hi, nhwc) != 0;
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


def generate_conv_source(p: BlisParams, *, nhwc: bool) -> str:
    """The C translation unit of blis.conv2d for ``p`` (any shape of the layout, set at run
    time): ``tunehub_conv_shape(int64_t[16])`` (SHAPE_FIELDS' order), ``tunehub_conv(X, W,
    Y)``, and blis.gemm's ``tunehub_bench`` / ``tunehub_release`` timing and freeing it."""
    if not p.packb or p.par != "ic":
        raise ValueError("blis.conv2d packs B and splits its own units: PACKB true, PAR ic")
    serial = BlisParams(**{**p.__dict__, "threads": 1})
    source = generate_source(serial)
    head, timer = source.split(_TIMER, 1)
    head = head.replace(
        _ENTRY_SERIAL,
        _ENTRY_SERIAL.replace(
            "int tunehub_gemm(", "static __attribute__((unused)) int gemm_entry("
        ),
    )
    if p.threads > 1:
        head = head.replace("#define THREADS 1\n", f"#define THREADS {p.threads}\n")
        head = head.replace("#include <pthread.h>", "#include <omp.h>\n#include <pthread.h>")
    head = head.replace(
        "/* generated by tunehub (blis.gemm): ",
        f"/* generated by tunehub (blis.conv2d {'nhwc' if nhwc else 'nchw'}): ",
    )
    conv = _CONV.replace("PACK_ROWS\n", _pack_rows(p) + _pack_rows(p, "pack_cols", "NR"))
    return head + f"#define NHWC {int(nhwc)}\n" + conv + _TIMER + timer


class ConvKernel(GemmKernel):
    """A compiled blis.conv2d kernel for one (config, dtype, layout); any shape per call."""

    def __init__(self, params: BlisParams, library: BuiltLibrary | Path) -> None:
        super().__init__(params, library)
        self._bind_conv()

    def _bind_conv(self) -> None:
        self._conv = self._lib.tunehub_conv
        self._conv.argtypes = [_PTR, _PTR, _PTR]
        self._conv.restype = ctypes.c_int
        self._set_shape = self._lib.tunehub_conv_shape
        self._set_shape.argtypes = [_PTR]
        self._set_shape.restype = None

    def _prepare(self, workload: Workload, x: Array, w: Array, y: Array) -> None:
        shapes = conv_shapes(workload)
        for name, array, shape in (("x", x, shapes[0]), ("w", w, shapes[1]), ("y", y, shapes[2])):
            if array.shape != shape or array.dtype != self.dtype or not array.flags.c_contiguous:
                raise ValueError(f"{name} must be a C-contiguous {shape} {self.dtype} array")
        d = conv_dims(workload)
        self._check_shape(workload, d)
        fields = np.array([d[name] for name in SHAPE_FIELDS], dtype=np.int64)
        self._set_shape(fields.ctypes.data)

    def _check_shape(self, workload: Workload, dims: dict[str, int]) -> None:
        """The implicit-GEMM unit runs any shape of its layout."""

    def conv(self, workload: Workload, x: Array, w: Array, y: Array) -> Array:
        """``y = conv2d(x, w)`` for ``workload``'s shape (arrays as its layout stores them)."""
        self._prepare(workload, x, w, y)
        if self._conv(x.ctypes.data, w.ctypes.data, y.ctypes.data):
            raise KernelError("kernel could not allocate its packing buffers")
        return y

    def bench_conv(
        self, workload: Workload, x: Array, w: Array, y: Array, *, min_secs: float,
        max_repeats: int,
    ) -> BenchResult:  # fmt: skip
        """Time whole convolutions with blis.gemm's C timing loop (warm caches)."""
        self._prepare(workload, x, w, y)
        secs = np.zeros(max_repeats, dtype=np.float64)
        off = np.full(max_repeats, -1.0, dtype=np.float64)
        calls = np.zeros(1, dtype=np.int64)
        cpu = np.full(1, -1, dtype=np.int64)
        warm = warmup_secs(min_secs)
        done = self._bench(
            1, 1, 1, x.ctypes.data, 1, w.ctypes.data, 1, y.ctypes.data, 1, None,
            warm, min_secs, repeat_min_secs(min_secs, max_repeats),
            min(MIN_REPEATS, max_repeats), max_repeats, secs.ctypes.data, calls.ctypes.data,
            cpu.ctypes.data, off.ctypes.data,
        )  # fmt: skip
        if done < 0:
            raise KernelError("kernel could not allocate its packing buffers")
        pinned = int(cpu[0])
        return BenchResult(
            tuple(float(s) for s in secs[:done]),
            int(calls[0]),
            warm,
            pinned if pinned >= 0 else None,
            tuple(float(v) if v >= 0 else None for v in off[:done]),
        )


class DepthwiseKernel(ConvKernel):
    """A compiled depthwise unit (blis_depthwise) for one (config, dtype, layout, filter width,
    stride and dilation along W); any other depthwise shape per call."""

    def __init__(self, params: DepthwiseParams, library: BuiltLibrary | Path) -> None:
        self.depthwise = params
        self._open(library, params.dtype, False)
        self._bind_conv()

    def _check_shape(self, workload: Workload, dims: dict[str, int]) -> None:
        p = self.depthwise
        filt = ("kernel_h", "stride_h", "dilation_h", "kernel_w", "stride_w", "dilation_w")
        got = (is_depthwise(workload), is_nhwc(workload), *(dims[f] for f in filt))
        if got != (True, p.nhwc, *(getattr(p, f) for f in filt)):
            raise ValueError(
                f"this kernel runs depthwise {'nhwc' if p.nhwc else 'nchw'} convolutions with "
                + ", ".join(f"{f}={getattr(p, f)}" for f in filt)
                + f"; got {workload.label}"
            )


class BlisConv2dTemplate(BlisGemmTemplate):
    """``blis.conv2d``: see the module docstring."""

    name = "blis.conv2d"
    baseline_template = "torch.conv2d"
    # 2: depthwise workloads run the direct path (its own knobs) instead of implicit GEMM.
    version = 2
    device_kind = "cpu"

    def capabilities(self, target: Target) -> Capabilities:
        return Capabilities(
            kinds=("cpu",),
            ops=("conv2d",),
            dtypes=tuple(ELEMENT_BYTES),
            a_layouts=("row_major",),
            b_layouts=("row_major",),
            epilogues=("none",),
        )

    def _depthwise(self, workload: Workload, target: Target) -> DepthwiseSpace:
        isas = available_isas(target)
        return DepthwiseSpace(
            workload, target, isas, {isa: vector_registers(isa, target) for isa in isas}
        )

    def space(self, workload: Workload, target: Target) -> SearchSpace:
        """blis.gemm's knobs for the implicit GEMM; for a depthwise workload the direct path's
        (blis_depthwise: ISA, CB, WB, RB, threads)."""
        if is_depthwise(workload):
            return self._depthwise(workload, target).space()
        gemm = _SpaceModel(gemm_view(workload), target).space()
        return SearchSpace(
            knobs=gemm.knobs,
            constraints=(
                *gemm.constraints,
                KnobConstraint(
                    ("PACKB", "PAR", "PREFETCH"),
                    lambda c: (
                        bool(c["PACKB"]) and c["PAR"] == "ic" and c["PREFETCH"] in PACKED_PREFETCHES
                    ),
                ),
            ),
        )

    def default_config(self, workload: Workload, target: Target) -> Config:
        """blis.gemm's analytical point for the GEMM view (gemm_view), single-threaded; the
        direct path's for a depthwise workload."""
        if is_depthwise(workload):
            return self._depthwise(workload, target).default()
        return _SpaceModel(gemm_view(workload), target).default()

    def seed_configs(self, workload: Workload, target: Target) -> list[Config]:
        """The model's point and the best-fitting tile's, each with one thread and every core
        (depthwise: the direct path's point and a two-vector channel block)."""
        if is_depthwise(workload):
            return self._depthwise(workload, target).seeds()
        model = _SpaceModel(gemm_view(workload), target)
        space = self.space(workload, target)
        seeds: list[Config] = []
        for base in (model.default(), model.edge_point()):
            for threads in sorted(model.threads, reverse=True):
                config = base.replace(threads=threads, PAR="ic", PACKB=True)
                if config not in seeds and space.is_valid(config):
                    seeds.append(config)
        return seeds

    def config_problem(self, workload: Workload, target: Target, config: Config) -> str | None:
        if is_depthwise(workload):
            try:
                params = depthwise_params(workload, config)
            except ValueError as exc:
                return str(exc)
            if params.isa not in available_isas(target):
                return f"ISA {params.isa} is not available on {target.label}"
            return None
        problem = super().config_problem(gemm_view(workload), target, config)
        if problem:
            return problem
        if config.get("PACKB") is not True or config.get("PAR") != "ic":
            return "blis.conv2d packs B and splits its own units: PACKB true, PAR ic"
        return None

    def source(self, workload: Workload, config: Config) -> str:
        if is_depthwise(workload):
            return generate_depthwise_source(depthwise_params(workload, config))
        return generate_conv_source(params_for(gemm_view(workload), config), nhwc=is_nhwc(workload))

    def build_library(
        self, workload: Workload, target: Target, config: Config, build_dir: Path
    ) -> tuple[BlisParams, BuiltLibrary]:
        problem = self.config_problem(workload, target, config)
        if problem:
            raise ValueError(problem)
        params = params_for(gemm_view(workload), config)
        flags = ("-fopenmp",) if params.threads > 1 else ()
        library = build_shared_library(
            self.source(workload, config), build_dir=build_dir, flags=flags, stem="blis_conv2d"
        )
        return params, library

    def build_depthwise_library(
        self, workload: Workload, target: Target, config: Config, build_dir: Path
    ) -> tuple[DepthwiseParams, BuiltLibrary]:
        problem = self.config_problem(workload, target, config)
        if problem:
            raise ValueError(problem)
        params = depthwise_params(workload, config)
        flags = ("-fopenmp",) if params.threads > 1 else ()
        library = build_shared_library(
            self.source(workload, config), build_dir=build_dir, flags=flags, stem="blis_dwconv"
        )
        return params, library

    def _built_params(
        self, workload: Workload, target: Target, config: Config, build_dir: Path
    ) -> tuple[dict[str, Any], BuiltLibrary]:
        if is_depthwise(workload):
            params, library = self.build_depthwise_library(workload, target, config, build_dir)
            return dataclasses.asdict(params), library
        return super()._built_params(workload, target, config, build_dir)

    def compile(
        self, workload: Workload, target: Target, config: Config, build_dir: Path
    ) -> ConvKernel:
        if is_depthwise(workload):
            return DepthwiseKernel(
                *self.build_depthwise_library(workload, target, config, build_dir)
            )
        return ConvKernel(*self.build_library(workload, target, config, build_dir))

    def load(self, artifact: Any) -> ConvKernel:
        data = artifact.data["params"]
        if "wb" in data:
            return DepthwiseKernel(DepthwiseParams(**data), Path(artifact.path))
        return ConvKernel(BlisParams(**data), Path(artifact.path))

    def _verify_and_time(
        self,
        kernel: GemmKernel,
        workload: Workload,
        compile_secs: float,
        environment: dict[str, Any],
        min_secs: float,
        max_repeats: int,
    ) -> MeasureResult:
        assert isinstance(kernel, ConvKernel)
        start = time.perf_counter()
        seed = secrets.randbits(63)
        rng = np.random.default_rng(seed)
        x, w = conv_operands(workload, rng)
        y = conv_output(workload)
        try:
            kernel.conv(workload, x, w, y)
        except KernelError as exc:
            return self._failed(MeasureStatus.RUNTIME_ERROR, str(exc), compile_secs, environment)
        ok, rows, max_abs, max_ratio, message = check_conv(y, x, w, workload, rng)
        verify_secs = time.perf_counter() - start
        environment.update(seed=seed, verify_rows=rows)
        if not ok:
            return MeasureResult(
                MeasureStatus.WRONG_ANSWER,
                error=message,
                compile_secs=compile_secs,
                verify_secs=verify_secs,
                environment=environment,
            )
        environment.update(max_abs_err=max_abs, max_err_ratio=max_ratio)
        start = time.perf_counter()
        try:
            with watch() as machine:
                bench = kernel.bench_conv(
                    workload, x, w, y, min_secs=min_secs, max_repeats=max_repeats
                )
        except KernelError as exc:
            return self._failed(MeasureStatus.RUNTIME_ERROR, str(exc), compile_secs, environment)
        run_secs = time.perf_counter() - start
        return self._timed(bench, machine, environment, compile_secs, verify_secs, run_secs)
