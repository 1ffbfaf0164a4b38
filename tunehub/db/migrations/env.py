"""Alembic environment: runs tunehub's migrations on a given connection or URL."""

from __future__ import annotations

from typing import Any, Literal

from alembic import context
from sqlalchemy import Connection

from tunehub.db.engine import make_engine, migrating, normalize_url
from tunehub.db.tables import Base, UTCDateTime

config = context.config
target_metadata = Base.metadata


def _render_item(kind: str, obj: Any, _context: Any) -> str | Literal[False]:
    # Migrations are frozen snapshots: spell the UTC type as its plain column type so a
    # revision never imports tunehub code that may later change.
    if kind == "type" and isinstance(obj, UTCDateTime):
        return "sa.DateTime(timezone=True)"
    return False


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things: batch mode rebuilds the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
        render_item=_render_item,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_offline() -> None:
    """Emit SQL for ``sqlalchemy.url`` without connecting (``alembic upgrade --sql``)."""
    url = normalize_url(config.get_main_option("sqlalchemy.url") or "")
    context.configure(
        url=url,
        target_metadata=target_metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
        render_as_batch=url.get_backend_name() == "sqlite",
        render_item=_render_item,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    """Migrate the connection tunehub.db.migrate passes in, or connect to ``sqlalchemy.url``."""
    connection = config.attributes.get("connection")
    if isinstance(connection, Connection):
        _configure(connection)
        return
    engine = make_engine(config.get_main_option("sqlalchemy.url") or "")
    try:
        with engine.connect() as connection, migrating(connection):
            _configure(connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
