"""Storage: SQLAlchemy tables, engines, Alembic migrations and the ScheduleStore implementations.

>>> from tunehub.db import SqlScheduleStore, database_url, upgrade
>>> url = database_url()  # doctest: +SKIP
>>> upgrade(url)  # doctest: +SKIP
>>> store = SqlScheduleStore(url)  # doctest: +SKIP
"""

from __future__ import annotations

from tunehub.db.engine import database_url, make_engine, session_scope
from tunehub.db.memory_store import MemoryScheduleStore
from tunehub.db.migrate import (
    SchemaOutOfDate,
    check_at_head,
    current_revision,
    head_revision,
    upgrade,
)
from tunehub.db.sql_store import SqlScheduleStore
from tunehub.db.store import (
    ApiKeyNotFound,
    JobNotFound,
    LeaseLost,
    QueueFull,
    ScheduleStore,
    StoreUnavailable,
)

__all__ = [
    "ApiKeyNotFound",
    "JobNotFound",
    "LeaseLost",
    "MemoryScheduleStore",
    "QueueFull",
    "ScheduleStore",
    "SchemaOutOfDate",
    "SqlScheduleStore",
    "StoreUnavailable",
    "check_at_head",
    "current_revision",
    "database_url",
    "head_revision",
    "make_engine",
    "session_scope",
    "upgrade",
]
