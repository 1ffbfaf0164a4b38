"""Device fingerprints: the Target a worker measures on, taken on the device itself."""

from __future__ import annotations

from tunehub.core import Target, local_cpu_target

KINDS = ("cpu", "cuda")


def fingerprint(kind: str) -> Target:
    """The Target of this process's device of ``kind``: the host CPU, or the first visible
    GPU (a GPU worker's sandbox sees only its own, through CUDA_VISIBLE_DEVICES)."""
    if kind == "cpu":
        return local_cpu_target()
    if kind == "cuda":
        from tunehub.kernels.cuda_device import cuda_target

        return cuda_target()
    raise ValueError(f"unknown device kind {kind!r}; known: {', '.join(KINDS)}")


def device_lock_name(kind: str) -> str:
    """The name of this process's device in host-wide locks: ``cpu``, or ``cuda-<uuid>``."""
    if kind == "cuda":
        from tunehub.kernels.cuda_device import device_uuid

        return f"cuda-{device_uuid()}"
    return kind
