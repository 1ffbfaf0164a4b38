"""C source generation for the BLIS-structured GEMM: loops, packing, micro-kernels, timer."""

from __future__ import annotations

import dataclasses
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
ABI_VERSION = 3
PREFETCH_MAX = 64


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
    prefetch: int = 0  # software prefetch distance of the A and B micro-panels, in k steps
    packb: bool = True  # False: full B micro-panels are read from B in place

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
        if isinstance(self.prefetch, bool) or not isinstance(self.prefetch, int):
            return f"PREFETCH must be an integer, got {self.prefetch!r}"
        if not 0 <= self.prefetch <= PREFETCH_MAX:
            return f"PREFETCH must be in 0..{PREFETCH_MAX}, got {self.prefetch}"
        if not isinstance(self.packb, bool):
            return f"PACKB must be a bool, got {self.packb!r}"
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


def _asm_ukernel(p: BlisParams) -> str:
    """The compute part of the AVX-512 / AVX2 micro-kernel as one GCC inline-asm block.

    Written in asm because GCC's register allocator spills accumulators of the larger tiles
    (6 x 4 zmm leaves 3 spare registers) and reorders the B loads; the hand-placed loop runs
    within a few percent of the FMA peak. Registers: accumulators 0 .. MR*nv-1 (row-major),
    then nv B vectors, then one A broadcast; ``tile_fits`` keeps that within the ISA's
    register file. B rows are ``bs`` bytes apart (NR elements when packed, ldb when read in
    place), so one loop serves both; the raw accumulators go to the aligned tile ``acc`` and
    the epilogue (bias, C, ReLU, partial tiles) is C code that reads them back from L1.
    """
    e = ELEMENT_BYTES[p.dtype]
    reg = "zmm" if p.isa == "avx512" else "ymm"
    sfx = "ps" if p.dtype == "float32" else "pd"
    bcast = "vbroadcastss" if p.dtype == "float32" else "vbroadcastsd"
    vb = ISA_VECTOR_BYTES[p.isa]
    acc_regs = [[f"%%{reg}{i * p.nv + j}" for j in range(p.nv)] for i in range(p.mr)]
    b_regs = [f"%%{reg}{p.mr * p.nv + j}" for j in range(p.nv)]
    a_reg = f"%%{reg}{p.mr * p.nv + p.nv}"
    b_lines = -(-p.nr * e // 64)

    def step(u: int) -> list[str]:
        out = [f"vmovups {j * vb}(%[b]), {b_regs[j]}" for j in range(p.nv)]
        if p.prefetch:
            # A micro-panel: one line per step is enough (MR*e <= 64 bytes for every tile).
            out.append(f"prefetcht0 {(p.prefetch * p.mr + u * p.mr) * e}(%[a])")
            out.extend(f"prefetcht0 {line * 64}(%[b],%[pf],1)" for line in range(b_lines))
        for i in range(p.mr):
            out.append(f"{bcast} {(u * p.mr + i) * e}(%[a]), {a_reg}")
            out.extend(
                f"vfmadd231{sfx} {b_regs[j]}, {a_reg}, {acc_regs[i][j]}" for j in range(p.nv)
            )
        out.append("add %[bs], %[b]")
        return out

    body = [f"vxorps {r}, {r}, {r}" for row in acc_regs for r in row]
    body += ["test %[iters], %[iters]", "jz 2f", ".p2align 5", "1:"]
    for u in range(p.unroll):
        body += step(u)
    body += [f"add ${p.unroll * p.mr * e}, %[a]", "dec %[iters]", "jnz 1b", "2:"]
    body += ["test %[rem], %[rem]", "jz 4f", "3:"]
    body += step(0)
    body += [f"add ${p.mr * e}, %[a]", "dec %[rem]", "jnz 3b", "4:"]
    body += [
        f"vmovaps {acc_regs[i][j]}, {(i * p.nr + j * p.vl) * e}(%[acc])"
        for i in range(p.mr)
        for j in range(p.nv)
    ]
    used = p.mr * p.nv + p.nv + 1
    clobbers = ", ".join(f'"xmm{r}"' for r in range(used))
    asm = "\n".join(f'        "{line}\\n\\t"' for line in body)
    return f"""
static inline __attribute__((always_inline)) void
ukernel(int64_t kc, const T *a, const T *b, int64_t ldb, T *restrict acc)
{{
    int64_t iters = kc / {p.unroll}, rem = kc % {p.unroll};
    int64_t bs = ldb * (int64_t)sizeof(T), pf = {p.prefetch} * bs;
    (void)pf;
    __asm__ volatile(
{asm}
        : [a] "+r"(a), [b] "+r"(b), [iters] "+r"(iters), [rem] "+r"(rem)
        : [bs] "r"(bs), [pf] "r"(pf), [acc] "r"(acc)
        : "cc", "memory", {clobbers});
}}
"""


def _generic_ukernel(p: BlisParams, v: _Vec) -> str:
    """The portable micro-kernel (GCC vector extensions), same contract as ``_asm_ukernel``."""
    lines = []
    for i in range(p.mr):
        decl = ", ".join(f"c{i}_{j} = {v.zero}" for j in range(p.nv))
        lines.append(f"    {v.type} {decl};")
    lines.append(f"    #pragma GCC unroll {p.unroll}")
    lines.append("    for (int64_t p = 0; p < kc; ++p) {")
    if p.prefetch:
        lines.append(f"        __builtin_prefetch(a + {p.prefetch * p.mr});")
        lines.append(f"        __builtin_prefetch(b + {p.prefetch} * ldb);")
    bdecl = ", ".join(f"b{j} = {v.loadu}(b + {j * p.vl})" for j in range(p.nv))
    lines.append(f"        {v.type} {bdecl};")
    for i in range(p.mr):
        lines.append(f"        {{ {v.type} a_ = {v.set1}(a[{i}]);")
        lines.extend(f"          c{i}_{j} = {v.fmadd}(a_, b{j}, c{i}_{j});" for j in range(p.nv))
        lines.append("        }")
    lines.append(f"        a += {p.mr}; b += ldb;")
    lines.append("    }")
    lines.extend(
        f"    vstoreu(acc + {i * p.nr + j * p.vl}, c{i}_{j});"
        for i in range(p.mr)
        for j in range(p.nv)
    )
    body = "\n".join(lines)
    # GCC unrolls this loop itself (UNROLL is an asm-kernel knob; here it only changes the
    # pragma), and the generic kernel is a fallback where speed matters less.
    return f"""
static inline __attribute__((always_inline)) void
ukernel(int64_t kc, const T *a, const T *b, int64_t ldb, T *restrict acc)
{{
{body}
}}
"""


def _masks(p: BlisParams) -> str:
    """Per-vector masks of a partial tile's columns (``rem`` = valid columns left)."""
    if p.isa == "avx512":
        mtype = "__mmask16" if p.dtype == "float32" else "__mmask8"
        sfx = "ps" if p.dtype == "float32" else "pd"
        return f"""
typedef {mtype} mask_t;
static inline mask_t col_mask(int64_t rem)
{{
    return rem >= {p.vl} ? (mask_t)-1 : rem <= 0 ? (mask_t)0 : (mask_t)((1u << rem) - 1);
}}
#define MLOAD(m, ptr) _mm512_maskz_loadu_{sfx}(m, ptr)
#define MSTORE(m, ptr, v) _mm512_mask_storeu_{sfx}(ptr, m, v)
"""
    if p.isa == "avx2":
        f32 = p.dtype == "float32"
        iota = (
            "_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)" if f32 else "_mm256_setr_epi64x(0, 1, 2, 3)"
        )
        cmp = "_mm256_cmpgt_epi32" if f32 else "_mm256_cmpgt_epi64"
        set1 = "_mm256_set1_epi32((int)" if f32 else "_mm256_set1_epi64x((long long)"
        sfx = "ps" if f32 else "pd"
        return f"""
typedef __m256i mask_t;
static inline mask_t col_mask(int64_t rem)
{{
    int64_t r = rem < 0 ? 0 : rem > {p.vl} ? {p.vl} : rem;
    return {cmp}({set1}r), {iota});
}}
#define MLOAD(m, ptr) _mm256_maskload_{sfx}(ptr, m)
#define MSTORE(m, ptr, v) _mm256_maskstore_{sfx}(ptr, m, v)
"""
    return ""


def _ukernels(p: BlisParams, v: _Vec) -> str:
    """The micro-kernel (compute into ``acc``) and the two epilogue stores.

    ``store_full`` writes a full MR x NR tile of C with the epilogue fused into the store
    (bias on the first KC block, accumulate C on later ones, ReLU on the last);
    ``store_edge`` does the same for a partial tile: only its ``mr`` rows, and masked vector
    loads/stores for its ``nr`` columns (AVX-512 and AVX2), so nothing outside C is touched
    and no scalar loop runs; the portable kernel copies edge elements one by one.
    """
    has_bias = p.epilogue in ("bias", "bias_relu")
    has_relu = p.epilogue == "bias_relu"
    compute = _generic_ukernel(p, v) if p.isa == "generic" else _asm_ukernel(p)

    def tile_ops(i: str, j: int, load: str, store: str) -> list[str]:
        # load(ptr) / store(ptr, value) spell full or masked accesses.
        out = [f"{v.type} x_ = {v.load}(acc + {i} * NR + {j * p.vl});"]
        bias_term = f"x_ = {v.add}(x_, {load.format(f'bias + {j * p.vl}')});" if has_bias else ""
        out.append(f"if (first) {{ {bias_term} }}")
        out.append(f"else x_ = {v.add}(x_, {load.format(f'c + {i} * ldc + {j * p.vl}')});")
        if has_relu:
            out.append(f"if (last) x_ = {v.max}(x_, {v.zero});")
        out.append(store.format(f"c + {i} * ldc + {j * p.vl}") + ";")
        return out

    full = []
    for i in range(p.mr):
        for j in range(p.nv):
            ops = tile_ops(str(i), j, v.loadu + "({})", v.storeu + "({}, x_)")
            full.append("    { " + " ".join(ops) + " }")
    if p.isa == "generic":
        edge_body = f"""
    for (int64_t i = 0; i < mr; ++i) {{
        T *restrict ci = c + i * ldc;
        const T *restrict ti = acc + i * NR;
        for (int64_t j = 0; j < nr; ++j) {{
            T x = ti[j];
            if (first) x += {"bias[j]" if has_bias else "0"};
            else x += ci[j];
            {"if (last && !(x > 0)) x = 0;" if has_relu else ""}
            ci[j] = x;
        }}
    }}"""
    else:
        masks = "\n".join(f"    mask_t m{j} = col_mask(nr - {j * p.vl});" for j in range(p.nv))
        rows = []
        for j in range(p.nv):
            # A vector wholly right of the edge has an empty mask: skip it rather than run
            # masked no-ops.
            ops = tile_ops("i", j, f"MLOAD(m{j}, {{}})", f"MSTORE(m{j}, {{}}, x_)")
            rows.append(f"        if (nr > {j * p.vl}) {{ " + " ".join(ops) + " }")
        edge_body = masks + "\n    for (int64_t i = 0; i < mr; ++i) {\n"
        edge_body += "\n".join(rows) + "\n    }"
    nl = "\n"
    return f"""
{_masks(p)}
{compute}

static inline __attribute__((always_inline)) void
store_full(const T *restrict acc, T *restrict c, int64_t ldc, const T *restrict bias, int first,
           int last)
{{
{nl.join(full)}
    (void)bias; (void)last;
}}

static void store_edge(const T *restrict acc, T *restrict c, int64_t ldc, int64_t mr, int64_t nr,
                       const T *restrict bias, int first, int last)
{{
{edge_body}
    (void)bias; (void)last;
}}
"""


def _transpose(p: BlisParams) -> list[str]:
    """In-register transpose of r0..r{w-1} (w rows of w elements) into o0..o{w-1} (columns)."""
    if p.dtype == "float32":
        lines = []
        for h in range(4):
            lo, hi = 2 * h, 2 * h + 1
            lines.append(f"__m256 t{lo} = _mm256_unpacklo_ps(r{lo}, r{hi});")
            lines.append(f"__m256 t{hi} = _mm256_unpackhi_ps(r{lo}, r{hi});")
        for base in (0, 4):
            for q, (x, y, sh) in enumerate(
                [
                    (0, 2, "1, 0, 1, 0"),
                    (0, 2, "3, 2, 3, 2"),
                    (1, 3, "1, 0, 1, 0"),
                    (1, 3, "3, 2, 3, 2"),
                ]
            ):
                lines.append(
                    f"__m256 u{base + q} = _mm256_shuffle_ps(t{base + x}, t{base + y},"
                    f" _MM_SHUFFLE({sh}));"
                )
        for q in range(4):
            lines.append(f"__m256 o{q} = _mm256_permute2f128_ps(u{q}, u{q + 4}, 0x20);")
            lines.append(f"__m256 o{q + 4} = _mm256_permute2f128_ps(u{q}, u{q + 4}, 0x31);")
        return lines
    return [
        "__m256d t0 = _mm256_unpacklo_pd(r0, r1), t1 = _mm256_unpackhi_pd(r0, r1);",
        "__m256d t2 = _mm256_unpacklo_pd(r2, r3), t3 = _mm256_unpackhi_pd(r2, r3);",
        "__m256d o0 = _mm256_permute2f128_pd(t0, t2, 0x20);",
        "__m256d o1 = _mm256_permute2f128_pd(t1, t3, 0x20);",
        "__m256d o2 = _mm256_permute2f128_pd(t0, t2, 0x31);",
        "__m256d o3 = _mm256_permute2f128_pd(t1, t3, 0x31);",
    ]


def _pack_a(p: BlisParams) -> str:
    """pack_a: row-major A into MR-row micro-panels, which is a transpose of each MR x KC block.

    With AVX2 (also on AVX-512 hosts) full panels are transposed W x W at a time in registers
    (W = 8 floats or 4 doubles per 256-bit vector): W rows of W k-values are loaded, transposed,
    and each column (one k, W rows) is stored with one vector store. A group of fewer than W
    rows (MR not a multiple of W) stores a full vector anyway: the extra elements land on the
    next k's start, which the groups are ordered to overwrite afterwards (the last group goes
    first), and past the last panel into PACK_SLACK. Partial panels and the KC tail are scalar.
    """
    scalar_full = """
            for (; p < kc; ++p) {
                const T *restrict src = a + ir * lda + p;
                for (int64_t i = 0; i < MR; ++i) ap[p * MR + i] = src[i * lda];
            }"""
    vector = ""
    if p.isa != "generic":
        w = 32 // ELEMENT_BYTES[p.dtype]
        vt = "__m256" if p.dtype == "float32" else "__m256d"
        sfx = "ps" if p.dtype == "float32" else "pd"
        groups = []
        for g in reversed(range(0, p.mr, w)):
            rows = min(w, p.mr - g)
            body = [
                f"{vt} r{i} = _mm256_loadu_{sfx}(src + {g + i} * lda);"
                if i < rows
                else f"{vt} r{i} = _mm256_setzero_{sfx}();"
                for i in range(w)
            ]
            body += _transpose(p)
            body += [f"_mm256_storeu_{sfx}(ap + (p + {q}) * MR + {g}, o{q});" for q in range(w)]
            groups.append("                { " + "\n                  ".join(body) + " }")
        vector = f"""
            for (; p + {w} <= kc; p += {w}) {{
                const T *restrict src = a + ir * lda + p;
{chr(10).join(groups)}
            }}""".replace("\\n", "\n")
    return f"""
/* A[mc x kc] (row-major, leading dim lda) -> MR-row micro-panels, zero-padded to MR rows:
   panel r holds A[r*MR + i][p] at ap[r*MR*kc + p*MR + i]. */
static void pack_a(int64_t mc, int64_t kc, const T *restrict a, int64_t lda, T *restrict ap)
{{
    for (int64_t ir = 0; ir < mc; ir += MR) {{
        int64_t mr = mc - ir < MR ? mc - ir : MR;
        if (mr == MR) {{
            int64_t p = 0;{vector}{scalar_full}
        }} else {{
            for (int64_t p = 0; p < kc; ++p) {{
                const T *restrict src = a + ir * lda + p;
                int64_t i = 0;
                for (; i < mr; ++i) ap[p * MR + i] = src[i * lda];
                for (; i < MR; ++i) ap[p * MR + i] = 0;
            }}
        }}
        ap += MR * kc;
    }}
}}
"""


_DRIVER = r"""
/* Packing buffers live per thread and are kept between calls, so repeated calls (and the
   timing loop) do not pay for allocation or page faults. They are sized for KC, MC and NC. */
static __thread T *tl_a;
static __thread T *tl_b;

static T *buffer_a(void)
{
    /* PACK_SLACK: the vectorised pack_a may write one vector past the last panel. */
    size_t size = sizeof(T) * ((size_t)MC_EFF * KC + PACK_SLACK);
    if (!tl_a && posix_memalign((void **)&tl_a, 4096, size)) tl_a = 0;
    return tl_a;
}

static T *buffer_b(void)
{
    /* Read in place (PACKB 0), B needs a buffer only for the zero-padded edge panel. */
    size_t cols = PACKB ? (size_t)NC_EFF : (size_t)NR;
    if (!tl_b && posix_memalign((void **)&tl_b, 4096, sizeof(T) * cols * KC)) tl_b = 0;
    return tl_b;
}

PACK_A
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

/* Prepare the KC x nc block of B for the macro-kernel: pack every micro-panel (PACKB 1), or
   only the partial last one (PACKB 0: full panels are read where they are). */
static void pack_b(int64_t kc, int64_t nc, const T *restrict b, int64_t ldb, T *restrict bp)
{
    if (PACKB) {
        for (int64_t jr = 0; jr < nc; jr += NR)
            pack_b_panel(kc, nc - jr < NR ? nc - jr : NR, b + jr, ldb, bp + jr * kc);
    } else if (nc % NR) {
        pack_b_panel(kc, nc % NR, b + nc - nc % NR, ldb, bp);
    }
}

/* The two innermost loops: B micro-panel (jr) stays in L1 while A micro-panels (ir) stream.
   `b` is the unpacked KC x nc block (used when PACKB is 0), `bp` what pack_b made of it. */
static void macro_kernel(int64_t mc, int64_t nc, int64_t kc, const T *ap, const T *bp,
                         const T *b, int64_t ldb, T *c, int64_t ldc, const T *bias, int first,
                         int last)
{
    T acc[MR * NR] __attribute__((aligned(64)));
    for (int64_t jr = 0; jr < nc; jr += NR) {
        int64_t nr = nc - jr < NR ? nc - jr : NR;
        const T *bpan = PACKB ? bp + jr * kc : nr == NR ? b + jr : bp;
        int64_t bstride = PACKB || nr < NR ? NR : ldb;
        const T *bj = bias ? bias + jr : 0;
        for (int64_t ir = 0; ir < mc; ir += MR) {
            int64_t mr = mc - ir < MR ? mc - ir : MR;
            T *cij = c + ir * ldc + jr;
            /* C rows are fetched for writing while the k loop runs, so the store doesn't
               stall on them. */
            for (int64_t i = 0; i < mr; ++i) {
                __builtin_prefetch(cij + i * ldc, 1, 3);
                __builtin_prefetch(cij + i * ldc + nr - 1, 1, 3);
            }
            ukernel(kc, ap + ir * kc, bpan, bstride, acc);
            if (mr == MR && nr == NR)
                store_full(acc, cij, ldc, bj, first, last);
            else
                store_edge(acc, cij, ldc, mr, nr, bj, first, last);
        }
    }
}

/* The block size for `total` in the fewest blocks of at most `max` (a multiple of `align`),
   made equal up to `align`: K = 777 with KC = 384 runs as 259 x 3, not 384 + 384 + 9, whose
   thin last block pays a full pass over C for little work. */
static int64_t balanced(int64_t total, int64_t max, int64_t align)
{
    if (total <= 0) return max;
    int64_t blocks = (total + max - 1) / max;
    int64_t size = (total + blocks - 1) / blocks;
    size = (size + align - 1) / align * align;
    return size < max ? size : max;
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
        int64_t kc_step = balanced(k, KC, 1);
        for (int64_t pc = 0; pc < k; pc += kc_step) {
            int64_t kc = k - pc < kc_step ? k - pc : kc_step;
            int first = pc == 0, last = pc + kc == k;
            const T *bk = b + pc * ldb + jc;
            pack_b(kc, nc, bk, ldb, bp);
            int64_t mc_step = balanced(m, MC_EFF, MR);
            for (int64_t ic = 0; ic < m; ic += mc_step) {
                int64_t mc = m - ic < mc_step ? m - ic : mc_step;
                pack_a(mc, kc, a + ic * lda + pc, lda, ap);
                macro_kernel(mc, nc, kc, ap, bp, bk, ldb, c + ic * ldc + jc, ldc,
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

# No PAR=jr: on the machines this targets (each core with its own L2), splitting jr makes the
# threads share one A block and one B panel, so they pay a barrier per KC block for nothing
# PAR=ic (private A blocks, shared B) and PAR=jc (private everything, no barriers) lack; jr pays
# where many cores share an L2 and M is too small to split by ic (BLIS on Xeon Phi).
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
            int64_t kc_step = balanced(k, KC, 1);
            for (int64_t pc = 0; pc < k; pc += kc_step) {
                int64_t kc = k - pc < kc_step ? k - pc : kc_step;
                int first = pc == 0, last = pc + kc == k;
                const T *bk = b + pc * ldb + jc;
                if (PACKB) {
                    #pragma omp for schedule(static)
                    for (int64_t jr = 0; jr < nc; jr += NR)
                        pack_b_panel(kc, nc - jr < NR ? nc - jr : NR, bk + jr, ldb,
                                     bp + jr * kc);
                } else {
                    #pragma omp single
                    pack_b(kc, nc, bk, ldb, bp);
                }
                if (ap) {
                    int64_t mc_step = balanced(hi - lo, MC_EFF, MR);
                    for (int64_t ic = lo; ic < hi; ic += mc_step) {
                        int64_t mc = hi - ic < mc_step ? hi - ic : mc_step;
                        pack_a(mc, kc, a + ic * lda + pc, lda, ap);
                        macro_kernel(mc, nc, kc, ap, bp, bk, ldb, c + ic * ldc + jc, ldc,
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

/* The CPU clocks of the threads that run a call (the OpenMP team: the same pool threads run
   every call from this thread). A repeat during which each of them ran the whole time had the
   timed cores to itself; one that ran less was off its CPU (preempted by another process,
   waiting for a CPU to wake up on): the repeat was disturbed. The clocks are exact (the
   kernel adds the running slice), unlike the run-queue waits of /proc/.../schedstat, which a
   thread is charged only once it runs again, often after the repeat that suffered them. */
static int team_clocks(clockid_t *clocks)
{
    int n = THREADS;
#if THREADS > 1
    #pragma omp parallel num_threads(THREADS)
    {
        clockid_t id;
        int i = omp_get_thread_num();
        if (i < THREADS) clocks[i] = pthread_getcpuclockid(pthread_self(), &id) == 0 ? id : -1;
        if (omp_get_num_threads() < THREADS && i == 0) n = omp_get_num_threads();
    }
#else
    clocks[0] = CLOCK_THREAD_CPUTIME_ID;
#endif
    for (int i = 0; i < n; ++i)
        if (clocks[i] == (clockid_t)-1) return 0;
    return n;
}

static void team_cpu(const clockid_t *clocks, int n, double *cpu)
{
    struct timespec ts;
    for (int i = 0; i < n; ++i)
        cpu[i] = clock_gettime(clocks[i], &ts) == 0
                     ? (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec : -1.0;
}

/* Warm up for warmup_secs (at least one call), then time repeats until min_secs in total and
   at least min_repeats, at most max_repeats. A repeat is `calls` back-to-back calls (enough
   for repeat_min_secs, so tiny GEMMs are not clock-bound); out[r] is its time per call and
   off[r] the largest share of it one of the team's threads spent off its CPU (-1: unknown).
   Inputs and C stay where they are between calls: caches are warm. Returns the number of
   repeats, or -1 if a call failed. */
static int64_t bench_loop(int64_t m, int64_t n, int64_t k, const T *a, int64_t lda, const T *b,
                          int64_t ldb, T *c, int64_t ldc, const T *bias, double warmup_secs,
                          double min_secs, double repeat_min_secs, int64_t min_repeats,
                          int64_t max_repeats, double *out, int64_t *calls_out, double *off)
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
    clockid_t clocks[THREADS];
    double cpu0[THREADS], cpu1[THREADS];
    int team = team_clocks(clocks);
    double total = 0;
    int64_t r = 0;
    while (r < max_repeats && (r < min_repeats || total < min_secs)) {
        if (team) team_cpu(clocks, team, cpu0);
        double s = now_secs();
        for (int64_t i = 0; i < calls; ++i)
            if (tunehub_gemm(m, n, k, a, lda, b, ldb, c, ldc, bias)) return -1;
        double e = now_secs() - s;
        off[r] = -1.0;
        if (team && e > 0) {
            team_cpu(clocks, team, cpu1);
            /* The clocks are read just outside the timed region, so a thread that ran the
               whole repeat shows a little more CPU time than it lasted: that is 0 off. */
            double worst = 0;
            for (int i = 0; i < team && worst >= 0; ++i) {
                double gone = 1.0 - (cpu1[i] - cpu0[i]) / e;
                worst = cpu0[i] < 0 || cpu1[i] < 0 ? -1.0 : gone > worst ? gone : worst;
            }
            off[r] = worst;
        }
        out[r++] = e / (double)calls;
        total += e;
    }
    *calls_out = calls;
    return r;
}

/* bench_loop, with a single-threaded kernel pinned to the CPU it starts on (so the scheduler
   cannot migrate it mid-repeat and make it refill its L1/L2), and the caller's affinity put
   back afterwards. *cpu_out is that CPU, or -1 when not pinned (threaded kernels: the OpenMP
   team places itself). */
int64_t tunehub_bench(int64_t m, int64_t n, int64_t k, const T *a, int64_t lda, const T *b,
                      int64_t ldb, T *c, int64_t ldc, const T *bias, double warmup_secs,
                      double min_secs, double repeat_min_secs, int64_t min_repeats,
                      int64_t max_repeats, double *out, int64_t *calls_out, int64_t *cpu_out,
                      double *off)
{
    *cpu_out = -1;
#if THREADS == 1
    cpu_set_t saved, one;
    int cpu = sched_getcpu();
    int pinned = 0;
    if (cpu >= 0 && sched_getaffinity(0, sizeof saved, &saved) == 0) {
        CPU_ZERO(&one);
        CPU_SET(cpu, &one);
        pinned = sched_setaffinity(0, sizeof one, &one) == 0;
        if (pinned) *cpu_out = cpu;
    }
#endif
    int64_t r = bench_loop(m, n, k, a, lda, b, ldb, c, ldc, bias, warmup_secs, min_secs,
                           repeat_min_secs, min_repeats, max_repeats, out, calls_out, off);
#if THREADS == 1
    if (pinned) sched_setaffinity(0, sizeof saved, &saved);
#endif
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


# bmm (the blis.bmm template): ``batch`` products over the gemm's loop nest. BPAR_BATCH: the
# threads split the batch, each running the serial loop nest on whole entries with its own
# packing buffers; else every entry runs the gemm entry (threaded as PAR says) in turn.
_BMM = r"""
int tunehub_bmm(int64_t batch, int64_t m, int64_t n, int64_t k, const T *a, int64_t lda,
                int64_t sa, const T *b, int64_t ldb, int64_t sb, T *c, int64_t ldc, int64_t sc)
{
    int failed = 0;
    if (sb == 0 && sa == m * lda && sc == m * ldc) {
        /* One B for every entry, A's and C's entries back to back: the batch is one GEMM of
           batch*m rows, whose blocks of B are packed once for every entry (not once per
           entry) and whose MC blocks span entries (a small m fills them). */
#if BPAR_BATCH
        #pragma omp parallel num_threads(THREADS) reduction(|:failed)
        {
            int64_t lo, hi;
            split_range(batch * m, omp_get_num_threads(), MR, omp_get_thread_num(), &lo, &hi);
            if (lo < hi)
                failed |= gemm_cols(hi - lo, 0, n, k, a + lo * lda, lda, b, ldb, c + lo * ldc,
                                    ldc, 0) != 0;
        }
#else
        failed = gemm_entry(batch * m, n, k, a, lda, b, ldb, c, ldc, 0) != 0;
#endif
        return failed ? -1 : 0;
    }
#if BPAR_BATCH
    #pragma omp parallel for num_threads(THREADS) schedule(static) reduction(|:failed)
    for (int64_t i = 0; i < batch; ++i)
        failed |= gemm_cols(m, 0, n, k, a + i * sa, lda, b + i * sb, ldb, c + i * sc, ldc, 0) != 0;
#else
    for (int64_t i = 0; i < batch && !failed; ++i)
        failed = gemm_entry(m, n, k, a + i * sa, lda, b + i * sb, ldb, c + i * sc, ldc, 0) != 0;
#endif
    return failed ? -1 : 0;
}

/* The call tunehub_bench times: the bmm whose batch and strides tunehub_bmm_shape set, with
   the first entry's operands as arguments (one process times one kernel at a time). */
static int64_t g_batch = 1, g_sa, g_sb, g_sc;

void tunehub_bmm_shape(int64_t batch, int64_t sa, int64_t sb, int64_t sc)
{
    g_batch = batch;
    g_sa = sa;
    g_sb = sb;
    g_sc = sc;
}

int tunehub_gemm(int64_t m, int64_t n, int64_t k, const T *a, int64_t lda, const T *b,
                 int64_t ldb, T *c, int64_t ldc, const T *bias)
{
    (void)bias;
    return tunehub_bmm(g_batch, m, n, k, a, lda, g_sa, b, ldb, g_sb, c, ldc, g_sc);
}
"""


def generate_source(p: BlisParams, *, bmm: str | None = None) -> str:
    """The complete C translation unit for ``p``.

    Exports ``tunehub_gemm(m, n, k, A, lda, B, ldb, C, ldc, bias)`` (row-major, returns 0 or
    -1 when a packing buffer cannot be allocated), ``tunehub_bench(...)``,
    ``tunehub_release()`` (frees the packing buffers) and ``tunehub_abi_version()``.

    ``bmm`` (``"batch"`` or ``"inner"``: which loop the threads split) makes the batched
    unit instead: ``tunehub_bmm(batch, m, n, k, A, lda, sa, B, ldb, sb, C, ldc, sc)`` (sa, sb,
    sc: the batch strides; sb 0 shares one B), ``tunehub_bmm_shape(batch, sa, sb, sc)``, and
    ``tunehub_gemm`` / ``tunehub_bench`` time that bmm.
    """
    if bmm is not None:
        return _generate_bmm(p, bmm)
    v = _Vec(p)
    headers = ["pthread.h", "sched.h", "stdint.h", "stdlib.h", "string.h", "time.h"]
    if p.isa in ("avx512", "avx2"):
        headers.append("immintrin.h")
    if p.threads > 1:
        headers.append("omp.h")
    entry = _ENTRY_SERIAL if p.threads == 1 else _ENTRY_JC if p.par == "jc" else _ENTRY_IC
    parts = [
        "/* generated by tunehub (blis.gemm): "
        f"{p.dtype} {p.epilogue} {p.isa} MR={p.mr} NR={p.nr} KC={p.kc} MC={p.mc} NC={p.nc} "
        f"UNROLL={p.unroll} threads={p.threads} PAR={p.par} PREFETCH={p.prefetch} "
        f"PACKB={int(p.packb)} */",
        "#define _GNU_SOURCE",
        *(f"#include <{h}>" for h in headers),
        f"typedef {p.c_type} T;",
        f"#define MR {p.mr}",
        f"#define NR {p.nr}",
        f"#define KC {p.kc}",
        f"#define MC_EFF {p.mc_eff}",
        f"#define NC_EFF {p.nc_eff}",
        f"#define THREADS {p.threads}",
        f"#define PACKB {int(p.packb)}",
        f"#define PACK_SLACK {32 // ELEMENT_BYTES[p.dtype]}",
        f"#define ABI_VERSION {ABI_VERSION}",
    ]
    if p.isa == "generic":
        parts.append(_generic_helpers(p))
    parts.extend([_ukernels(p, v), _DRIVER.replace("PACK_A\n", _pack_a(p)), entry, _TIMER])
    return "\n".join(parts) + "\n"


def _generate_bmm(p: BlisParams, bpar: str) -> str:
    if bpar not in ("batch", "inner"):
        raise ValueError(f"BPAR must be batch or inner, got {bpar!r}")
    batch_threads = bpar == "batch" and p.threads > 1
    # The gemm entry each inner entry runs; the batch split runs the serial nest per thread.
    serial = dataclasses.replace(p, threads=1, par="ic")
    source = generate_source(serial if batch_threads else p)
    head, timer = source.split(_TIMER, 1)
    entry = _ENTRY_SERIAL if batch_threads or p.threads == 1 else None
    if entry is None:
        entry = _ENTRY_JC if p.par == "jc" else _ENTRY_IC
    renamed = entry.replace("int tunehub_gemm(", "static __attribute__((unused)) int gemm_entry(")
    head = head.replace(entry, renamed)
    if batch_threads:
        head = head.replace("#define THREADS 1\n", f"#define THREADS {p.threads}\n")
        head = head.replace("#include <pthread.h>", "#include <omp.h>\n#include <pthread.h>")
    head = head.replace(
        "/* generated by tunehub (blis.gemm): ", f"/* generated by tunehub (blis.bmm BPAR={bpar}): "
    )
    defines = f"#define BPAR_BATCH {int(batch_threads)}\n"
    return head + defines + _BMM + _TIMER + timer
