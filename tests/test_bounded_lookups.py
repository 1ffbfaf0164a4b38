"""Bounded work per request (issue 27): a keyless batch of 1,000 never-seen shapes with a
trained model answers within its limit and leaves nothing running, and keyless requests have
their own rate limit per client address."""

from __future__ import annotations

import json
import os
import random
import socket
import struct
import time
from pathlib import Path

import httpx
from fastapi.testclient import TestClient

from tests.live import ServedApp
from tests.test_lookup_tiers import trained_store  # noqa: F401 - the module's fixture
from tunehub.db import MemoryScheduleStore
from tunehub.service.app import create_app
from tunehub.service.settings import Settings


def test_a_keyless_batch_of_1000_new_shapes_answers_in_time_and_leaves_no_work(
    trained_store: MemoryScheduleStore,  # noqa: F811
    tmp_path: Path,
) -> None:
    rng = random.Random(27)
    items = [
        {"workload": {"m": rng.randint(8, 8192), "n": rng.randint(8, 8192), "k": 8 + i}}
        for i in range(1000)
    ]
    settings = Settings(home=tmp_path, run_jobs=False, train_models=False)
    with ServedApp(create_app(settings, store=trained_store)) as served:
        with httpx.Client(base_url=served.url, timeout=60) as client:
            # The model loaded and the tuned set read, as a running service has them.
            client.post("/api/v1/schedules/lookup", json={"items": items[:1]})
            start = time.perf_counter()
            answer = client.post("/api/v1/schedules/lookup", json={"items": items[1:]})
            took = time.perf_counter() - start
        assert answer.status_code == 200
        results = answer.json()["results"]
        assert len(results) == 999 and all(r["ok"] for r in results)
        assert {r["schedule"]["source"] for r in results} == {"predicted"}
        # About a second on the quiet 2-core VM; before issue 27, minutes.
        assert took < 10, f"the batch took {took:.1f}s"
        cpu = time.process_time()
        time.sleep(1.0)
        busy = time.process_time() - cpu
    assert busy < 0.3, f"{busy:.2f}s of CPU in the second after the answer"


def test_keyless_requests_are_limited_per_address_with_retry_after(tmp_path: Path) -> None:
    settings = Settings(
        home=tmp_path,
        run_jobs=False,
        train_models=False,
        keyless_requests_per_sec=1,
        keyless_burst=3,
    )
    store = MemoryScheduleStore()
    with TestClient(create_app(settings, store=store), base_url="http://127.0.0.1") as client:
        codes = [client.get("/api/v1/jobs").status_code for _ in range(4)]
        assert codes == [200, 200, 200, 429]
        refused = client.get("/api/v1/jobs")
        assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
        assert "without an API key" in refused.json()["detail"]
        # A request with a key is not counted against the address (here: 401, not 429).
        keyed = client.get("/api/v1/jobs", headers={"X-API-Key": "th_00000000_x"})
        assert keyed.status_code != 429
        assert client.get("/healthz").status_code == 200  # not the API
        time.sleep(1.05)
        assert client.get("/api/v1/jobs").status_code == 200


def cpu_secs(pid: int) -> float:
    """User and system CPU time of process ``pid`` so far (/proc/<pid>/stat), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_keyless_batch_whose_caller_leaves_mid_batch_leaves_no_work_running(
    trained_store: MemoryScheduleStore,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Callers that close their connection while their batches of never-seen shapes are being
    predicted: the route sees it (every 32 items) and stops, so the server's CPU time stops
    growing within about a second, and it still answers. Without the check the batches, several
    seconds of work together, would run on after the callers had gone."""
    settings = Settings(home=tmp_path, run_jobs=False, train_models=False)
    callers, per_batch = 6, 1000
    with ServedApp(create_app(settings, store=trained_store)) as served:  # this process
        pid = os.getpid()
        host, port = served.url.removeprefix("http://").split(":")
        with httpx.Client(base_url=served.url, timeout=60) as client:  # the model loaded
            warm = {"items": [{"workload": {"m": 33, "n": 65, "k": 129}}]}
            assert client.post("/api/v1/schedules/lookup", json=warm).status_code == 200
        sockets = []
        for c in range(callers):  # every shape never seen, none shared between the batches
            items = [
                {"workload": {"m": 8 + c, "n": 8 + i % 997, "k": 4000 + i}}
                for i in range(per_batch)
            ]
            body = json.dumps({"items": items}).encode()
            head = (
                f"POST /api/v1/schedules/lookup HTTP/1.1\r\nHost: {host}:{port}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            )
            sock = socket.create_connection((host, int(port)))
            sock.sendall(head.encode() + body)
            sockets.append(sock)
        started = cpu_secs(pid)
        time.sleep(0.5)
        busy = cpu_secs(pid) - started
        assert busy > 0.05, f"the batches did not keep the server busy ({busy:.2f}s of CPU)"
        for sock in sockets:  # the callers leave, none having read an answer
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
        time.sleep(1.0)  # the route notices within 32 items, the last model call ends
        before = cpu_secs(pid)
        time.sleep(1.0)
        after_leaving = cpu_secs(pid) - before
        with httpx.Client(base_url=served.url, timeout=10) as client:
            assert client.get("/healthz").status_code == 200
            answer = client.post("/api/v1/schedules/lookup", json=warm)
            assert answer.status_code == 200 and answer.json()["results"][0]["ok"]
    assert after_leaving < 0.2, f"{after_leaving:.2f}s of CPU a second after the callers left"
