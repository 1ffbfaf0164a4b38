"""A ``tunehub serve`` of the benchmarks' own: SQLite in a temp dir, a loopback port, a write
key, this machine's devices as workers; stopped (its process group) on exit."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Service:
    url: str
    key: str
    home: Path | None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("TUNEHUB_DATABASE_URL", None)
    env.update(
        TUNEHUB_HOME=str(home),
        PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
        **extra,
    )
    return env


@contextlib.contextmanager
def local_service(
    url: str | None = None,
    api_key: str | None = None,
    *,
    gpus: str = "auto",
    home: Path | None = None,
    **env: str,
) -> Iterator[Service]:
    """The service at ``url`` (with ``api_key``, default ``$TUNEHUB_API_KEY``), or a new
    ``tunehub serve`` with a write key, on SQLite in ``home`` (kept, with its key, so a later
    run finds what this one tuned) or in a temp dir."""
    if url:
        yield Service(url.rstrip("/"), api_key or os.environ.get("TUNEHUB_API_KEY", ""), None)
        return
    with contextlib.ExitStack() as stack:
        if home is None:
            home = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tunehub-bench-")))
        home.mkdir(parents=True, exist_ok=True)
        yield stack.enter_context(_serve(home, gpus, env))


@contextlib.contextmanager
def _serve(home: Path, gpus: str, env: dict[str, str]) -> Iterator[Service]:
    environment = _env(home, TUNEHUB_GPUS=gpus, **env)
    key_file = home / "bench-write-key"
    if key_file.exists():
        key = key_file.read_text().strip()
    else:
        key = subprocess.run(
            [sys.executable, "-m", "tunehub.cli", "keys", "create", "--scope", "write"],
            env=environment,
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        ).stdout.strip()
        key_file.write_text(key)
    port = _free_port()
    log = (home / "serve.log").open("wb")
    child = subprocess.Popen(
        [sys.executable, "-m", "tunehub.cli", "serve", "--host", "127.0.0.1",
         "--port", str(port)],
        env=environment,
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if child.poll() is not None:
                text = (home / "serve.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"tunehub serve exited with {child.returncode}:\n{text}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("tunehub serve did not answer within 120 s")
            time.sleep(0.3)
        yield Service(base, key, home)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGINT)
        try:
            child.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            child.wait(10)
        log.close()


def tune_shapes(
    service: Service,
    workloads: list[dict[str, Any]],
    *,
    target: str,
    template: str,
    max_trials: int,
    max_secs: float,
    timeout_secs: float = 3600.0,
) -> list[dict[str, Any]]:
    """Submit one tuning job per workload (queued together), wait for all; the jobs."""
    headers = {"X-API-Key": service.key}
    ids = []
    with httpx.Client(base_url=service.url, headers=headers, timeout=30) as http:
        for workload in workloads:
            body = {
                "workload": {"op": "matmul", **workload},
                "target": target,
                "template": template,
                "budget": {"max_trials": max_trials, "max_secs": max_secs},
            }
            response = http.post("/api/v1/jobs", json=body)
            response.raise_for_status()
            ids.append(response.json()["id"])
        deadline = time.monotonic() + timeout_secs
        jobs: dict[int, dict[str, Any]] = {}
        while len(jobs) < len(ids):
            for job_id in ids:
                if job_id in jobs:
                    continue
                job = http.get(f"/api/v1/jobs/{job_id}").json()
                if job["state"] in ("succeeded", "failed", "cancelled"):
                    jobs[job_id] = job
            if time.monotonic() > deadline:
                raise TimeoutError(f"jobs {sorted(set(ids) - set(jobs))} still running")
            time.sleep(1.0)
    return [jobs[i] for i in ids]


def job_outcomes(service: Service, job_id: int, *, keep: int = 20) -> dict[str, Any]:
    """How a job's trials ended: a count per status and the first ``keep`` that were not
    ``ok`` (config, status, error's first line), so a suite shows what failed, not only
    that its job did."""
    counts: dict[str, int] = {}
    failed: list[dict[str, Any]] = []
    after = None
    with httpx.Client(base_url=service.url, headers={"X-API-Key": service.key}, timeout=30) as h:
        while True:
            params = {"after": after} if after is not None else {}
            page = h.get(f"/api/v1/jobs/{job_id}/records", params=params).json()
            for item in page.get("items", []):
                counts[item["status"]] = counts.get(item["status"], 0) + 1
                if item["status"] != "ok" and len(failed) < keep:
                    error = (item.get("error") or "").strip().splitlines()
                    failed.append({"config": item["config"], "status": item["status"],
                                   "error": error[0][:300] if error else ""})  # fmt: skip
            if not page.get("items") or page.get("next_after") in (None, after):
                break
            after = page["next_after"]
    return {"statuses": counts, "failed": failed}


def lookup(service: Service, workload: dict[str, Any], *, target: str, template: str) -> Any:
    params = {k: str(v).lower() if isinstance(v, bool) else v for k, v in workload.items()}
    response = httpx.get(
        f"{service.url}/api/v1/schedules/best",
        params={**params, "target": target, "template": template},
        timeout=30,
    )
    return response.json() if response.status_code == 200 else {"error": response.text}


def machine() -> dict[str, str]:
    """The machine, as the results record it."""
    info = {"python": sys.version.split()[0]}
    with contextlib.suppress(Exception):
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        info["cpu"] = next(
            (line.split(":", 1)[1].strip() for line in out.splitlines() if "Model name" in line),
            "",
        )
    with contextlib.suppress(Exception):
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
            info["cuda"] = str(torch.version.cuda)
    with contextlib.suppress(Exception):
        import triton

        info["triton"] = triton.__version__
    return info
