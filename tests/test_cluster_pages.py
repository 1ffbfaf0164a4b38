"""The dashboard's Workers and Schedules pages as headless Chromium renders them, over a real
uvicorn server on a SQLite store (needs Debian's ``chromium``: scripts/install-browser.sh).
Set ``TUNEHUB_DASHBOARD_SHOTS=<dir>`` to keep the screenshots."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.testclient import TestClient
from starlette.types import Receive, Scope, Send

from tests.test_cluster_views import CPU, GPU, SMALL, SQUARE, TALL, ok_record, seed_schedules
from tests.test_dashboard import (
    assert_clean_text,
    assert_looks_rendered,
    dump_dom,
    needs_chromium,
    screenshot,
)
from tunehub.core import Worker, Workload, utc_now
from tunehub.db import MemoryScheduleStore, ScheduleStore, SqlScheduleStore, upgrade
from tunehub.service.app import create_app
from tunehub.service.settings import Settings

BUSY_CONFIG = {"BLOCK_M": 128, "BLOCK_N": 256, "num_warps": 8}


def register(store: ScheduleStore, worker_id: str, target: Any, age_secs: float = 0.0,
             **info: Any) -> None:  # fmt: skip
    at = utc_now() - timedelta(seconds=age_secs)
    store.register_worker(
        Worker(worker_id=worker_id, target_key=target.target_key, host="box-1", pid=7,
               kind="ray", device="cuda:0" if target is GPU else "cpu", started_at=at,
               heartbeat_at=at, info=info)
    )  # fmt: skip


def test_the_pages_are_served_and_linked_from_every_page(tmp_path: Path) -> None:
    app = create_app(Settings(home=tmp_path, run_jobs=False), store=MemoryScheduleStore())
    with TestClient(app, base_url="http://127.0.0.1") as client:
        for path, script in (("/workers", "workers.js"), ("/schedules", "schedules.js")):
            page = client.get(path)
            assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
            assert f'src="/static/{script}"' in page.text
            assert client.get(f"/static/{script}").status_code == 200
        for path in ("/", "/jobs/1", "/models", "/workers", "/schedules"):
            text = client.get(path).text
            assert 'href="/workers"' in text and 'href="/schedules"' in text, path
        paths = client.get("/openapi.json").json()["paths"]
        assert "/workers" not in paths and "/api/v1/workers" in paths


@contextmanager
def serving(app: Callable[..., Any]) -> Iterator[str]:
    """Serve an ASGI app with uvicorn on a free loopback port; yield its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)
        sock.close()


class AfterFirst:
    """Runs ``then`` once, after the first answer to ``path`` went out; counts the calls."""

    def __init__(self, app: FastAPI, path: str, then: Callable[[], None]) -> None:
        self.app, self.path, self.then = app, path, then
        self.calls = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)
        if scope["type"] == "http" and scope["path"] == self.path:
            self.calls += 1
            if self.calls == 1:
                self.then()


