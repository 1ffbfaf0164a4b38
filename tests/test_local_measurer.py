"""LocalMeasurer: real sandbox processes that build in parallel, time one at a time, crash, hang,
raise, get cancelled and recover; real blis builds."""

from __future__ import annotations

import os
import stat
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import wait
from itertools import pairwise
from pathlib import Path

import pytest

from tunehub.core import Config, MeasureRequest, MeasureStatus, Workload, local_cpu_target
from tunehub.kernels.base import TimingPolicy
from tunehub.kernels.blis_gemm import BlisGemmTemplate
from tunehub.workers.local import LocalMeasurer
from tunehub.workers.locks import Cancelled, CoreLocks, usable_cores
from tunehub.workers.sandbox import describe_exit

REPO = Path(__file__).resolve().parents[1]
PLUGIN_ENV = {"TUNEHUB_TEMPLATE_MODULES": "tests.faulty_template", "PYTHONPATH": str(REPO)}
TARGET = local_cpu_target()
WORKLOAD = Workload(m=16, n=16, k=16)
HANG_TIMEOUT = 3.0
FAST = TimingPolicy(min_secs=0.01, max_repeats=5)


def faulty(mode: str, version: int = 1) -> MeasureRequest:
    return MeasureRequest(WORKLOAD, TARGET, "test.faulty", version, Config({"mode": mode}))


def piped(i: int) -> MeasureRequest:
    return MeasureRequest(WORKLOAD, TARGET, "test.pipeline", 1, Config({"i": i}))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def measurer(tmp_path: Path) -> Iterator[LocalMeasurer]:
    with LocalMeasurer(
        workdir=tmp_path / "work",
        timeout_secs=HANG_TIMEOUT,
        build_timeout_secs=HANG_TIMEOUT,
        env=PLUGIN_ENV,
        timing=FAST,
    ) as m:
        yield m


def test_failures_become_statuses_and_the_sandbox_recovers(measurer: LocalMeasurer) -> None:
    modes = ["ok", "crash", "ok", "hang", "ok", "raise", "ok"]
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
    crash, hang, raised = results[1], results[3], results[5]
    assert "SIGSEGV" in crash.error and "Segmentation fault" in crash.error  # faulthandler's log
    assert f"{HANG_TIMEOUT:.1f}s" in hang.error and hang.run_secs >= HANG_TIMEOUT
    assert "faulty template was asked to raise" in raised.error and "Traceback" in raised.error
    assert not any(r.repeat_secs for r in (crash, hang, raised))
    assert elapsed < HANG_TIMEOUT + 15  # the hang cost about its timeout, not more
    # A fresh run child after the crash and after the hang; raising does not cost a child.
    pids = [r.environment["pid"] for r in results if r.status is MeasureStatus.OK]
    assert pids[0] != pids[1] != pids[2] and pids[2] == pids[3]
    assert measurer.sandbox_starts == 3
    for ok in (results[0], results[2], results[4], results[6]):
        assert ok.repeat_secs and all(s > 0 for s in ok.repeat_secs)
        # built in a build sandbox, timed in the run sandbox
        assert ok.environment["built_by"] != ok.environment["pid"]


def test_build_failures_are_the_configs_and_cost_only_their_build(
    measurer: LocalMeasurer,
) -> None:
    modes = ["build_fail", "ok", "build_crash", "ok", "build_hang", "ok"]
    results = measurer.measure([faulty(mode) for mode in modes])
    assert [r.status for r in results] == [
        MeasureStatus.BUILD_ERROR,
        MeasureStatus.OK,
        MeasureStatus.BUILD_ERROR,
        MeasureStatus.OK,
        MeasureStatus.TIMEOUT,
        MeasureStatus.OK,
    ]
    assert "deliberately failed" in results[0].error
    assert "SIGSEGV" in results[2].error and "while building" in results[2].error
    assert "build did not finish" in results[4].error
    assert measurer.sandbox_starts == 1  # the run sandbox never noticed


def test_exit_code_and_wrong_answer_and_stdout_noise(measurer: LocalMeasurer) -> None:
    results = measurer.measure([faulty("exit"), faulty("wrong"), faulty("noisy"), faulty("ok")])
    assert results[0].status is MeasureStatus.RUNTIME_ERROR
    assert "exited with status 7" in results[0].error
    assert results[1].status is MeasureStatus.WRONG_ANSWER and results[1].error
    # a template writing to stdout (Python and C level) does not corrupt the channel
    assert results[2].status is MeasureStatus.OK
    assert results[3].status is MeasureStatus.OK
    assert "noise from the template" in (measurer.workdir / "run-sandbox.log").read_text()


