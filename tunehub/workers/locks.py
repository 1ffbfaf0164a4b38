"""Host-wide locks: one process times a device at a time, and nothing builds on timed cores.

Every tunehub process on a host (``tunehub serve``, ``tunehub tune``, a benchmark) takes the
same lock files, in ``$TUNEHUB_LOCK_DIR`` (default ``/tmp/tunehub-locks``), so two of them
never time at once on one device, and a build never runs on a core being timed:

- ``device-<name>.lock``: held while a candidate is checked and timed on that device (``cpu``
  for the host's CPU, ``cuda-<uuid>`` for a GPU);
- ``core-<n>.lock``: held for each CPU core a timing occupies, by a build for the one core it
  is pinned to, and by tunehub's own CPU work (a search step, a model refit or training: see
  ``CoreLocks.working``) for the one core its thread is pinned to meanwhile. So a timing that
  uses every core has the machine to itself as far as tunehub controls it: no build, no other
  timing and no model work of any tunehub process here runs beside it.

They are ``flock`` locks: the kernel drops them when their holder dies, so a killed process
never leaves a device locked. Locks are taken device first, then cores in ascending order, so
two holders never wait on each other in a cycle.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

LOCK_DIR_ENV = "TUNEHUB_LOCK_DIR"
DEFAULT_LOCK_DIR = "/tmp/tunehub-locks"
POLL_SECS = 0.02


class Cancelled(Exception):
    """Waiting for a lock was given up because the caller was cancelled."""


def lock_dir() -> Path:
    """The host's lock directory (created world-writable, sticky, like /tmp)."""
    path = Path(os.environ.get(LOCK_DIR_ENV) or DEFAULT_LOCK_DIR)
    if not path.is_dir():
        path.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            path.chmod(0o1777)
    return path


class HostLock:
    """An exclusive lock on one file of the lock directory, shared by every process here.

    Not re-entrant. ``acquire`` polls, so a waiter can give up when ``cancelled()`` turns true.
    """

    def __init__(self, name: str, directory: Path | None = None) -> None:
        self.name = name
        self.path = (directory or lock_dir()) / f"{name}.lock"
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def try_acquire(self) -> bool:
        if self._fd is not None:
            raise RuntimeError(f"lock {self.name} is already held by this object")
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                return False
            raise
        self._fd = fd
        return True

    def acquire(self, *, cancelled: Callable[[], bool] = lambda: False) -> None:
        """Wait for the lock; Cancelled if ``cancelled()`` becomes true first."""
        while not self.try_acquire():
            if cancelled():
                raise Cancelled(f"gave up waiting for {self.name}")
            time.sleep(POLL_SECS)

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def device_lock_name(device: str) -> str:
    """``cpu`` -> ``device-cpu``; ``cuda:GPU-8f2…`` -> ``device-cuda-GPU-8f2…``."""
    return "device-" + "".join(c if c.isalnum() or c in "-_" else "-" for c in device)


def usable_cores() -> tuple[int, ...]:
    """The CPU cores this process may run on, ascending."""
    if hasattr(os, "sched_getaffinity"):
        return tuple(sorted(os.sched_getaffinity(0)))
    return tuple(range(os.cpu_count() or 1))


class CoreLocks:
    """The per-core locks of a set of cores, taken host-wide."""

    def __init__(self, cores: Sequence[int] | None = None, directory: Path | None = None) -> None:
        self.cores = tuple(cores) if cores is not None else usable_cores()
        self._dir = directory
        self._guard = threading.Lock()

    def _lock(self, core: int) -> HostLock:
        return HostLock(f"core-{core}", self._dir)

    @contextlib.contextmanager
    def timing(
        self, device: str, count: int, *, cancelled: Callable[[], bool] = lambda: False
    ) -> Iterator[tuple[int, ...]]:
        """Hold ``device``'s lock and ``count`` cores (the lowest-numbered) while timing.

        Yields the cores, which the timed process should be pinned to. Waits for builds on
        those cores to finish, and for any other process timing the device.
        """
        count = max(1, min(count, len(self.cores)))
        held: list[HostLock] = []
        device_lock = HostLock(device_lock_name(device), self._dir)
        device_lock.acquire(cancelled=cancelled)
        held.append(device_lock)
        try:
            chosen = self.cores[:count]
            for core in chosen:
                lock = self._lock(core)
                lock.acquire(cancelled=cancelled)
                held.append(lock)
            yield chosen
        finally:
            for lock in reversed(held):
                lock.release()

    @contextlib.contextmanager
    def working(self, *, cancelled: Callable[[], bool] = lambda: False) -> Iterator[int]:
        """Hold one free core (as ``building``) and pin the calling thread to it while this
        process computes something of its own (a search step, a model fit); its affinity is
        put back after. A timing that needs that core waits for the work, and the work waits
        while a timing holds every core. Yields the core."""
        with self.building(cancelled=cancelled) as core:
            saved = _thread_affinity()
            pinned = saved is not None and _set_thread_affinity({core})
            try:
                yield core
            finally:
                if pinned and saved is not None:
                    _set_thread_affinity(saved)

    @contextlib.contextmanager
    def building(self, *, cancelled: Callable[[], bool] = lambda: False) -> Iterator[int]:
        """Hold one free core for a build (the highest-numbered free one, away from where
        timings start); waits while every core is taken. Yields the core."""
        while True:
            with self._guard:
                for core in reversed(self.cores):
                    lock = self._lock(core)
                    if lock.try_acquire():
                        break
                else:
                    lock = None
            if lock is not None:
                try:
                    yield core
                finally:
                    lock.release()
                return
            if cancelled():
                raise Cancelled("gave up waiting for a core to build on")
            time.sleep(POLL_SECS)


def _thread_affinity() -> set[int] | None:
    """The calling thread's CPUs (Linux: affinity 0 is the calling thread's), or None."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    try:
        return set(os.sched_getaffinity(0))
    except OSError:
        return None


def _set_thread_affinity(cores: set[int]) -> bool:
    try:
        os.sched_setaffinity(0, cores)
    except OSError:
        return False
    return True


@contextlib.contextmanager
def cpu_work(*, cancelled: Callable[[], bool] = lambda: False) -> Iterator[int]:
    """``CoreLocks().working``: hold a core of this host for this thread's own CPU work (model
    training, a search step), so no tunehub timing that needs that core runs meanwhile."""
    with CoreLocks().working(cancelled=cancelled) as core:
        yield core
