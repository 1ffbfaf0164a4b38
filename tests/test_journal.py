"""The result journal (tunehub.db.journal): bounded, fsynced, a torn or foreign line tolerated,
and a replay that stores each result exactly once, however often it runs (issue 27)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_store import CPU, record
from tunehub.core import JobSpec
from tunehub.core.workload import Workload
from tunehub.db import MemoryScheduleStore, ScheduleStore, StoreUnavailable
from tunehub.db.journal import JournalEntry, JournalFull, ResultJournal

SQUARE = Workload(m=64, n=64, k=64)


def job(store: ScheduleStore) -> int:
    store.put_target(CPU)
    return store.create_job(JobSpec(workload=SQUARE, target_key=CPU.target_key)).id


def entries(job_id: int, n: int, *, secs: float = 0.5) -> list[JournalEntry]:
    return [
        JournalEntry(record(1e-3 * (i + 1), job_id=job_id, config={"MR": i + 1}), secs)
        for i in range(n)
    ]


def test_entries_round_trip_one_json_line_each(tmp_path: Path) -> None:
    journal = ResultJournal(tmp_path / "journal" / "results.jsonl")
    written = entries(7, 3)
    journal.append(written[:1])
    journal.append(written[1:])
    assert journal.entries() == written
    assert len(journal) == 3 and bool(journal)
    lines = journal.path.read_bytes().splitlines()
    assert len(lines) == 3
    first = json.loads(lines[0])
    assert (first["format"], first["key"], first["job_id"]) == (
        "tunehub.journal/1", written[0].record.uid, 7
    )  # fmt: skip


def test_the_journal_is_bounded_and_a_refused_append_writes_nothing(tmp_path: Path) -> None:
    one = len(entries(1, 1)[0].to_line())
    journal = ResultJournal(tmp_path / "results.jsonl", max_bytes=int(one * 2.5))
    journal.append(entries(1, 2))
    size = journal.size_bytes
    with pytest.raises(JournalFull, match="TUNEHUB_JOURNAL_MAX_BYTES"):
        journal.append(entries(1, 1))
    with pytest.raises(JournalFull):  # a batch is taken whole or not at all
        ResultJournal(tmp_path / "other.jsonl", max_bytes=one).append(entries(1, 2))
    assert journal.size_bytes == size and len(journal.entries()) == 2


def test_a_torn_last_line_and_foreign_lines_are_skipped(tmp_path: Path) -> None:
    journal = ResultJournal(tmp_path / "results.jsonl")
    kept = entries(3, 2)
    journal.append(kept[:1])
    with open(journal.path, "ab") as f:
        f.write(b'{"format": "something else"}\n')
        f.write(b"not json at all\n")
    journal.append(kept[1:])
    torn = entries(3, 3)[2].to_line()
    with open(journal.path, "ab") as f:  # a crash in the middle of a write
        f.write(torn[: len(torn) // 2])
    assert journal.entries() == kept
    # The next append drops the torn tail first, so its own line is whole.
    late = JournalEntry(record(9e-3, job_id=3, config={"MR": 99}))
    journal.append([late])
    assert journal.entries() == [*kept, late]
    assert journal.path.read_bytes().endswith(b"\n")


def test_replay_stores_each_result_once_and_empties_the_journal(tmp_path: Path) -> None:
    store = MemoryScheduleStore()
    job_id = job(store)
    journal = ResultJournal(tmp_path / "results.jsonl")
    written = entries(job_id, 5)
    journal.append(written)
    report = journal.replay(store)
    assert (report.entries, report.stored, report.rejected) == (5, {job_id: 5}, 0)
    assert not journal and len(journal) == 0
    stored = store.get_job(job_id)
    assert (stored.trials_done, stored.replayed) == (5, 5)
    assert stored.tuning_secs == pytest.approx(0.5 * 5)
    assert sorted(r.uid for r in store.job_records(job_id)) == sorted(e.key for e in written)
    # Replayed again (the same lines written again): nothing changes.
    journal.append(written)
    assert journal.replay(store).stored == {job_id: 0}
    again = store.get_job(job_id)
    assert (again.trials_done, again.replayed, again.tuning_secs) == (
        5, 5, stored.tuning_secs
    )  # fmt: skip
    assert journal.replay(store).entries == 0  # empty: nothing to do


class AwayStore(MemoryScheduleStore):
    """Takes ``room`` commits, then is away."""

    room = 0

    def commit_records(self, *args: object, **kwargs: object) -> int:
        if self.room <= 0:
            raise StoreUnavailable("the database is unreachable: connection refused")
        self.room -= 1
        return super().commit_records(*args, **kwargs)  # type: ignore[arg-type]


def test_a_replay_cut_short_keeps_the_journal_whole(tmp_path: Path) -> None:
    store = AwayStore()
    ids = [job(store), job(store)]
    journal = ResultJournal(tmp_path / "results.jsonl")
    written = entries(ids[0], 2) + entries(ids[1], 2)
    journal.append(written)
    store.room = 1  # the first job's batch goes in, then the store is away
    with pytest.raises(StoreUnavailable):
        journal.replay(store)
    assert journal.entries() == written
    store.room = 10
    assert journal.replay(store).stored == {ids[0]: 0, ids[1]: 2}
    jobs = [store.get_job(i) for i in ids]
    assert [(j.trials_done, j.replayed, j.tuning_secs) for j in jobs] == [(2, 2, 1.0)] * 2


def test_entries_the_store_refuses_for_good_are_kept_aside(tmp_path: Path) -> None:
    store = MemoryScheduleStore()
    job_id = job(store)
    journal = ResultJournal(tmp_path / "results.jsonl")
    good, orphan = entries(job_id, 1), entries(job_id + 100, 1)  # no such job
    journal.append(good + orphan)
    report = journal.replay(store)
    assert (report.stored, report.rejected) == ({job_id: 1}, 1)
    assert not journal
    (line,) = journal.rejected_path.read_text().splitlines()
    assert json.loads(line)["key"] == orphan[0].key
    assert "JobNotFound" in json.loads(line)["rejected"]


def test_a_service_started_again_replays_what_its_journal_holds_before_claiming(
    tmp_path: Path,
) -> None:
    """A crash left results in the journal: the runner stores them at its start, before it
    claims anything, so the job resumes with them (also after a restart, issue 27)."""
    from tunehub.service.runner import JobRunner

    store = MemoryScheduleStore()
    job_id = job(store)
    journal = ResultJournal.in_home(tmp_path)
    journal.append(entries(job_id, 3))
    runner = JobRunner(store, journal=journal, poll_secs=0.05)
    runner.start()
    try:
        stored = store.get_job(job_id)
        assert (stored.trials_done, stored.replayed) == (3, 3)
        assert not journal
    finally:
        runner.stop()
