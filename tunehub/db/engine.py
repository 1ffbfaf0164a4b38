"""Database URLs, engines (SQLite and PostgreSQL settings) and the session scope helper."""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import URL, ExceptionContext, make_url
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

from tunehub.db.store import StoreUnavailable

log = logging.getLogger(__name__)

T = TypeVar("T")

DATABASE_URL_ENV = "TUNEHUB_DATABASE_URL"
HOME_ENV = "TUNEHUB_HOME"
DEFAULT_HOME = "~/.tunehub"
DATABASE_FILE = "tunehub.db"
SQLITE_BUSY_TIMEOUT_MS = 30_000
PG_CONNECT_TIMEOUT_SECS = 10

# Execution option read by the SQLite "begin" hook: writers take the write lock at BEGIN.
_SQLITE_BEGIN_IMMEDIATE = "tunehub_sqlite_begin_immediate"


def tunehub_home() -> Path:
    """The data directory: ``$TUNEHUB_HOME`` or ``~/.tunehub``."""
    return Path(os.environ.get(HOME_ENV) or DEFAULT_HOME).expanduser()


def database_url(home: Path | None = None) -> str:
    """The database URL: ``$TUNEHUB_DATABASE_URL`` if set, else SQLite in the data directory.

    The data directory is ``home``, else ``$TUNEHUB_HOME``, else ``~/.tunehub``; it is created
    if missing. The environment variable wins even over ``home`` so a deployment can point every
    command at PostgreSQL.
    """
    url = os.environ.get(DATABASE_URL_ENV, "").strip()
    if url:
        return url
    directory = (home if home is not None else tunehub_home()).expanduser()
    directory.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{directory.resolve() / DATABASE_FILE}"


def normalize_url(url: str | URL) -> URL:
    """Parse ``url``; plain ``postgresql://`` (or ``postgres://``) gets the psycopg 3 driver."""
    text = url if isinstance(url, str) else url.render_as_string(hide_password=False)
    if text.startswith("postgres://"):
        text = "postgresql://" + text.removeprefix("postgres://")
    parsed = make_url(text)
    if parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def safe_url(url: str | URL) -> str:
    """``url`` with its password hidden, for messages and logs."""
    return make_url(url).render_as_string(hide_password=True)


def _is_sqlite_memory(url: URL) -> bool:
    return url.database in (None, "", ":memory:") or (url.query.get("mode") == "memory")


def make_engine(url: str | URL, *, echo: bool = False, pre_ping: bool = True) -> Engine:
    """An engine for ``url`` with tunehub's settings.

    SQLite: WAL journal, foreign keys on, a busy timeout, usable from any thread, and
    transactions begun by SQLAlchemy (``BEGIN``, or ``BEGIN IMMEDIATE`` on engines from
    ``write_engine``) instead of by the sqlite3 module, so a read-then-write transaction cannot
    fail half-way on a lock upgrade; the busy timeout is 30 s unless the URL says
    ``?timeout=SECS``. An in-memory SQLite database uses one shared connection and suits only
    single-threaded tests. PostgreSQL URLs use psycopg 3.
    ``pre_ping=False``: no liveness check (see ``lookup_engine``).

    Faults: PostgreSQL connections are checked before use (``pool_pre_ping``), and a
    disconnect discards every connection opened before it; on SQLite a read-only or I/O error
    counts as one, since a connection opened while its file could not be written stays
    read-only for its life.

    >>> make_engine("sqlite://").dialect.name
    'sqlite'
    """
    parsed = normalize_url(url)
    kwargs: dict[str, Any] = {"echo": echo}
    busy_ms = SQLITE_BUSY_TIMEOUT_MS
    if parsed.get_backend_name() == "sqlite":
        # No pre-ping: a SQLite connection cannot drop; the errors that spoil one are handled
        # by _configure_sqlite, and lookups that miss the cache do not pay a SELECT 1 each.
        if "timeout" in parsed.query:
            busy_ms = round(float(str(parsed.query["timeout"])) * 1000)
        kwargs["connect_args"] = {"check_same_thread": False, "timeout": busy_ms / 1000}
        if _is_sqlite_memory(parsed):
            kwargs["poolclass"] = StaticPool
    else:
        kwargs["pool_pre_ping"] = pre_ping
        if "connect_timeout" not in parsed.query:
            # A database host that drops packets must not hold a caller for the OS's minutes:
            # the runner counts an outage from failed attempts (TUNEHUB_DB_OUTAGE_SECS).
            kwargs["connect_args"] = {"connect_timeout": PG_CONNECT_TIMEOUT_SECS}
    engine = create_engine(parsed, **kwargs)
    if engine.dialect.name == "sqlite":
        _configure_sqlite(engine, memory=_is_sqlite_memory(parsed), busy_ms=busy_ms)
    return engine


