"""Probe: do triton.conv2d's and triton.attention's builds fill the Triton cache the run's
first launch reads? Each config is built, then run (checked, timed), in one fresh cache: the
run's compile_secs minus the build's is its first launch (a cache hit: milliseconds). Needs
a GPU and the service's dependencies:

    python benchmarks/probes/build_ahead.py > $OUT/buildcheck.log
"""

import os
import tempfile

os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp()
from pathlib import Path

from tunehub.core import MeasureRequest, Workload
from tunehub.kernels.base import TimingPolicy
from tunehub.kernels.cuda_device import cuda_target
from tunehub.kernels.registry import get_template

target = cuda_target(0)
cases = [
    (
        "triton.attention",
        {
            "op": "attention",
            "batch": 2,
            "heads": 32,
            "m": 2048,
            "n": 2048,
            "k": 128,
            "causal": True,
            "dtype": "float16",
        },
    ),
    (
        "triton.conv2d",
        {
            "op": "conv2d",
            "batch": 32,
            "in_channels": 256,
            "out_channels": 256,
            "height": 14,
            "width": 14,
            "kernel_h": 3,
            "kernel_w": 3,
            "pad_h": 1,
            "pad_w": 1,
            "data_layout": "nhwc",
            "dtype": "float16",
        },
    ),
    (
        "triton.conv2d",
        {
            "op": "conv2d",
            "batch": 32,
            "in_channels": 256,
            "out_channels": 256,
            "height": 14,
            "width": 14,
            "kernel_h": 3,
            "kernel_w": 3,
            "pad_h": 1,
            "pad_w": 1,
            "data_layout": "nchw",
            "dtype": "float16",
        },
    ),
    (
        "triton.conv2d",
        {
            "op": "conv2d",
            "batch": 32,
            "in_channels": 3,
            "out_channels": 64,
            "height": 224,
            "width": 224,
            "kernel_h": 7,
            "kernel_w": 7,
            "pad_h": 3,
            "pad_w": 3,
            "stride_h": 2,
            "stride_w": 2,
            "data_layout": "nhwc",
            "dtype": "float16",
        },
    ),
    (
        "triton.conv2d",
        {
            "op": "conv2d",
            "batch": 32,
            "in_channels": 384,
            "out_channels": 384,
            "height": 14,
            "width": 14,
            "kernel_h": 7,
            "kernel_w": 7,
            "pad_h": 3,
            "pad_w": 3,
            "groups": 384,
            "data_layout": "nhwc",
            "dtype": "float16",
        },
    ),
]
for name, spec in cases:
    t = get_template(name)
    w = Workload.from_dict(spec)
    for c in t.seed_configs(w, target)[:2]:
        req = MeasureRequest(w, target, t.name, t.version, c)
        art = t.build(req, build_dir=Path("."))
        res = t.run(req, art, timing=TimingPolicy(min_secs=0.05))
        print(
            name,
            w.label,
            {k: c[k] for k in ("BLOCK_M", "BLOCK_N") if k in c},
            c.get("TMA"),
            c.get("PATCH"),
            c.get("REPACK"),
            res.status.value,
            f"build {art.environment.get('build')} {art.compile_secs:.2f}s, first launch "
            f"{res.compile_secs - art.compile_secs:.3f}s",
            flush=True,
        )
