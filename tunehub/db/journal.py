"""ResultJournal: measured results the store could not take, kept on local disk until it can.

When the database stays away longer than a job may keep results in memory
(``TUNEHUB_DB_OUTAGE_SECS``), the job's Session appends each measured result here instead of
failing; when the database answers again (or the service starts again after a crash), the
journal is replayed into the store and emptied.

The file is append-only JSON lines (``JOURNAL_FORMAT``), one result per line, each line written
and fsynced before the append returns, so a result the journal took survives a crash of the
process or the host. It is bounded (``max_bytes``): an append that would pass the limit raises
``JournalFull`` and writes nothing. A torn last line (a crash in the middle of a write) is
dropped, as is any line that is not a journal entry (with a warning): neither was acknowledged.

Replaying is exactly-once: each line carries the record (its ``uid`` is the idempotency key,
stored records are never stored twice) and the tuning seconds that came with it, and the
store's ``commit_records(..., replayed=True)`` counts a record and its seconds only when the
record is new. A replay that stops half-way (the store went away again, the process died)
leaves the journal as it was; the next replay skips what the first one stored. Entries the
store refuses for good (their job was deleted, a record it cannot take) are moved to
``<journal>.rejected`` for the operator, not dropped. One replayer and one writer at a time,
across threads and processes (a ``flock`` on ``<journal>.lock``).

>>> import tempfile, pathlib
>>> journal = ResultJournal(pathlib.Path(tempfile.mkdtemp()) / "results.jsonl")
>>> len(journal), journal.size_bytes
(0, 0)
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from tunehub.core import MeasureRecord, record_from_json, record_to_json, utc_now
from tunehub.db.store import JobNotFound, ScheduleStore, StoreUnavailable

log = logging.getLogger(__name__)

JOURNAL_FORMAT = "tunehub.journal/1"
JOURNAL_FILE = "journal/results.jsonl"
DEFAULT_MAX_BYTES = 64 << 20
# Records committed per transaction while replaying.
REPLAY_BATCH = 200


class JournalFull(RuntimeError):
    """The journal is at its size limit: the entry was not written."""


@dataclass(frozen=True)
class JournalEntry:
    """One measured result waiting for the store: the record (its job is ``record.job_id``)
    and the tuning seconds its job spent since the result before it."""

    record: MeasureRecord
    tuning_secs: float = 0.0
    written_at: datetime = field(default_factory=utc_now)

    @property
    def key(self) -> str:
        """The idempotency key: the record's uid."""
        return self.record.uid

    def to_line(self) -> bytes:
        data = {
            "format": JOURNAL_FORMAT,
            "key": self.key,
            "job_id": self.record.job_id,
            "tuning_secs": self.tuning_secs,
            "written_at": self.written_at.isoformat(),
            "record": record_to_json(self.record),
        }
        return (json.dumps(data, separators=(",", ":"), allow_nan=False) + "\n").encode()

    @classmethod
    def from_line(cls, line: bytes) -> JournalEntry:
        """The entry a line holds; ValueError if it holds none."""
        try:
            data = json.loads(line)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"not JSON: {exc}") from None
        if not isinstance(data, dict) or data.get("format") != JOURNAL_FORMAT:
            raise ValueError(f"not a {JOURNAL_FORMAT} entry")
        try:
            record = record_from_json(data["record"])
            secs = float(data.get("tuning_secs") or 0.0)
            written = datetime.fromisoformat(data["written_at"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"a broken entry: {type(exc).__name__}: {exc}") from None
        if record.uid != data.get("key"):
            raise ValueError("its key is not its record's uid")
        return cls(record=record, tuning_secs=max(0.0, secs), written_at=written)


@dataclass(frozen=True)
class ReplayReport:
    """What a replay did: ``stored`` new records per job (None: records of no job), how many
    entries were read, and how many were moved to the rejected file."""

    stored: dict[int | None, int]
    entries: int
    rejected: int = 0

    @property
    def total(self) -> int:
        return sum(self.stored.values())


class ResultJournal:
    """The append-only, bounded, fsynced file of results waiting for the store (see the
    module docstring). Thread- and process-safe."""

    def __init__(self, path: Path, *, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes: must be at least 1, got {max_bytes}")
        self.path = path
        self.max_bytes = max_bytes
        self._lock = threading.Lock()

    @classmethod
    def in_home(cls, home: Path, *, max_bytes: int = DEFAULT_MAX_BYTES) -> ResultJournal:
        """The journal of the service whose data dir is ``home``."""
        return cls(home / JOURNAL_FILE, max_bytes=max_bytes)

    @property
    def rejected_path(self) -> Path:
        return self.path.with_name(self.path.name + ".rejected")

    @property
    def size_bytes(self) -> int:
        try:
            return self.path.stat().st_size
        except FileNotFoundError:
            return 0

    def __len__(self) -> int:
        """Entries waiting (complete lines in the file, read now: another process, e.g. a
        sibling of ``serve --workers N``, may have written or replayed it)."""
        if not self.size_bytes:
            return 0
        try:
            return self.path.read_bytes().count(b"\n")
        except FileNotFoundError:
            return 0

    def __bool__(self) -> bool:
        return self.size_bytes > 0

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path.with_name(self.path.name + ".lock"), os.O_RDWR | os.O_CREAT,
                         0o600)  # fmt: skip
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)  # releases the flock

    def _lines(self) -> Iterator[bytes]:
        """The complete lines of the file (a torn last line is not one)."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        end = data.rfind(b"\n")
        for line in data[: end + 1].splitlines():
            if line.strip():
                yield line

    def append(self, entries: Sequence[JournalEntry]) -> None:
        """Write ``entries`` and fsync them; JournalFull (nothing written) past ``max_bytes``."""
        if not entries:
            return
        payload = b"".join(entry.to_line() for entry in entries)
        with self._locked():
            new_file = not self.path.exists()
            with open(self.path, "ab+") as f:
                size = f.seek(0, os.SEEK_END)
                if size:
                    f.seek(size - 1)
                    if f.read(1) != b"\n":  # a torn line from a crash: never acknowledged
                        f.seek(0)
                        kept = f.read().rfind(b"\n") + 1
                        log.warning("journal %s: a torn last line (%d bytes) dropped",
                                    self.path, size - kept)  # fmt: skip
                        f.truncate(kept)
                        size = kept
                if size + len(payload) > self.max_bytes:
                    raise JournalFull(
                        f"the result journal {self.path} holds {size} bytes; {len(entries)} "
                        f"more result(s) ({len(payload)} bytes) would pass its limit of "
                        f"{self.max_bytes} (TUNEHUB_JOURNAL_MAX_BYTES)"
                    )
                f.seek(0, os.SEEK_END)
                f.write(payload)
                f.flush()
                os.fsync(f.fileno())
            if new_file:
                _fsync_dir(self.path.parent)

    def entries(self) -> list[JournalEntry]:
        """The entries waiting, in the order written; lines that hold none are skipped."""
        with self._locked():
            return self._read()

    def _read(self) -> list[JournalEntry]:
        found = []
        for number, line in enumerate(self._lines(), 1):
            try:
                found.append(JournalEntry.from_line(line))
            except ValueError as exc:
                log.warning("journal %s: line %d skipped: %s", self.path, number, exc)
        return found

    def replay(self, store: ScheduleStore) -> ReplayReport:
        """Store every entry (exactly once, see the module docstring) and empty the journal.

        Raises StoreUnavailable if the store went away meanwhile: the journal is kept whole,
        and what was stored already is skipped by the next replay."""
        with self._locked():
            if not self.size_bytes:
                return ReplayReport({}, 0)
            entries = self._read()
            by_job: dict[int | None, list[JournalEntry]] = {}
            for entry in entries:
                by_job.setdefault(entry.record.job_id, []).append(entry)
            batches = [
                found[start : start + REPLAY_BATCH]
                for found in by_job.values()
                for start in range(0, len(found), REPLAY_BATCH)
            ]
            stored: dict[int | None, int] = {}
            rejected: list[tuple[JournalEntry, str]] = []
            for batch in batches:
                try:
                    _commit(store, batch, stored)
                except StoreUnavailable:
                    raise
                except (JobNotFound, ValueError):  # one entry spoils the batch: one by one
                    for entry in batch:
                        try:
                            _commit(store, [entry], stored)
                        except StoreUnavailable:
                            raise
                        except (JobNotFound, ValueError) as exc:
                            rejected.append((entry, f"{type(exc).__name__}: {exc}"))
            if rejected:
                self._reject(rejected)
            with open(self.path, "r+b") as f:
                f.truncate(0)
                os.fsync(f.fileno())
        report = ReplayReport(stored, len(entries), len(rejected))
        log.warning(
            "journal %s replayed: %d entries, %d result(s) stored now, %d rejected%s",
            self.path,
            report.entries,
            report.total,
            report.rejected,
            f" (kept in {self.rejected_path})" if rejected else "",
        )
        return report

    def _reject(self, rejected: list[tuple[JournalEntry, str]]) -> None:
        with open(self.rejected_path, "ab") as f:
            for entry, why in rejected:
                data = json.loads(entry.to_line())
                data["rejected"] = why
                f.write((json.dumps(data, separators=(",", ":")) + "\n").encode())
                log.error("journal entry %s (job %s) rejected by the store: %s", entry.key,
                          entry.record.job_id, why)  # fmt: skip
            f.flush()
            os.fsync(f.fileno())


def _commit(
    store: ScheduleStore, entries: Sequence[JournalEntry], stored: dict[int | None, int]
) -> None:
    """Store one job's ``entries`` in one transaction; count what was new in ``stored``."""
    job_id = entries[0].record.job_id
    secs = sum(entry.tuning_secs for entry in entries)
    new = store.commit_records(
        [entry.record for entry in entries],
        tuning_secs={job_id: secs} if job_id is not None and secs > 0 else None,
        replayed=True,
    )
    stored[job_id] = stored.get(job_id, 0) + new


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # not every filesystem allows it
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def journal_info(journal: ResultJournal | None) -> dict[str, Any]:
    """What health and metrics show of the journal."""
    if journal is None:
        return {"entries": 0, "bytes": 0, "max_bytes": 0}
    return {"entries": len(journal), "bytes": journal.size_bytes, "max_bytes": journal.max_bytes}
