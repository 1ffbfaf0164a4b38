"""``tunehub tune``'s progress where stderr is not a terminal: lines at a bounded rate."""

from __future__ import annotations

import io
import os
import pty
import subprocess
import sys

from tests.live import REPO
from tunehub.cli.progress import TrialLines
from tunehub.core import (
    Config,
    MeasureRecord,
    MeasureRequest,
    MeasureResult,
    MeasureStatus,
    Target,
    Workload,
)
from tunehub.tuner import Progress

WORKLOAD = Workload(m=64, n=64, k=64)
TARGET = Target(kind="cpu", name="Test CPU", arch=("avx2",), cores=2)


def record(mr: int, secs: float | None, status: MeasureStatus = MeasureStatus.OK) -> MeasureRecord:
    request = MeasureRequest(WORKLOAD, TARGET, "blis.gemm", 1, Config({"MR": mr, "NR": 32}))
    result = MeasureResult(status, repeat_secs=(secs,) if secs else ())
    return MeasureRecord(request=request, result=result)


class Clock:
    """Seconds that pass only when the test says so."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_lines_at_a_bounded_rate_and_always_the_last() -> None:
    out, clock = io.StringIO(), Clock()
    lines = TrialLines(6, every_secs=5.0, file=out, clock=clock)
    fast, faster = record(6, 2e-5), record(4, 1e-5)
    best: MeasureRecord | None = None
    for done, rec in enumerate([fast, record(8, 3e-5), faster, record(2, 4e-5)], start=1):
        best = rec if best is None or (rec.gflops or 0) > (best.gflops or 0) else best
        clock.now += 1.0  # a trial a second: one line in five seconds
        lines.update(Progress(done, 6, float(done), best, (rec,)))
    lines.update(Progress(4, 6, 4.5, best, (record(3, None, MeasureStatus.BUILD_ERROR),)))
    lines.finish()  # the budget's seconds ran out at 4 of 6 trials
    printed = out.getvalue().splitlines()
    assert printed == [
        f"trial 1/6, best {fast.gflops:.1f} GFLOP/s (blis.gemm MR=6 NR=32), 1.0 s",
        f"trial 4/6 (1 failed), best {faster.gflops:.1f} GFLOP/s (blis.gemm MR=4 NR=32), 4.5 s",
    ], printed
    lines.finish()  # nothing new: said once
    assert len(out.getvalue().splitlines()) == 2


def test_the_last_trial_is_printed_at_once_and_says_what_comes_next() -> None:
    out, clock = io.StringIO(), Clock()
    lines = TrialLines(2, every_secs=60.0, file=out, clock=clock)
    first = record(6, 2e-5)
    lines.update(Progress(0, 2, 0.5, None, (record(6, None, MeasureStatus.NOISY),)))
    lines.update(Progress(1, 2, 0.9, first, (first,)))  # within 60 s of the first line
    lines.update(Progress(2, 2, 1.2, first, (record(8, 3e-5),)))  # the last: printed at once
    lines.finish()
    assert out.getvalue().splitlines() == [
        "trial 0/2 (1 noisy), no config measured ok yet, 0.5 s",
        f"trial 2/2 (1 noisy), best {first.gflops:.1f} GFLOP/s (blis.gemm MR=6 NR=32), 1.2 s",
        "re-timing the best against the runners-up and the library",
    ]


def test_every_change_is_a_line_when_the_rate_is_unbounded() -> None:
    out = io.StringIO()
    lines = TrialLines(3, every_secs=0.0, file=out, clock=Clock())
    best = record(6, 2e-5)
    lines.update(Progress(1, 3, 0.1, best, (best,)))
    lines.update(Progress(1, 3, 0.2, best, (record(6, None, MeasureStatus.CANCELLED),)))
    lines.update(Progress(2, 3, 0.3, best, (record(8, 3e-5),)))
    printed = out.getvalue().splitlines()
    # A cancelled record changes nothing a line says; the best's knobs are shown when it is new.
    assert printed == [
        f"trial 1/3, best {best.gflops:.1f} GFLOP/s (blis.gemm MR=6 NR=32), 0.1 s",
        f"trial 2/3, best {best.gflops:.1f} GFLOP/s, 0.3 s",
    ]


def test_a_terminal_keeps_its_live_bar() -> None:
    """The same progress, with stderr a terminal (a pseudo-terminal here): the bar, no lines."""
    code = (
        "from tests.test_cli_progress import record\n"
        "from tunehub.cli.progress import trial_progress\n"
        "from tunehub.tuner import Progress\n"
        "best = record(6, 2e-5)\n"
        "with trial_progress(3, every_secs=0) as progress:\n"
        "    for done in (1, 2, 3):\n"
        "        progress(Progress(done, 3, 0.1 * done, best, (best,)))\n"
    )
    terminal, inside = pty.openpty()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code], cwd=REPO, stderr=inside, stdout=inside, timeout=60
        )
    finally:
        os.close(inside)
    shown = b""
    while True:
        try:
            chunk = os.read(terminal, 4096)
        except OSError:  # EIO: everything written has been read
            break
        if not chunk:
            break
        shown += chunk
    os.close(terminal)
    text = shown.decode(errors="replace")
    assert proc.returncode == 0, text
    assert f"best {best_gflops():.1f} GFLOP/s" in text and "100%" in text, text
    assert "trial 1/3" not in text and "re-timing" not in text, text


def best_gflops() -> float:
    gflops = record(6, 2e-5).gflops
    assert gflops is not None
    return gflops