@needs_chromium
def test_workers_page_groups_by_target_and_refreshes_live(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    url = f"sqlite:///{home / 'tunehub.db'}"
    upgrade(url)
    store = SqlScheduleStore(url)
    store.put_target(CPU)
    store.put_target(GPU)
    register(store, "gpu-worker-0001", GPU, state="idle", node="node-a",
             device_name="NVIDIA H100 80GB HBM3")  # fmt: skip
    register(store, "gpu-worker-0002", GPU, state="building", job_id=3, config=BUSY_CONFIG)
    register(store, "cpu-worker-0001", CPU, state="idle")
    register(store, "cpu-worker-lost", CPU, age_secs=300, state="timing", job_id=2)

    def start_timing() -> None:  # what the worker's next heartbeat reports
        register(store, "gpu-worker-0001", GPU, state="timing", job_id=4, config=BUSY_CONFIG,
                 node="node-a", device_name="NVIDIA H100 80GB HBM3")  # fmt: skip

    app = AfterFirst(create_app(Settings(home=home, run_jobs=False)), "/api/v1/workers",
                     start_timing)  # fmt: skip
    try:
        with serving(app) as base:
            dom = dump_dom(base + "/workers", tmp_path / "p1")
            assert app.calls >= 2, "the page polls"
            shot = screenshot(base + "/workers", tmp_path / "p2", "workers", tmp_path)
    finally:
        store.close()

    groups = dom.find_all("section", {"data-target-key": None})
    assert [g.attrs["data-target-key"] for g in groups] == sorted(
        [CPU.target_key, GPU.target_key], key=lambda k: {CPU.target_key: CPU.label,
                                                         GPU.target_key: GPU.label}[k]
    )  # fmt: skip
    by_target = {g.attrs["data-target-key"]: g for g in groups}
    gpu = by_target[GPU.target_key]
    assert GPU.label in gpu.text() and "2 live · 2 busy · 2 in all" in gpu.text()
    rows = {r.attrs["data-worker-id"]: r for r in gpu.find_all("tr", {"data-worker-id": None})}
    assert set(rows) == {"gpu-worker-0001", "gpu-worker-0002"}
    refreshed = rows["gpu-worker-0001"]
    assert refreshed.attrs["data-state"] == "timing", "the second poll's state is shown"
    assert refreshed.find_all("a", {"href": "/jobs/4"})
    assert "BLOCK_M=128 BLOCK_N=256 num_warps=8" in refreshed.text()
    assert "box-1 · node-a" in refreshed.text() and "NVIDIA H100 80GB HBM3" in refreshed.text()
    assert rows["gpu-worker-0002"].attrs["data-state"] == "building"

    cpu = by_target[CPU.target_key]
    cpu_rows = {r.attrs["data-worker-id"]: r for r in cpu.find_all("tr", {"data-worker-id": None})}
    lost = cpu_rows["cpu-worker-lost"]
    assert lost.attrs["data-state"] == "lost" and lost.attrs["class"] == "lost"
    assert not lost.find_all("a"), "a lost worker is on no job"
    assert "1 live · 0 busy · 2 in all" in cpu.text()
    assert "(3 live of 4)" in dom.by_id("workers-count").text()
    assert_clean_text(dom.by_id("workers-groups"))
    # the page, the timing badges (accent) and the lost badge (bad)
    assert_looks_rendered(shot, {"bg": 100_000, "accent-soft": 100, "bad-bg": 50})


@pytest.fixture(scope="module")
def schedules_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Four schedules of seed_schedules and 56 more on CPU (60 in all: two pages of 50)."""
    home = tmp_path_factory.mktemp("schedules-home")
    url = f"sqlite:///{home / 'tunehub.db'}"
    upgrade(url)
    store = SqlScheduleStore(url)
    try:
        store.put_target(CPU)
        store.put_target(GPU)
        seed_schedules(store)
        extra = [Workload(m=64 + i, n=64, k=64) for i in range(56)]
        store.commit_records([ok_record(w, CPU, 1e-4 + i * 1e-6) for i, w in enumerate(extra)])
    finally:
        store.close()
    with serving(create_app(Settings(home=home, run_jobs=False))) as base:
        yield base


def rows_of(dom: Any) -> list[Any]:
    return list(dom.by_id("schedules-table").find_all("tr", {"data-workload-key": None}))


@needs_chromium
def test_schedules_page_sorts_filters_and_pages(
    schedules_site: str, profile_dir: Path, tmp_path: Path
) -> None:
    base = schedules_site
    dom = dump_dom(base + "/schedules?sort=speedup", profile_dir / "a")
    rows = rows_of(dom)
    assert len(rows) == 50, "one page of 50"
    assert "1\u201350 of 60" in dom.by_id("schedules-range").text()
    assert dom.by_id("schedules-pager").attrs.get("hidden") is None
    first, second = rows[0], rows[1]
    assert SQUARE.label in first.text() and CPU.label in first.text()
    assert first.find_all("td", {"class": "num speedup faster"})[0].text() == "\u00d72.00"
    assert SMALL.label in second.text()
    assert second.find_all("td", {"class": "num speedup slower"})[0].text() == "\u00d70.50"
    assert "exact" in first.text() and "not yet" in first.text()
    sorted_by = dom.find_all("button", {"data-sort": "speedup"})[0]
    assert "sorted" in sorted_by.attrs["class"] and sorted_by.attrs["data-order"] == "desc"
    assert_clean_text(dom.by_id("schedules-table"))

    dom = dump_dom(base + "/schedules?sort=speedup&offset=50", profile_dir / "b")
    assert len(rows_of(dom)) == 10 and "51\u201360 of 60" in dom.by_id("schedules-range").text()

    dom = dump_dom(base + "/schedules?dtype=float64", profile_dir / "c")
    cells = [r.find_all("td", {"class": "workload operator"})[0] for r in rows_of(dom)]
    assert [cell.text() for cell in cells] == [TALL.label]
    assert dom.by_id("schedules-pager").attrs.get("hidden") is not None, "one page: no pager"

    dom = dump_dom(base + f"/schedules?target={GPU.target_key}&sort=workload", profile_dir / "d")
    (gpu_row,) = rows_of(dom)
    assert gpu_row.attrs["data-template"] == "triton.gemm"

    dom = dump_dom(base + "/schedules?template=no.such", profile_dir / "e")
    assert "No schedule matches these filters." in dom.by_id("schedules-table").text()

    shot = screenshot(base + "/schedules?sort=speedup", profile_dir / "f", "schedules", tmp_path)
    # the page, the `exact` badges and the green speedups
    assert_looks_rendered(shot, {"bg": 50_000, "ok-bg": 500, "ok": 50})


@pytest.fixture
def profile_dir(tmp_path: Path) -> Path:
    return tmp_path / "profiles"
