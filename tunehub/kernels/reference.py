"""The numpy reference for GEMM (+ epilogue) and the check that compares a kernel's output to it."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tunehub.core import Workload

Array = npt.NDArray[np.floating]

# Full checks up to this many multiply-adds; above it, a row sample (see check_gemm).
FULL_CHECK_MACS = 1 << 30
SAMPLE_EDGE_ROWS = 64
SAMPLE_RANDOM_ROWS = 128


def random_operands(
    workload: Workload, rng: np.random.Generator
) -> tuple[Array, Array, Array | None]:
    """Fresh A, B (and bias) uniform in [-1, 1), in the workload's dtype, stored as its
    layouts say (a column-major operand is a Fortran-ordered array)."""
    dtype = np.dtype(workload.dtype)
    a = rng.uniform(-1.0, 1.0, (workload.m, workload.k)).astype(dtype)
    b = rng.uniform(-1.0, 1.0, (workload.k, workload.n)).astype(dtype)
    if workload.a_layout == "col_major":
        a = np.asfortranarray(a)
    if workload.b_layout == "col_major":
        b = np.asfortranarray(b)
    bias = None
    if workload.epilogue in ("bias", "bias_relu"):
        bias = rng.uniform(-1.0, 1.0, workload.n).astype(dtype)
    return a, b, bias


def poisoned_output(workload: Workload) -> Array:
    """C filled with NaN, so an element a kernel forgets to write fails the check."""
    return np.full((workload.m, workload.n), np.nan, dtype=np.dtype(workload.dtype))


def reference_gemm(a: Array, b: Array, bias: Array | None, epilogue: str) -> Array:
    """``epilogue(A @ B + bias)`` accumulated in float64 (products of float32 inputs are exact)."""
    out: Array = a.astype(np.float64) @ b.astype(np.float64)
    if epilogue in ("bias", "bias_relu"):
        if bias is None:
            raise ValueError(f"epilogue {epilogue!r} needs a bias")
        out += bias.astype(np.float64)
    if epilogue == "bias_relu":
        np.maximum(out, 0.0, out=out)
    return out


def error_factor(k: int) -> float:
    """How many ulps of sum(|a||b|) a correct k-term dot product may be off by.

    The worst-case bound grows like k; rounding errors of real (blocked, FMA) sums on random
    data grow like sqrt(k), which is what we allow (with headroom), so that a kernel dropping
    even one product term of a long sum is still caught.
    """
    return 2.0 * math.sqrt(k) + 8.0


@dataclass(frozen=True)
class GemmCheck:
    """The outcome of comparing a kernel's C against the reference."""

    ok: bool
    checked_rows: int
    bad: int  # elements outside tolerance (or not finite)
    max_abs_err: float
    max_err_ratio: float  # max |c - ref| / tolerance; <= 1 when ok
    message: str


def sample_rows(m: int, n: int, k: int, rng: np.random.Generator) -> npt.NDArray[np.intp] | None:
    """Rows to check: all (None) when the reference is cheap, else both edges and a sample."""
    if m * n * k <= FULL_CHECK_MACS or m <= 2 * SAMPLE_EDGE_ROWS + SAMPLE_RANDOM_ROWS:
        return None
    edges = np.r_[0:SAMPLE_EDGE_ROWS, m - SAMPLE_EDGE_ROWS : m]
    middle = rng.choice(
        np.arange(SAMPLE_EDGE_ROWS, m - SAMPLE_EDGE_ROWS), SAMPLE_RANDOM_ROWS, replace=False
    )
    return np.unique(np.concatenate([edges, middle])).astype(np.intp)


def check_gemm(
    c: Array,
    a: Array,
    b: Array,
    bias: Array | None,
    epilogue: str,
    *,
    rows: npt.NDArray[np.intp] | None = None,
) -> GemmCheck:
    """Compare ``c`` with the reference, element by element.

    Every element of ``c`` must be finite (a NaN left from the poisoned buffer means a tile was
    never written). On ``rows`` (all when None) each element must be within
    ``eps(dtype) * error_factor(k) * (|A||B| + |bias|)_ij`` of the float64 reference.
    """
    m, k = a.shape
    n = b.shape[1]
    if c.shape != (m, n):
        return GemmCheck(False, 0, c.size, math.inf, math.inf, f"C has shape {c.shape}")
    nonfinite = int(np.count_nonzero(~np.isfinite(c)))
    a_rows = a if rows is None else a[rows]
    c_rows = c if rows is None else c[rows]
    ref = reference_gemm(a_rows, b, bias, epilogue)
    eps = float(np.finfo(c.dtype).eps)
    scale = np.abs(a_rows).astype(np.float64) @ np.abs(b).astype(np.float64)
    if bias is not None and epilogue != "none":
        scale += np.abs(bias).astype(np.float64)
    tol = eps * error_factor(k) * scale + np.finfo(c.dtype).tiny
    err = np.abs(c_rows.astype(np.float64) - ref)
    with np.errstate(invalid="ignore"):
        ratio = err / tol
        bad_mask = ~(err <= tol)
    bad_in_rows = int(np.count_nonzero(bad_mask))
    finite = np.isfinite(err)
    max_abs = float(err[finite].max()) if finite.any() else math.inf
    max_ratio = float(ratio[finite].max()) if finite.any() else math.inf
    if not finite.all():
        max_abs = max_ratio = math.inf
    bad = bad_in_rows + nonfinite - int(np.count_nonzero(~np.isfinite(c_rows)))
    checked = m if rows is None else len(rows)
    if bad == 0:
        return GemmCheck(True, checked, 0, max_abs, max_ratio, "")
    if bad_in_rows:
        i, j = (int(x) for x in np.argwhere(bad_mask)[0])
        row = i if rows is None else int(rows[i])
        where = (
            f"first at C[{row}, {j}] = {c[row, j]!r}, expected {ref[i, j]!r} "
            f"(tolerance {tol[i, j]:.3g})"
        )
    else:
        i, j = (int(x) for x in np.argwhere(~np.isfinite(c))[0])
        where = f"first at C[{i}, {j}] = {c[i, j]!r}"
    message = (
        f"{bad} of {c.size} elements wrong ({nonfinite} not finite), max abs error "
        f"{max_abs:.3g} ({max_ratio:.3g}x tolerance), {where}"
    )
    return GemmCheck(False, checked, bad, max_abs, max_ratio, message)
