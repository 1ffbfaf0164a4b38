"""C source generation for the BLIS-structured GEMM: loops, packing, micro-kernels, timer."""

from __future__ import annotations

from dataclasses import dataclass

# Vector width and register count per micro-kernel ISA. "generic" is the GCC vector-extension
# kernel: 16-byte vectors (SSE, NEON), with 32 registers on aarch64 and the SSE count elsewhere.
ISA_VECTOR_BYTES = {"avx512": 64, "avx2": 32, "generic": 16}
ISA_REGISTERS = {"avx512": 32, "avx2": 16, "generic": 16}
ISA_REGISTERS_AARCH64 = 32
C_TYPES = {"float32": "float", "float64": "double"}
ELEMENT_BYTES = {"float32": 4, "float64": 8}
PARALLEL_LOOPS = ("ic", "jc")
BUFFER_ALIGN = 64
ABI_VERSION = 1


@dataclass(frozen=True)
class BlisParams:
    """Everything the generated source depends on; M, N and K are runtime arguments.

    ``MC`` and ``NC`` are used rounded up to multiples of ``MR`` and ``NR`` (BLIS requires
    that; see ``mc_eff``/``nc_eff``), so any positive value is accepted.
    """

    dtype: str
    epilogue: str  # none | bias | bias_relu
    isa: str  # avx512 | avx2 | generic
    mr: int
    nr: int
    kc: int
    mc: int
    nc: int
    unroll: int = 1
    threads: int = 1
    par: str = "ic"

    def __post_init__(self) -> None:
        problem = self.problem()
        if problem:
            raise ValueError(problem)

    def problem(self) -> str | None:
        """Why these parameters cannot be generated, or None."""
        if self.dtype not in C_TYPES:
            return f"unsupported dtype {self.dtype!r}"
        if self.epilogue not in ("none", "bias", "bias_relu"):
            return f"unsupported epilogue {self.epilogue!r}"
        if self.isa not in ISA_VECTOR_BYTES:
            return f"unknown ISA {self.isa!r}"
        for name in ("mr", "nr", "kc", "mc", "nc", "unroll", "threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                return f"{name.upper()} must be a positive integer, got {value!r}"
        if self.nr % self.vl:
            return f"NR={self.nr} is not a multiple of the {self.isa} vector length {self.vl}"
        if self.mr > 32 or self.nv > 8:
            return f"micro-tile {self.mr}x{self.nr} is too large to generate"
        if self.unroll > 16:
            return f"UNROLL={self.unroll} is above 16"
        if self.par not in PARALLEL_LOOPS:
            return f"PAR must be one of {PARALLEL_LOOPS}, got {self.par!r}"
        return None

    @property
    def vl(self) -> int:
        """Elements per vector register."""
        return ISA_VECTOR_BYTES[self.isa] // ELEMENT_BYTES[self.dtype]

    @property
    def nv(self) -> int:
        """Vectors per micro-tile row."""
        return self.nr // self.vl

    @property
    def mc_eff(self) -> int:
        return -(-self.mc // self.mr) * self.mr

    @property
    def nc_eff(self) -> int:
        return -(-self.nc // self.nr) * self.nr

    @property
    def c_type(self) -> str:
        return C_TYPES[self.dtype]


class _Vec:
    """Spelling of the vector operations for one ISA and element type."""

    def __init__(self, p: BlisParams) -> None:
        self.p = p
        if p.isa == "generic":
            self.type = "vec_t"
            self.zero = "vzero()"
            return
        suffix = "ps" if p.dtype == "float32" else "pd"
        if p.isa == "avx512":
            prefix = "_mm512"
            self.type = "__m512" if p.dtype == "float32" else "__m512d"
        else:
            prefix = "_mm256"
            self.type = "__m256" if p.dtype == "float32" else "__m256d"
        self._f = {
            op: f"{prefix}_{op}_{suffix}"
            for op in ("load", "loadu", "storeu", "set1", "fmadd", "add", "max")
        }
        self.zero = f"{prefix}_setzero_{suffix}()"

    def __getattr__(self, op: str) -> str:
        if self.p.isa == "generic":
            return f"v{op}"
        return self._f[op]


def _generic_helpers(p: BlisParams) -> str:
    vb = ISA_VECTOR_BYTES[p.isa]
    int_type = "int32_t" if p.dtype == "float32" else "int64_t"
    return f"""
typedef T vec_t __attribute__((vector_size({vb})));
typedef {int_type} veci_t __attribute__((vector_size({vb})));
#define VL {p.vl}
static inline vec_t vzero(void) {{ vec_t v = {{0}}; return v; }}
static inline vec_t vload(const T *p) {{ return *(const vec_t *)p; }}
static inline vec_t vloadu(const T *p) {{ vec_t v; memcpy(&v, p, sizeof v); return v; }}
static inline void vstoreu(T *p, vec_t v) {{ memcpy(p, &v, sizeof v); }}
static inline vec_t vset1(T x) {{ vec_t v; for (int i = 0; i < VL; ++i) v[i] = x; return v; }}
/* a*b+c: GNU C contracts this into an FMA where the target has one (-ffp-contract=fast). */
static inline vec_t vfmadd(vec_t a, vec_t b, vec_t c) {{ return a * b + c; }}
static inline vec_t vadd(vec_t a, vec_t b) {{ return a + b; }}
static inline vec_t vmax(vec_t a, vec_t b)
{{
    veci_t m = a > b;
    return (vec_t)(((veci_t)a & m) | ((veci_t)b & ~m));
}}
"""


def _ukernel_compute(p: BlisParams, v: _Vec) -> list[str]:
    """Declare the accumulators and run the k loop (unrolled UNROLL times)."""
    lines = []
    for i in range(p.mr):
        decl = ", ".join(f"c{i}_{j} = {v.zero}" for j in range(p.nv))
        lines.append(f"    {v.type} {decl};")

    def step(offset: int) -> list[str]:
        out = ["        {"]
        bdecl = ", ".join(f"b{j} = {v.load}(b + {offset * p.nr + j * p.vl})" for j in range(p.nv))
        out.append(f"            {v.type} {bdecl};")
        if p.isa != "generic":
            # An empty asm that "modifies" each B vector pins it in a register: otherwise GCC
            # folds the load into every FMA and the kernel becomes load-bound.
            pins = " ".join(f'__asm__("" : "+v"(b{j}));' for j in range(p.nv))
            out.append(f"            {pins}")
        for i in range(p.mr):
            out.append(f"            {{ {v.type} a_ = {v.set1}(a[{offset * p.mr + i}]);")
            for j in range(p.nv):
                out.append(f"              c{i}_{j} = {v.fmadd}(a_, b{j}, c{i}_{j});")
            out.append("            }")
        out.append("        }")
        return out

    lines.append("    int64_t p = 0;")
    if p.unroll > 1:
        lines.append(f"    for (; p + {p.unroll} <= kc; p += {p.unroll}) {{")
        for u in range(p.unroll):
            lines.extend(step(u))
        lines.append(f"        a += {p.unroll * p.mr}; b += {p.unroll * p.nr};")
        lines.append("    }")
    lines.append("    for (; p < kc; ++p) {")
    lines.extend(step(0))
    lines.append(f"        a += {p.mr}; b += {p.nr};")
    lines.append("    }")
    return lines


def _ukernels(p: BlisParams, v: _Vec) -> str:
    """Two micro-kernels sharing the compute part.

    ``ukernel_c`` writes a full MR x NR tile of C with the epilogue fused into the store;
    ``ukernel_t`` writes the raw accumulators to an aligned temp tile, from which ``edge``
    copies the valid part of a partial tile (so edges never need a scalar GEMM).
    """
    has_bias = p.epilogue in ("bias", "bias_relu")
    has_relu = p.epilogue == "bias_relu"
    compute = "\n".join(_ukernel_compute(p, v))
    head = "static inline __attribute__((always_inline)) void"
    sig = "int64_t kc, const T *restrict a, const T *restrict b"
    # C rows are prefetched for writing before the k loop, so the store doesn't stall.
    prefetch = "\n".join(
        f"    __builtin_prefetch(c + {i} * ldc, 1, 3);"
        f" __builtin_prefetch(c + {i} * ldc + {p.nr - 1}, 1, 3);"
        for i in range(p.mr)
    )
    first = []
    if has_bias:
        for j in range(p.nv):
            first.append(f"        {v.type} bias{j} = {v.loadu}(bias + {j * p.vl});")
        for i in range(p.mr):
            for j in range(p.nv):
                first.append(f"        c{i}_{j} = {v.add}(c{i}_{j}, bias{j});")
    accumulate = [
        f"        c{i}_{j} = {v.add}(c{i}_{j}, {v.loadu}(c + {i} * ldc + {j * p.vl}));"
        for i in range(p.mr)
        for j in range(p.nv)
    ]
    relu = []
    if has_relu:
        relu.append(f"    if (last) {{ {v.type} z_ = {v.zero};")
        relu.extend(
            f"        c{i}_{j} = {v.max}(c{i}_{j}, z_);" for i in range(p.mr) for j in range(p.nv)
        )
        relu.append("    }")
    store_c = [
        f"    {v.storeu}(c + {i} * ldc + {j * p.vl}, c{i}_{j});"
        for i in range(p.mr)
        for j in range(p.nv)
    ]
    store_t = [
        f"    {v.storeu}(t + {i * p.nr + j * p.vl}, c{i}_{j});"
        for i in range(p.mr)
        for j in range(p.nv)
    ]
    nl = "\n"
    return f"""
{head} ukernel_c({sig}, T *restrict c, int64_t ldc, const T *restrict bias, int first, int last)
{{
{prefetch}
{compute}
    if (first) {{
{nl.join(first) or "        (void)bias;"}
    }} else {{
{nl.join(accumulate)}
    }}
{nl.join(relu) or "    (void)last;"}
{nl.join(store_c)}
}}

{head} ukernel_t({sig}, T *restrict t)
{{
{compute}
{nl.join(store_t)}
}}

static void edge(int64_t kc, const T *restrict a, const T *restrict b, T *restrict c,
                 int64_t ldc, int64_t mr, int64_t nr, const T *restrict bias, int first, int last)
{{
    T t[MR * NR] __attribute__((aligned({BUFFER_ALIGN})));
    ukernel_t(kc, a, b, t);
    for (int64_t i = 0; i < mr; ++i) {{
        T *restrict ci = c + i * ldc;
        const T *restrict ti = t + i * NR;
        for (int64_t j = 0; j < nr; ++j) {{
            T x = ti[j];
            if (first) x += {"bias[j]" if has_bias else "0"};
            else x += ci[j];
            {"if (last && !(x > 0)) x = 0;" if has_relu else "(void)last;"}
            ci[j] = x;
        }}
    }}
    (void)bias;
}}
"""


_DRIVER = r"""
/* Packing buffers live per thread and are kept between calls, so repeated calls (and the
   timing loop) do not pay for allocation or page faults. They are sized for KC, MC and NC. */
static __thread T *tl_a;
static __thread T *tl_b;

static T *buffer_a(void)
{
    if (!tl_a && posix_memalign((void **)&tl_a, 4096, sizeof(T) * (size_t)MC_EFF * KC)) tl_a = 0;
    return tl_a;
}

static T *buffer_b(void)
{
    if (!tl_b && posix_memalign((void **)&tl_b, 4096, sizeof(T) * (size_t)NC_EFF * KC)) tl_b = 0;
    return tl_b;
}

/* A[mc x kc] (row-major, leading dim lda) -> MR-row micro-panels, zero-padded to MR rows:
   panel r holds A[r*MR + i][p] at ap[r*MR*kc + p*MR + i]. */
static void pack_a(int64_t mc, int64_t kc, const T *restrict a, int64_t lda, T *restrict ap)
{
    for (int64_t ir = 0; ir < mc; ir += MR) {
        int64_t mr = mc - ir < MR ? mc - ir : MR;
        if (mr == MR) {
            for (int64_t p = 0; p < kc; ++p) {
                const T *restrict src = a + ir * lda + p;
                for (int64_t i = 0; i < MR; ++i) ap[p * MR + i] = src[i * lda];
            }
        } else {
            for (int64_t p = 0; p < kc; ++p) {
                const T *restrict src = a + ir * lda + p;
                int64_t i = 0;
                for (; i < mr; ++i) ap[p * MR + i] = src[i * lda];
                for (; i < MR; ++i) ap[p * MR + i] = 0;
            }
        }
        ap += MR * kc;
    }
}

/* One NR-column micro-panel of B[kc x nr], zero-padded to NR columns:
   B[p][j] at bp[p*NR + j]. */
static void pack_b_panel(int64_t kc, int64_t nr, const T *restrict b, int64_t ldb, T *restrict bp)
{
    if (nr == NR) {
        for (int64_t p = 0; p < kc; ++p) memcpy(bp + p * NR, b + p * ldb, sizeof(T) * NR);
    } else {
        for (int64_t p = 0; p < kc; ++p) {
            int64_t j = 0;
            for (; j < nr; ++j) bp[p * NR + j] = b[p * ldb + j];
            for (; j < NR; ++j) bp[p * NR + j] = 0;
        }
    }
}

static void pack_b(int64_t kc, int64_t nc, const T *restrict b, int64_t ldb, T *restrict bp)
{
    for (int64_t jr = 0; jr < nc; jr += NR)
        pack_b_panel(kc, nc - jr < NR ? nc - jr : NR, b + jr, ldb, bp + jr * kc);
}

/* The two innermost loops: B micro-panel (jr) stays in L1 while A micro-panels (ir) stream. */
static void macro_kernel(int64_t mc, int64_t nc, int64_t kc, const T *ap, const T *bp, T *c,
                         int64_t ldc, const T *bias, int first, int last)
{
    for (int64_t jr = 0; jr < nc; jr += NR) {
        int64_t nr = nc - jr < NR ? nc - jr : NR;
        const T *bpan = bp + jr * kc;
        const T *bj = bias ? bias + jr : 0;
        for (int64_t ir = 0; ir < mc; ir += MR) {
            int64_t mr = mc - ir < MR ? mc - ir : MR;
            if (mr == MR && nr == NR)
                ukernel_c(kc, ap + ir * kc, bpan, c + ir * ldc + jr, ldc, bj, first, last);
            else
                edge(kc, ap + ir * kc, bpan, c + ir * ldc + jr, ldc, mr, nr, bj, first, last);
        }
    }
}

/* [lo, hi) of part `idx` when `total` is split into `parts` pieces aligned to `align`. */
static void split_range(int64_t total, int64_t parts, int64_t align, int64_t idx,
                        int64_t *lo, int64_t *hi)
{
    int64_t units = (total + align - 1) / align;
    int64_t per = units / parts, rem = units % parts;
    int64_t u0 = idx * per + (idx < rem ? idx : rem);
    int64_t u1 = u0 + per + (idx < rem ? 1 : 0);
    *lo = u0 * align < total ? u0 * align : total;
    *hi = u1 * align < total ? u1 * align : total;
}

/* C[m x n0..n1) = epilogue(A B): the serial jc -> pc -> ic loop nest over a column range. */
static int gemm_cols(int64_t m, int64_t n0, int64_t n1, int64_t k, const T *a, int64_t lda,
                     const T *b, int64_t ldb, T *c, int64_t ldc, const T *bias)
{
    T *ap = buffer_a(), *bp = buffer_b();
    if (!ap || !bp) return -1;
    for (int64_t jc = n0; jc < n1; jc += NC_EFF) {
        int64_t nc = n1 - jc < NC_EFF ? n1 - jc : NC_EFF;
        for (int64_t pc = 0; pc < k; pc += KC) {
            int64_t kc = k - pc < KC ? k - pc : KC;
            int first = pc == 0, last = pc + kc == k;
            pack_b(kc, nc, b + pc * ldb + jc, ldb, bp);
            for (int64_t ic = 0; ic < m; ic += MC_EFF) {
                int64_t mc = m - ic < MC_EFF ? m - ic : MC_EFF;
                pack_a(mc, kc, a + ic * lda + pc, lda, ap);
                macro_kernel(mc, nc, kc, ap, bp, c + ic * ldc + jc, ldc,
                             bias ? bias + jc : 0, first, last);
            }
        }
    }
    return 0;
}
"""

_ENTRY_SERIAL = r"""
int tunehub_gemm(int64_t m, int64_t n, int64_t k, const T *a, int64_t lda, const T *b,
                 int64_t ldb, T *c, int64_t ldc, const T *bias)
{
    return gemm_cols(m, 0, n, k, a, lda, b, ldb, c, ldc, bias);
}
"""

# PAR=jc: every thread runs the serial loop nest on its own NR-aligned column range, with its
# own packing buffers (B is not shared, so no barriers).
_ENTRY_JC = r"""
int tunehub_gemm(int64_t m, int64_t n, int64_t k, const T *a, int64_t lda, const T *b,
                 int64_t ldb, T *c, int64_t ldc, const T *bias)
{
    int failed = 0;
    #pragma omp parallel num_threads(THREADS) reduction(|:failed)
    {
        int64_t lo, hi;
        split_range(n, omp_get_num_threads(), NR, omp_get_thread_num(), &lo, &hi);
        if (lo < hi) failed |= gemm_cols(m, lo, hi, k, a, lda, b, ldb, c, ldc, bias) != 0;
    }
    return failed ? -1 : 0;
}
"""

# PAR=ic: the threads pack one shared B panel together, then each computes its own MR-aligned
# row range (so all threads work even when M <= MC), each with its own A buffer.
_ENTRY_IC = r"""
int tunehub_gemm(int64_t m, int64_t n, int64_t k, const T *a, int64_t lda, const T *b,
                 int64_t ldb, T *c, int64_t ldc, const T *bias)
{
    T *bp = buffer_b();
    if (!bp) return -1;
    int failed = 0;
    #pragma omp parallel num_threads(THREADS) reduction(|:failed)
    {
        int64_t lo, hi;
        split_range(m, omp_get_num_threads(), MR, omp_get_thread_num(), &lo, &hi);
        T *ap = buffer_a();
        if (!ap) failed = 1;
        for (int64_t jc = 0; jc < n; jc += NC_EFF) {
            int64_t nc = n - jc < NC_EFF ? n - jc : NC_EFF;
            for (int64_t pc = 0; pc < k; pc += KC) {
                int64_t kc = k - pc < KC ? k - pc : KC;
                int first = pc == 0, last = pc + kc == k;
                #pragma omp for schedule(static)
                for (int64_t jr = 0; jr < nc; jr += NR)
                    pack_b_panel(kc, nc - jr < NR ? nc - jr : NR, b + pc * ldb + jc + jr, ldb,
                                 bp + jr * kc);
                if (ap) {
                    for (int64_t ic = lo; ic < hi; ic += MC_EFF) {
                        int64_t mc = hi - ic < MC_EFF ? hi - ic : MC_EFF;
                        pack_a(mc, kc, a + ic * lda + pc, lda, ap);
                        macro_kernel(mc, nc, kc, ap, bp, c + ic * ldc + jc, ldc,
                                     bias ? bias + jc : 0, first, last);
                    }
                }
                #pragma omp barrier
            }
        }
    }
    return failed ? -1 : 0;
}
"""

_TIMER = r"""
static double now_secs(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Warm up for warmup_secs (at least one call), then time repeats until min_secs in total and
   at least min_repeats, at most max_repeats. A repeat is `calls` back-to-back calls (enough
   for repeat_min_secs, so tiny GEMMs are not clock-bound); out[r] is its time per call.
   Inputs and C stay where they are between calls: caches are warm. Returns the number of
   repeats, or -1 if a call failed. */
int64_t tunehub_bench(int64_t m, int64_t n, int64_t k, const T *a, int64_t lda, const T *b,
                      int64_t ldb, T *c, int64_t ldc, const T *bias, double warmup_secs,
                      double min_secs, double repeat_min_secs, int64_t min_repeats,
                      int64_t max_repeats, double *out, int64_t *calls_out)
{
    double t0 = now_secs(), elapsed;
    int64_t warm = 0;
    do {
        if (tunehub_gemm(m, n, k, a, lda, b, ldb, c, ldc, bias)) return -1;
        ++warm;
        elapsed = now_secs() - t0;
    } while (elapsed < warmup_secs);
    double per_call = elapsed / (double)warm;
    int64_t calls = 1;
    if (per_call < repeat_min_secs)
        calls = per_call > 0 ? (int64_t)(repeat_min_secs / per_call) + 1 : 1000;
    double total = 0;
    int64_t r = 0;
    while (r < max_repeats && (r < min_repeats || total < min_secs)) {
        double s = now_secs();
        for (int64_t i = 0; i < calls; ++i)
            if (tunehub_gemm(m, n, k, a, lda, b, ldb, c, ldc, bias)) return -1;
        double e = now_secs() - s;
        out[r++] = e / (double)calls;
        total += e;
    }
    *calls_out = calls;
    return r;
}

/* Free the packing buffers of the calling thread and, for a threaded kernel, of its OpenMP
   team (the same pool threads run every call from this thread). The next call allocates
   them again. */
void tunehub_release(void)
{
#if THREADS > 1
    #pragma omp parallel num_threads(THREADS)
    {
        free(tl_a);
        tl_a = 0;
        free(tl_b);
        tl_b = 0;
    }
#endif
    free(tl_a);
    tl_a = 0;
    free(tl_b);
    tl_b = 0;
}

int tunehub_abi_version(void) { return ABI_VERSION; }
"""


def generate_source(p: BlisParams) -> str:
    """The complete C translation unit for ``p``.

    Exports ``tunehub_gemm(m, n, k, A, lda, B, ldb, C, ldc, bias)`` (row-major, returns 0 or
    -1 when a packing buffer cannot be allocated), ``tunehub_bench(...)``,
    ``tunehub_release()`` (frees the packing buffers) and ``tunehub_abi_version()``.
    """
    v = _Vec(p)
    headers = ["stdint.h", "stdlib.h", "string.h", "time.h"]
    if p.isa in ("avx512", "avx2"):
        headers.append("immintrin.h")
    if p.threads > 1:
        headers.append("omp.h")
    entry = _ENTRY_SERIAL if p.threads == 1 else _ENTRY_JC if p.par == "jc" else _ENTRY_IC
    parts = [
        "/* generated by tunehub (blis.gemm): "
        f"{p.dtype} {p.epilogue} {p.isa} MR={p.mr} NR={p.nr} KC={p.kc} MC={p.mc} NC={p.nc} "
        f"UNROLL={p.unroll} threads={p.threads} PAR={p.par} */",
        "#define _POSIX_C_SOURCE 200809L",
        *(f"#include <{h}>" for h in headers),
        f"typedef {p.c_type} T;",
        f"#define MR {p.mr}",
        f"#define NR {p.nr}",
        f"#define KC {p.kc}",
        f"#define MC_EFF {p.mc_eff}",
        f"#define NC_EFF {p.nc_eff}",
        f"#define THREADS {p.threads}",
        f"#define ABI_VERSION {ABI_VERSION}",
    ]
    if p.isa == "generic":
        parts.append(_generic_helpers(p))
    parts.extend([_ukernels(p, v), _DRIVER, entry, _TIMER])
    return "\n".join(parts) + "\n"
