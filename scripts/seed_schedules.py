"""Seed a tunehub database with many synthetic Schedules, for load tests of the lookup.

Each seeded shape gets a workload row, one ok measure record (the schedule's source; the
``environment`` says ``"seeded": true``) and a schedule row, for one target (default: this
machine's CPU, so ``target=local-cpu`` lookups answer from the ``exact`` tier). Shapes are
``matmul`` float32 on a grid: ``m``, ``n``, ``k`` = ``step`` x 1, 2, ..., so ``--count``
10^6 with the default grid side 100 covers m, n, k in 16..1600. ``shape_of(i)`` (below) names
the i-th shape, so a load generator can ask for seeded shapes without reading the database.

PostgreSQL is filled with COPY, SQLite with executemany in chunks; the database must be at
the Alembic head (``tunehub db upgrade``). Existing rows are kept: seeding the same shapes
twice fails on the workloads' primary key (seed a fresh database).

    python scripts/seed_schedules.py --database-url postgresql://postgres@127.0.0.1/lookload \\
        --count 1000000
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine, insert

from tunehub.core import Target, Workload, local_cpu_target
from tunehub.db import SqlScheduleStore, check_at_head, make_engine
from tunehub.db.tables import RecordRow, ScheduleRow, WorkloadRow, table
from tunehub.kernels.registry import get_template

log = logging.getLogger("seed_schedules")

STEP = 16
SIDE = 100  # shapes per dimension: SIDE**3 = 10^6 shapes
CHUNK = 20_000


def shape_of(index: int, *, side: int = SIDE, step: int = STEP) -> tuple[int, int, int]:
    """The (m, n, k) of the ``index``-th seeded shape.

    >>> shape_of(0), shape_of(1), shape_of(100), shape_of(999_999)
    ((16, 16, 16), (16, 16, 32), (16, 32, 16), (1600, 1600, 1600))
    """
    m, rest = divmod(index, side * side)
    n, k = divmod(rest, side)
    return (m + 1) * step, (n + 1) * step, (k + 1) * step


def _rows(
    count: int, target: Target, template: str, side: int
) -> Iterator[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]:
    tmpl = get_template(template)
    first = Workload(op="matmul", m=256, n=256, k=256, dtype="float32")
    config = tmpl.default_config(first, target)
    config_json = config.to_dict()
    now = datetime.now(UTC)
    for index in range(count):
        m, n, k = shape_of(index, side=side)
        workload = Workload(op="matmul", m=m, n=n, k=k, dtype="float32")
        key = workload.key
        # A plausible time: 20 GFLOP/s, jittered by the index so medians differ.
        secs = workload.flops / 20e9 * (1.0 + (index % 7) / 100.0)
        uid = uuid.uuid4().hex
        yield (
            {"workload_key": key, **workload.to_dict(), "created_at": now},
            {
                "uid": uid,
                "job_id": None,
                "workload_key": key,
                "target_key": target.target_key,
                "template": tmpl.name,
                "template_version": tmpl.version,
                "config": config_json,
                "config_key": config.key,
                "status": "ok",
                "median_secs": secs,
                "repeat_secs": [secs, secs],
                "error": "",
                "compile_secs": 0.0,
                "verify_secs": 0.0,
                "run_secs": 2 * secs,
                "environment": {"seeded": True},
                "created_at": now,
            },
            {
                "workload_key": key,
                "target_key": target.target_key,
                "template": tmpl.name,
                "template_version": tmpl.version,
                "config": config_json,
                "median_secs": secs,
                "gflops": workload.gflops(secs),
                "record_uid": uid,
                "updated_at": now,
            },
        )


def _chunks(
    rows: Iterator[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]],
) -> Iterator[tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]]:
    workloads: list[dict[str, Any]] = []
    records: list[dict[str, Any]] = []
    schedules: list[dict[str, Any]] = []
    for w, r, s in rows:
        workloads.append(w)
        records.append(r)
        schedules.append(s)
        if len(workloads) == CHUNK:
            yield workloads, records, schedules
            workloads, records, schedules = [], [], []
    if workloads:
        yield workloads, records, schedules


def _copy_text(value: Any) -> str:
    """One value in COPY's text format."""
    if value is None:
        return "\\N"
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, dict | list):
        value = json.dumps(value, separators=(",", ":"))
    elif isinstance(value, datetime):
        value = value.isoformat()
    text = str(value)
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")


def _copy(cursor: Any, name: str, rows: list[dict[str, Any]]) -> None:
    columns = list(rows[0])
    buffer = io.StringIO()
    for row in rows:
        buffer.write("\t".join(_copy_text(row[c]) for c in columns))
        buffer.write("\n")
    with cursor.copy(f"COPY {name} ({', '.join(columns)}) FROM STDIN") as copy:
        copy.write(buffer.getvalue())


def seed(engine: Engine, *, count: int, target: Target, template: str, side: int) -> None:
    """Insert ``count`` workloads, records and schedules for ``target`` in chunks, each chunk
    in one transaction."""
    store = SqlScheduleStore(engine)
    store.put_target(target)
    done = 0
    start = time.monotonic()
    for workloads, records, schedules in _chunks(_rows(count, target, template, side)):
        if engine.dialect.name == "postgresql":
            raw = engine.raw_connection()
            try:
                with raw.cursor() as cursor:
                    _copy(cursor, "workloads", workloads)
                    _copy(cursor, "records", records)
                    _copy(cursor, "schedules", schedules)
                raw.commit()
            finally:
                raw.close()
        else:
            with engine.begin() as conn:
                conn.execute(insert(table(WorkloadRow)), workloads)
                conn.execute(insert(table(RecordRow)), records)
                conn.execute(insert(table(ScheduleRow)), schedules)
        done += len(workloads)
        log.info("%d schedules (%.0f/s)", done, done / (time.monotonic() - start))
    if engine.dialect.name == "postgresql":
        # Fresh planner statistics: with the tables' sizes from before the load (autovacuum
        # gets to it minutes later) PostgreSQL read a batch lookup's 1,000 keys by scanning
        # every schedule of the target (550 ms) instead of probing the primary key (4 ms).
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("ANALYZE workloads, records, schedules, targets")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", required=True, help="SQLAlchemy URL, at head.")
    parser.add_argument("--count", type=int, default=SIDE**3, help="Schedules to seed.")
    parser.add_argument("--side", type=int, default=SIDE, help="Shapes per dimension.")
    parser.add_argument("--template", default="blis.gemm")
    parser.add_argument(
        "--target-key",
        default=None,
        help="A stored target's key (default: this machine's CPU, as `local-cpu` names it).",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if not 1 <= args.count <= args.side**3:
        parser.error(f"--count must be within 1..{args.side**3} (--side cubed)")
    check_at_head(args.database_url)
    engine = make_engine(args.database_url)
    try:
        target = local_cpu_target()
        if args.target_key is not None:
            found = SqlScheduleStore(engine).get_target(args.target_key)
            if found is None:
                parser.error(f"--target-key {args.target_key}: no such stored target")
            target = found
        start = time.monotonic()
        seed(engine, count=args.count, target=target, template=args.template, side=args.side)
        log.info("seeded %d schedules in %.1f s", args.count, time.monotonic() - start)
    finally:
        engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
