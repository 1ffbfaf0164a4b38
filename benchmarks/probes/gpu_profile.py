"""Profile: tunehub's Triton GEMM against Inductor's generated kernel, same shapes, same tiles.

Run on the GPU machine from the repository root (one call does every step)::

    PYTHONPATH=. python3 benchmarks/probes/gpu_profile.py --out "$OUT"            # all shapes
    PYTHONPATH=. python3 benchmarks/probes/gpu_profile.py --out "$OUT" --case 1024x1024x1024

Per shape (float16, A row-major, B column-major as an nn.Linear weight): compiles ``a @ b``
with ``torch.compile(mode="max-autotune-no-cudagraphs")`` (Inductor prints its autotuning
table to stderr; its generated code lands in ``TORCHINDUCTOR_CACHE_DIR``), then checks and
times side by side, in alternating rounds, by tunehub's timing policy (L2 flushed before every
repeat, CUDA-graph replay, median): cuBLAS, Inductor's compiled function, tunehub's variants at
fixed tiles, and probe kernels written here that differ from tunehub's in one respect each
(shapes and strides as compile-time constants with contiguity hints, as Inductor's template
has them; host-side TMA descriptors instead of device-side ones). It also records what each
call launches (torch.profiler: kernels per call, device time per kernel), the host time per
eager call, the same kernel timed eagerly (no graph), and the compiled kernels' registers,
spills and shared memory. ``--ncu`` re-runs one shape's kernels under Nsight Compute in a
child process (``--clock-control none``) and writes its CSV.
"""

# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # ncu

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from tunehub.kernels import triton_gemm_kernels as tg  # noqa: E402
from tunehub.kernels.gpu_timing import gpu_environment, time_gpu  # noqa: E402

CASES = [(1024, 1024, 1024), (2048, 2048, 2048), (127, 5000, 2048), (3000, 1000, 4000)]
# (variant, BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, GROUP_M, extra)
CONFIGS: list[tuple[str, int, int, int, int, int, int, dict[str, Any]]] = [
    ("tiled", 64, 128, 64, 4, 3, 8, {}),
    ("tiled", 64, 128, 64, 4, 4, 8, {}),
    ("tiled", 128, 128, 64, 8, 3, 8, {}),
    ("persistent", 64, 128, 64, 4, 3, 8, {"FLATTEN": False}),
    ("tma", 64, 128, 64, 4, 3, 8, {"FLATTEN": False}),
    ("tma", 64, 128, 64, 4, 3, 8, {"FLATTEN": True}),
    ("tma", 128, 128, 64, 8, 3, 8, {"FLATTEN": False}),
    ("tma", 128, 256, 64, 8, 3, 16, {"FLATTEN": True}),
]


# ---------------------------------------------------------------------------------------------
# Probe kernels: tunehub's tiled kernel with everything Inductor's template bakes in made
# constant, and tunehub's TMA kernel with host-side descriptors.
# ---------------------------------------------------------------------------------------------


@triton.jit
def _const_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    M: tl.constexpr,
    N: tl.constexpr,
    K: tl.constexpr,
    stride_am: tl.constexpr,
    stride_ak: tl.constexpr,
    stride_bk: tl.constexpr,
    stride_bn: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (pid % num_pid_in_group) % group_size_m
    pid_n = (pid % num_pid_in_group) // group_size_m
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ram = tl.max_contiguous(tl.multiple_of(rm % M, BLOCK_M), BLOCK_M)
    rbn = tl.max_contiguous(tl.multiple_of(rn % N, BLOCK_N), BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(0, tl.cdiv(K, BLOCK_K)):
        kk = kt * BLOCK_K + rk
        a = tl.load(a_ptr + ram[:, None] * stride_am + kk[None, :] * stride_ak)
        b = tl.load(b_ptr + kk[:, None] * stride_bk + rbn[None, :] * stride_bn)
        acc += tl.dot(a, b)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc.to(tl.float16), mask=mask)


