"""The command line's arguments as click parses them: negative numbers, positional names."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from tunehub.cli import main


def run(home: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), env={"TUNEHUB_HOME": str(home)})
    return result.exit_code, result.output


@pytest.mark.parametrize("command", ["tune", "lookup"])
@pytest.mark.parametrize(
    ("shape", "named"),
    [
        (("-256", "256", "256"), "'M': must be >= 1, got -256"),
        (("256", "-2", "256"), "'N': must be >= 1, got -2"),
        (("256", "256", "-1"), "'K': must be >= 1, got -1"),
        (("256", "256", "0"), "'K': must be >= 1, got 0"),
    ],
)
def test_a_shape_below_one_is_named_by_its_argument(
    tmp_path: Path, command: str, shape: tuple[str, ...], named: str
) -> None:
    code, out = run(tmp_path, command, *shape)
    assert code == 2, out
    assert f"Error: Invalid value for {named}" in out, out
    assert "No such option" not in out and "--k" not in out and "--m" not in out


def test_negative_numbers_mix_with_options(tmp_path: Path) -> None:
    code, out = run(tmp_path, "tune", "--dtype", "float64", "16", "-16", "16", "--trials", "2")
    assert code == 2 and "Invalid value for 'N': must be >= 1, got -16" in out, out
    code, out = run(tmp_path, "tune", "16", "16", "16", "--seed", "-5")  # an option's value
    assert code == 2 and "Invalid value for '--seed': -5 is not in the range" in out, out
    code, out = run(tmp_path, "tune", "16", "16", "16", "--trials=-5")
    assert code == 2 and "Invalid value for '--trials': -5 is not in the range" in out, out
    code, out = run(tmp_path, "tune", "16", "-1.5", "16")
    assert code == 2 and "Invalid value for 'N': '-1.5' is not a valid integer" in out, out


def test_an_unknown_option_is_still_refused_by_name(tmp_path: Path) -> None:
    code, out = run(tmp_path, "tune", "16", "16", "16", "--trails", "5")
    assert code == 2 and "No such option '--trails'. Did you mean '--trials'?" in out, out
    code, out = run(tmp_path, "lookup", "-x", "16", "16", "16")
    assert code == 2 and "No such option '-x'" in out, out
    code, out = run(tmp_path, "tune", "16", "16", "16", "-5")  # one argument too many
    assert code == 2 and "unexpected extra argument (-5)" in out, out


@pytest.mark.parametrize("command", ["tune", "lookup"])
def test_help_names_the_shape_as_positional_arguments(tmp_path: Path, command: str) -> None:
    code, out = run(tmp_path, command, "--help")
    assert code == 0
    assert f"Usage: main {command} [OPTIONS] M N K" in out, out
    assert "--m " not in out and "--k " not in out
