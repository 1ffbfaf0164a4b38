"""Target: where a kernel runs (a fingerprint of a device and its toolchain) and its keys."""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

from tunehub.core.keys import sha256_key

LOCAL_CPU = "local-cpu"
# ISA flags that change which kernels can be generated; the rest of /proc/cpuinfo is noise.
ISA_FLAGS = (
    "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512dq", "avx512bw", "avx512vl",
    "avx512_bf16", "avx512_fp16", "amx_tile", "neon", "asimd", "sve", "sve2",
)  # fmt: skip


KINDS = ("cpu", "cuda")


@dataclass(frozen=True)
class Target:
    """A device fingerprint, taken by the worker that measures on it.

    One type for CPUs and GPUs. ``cores`` is the CPU's usable cores or the GPU's SM count;
    ``l1d_bytes``/``l2_bytes``/``l3_bytes`` its caches (per core for a CPU's L1 and L2);
    ``memory_bytes`` its memory; ``properties`` what else a template's space depends on (a GPU's
    shared memory per block, registers per SM, clocks); ``toolchain`` every compiler, driver
    and library version that can change a result (cc; driver, CUDA, torch, Triton).

    ``target_key`` covers every field (exact: same device, same toolchain); ``family_key``
    covers kind, device name and arch only, so a schedule tuned under another compiler version
    on the same kind of chip is still found as a family match. Fields at their defaults are
    left out of ``to_dict`` (and so of the key): a CPU fingerprint taken before ``vendor``,
    ``memory_bytes`` and ``properties`` existed keeps its key.

    >>> gpu = Target(kind="cuda", name="NVIDIA H100 80GB HBM3", arch=("sm_90",), cores=132,
    ...              vendor="nvidia", properties={"smem_per_block_bytes": 232448})
    >>> gpu.label
    'cuda NVIDIA H100 80GB HBM3 x132 [sm_90]'
    >>> Target.from_dict(gpu.to_dict()) == gpu
    True
    """

    kind: str  # "cpu" | "cuda"
    name: str  # CPU model name or GPU name
    arch: tuple[str, ...]  # ISA flags (cpu) or ("sm_90",) (cuda)
    cores: int  # usable CPU cores, or streaming multiprocessors
    l1d_bytes: int = 0
    l2_bytes: int = 0
    l3_bytes: int = 0
    machine: str = ""  # platform.machine(): x86_64, aarch64
    toolchain: dict[str, str] = field(default_factory=dict)  # e.g. {"cc": "gcc 12.2.0"}
    vendor: str = ""
    memory_bytes: int = 0
    properties: dict[str, int | str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "kind": self.kind,
            "name": self.name,
            "arch": list(self.arch),
            "cores": self.cores,
            "l1d_bytes": self.l1d_bytes,
            "l2_bytes": self.l2_bytes,
            "l3_bytes": self.l3_bytes,
            "machine": self.machine,
            "toolchain": dict(sorted(self.toolchain.items())),
        }
        if self.vendor:
            data["vendor"] = self.vendor
        if self.memory_bytes:
            data["memory_bytes"] = self.memory_bytes
        if self.properties:
            data["properties"] = dict(sorted(self.properties.items()))
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Target:
        return cls(
            kind=data["kind"],
            name=data["name"],
            arch=tuple(data.get("arch", ())),
            cores=int(data.get("cores", 1)),
            l1d_bytes=int(data.get("l1d_bytes", 0)),
            l2_bytes=int(data.get("l2_bytes", 0)),
            l3_bytes=int(data.get("l3_bytes", 0)),
            machine=data.get("machine", ""),
            toolchain=dict(data.get("toolchain", {})),
            vendor=data.get("vendor", ""),
            memory_bytes=int(data.get("memory_bytes", 0)),
            properties=dict(data.get("properties", {})),
        )

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Target):
            return self.target_key == other.target_key
        return NotImplemented

    def prop(self, name: str, default: int = 0) -> int:
        """An integer property (``properties[name]``), or ``default``."""
        value = self.properties.get(name, default)
        return value if isinstance(value, int) and not isinstance(value, bool) else default

    def __hash__(self) -> int:
        return hash(self.target_key)

    @cached_property
    def target_key(self) -> str:
        return sha256_key(self.to_dict())

    @cached_property
    def family_key(self) -> str:
        return sha256_key({"kind": self.kind, "name": self.name, "arch": list(self.arch)})

    @property
    def label(self) -> str:
        """Readable form, e.g. ``cpu AMD EPYC x2 [avx2 avx512f fma]``."""
        return f"{self.kind} {self.name} x{self.cores} [{' '.join(self.arch)}]"

    @property
    def short_label(self) -> str:
        """Label and key prefix, for messages: ``cpu AMD EPYC x2 [...] (3f2a9c1b0d4e)``."""
        return f"{self.label} ({self.target_key[:12]})"

    def has(self, flag: str) -> bool:
        return flag in self.arch


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _parse_size(text: str) -> int:
    """'32K' -> 32768, '1024K' -> 1048576, '32M' -> 33554432."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)\s*", text)
    if not match:
        return 0
    scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[match.group(2)]
    return int(match.group(1)) * scale


def _cache_sizes() -> dict[int, int]:
    """Per-core data/unified cache size by level, from sysfs."""
    sizes: dict[int, int] = {}
    root = Path("/sys/devices/system/cpu/cpu0/cache")
    for index in sorted(root.glob("index*")):
        if _read(index / "type").strip() == "Instruction":
            continue
        level = _read(index / "level").strip()
        if level.isdigit():
            sizes[int(level)] = _parse_size(_read(index / "size"))
    return sizes


def compiler_version(cc: str | None = None) -> str:
    """First line of ``cc --version`` (e.g. 'cc (Debian 12.2.0-14) 12.2.0'), or '' if absent."""
    cc = cc or os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        return ""
    try:
        out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.splitlines()[0].strip() if out.stdout else ""


@lru_cache(maxsize=1)
def local_cpu_target() -> Target:
    """Fingerprint this machine's CPU: model, ISA flags, usable cores, caches, C compiler."""
    cpuinfo = _read(Path("/proc/cpuinfo"))
    name = ""
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if not name and key in ("model name", "Model", "cpu model"):
            name = value.strip()
        if not flags and key in ("flags", "Features"):
            flags = set(value.split())
    name = name or platform.processor() or platform.machine()
    caches = _cache_sizes()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return Target(
        kind="cpu",
        name=name,
        arch=tuple(f for f in ISA_FLAGS if f in flags),
        cores=cores or 1,
        l1d_bytes=caches.get(1, 0),
        l2_bytes=caches.get(2, 0),
        l3_bytes=caches.get(3, 0),
        machine=platform.machine(),
        toolchain={"cc": compiler_version()},
    )
