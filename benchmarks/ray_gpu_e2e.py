"""One triton.gemm job through Ray on a GPU machine, end to end, against the same job measured
by the local measurer.

Through Ray: `ray start --head` (control plane only), `tunehub worker --no-cpu --gpus 0` as a
second Ray node offering GPU 0, and `tunehub serve --ray` (its own SQLite); an HTTP job for the
GPU target the Ray worker registered, measured by the service's actor on that node (builds in
the actor's build sandboxes on the node's CPU cores while its run sandbox times), records in
the database, then the lookup. Locally: the same job on a fresh `tunehub serve` whose own
worker measures GPU 0. Prints both jobs' wall time (submit to finished), their records and
what the worker reported while the job ran, and how much compile time ran beside timing (the
records' compile time plus their device time, less the job's tuning time: a lower bound);
writes JSON with --out.

    python3 benchmarks/ray_gpu_e2e.py --trials 32 --out /tmp/ray_gpu_e2e.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from local_service import REPO, Service, _free_port, local_service, lookup, machine

TERMINAL = ("succeeded", "failed", "cancelled")


def _workload(shape: str, dtype: str) -> dict[str, Any]:
    m, n, k = (int(x) for x in shape.split("x"))
    return {"m": m, "n": n, "k": k, "dtype": dtype, "b_layout": "col_major"}


def _cuda_target(http: httpx.Client, *, kind: str, timeout_secs: float) -> dict[str, Any]:
    """The live cuda target with a worker of ``kind`` (``ray`` or ``local``), waiting for it."""
    deadline = time.monotonic() + timeout_secs
    while True:
        for target in http.get("/api/v1/targets").json()["items"]:
            if target["kind"] == "cuda" and any(w["kind"] == kind for w in target["workers"]):
                return dict(target)
        if time.monotonic() > deadline:
            raise TimeoutError(f"no live {kind} worker of a cuda target in {timeout_secs:.0f} s")
        time.sleep(1.0)


def _run_job(
    service: Service, workload: dict[str, Any], target_key: str, trials: int, secs: float
) -> dict[str, Any]:
    """Submit, wait, and return the job with its records, wall time and worker samples."""
    headers = {"X-API-Key": service.key}
    with httpx.Client(base_url=service.url, headers=headers, timeout=30) as http:
        body = {
            "workload": {"op": "matmul", **workload},
            "target": target_key,
            "template": "triton.gemm",
            "budget": {"max_trials": trials, "max_secs": secs},
        }
        started = time.monotonic()
        response = http.post("/api/v1/jobs", json=body)
        response.raise_for_status()
        job_id = response.json()["id"]
        samples: list[dict[str, Any]] = []
        while True:
            job = http.get(f"/api/v1/jobs/{job_id}").json()
            with contextlib.suppress(Exception):  # the workers route, where the service has it
                listed = http.get("/api/v1/workers")
                if listed.status_code == 200:
                    for worker in listed.json().get("workers", []):
                        samples.append(
                            {
                                "at_secs": round(time.monotonic() - started, 2),
                                "kind": worker.get("kind"),
                                "state": worker.get("state"),
                                "job_id": worker.get("job_id"),
                            }
                        )
            if job["state"] in TERMINAL:
                break
            time.sleep(0.5)
        wall = time.monotonic() - started
        records = http.get(f"/api/v1/jobs/{job_id}/records").json()
    items = records.get("records", records.get("items", []))
    statuses: dict[str, int] = {}
    for record in items:
        statuses[record["status"]] = statuses.get(record["status"], 0) + 1
    # The device times one candidate at a time (check, then timed repeats), so the job's
    # tuning time holds at least the sum of that device time; whatever the records' compile
    # time adds beyond the tuning time must have run beside timing (a lower bound).
    compile_total = sum(float(r.get("compile_secs") or 0.0) for r in items)
    device_total = sum(
        float(r.get("verify_secs") or 0.0) + float(r.get("run_secs") or 0.0) for r in items
    )
    tuning = float(job.get("tuning_secs") or 0.0)
    return {
        "job_id": job_id,
        "compile_secs_total": round(compile_total, 2),
        "device_secs_total": round(device_total, 2),
        "compile_beside_timing_secs_at_least": round(
            max(0.0, compile_total + device_total - tuning), 2
        ),
        "state": job["state"],
        "error": job.get("error"),
        "wall_secs": round(wall, 2),
        "tuning_secs": job.get("tuning_secs"),
        "trials_done": job.get("trials_done"),
        "statuses": statuses,
        "best_gflops": max((r["gflops"] or 0.0 for r in items if r["status"] == "ok"), default=0),
        "worker_states_seen": sorted({s["state"] for s in samples if s.get("state")}),
        "samples": samples[:400],
    }


@contextlib.contextmanager
def _ray_cluster(home: Path) -> Any:
    """A Ray head (no resources of its own) and a `tunehub worker` node offering GPU 0."""
    port = _free_port()
    address = f"127.0.0.1:{port}"
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    head = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--port", str(port),
            "--num-cpus", "0", "--num-gpus", "0", "--include-dashboard=false",
            "--disable-usage-stats"]  # fmt: skip
    subprocess.run(head, env=env, check=True, timeout=180)
    log = (home / "worker.log").open("wb")
    worker = subprocess.Popen(
        [sys.executable, "-m", "tunehub.cli", "worker", "--address", address, "--no-cpu",
         "--gpus", "0"],
        env=dict(env, TUNEHUB_HOME=str(home / "worker-home")),
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    try:
        yield address
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            worker.wait(30)
        subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "stop", "--force"],
                       env=env, timeout=120, check=False)  # fmt: skip
        log.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="2048x2048x2048")
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--trials", type=int, default=32)
    parser.add_argument("--secs", type=float, default=240.0, help="each job's max_secs")
    parser.add_argument("--skip-local", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    workload = _workload(args.shape, args.dtype)
    result: dict[str, Any] = {"machine": machine(), "workload": workload, "trials": args.trials,
                              "commit": os.environ.get("TUNEHUB_COMMIT", "")}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="tunehub-ray-e2e-") as tmp:
        home = Path(tmp)
        with _ray_cluster(home) as address:
            with local_service(gpus="none", home=home / "ray-serve",
                               TUNEHUB_RAY_ADDRESS=address) as service:  # fmt: skip
                with httpx.Client(base_url=service.url, timeout=30) as http:
                    target = _cuda_target(http, kind="ray", timeout_secs=240)
                print(f"ray worker live for {target['label']}", flush=True)
                ray_job = _run_job(service, workload, target["target_key"], args.trials, args.secs)
                ray_job["lookup"] = lookup(service, workload, target=target["target_key"],
                                           template="triton.gemm")  # fmt: skip
                result["ray"] = ray_job
                result["target"] = {k: target[k] for k in ("target_key", "label", "toolchain")}
            with contextlib.suppress(OSError):
                result["worker_log_tail"] = (home / "worker.log").read_text()[-3000:]
        if not args.skip_local:
            with local_service(gpus="0", home=home / "local-serve") as service:
                with httpx.Client(base_url=service.url, timeout=30) as http:
                    target = _cuda_target(http, kind="local", timeout_secs=240)
                result["local"] = _run_job(service, workload, "local-cuda:0", args.trials,
                                           args.secs)  # fmt: skip
    print(f"\n{args.shape} {args.dtype}, {args.trials} trials, triton.gemm, default strategy")
    print(f"{'measured through':<18}{'state':<11}{'wall s':>8}{'tuning s':>10}{'records':>9}"
          f"{'best TFLOP/s':>14}{'compile s':>11}{'device s':>10}{'overlap s':>11}"
          "  worker states seen")  # fmt: skip
    for name in ("ray", "local"):
        job = result.get(name)
        if job is None:
            continue
        tuning = job["tuning_secs"] or 0.0
        print(f"{name:<18}{job['state']:<11}{job['wall_secs']:>8.1f}{tuning:>10.1f}"
              f"{sum(job['statuses'].values()):>9}{job['best_gflops'] / 1000:>14.1f}"
              f"{job['compile_secs_total']:>11.1f}{job['device_secs_total']:>10.1f}"
              f"{job['compile_beside_timing_secs_at_least']:>11.1f}  "
              f"{','.join(job['worker_states_seen'])}")  # fmt: skip
    if "ray" in result and "local" in result:
        ratio = result["ray"]["wall_secs"] / result["local"]["wall_secs"]
        result["ray_over_local_wall"] = round(ratio, 3)
        print(f"wall time through Ray / local: {ratio:.2f}x")
    answer = result.get("ray", {}).get("lookup", {})
    print(
        "lookup through the Ray-fed database:",
        json.dumps(
            {k: answer.get(k) for k in ("source", "gflops", "speedup_vs_baseline", "config")}
        ),
    )
    if args.out:
        args.out.write_text(json.dumps(result, indent=1, default=str))
        print(f"wrote {args.out}")
    ok = result.get("ray", {}).get("state") == "succeeded"
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
