"""Which GPUs this host has, found without importing torch (the service stays GPU-free)."""

from __future__ import annotations

import os
import shutil
import subprocess


def visible_gpus() -> list[int]:
    """Indices of the NVIDIA GPUs this process may use: ``CUDA_VISIBLE_DEVICES`` if it names
    indices, else every GPU ``nvidia-smi -L`` lists; [] without a driver.

    >>> isinstance(visible_gpus(), list)
    True
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        parts = [p.strip() for p in visible.split(",") if p.strip()]
        if all(p.isdigit() for p in parts):
            return [int(p) for p in parts]
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if out.returncode != 0:
        return []
    return [i for i, line in enumerate(out.stdout.splitlines()) if line.startswith("GPU ")]