@triton.jit
def _host_tma_kernel(
    a_desc,
    b_desc,
    c_ptr,
    M,
    N,
    K,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    NUM_SMS: tl.constexpr,
):
    start_pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    num_tiles = num_pid_m * num_pid_n
    tile_id_c = start_pid - NUM_SMS
    for tile_id in tl.range(start_pid, num_tiles, NUM_SMS):
        num_pid_in_group = GROUP_M * num_pid_n
        group_id = tile_id // num_pid_in_group
        first_pid_m = group_id * GROUP_M
        group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
        pid_m = first_pid_m + (tile_id % num_pid_in_group) % group_size_m
        pid_n = (tile_id % num_pid_in_group) // group_size_m
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kt in range(k_tiles):
            a = a_desc.load([pid_m * BLOCK_M, kt * BLOCK_K])
            b = b_desc.load([pid_n * BLOCK_N, kt * BLOCK_K]).T
            acc = tl.dot(a, b, acc)
        tile_id_c += NUM_SMS
        group_id = tile_id_c // num_pid_in_group
        first_pid_m = group_id * GROUP_M
        group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
        pid_m = first_pid_m + (tile_id_c % num_pid_in_group) % group_size_m
        pid_n = (tile_id_c % num_pid_in_group) // group_size_m
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = (rm[:, None] < M) & (rn[None, :] < N)
        tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc.to(tl.float16), mask=mask)


def const_call(a, b, c, bm, bn, bk, warps, stages, group):
    m, k = a.shape
    n = b.shape[1]
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    args = dict(
        M=m,
        N=n,
        K=k,
        stride_am=a.stride(0),
        stride_ak=a.stride(1),
        stride_bk=b.stride(0),
        stride_bn=b.stride(1),
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_K=bk,
        GROUP_M=group,
        num_warps=warps,
        num_stages=stages,
    )
    if k % bk:
        raise ValueError("probe kernel takes K divisible by BLOCK_K only")
    return lambda: _const_kernel[grid](a, b, c, **args)


def host_tma_call(a, b, c, bm, bn, bk, warps, stages, group, num_sms):
    from triton.tools.tensor_descriptor import TensorDescriptor

    m, k = a.shape
    n = b.shape[1]
    a_desc = TensorDescriptor.from_tensor(a, [bm, bk])
    b_desc = TensorDescriptor.from_tensor(b.t(), [bn, bk])  # B column-major: N x K row-major
    grid = (min(num_sms, triton.cdiv(m, bm) * triton.cdiv(n, bn)),)
    return lambda: _host_tma_kernel[grid](
        a_desc,
        b_desc,
        c,
        m,
        n,
        k,
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_K=bk,
        GROUP_M=group,
        NUM_SMS=num_sms,
        num_warps=warps,
        num_stages=stages,
    )


# ---------------------------------------------------------------------------------------------


def label(c: tuple[Any, ...]) -> str:
    variant, bm, bn, bk, w, s, g, extra = c
    flat = "" if "FLATTEN" not in extra else (" F" if extra["FLATTEN"] else " noF")
    return f"{variant} {bm}x{bn}x{bk} w{w} s{s} g{g}{flat}"


def config_dict(c: tuple[Any, ...]) -> dict[str, Any]:
    variant, bm, bn, bk, w, s, g, extra = c
    return {
        "variant": variant,
        "BLOCK_M": bm,
        "BLOCK_N": bn,
        "BLOCK_K": bk,
        "GROUP_M": g,
        "num_warps": w,
        "num_stages": s,
        "SPLIT_K": 1,
        **extra,
    }


def operands(m: int, n: int, k: int, seed: int = 0) -> tuple[Any, Any, Any]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.empty((m, k), dtype=torch.float16, device="cuda").uniform_(-1, 1, generator=g)
    b = torch.empty((n, k), dtype=torch.float16, device="cuda").uniform_(-1, 1, generator=g).t()
    bias = torch.empty(n, dtype=torch.float16, device="cuda").uniform_(-1, 1, generator=g)
    return a, b, bias


