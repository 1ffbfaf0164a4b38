"""Who may do what, from where: API keys and scopes, cross-site writes, hosts, headers, CORS,
limits on jobs, queues and request bodies."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from fastapi.testclient import TestClient

from tests.test_api import SHAPE, add_key
from tunehub.core import JobState, Scope, local_cpu_target
from tunehub.db import MemoryScheduleStore
from tunehub.service.app import create_app
from tunehub.service.settings import Settings

BASE = "http://127.0.0.1"


@pytest.fixture
def store() -> MemoryScheduleStore:
    return MemoryScheduleStore()


def make_client(store: MemoryScheduleStore, tmp_path: Any, **settings: Any) -> TestClient:
    app = create_app(Settings(home=tmp_path, run_jobs=False, **settings), store=store)
    return TestClient(app, base_url=BASE)


@pytest.fixture
def anon(store: MemoryScheduleStore, tmp_path: Any) -> Iterator[TestClient]:
    """A client that sends no key."""
    with make_client(store, tmp_path) as c:
        yield c


# Reads sent as a POST (a body too large for a query string): open as GET reads are.
POSTED_READS = {("POST", "/api/v1/schedules/lookup")}


def write_routes(client: TestClient) -> list[tuple[str, str]]:
    """Every route of the API that is not a read, from the OpenAPI document."""
    paths = client.get("/openapi.json").json()["paths"]
    return [
        (method.upper(), path.replace("{job_id}", "1"))
        for path, ops in paths.items()
        for method in ops
        if method not in ("get", "head", "options") and (method.upper(), path) not in POSTED_READS
    ]


def test_the_batch_lookup_is_a_read(store: MemoryScheduleStore, tmp_path: Any) -> None:
    body = {"items": [{"workload": {"m": 8, "n": 8, "k": 8}}]}
    with make_client(store, tmp_path) as client:
        spec = client.get("/openapi.json").json()["paths"]["/api/v1/schedules/lookup"]["post"]
        assert "security" not in spec  # reads declare no key, as the GET routes
        assert client.post("/api/v1/schedules/lookup", json=body).status_code == 200
    with make_client(store, tmp_path, read_requires_key=True) as client:
        response = client.post("/api/v1/schedules/lookup", json=body)
        assert response.status_code == 401
        assert "reading needs an API key with scope read" in response.json()["detail"]
        reader = {"X-API-Key": add_key(store, Scope.READ)}
        answer = client.post("/api/v1/schedules/lookup", json=body, headers=reader)
        assert answer.status_code == 200 and answer.json()["results"][0]["ok"] is True


def test_every_write_without_a_key_is_401_naming_the_header(
    anon: TestClient, store: MemoryScheduleStore
) -> None:
    routes = write_routes(anon)
    assert ("POST", "/api/v1/jobs") in routes and ("POST", "/api/v1/jobs/1/cancel") in routes
    for method, path in routes:
        for body in (None, b"{not json", json.dumps({"workload": SHAPE}).encode()):
            response = anon.request(
                method, path, content=body, headers={"content-type": "application/json"}
            )
            assert response.status_code == 401, (method, path, response.text)
            assert response.headers["www-authenticate"] == "ApiKey"
            detail = response.json()["detail"]
            assert "X-API-Key" in detail and "tunehub keys create --scope write" in detail
    assert store.count_jobs() == 0


@pytest.mark.parametrize(
    ("header", "reason"),
    [
        ({"X-API-Key": "hunter2"}, "does not hold a tunehub API key"),
        ({"X-API-Key": "th_0123abcd_" + "x" * 43}, "unknown API key th_0123abcd"),
        ({"Authorization": "Bearer th_0123abcd_" + "x" * 43}, "unknown API key"),
        ({"X-API-Key": "th_\x00"}, "does not hold"),
    ],
)
def test_a_bad_key_is_401_with_the_reason(
    anon: TestClient, header: dict[str, str], reason: str
) -> None:
    response = anon.post("/api/v1/jobs", json={"workload": SHAPE}, headers=header)
    assert response.status_code == 401 and reason in response.json()["detail"]


def test_scopes_revocation_and_bearer(anon: TestClient, store: MemoryScheduleStore) -> None:
    reader = add_key(store, Scope.READ)
    response = anon.post("/api/v1/jobs", json={"workload": SHAPE}, headers={"X-API-Key": reader})
    assert response.status_code == 403
    assert "has scope read; submitting a job needs write" in response.json()["detail"]
    writer = add_key(store, Scope.WRITE)
    ok = anon.post(
        "/api/v1/jobs", json={"workload": SHAPE}, headers={"Authorization": f"Bearer {writer}"}
    )
    assert ok.status_code == 202, ok.text
    assert ok.json()["submitted_by"] == "test write"
    key = store.list_api_keys()[-1]
    store.revoke_api_key(key.id)
    again = anon.post("/api/v1/jobs", json={"workload": SHAPE}, headers={"X-API-Key": writer})
    assert again.status_code == 401 and "was revoked" in again.json()["detail"]


def test_a_write_key_cancels_only_its_own_jobs_and_admin_any(
    anon: TestClient, store: MemoryScheduleStore
) -> None:
    alice, bob, admin = add_key(store), add_key(store), add_key(store, Scope.ADMIN)
    job = anon.post("/api/v1/jobs", json={"workload": SHAPE}, headers={"X-API-Key": alice})
    job_id = job.json()["id"]
    refused = anon.post(f"/api/v1/jobs/{job_id}/cancel", headers={"X-API-Key": bob})
    assert refused.status_code == 403
    assert "not submitted by key" in refused.json()["detail"]
    assert store.get_job(job_id).state is JobState.QUEUED
    own = anon.post(f"/api/v1/jobs/{job_id}/cancel", headers={"X-API-Key": alice})
    assert own.json()["state"] == "cancelled"
    other = anon.post("/api/v1/jobs", json={"workload": SHAPE}, headers={"X-API-Key": bob})
    by_admin = anon.post(f"/api/v1/jobs/{other.json()['id']}/cancel", headers={"X-API-Key": admin})
    assert by_admin.json()["state"] == "cancelled"


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("application/x-www-form-urlencoded", b"x=1"),
        ("text/plain", b'{"x": 1}'),
        ("multipart/form-data; boundary=b", b"--b--\r\n"),
    ],
)
def test_a_cross_site_form_post_cannot_cancel(
    anon: TestClient, store: MemoryScheduleStore, content_type: str, body: bytes
) -> None:
    """What a page on another site can make a browser send: no key header, its own Origin."""
    job_id = submit_with(anon, add_key(store))
    for origin in ("http://evil.example", "null"):
        response = anon.post(
            f"/api/v1/jobs/{job_id}/cancel",
            content=body,
            headers={"content-type": content_type, "origin": origin},
        )
        assert response.status_code == 403, response.text
        assert "refused" in response.json()["detail"]
    # Without an Origin (an old browser), the missing key stops it.
    plain = anon.post(
        f"/api/v1/jobs/{job_id}/cancel", content=body, headers={"content-type": content_type}
    )
    assert plain.status_code == 401
    fetch_metadata = anon.post(
        f"/api/v1/jobs/{job_id}/cancel", headers={"sec-fetch-site": "cross-site"}
    )
    assert fetch_metadata.status_code == 403
    assert store.get_job(job_id).state is JobState.QUEUED


def submit_with(client: TestClient, key: str) -> int:
    response = client.post("/api/v1/jobs", json={"workload": SHAPE}, headers={"X-API-Key": key})
    assert response.status_code == 202, response.text
    return int(response.json()["id"])


def test_same_origin_writes_pass(anon: TestClient, store: MemoryScheduleStore) -> None:
    key = add_key(store)
    job_id = submit_with(anon, key)
    response = anon.post(
        f"/api/v1/jobs/{job_id}/cancel",
        headers={"X-API-Key": key, "origin": BASE, "sec-fetch-site": "same-origin"},
    )
    assert response.status_code == 200


@pytest.mark.parametrize(
    ("host", "status"),
    [
        ("127.0.0.1:8000", 200),
        ("localhost", 200),
        ("LOCALHOST:1", 200),
        ("[::1]:8000", 200),
        ("evil.example", 400),
        ("127.0.0.1.evil.example", 400),
        ("", 400),
    ],
)
def test_only_allowed_hosts_are_served(anon: TestClient, host: str, status: int) -> None:
    response = anon.get("/api/v1/jobs", headers={"host": host})
    assert response.status_code == status, response.text
    if status == 400:
        assert "TUNEHUB_ALLOWED_HOSTS" in response.json()["detail"]


def test_allowed_hosts_is_a_setting(store: MemoryScheduleStore, tmp_path: Any) -> None:
    with make_client(store, tmp_path, allowed_hosts=["tunehub.internal"]) as client:
        assert client.get("/healthz", headers={"host": "tunehub.internal:80"}).status_code == 200
        assert client.get("/healthz").status_code == 400  # 127.0.0.1 is not listed now
    with make_client(store, tmp_path, allowed_hosts=["*"]) as client:
        assert client.get("/healthz", headers={"host": "anything"}).status_code == 200


def test_the_dashboard_may_not_be_framed_and_loads_only_its_own_code(anon: TestClient) -> None:
    for path in ("/", "/jobs/1", "/static/job.js", "/api/v1/jobs", "/no-such-page"):
        response = anon.get(path)
        assert response.headers["x-frame-options"] == "DENY", path
        assert response.headers["x-content-type-options"] == "nosniff", path
        assert "frame-ancestors 'none'" in response.headers["content-security-policy"], path
    csp = anon.get("/").headers["content-security-policy"]
    assert "script-src 'self'" in csp and "default-src 'none'" in csp
    assert "unsafe-inline" not in csp


def test_no_cors_unless_configured(
    anon: TestClient, store: MemoryScheduleStore, tmp_path: Any
) -> None:
    preflight = {
        "origin": "https://ci.example",
        "access-control-request-method": "POST",
        "access-control-request-headers": "x-api-key",
    }
    response = anon.options("/api/v1/jobs", headers=preflight)
    assert "access-control-allow-origin" not in response.headers
    with make_client(store, tmp_path, cors_origins=["https://ci.example"]) as client:
        allowed = client.options("/api/v1/jobs", headers=preflight)
        assert allowed.headers["access-control-allow-origin"] == "https://ci.example"
        key = add_key(store)
        post = client.post(
            "/api/v1/jobs",
            json={"workload": SHAPE},
            headers={"origin": "https://ci.example", "X-API-Key": key},
        )
        assert post.status_code == 202


def test_closed_reads_need_a_key_of_any_scope(store: MemoryScheduleStore, tmp_path: Any) -> None:
    with make_client(store, tmp_path, read_requires_key=True) as client:
        for path in ("/api/v1/jobs", "/api/v1/targets", "/api/v1/schedules/best?m=1&n=1&k=1"):
            response = client.get(path)
            assert response.status_code == 401, path
            assert "reading needs an API key with scope read" in response.json()["detail"]
        reader = add_key(store, Scope.READ)
        assert client.get("/api/v1/jobs", headers={"X-API-Key": reader}).status_code == 200
        assert client.get("/healthz").status_code == 200  # health stays open
        assert client.get("/").status_code == 200  # the page asks for a key itself


def test_a_seven_day_job_is_refused_naming_the_limit(
    anon: TestClient, store: MemoryScheduleStore
) -> None:
    key = {"X-API-Key": add_key(store)}
    week = {"workload": SHAPE, "budget": {"max_trials": 100, "max_secs": 7 * 86400}}
    response = anon.post("/api/v1/jobs", json=week, headers=key)
    assert response.status_code == 422
    (error,) = response.json()["detail"]
    assert error["loc"] == ["body", "budget", "max_secs"]
    assert "at most 21600 s (6 h)" in error["msg"] and "TUNEHUB_MAX_JOB_SECS" in error["msg"]
    many = {"workload": SHAPE, "budget": {"max_trials": 100_000}}
    (error,) = anon.post("/api/v1/jobs", json=many, headers=key).json()["detail"]
    assert error["loc"] == ["body", "budget", "max_trials"] and "5000" in error["msg"]
    # A key's own limits replace the service's.
    small = {"X-API-Key": add_key(store, max_secs=60.0, max_trials=8)}
    (error,) = anon.post(
        "/api/v1/jobs",
        json={"workload": SHAPE, "budget": {"max_trials": 4, "max_secs": 61}},
        headers=small,
    ).json()["detail"]
    assert "at most 60 s" in error["msg"] and "limit of key test write" in error["msg"]
    assert store.count_jobs() == 0


def test_a_key_may_have_only_so_many_jobs_queued(store: MemoryScheduleStore, tmp_path: Any) -> None:
    with make_client(store, tmp_path, max_queued_jobs_per_key=3) as client:
        key = add_key(store)
        for _ in range(3):
            submit_with(client, key)
        response = client.post("/api/v1/jobs", json={"workload": SHAPE}, headers={"X-API-Key": key})
        assert response.status_code == 429
        assert "this key has 3 jobs queued or running" in response.json()["detail"]
        assert response.headers["retry-after"]
        roomy = add_key(store, max_queued_jobs=5)  # its own limit
        for _ in range(5):
            submit_with(client, roomy)
        other = add_key(store)
        assert submit_with(client, other)  # the limit is per key


def test_request_bodies_are_bounded(store: MemoryScheduleStore, tmp_path: Any) -> None:
    with make_client(store, tmp_path, max_body_bytes=4096) as client:
        key = {"X-API-Key": add_key(store)}
        big = json.dumps({"workload": SHAPE, "pad": "x" * 5000}).encode()
        response = client.post(
            "/api/v1/jobs", content=big, headers={**key, "content-type": "application/json"}
        )
        assert response.status_code == 413
        assert "larger than 4096 bytes" in response.json()["detail"]

        def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it comes
            yield b'{"workload": '
            for _ in range(10):
                yield b" " * 1000

        streamed = client.post(
            "/api/v1/jobs", content=chunks(), headers={**key, "content-type": "application/json"}
        )
        assert streamed.status_code == 413
        assert submit_with(client, key["X-API-Key"])  # an ordinary body still passes


def test_the_job_list_looks_each_target_up_once(
    anon: TestClient, store: MemoryScheduleStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = add_key(store, max_queued_jobs=50)
    for _ in range(30):
        submit_with(anon, key)
    calls: list[str] = []
    original = store.get_target

    def counting(target_key: str) -> Any:
        calls.append(target_key)
        return original(target_key)

    monkeypatch.setattr(store, "get_target", counting)
    page = anon.get("/api/v1/jobs", params={"limit": 50}).json()
    assert len(page["items"]) == 30
    assert calls == [local_cpu_target().target_key]


# --- a real server: bodies that never arrive --------------------------------------------------
@pytest.fixture
def live(tmp_path: Any) -> Iterator[int]:
    store = MemoryScheduleStore()
    settings = Settings(home=tmp_path, run_jobs=False, body_timeout_secs=1.0)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(
        uvicorn.Config(create_app(settings, store=store), log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    try:
        yield int(sock.getsockname()[1])
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def test_a_stalled_body_is_cut_off_after_the_read_timeout(live: int) -> None:
    conns = []
    start = time.monotonic()
    for _ in range(20):
        conn = socket.create_connection(("127.0.0.1", live), timeout=10)
        conn.sendall(
            b"POST /api/v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
            b'\r\nContent-Length: 500\r\n\r\n{"workload": '
        )
        conns.append(conn)
    for conn in conns:
        answer = b""
        while chunk := conn.recv(4096):  # the server closes the connection after answering
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b"did not arrive within 1s" in answer
        conn.close()
    assert time.monotonic() - start < 8
