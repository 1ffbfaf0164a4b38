"""Hostile strings (NUL bytes, lone surrogates, control characters, very long) into every
string the API takes, on SQLite and on PostgreSQL. Nothing may answer with a server error;
hostile names are a 422. (Generated requests to every route: tests/test_fuzz_routes.py.)"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.test_api import SHAPE, add_key
from tunehub.core import Scope
from tunehub.db import SqlScheduleStore
from tunehub.service.app import create_app
from tunehub.service.settings import Settings

# Bounded, so the suite stays a few minutes; raise it with TUNEHUB_FUZZ_EXAMPLES.
EXAMPLES = int(os.environ.get("TUNEHUB_FUZZ_EXAMPLES", "25"))


# --- hostile strings into every string the API takes --------------------------------------------
HOSTILE = st.one_of(
    st.sampled_from(
        [
            "\x00",
            "local-cpu\x00",
            "blis.gemm\x00; DROP TABLE jobs; --",
            "\ud800",
            "x\udfff",
            "\u202e\u0000\ufeff",
            "\x1b[31m",
            "%00",
            "../../etc/passwd",
            "' OR '1'='1",
            "\n\r\t",
            "\U0001d518\U0001d52b\U0001d526",  # letters outside the BMP
            "a" * 70,
            "a" * 100_000,
        ]
    ),
    st.text(st.characters(codec=None, exclude_categories=()), min_size=1, max_size=40),
)


def _nasty(text: str) -> bool:
    return any(not c.isprintable() or 0xD800 <= ord(c) <= 0xDFFF for c in text)


@pytest.fixture
def api(sql_url: str, tmp_path: Any) -> Iterator[tuple[Any, dict[str, str]]]:
    from fastapi.testclient import TestClient

    store = SqlScheduleStore(sql_url)
    key = {"X-API-Key": add_key(store, Scope.ADMIN)}
    app = create_app(
        Settings(home=tmp_path, run_jobs=False, max_queued_jobs_per_key=100_000), store=store
    )
    with TestClient(app, base_url="http://127.0.0.1") as client:
        yield client, key
    store.close()


def _raw_json(body: dict[str, Any]) -> bytes:
    # ensure_ascii: a lone surrogate travels as a \ud800 escape, as a hostile client sends it
    return json.dumps(body, ensure_ascii=True).encode()


@settings(max_examples=EXAMPLES * 2, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(
    field=st.sampled_from(
        [
            "target",
            "template",
            "strategy",
            "workload.dtype",
            "workload.op",
            "workload.epilogue",
            "extra-key",
        ]
    ),
    value=HOSTILE,
)
def test_hostile_strings_in_a_job_are_422_on_every_database(
    api: tuple[Any, dict[str, str]], field: str, value: str
) -> None:
    client, key = api
    body: dict[str, Any] = {"workload": dict(SHAPE), "budget": {"max_trials": 2}}
    if field == "extra-key":
        body[value] = 1
    elif field.startswith("workload."):
        body["workload"][field.split(".")[1]] = value
    else:
        body[field] = value
    response = client.post(
        "/api/v1/jobs", content=_raw_json(body), headers={**key, "content-type": "application/json"}
    )
    assert response.status_code in (413, 422), (field, value[:50], response.text[:300])
    if response.status_code == 422:
        response.json()  # the answer itself is valid JSON, whatever was echoed


@settings(max_examples=EXAMPLES * 2, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(
    where=st.sampled_from(
        [
            "lookup.target",
            "lookup.template",
            "lookup.dtype",
            "target_key",
            "jobs.state",
            "job_id",
            "cancel.job_id",
            "records.after",
        ]
    ),
    value=HOSTILE,
)
def test_hostile_strings_in_paths_and_queries_never_break_a_route(
    api: tuple[Any, dict[str, str]], where: str, value: str
) -> None:
    client, key = api
    # What a client can put on the wire: UTF-8, percent-encoded; lone surrogates become their
    # (invalid) UTF-8 bytes, which the server must survive too.
    raw = value.encode("utf-8", "surrogatepass")
    quoted = "".join(f"%{b:02X}" for b in raw[:3000])
    shape = "m=8&n=8&k=8"
    url = {
        "lookup.target": f"/api/v1/schedules/best?{shape}&target={quoted}",
        "lookup.template": f"/api/v1/schedules/best?{shape}&template={quoted}",
        "lookup.dtype": f"/api/v1/schedules/best?{shape}&dtype={quoted}",
        "target_key": f"/api/v1/targets/{quoted}",
        "jobs.state": f"/api/v1/jobs?state={quoted}",
        "job_id": f"/api/v1/jobs/{quoted}",
        "cancel.job_id": f"/api/v1/jobs/{quoted}/cancel",
        "records.after": f"/api/v1/jobs/1/records?after={quoted}",
    }[where]
    method = "POST" if where.startswith("cancel") else "GET"
    response = client.request(method, url, headers=key)
    assert response.status_code < 500, (where, value[:50], response.text[:300])
    if (where.startswith("lookup.") or where == "target_key") and _nasty(value):
        # (a "/" in a path segment names another path: no such route)
        expected = (422, 404) if where == "target_key" and "/" in value else (422,)
        assert response.status_code in expected, (where, value[:50], response.text[:300])


@settings(max_examples=EXAMPLES * 2, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(
    field=st.sampled_from(["target", "template", "workload.dtype", "workload.op", "extra-key"]),
    value=HOSTILE,
)
def test_hostile_strings_in_a_batch_lookup_item_are_that_items_422(
    api: tuple[Any, dict[str, str]], field: str, value: str
) -> None:
    client, key = api
    item: dict[str, Any] = {"workload": {"m": 8, "n": 8, "k": 8}}
    if field == "extra-key":
        item[value] = 1
    elif field.startswith("workload."):
        item["workload"][field.split(".")[1]] = value
    else:
        item[field] = value
    good = {"workload": {"m": 8, "n": 8, "k": 8}}
    body = {"items": [good, item, good], "tune": True}
    response = client.post(
        "/api/v1/schedules/lookup",
        content=_raw_json(body),
        headers={**key, "content-type": "application/json"},
    )
    if response.status_code == 413:  # a 100,000-character key
        return
    assert response.status_code == 200, (field, value[:50], response.text[:300])
    first, bad, last = response.json()["results"]
    assert first["ok"] and last["ok"]
    if field == "template" and not _nasty(value) and len(value) <= 64:
        assert bad["status"] in (404, 422), bad  # a well-formed name no template has
    else:
        assert (bad["ok"], bad["status"]) == (False, 422), (field, value[:50], bad)