def rel_err(out: Any, ref: Any) -> float:
    out = out.float()
    if not bool(torch.isfinite(out).all()):
        return math.inf
    return float(torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref))


def profile_kernels(call: Any, calls: int = 20) -> list[dict[str, Any]]:
    """What ``calls`` eager calls launch on the GPU: kernel names, counts, mean device µs."""
    from torch.profiler import ProfilerActivity, profile

    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        if "CUDA" not in str(getattr(e, "device_type", "")):
            continue
        dev = getattr(e, "self_device_time_total", 0.0) or getattr(e, "device_time_total", 0.0)
        rows.append({"kernel": e.key[:120], "per_call": e.count / calls, "mean_us": dev / e.count})
    return rows


def host_us_per_call(call: Any, calls: int = 200) -> float:
    """Host time to issue one eager call (launch overhead); the GPU queue absorbs the work."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    host = (time.perf_counter() - start) / calls
    torch.cuda.synchronize()
    return host * 1e6


def eager_event_us(call: Any, reps: int = 50) -> float:
    """Median of CUDA events around single eager launches (no graph), L2 flushed before each."""
    flush = torch.empty(2 * 50 * 2**20 // 4, dtype=torch.int32, device="cuda")
    times = []
    for _ in range(reps):
        flush.zero_()
        begin = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        begin.record()
        call()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end) * 1e3)
    return statistics.median(times)


def kernel_resources(kernel: Any) -> list[dict[str, Any]]:
    """Registers, spills and shared memory of every compiled specialisation of a JIT kernel."""
    out: list[dict[str, Any]] = []
    try:
        caches = list(getattr(kernel, "device_caches", {}).values())
    except Exception:
        return out
    for cache in caches:
        for compiled in cache[0].values():
            with contextlib.suppress(Exception):
                compiled._init_handles()
            md = compiled.metadata
            out.append(
                {
                    "name": compiled.name,
                    "n_regs": getattr(compiled, "n_regs", None),
                    "n_spills": getattr(compiled, "n_spills", None),
                    "shared": getattr(md, "shared", None),
                    "num_warps": getattr(md, "num_warps", None),
                    "num_stages": getattr(md, "num_stages", None),
                    "ptx_ld_global": compiled.asm.get("ptx", "").count("ld.global"),
                    "ptx_cp_async": compiled.asm.get("ptx", "").count("cp.async.cg")
                    + compiled.asm.get("ptx", "").count("cp.async.ca"),
                    "ptx_tma": compiled.asm.get("ptx", "").count("cp.async.bulk.tensor"),
                    "ptx_wgmma": compiled.asm.get("ptx", "").count("wgmma.mma_async"),
                    "ptx_tensormap": compiled.asm.get("ptx", "").count("tensormap"),
                }
            )
    return out


def run_case(shape: tuple[int, int, int], bias: bool, rounds: int, num_sms: int) -> dict[str, Any]:
    m, n, k = shape
    a, b, bias_t = operands(m, n, k)
    ref = a.float() @ b.float() + (bias_t.float() if bias else 0)
    flops = 2.0 * m * n * k
    row: dict[str, Any] = {"case": f"{m}x{n}x{k}", "bias": bias, "sides": []}
    sides: list[tuple[str, Any, Any]] = []  # (name, call, out)

    out_cublas = torch.empty((m, n), dtype=torch.float16, device="cuda")
    if bias:
        sides.append(("cuBLAS", lambda: torch.addmm(bias_t, a, b, out=out_cublas), out_cublas))
    else:
        sides.append(("cuBLAS", lambda: torch.matmul(a, b, out=out_cublas), out_cublas))

    torch._dynamo.reset()
    fn = (lambda x, y, z: x @ y + z) if bias else (lambda x, y, z: x @ y)
    sys.stderr.write(f"=== Inductor compile {m}x{n}x{k} bias={bias}\n")
    start = time.monotonic()
    compiled = torch.compile(fn, mode="max-autotune-no-cudagraphs", dynamic=False)
    compiled(a, b, bias_t)
    torch.cuda.synchronize()
    row["compile_secs"] = time.monotonic() - start
    holder: dict[str, Any] = {}

    def inductor() -> Any:
        holder["out"] = compiled(a, b, bias_t)
        return holder["out"]

    sides.append(("inductor", inductor, None))

    for c in CONFIGS:
        out = torch.full((m, n), math.nan, dtype=torch.float16, device="cuda")
        try:
            launch = tg.bind(
                a,
                b,
                bias_t if bias else None,
                out,
                epilogue="bias" if bias else "none",
                config=config_dict(c),
                num_sms=num_sms,
            )
        except ValueError as exc:
            row.setdefault("skipped", []).append(f"{label(c)}: {exc}")
            continue
        sides.append(("tunehub " + label(c), launch, out))
    if not bias:
        for probe, maker in (("probe const+hints tiled", const_call), ("probe host-TMA", None)):
            for c in CONFIGS:
                if (probe.endswith("tiled") and c[0] != "tiled") or (
                    probe.endswith("TMA") and c[0] != "tma"
                ):
                    continue
                if probe.endswith("TMA") and c[7].get("FLATTEN"):
                    continue
                out = torch.full((m, n), math.nan, dtype=torch.float16, device="cuda")
                try:
                    if maker is not None:
                        call = maker(a, b, out, *c[1:7])
                    else:
                        call = host_tma_call(a, b, out, *c[1:7], num_sms)
                except ValueError as exc:
                    row.setdefault("skipped", []).append(f"{probe} {label(c)}: {exc}")
                    continue
                sides.append((f"{probe} {label(c)}", call, out))

    checked: list[tuple[str, Any]] = []
    for name, call, out in sides:
        entry: dict[str, Any] = {"name": name}
        try:
            got = call()
            torch.cuda.synchronize()
            got = out if out is not None else got
            entry["rel_err"] = rel_err(got, ref)
            if not entry["rel_err"] < 2e-3:
                entry["error"] = "wrong answer"
            else:
                checked.append((name, call))
                entry["kernels"] = profile_kernels(call)
                entry["host_us_per_call"] = host_us_per_call(call)
                entry["eager_event_us"] = eager_event_us(call)
        except Exception as exc:
            entry["error"] = f"{type(exc).__name__}: {exc}"[:800]
            traceback.print_exc()
        row["sides"].append(entry)
    medians: dict[str, list[float]] = {name: [] for name, _ in checked}
    for _ in range(rounds):
        for name, call in checked:
            timed = time_gpu(call, min_secs=0.03, max_repeats=100, device=torch.device("cuda"))
            medians[name].append(statistics.median(timed.repeat_secs))
    for entry in row["sides"]:
        if entry["name"] in medians:
            secs = statistics.median(medians[entry["name"]])
            entry["graph_us"] = secs * 1e6
            entry["round_us"] = [s * 1e6 for s in medians[entry["name"]]]
            entry["tflops"] = flops / secs / 1e12
    row["resources"] = {
        "tiled": kernel_resources(tg._gemm_tiled_kernel),
        "persistent": kernel_resources(tg._gemm_persistent_kernel),
        "tma": kernel_resources(tg._gemm_tma_kernel),
        "probe_const": kernel_resources(_const_kernel),
        "probe_host_tma": kernel_resources(_host_tma_kernel),
    }
    return row


def print_case(row: dict[str, Any]) -> None:
    cublas = next((s for s in row["sides"] if s["name"] == "cuBLAS"), {})
    ind = next((s for s in row["sides"] if s["name"] == "inductor"), {})
    print(f"\n## {row['case']} bias={row['bias']} (inductor compile {row['compile_secs']:.0f} s)")
    print(f"{'side':<46} {'graph us':>9} {'TFLOP/s':>8} {'xcuBLAS':>8} {'xInd':>6} "
          f"{'eager us':>9} {'host us':>8}  kernels/call")  # fmt: skip
    for s in row["sides"]:
        if "graph_us" not in s:
            print(f"{s['name']:<46} {s.get('error', '?')}")
            continue
        kern = "; ".join(
            f"{k['kernel'][:34]} x{k['per_call']:.0f} {k['mean_us']:.1f}us" for k in s["kernels"]
        )
        print(
            f"{s['name']:<46} {s['graph_us']:9.2f} {s['tflops']:8.1f} "
            f"{cublas.get('graph_us', math.nan) / s['graph_us']:8.3f} "
            f"{ind.get('graph_us', math.nan) / s['graph_us']:6.3f} "
            f"{s['eager_event_us']:9.2f} {s['host_us_per_call']:8.1f}  {kern}"
        )
    for what, res in row["resources"].items():
        for r in res:
            print(f"  res {what}: {json.dumps(r)}")


def ncu_child(shape: tuple[int, int, int], num_sms: int) -> None:
    """Launched under ncu: each contender twice (the Inductor compile is a cache hit)."""
    m, n, k = shape
    a, b, _ = operands(m, n, k)
    # The same function as the parent's, so the compile is a cache hit; either way it and its
    # autotuning happen before the profiler starts.
    compiled = torch.compile(
        lambda x, y, z: x @ y, mode="max-autotune-no-cudagraphs", dynamic=False
    )
    compiled(a, b, None)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for _ in range(2):
        compiled(a, b, None)
    out = torch.empty((m, n), dtype=torch.float16, device="cuda")
    for c in CONFIGS[:1] + CONFIGS[4:5]:
        launch = tg.bind(a, b, None, out, config=config_dict(c), num_sms=num_sms)
        for _ in range(2):
            launch()
    call = const_call(a, b, out, *CONFIGS[0][1:7])
    for _ in range(2):
        call()
    call = host_tma_call(a, b, out, *CONFIGS[4][1:7], num_sms)
    for _ in range(2):
        call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def run_ncu(shape: tuple[int, int, int], out_dir: Path) -> None:
    import ncu

    m, n, k = shape
    sections = (*ncu.SECTIONS[:-2], "InstructionStats", *ncu.SECTIONS[-2:])
    ncu.profile(__file__, ["--ncu-child", f"{m}x{n}x{k}"], "_gemm_|triton_|_const_|_host_tma",
                out_dir / "ncu.csv", sections=sections, timeout=240)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")))
    parser.add_argument("--case", action="append", default=[])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ncu", default="1024x1024x1024", help="shape to profile under ncu")
    parser.add_argument("--ncu-child", default=None)
    parser.add_argument("--bias-case", default="1024x1024x1024")
    args = parser.parse_args()
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    if args.ncu_child:
        ncu_child(tuple(int(x) for x in args.ncu_child.split("x")), num_sms)  # type: ignore[arg-type]
        return
    args.out.mkdir(parents=True, exist_ok=True)
    env = gpu_environment(torch.device("cuda"))
    print(json.dumps(env), flush=True)
    cases = [tuple(int(x) for x in c.split("x")) for c in args.case] or CASES
    todo = [(c, False) for c in cases]
    if args.bias_case:
        todo.append((tuple(int(x) for x in args.bias_case.split("x")), True))
    report: dict[str, Any] = {"environment": env, "command": sys.argv, "cases": []}
    for shape, bias in todo:
        try:
            row = run_case(shape, bias, args.rounds, num_sms)  # type: ignore[arg-type]
        except Exception:
            traceback.print_exc()
            continue
        report["cases"].append(row)
        (args.out / "profile.json").write_text(json.dumps(report, indent=1, default=str))
        print_case(row)
        sys.stdout.flush()
    if args.ncu:
        try:
            run_ncu(tuple(int(x) for x in args.ncu.split("x")), args.out)  # type: ignore[arg-type]
        except Exception:
            traceback.print_exc()


if __name__ == "__main__":
    main()
