"""``tunehub worker`` and ``tunehub serve --ray``: one-line errors that say the fix."""

from __future__ import annotations

import sys

import pytest
from click.testing import CliRunner

from tests.live import free_port
from tunehub.cli import main


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def test_a_machine_without_ray_is_told_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now raises ImportError
    code, out = run("worker", "--address", "127.0.0.1:6379", "--gpus", "none")
    assert code == 1
    assert "Ray is not installed: pip install 'tunehub[cluster]'" in out


@pytest.mark.parametrize(
    ("gpus", "message"),
    [
        ("x", "--gpus: expected all, none or indices like 0,1; got 'x'"),
        ("0,a", "--gpus: expected all, none or indices like 0,1; got '0,a'"),
        ("99", "--gpus: this machine has no GPU 99"),
    ],
)
def test_bad_gpus_are_refused(gpus: str, message: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # as if this machine had GPU 0 only
    code, out = run("worker", "--address", "127.0.0.1:6379", "--gpus", gpus)
    assert code == 1 and message in out


def test_nothing_to_offer_is_refused() -> None:
    code, out = run("worker", "--address", "127.0.0.1:6379", "--no-cpu", "--gpus", "none")
    assert code == 1 and "nothing to offer" in out


def test_an_unreachable_cluster_is_a_one_line_error() -> None:
    pytest.importorskip("ray", reason="Ray is not installed")
    port = free_port()  # nothing listens there
    code, out = run("worker", "--address", f"127.0.0.1:{port}", "--gpus", "none")
    assert code == 1
    assert f"cannot reach the Ray cluster at 127.0.0.1:{port}" in out
    assert "ray start --head" in out
    code, out = run("worker", "--address", "no-port-here", "--gpus", "none")
    assert code == 1 and "--address: expected host:port" in out


def test_the_default_serve_path_does_not_import_ray() -> None:
    import subprocess

    code = (
        "import sys, tunehub.cli, tunehub.service.app, tunehub.service.runner;"
        "print('ray' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