def test_unknown_template_and_version_mismatch_are_invalid(measurer: LocalMeasurer) -> None:
    unknown = MeasureRequest(WORKLOAD, TARGET, "no.such", 1, Config({}))
    results = measurer.measure([unknown, faulty("ok", version=9)])
    assert [r.status for r in results] == [MeasureStatus.INVALID, MeasureStatus.INVALID]
    assert "test.faulty" in results[0].error  # the known templates are listed
    assert "v9" in results[1].error


def test_builds_overlap_timing_but_timing_never_overlaps_timing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "intervals.log"
    env = {
        **PLUGIN_ENV,
        "TUNEHUB_TEST_INTERVALS": str(log),
        "TUNEHUB_TEST_BUILD_SECS": "0.3",
        "TUNEHUB_TEST_RUN_SECS": "0.2",
    }
    count = 10
    with LocalMeasurer(workdir=tmp_path / "work", env=env, timing=FAST, timeout_secs=30) as m:
        futures = [m.submit(piped(i)) for i in range(count)]
        wait(futures, timeout=60)
        results = [f.result() for f in futures]
    assert [r.status for r in results] == [MeasureStatus.OK] * count
    lines = [line.split() for line in log.read_text().splitlines()]
    builds = [
        (float(s), float(e), i, cores) for kind, _, s, e, i, cores in lines if kind == "build"
    ]
    runs = [(float(s), float(e), i, cores) for kind, _, s, e, i, cores in lines if kind == "run"]
    # Every config built once and timed once.
    assert sorted(int(i) for *_, i, _ in builds) == list(range(count))
    assert sorted(int(i) for *_, i, _ in runs) == list(range(count))
    runs.sort()
    for (_, end, *_), (start, *_) in pairwise(runs):
        assert end <= start, "two candidates were timed at once"
    overlapping = [
        (b, r)
        for b in builds
        for r in runs
        if b[0] < r[1] and r[0] < b[1]  # intervals meet
    ]
    if len(local_cpu_target_cores()) > 1:
        assert overlapping, "no build ran while a candidate was timed"
        for build, run in overlapping:
            assert not set(build[3].split(",")) & set(run[3].split(",")), (
                f"build on cores {build[3]} while timing on {run[3]}"
            )


def local_cpu_target_cores() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def test_cancel_kills_a_long_candidate_within_two_seconds(measurer: LocalMeasurer) -> None:
    future = measurer.submit(faulty("sleep60"))
    queued = measurer.submit(faulty("ok"))
    deadline = time.monotonic() + 30
    while measurer.sandbox_pid is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # it is timing now
    pid = measurer.sandbox_pid
    assert pid is not None and alive(pid)
    start = time.monotonic()
    measurer.cancel([future, queued])
    result = future.result(timeout=5)
    assert time.monotonic() - start < 2.0
    assert result.status is MeasureStatus.CANCELLED and queued.result().status is (
        MeasureStatus.CANCELLED
    )
    time.sleep(0.2)
    assert not alive(pid)
    # The measurer goes on with a fresh sandbox.
    assert measurer.measure([faulty("ok")])[0].status is MeasureStatus.OK


def test_close_stops_the_children(tmp_path: Path) -> None:
    m = LocalMeasurer(timeout_secs=HANG_TIMEOUT, env=PLUGIN_ENV, timing=FAST)
    workdir = m.workdir
    assert m.measure([faulty("ok")])[0].status is MeasureStatus.OK
    pids = m.sandbox_pids()
    assert pids and all(alive(p) for p in pids)
    m.close()
    assert not any(alive(p) for p in pids)
    assert not workdir.exists()  # it made the workdir, so it removes it
    with pytest.raises(RuntimeError):
        m.submit(faulty("ok"))
    m.close()  # idempotent


def test_close_answers_what_is_in_flight_cancelled(tmp_path: Path) -> None:
    m = LocalMeasurer(timeout_secs=HANG_TIMEOUT, env=PLUGIN_ENV, timing=FAST)
    futures = [m.submit(faulty("sleep60")), m.submit(faulty("ok")), m.submit(faulty("ok"))]
    time.sleep(1.0)
    start = time.monotonic()
    m.close()
    assert time.monotonic() - start < 5
    assert [f.result(timeout=1).status for f in futures] == [MeasureStatus.CANCELLED] * 3


