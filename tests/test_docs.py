"""Every docstring example in the package runs and gives what it shows."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import tunehub

MODULES = sorted(
    m.name
    for m in pkgutil.walk_packages(tunehub.__path__, "tunehub.")
    if ".migrations" not in m.name and m.name != "tunehub.workers.sandbox"
)


@pytest.mark.parametrize("module", MODULES)
def test_docstring_examples_run(module: str) -> None:
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0


def test_the_examples_cover_the_main_types() -> None:
    attempted = {
        name: doctest.testmod(importlib.import_module(name)).attempted
        for name in ("tunehub.core.workload", "tunehub.core.config", "tunehub.kernels.space")
    }
    assert all(attempted.values()), attempted
