"""Compiling generated C into shared libraries, cached by what can change the binary."""

from __future__ import annotations

import contextlib
import errno
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from tunehub.core import sha256_key
from tunehub.core.target import compiler_version as _first_line_of_version
from tunehub.core.target import local_cpu_target

BASE_FLAGS = ("-O3", "-march=native", "-fPIC", "-shared", "-std=gnu11")
COMPILE_TIMEOUT_SECS = 300.0
STDERR_TAIL_CHARS = 2000


class BuildError(RuntimeError):
    """The compiler failed (or could not run); ``stderr`` holds the tail of its output."""

    def __init__(self, message: str, stderr: str = "", flags: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.stderr = stderr
        self.flags = tuple(flags)

    def report(self) -> str:
        return f"{self}\n{self.stderr}".strip()


@dataclass(frozen=True)
class BuiltLibrary:
    """A compiled shared library. ``cached``: it was already in the build dir."""

    path: Path
    key: str
    compile_secs: float
    cached: bool
    compiler: str
    compiler_version: str
    flags: tuple[str, ...]


def compiler() -> str:
    """The C compiler: ``$CC`` if set, else ``cc``."""
    return os.environ.get("CC", "cc")


@lru_cache(maxsize=8)
def compiler_version(cc: str) -> str:
    """``cc --version``'s first line ('' if it cannot run), cached per compiler command."""
    return _first_line_of_version(cc)


def default_build_dir(workdir: Path) -> Path:
    """Where compiled kernels are cached.

    ``$TUNEHUB_BUILD_DIR`` if set (a sandbox's measurer sets it), else ``$TUNEHUB_HOME/build``,
    else ``<workdir>/build``.
    """
    explicit = os.environ.get("TUNEHUB_BUILD_DIR")
    if explicit:
        return Path(explicit)
    home = os.environ.get("TUNEHUB_HOME")
    if home:
        return Path(home).expanduser() / "build"
    return workdir / "build"


# Errors of the machine, not of the code being built: a full or read-only disk, no permission.
ENVIRONMENT_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM, errno.EDQUOT, errno.EIO}
)
ENVIRONMENT_MESSAGES = (
    "No space left on device",
    "Read-only file system",
    "Disk quota exceeded",
    "Permission denied",
    "Input/output error",
)


def environment_error(exc: BaseException) -> OSError | None:
    """The OSError of the machine (ENOSPC, EROFS, EACCES, ...) in ``exc`` or its causes."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in ENVIRONMENT_ERRNOS:
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def mentions_environment(text: str) -> str | None:
    """The first message of the machine's trouble (a full disk, ...) that ``text`` (e.g. a
    compiler's output) holds, or None."""
    return next((m for m in ENVIRONMENT_MESSAGES if m in text), None)


def dir_problem(path: Path, *, min_free_bytes: int = 0) -> str | None:
    """Why ``path`` cannot take new files (it cannot be created or written, or has less than
    ``min_free_bytes`` free), or None when it can. Writes, syncs and removes a small file.

    >>> import tempfile
    >>> dir_problem(Path(tempfile.mkdtemp())) is None
    True
    """
    probe = path / f".tunehub-probe-{os.getpid()}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as f:
            f.write(b"tunehub" * 64)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        return f"{path} is not writable: {exc.strerror or exc}"
    finally:
        with contextlib.suppress(OSError):
            probe.unlink(missing_ok=True)
    if min_free_bytes:
        free = shutil.disk_usage(path).free
        if free < min_free_bytes:
            return (
                f"{path} has {free >> 20} MiB free, less than the {min_free_bytes >> 20} MiB "
                "it needs (TUNEHUB_MIN_FREE_BYTES)"
            )
    return None


TEMP_MARK = ".tmp"
CACHE_SUBDIRS = ("triton",)  # caches of whole directories kept inside the build dir


def remove_temp_files(build_dir: Path, pid: int) -> int:
    """Remove what a killed build process ``pid`` left half-written in ``build_dir`` (its
    ``*.<pid>.tmp*`` files); returns how many."""
    removed = 0
    try:
        leftovers = list(build_dir.glob(f"*.{pid}{TEMP_MARK}*"))
    except OSError:
        return 0
    for path in leftovers:
        with contextlib.suppress(OSError):
            path.unlink()
            removed += 1
    return removed


