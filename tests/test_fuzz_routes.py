"""Every route against generated requests, on SQLite and on PostgreSQL: Schemathesis builds
requests from the OpenAPI document (with and without a key) and sends them to the app served by
uvicorn on loopback. Nothing may answer with a server error or outside its schema.

A module of its own: the served app follows the store's change feed on a thread (several
tables read in one transaction), so its server must be gone before other tests truncate the same
PostgreSQL database (a TRUNCATE racing that read deadlocks). Module-scoped fixtures end with
their module."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from tests.db_fixtures import _truncate as truncate
from tests.live import ServedApp
from tests.test_api import add_key
from tests.test_fuzz import EXAMPLES
from tunehub.core import Scope
from tunehub.db import SqlScheduleStore, upgrade
from tunehub.service.app import create_app
from tunehub.service.settings import Settings

schema = schemathesis.openapi.from_dict(create_app(Settings(run_jobs=False)).openapi())


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def live_api(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, dict[str, str]]]:
    """The app served by uvicorn on a loopback port over a SQL store; yields its URL and the
    admin key's header (made in its store)."""
    home = tmp_path_factory.mktemp(f"fuzz-{request.param}")
    if request.param == "sqlite":
        url = f"sqlite:///{home / 'tunehub.db'}"
        upgrade(url)
    else:
        url = request.getfixturevalue("pg_url")
        truncate(request.getfixturevalue("pg_engine"))
    store = SqlScheduleStore(url)
    key = add_key(store, Scope.ADMIN)
    settings_ = Settings(home=home, run_jobs=False, max_queued_jobs_per_key=10_000)
    try:
        with ServedApp(create_app(settings_, store=store)) as served:
            yield served.url, {"X-API-Key": key}
    finally:
        store.close()


COUNTS: dict[str, int] = {}


@pytest.mark.parametrize("with_key", [False, True], ids=["anonymous", "admin-key"])
@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_no_route_answers_with_a_server_error(
    case: Any, live_api: tuple[str, dict[str, str]], with_key: bool
) -> None:
    base_url, key = live_api
    headers = dict(key) if with_key else {}  # else: none, or whatever garbage was generated
    case.call_and_validate(
        base_url=base_url,
        headers=headers,
        checks=[not_a_server_error, response_schema_conformance],
    )
    label = f"{case.method} {case.path} {'key' if with_key else 'anonymous'}"
    COUNTS[label] = COUNTS.get(label, 0) + 1


@pytest.fixture(scope="module", autouse=True)
def report_counts() -> Iterator[None]:
    yield
    if COUNTS and os.environ.get("TUNEHUB_FUZZ_REPORT"):
        print(json.dumps({"requests": sum(COUNTS.values()), **COUNTS}, indent=1))
