"""The GPU fingerprint's driver version: read from the kernel module's version file, as
nvidia-smi reports it, without starting nvidia-smi (a compile that fingerprints its GPU)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tunehub.kernels import cuda_device
from tunehub.kernels.cuda_device import driver_from_proc

OPEN_MODULE = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  "
    "(dvs-builder@U16-I3-B03-4-3)  Sun Jul 27 07:09:06 UTC 2025\n"
    "GCC version:  gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04)\n"
)
PROPRIETARY_MODULE = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC 2024\n"
    "GCC version:  gcc version 12.3.0\n"
)
ARM_MODULE = "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  550.54.15  Release\n"


@pytest.mark.parametrize(
    ("text", "version"),
    [
        (OPEN_MODULE, "580.65.06"),
        (PROPRIETARY_MODULE, "535.183.01"),
        (ARM_MODULE, "550.54.15"),
        ("GCC version:  gcc version 13.3.0\n", ""),
        ("", ""),
    ],
)
def test_the_driver_version_is_read_from_the_module_version_text(text: str, version: str) -> None:
    assert driver_from_proc(text) == version


@pytest.fixture
def uncached() -> Iterator[None]:
    # The version is read once per process: each test reads it afresh, and leaves none behind.
    cuda_device._driver_version.cache_clear()
    yield
    cuda_device._driver_version.cache_clear()


@pytest.mark.usefixtures("uncached")
def test_the_fingerprint_reads_the_file_before_asking_nvidia_smi(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    version_file = tmp_path / "version"
    version_file.write_text(OPEN_MODULE)
    monkeypatch.setattr(cuda_device, "_PROC_VERSION", version_file)
    monkeypatch.setattr(cuda_device.subprocess, "run", _no_subprocess)
    assert cuda_device._driver_version() == "580.65.06"


@pytest.mark.usefixtures("uncached")
def test_without_the_file_nvidia_smi_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[list[str]] = []

    class Done:
        returncode, stdout = 0, "580.65.06\n"

    def run(command: list[str], **_: object) -> Done:
        asked.append(command)
        return Done()

    monkeypatch.setattr(cuda_device, "_PROC_VERSION", tmp_path / "absent")
    monkeypatch.setattr(cuda_device.subprocess, "run", run)
    assert cuda_device._driver_version() == "580.65.06"
    assert asked and asked[0][0] == "nvidia-smi"


def _no_subprocess(*_: object, **__: object) -> None:
    raise AssertionError("nvidia-smi started though the version file answers")
