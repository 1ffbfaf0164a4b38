"""``tunehub tune``'s progress on stderr: a live bar on a terminal, lines a log can keep
elsewhere (a pipe, a file, CI).

A line reads ``trial 5/24 (1 failed), best 151.3 GFLOP/s (blis.gemm MR=6 NR=32 threads=1),
3.2 s`` (the best's template and knobs when it is new since the last line; the tuning seconds
so far): at most one every ``every_secs`` seconds (the first trial's at once), and always the
last one. When the last trial is in, a line says the job goes on to re-time its best.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TextIO

import click

from tunehub.core import MeasureRecord, MeasureStatus

if TYPE_CHECKING:  # the tuner (and its cost model) is imported only by the commands that tune
    from tunehub.tuner import Progress

DEFAULT_EVERY_SECS = 5.0
# Records that judge the machine, not the config, counted beside the trials (a trial that
# failed is a config that did not build, crashed, timed out or answered wrong; one cut short
# by the end of the budget is not counted).
SIDE_COUNTS = {
    MeasureStatus.NOISY: "noisy",
    MeasureStatus.WORKER_ERROR: "worker errors",
}


def best_text(best: MeasureRecord | None, *, config: bool = True) -> str:
    """The best so far, with its template and knobs unless not ``config``:
    ``best 151.3 GFLOP/s (blis.gemm MR=6 ...)``."""
    gflops = best.gflops if best is not None else None
    if best is None or not gflops:
        return "no config measured ok yet"
    text = f"best {gflops:.1f} GFLOP/s"
    if not config:
        return text
    knobs = " ".join(f"{k}={v}" for k, v in best.request.config.items())
    return f"{text} ({best.request.template} {knobs})"


class TrialLines:
    """Progress as lines, at a bounded rate: ``update`` with each ``Progress`` (it prints when
    ``every_secs`` have passed since the last line), ``finish`` once the session returned (it
    prints the last state unless that was the last line)."""

    def __init__(
        self,
        total: int,
        *,
        every_secs: float = DEFAULT_EVERY_SECS,
        file: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total = total
        self.every_secs = every_secs
        self.file = file
        self.clock = clock
        self.counts = {"failed": 0, **dict.fromkeys(SIDE_COUNTS.values(), 0)}
        self.latest: Progress | None = None
        self.printed: tuple[Any, ...] | None = None  # what the last line said
        self.printed_best: MeasureRecord | None = None
        self.printed_at = float("-inf")

    def update(self, progress: Progress) -> None:
        for record in progress.last:
            status = record.result.status
            if status in SIDE_COUNTS:
                self.counts[SIDE_COUNTS[status]] += 1
            elif status.verdict and status is not MeasureStatus.OK:
                self.counts["failed"] += 1
        self.latest = progress
        now = self.clock()
        if self._said(progress) == self.printed:
            return
        if progress.trials_done >= self.total or now - self.printed_at >= self.every_secs:
            self._print(progress, now)

    def finish(self) -> None:
        if self.latest is not None and self._said(self.latest) != self.printed:
            self._print(self.latest, self.clock())

    def _said(self, progress: Progress) -> tuple[Any, ...]:
        return (progress.trials_done, progress.best, *self.counts.values())

    def _print(self, progress: Progress, now: float) -> None:
        side = ", ".join(f"{n} {what}" for what, n in self.counts.items() if n)
        new = progress.best is not self.printed_best
        line = (
            f"trial {progress.trials_done}/{self.total}{f' ({side})' if side else ''}, "
            f"{best_text(progress.best, config=new)}, {progress.elapsed_secs:.1f} s"
        )
        file = self.file or sys.stderr
        click.echo(line, file=file)
        if progress.trials_done >= self.total:
            click.echo("re-timing the best against the runners-up and the library", file=file)
        self.printed, self.printed_best, self.printed_at = self._said(progress), progress.best, now


@contextmanager
def trial_progress(
    total: int, *, every_secs: float = DEFAULT_EVERY_SECS
) -> Iterator[Callable[[Progress], None]]:
    """The ``on_progress`` for a session of ``total`` trials, on stderr: a live bar where
    stderr is a terminal, else ``TrialLines``. The last line is printed when the block ends
    without an exception."""
    if sys.stderr.isatty():
        with click.progressbar(length=total, label="trials", file=sys.stderr) as bar:
            shown = [0]

            def advance(p: Progress) -> None:
                bar.update(p.trials_done - shown[0])
                shown[0] = p.trials_done
                bar.label = best_text(p.best, config=False)

            yield advance
        return
    lines = TrialLines(total, every_secs=every_secs)
    yield lines.update
    lines.finish()
