"""The single lookup's read on the caller's event loop (PostgreSQL): psycopg's async
connections, so an uncached lookup needs no thread of the pool.

Read on a pool thread, an uncached lookup hands its answer back to the event loop, and the two
threads take turns at the interpreter: under wrk on the 2-core VM that hand-over and the
thread pool cost more server CPU than the rest of the lookup. Here the statement of
``SqlScheduleStore.family_lookup`` (built once by SQLAlchemy, compiled once for psycopg) runs
on a connection of the running loop's own, in autocommit, prepared on the server; a few
connections are kept per loop (a lookup that finds them all busy reads on a thread), and one
that fails is closed. After a failure the path stands aside for a few seconds, so that while
the database is away a lookup is not made to fail twice (the caller takes the threaded path,
which answers 503 through the app's one error mapping).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections.abc import Sequence
from datetime import UTC
from typing import Any

import psycopg
from psycopg.rows import namedtuple_row
from sqlalchemy import Engine, Select

from tunehub.db.engine import PG_CONNECT_TIMEOUT_SECS

log = logging.getLogger(__name__)

MAX_OPEN = 4  # connections per event loop; a lookup beyond them reads on a thread
BACKOFF_SECS = 5.0  # how long the path stands aside after a failure


class AsyncLookups:
    """Runs the single lookup's two statements (any template, one template) on psycopg async
    connections of the running event loop (``MAX_OPEN`` at most); rows as named tuples with
    UTC timestamps."""

    def __init__(self, engine: Engine, plain: Select[Any], with_template: Select[Any]) -> None:
        url = engine.url.set(drivername="postgresql")
        self._conninfo = url.render_as_string(hide_password=False)
        self._connect_timeout = int(str(url.query.get("connect_timeout", PG_CONNECT_TIMEOUT_SECS)))
        self._sql = {
            False: str(plain.compile(dialect=engine.dialect)),
            True: str(with_template.compile(dialect=engine.dialect)),
        }
        self._idle: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, list[psycopg.AsyncConnection[Any]]
        ] = weakref.WeakKeyDictionary()
        self._open: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, int] = (
            weakref.WeakKeyDictionary()
        )
        self._resting_until = 0.0

    @property
    def available(self) -> bool:
        """False for a few seconds after a failure (see the module docstring)."""
        return time.monotonic() >= self._resting_until

    async def fetch(self, params: dict[str, Any], *, template: bool) -> Sequence[Any] | None:
        """The rows of the lookup's statement, or None when the loop's ``MAX_OPEN``
        connections are all busy (read on a thread instead: more connections would be opened
        and closed again with every burst); any failure is raised (the connection closed)."""
        loop = asyncio.get_running_loop()
        idle = self._idle.setdefault(loop, [])
        conn = idle.pop() if idle else None
        if conn is None:
            if self._open.get(loop, 0) >= MAX_OPEN:
                return None
            self._open[loop] = self._open.get(loop, 0) + 1
        try:
            if conn is None:
                conn = await psycopg.AsyncConnection.connect(
                    self._conninfo,
                    autocommit=True,
                    connect_timeout=self._connect_timeout,
                    row_factory=namedtuple_row,
                )
            cursor = await conn.execute(self._sql[template], params, prepare=True)
            rows = await cursor.fetchall()
        except BaseException:
            self._resting_until = time.monotonic() + BACKOFF_SECS
            self._open[loop] -= 1
            if conn is not None:
                with contextlib.suppress(Exception):
                    await conn.close()
            raise
        idle.append(conn)
        return [_utc(row) for row in rows]

    async def aclose(self) -> None:
        """Close the running loop's idle connections (at the app's shutdown)."""
        loop = asyncio.get_running_loop()
        for conn in self._idle.pop(loop, []):
            self._open[loop] -= 1
            with contextlib.suppress(Exception):
                await conn.close()


def _utc(row: Any) -> Any:
    """Timestamps in UTC, as the store's UTC column type gives them back."""
    changes = {
        name: value.astimezone(UTC)
        for name in ("updated_at", "confirmed_at")
        if (value := getattr(row, name, None)) is not None
    }
    return row._replace(**changes) if changes else row
