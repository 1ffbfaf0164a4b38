"""The live state a local runner keeps in ``Worker.info`` (the contract readers such as
``GET /api/v1/workers`` rely on): state, job and config, refreshed with the heartbeat."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import tests.faulty_template  # noqa: F401 - registers the test templates in this process
from tests.test_local_measurer import FAST, PLUGIN_ENV
from tests.test_runner import submit, wait_finished, wait_for
from tunehub.core import JobState, local_cpu_target
from tunehub.db import MemoryScheduleStore
from tunehub.service.runner import JobRunner
from tunehub.workers.local import LocalMeasurer

KEYS = {"state", "job_id", "config", "node", "device_name", "label", "capacity"}


def test_a_local_worker_reports_what_it_is_doing(tmp_path: Path) -> None:
    target = local_cpu_target()
    store = MemoryScheduleStore()
    runner = JobRunner(
        store,
        lambda: LocalMeasurer(workdir=tmp_path / "work", env=PLUGIN_ENV, timing=FAST),
        poll_secs=0.02,
        heartbeat_secs=0.1,
    )
    (idle,) = store.list_workers()
    assert set(idle.info) >= KEYS and idle.info["state"] == "idle" and idle.kind == "local"
    assert idle.info["device_name"] == target.name
    job_id = submit(store, target, trials=12, template="test.pipeline")
    seen: list[dict[str, Any]] = []

    def busy() -> bool:
        (worker,) = store.list_workers()
        if worker.info["state"] in ("building", "timing"):
            seen.append(worker.info)
        return bool(seen)

    runner.start()
    try:
        wait_for(busy, timeout=60)
        assert wait_finished(store, job_id, 60) is JobState.SUCCEEDED
        wait_for(lambda: store.list_workers()[0].info["state"] == "idle", timeout=10)
    finally:
        runner.stop()
    assert seen[0]["job_id"] == job_id and "i" in seen[0]["config"]
