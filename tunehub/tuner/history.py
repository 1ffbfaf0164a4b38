"""HistoryView: the read-only view of stored measurements a strategy (or a model) may read.

Two scopes: ``records()`` are the verdicts already stored for this workload on this target
with this template version (what a search need not repeat); ``similar()`` are the verdicts
for other workloads of the same op and template version on any target of the same family
(what a model transfers from). Machine failures (``cancelled``, ``worker_error``) are never
part of a history.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence

from tunehub.core import MeasureRecord, Target, Workload
from tunehub.db.store import ScheduleStore

# At most this many records of similar workloads are read into one history.
SIMILAR_LIMIT = 50_000


class HistoryView(ABC):
    """Read-only stored measurements; the lists returned are snapshots, never changed."""

    @abstractmethod
    def records(self) -> Sequence[MeasureRecord]:
        """Verdicts for this workload, target and template version, oldest first."""

    @abstractmethod
    def similar(self) -> Sequence[MeasureRecord]:
        """Verdicts for other workloads (same op, template and version) on this target family."""


class EmptyHistory(HistoryView):
    """No history (a first job, a unit test)."""

    def records(self) -> Sequence[MeasureRecord]:
        return ()

    def similar(self) -> Sequence[MeasureRecord]:
        return ()


def _matches(record: MeasureRecord, template: str, version: int) -> bool:
    req = record.request
    return record.verdict and req.template == template and req.template_version == version


class StaticHistory(HistoryView):
    """A history from records in memory (replay datasets, benchmarks), split into the two scopes
    by the workload and target asked about.

    >>> StaticHistory([], Workload(m=8, n=8, k=8), Target("cpu", "x", (), 1), "t", 1).records()
    ()
    """

    def __init__(
        self,
        records: Iterable[MeasureRecord],
        workload: Workload,
        target: Target,
        template: str,
        template_version: int,
    ) -> None:
        own: list[MeasureRecord] = []
        similar: list[MeasureRecord] = []
        for record in records:
            req = record.request
            if not _matches(record, template, template_version) or req.workload.op != workload.op:
                continue
            if req.workload.key == workload.key and req.target.target_key == target.target_key:
                own.append(record)
            elif req.workload.key != workload.key and req.target.family_key == target.family_key:
                similar.append(record)
        self._own = tuple(own)
        self._similar = tuple(similar)

    def records(self) -> Sequence[MeasureRecord]:
        return self._own

    def similar(self) -> Sequence[MeasureRecord]:
        return self._similar


class StoreHistory(HistoryView):
    """The history read from a ScheduleStore, once per scope, on first use."""

    def __init__(
        self,
        store: ScheduleStore,
        workload: Workload,
        target: Target,
        template: str,
        template_version: int,
        *,
        exclude_job: int | None = None,
    ) -> None:
        self._store = store
        self._workload = workload
        self._target = target
        self._template = template
        self._version = template_version
        self._exclude_job = exclude_job
        self._own: tuple[MeasureRecord, ...] | None = None
        self._similar: tuple[MeasureRecord, ...] | None = None

    def records(self) -> Sequence[MeasureRecord]:
        if self._own is None:
            found = self._store.records_for(
                workload_key=self._workload.key,
                target_key=self._target.target_key,
                template=self._template,
            )
            self._own = tuple(
                r
                for r in found
                if _matches(r, self._template, self._version)
                and (self._exclude_job is None or r.job_id != self._exclude_job)
            )
        return self._own

    def similar(self) -> Sequence[MeasureRecord]:
        if self._similar is None:
            found = self._store.family_records(
                family_key=self._target.family_key,
                template=self._template,
                template_version=self._version,
                limit=SIMILAR_LIMIT,
            )
            self._similar = tuple(
                r
                for r in found
                if _matches(r, self._template, self._version)
                and r.request.workload.key != self._workload.key
                and r.request.workload.op == self._workload.op
            )
        return self._similar
