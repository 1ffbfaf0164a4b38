"""Schema migrations: upgrade a database with the Alembic scripts shipped in the package.

No ``alembic.ini`` is needed: the configuration is built here.

>>> from tunehub.db import make_engine, upgrade, check_at_head
>>> engine = make_engine("sqlite://")
>>> upgrade(engine)
>>> check_at_head(engine)
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine

from tunehub.db.engine import make_engine, migrating, safe_url

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
UPGRADE_HINT = "run `tunehub db upgrade`"


class SchemaOutOfDate(RuntimeError):
    """The database's schema revision is not the one this tunehub was built for."""

    def __init__(self, url: str, current: str | None, head: str, message: str) -> None:
        super().__init__(message)
        self.url = url
        self.current = current
        self.head = head


def alembic_config(url: str | None = None) -> Config:
    """An Alembic Config for the packaged migrations (``url`` for offline or CLI use)."""
    config = Config()
    # ConfigParser interpolates '%', so a path or URL holding one must escape it.
    config.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
    if url is not None:
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


@contextmanager
def _engine(url_or_engine: str | Engine) -> Iterator[Engine]:
    if isinstance(url_or_engine, Engine):
        yield url_or_engine
        return
    engine = make_engine(url_or_engine)
    try:
        yield engine
    finally:
        engine.dispose()


def _url_text(url_or_engine: str | Engine) -> str:
    url = url_or_engine.url if isinstance(url_or_engine, Engine) else url_or_engine
    return safe_url(url)


def upgrade(url_or_engine: str | Engine, revision: str = "head") -> None:
    """Migrate the database to ``revision`` (the newest by default); creates the tables."""
    with (
        _engine(url_or_engine) as engine,
        engine.connect() as connection,
        migrating(connection),
    ):
        _run_upgrade(connection, revision)
    log.info("database %s upgraded to %s", _url_text(url_or_engine), revision)


def _run_upgrade(connection: Connection, revision: str) -> None:
    config = alembic_config()
    config.attributes["connection"] = connection
    command.upgrade(config, revision)


def head_revision() -> str:
    """The newest revision shipped with this tunehub."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:
        raise RuntimeError(f"no migrations found in {MIGRATIONS_DIR}")
    return head


def current_revision(url_or_engine: str | Engine) -> str | None:
    """The database's revision, or None for a database tunehub has never migrated."""
    with _engine(url_or_engine) as engine, engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def check_at_head(url_or_engine: str | Engine) -> None:
    """Raise SchemaOutOfDate unless the database is at ``head_revision()``."""
    head = head_revision()
    current = current_revision(url_or_engine)
    if current == head:
        return
    url = _url_text(url_or_engine)
    if current is None:
        message = f"database {url} is not initialised (no tunehub schema); {UPGRADE_HINT}"
    elif current in _known_revisions():
        message = (
            f"database {url} is at schema revision {current}, but this tunehub needs "
            f"{head}; {UPGRADE_HINT}"
        )
    else:
        message = (
            f"database {url} is at schema revision {current}, unknown to this tunehub (head "
            f"{head}): a newer tunehub migrated it, so use that version; `tunehub db upgrade` "
            "only moves a database forward to this tunehub's head"
        )
    raise SchemaOutOfDate(url, current, head, message)


def _known_revisions() -> set[str]:
    return {
        script.revision for script in ScriptDirectory.from_config(alembic_config()).walk_revisions()
    }