def _entries(build_dir: Path) -> list[tuple[float, int, Path]]:
    """(last use, bytes, path) of each cache entry: the build dir's files, and each directory
    inside its cache subdirectories (a Triton kernel's)."""
    out: list[tuple[float, int, Path]] = []
    for path in build_dir.iterdir():
        if path.name.startswith(".") or TEMP_MARK in path.name:
            continue
        if path.is_file():
            st = path.stat()
            out.append((st.st_mtime, st.st_size, path))
        elif path.is_dir() and path.name in CACHE_SUBDIRS:
            for entry in path.iterdir():
                newest, size = entry.stat().st_mtime, 0
                for sub in entry.rglob("*") if entry.is_dir() else [entry]:
                    if sub.is_file():
                        st = sub.stat()
                        newest, size = max(newest, st.st_mtime), size + st.st_size
                out.append((newest, size, entry))
    return out


def evict_build_cache(build_dir: Path, max_bytes: int, *, keep_secs: float = 600.0) -> int:
    """Remove the least recently used cache entries until the build dir holds at most
    ``max_bytes``; entries used in the last ``keep_secs`` stay (a candidate may be waiting to
    run them), so the limit can be passed for a while. Returns the bytes freed.

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> for i in range(3):
    ...     _ = (d / f"k{i}.so").write_bytes(b"x" * 100)
    ...     os.utime(d / f"k{i}.so", (1000 + i, 1000 + i))
    >>> evict_build_cache(d, 150), sorted(p.name for p in d.iterdir())
    (200, ['k2.so'])
    """
    if max_bytes <= 0 or not build_dir.is_dir():
        return 0
    try:
        entries = sorted(_entries(build_dir))
    except OSError:
        return 0
    total = sum(size for _, size, _ in entries)
    freed = 0
    now = time.time()
    for used, size, path in entries:
        if total - freed <= max_bytes:
            break
        if now - used < keep_secs:
            continue
        try:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
        except OSError:
            continue
        freed += size
    return freed


def _tail(text: str) -> str:
    return text[-STDERR_TAIL_CHARS:]


def build_shared_library(
    source: str, *, build_dir: Path, flags: Sequence[str] = (), stem: str = "kernel"
) -> BuiltLibrary:
    """Compile ``source`` with ``$CC`` and BASE_FLAGS + ``flags`` into ``build_dir``.

    The file name is the sha256 of (source, compiler, compiler version, flags, host CPU):
    ``-march=native`` makes the binary depend on the host, so a build dir shared between
    hosts never hands one host another's code. Concurrent builders of the same key each
    compile to a private temp file and rename it into place, so readers never see a partial
    library. Raises BuildError with the compiler's stderr tail on failure.
    """
    cc = compiler()
    version = compiler_version(cc)
    all_flags = (*BASE_FLAGS, *flags)
    host = local_cpu_target()
    key = sha256_key(
        {
            "source": source,
            "cc": cc,
            "cc_version": version,
            "flags": list(all_flags),
            "host": {"name": host.name, "arch": list(host.arch), "machine": host.machine},
        }
    )
    build_dir.mkdir(parents=True, exist_ok=True)
    lib = build_dir / f"{stem}-{key[:32]}.so"
    start = time.perf_counter()
    if lib.exists():
        with contextlib.suppress(OSError):  # a use: the cache evicts the least recently used
            os.utime(lib)
        return BuiltLibrary(lib, key, time.perf_counter() - start, True, cc, version, all_flags)
    src = build_dir / f"{stem}-{key[:32]}.c"
    tmp_src = src.with_name(f"{src.name}.{os.getpid()}.tmp.c")
    tmp_lib = lib.with_name(f"{lib.name}.{os.getpid()}.tmp")
    tmp_src.write_text(source)
    cmd = [*shlex.split(cc), *all_flags, "-o", str(tmp_lib), str(tmp_src)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_SECS)
    except FileNotFoundError as exc:
        raise BuildError(f"C compiler {cc!r} not found", str(exc), all_flags) from None
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else ""
        raise BuildError(
            f"{cc} timed out after {COMPILE_TIMEOUT_SECS:.0f}s", _tail(err), all_flags
        ) from None
    finally:
        if not tmp_lib.exists():
            tmp_src.unlink(missing_ok=True)
    if proc.returncode != 0 or not tmp_lib.exists():
        tmp_src.unlink(missing_ok=True)
        tmp_lib.unlink(missing_ok=True)
        out = (proc.stderr or "") + (proc.stdout or "")
        raise BuildError(f"{cc} exited with status {proc.returncode}", _tail(out), all_flags)
    os.replace(tmp_src, src)  # kept beside the library, for reading what was built
    os.replace(tmp_lib, lib)
    return BuiltLibrary(lib, key, time.perf_counter() - start, False, cc, version, all_flags)
