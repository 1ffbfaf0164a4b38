"""The CUDA GPU fingerprint and the facts GPU templates read from it (imports torch)."""

from __future__ import annotations

import platform
import re
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Any

from tunehub.core import Target

# The loaded kernel module's version, which nvidia-smi's driver_version reports (the two must
# match for nvidia-smi to run at all), e.g. "NVRM version: NVIDIA UNIX Open Kernel Module for
# x86_64  580.65.06  Release Build ..." or "... x86_64 Kernel Module  535.183.01  Sun May ...".
_PROC_VERSION = Path("/proc/driver/nvidia/version")
_NVRM = re.compile(r"^NVRM version:.*?Kernel Module\b.*?\s(\d+\.\d+(?:\.\d+)*)\s", re.MULTILINE)


def driver_from_proc(text: str) -> str:
    """The driver version in ``/proc/driver/nvidia/version``'s text ("" where none is)."""
    found = _NVRM.search(text)
    return found.group(1) if found else ""


@lru_cache(maxsize=1)
def _driver_version() -> str:
    # The file first: nvidia-smi costs a compile that looks a GPU's target up about 0.2 s.
    try:
        driver = driver_from_proc(_PROC_VERSION.read_text())
    except OSError:
        driver = ""
    if driver:
        return driver
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout else ""


def cuda_target(index: int = 0) -> Target:
    """Fingerprint visible GPU ``index``: name, compute capability, SMs, memory, L2, shared
    memory per block, registers, and the driver, CUDA, torch and Triton versions."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA GPU is visible to this process")
    props = torch.cuda.get_device_properties(index)
    properties: dict[str, Any] = {
        "compute_capability": props.major * 10 + props.minor,
        "smem_per_block_bytes": int(
            getattr(props, "shared_memory_per_block_optin", 0)
            or getattr(props, "shared_memory_per_block", 0)
        ),
        "smem_per_sm_bytes": int(getattr(props, "shared_memory_per_multiprocessor", 0)),
        "regs_per_sm": int(getattr(props, "regs_per_multiprocessor", 0)),
        "max_threads_per_sm": int(getattr(props, "max_threads_per_multi_processor", 0)),
        "warp_size": int(getattr(props, "warp_size", 32)),
    }
    toolchain = {"torch": torch.__version__, "cuda": str(torch.version.cuda or "")}
    driver = _driver_version()
    if driver:
        toolchain["driver"] = driver
    try:
        import triton

        toolchain["triton"] = triton.__version__
    except ImportError:
        pass
    return Target(
        kind="cuda",
        name=props.name,
        arch=(f"sm_{props.major}{props.minor}",),
        cores=int(props.multi_processor_count),
        l2_bytes=int(getattr(props, "L2_cache_size", 0)),
        machine=platform.machine(),
        toolchain=toolchain,
        vendor="nvidia",
        memory_bytes=int(props.total_memory),
        properties={k: v for k, v in properties.items() if v},
    )


def device_uuid(index: int = 0) -> str:
    """A name for the GPU that is the same in every process of the host (its UUID), whatever
    CUDA_VISIBLE_DEVICES says: the host-wide lock is keyed by it."""
    import torch

    props = torch.cuda.get_device_properties(index)
    uuid = getattr(props, "uuid", None)
    return str(uuid) if uuid is not None else f"{props.pci_bus_id}"  # type: ignore[attr-defined]
