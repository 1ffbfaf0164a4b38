"""Shared pytest fixtures (each part keeps its own in tests/<part>_fixtures.py), and how the
tests share pytest-xdist's workers.

pyproject's addopts run the tests on two workers (``-n 2 --dist loadfile``), which this file
refines:

- a worker takes a module whole, so module-scoped fixtures (a served app, compiled kernels)
  are made once; the modules that start a local Ray cluster share one group, so one worker
  runs them one after another and two clusters never start on this host at once;
- the groups that take longest go first, so that the short ones fill in at the end;
- a test that times real kernels and needs a true time (``SERIAL``, or ``@pytest.mark.serial``)
  has the machine to itself: the other worker waits before its next test until it is done
  (the trust guard would rightly call its timings disturbed beside a busy neighbour);
- each worker has its own host locks (``TUNEHUB_LOCK_DIR``), so its builds and timings are
  not held up by another worker's, or by another test run's on this machine; each has its own
  PostgreSQL database and temporary directories too (tests/db_fixtures.py, ``tmp_path``).

``-n 0`` runs everything in this one process, in the same order.
"""

from __future__ import annotations

import os

# Every test process runs Triton's kernels through its interpreter (CI has no GPU). Triton
# reads the choice when a kernel is defined, its own library's (``tl.cdiv``...) at ``import
# triton`` included, so it is set here, before any test module or fixture imports Triton: set
# by one test module, it held only for what that module's import came before (two modules
# collected in another order failed 8 tests). Tests that need Triton's compiler run it in a
# child process without the variable.
os.environ["TRITON_INTERPRET"] = "1"

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.db_fixtures import *  # noqa: F403
from tunehub.workers.locks import LOCK_DIR_ENV

# Modules that must not run beside each other: one worker takes each group whole.
SHARED_GROUPS = {
    "tests/test_ray_measurer.py": "ray",  # a local Ray cluster (tests/ray_fixtures.py)
    "tests/test_topology.py": "ray",  # `ray start --head` and nodes, as an operator runs them
}
# The groups that take longest (a minute or more of one worker on the 2-core CI machine),
# handed out first; the others keep pytest's order.
FIRST = (
    "ray",
    "tests/test_compiler_benchmarks.py",
    "tests/test_e2e.py::test_job_over_http_becomes_the_schedule_a_lookup_returns",
    "tests/test_e2e.py::test_restart_mid_job_loses_and_duplicates_nothing",
    "tests/test_e2e.py::test_a_served_job_and_tunehub_tune_never_time_at_once",  # both run
    "tests/test_lookup_cache.py",
    "tests/test_search_efficiency.py",
    "tests/test_triton_template.py",
    "tests/test_leases.py",
    "tests/test_triton_kernels.py",
    "tests/test_store.py",
)
# Tests (node id prefixes: a module, or one test of it) that need the machine to themselves.
SERIAL = (
    # Jobs of blis.gemm (and the numpy baseline) that must succeed: beside a busy neighbour
    # the trust guard rightly calls their timings disturbed.
    "tests/test_e2e.py::test_job_over_http_becomes_the_schedule_a_lookup_returns",
    "tests/test_e2e.py::test_restart_mid_job_loses_and_duplicates_nothing",
    "tests/test_compiler_benchmarks.py::test_compile_models_dry_run_tunes_and_looks_up",
    "tests/test_cli.py::test_tune_then_lookup_and_jobs",
    "tests/test_environment.py::test_a_job_on_a_full_disk_fails_with_the_reason",
    # The guard's own test beside a CPU hog of its own.
    "tests/test_trust_cpu.py",
    # When builds and timings run, read from the clock: a neighbour's load shifts them.
    "tests/test_local_measurer.py::test_builds_overlap_timing_but_timing_never_overlaps_timing",
    "tests/test_e2e.py::test_a_served_job_and_tunehub_tune_never_time_at_once",
)


def group_of(nodeid: str) -> str:
    """The group a test runs in: its module's, or the group it shares."""
    module = nodeid.split("::", 1)[0]
    return SHARED_GROUPS.get(module, module)


@pytest.hookimpl(tryfirst=True)  # before -k and -m deselect: all the collected tests
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.nodeid.startswith(SERIAL):
            item.add_marker(pytest.mark.serial)
    if not config.args or config.args == ["tests"]:  # the whole suite: no stale names here
        stale = [s for s in SERIAL if not any(i.nodeid.startswith(s) for i in items)]
        if stale:
            raise pytest.UsageError(f"tests/conftest.py: SERIAL names no test: {stale}")
    # xdist hands the groups out in the order their first tests are collected; a stable sort
    # keeps each group's tests, and the groups not named in FIRST, in pytest's order.
    rank = {group: i for i, group in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(group_of(item.nodeid), len(FIRST)))


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: absent under `-p no:xdist`
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class GroupScheduling(LoadFileScheduling):
        """loadfile, with the SHARED_GROUPS merged (xdist's own loadgroup puts its groups in
        node ids, which pytest 9 no longer lets it change), in collection order."""

        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    config.option.loadscopereorder = False  # keep FIRST's order, not the largest count first
    return GroupScheduling(config, log)


@pytest.fixture(scope="session", autouse=True)
def own_host_locks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """This worker's host lock directory, for its processes and the servers it starts."""
    path = tmp_path_factory.mktemp("host-locks")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(LOCK_DIR_ENV, str(path))
        yield path


def _flock(path: Path, mode: int) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    fcntl.flock(fd, mode)
    return fd


@contextlib.contextmanager
def machine_share(config: pytest.Config, alone: bool) -> Iterator[None]:
    """Hold this run's machine lock shared (a test) or exclusive (a serial test) meanwhile.

    A turnstile ahead of it lets a serial test in as soon as the tests running now end: a
    worker waits there for the machine before each test, so a stream of shared holders cannot
    keep an exclusive one out."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:  # one process: nothing runs beside
        yield
        return
    shared = Path(config.option.basetemp).parent  # the run's; each worker's is under it
    turnstile = _flock(shared / "machine.turnstile", fcntl.LOCK_EX)
    try:
        held = _flock(shared / "machine.lock", fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
    finally:
        os.close(turnstile)  # closing drops the flock
    try:
        yield
    finally:
        os.close(held)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[Any]:
    with machine_share(item.config, alone=item.get_closest_marker("serial") is not None):
        return (yield)
