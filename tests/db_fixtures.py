"""Database fixtures: ``store`` (memory, SQLite, PostgreSQL), migrated SQLite and PostgreSQL URLs.

PostgreSQL comes from ``$TUNEHUB_TEST_PG_URL`` (default the local server); each test session
creates its own database, migrates it, truncates it between tests and drops it at the end. If
no server answers, the PostgreSQL variants are skipped with the reason.
"""

from __future__ import annotations

import os
import secrets
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.pool import NullPool

from tunehub.db import MemoryScheduleStore, ScheduleStore, SqlScheduleStore, make_engine, upgrade
from tunehub.db.engine import normalize_url, safe_url
from tunehub.db.tables import Base

__all__ = [
    "empty_pg_database",
    "pg_engine",
    "pg_store",
    "pg_url",
    "sql_url",
    "sqlite_template",
    "sqlite_url",
    "store",
]

PG_URL_ENV = "TUNEHUB_TEST_PG_URL"
DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
DEADLOCK_DETECTED = "40P01"  # PostgreSQL's SQLSTATE
TRUNCATE_ATTEMPTS = 5


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file migrated to head once per session; tests get copies."""
    path = tmp_path_factory.mktemp("sqlite") / "template.db"
    engine = make_engine(f"sqlite:///{path}")
    upgrade(engine)
    engine.dispose()  # closing the last connection checkpoints the WAL into the file
    return path


@pytest.fixture
def sqlite_url(sqlite_template: Path, tmp_path: Path) -> str:
    """A fresh SQLite database at head (a copy of the session's migrated template)."""
    path = tmp_path / "tunehub.db"
    shutil.copyfile(sqlite_template, path)
    return f"sqlite:///{path}"


def empty_pg_database() -> Iterator[str]:
    """Create an empty PostgreSQL database, yield its URL, drop it (skip if no server)."""
    admin_url = normalize_url(os.environ.get(PG_URL_ENV, DEFAULT_PG_URL))
    admin = create_engine(
        admin_url,
        isolation_level="AUTOCOMMIT",
        poolclass=NullPool,
        connect_args={"connect_timeout": 5},
    )
    name = f"tunehub_test_{os.getpid()}_{secrets.token_hex(4)}"
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except OperationalError as exc:
        admin.dispose()
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        pytest.skip(f"PostgreSQL not reachable at {safe_url(admin_url)}: {reason}")
    url = admin_url.set(database=name).render_as_string(hide_password=False)
    try:
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A new PostgreSQL database at head for this test session, dropped at the end."""
    for url in empty_pg_database():
        upgrade(url)
        yield url


@pytest.fixture(scope="session")
def pg_engine(pg_url: str) -> Iterator[Engine]:
    engine = make_engine(pg_url)
    yield engine
    engine.dispose()


def _truncate(engine: Engine) -> None:
    """Empty every table. TRUNCATE locks the tables one after another; a reader still open on
    them from an earlier test (a served app follows the change feed on a thread, several tables
    in one transaction) can take them in another order, and PostgreSQL then ends one of the two
    with a deadlock. When it ends the TRUNCATE, the reader has gone on: try again, a few times."""
    names = ", ".join(t.name for t in Base.metadata.sorted_tables)
    for attempt in range(TRUNCATE_ATTEMPTS):
        try:
            with engine.begin() as conn:
                conn.execute(text(f"TRUNCATE {names} RESTART IDENTITY CASCADE"))
            return
        except OperationalError as exc:
            if getattr(exc.orig, "sqlstate", None) != DEADLOCK_DETECTED:
                raise
            if attempt == TRUNCATE_ATTEMPTS - 1:
                raise
            time.sleep(0.1 * (attempt + 1))


@pytest.fixture
def pg_store(pg_engine: Engine) -> SqlScheduleStore:
    """A SqlScheduleStore on the session's PostgreSQL database, emptied first."""
    _truncate(pg_engine)
    return SqlScheduleStore(pg_engine)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def sql_url(request: pytest.FixtureRequest) -> str:
    """An empty database at head on each SQL backend (open several stores on it)."""
    if request.param == "sqlite":
        url: str = request.getfixturevalue("sqlite_url")
        return url
    _truncate(request.getfixturevalue("pg_engine"))
    pg: str = request.getfixturevalue("pg_url")
    return pg


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest) -> Iterator[ScheduleStore]:
    """An empty ScheduleStore: the in-memory double, SQLite and PostgreSQL."""
    result: ScheduleStore
    if request.param == "memory":
        result = MemoryScheduleStore()
    elif request.param == "sqlite":
        result = SqlScheduleStore(request.getfixturevalue("sqlite_url"))
    else:
        result = request.getfixturevalue("pg_store")
    yield result
    result.close()
