"""Probe: does a TMA store of C pay for triton.gemm's persistent ``tma`` kernel, as it did for
triton.bmm's (0.77-0.85x -> 0.93-0.97x of cuBLAS on output-heavy products)?

On the GEMMs of the compile_models benchmark's models (GPT-2 small and ViT-B: K = 768 or
3,072 under wide outputs, the LM head 50,304 wide; LLaMA-7B prefill), each config runs as
triton.gemm's ``tma`` kernel (pointer stores, through ``triton_gemm_kernels.bind``) and as a
copy of its loop whose C tile leaves through a host TMA descriptor; both are checked against
``F.linear`` (relative error) and timed beside it with ``triton.testing.do_bench``
(median). Prints, per shape, cuBLAS's time over each kernel's best config's:

    python benchmarks/probes/gemm_tma_store.py --out $OUT/gemm_tma_store.json
"""

# ruff: noqa: B023
# (a probe: each closure is called inside its loop iteration)

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tunehub.kernels import triton_gemm_kernels as tg


@triton.jit
def _tma_store_kernel(
    a_desc,
    b_desc,
    c_desc,
    M,
    N,
    K,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    NUM_SMS: tl.constexpr,
    FLATTEN: tl.constexpr,
):
    # triton.gemm's ``tma`` loop for a row-major A and an nn.Linear weight (B column-major,
    # described as its N x K transpose), C stored through its descriptor.
    start_pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    num_tiles = num_pid_m * num_pid_n
    tile_id_c = start_pid - NUM_SMS
    for tile_id in tl.range(start_pid, num_tiles, NUM_SMS, flatten=FLATTEN):
        pid_m, pid_n = tg._tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kt in range(k_tiles):
            off_k = kt * BLOCK_K
            a = a_desc.load([off_m, off_k])
            b = b_desc.load([off_n, off_k]).T
            acc = tl.dot(a, b, acc)
        tile_id_c += NUM_SMS
        pid_m, pid_n = tg._tile_coords(tile_id_c, num_pid_m, num_pid_n, GROUP_M)
        c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(c_desc.dtype))


SHAPES = {  # (M, N, K): activations x nn.Linear weights
    "gpt2-b8-qkv": (4096, 2304, 768),
    "gpt2-b8-proj": (4096, 768, 768),
    "gpt2-b8-up": (4096, 3072, 768),
    "gpt2-b8-down": (4096, 768, 3072),
    "gpt2-b8-lmhead": (4096, 50304, 768),
    "vit-b64-qkv": (12608, 2304, 768),
    "vit-b64-up": (12608, 3072, 768),
    "vit-b64-down": (12608, 768, 3072),
    "llama-prefill-qkv": (4096, 4096, 4096),
    "llama-prefill-up": (4096, 11008, 4096),
    "llama-prefill-down": (4096, 4096, 11008),
}
TILES = (  # BLOCK_M, BLOCK_N, BLOCK_K, warps, stages
    (128, 256, 64, 8, 3),
    (128, 128, 64, 8, 4),
    (128, 128, 64, 4, 4),
    (256, 128, 64, 8, 3),
    (64, 256, 64, 4, 4),
)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    args = parser.parse_args()
    from triton.testing import do_bench
    from triton.tools.tensor_descriptor import TensorDescriptor

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    report: dict[str, Any] = {"device": torch.cuda.get_device_name(0), "shapes": {}}
    torch.manual_seed(0)
    for name in args.shapes.split(","):
        m, n, k = SHAPES[name]
        x = torch.randn(m, k, device="cuda", dtype=torch.float16)
        w = torch.randn(n, k, device="cuda", dtype=torch.float16) / k**0.5
        ref = torch.nn.functional.linear(x, w)
        row: dict[str, Any] = {"mnk": [m, n, k], "configs": {}}
        row["cublas_ms"] = do_bench(lambda: torch.nn.functional.linear(x, w))
        for bm, bn, bk, warps, stages in TILES:
            for flat in (True, False):
                cfg = {
                    "variant": "tma",
                    "BLOCK_M": bm,
                    "BLOCK_N": bn,
                    "BLOCK_K": bk,
                    "GROUP_M": 8,
                    "num_warps": warps,
                    "num_stages": stages,
                    "SPLIT_K": 1,
                    "FLATTEN": flat,
                }
                tag = f"{bm}x{bn}x{bk}-w{warps}-s{stages}-{'flat' if flat else 'nested'}"
                for store in ("ptr", "tma"):
                    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
                    try:
                        if store == "ptr":
                            call = tg.bind(x, w.t(), None, out, config=cfg)
                        else:
                            a_d = TensorDescriptor(x, [m, k], [k, 1], [bm, bk])
                            b_d = TensorDescriptor(w, [n, k], [k, 1], [bn, bk])
                            c_d = TensorDescriptor(out, [m, n], [n, 1], [bm, bn])
                            grid = (min(sms, triton.cdiv(m, bm) * triton.cdiv(n, bn)),)

                            def call(a_d=a_d, b_d=b_d, c_d=c_d, grid=grid, cfg=cfg) -> None:
                                _tma_store_kernel[grid](
                                    a_d,
                                    b_d,
                                    c_d,
                                    m,
                                    n,
                                    k,
                                    BLOCK_M=cfg["BLOCK_M"],
                                    BLOCK_N=cfg["BLOCK_N"],
                                    BLOCK_K=cfg["BLOCK_K"],
                                    GROUP_M=8,
                                    NUM_SMS=sms,
                                    FLATTEN=cfg["FLATTEN"],
                                    num_warps=cfg["num_warps"],
                                    num_stages=cfg["num_stages"],
                                )

                        call()
                        torch.cuda.synchronize()
                        err = float((out.float() - ref.float()).norm() / ref.float().norm())
                        ms = do_bench(call) if err < 2e-3 else None
                        row["configs"][f"{store}:{tag}"] = {"ms": ms, "rel_err": err}
                    except Exception as exc:
                        row["configs"][f"{store}:{tag}"] = {"error": f"{exc}"[-200:]}
        for store in ("ptr", "tma"):
            timed = {
                c: v["ms"]
                for c, v in row["configs"].items()
                if c.startswith(store + ":") and v.get("ms")
            }
            if timed:
                best = min(timed, key=timed.get)
                row[f"best_{store}"] = best
                row[f"cublas_over_{store}"] = row["cublas_ms"] / timed[best]
        report["shapes"][name] = row
        print(
            f"{name:20s} cuBLAS {row['cublas_ms'] * 1e3:8.1f}us  ptr "
            f"{row.get('cublas_over_ptr', 0):.3f}x ({row.get('best_ptr')})  tma-store "
            f"{row.get('cublas_over_tma', 0):.3f}x ({row.get('best_tma')})",
            flush=True,
        )
        if args.out:
            Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
