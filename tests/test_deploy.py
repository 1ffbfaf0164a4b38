"""The cluster deployment files (docker-compose.yml, Dockerfile, deploy.env.example) agree with
the code: every service's command parses against the real CLI, every TUNEHUB_* variable set is
one tunehub reads, every file the image copies exists. No Docker engine runs here, so the files
are checked, not started; tests/test_cluster*.py run the same topology without Docker."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from tests.live import REPO
from tunehub.cli import main as tunehub_cli
from tunehub.service.settings import Settings

COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
DOCKERFILE = (REPO / "Dockerfile").read_text()


def env_file_vars(path: Path) -> dict[str, str]:
    found = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, value = line.partition("=")
            found[name.strip()] = value.strip()
    return found


def service_env(service: dict[str, Any]) -> dict[str, str]:
    """What a service's environment holds: its env file (the committed example stands for the
    operator's copy) and its own `environment`."""
    env: dict[str, str] = {}
    files = service.get("env_file", [])
    for name in [files] if isinstance(files, str) else files:
        assert name == "deploy.env", f"unexpected env file {name}"
        env.update(env_file_vars(REPO / "deploy.env.example"))
    given = service.get("environment", {})
    if isinstance(given, list):
        given = dict(item.partition("=")[::2] for item in given)
    env.update({k: str(v) for k, v in given.items()})
    return env


def tunehub_vars_read() -> set[str]:
    """The TUNEHUB_* variables tunehub reads: the settings' fields (pydantic-settings, prefix
    TUNEHUB_) and the names the code spells out where it reads the environment itself."""
    names = {f"TUNEHUB_{name.upper()}" for name in Settings.model_fields}
    for path in (REPO / "tunehub").rglob("*.py"):
        names.update(re.findall(r"\bTUNEHUB_[A-Z][A-Z0-9_]*\b", path.read_text()))
    return names


def parse_command(cli: click.Command, argv: list[str]) -> click.Context:
    """Resolve ``argv`` down ``cli``'s command tree and parse its options, running nothing;
    click raises UsageError (no such command or option, a bad value) as it would for a user."""
    ctx = cli.make_context(cli.name or "cli", list(argv), resilient_parsing=False)
    while isinstance(ctx.command, click.Group):
        args = [*ctx._protected_args, *ctx.args]  # the group's unparsed rest
        assert args, f"{ctx.command_path}: no subcommand given"
        name, command, rest = ctx.command.resolve_command(ctx, args)
        assert command is not None, f"{ctx.command_path}: no command {args[0]!r}"
        ctx = command.make_context(name or "", rest, parent=ctx)
    return ctx


def ray_cli() -> click.Command:
    from ray.scripts.scripts import cli

    return cli


def command_params() -> list[Any]:
    return [pytest.param(name) for name in SERVICES if "command" in SERVICES[name]]


def test_the_topology_is_the_one_documented() -> None:
    assert {"postgres", "ray-head", "api", "worker-cpu", "worker-gpu"} <= set(SERVICES)
    assert "--head" in SERVICES["ray-head"]["command"]
    assert "--block" in SERVICES["ray-head"]["command"]  # else the container exits at once


@pytest.mark.parametrize("service", command_params())
def test_every_command_exists_in_the_cli(service: str) -> None:
    argv = SERVICES[service]["command"]
    assert isinstance(argv, list), "exec form: no shell between Docker and the process"
    program, *args = argv
    if program == "tunehub":
        ctx = parse_command(tunehub_cli, args)
    elif program == "ray":
        ctx = parse_command(ray_cli(), args)
    else:
        raise AssertionError(f"{service}: runs {program!r}, neither tunehub nor ray")
    assert ctx.command.callback is not None


def test_a_command_the_cli_lacks_is_caught() -> None:
    with pytest.raises(click.UsageError):
        parse_command(tunehub_cli, ["serve", "--no-such-option"])
    with pytest.raises(click.UsageError):
        parse_command(tunehub_cli, ["no-such-command"])
    with pytest.raises(click.UsageError):
        parse_command(ray_cli(), ["start", "--head", "--port=not-a-port"])


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_every_tunehub_variable_set_is_read(service: str) -> None:
    unknown = {n for n in service_env(SERVICES[service]) if n.startswith("TUNEHUB_")}
    unknown -= tunehub_vars_read()
    assert not unknown, f"{service} sets variables tunehub never reads: {sorted(unknown)}"


def test_the_variable_check_can_fail() -> None:
    assert "TUNEHUB_DATABASE_URL" in tunehub_vars_read()
    assert "TUNEHUB_BUILD_DIR" in tunehub_vars_read()  # read by kernels/build.py, not Settings
    assert "TUNEHUB_DATABSE_URL" not in tunehub_vars_read()


