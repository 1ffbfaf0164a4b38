"""Probe: does a tuned GEMM's win measured alone (L2 flushed before each call, as tunehub's
timing policy does) hold when the GEMM runs back to back, or inside a LLaMA MLP's chain?

For each shape: cuBLAS (``torch.mm(a, w.t(), out=)``, as Inductor's ``extern_kernels.mm``)
against tunehub's kernel with the given config, interleaved over rounds, in three regimes:
``flush`` (tunehub's policy, ``time_gpu``), ``b2b`` (20 calls back to back in one CUDA
graph, no flush), ``chain`` (the MLP: gate and up on cuBLAS, SiLU * up, then the down GEMM on
one or the other, in one CUDA graph). Prints per-regime medians and ratios as JSON.

    python benchmarks/probes/gemm_regimes.py --configs tune.json --out r.json
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.nn.functional as F

from tunehub.kernels import triton_gemm_kernels as kernels
from tunehub.kernels.gpu_timing import time_gpu


def graph_of(calls, reps: int):
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(stream)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            for c in calls:
                c()
    torch.cuda.synchronize()
    return g


def time_graph(g, reps: int) -> float:
    g.replay()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    g.replay()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) * 1e3 / reps  # us per rep


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--configs", required=True)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--out")
    args = p.parse_args()
    tuned = json.load(open(args.configs))["lookups"]
    dev = torch.device("cuda")
    torch.manual_seed(0)
    results = {"gpu": torch.cuda.get_device_name(), "shapes": []}
    for entry in tuned:
        w = entry["workload"]
        if w.get("op") == "attention" or entry["answer"].get("config", {}).get("variant") is None:
            continue
        cfg = {k: v for k, v in entry["answer"]["config"].items()}
        m, n, k = w["m"], w["n"], w["k"]
        a = torch.randn(m, k, device=dev, dtype=torch.float16) * 0.1
        wt = torch.randn(n, k, device=dev, dtype=torch.float16) * 0.1
        b = wt.t()
        out_l = torch.empty(m, n, device=dev, dtype=torch.float16)
        out_t = torch.empty_like(out_l)
        lib = lambda: torch.mm(a, b, out=out_l)  # noqa: E731
        tun = kernels.bind(a, b, None, out_t, config=cfg)
        lib(); tun(); torch.cuda.synchronize()
        err = float((out_l.float() - out_t.float()).abs().max())
        rows = {"flush": ([], []), "b2b": ([], []), "chain": ([], [])}
        g_l, g_t = graph_of([lib], 20), graph_of([tun], 20)
        chain = None
        if k > n:  # the MLP down: the chain before it (gate, up, SiLU * up) feeds its A
            x = torch.randn(m, n, device=dev, dtype=torch.float16) * 0.1
            wg = torch.randn(k, n, device=dev, dtype=torch.float16) * 0.1
            wu = torch.randn(k, n, device=dev, dtype=torch.float16) * 0.1
            g_buf = torch.empty(m, k, device=dev, dtype=torch.float16)
            u_buf = torch.empty_like(g_buf)

            def pre():
                torch.mm(x, wg.t(), out=g_buf)
                torch.mm(x, wu.t(), out=u_buf)
                torch.mul(F.silu(g_buf), u_buf, out=a)

            chain = (graph_of([pre, lib], 5), graph_of([pre, tun], 5), graph_of([pre], 5))
        for _ in range(args.rounds):
            for i, call in enumerate((lib, tun)):
                t = time_gpu(call, min_secs=0.03, max_repeats=40, device=dev)
                rows["flush"][i].append(statistics.median(t.repeat_secs) * 1e6)
            for i, g in enumerate((g_l, g_t)):
                rows["b2b"][i].append(time_graph(g, 20))
            if chain:
                base = time_graph(chain[2], 5)
                for i, g in enumerate(chain[:2]):
                    rows["chain"][i].append(time_graph(g, 5) - base)
        shape = {"m": m, "n": n, "k": k, "config": cfg, "max_abs_diff": err,
                 "tuned_speedup": entry["answer"].get("speedup_vs_baseline"),
                 "clock_mhz": torch.cuda.clock_rate()}
        for name, (l_us, t_us) in rows.items():
            if l_us:
                shape[name] = {"library_us": statistics.median(l_us),
                               "tunehub_us": statistics.median(t_us),
                               "library_over_tunehub": statistics.median(
                                   x / y for x, y in zip(l_us, t_us)),
                               "rounds_library": [round(v, 1) for v in l_us],
                               "rounds_tunehub": [round(v, 1) for v in t_us]}
        results["shapes"].append(shape)
        print(f"{m}x{n}x{k} tuned {shape['tuned_speedup']:.3f}x  " + "  ".join(
            f"{r}: {shape[r]['library_us']:.1f}/{shape[r]['tunehub_us']:.1f} us "
            f"{shape[r]['library_over_tunehub']:.3f}x" for r in rows if r in shape), flush=True)
    if args.out:
        json.dump(results, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
