"""ReplayMeasurer: the in-memory measurer double that answers from stored records, and the
replay datasets (measured spaces in the record format) it serves."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from tunehub.core import (
    MeasureRecord,
    MeasureRequest,
    MeasureResult,
    MeasureStatus,
    Target,
    record_from_json,
    record_to_json,
)
from tunehub.kernels.space import SearchSpace
from tunehub.workers.base import Measurer

ReplayKey = tuple[str, str, str, str]
NOT_IN_HISTORY = "not in replay history"


def replay_key(request: MeasureRequest) -> ReplayKey:
    """(workload key, target key, template, config key); the template version is not part of
    it, so a history outlives version bumps that do not change timings."""
    return (
        request.workload.key,
        request.target.target_key,
        request.template,
        request.config.key,
    )


class ReplayMeasurer(Measurer):
    """Answers each request with the result of the matching stored record, without hardware.

    Futures come back already resolved. When a request matches several records the latest
    (by ``created_at``, then by order given) answers. A request with no record gets
    ``fallback(request)`` if given, else an ``invalid`` result saying it is not in the replay
    history. ``requests`` keeps every request asked, in order, so tests can check what a
    strategy measured. ``capacity`` is how many requests a caller keeps in flight (as many
    as a real worker pool would take). ``live`` says whether the session may re-measure what
    it does not trust (see ``Measurer.live``).

    >>> ReplayMeasurer([]).measure([])
    []
    """

    def __init__(
        self,
        records: Iterable[MeasureRecord],
        *,
        fallback: Callable[[MeasureRequest], MeasureResult] | None = None,
        capacity: int = 1,
        target: Target | None = None,
        live: bool = False,
    ) -> None:
        self._results: dict[ReplayKey, tuple[MeasureRecord, MeasureResult]] = {}
        self._live = live
        self.fallback = fallback
        self._capacity = max(1, capacity)
        self._target = target
        self.requests: list[MeasureRequest] = []
        self.add(records)

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def target(self) -> Target | None:
        """The target it stands in for, when it plays one device's worker."""
        return self._target

    @property
    def live(self) -> bool:
        """False unless made ``live=True``: a replay answers what was stored, so re-measuring
        tells nothing new. A test whose ``fallback`` answers each attempt afresh (as a busy
        machine would) makes it live, so the session's guard re-measures."""
        return self._live

    def add(self, records: Iterable[MeasureRecord]) -> None:
        """Extend the history (machine failures are not answers: they are skipped)."""
        for record in records:
            if not record.verdict:
                continue
            key = replay_key(record.request)
            known = self._results.get(key)
            if known is None or record.created_at >= known[0].created_at:
                self._results[key] = (record, record.result)

    def __len__(self) -> int:
        return len(self._results)

    def __contains__(self, request: object) -> bool:
        return isinstance(request, MeasureRequest) and replay_key(request) in self._results

    def answer(self, request: MeasureRequest) -> MeasureResult:
        """The result for ``request`` (recorded in ``requests``)."""
        self.requests.append(request)
        known = self._results.get(replay_key(request))
        if known is not None:
            return known[1]
        if self.fallback is not None:
            return self.fallback(request)
        return MeasureResult(MeasureStatus.INVALID, error=NOT_IN_HISTORY)

    def submit(self, request: MeasureRequest) -> Future[MeasureResult]:
        future: Future[MeasureResult] = Future()
        future.set_result(self.answer(request))
        return future


# --- replay datasets -------------------------------------------------------------------------
@dataclass(frozen=True)
class ReplayDataset:
    """A measured space: records of one (workload, target, template) in the record format, one
    JSON object per line (gzip-compressed when the name ends in ``.gz``).

    ``space`` is the template's space for the workload restricted to the configs measured, so
    a strategy replayed on it only asks for configs the dataset can answer.
    """

    name: str
    records: tuple[MeasureRecord, ...]

    @property
    def request(self) -> MeasureRequest:
        return self.records[0].request

    @property
    def best(self) -> MeasureRecord:
        """The fastest ok record."""
        ok = [r for r in self.records if r.median_secs is not None]
        return min(ok, key=lambda r: r.median_secs or 0.0)

    def gflops(self) -> dict[str, float]:
        """Config key -> GFLOP/s (0 for a failed config)."""
        return {r.config.key: r.gflops or 0.0 for r in self.records}

    def restricted(self, space: SearchSpace) -> SearchSpace:
        """``space`` limited to the configs this dataset measured."""
        keys = frozenset(r.config.key for r in self.records)
        return SearchSpace(space.knobs, (*space.constraints, lambda c: c.key in keys))


def read_records(path: Path) -> list[MeasureRecord]:
    """Records from a ``tunehub.record/1`` JSON-lines file (``.gz`` read compressed)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as lines:
        return [record_from_json(json.loads(line)) for line in lines if line.strip()]


def write_records(path: Path, records: Iterable[MeasureRecord]) -> None:
    """Write records as ``tunehub.record/1`` JSON lines (gzip when the name ends in .gz)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt", encoding="utf-8") as out:
        for record in records:
            out.write(json.dumps(record_to_json(record), sort_keys=True) + "\n")


def load_datasets(directory: Path) -> list[ReplayDataset]:
    """Every ``*.jsonl.gz`` / ``*.jsonl`` dataset under ``directory`` (recursively), by path."""
    found = sorted([*directory.rglob("*.jsonl.gz"), *directory.rglob("*.jsonl")])
    datasets = []
    for path in found:
        records = tuple(r for r in read_records(path) if r.verdict)
        if records:
            name = path.name.removesuffix(".gz").removesuffix(".jsonl")
            datasets.append(ReplayDataset(name=name, records=records))
    return datasets
