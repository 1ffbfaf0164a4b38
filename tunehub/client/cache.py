"""The client's disk cache of schedule answers: one JSON file per lookup, shared by processes.

Each entry is its own file, written to a temporary file in the same directory and moved into
place with ``os.replace`` (atomic on POSIX and Windows), so a reader sees a whole old entry or a
whole new one and concurrent writers never interleave; the last writer wins, and every writer
holds an answer as good as the others'. No entry is ever read, changed and written back, so no
lock is needed. A file that does not parse or does not hold what its name says is ignored (a
miss), never an error.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunehub.core.damped import DampedLog

log = logging.getLogger(__name__)

CACHE_FORMAT = 1
CACHE_DIR_ENV = "TUNEHUB_CACHE_DIR"


def default_cache_dir() -> Path:
    """``$TUNEHUB_CACHE_DIR``, else the user's cache directory (``~/.cache/tunehub`` on Linux,
    through platformdirs)."""
    override = os.environ.get(CACHE_DIR_ENV)
    if override:
        return Path(override).expanduser()
    try:
        import platformdirs
    except ImportError:  # a GPU box with torch and triton only: the XDG default
        base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        return Path(base) / "tunehub"
    return Path(platformdirs.user_cache_dir("tunehub", appauthor=False))


@dataclass(frozen=True)
class CachedLookup:
    """A service answer as cached: the schedule JSON (None: no template runs the workload,
    ``error`` says why), its ETag, and when it was fetched (seconds since the epoch)."""

    key: tuple[Any, ...]
    schedule: dict[str, Any] | None
    error: str
    etag: str | None
    fetched_at: float


class DiskCache:
    """Cached lookups of one service (``scope``, e.g. its URL) under ``root``.

    A directory that cannot be written (read-only, full, not a directory) is said once, then
    counted once a minute while it lasts (``write_warning``), not once per shape."""

    def __init__(self, root: Path, scope: str) -> None:
        digest = hashlib.sha256(scope.encode()).hexdigest()[:16]
        self.dir = root / f"schedules-v{CACHE_FORMAT}" / digest
        self.write_warning = DampedLog(log)

    def path(self, key: tuple[Any, ...]) -> Path:
        name = hashlib.sha256(_key_text(key).encode()).hexdigest()
        return self.dir / name[:2] / f"{name}.json"

    def get(self, key: tuple[Any, ...]) -> CachedLookup | None:
        """The entry for ``key``; None if there is none or it is unreadable or malformed."""
        path = self.path(key)
        try:
            data = json.loads(path.read_bytes())
            return _entry(data, key)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError, KeyError) as exc:
            log.debug("ignoring the cache file %s: %s", path, exc)
            return None

    def put(self, entry: CachedLookup) -> None:
        """Store ``entry`` (atomically; a failure to write is logged, never raised)."""
        path = self.path(entry.key)
        data = {
            "format": CACHE_FORMAT,
            "key": _key_text(entry.key),
            "schedule": entry.schedule,
            "error": entry.error,
            "etag": entry.etag,
            "fetched_at": entry.fetched_at,
        }
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(json.dumps(data, separators=(",", ":")).encode())
                os.replace(tmp, path)
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError as exc:
            self.write_warning.warning("could not write the schedule cache %s: %s", path, exc)
        else:
            if self.write_warning.active:
                self.write_warning.clear("the schedule cache %s is writable again", self.dir)


def _key_text(key: tuple[Any, ...]) -> str:
    return json.dumps(list(key), separators=(",", ":"))


def _entry(data: Any, key: tuple[Any, ...]) -> CachedLookup:
    """The entry ``data`` holds, checked field by field (ValueError if anything is off)."""
    if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT:
        raise ValueError("not a tunehub cache entry of this format")
    if data.get("key") != _key_text(key):
        raise ValueError("the entry is for another lookup")
    schedule = data["schedule"]
    if schedule is not None and not (
        isinstance(schedule, dict)
        and isinstance(schedule.get("config"), dict)
        and isinstance(schedule.get("source"), str)
        and isinstance(schedule.get("template"), str)
    ):
        raise ValueError("malformed schedule")
    error, etag, fetched_at = data["error"], data["etag"], data["fetched_at"]
    if not isinstance(error, str) or not (etag is None or isinstance(etag, str)):
        raise ValueError("malformed error or etag")
    if isinstance(fetched_at, bool) or not isinstance(fetched_at, (int, float)):
        raise ValueError("malformed fetched_at")
    return CachedLookup(key, schedule, error, etag, float(fetched_at))
