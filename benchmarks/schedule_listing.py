"""How long one page of the schedule listing (``GET /api/v1/schedules``, the dashboard's
Schedules page) takes with PostgreSQL holding N schedules: the store's ``list_schedules``, one
page of 50 for each sort column, a dtype filter, and a deep page.

    .venv/bin/python benchmarks/schedule_listing.py --schedules 1000000
    .venv/bin/python benchmarks/schedule_listing.py --pg postgresql://postgres@127.0.0.1/postgres

It creates its own database on the server (dropped at the end) and seeds it in SQL with
``generate_series`` (workloads, one ok record and one schedule each, a library baseline for one
workload in three). Each figure is the median of ``--repeats`` calls after one warm-up.
Nothing here is compared against another tool: the figure answers whether a page stays
interactive at that size.
"""

from __future__ import annotations

import argparse
import json
import platform
import secrets
import statistics
import subprocess
import time
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from tunehub.core import local_cpu_target
from tunehub.db import SqlScheduleStore, upgrade
from tunehub.db.engine import normalize_url
from tunehub.db.store import SCHEDULE_SORTS

SEED_SQL = """
INSERT INTO workloads (workload_key, op, m, n, k, dtype, a_layout, b_layout, epilogue,
                       allow_tf32, created_at)
SELECT md5('w' || i) || md5('x' || i), 'matmul', 1 + i % 4096, 1 + (i / 4096) % 4096,
       64 + i % 977, (ARRAY['float32','float64','float16','bfloat16'])[1 + i % 4],
       'row_major', 'row_major', 'none', false, now()
FROM generate_series(1, :n) AS i;

INSERT INTO records (uid, job_id, workload_key, target_key, template, template_version, config,
                     config_key, status, median_secs, repeat_secs, error, compile_secs,
                     verify_secs, run_secs, environment, created_at)
SELECT md5('r' || i), NULL, md5('w' || i) || md5('x' || i), :target, 'blis.gemm', 1,
       '{"MR": 6, "NR": 8}', md5('c') || md5('c'), 'ok', 1e-4 * (1 + random()), '[]', '', 0, 0,
       0, '{}', now() - make_interval(secs => i)
FROM generate_series(1, :n) AS i;

INSERT INTO schedules (workload_key, target_key, template, template_version, config,
                       median_secs, gflops, record_uid, updated_at)
SELECT workload_key, target_key, template, template_version, config, median_secs,
       1.0 / median_secs, uid, created_at
FROM records WHERE template = 'blis.gemm';

INSERT INTO records (uid, job_id, workload_key, target_key, template, template_version, config,
                     config_key, status, median_secs, repeat_secs, error, compile_secs,
                     verify_secs, run_secs, environment, created_at)
SELECT md5('b' || i), NULL, md5('w' || i) || md5('x' || i), :target, 'numpy.matmul', 1,
       '{"threads": 1}', md5('t') || md5('t'), 'ok', 1.5e-4, '[]', '', 0, 0, 0, '{}', now()
FROM generate_series(3, :n, 3) AS i;

INSERT INTO baselines (workload_key, target_key, template, config_key, config, median_secs,
                       record_uid, updated_at)
SELECT workload_key, target_key, template, config_key, config, median_secs, uid, created_at
FROM records WHERE template = 'numpy.matmul';
ANALYZE;
"""


def timed(call: Any, repeats: int) -> float:
    call()  # warm-up: plans cached, pages in shared buffers
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--schedules", type=int, default=1_000_000)
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=None, help="Write the figures as JSON here too.")
    args = parser.parse_args()

    admin_url = normalize_url(args.pg)
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    name = f"tunehub_listing_{secrets.token_hex(4)}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = admin_url.set(database=name).render_as_string(hide_password=False)
    try:
        upgrade(url)
        store = SqlScheduleStore(url)
        target = local_cpu_target()
        store.put_target(target)
        start = time.perf_counter()
        with store.engine.begin() as conn:
            for statement in SEED_SQL.split(";"):
                if statement.strip():
                    conn.execute(
                        text(statement), {"n": args.schedules, "target": target.target_key}
                    )
        seed_secs = time.perf_counter() - start
        print(f"seeded {args.schedules:,} schedules in {seed_secs:.0f} s")

        cases: dict[str, Any] = {
            f"sort={sort} desc": (lambda s=sort: store.list_schedules(sort=s, limit=50))
            for sort in SCHEDULE_SORTS
        }
        cases["sort=speedup asc"] = lambda: store.list_schedules(
            sort="speedup", descending=False, limit=50
        )
        cases["dtype=float64, sort=gflops"] = lambda: store.list_schedules(
            dtype="float64", sort="gflops", limit=50
        )
        cases["offset=500000, sort=updated_at"] = lambda: store.list_schedules(
            limit=50, offset=min(500_000, args.schedules // 2)
        )
        results = {}
        for label, call in cases.items():
            page, total = call()
            assert total > 0 and len(page) == 50, (label, total, len(page))
            secs = timed(call, args.repeats)
            results[label] = secs
            print(f"{label:36s} {secs * 1e3:9.1f} ms  (total {total:,})")
        store.close()
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((ln.split(":", 1)[1].strip() for ln in cpu.splitlines()
                  if ln.startswith("Model name")), platform.processor())  # fmt: skip
    print(f"machine: {model}; PostgreSQL on loopback; median of {args.repeats}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"schedules": args.schedules, "seed_secs": seed_secs, "page_secs": results,
                       "cpu": model, "at": datetime.now(UTC).isoformat()}, f, indent=2)  # fmt: skip


if __name__ == "__main__":
    main()
