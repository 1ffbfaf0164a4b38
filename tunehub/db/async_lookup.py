"""The single lookup's read on the caller's event loop (PostgreSQL): psycopg's async
connections, so an uncached lookup needs no thread of the pool.

Read on a pool thread, an uncached lookup hands its answer back to the event loop, and the two
threads take turns at the interpreter: under wrk on the 2-core VM that hand-over was the most
of the lookup's latency tail. Here the statement of ``SqlScheduleStore.family_lookup`` (built
once by SQLAlchemy, compiled once for psycopg) runs on a connection of the running loop's own,
in autocommit, prepared on the server; idle connections are kept per loop (a few), and one
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

MAX_IDLE = 4  # connections kept per event loop (one per request in flight at most)
BACKOFF_SECS = 5.0  # how long the path stands aside after a failure


class AsyncLookups:
    """Runs the single lookup's two statements (any template, one template) on psycopg async
    connections of the running event loop; rows as named tuples with UTC timestamps."""

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
        self._resting_until = 0.0

    @property
    def available(self) -> bool:
        """False for a few seconds after a failure (see the module docstring)."""
        return time.monotonic() >= self._resting_until

    async def fetch(self, params: dict[str, Any], *, template: bool) -> Sequence[Any]:
        """The rows of the lookup's statement; any failure is raised (the connection closed)."""
        idle = self._idle.setdefault(asyncio.get_running_loop(), [])
        conn = idle.pop() if idle else None
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
            if conn is not None:
                with contextlib.suppress(Exception):
                    await conn.close()
            raise
        if len(idle) < MAX_IDLE:
            idle.append(conn)
        else:
            await conn.close()
        return [_utc(row) for row in rows]

    async def aclose(self) -> None:
        """Close the running loop's idle connections (at the app's shutdown)."""
        for conn in self._idle.pop(asyncio.get_running_loop(), []):
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
