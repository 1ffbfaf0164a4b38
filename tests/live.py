"""A real tunehub server in a subprocess on a free loopback port, for end-to-end tests."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_script(script: str, *args: str, env: dict[str, str], timeout: float = 300) -> Any:
    """Run ``python -c script *args`` in a fresh interpreter (in the repository, with ``env``)
    and return what it printed last, read as JSON; a non-zero exit fails the test with the
    script's stderr."""
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def tunehub_env(home: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("TUNEHUB_DATABASE_URL", None)
    env.update(
        TUNEHUB_HOME=str(home),
        TUNEHUB_MIN_REPEAT_SECS="0.02",
        TUNEHUB_MEASURE_TIMEOUT_SECS="60",
        TUNEHUB_TEMPLATE_MODULES="tests.faulty_template",
        TUNEHUB_GPUS="none",
        PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
    )
    env.update(extra)
    return env


def create_key(home: Path, scope: str = "write", *extra: str, **env: str) -> str:
    """A new API key of ``scope``, made with ``tunehub keys create`` in ``home``'s database."""
    out = subprocess.run(
        [sys.executable, "-m", "tunehub.cli", "keys", "create", "--scope", scope, *extra],
        cwd=REPO,
        env=tunehub_env(home, **env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


class LiveServer:
    """``tunehub serve`` as a user runs it; ``restart`` kills it hard and starts it again.

    ``key`` is a write key made in its database before it starts; ``command`` runs in place of
    ``python -m tunehub.cli serve`` (e.g. under ``unshare``), with the same arguments after it.
    """

    def __init__(self, home: Path, *, command: list[str] | None = None, **env: str) -> None:
        self.home = home
        self.env = tunehub_env(home, **env)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = home / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.command = command or [sys.executable, "-m", "tunehub.cli", "serve"]
        home.mkdir(parents=True, exist_ok=True)
        self.key = create_key(home, **env)

    def start(self, timeout_secs: float = 60.0) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        log = self.log.open("ab")
        self.proc = subprocess.Popen(
            [*self.command, "--port", str(self.port)],
            cwd=REPO,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout_secs
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode}:\n{self.logs()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"server not up after {timeout_secs}s:\n{self.logs()}")

    def kill(self) -> None:
        """SIGKILL the whole process group: no shutdown hooks run, as in a crash."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()

    def restart(self) -> None:
        self.kill()
        self.start()

    def logs(self) -> str:
        return self.log.read_text(errors="replace")[-4000:] if self.log.exists() else ""

    def __enter__(self) -> LiveServer:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class ServedApp:
    """An app object served by uvicorn on a free loopback port, in a thread of this process
    (so a test can reach into its store, e.g. to count SQL statements); ``url`` once started."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def __enter__(self) -> ServedApp:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(15)
        self.sock.close()
