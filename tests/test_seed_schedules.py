"""scripts/seed_schedules.py, the load tests' seeder: every seeded shape answers a lookup
from the ``exact`` tier, and PostgreSQL gets fresh planner statistics after the bulk load."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from sqlalchemy import text

from tests.db_fixtures import empty_pg_database
from tunehub.core import Workload, local_cpu_target
from tunehub.db import SqlScheduleStore, make_engine, upgrade
from tunehub.tuner.lookup import LookupQuery, find_schedules

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

from seed_schedules import main, shape_of


def seeded_lookups(url: str, count: int, side: int) -> list[str]:
    store = SqlScheduleStore(url)
    try:
        target = local_cpu_target()
        shapes = [shape_of(i, side=side) for i in range(count)]
        queries = [LookupQuery(Workload(m=m, n=n, k=k), target) for m, n, k in shapes]
        return [a.source if a else "none" for a in find_schedules(store, queries)]
    finally:
        store.close()


def test_seeding_sqlite_answers_every_shape_exactly(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'seed.db'}"
    upgrade(url)
    assert main(["--database-url", url, "--count", "27", "--side", "3"]) == 0
    assert seeded_lookups(url, 27, 3) == ["exact"] * 27


@pytest.mark.postgres
def test_seeding_postgresql_leaves_the_planner_fresh_statistics() -> None:
    for url in empty_pg_database():
        upgrade(url)
        assert main(["--database-url", url, "--count", "64", "--side", "4"]) == 0
        assert seeded_lookups(url, 64, 4) == ["exact"] * 64
        engine = make_engine(url)
        try:
            with engine.connect() as conn:
                analyzed = conn.execute(
                    text(
                        "SELECT relname FROM pg_stat_user_tables WHERE last_analyze IS NOT NULL "
                        "AND relname IN ('schedules', 'workloads', 'records', 'targets')"
                    )
                ).scalars()
                assert sorted(analyzed) == ["records", "schedules", "targets", "workloads"]
                rows = conn.execute(
                    text("SELECT reltuples FROM pg_class WHERE relname = 'schedules'")
                ).scalar_one()
                assert rows == 64
        finally:
            engine.dispose()