def test_limits_grow_with_the_workload_and_are_capped() -> None:
    blis = BlisGemmTemplate()
    small = MeasureRequest(WORKLOAD, TARGET, "blis.gemm", 2, Config({}))
    big = MeasureRequest(Workload(m=4096, n=4096, k=4096), TARGET, "blis.gemm", 2, Config({}))
    with LocalMeasurer(timing=TimingPolicy(min_secs=0.1)) as m:
        assert 10 < m.limit_for(small, blis) < m.limit_for(big, blis)
    with LocalMeasurer(max_candidate_secs=60) as m:
        assert m.limit_for(big, blis) == 60
    with LocalMeasurer(timeout_secs=5) as m:
        assert m.limit_for(big, blis) == 5


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
    with LocalMeasurer(
        workdir=tmp_path / "work",
        build_dir=build_dir,
        timing=TimingPolicy(min_secs=0.01, max_repeats=10),
    ) as m:
        first = m.measure([request])[0]
        second = m.measure([request])[0]
    assert first.status is MeasureStatus.OK, first.error
    assert second.status is MeasureStatus.OK, second.error
    assert 3 <= len(first.repeat_secs) <= 10
    assert first.environment["build_cached"] is False
    assert second.environment["build_cached"] is True  # same build dir
    assert len(list(build_dir.glob("*.so"))) == 1
    assert first.environment["device"] == "cpu" and "queue_secs" in first.environment


def test_a_plugin_that_fails_to_import_is_a_failed_build(tmp_path: Path) -> None:
    env = {**PLUGIN_ENV, "TUNEHUB_TEMPLATE_MODULES": "tests.faulty_template,tests.no_such_plugin"}
    with LocalMeasurer(workdir=tmp_path, timeout_secs=HANG_TIMEOUT, env=env) as m:
        results = m.measure([faulty("ok"), faulty("ok")])
    for result in results:
        assert result.status is MeasureStatus.RUNTIME_ERROR
        assert "No module named 'tests.no_such_plugin'" in result.error
    assert m.sandbox_starts == 0  # the build sandbox reports it; nothing reached the device


def test_a_sandbox_that_cannot_start_is_a_worker_error(tmp_path: Path) -> None:
    broken = LocalMeasurer(workdir=tmp_path, python=str(tmp_path / "no-such-python"), retries=1)
    try:
        results = broken.measure([faulty("ok"), faulty("ok")])
    finally:
        broken.close()
    assert [r.status for r in results] == [MeasureStatus.WORKER_ERROR] * 2
    assert all("could not start after 2 attempts" in r.error for r in results)


