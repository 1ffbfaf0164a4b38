"""LocalMeasurer: real sandbox processes that crash, hang, raise and recover; real blis builds."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tunehub.core import (
    Config,
    MeasureRequest,
    MeasureResult,
    MeasureStatus,
    Workload,
    local_cpu_target,
)
from tunehub.kernels.blis_gemm import BlisGemmTemplate
from tunehub.workers.local import LocalMeasurer
from tunehub.workers.sandbox import describe_exit

REPO = Path(__file__).resolve().parents[1]
PLUGIN_ENV = {"TUNEHUB_TEMPLATE_MODULES": "tests.faulty_template", "PYTHONPATH": str(REPO)}
TARGET = local_cpu_target()
WORKLOAD = Workload(m=16, n=16, k=16)
HANG_TIMEOUT = 3.0


def faulty(mode: str, version: int = 1) -> MeasureRequest:
    return MeasureRequest(WORKLOAD, TARGET, "test.faulty", version, Config({"mode": mode}))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def measurer(tmp_path: Path):  # type: ignore[no-untyped-def]
    with LocalMeasurer(
        workdir=tmp_path / "work", timeout_secs=HANG_TIMEOUT, env=PLUGIN_ENV, min_secs=0.0
    ) as m:
        yield m


def test_failures_become_statuses_and_the_sandbox_recovers(measurer: LocalMeasurer) -> None:
    modes = ["ok", "crash", "ok", "hang", "ok", "raise", "ok"]
    seen: list[tuple[str, MeasureStatus]] = []
    measurer.progress = lambda req, res: seen.append((str(req.config["mode"]), res.status))
    start = time.monotonic()
    results = measurer.measure([faulty(mode) for mode in modes])
    elapsed = time.monotonic() - start

    statuses = [r.status for r in results]
    assert statuses == [
        MeasureStatus.OK,
        MeasureStatus.RUNTIME_ERROR,
        MeasureStatus.OK,
        MeasureStatus.TIMEOUT,
        MeasureStatus.OK,
        MeasureStatus.RUNTIME_ERROR,
        MeasureStatus.OK,
    ]
    assert seen == list(zip(modes, statuses, strict=True))
    crash, hang, raised = results[1], results[3], results[5]
    assert "SIGSEGV" in crash.error and "Segmentation fault" in crash.error  # faulthandler's log
    assert f"{HANG_TIMEOUT:.1f}s" in hang.error and hang.run_secs >= HANG_TIMEOUT
    assert "faulty template was asked to raise" in raised.error and "Traceback" in raised.error
    assert not any(r.repeat_secs for r in (crash, hang, raised))
    # the hang cost about its timeout, not more
    assert elapsed < HANG_TIMEOUT + 15
    # a fresh child after the crash and after the hang; raising does not cost a child
    pids = [r.environment["pid"] for r in results if r.status is MeasureStatus.OK]
    assert pids[0] != pids[1] != pids[2] and pids[2] == pids[3]
    assert measurer.sandbox_starts == 3
    for ok in (results[0], results[2], results[4], results[6]):
        assert ok.repeat_secs and all(s > 0 for s in ok.repeat_secs)


def test_exit_code_and_wrong_answer_and_stdout_noise(measurer: LocalMeasurer) -> None:
    results = measurer.measure([faulty("exit"), faulty("wrong"), faulty("noisy"), faulty("ok")])
    assert results[0].status is MeasureStatus.RUNTIME_ERROR
    assert "exited with status 7" in results[0].error
    assert results[1].status is MeasureStatus.WRONG_ANSWER and results[1].error
    # a template writing to stdout (Python and C level) does not corrupt the channel
    assert results[2].status is MeasureStatus.OK
    assert results[3].status is MeasureStatus.OK
    assert "noise from the template" in (measurer.workdir / "sandbox.log").read_text()


def test_unknown_template_and_version_mismatch_are_invalid(measurer: LocalMeasurer) -> None:
    unknown = MeasureRequest(WORKLOAD, TARGET, "no.such", 1, Config({}))
    results = measurer.measure([unknown, faulty("ok", version=9)])
    assert [r.status for r in results] == [MeasureStatus.INVALID, MeasureStatus.INVALID]
    assert "test.faulty" in results[0].error  # the known templates are listed
    assert "v9" in results[1].error


def test_close_stops_the_child(tmp_path: Path) -> None:
    m = LocalMeasurer(timeout_secs=HANG_TIMEOUT, env=PLUGIN_ENV)
    workdir = m.workdir
    assert m.measure([faulty("ok")])[0].status is MeasureStatus.OK
    pid = m.sandbox_pid
    assert pid is not None and alive(pid)
    m.close()
    assert not alive(pid)
    assert not workdir.exists()  # it made the workdir, so it removes it
    with pytest.raises(RuntimeError):
        m.measure([faulty("ok")])
    m.close()  # idempotent


def test_default_timeout_grows_with_the_workload() -> None:
    m = LocalMeasurer(min_secs=0.1, build_allowance_secs=60)
    try:
        small = m.timeout_for(faulty("ok"))
        big = m.timeout_for(
            MeasureRequest(Workload(m=4096, n=4096, k=4096), TARGET, "blis.gemm", 1, Config({}))
        )
        assert 60 < small < big
        assert LocalMeasurer(timeout_secs=5).timeout_for(faulty("ok")) == 5
    finally:
        m.close()


def test_describe_exit() -> None:
    assert describe_exit(-11) == "was killed by SIGSEGV (signal 11)"
    assert describe_exit(-6).startswith("was killed by SIGABRT")
    assert describe_exit(3) == "exited with status 3"


def test_measures_blis_gemm_in_the_sandbox_with_a_shared_build_cache(tmp_path: Path) -> None:
    template = BlisGemmTemplate()
    workload = Workload(m=50, n=70, k=30, epilogue="bias_relu")
    config = template.default_config(workload, TARGET)
    request = MeasureRequest(workload, TARGET, template.name, template.version, config)
    build_dir = tmp_path / "build"
    done: list[MeasureResult] = []
    with LocalMeasurer(
        workdir=tmp_path / "work",
        build_dir=build_dir,
        min_secs=0.01,
        max_repeats=10,
        progress=lambda _, res: done.append(res),
    ) as m:
        first, second = m.measure([request, request])
    assert first.status is MeasureStatus.OK, first.error
    assert second.status is MeasureStatus.OK, second.error
    assert 3 <= len(first.repeat_secs) <= 10
    assert first.environment["build_cached"] is False
    assert second.environment["build_cached"] is True  # same child, same build dir
    assert len(list(build_dir.glob("*.so"))) == 1
    assert done == [first, second]


def test_a_plugin_that_fails_to_import_is_a_runtime_error(tmp_path: Path) -> None:
    env = {**PLUGIN_ENV, "TUNEHUB_TEMPLATE_MODULES": "tests.faulty_template,tests.no_such_plugin"}
    with LocalMeasurer(workdir=tmp_path, timeout_secs=HANG_TIMEOUT, env=env) as m:
        results = m.measure([faulty("ok"), faulty("ok")])
    for result in results:
        assert result.status is MeasureStatus.RUNTIME_ERROR
        assert "No module named 'tests.no_such_plugin'" in result.error
    assert m.sandbox_starts == 1  # the child reports it; it does not die of it


def test_a_sandbox_that_cannot_start_costs_records_not_the_job(tmp_path: Path) -> None:
    broken = LocalMeasurer(workdir=tmp_path, python=str(tmp_path / "no-such-python"))
    try:
        results = broken.measure([faulty("ok"), faulty("ok")])
    finally:
        broken.close()
    assert [r.status for r in results] == [MeasureStatus.RUNTIME_ERROR] * 2
    assert all("could not start the sandbox" in r.error for r in results)
