"""The shared autotuning results: the store (memory, SQLite, PostgreSQL) and the
``/api/v1/autotune`` routes (writes need a write key, the key document must hash to the key,
the first upload stays)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.test_api import add_key
from tunehub.core import AutotuneResult, InvalidSpec, Scope, sha256_key, utc_now
from tunehub.db import ScheduleStore
from tunehub.service.app import create_app
from tunehub.service.settings import Settings


def key_doc(block: int = 64, kernel: str = "tests.add_kernel") -> dict[str, Any]:
    return {
        "format": 1,
        "kernel": {"name": kernel, "source_sha256": "ab" * 32},
        "key_names": ["n"],
        "key": [4096, "torch.float16"],
        "configs": [
            {"kwargs": {"BLOCK": block}, "num_warps": 4, "num_stages": 3},
            {"kwargs": {"BLOCK": 2 * block}, "num_warps": 8, "num_stages": 3},
        ],
        "target": {"kind": "cuda", "name": "NVIDIA H100 80GB HBM3"},
        "triton": "3.6.0",
    }


def result(doc: dict[str, Any], best: int = 1, **changes: Any) -> AutotuneResult:
    fields: dict[str, Any] = {
        "cache_key": sha256_key(doc),
        "key_doc": doc,
        "best_index": best,
        "timings_ms": ((0.5, 0.4, 0.6), (0.25, 0.2, 0.3)),
        "created_at": utc_now(),
    }
    fields.update(changes)
    return AutotuneResult(**fields)


def test_the_store_keeps_the_first_result_of_a_key(store: ScheduleStore) -> None:
    doc = key_doc()
    assert store.get_autotune(sha256_key(doc)) is None
    first, created = store.put_autotune(result(doc, best=1))
    assert created and first.best_config == doc["configs"][1]
    again, created = store.put_autotune(result(doc, best=0, timings_ms=((0.1,), (0.2,))))
    assert not created and again.best_index == 1
    got = store.get_autotune(sha256_key(doc))
    assert got is not None
    assert (got.best_index, got.timings_ms, got.key_doc) == (1, first.timings_ms, doc)
    assert got.kernel == "tests.add_kernel" and got.created_at.tzinfo is not None
    other = key_doc(block=32)
    assert store.put_autotune(result(other, timings_ms=(None, (1.0,))))[1]
    stored = store.get_autotune(sha256_key(other))
    assert stored is not None and stored.timings_ms == (None, (1.0,))


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"cache_key": "0" * 64}, "key_doc"),
        ({"cache_key": "XYZ"}, "cache_key"),
        ({"best_index": 2}, "best_index"),
        ({"timings_ms": ((1.0,),)}, "timings_ms"),
        ({"timings_ms": ((1.0,), None)}, "timings_ms"),  # the winner must have been timed
    ],
)
def test_a_malformed_result_names_its_field(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidSpec) as info:
        result(key_doc(), **changes)
    assert info.value.field == field


@pytest.fixture
def app_client(tmp_path: Path) -> Iterator[tuple[TestClient, str]]:
    from tunehub.db import MemoryScheduleStore

    store = MemoryScheduleStore()
    app = create_app(Settings(home=tmp_path, run_jobs=False, train_models=False), store=store)
    with TestClient(app, base_url="http://127.0.0.1") as client:
        yield client, add_key(store)


def body(doc: dict[str, Any], best: int = 1) -> dict[str, Any]:
    return {"key_doc": doc, "best_index": best, "timings_ms": [[0.5, 0.4, 0.6], [0.25, 0.2, 0.3]]}


def test_upload_needs_a_write_key_and_reads_are_open(app_client: tuple[TestClient, str]) -> None:
    client, key = app_client
    doc = key_doc()
    url = f"/api/v1/autotune/{sha256_key(doc)}"
    assert client.get(url).status_code == 404
    refused = client.put(url, json=body(doc))
    assert refused.status_code == 401 and "write" in refused.json()["detail"]
    created = client.put(url, json=body(doc), headers={"X-API-Key": key})
    assert created.status_code == 201
    assert created.json()["best_config"] == doc["configs"][1]
    kept = client.put(url, json=body(doc, best=0), headers={"X-API-Key": key})
    assert kept.status_code == 200 and kept.json()["best_index"] == 1
    got = client.get(url)
    assert got.status_code == 200
    assert got.json()["key_doc"] == doc and got.json()["kernel"] == "tests.add_kernel"


def test_upload_with_a_read_key_is_forbidden(tmp_path: Path) -> None:
    from tunehub.db import MemoryScheduleStore

    store = MemoryScheduleStore()
    app = create_app(Settings(home=tmp_path, run_jobs=False, train_models=False), store=store)
    doc = key_doc()
    with TestClient(app, base_url="http://127.0.0.1") as client:
        answer = client.put(
            f"/api/v1/autotune/{sha256_key(doc)}",
            json=body(doc),
            headers={"X-API-Key": add_key(store, Scope.READ)},
        )
    assert answer.status_code == 403


@pytest.mark.parametrize(
    ("path_key", "payload", "loc"),
    [
        (sha256_key(key_doc(block=16)), body(key_doc()), ["body", "key_doc"]),
        ("not-a-sha", body(key_doc()), ["path", "cache_key"]),
        (sha256_key(key_doc()), body(key_doc(), best=5), ["body", "best_index"]),
        (
            sha256_key(key_doc()),
            {**body(key_doc()), "timings_ms": [[-1.0], [1.0]]},
            ["body", "timings_ms", 0, 0],
        ),
        (sha256_key(key_doc()), {**body(key_doc()), "extra": 1}, ["body", "extra"]),
        (
            sha256_key({**key_doc(), "configs": []}),
            {**body({**key_doc(), "configs": []}), "best_index": 0, "timings_ms": []},
            ["body", "key_doc", "configs"],
        ),
    ],
)
def test_bad_uploads_are_422_naming_the_field(
    app_client: tuple[TestClient, str], path_key: str, payload: dict[str, Any], loc: list[Any]
) -> None:
    client, key = app_client
    answer = client.put(f"/api/v1/autotune/{path_key}", json=payload, headers={"X-API-Key": key})
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"][0]["loc"] == loc


def deep(levels: int) -> list[Any]:
    top: list[Any] = []
    inner = top
    for _ in range(levels - 1):
        inner.append([])
        inner = inner[0]
    return top


@pytest.mark.parametrize(
    ("doc", "loc"),
    [
        ({**key_doc(), "extra": deep(900)}, ["body", "key_doc", "extra"]),
        (key_doc(kernel="tests.add\x00kernel"), ["body", "key_doc", "kernel", "name"]),
        ({**key_doc(), "key": [4096, "torch.float16\x00"]}, ["body", "key_doc", "key", "1"]),
        ({**key_doc(), "note": "x" * (600 * 1024)}, ["body", "key_doc"]),
    ],
    ids=["900-deep", "nul-in-kernel-name", "nul-in-key", "too-large"],
)
def test_an_upload_past_the_document_limits_is_422_and_its_key_stays_usable(
    store: ScheduleStore, tmp_path: Path, doc: dict[str, Any], loc: list[Any]
) -> None:
    """Checked before it is stored, on every store (PostgreSQL refuses a NUL; a deep document
    is stored but could never be answered), so a GET of the key says 404, never 500."""
    settings = Settings(home=tmp_path, run_jobs=False, train_models=False, max_body_bytes=2 << 20)
    app = create_app(settings, store=store)
    with TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False) as client:
        url = f"/api/v1/autotune/{sha256_key(doc)}"
        answer = client.put(url, json=body(doc), headers={"X-API-Key": add_key(store)})
        assert answer.status_code == 422, answer.text
        assert answer.json()["detail"][0]["loc"] == loc
        assert client.get(url).status_code == 404
        good = key_doc(kernel="tests.after")
        assert client.put(f"/api/v1/autotune/{sha256_key(good)}", json=body(good),
                          headers={"X-API-Key": add_key(store)}).status_code == 201  # fmt: skip


def test_a_result_stored_before_the_limits_is_answered_as_absent(tmp_path: Path) -> None:
    from sqlalchemy.orm import Session

    from tunehub.db import SqlScheduleStore, upgrade
    from tunehub.db.tables import AutotuneRow

    url = f"sqlite:///{tmp_path / 'tunehub.db'}"
    upgrade(url)
    store = SqlScheduleStore(url)
    doc = {**key_doc(), "extra": deep(900)}
    with Session(store.engine) as session:  # as an older tunehub stored it
        session.add(AutotuneRow(cache_key=sha256_key(doc), kernel="k", key_doc=doc, best_index=1,
                                timings_ms=[[1.0], [1.0]], created_at=utc_now()))  # fmt: skip
        session.commit()
    assert store.get_autotune(sha256_key(doc)) is None
    store.close()