def flaky_python(tmp_path: Path, failures: int) -> Path:
    """A python that fails its first ``failures`` starts, then is the real one."""
    counter = tmp_path / "starts"
    script = tmp_path / "flaky-python"
    script.write_text(
        "#!/bin/sh\n"
        f'n=$(cat "{counter}" 2>/dev/null || echo 0)\n'
        f'echo $((n + 1)) > "{counter}"\n'
        f'if [ "$n" -lt {failures} ]; then echo "no memory for a sandbox" >&2; exit 1; fi\n'
        f'exec "{sys.executable}" "$@"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def test_a_sandbox_that_fails_to_start_once_is_retried(tmp_path: Path) -> None:
    python = flaky_python(tmp_path, failures=1)
    with LocalMeasurer(
        workdir=tmp_path / "w", python=str(python), env=PLUGIN_ENV, builders=1, retries=2
    ) as m:
        result = m.measure([faulty("ok")])[0]
    assert result.status is MeasureStatus.OK, result.error


# --- the machine's failures are not the config's ------------------------------------------------
def machine(mode: str) -> MeasureRequest:
    return MeasureRequest(WORKLOAD, TARGET, "test.machine", 1, Config({"mode": mode}))


@pytest.mark.parametrize("mode", ["enospc", "cc_full"])
def test_a_build_the_disk_refuses_is_a_worker_error_not_a_verdict(
    tmp_path: Path, mode: str
) -> None:
    import tests.faulty_template  # noqa: F401 - registers test.machine here
    from tunehub.workers.sandbox import BuildJob, build_job

    built = build_job(BuildJob(machine(mode), str(tmp_path / "build")))
    assert built.failure is not None and built.failure.status is MeasureStatus.WORKER_ERROR
    assert "the machine cannot build" in built.failure.error
    assert "No space left on device" in built.failure.error


def test_a_build_dir_that_cannot_take_files_is_a_worker_error(tmp_path: Path) -> None:
    import tests.faulty_template  # noqa: F401
    from tunehub.workers.sandbox import BuildJob, build_job

    blocked = tmp_path / "build"
    blocked.write_text("not a directory")
    built = build_job(BuildJob(machine("ok"), str(blocked)))
    assert built.failure is not None and built.failure.status is MeasureStatus.WORKER_ERROR
    assert "is not writable" in built.failure.error
    assert build_job(BuildJob(machine("ok"), str(tmp_path / "fine"))).artifact is not None


def test_a_killed_build_leaves_no_temporary_files(tmp_path: Path) -> None:
    build_dir = tmp_path / "build"
    with LocalMeasurer(
        workdir=tmp_path / "work",
        build_dir=build_dir,
        build_timeout_secs=2.0,
        env=PLUGIN_ENV,
        timing=FAST,
        builders=1,
    ) as m:
        (result,) = m.measure([machine("litter_hang")])
        assert result.status is MeasureStatus.TIMEOUT
        assert [p.name for p in build_dir.iterdir() if ".tmp" in p.name] == []
        tmp = tmp_path / "work" / "tmp-build-0"
        assert tmp.is_dir() and list(tmp.iterdir()) == []
        (ok,) = m.measure([machine("ok")])  # a fresh sandbox serves the next one
        assert ok.status is MeasureStatus.OK


def test_the_build_cache_evicts_the_least_recently_used(tmp_path: Path) -> None:
    from tunehub.kernels.build import build_shared_library, evict_build_cache

    sources = [f"int f{i}(void) {{ return {i}; }}\n" for i in range(3)]
    libs = [build_shared_library(src, build_dir=tmp_path).path for src in sources]
    for i, lib in enumerate(libs):  # built long ago, oldest first
        os.utime(lib, (1000.0 + i, 1000.0 + i))
        os.utime(lib.with_suffix(".c"), (1000.0 + i, 1000.0 + i))
    again = build_shared_library(sources[0], build_dir=tmp_path)  # a cache hit is a use
    assert again.cached and again.path.stat().st_mtime > 2000
    one = libs[0].stat().st_size + libs[0].with_suffix(".c").stat().st_size
    total = sum(p.stat().st_size for p in tmp_path.iterdir())
    freed = evict_build_cache(tmp_path, total - one, keep_secs=60)
    assert freed >= one
    left = {p.name for p in tmp_path.iterdir()}
    assert libs[0].name in left, "the one just used stays"
    assert libs[1].name not in left, "the least recently used went first"
    # Entries used within keep_secs stay, whatever the limit.
    assert evict_build_cache(tmp_path, 1, keep_secs=1e12) == 0


def test_own_cpu_work_never_runs_beside_a_timing_on_every_core(tmp_path: Path) -> None:
    # The tuning loop's own work (a search step, a model fit) holds a core as a build does:
    # a timing on every core waits for it, and it waits while such a timing runs.
    cores = usable_cores()
    if len(cores) < 2:
        pytest.skip("needs two cores")
    locks = CoreLocks(cores[:2], directory=tmp_path)

    def soon(secs: float = 0.2) -> Callable[[], bool]:
        deadline = time.monotonic() + secs
        return lambda: time.monotonic() > deadline

    with locks.timing("cpu", 2), pytest.raises(Cancelled), locks.working(cancelled=soon()):
        pass
    before = os.sched_getaffinity(0)
    with locks.working() as core:
        assert core == cores[1]  # away from where timings start
        assert os.sched_getaffinity(0) == {core}  # this thread only, while it works
        with pytest.raises(Cancelled), locks.timing("cpu", 2, cancelled=soon()):
            pass
        with locks.timing("cpu", 1) as timed:  # a one-core timing goes ahead beside it
            assert timed == (cores[0],)
    assert os.sched_getaffinity(0) == before
    measurer = LocalMeasurer(workdir=tmp_path / "work", cores=cores[:2])
    with measurer, measurer.host_work():  # the measurer's own cores, as a session uses them
        assert len(os.sched_getaffinity(0)) == 1
