"""Alembic migrations against tables.py, the schema check, database URLs and engine settings."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Column, Engine, Integer, MetaData, inspect, select, text
from sqlalchemy.exc import IntegrityError, StatementError
from sqlalchemy.orm import sessionmaker

from tests.db_fixtures import empty_pg_database
from tunehub.core import Config, Workload, local_cpu_target
from tunehub.db import (
    SchemaOutOfDate,
    SqlScheduleStore,
    check_at_head,
    current_revision,
    database_url,
    head_revision,
    make_engine,
    session_scope,
    upgrade,
)
from tunehub.db.migrate import MIGRATIONS_DIR, alembic_config
from tunehub.db.tables import Base, TargetRow

TABLES = {
    "targets",
    "workloads",
    "jobs",
    "records",
    "schedules",
    "baselines",
    "workers",
    "api_keys",
    "models",
    "autotune_results",
}


def _differences(url: str, metadata: MetaData) -> list[object]:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            return list(compare_metadata(context, metadata))
    finally:
        engine.dispose()


# --- migrations ------------------------------------------------------------------------------
def test_upgrade_of_an_empty_sqlite_database_reaches_head(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'new.db'}"
    assert current_revision(url) is None
    upgrade(url)
    assert current_revision(url) == head_revision() == "0012"
    check_at_head(url)
    upgrade(url)  # at head already: nothing to do
    engine = make_engine(url)
    assert set(inspect(engine).get_table_names()) == TABLES | {"alembic_version"}
    engine.dispose()


def test_an_empty_database_is_not_initialised(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    with pytest.raises(SchemaOutOfDate) as info:
        check_at_head(url)
    message = str(info.value)
    assert "not initialised" in message and "run `tunehub db upgrade`" in message
    assert str(tmp_path) in message
    assert (info.value.current, info.value.head) == (None, head_revision())


def test_a_database_at_an_older_revision_is_out_of_date(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    upgrade(url)
    command.downgrade(alembic_config(url), "base")  # the only older revision there is
    engine = make_engine(url)
    assert inspect(engine).get_table_names() == ["alembic_version"]
    engine.dispose()
    with pytest.raises(SchemaOutOfDate, match="not initialised"):
        check_at_head(url)
    upgrade(url)
    check_at_head(url)


def test_upgrade_from_0001_keeps_the_data_and_adds_baselines(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'v1.db'}"
    upgrade(url, revision="0001")
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO workloads VALUES ('w', 'matmul', 8, 8, 8, 'float32', 'row_major',"
                " 'none', '2026-11-22 00:00:00+00:00')"
            )
        )
    with pytest.raises(SchemaOutOfDate, match="0001"):
        check_at_head(engine)
    upgrade(engine)
    check_at_head(engine)
    assert "baselines" in inspect(engine).get_table_names()
    with engine.connect() as conn:
        assert conn.execute(text("SELECT m FROM workloads")).scalar_one() == 8
    engine.dispose()


def _fill_0003(engine: Engine) -> dict[str, str]:
    """Rows as a 0003 database holds them: a target, a workload, a job, a record, a schedule
    and a baseline. Returns the keys used."""
    target = local_cpu_target()
    workload = Workload(m=64, n=48, k=32, epilogue="bias")
    config = Config({"MR": 6, "NR": 64})
    now = "2026-11-22 00:00:00+00:00"
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO targets VALUES (:key, :family, 'cpu', :name, :data, :now)"),
            {
                "key": target.target_key,
                "family": target.family_key,
                "name": target.name,
                "data": json.dumps(target.to_dict()),
                "now": now,
            },
        )
        conn.execute(
            text(
                "INSERT INTO workloads VALUES (:key, 'matmul', 64, 48, 32, 'float32', "
                "'row_major', 'bias', :now)"
            ),
            {"key": workload.key, "now": now},
        )
        for uid, template, cfg, median in (
            ("r1", "blis.gemm", config.to_dict(), 1e-5),
            ("b1", "numpy.matmul", {"threads": 1}, 2e-5),
        ):
            conn.execute(
                text(
                    "INSERT INTO records (uid, job_id, workload_key, target_key, template,"
                    " template_version, config, config_key, status, median_secs, repeat_secs,"
                    " error, compile_secs, verify_secs, run_secs, environment, created_at)"
                    " VALUES (:uid, NULL, :w, :t, :tpl, 2, :cfg, :ck, 'ok', :median, :reps,"
                    " '', 0, 0, 0, '{}', :now)"
                ),
                {
                    "uid": uid,
                    "w": workload.key,
                    "t": target.target_key,
                    "tpl": template,
                    "cfg": json.dumps(cfg),
                    "ck": Config(cfg).key,
                    "median": median,
                    "reps": json.dumps([median]),
                    "now": now,
                },
            )
        conn.execute(
            text(
                "INSERT INTO schedules VALUES (:w, :t, 'blis.gemm', 2, :cfg, 1e-5, 1.0, 'r1', :now)"
            ),
            {
                "w": workload.key,
                "t": target.target_key,
                "cfg": json.dumps(config.to_dict()),
                "now": now,
            },
        )
        conn.execute(
            text("INSERT INTO baselines VALUES (:w, :t, 'numpy.matmul', 1, 2e-5, 'b1', :now)"),
            {"w": workload.key, "t": target.target_key, "now": now},
        )
    return {"workload": workload.key, "target": target.target_key}


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database (no tables) on each backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.db'}"
        return
    yield from empty_pg_database()


def test_upgrade_from_0003_keeps_keys_schedules_and_baselines(empty_url: str) -> None:
    upgrade(empty_url, revision="0003")
    engine = make_engine(empty_url)
    keys = _fill_0003(engine)
    upgrade(engine)
    check_at_head(engine)
    store = SqlScheduleStore(engine)
    workload = Workload(m=64, n=48, k=32, epilogue="bias")
    assert workload.key == keys["workload"]
    assert store.get_workload(workload.key) == workload
    schedule = store.get_schedule(workload_key=workload.key, target_key=keys["target"])
    assert schedule is not None and schedule.record_uid == "r1"
    assert schedule.confirmation is None
    baseline = store.get_baseline(
        workload_key=workload.key,
        target_key=keys["target"],
        template="numpy.matmul",
        config=Config({"threads": 1}),
    )
    assert baseline is not None and baseline.uid == "b1"
    assert [r.uid for r in store.list_baselines(workload_key=workload.key,
                                                target_key=keys["target"])] == ["b1"]  # fmt: skip
    # And back: the thread-count baselines survive a downgrade.
    command.downgrade(alembic_config(empty_url), "0003")
    with engine.connect() as conn:
        assert conn.execute(text("SELECT threads, record_uid FROM baselines")).one() == (1, "b1")
        assert conn.execute(text("SELECT layout FROM workloads")).scalar_one() == "row_major"
    engine.dispose()


def test_upgrade_from_0004_queues_old_jobs_by_creation_and_gives_them_no_key(
    empty_url: str,
) -> None:
    upgrade(empty_url, revision="0004")
    engine = make_engine(empty_url)
    target = local_cpu_target()
    workload = Workload(m=8, n=8, k=8)
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO targets VALUES (:key, :family, 'cpu', :name, :data, :now)"),
            {
                "key": target.target_key,
                "family": target.family_key,
                "name": target.name,
                "data": json.dumps(target.to_dict()),
                "now": "2026-11-22 00:00:00+00:00",
            },
        )
        conn.execute(
            text(
                "INSERT INTO workloads (workload_key, op, m, n, k, dtype, epilogue, created_at)"
                " VALUES (:key, 'matmul', 8, 8, 8, 'float32', 'none', :now)"
            ),
            {"key": workload.key, "now": "2026-11-22 00:00:00+00:00"},
        )
        for job_id, created in ((1, "2026-11-22 01:00:00+00:00"), (2, "2026-11-22 00:30:00+00:00")):
            conn.execute(
                text(
                    "INSERT INTO jobs (id, workload_key, target_key, template, strategy, budget,"
                    " seed, state, trials_done, error, created_at)"
                    " VALUES (:id, :w, :t, 'blis.gemm', 'random', :budget, 0, 'queued', 0, '',"
                    " :created)"
                ),
                {
                    "id": job_id,
                    "w": workload.key,
                    "t": target.target_key,
                    "budget": json.dumps({"max_trials": 4, "max_secs": 60.0}),
                    "created": created,
                },
            )
    upgrade(engine)
    check_at_head(engine)
    store = SqlScheduleStore(engine)
    assert [j.api_key_id for j in store.list_jobs()] == [None, None]
    claimed = store.claim_job()
    assert claimed is not None and claimed.id == 2  # it was queued first
    command.downgrade(alembic_config(empty_url), "0004")
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM jobs")).scalar_one() == 2
        assert "api_keys" not in inspect(conn).get_table_names()
    engine.dispose()


def test_upgrade_from_0006_gives_running_jobs_no_lease_so_the_reaper_requeues_them(
    empty_url: str,
) -> None:
    upgrade(empty_url, revision="0006")
    engine = make_engine(empty_url)
    target = local_cpu_target()
    workload = Workload(m=8, n=8, k=8)
    now = "2026-11-23 00:00:00+00:00"
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO targets VALUES (:key, :family, 'cpu', :name, :data, :now)"),
            {
                "key": target.target_key,
                "family": target.family_key,
                "name": target.name,
                "data": json.dumps(target.to_dict()),
                "now": now,
            },
        )
        conn.execute(
            text(
                "INSERT INTO workloads (workload_key, op, m, n, k, dtype, epilogue, created_at)"
                " VALUES (:key, 'matmul', 8, 8, 8, 'float32', 'none', :now)"
            ),
            {"key": workload.key, "now": now},
        )
        for job_id, state, owner in ((1, "running", "old-host:42:1000"), (2, "queued", "")):
            conn.execute(
                text(
                    "INSERT INTO jobs (id, workload_key, target_key, template, strategy, budget,"
                    " seed, state, trials_done, error, created_at, owner, queued_at)"
                    " VALUES (:id, :w, :t, 'blis.gemm', 'random', :budget, 0, :state, 0, '',"
                    " :now, :owner, :now)"
                ),
                {
                    "id": job_id,
                    "w": workload.key,
                    "t": target.target_key,
                    "budget": json.dumps({"max_trials": 4, "max_secs": 60.0}),
                    "state": state,
                    "owner": owner,
                    "now": now,
                },
            )
    upgrade(engine)
    check_at_head(engine)
    store = SqlScheduleStore(engine)
    running = store.get_job(1)
    assert (running.owner, running.lease_expires_at) == ("old-host:42:1000", None)
    # Its process was judged by host:pid before; now no lease means expired.
    assert store.requeue_expired() == [1]
    assert store.get_job(1).state.value == "queued"
    command.downgrade(alembic_config(empty_url), "0006")
    with engine.connect() as conn:
        columns = {c["name"] for c in inspect(conn).get_columns("jobs")}
        assert "lease_expires_at" not in columns and "owner" in columns
    engine.dispose()


def test_upgrade_from_0009_leaves_old_models_ungated_so_none_is_used(empty_url: str) -> None:
    upgrade(empty_url, revision="0009")
    engine = make_engine(empty_url)
    target = local_cpu_target()
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO models (family_key, template, template_version, version, kind,"
                " features, target_label, records_used, workloads_used, last_record_seq,"
                " metrics, created_at, artifact) VALUES (:family, 'blis.gemm', 2, 1, 'xgboost',"
                " 'blis.gemm/1', 'cpu', 800, 3, 10, :metrics, :now, :blob)"
            ),
            {
                "family": target.family_key,
                "metrics": json.dumps({"spearman": 0.024, "top1_fraction": 0.038}),
                "now": "2026-11-25 00:00:00+00:00",
                "blob": b"model",
            },
        )
    upgrade(engine)
    check_at_head(engine)
    store = SqlScheduleStore(engine)
    key = {"family_key": target.family_key, "template": "blis.gemm", "template_version": 2}
    old = store.latest_model(**key)
    assert old is not None and (old.accepted, old.reason) == (None, "")
    assert old.metrics == {"spearman": 0.024, "top1_fraction": 0.038}
    assert store.latest_model(**key, accepted_only=True) is None, "never gated: never used"
    command.downgrade(alembic_config(empty_url), "0009")
    with engine.connect() as conn:
        columns = {c["name"] for c in inspect(conn).get_columns("models")}
        assert "accepted" not in columns and "reason" not in columns and "metrics" in columns
    engine.dispose()


def test_a_database_from_a_newer_tunehub_names_both_revisions(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'newer.db'}"
    upgrade(url)
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = 'f00dfeed0000'"))
    with pytest.raises(SchemaOutOfDate) as info:
        check_at_head(engine)
    engine.dispose()
    message = str(info.value)
    assert "f00dfeed0000" in message and head_revision() in message
    assert "newer tunehub" in message and "tunehub db upgrade" in message


def test_migrations_match_tables_py(sql_url: str) -> None:
    assert _differences(sql_url, Base.metadata) == []


def test_the_comparison_sees_a_table_change(sql_url: str) -> None:
    changed = MetaData(naming_convention=Base.metadata.naming_convention)
    for table in Base.metadata.sorted_tables:
        table.to_metadata(changed)
    changed.tables["jobs"].append_column(Column("not_a_column", Integer, nullable=False))
    differences = _differences(sql_url, changed)
    assert [d[0] for d in differences if isinstance(d, tuple)] == ["add_column"]


def test_the_migrations_ship_as_package_data() -> None:
    # pyproject's package-data globs: db/migrations/*.mako and db/migrations/versions/*.py.
    assert (MIGRATIONS_DIR / "env.py").is_file()
    assert (MIGRATIONS_DIR / "script.py.mako").is_file()
    assert [p.name for p in sorted((MIGRATIONS_DIR / "versions").glob("*.py"))] == [
        "0001_initial.py",
        "0002_baselines.py",
        "0003_job_owner.py",
        "0004_pipeline.py",
        "0005_models.py",
        "0006_api_keys.py",
        "0007_job_leases.py",
        "0008_job_priority.py",
        "0009_autotune.py",
        "0010_model_gate.py",
        "0011_job_resumes.py",
        "0012_operator_params.py",
    ]


# --- URLs and engines --------------------------------------------------------------------------
def test_database_url_prefers_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TUNEHUB_DATABASE_URL", "postgresql://tunehub@db.example/tunehub")
    assert database_url(tmp_path) == "postgresql://tunehub@db.example/tunehub"


def test_database_url_defaults_to_sqlite_in_the_data_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TUNEHUB_DATABASE_URL", raising=False)
    monkeypatch.setenv("TUNEHUB_HOME", str(tmp_path / "home"))
    assert database_url() == f"sqlite:///{tmp_path / 'home' / 'tunehub.db'}"
    assert (tmp_path / "home").is_dir()
    explicit = tmp_path / "a" / "b"
    assert database_url(explicit) == f"sqlite:///{explicit / 'tunehub.db'}"
    assert explicit.is_dir()
    monkeypatch.delenv("TUNEHUB_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    assert database_url() == f"sqlite:///{tmp_path / 'user' / '.tunehub' / 'tunehub.db'}"


def test_postgresql_urls_use_psycopg() -> None:
    for url in ("postgresql://u@h/db", "postgres://u@h/db", "postgresql+psycopg://u@h/db"):
        engine = make_engine(url)
        assert (engine.dialect.name, engine.dialect.driver) == ("postgresql", "psycopg")
        engine.dispose()


def test_sqlite_engines_use_wal_foreign_keys_and_a_busy_timeout(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'x.db'}")
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30_000
    engine.dispose()


def test_sqlite_refuses_rows_breaking_foreign_keys(sqlite_url: str) -> None:
    engine = make_engine(sqlite_url)
    with pytest.raises(IntegrityError, match="FOREIGN KEY"), engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO jobs (workload_key, target_key, template, strategy, budget, seed,"
                " state, trials_done, error, created_at, queued_at) VALUES ('w', 't',"
                " 'blis.gemm', 'random', '{}', 0, 'queued', 0, '', '2024-01-01 00:00:00',"
                " '2024-01-01 00:00:00')"
            )
        )
    engine.dispose()


def test_session_scope_commits_or_rolls_back(sqlite_url: str) -> None:
    engine = make_engine(sqlite_url)
    factory = sessionmaker(engine)
    row = {"family_key": "f", "kind": "cpu", "name": "n", "data": {}}
    with session_scope(factory) as session:
        session.add(TargetRow(target_key="kept", created_at=datetime.now(UTC), **row))
    with pytest.raises(RuntimeError), session_scope(factory) as session:
        session.add(TargetRow(target_key="dropped", created_at=datetime.now(UTC), **row))
        session.flush()
        raise RuntimeError("fail after the insert")
    with session_scope(factory) as session:
        assert list(session.scalars(select(TargetRow.target_key))) == ["kept"]
        kept = session.get_one(TargetRow, "kept")
        assert kept.created_at.tzinfo is UTC
    engine.dispose()


def test_naive_datetimes_are_refused(sqlite_url: str) -> None:
    engine = make_engine(sqlite_url)
    factory = sessionmaker(engine)
    with pytest.raises(StatementError, match="naive datetime"), session_scope(factory) as session:
        session.add(
            TargetRow(
                target_key="k",
                family_key="f",
                kind="cpu",
                name="n",
                data={},
                created_at=datetime(2024, 1, 1),
            )
        )
    engine.dispose()