# SQLite errors after which a connection is opened afresh: its file could not be written when
# it was opened (it stays read-only for its life) or the file went away under it.
_SQLITE_REOPEN = ("readonly database", "disk i/o error", "unable to open database")


def _sqlite_reopen(exc: BaseException | None) -> bool:
    text = str(exc).lower()
    return any(marker in text for marker in _SQLITE_REOPEN)


def _configure_sqlite(engine: Engine, *, memory: bool, busy_ms: int) -> None:
    @event.listens_for(engine, "handle_error")
    def _on_error(context: ExceptionContext) -> None:
        # A disconnect to SQLAlchemy: this connection and every one opened before it go.
        if not memory and _sqlite_reopen(context.original_exception):
            context.is_disconnect = True

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, record: Any) -> None:
        record.info["busy_ms"] = busy_ms
        # Let SQLAlchemy emit BEGIN itself (see the "begin" hook below).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            if not memory:
                cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute(f"PRAGMA busy_timeout={busy_ms}")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        immediate = connection.get_execution_options().get(_SQLITE_BEGIN_IMMEDIATE, False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


@contextmanager
def migrating(connection: Connection) -> Iterator[Connection]:
    """``connection`` ready for a schema migration, in one transaction.

    SQLite rebuilds a table to alter it (Alembic's batch mode), which drops tables that others
    reference: foreign keys are switched off for the migration (it cannot be done inside a
    transaction), checked once it is done, and switched back on.
    """
    if connection.dialect.name != "sqlite":
        with connection.begin():
            yield connection
        return
    raw = connection.connection.driver_connection
    assert raw is not None
    raw.execute("PRAGMA foreign_keys=OFF")
    try:
        with connection.begin():
            yield connection
            broken = connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
            if broken:
                raise RuntimeError(f"the migration broke foreign keys: {broken[:5]}")
    finally:
        raw.execute("PRAGMA foreign_keys=ON")


def write_engine(engine: Engine) -> Engine:
    """``engine`` (same pool) for read-then-write transactions.

    On SQLite its transactions start with ``BEGIN IMMEDIATE``, taking the write lock first, so
    concurrent writers queue on the busy timeout instead of failing; elsewhere it is a no-op.
    """
    return engine.execution_options(**{_SQLITE_BEGIN_IMMEDIATE: True})


def ping(engine: Engine, *, timeout_secs: float = 1.0) -> None:
    """Raise ``StoreUnavailable`` unless ``engine``'s database could take a write now.

    PostgreSQL: a connection answers ``SELECT 1``. SQLite: the write lock can be taken within
    ``timeout_secs`` (``BEGIN IMMEDIATE``, rolled back: nothing is written); a connection that
    cannot is discarded, so one opened read-only during a fault does not outlive it.

    >>> ping(make_engine("sqlite://"))
    """
    try:
        if engine.dialect.name == "sqlite":
            _ping_sqlite(engine, timeout_secs)
        else:
            with engine.connect() as connection:
                connection.exec_driver_sql("SELECT 1")
    except (OperationalError, InterfaceError, sqlite3.Error) as exc:
        orig = exc.orig if isinstance(exc, OperationalError | InterfaceError) else exc
        reason = " ".join(str(orig or exc).split())[:300]
        raise StoreUnavailable(f"the database is unreachable: {reason}") from exc


def _ping_sqlite(engine: Engine, timeout_secs: float) -> None:
    pooled = engine.raw_connection()
    try:
        raw = pooled.driver_connection
        assert raw is not None
        busy_ms = pooled.info.get("busy_ms", SQLITE_BUSY_TIMEOUT_MS)
        raw.execute(f"PRAGMA busy_timeout={max(1, round(timeout_secs * 1000))}")
        try:
            raw.execute("BEGIN IMMEDIATE")
            raw.execute("ROLLBACK")
        except sqlite3.Error as exc:
            if _sqlite_reopen(exc):
                pooled.invalidate(exc)
                engine.pool.dispose()  # and the others opened during the fault
            raise
        finally:
            if pooled.is_valid:
                raw.execute(f"PRAGMA busy_timeout={busy_ms}")
    finally:
        pooled.close()


@contextmanager
def session_scope(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A session that commits on success, rolls back on error and is always closed.

    A database that cannot be reached (refused or dropped connections, a lock that timed out)
    raises ``StoreUnavailable``, which callers may meet with a retry later; other errors pass
    as they are.

    >>> from sqlalchemy import select
    >>> factory = sessionmaker(make_engine("sqlite://"))
    >>> with session_scope(factory) as session:
    ...     session.scalar(select(1))
    1
    """
    session = factory()
    try:
        yield session
        session.commit()
    except (OperationalError, InterfaceError) as exc:
        _rollback(session)
        reason = " ".join(str(exc.orig or exc).split())[:300]
        raise StoreUnavailable(f"the database is unreachable: {reason}") from exc
    except BaseException:
        _rollback(session)
        raise
    finally:
        session.close()


def read_once(engine: Engine, read: Callable[[Connection], T]) -> T:
    """``read(connection)`` on a pooled connection, for reads only; on PostgreSQL in
    autocommit, so that no BEGIN and COMMIT round trips wrap the reads (each statement sees
    the latest commits). Meant for an engine without ``pool_pre_ping`` (``lookup_engine``):
    a connection that turns out dead is discarded with every one opened before it (as a
    failed ping would have it) and the read is tried once more on a fresh one. A database
    that cannot be reached raises ``StoreUnavailable``, as in ``session_scope``."""
    for attempt in (1, 2):
        try:
            with engine.connect() as conn:
                if engine.dialect.name == "postgresql":
                    conn = conn.execution_options(isolation_level="AUTOCOMMIT")
                return read(conn)
        except (OperationalError, InterfaceError) as exc:
            if attempt == 1 and exc.connection_invalidated:
                continue
            reason = " ".join(str(exc.orig or exc).split())[:300]
            raise StoreUnavailable(f"the database is unreachable: {reason}") from exc
    raise AssertionError("unreachable")


def lookup_engine(engine: Engine) -> Engine:
    """An engine for the single lookup's reads (``read_once``): on PostgreSQL one of its own
    without the pool's liveness check (a ``SELECT 1`` round trip before every lookup, an
    eighth of an uncached lookup's time in a profile on the 2-core VM), with the same URL and
    settings otherwise; on SQLite ``engine`` itself (it has no such check)."""
    if engine.dialect.name != "postgresql":
        return engine
    # One per engine (stores that share an engine share its lookup pool), gone with it.
    with _LOOKUP_LOCK:
        found = _LOOKUP_ENGINES.get(engine)
        if found is None:
            found = _LOOKUP_ENGINES[engine] = make_engine(
                engine.url, echo=bool(engine.echo), pre_ping=False
            )
        return found


_LOOKUP_LOCK = threading.Lock()
_LOOKUP_ENGINES: weakref.WeakKeyDictionary[Engine, Engine] = weakref.WeakKeyDictionary()


def _rollback(session: Session) -> None:
    # On a dropped connection the rollback fails too; the error that matters is the first.
    try:
        session.rollback()
    except (OperationalError, InterfaceError):
        log.debug("rollback on a broken connection failed", exc_info=True)