@pytest.mark.parametrize("service", ["ray-head", "api", "worker-cpu", "worker-gpu"])
def test_every_ray_process_has_token_auth(service: str) -> None:
    env = service_env(SERVICES[service])
    assert env.get("RAY_AUTH_MODE") == "token"
    assert env.get("RAY_AUTH_TOKEN") or env.get("RAY_AUTH_TOKEN_PATH")


def test_the_api_and_workers_use_postgres_and_the_ray_head() -> None:
    for name in ("api", "migrate"):
        assert service_env(SERVICES[name])["TUNEHUB_DATABASE_URL"].startswith("postgresql")
    assert "ray-head:6379" in SERVICES["api"]["command"]
    for name in ("worker-cpu", "worker-gpu"):
        argv = SERVICES[name]["command"]
        assert argv[argv.index("--address") + 1] == "ray-head:6379"
    assert {"--cpu", "--gpus"} <= set(SERVICES["worker-cpu"]["command"])
    assert "--no-cpu" in SERVICES["worker-gpu"]["command"]


def test_only_the_api_port_is_published() -> None:
    published = {name: s["ports"] for name, s in SERVICES.items() if s.get("ports")}
    assert published == {"api": ["8000:8000"]}, published
    for name, service in SERVICES.items():
        assert "network_mode" not in service, f"{name}: host networking exposes Ray's ports"


def test_the_gpu_worker_asks_for_the_nvidia_runtime() -> None:
    devices = SERVICES["worker-gpu"]["deploy"]["resources"]["reservations"]["devices"]
    assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices)
    assert "gpu" in SERVICES["worker-gpu"]["build"]["args"]["EXTRAS"].split(",")
    assert "deploy" not in SERVICES["worker-cpu"]


def test_the_dockerfile_copies_files_that_exist_and_installs_real_extras() -> None:
    copied = re.findall(r"^COPY\s+(.+?)\s+\S+\s*$", DOCKERFILE, flags=re.M)
    assert copied
    for sources in copied:
        for source in sources.split():
            assert (REPO / source).exists(), f"Dockerfile copies {source}, which is missing"
    extras = set(
        tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    )
    default = re.search(r"^ARG EXTRAS=(\S+)", DOCKERFILE, flags=re.M)
    assert default is not None
    assert "${EXTRAS}" in DOCKERFILE
    wanted = set(default.group(1).split(","))
    for service in SERVICES.values():
        build = service.get("build")
        if isinstance(build, dict) and "args" in build:
            wanted |= set(build["args"]["EXTRAS"].split(","))
    assert "cluster" in wanted and wanted <= extras, wanted - extras


def test_the_secrets_stay_out_of_git() -> None:
    ignored = (REPO / ".gitignore").read_text().split()
    assert "deploy.env" in ignored
    assert "deploy.env" in (REPO / ".dockerignore").read_text().split()
    assert (REPO / "deploy.env.example").exists()


def cluster_doc() -> str:
    """The cluster's documentation (the README links it)."""
    return (REPO / "docs" / "cluster.md").read_text()


def section_commands(section: str, program: str) -> list[list[str]]:
    """The ``program`` command lines of a section's bash blocks, comments cut off."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", section, flags=re.S):
        for line in block.splitlines():
            argv = shlex.split(line, comments=True)
            if argv and argv[0] == program:
                found.append(argv)
    return found


CLUSTER = cluster_doc()


def test_the_cluster_docs_commands_exist_in_the_cli() -> None:
    tunehub_lines = section_commands(CLUSTER, "tunehub")
    ray_lines = section_commands(CLUSTER, "ray")
    # The topology: schema, replicas, workers (a worker machine's two ways), and the head.
    assert [a[1] for a in tunehub_lines].count("worker") >= 2
    assert {"serve", "db", "worker"} <= {a[1] for a in tunehub_lines}
    assert any("--head" in a for a in ray_lines)
    for argv in tunehub_lines:
        assert parse_command(tunehub_cli, argv[1:]).command.callback is not None, argv
    for argv in ray_lines:
        assert parse_command(ray_cli(), argv[1:]).command.callback is not None, argv
    with pytest.raises(click.UsageError):  # the check can fail
        parse_command(tunehub_cli, ["worker", "--adress", "h:1"])


def test_the_cluster_docs_say_what_stays_private_and_how_the_token_is_handled() -> None:
    text = " ".join(CLUSTER.split())
    private = text.split("What stays private")[1].split("Ray token authentication")[0]
    for port in ("6379", "8265", "10001", "5432"):
        assert re.search(rf"\b{port}\b", private), port
    assert "Only the API's port (8000)" in text
    assert "RAY_AUTH_MODE=token" in text and "Ray 2.52 and later" in text
    assert "RAY_AUTH_TOKEN" in text and "secrets.token_hex" in text  # where the token comes from
    assert "Add a worker machine" in text and "GET /api/v1/workers" in text
