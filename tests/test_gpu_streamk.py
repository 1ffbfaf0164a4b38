"""The stream-K probe's kernel (benchmarks/probes/gpu_streamk.py), on the CPU through Triton's
interpreter: every way its schedule cuts the work gives the right product, the same bits
again, and leaves its tile counters at zero. Its timings are the GPU's (``gpu_run.sh streamk``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the gpu extra)")
triton = pytest.importorskip("triton", reason="triton is not installed (the gpu extra)")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks" / "probes"))
sys.path.insert(0, str(REPO / "benchmarks"))

pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim:DeprecationWarning"
)


@pytest.fixture(scope="module")
def streamk() -> Any:
    import gpu_streamk

    return gpu_streamk


def test_schedule_shares_the_partial_waves(streamk: Any) -> None:
    tile = streamk.config("streamk", 128, 256, 64, 8, 3)
    # 96 tiles on 132 SMs: all shared, 46 of 63 K steps a program.
    assert streamk.schedule(3000, 1000, 4000, tile, 132) == (0, 96, 46)
    # 512 tiles (3.9 waves): two waves whole, the last full one and the rest shared.
    assert streamk.schedule(4096, 4096, 4096, tile, 132) == (264, 248, 121)
    # Whole waves: nothing shared.
    assert (
        streamk.schedule(1408, 3072, 512, streamk.config("streamk", 128, 256, 64, 8, 3), 132)[1]
        == 0
    )


@pytest.mark.parametrize("sms", [1, 2, 4, 5, 9, 50])
def test_every_cut_gives_the_product(streamk: Any, sms: int) -> None:
    # 9 tiles of 16x32, 7 K steps: whole waves (1, 9), a data-parallel wave and a shared rest
    # (2, 4), all shared (5), shares of 2 steps cutting tiles 4 ways (50).
    gen = torch.Generator().manual_seed(sms)
    m, n, k = 48, 96, 112
    a = torch.randn(m, k, generator=gen).half()
    b = torch.randn(n, k, generator=gen).half().t()
    tile = streamk.config("streamk", 16, 32, 16, 4, 2, group=2)
    want = a.double() @ b.double()
    outs = []
    for _ in range(2):
        out = torch.full((m, n), float("nan"), dtype=torch.float16)
        launch = streamk.bind(a, b, out, tile, sms)
        launch()
        assert not bool(launch.counts.any())
        outs.append(out)
    err = float((outs[0].double() - want).norm() / want.norm())
    assert err < 2e-3
    assert torch.equal(outs[0], outs[1])
