"""TunehubClient: a small synchronous HTTP client for the tunehub API."""

from __future__ import annotations

import os
import time
from typing import Any

import httpx

from tunehub.client.query import query_value

FINISHED = ("succeeded", "failed", "cancelled")
API_KEY_HEADER = "X-API-Key"
API_KEY_ENV = "TUNEHUB_API_KEY"


class TunehubError(RuntimeError):
    """The service answered with an error status; ``status_code`` and ``detail`` say which."""

    def __init__(self, status_code: int, detail: Any) -> None:
        super().__init__(f"HTTP {status_code}: {detail}")
        self.status_code = status_code
        self.detail = detail


class TunehubClient:
    """Talks to a tunehub service.

    ``api_key`` (default ``$TUNEHUB_API_KEY``) is sent as ``X-API-Key``: writes need one, and
    reads too where the service closes them.

    >>> client = TunehubClient("http://127.0.0.1:8000", api_key="th_…")  # doctest: +SKIP
    >>> job = client.submit_job({"m": 256, "n": 256, "k": 256}, max_trials=16)  # doctest: +SKIP
    >>> client.wait(job["id"])["state"]  # doctest: +SKIP
    'succeeded'
    """

    def __init__(
        self, base_url: str, *, api_key: str | None = None, timeout_secs: float = 10.0
    ) -> None:
        self.base_url = base_url.rstrip("/")
        key = api_key if api_key is not None else os.environ.get(API_KEY_ENV, "")
        headers = {API_KEY_HEADER: key} if key else {}
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout_secs, headers=headers)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> TunehubClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self._http.request(method, path, **kwargs)
        if response.status_code >= 400:
            try:
                detail = response.json().get("detail", response.text)
            except ValueError:
                detail = response.text
            raise TunehubError(response.status_code, detail)
        return response.json()

    def health(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/healthz")
        return result

    def submit_job(
        self,
        workload: dict[str, Any],
        *,
        target: str = "local-cpu",
        template: str | None = None,
        strategy: str = "random",
        max_trials: int = 32,
        max_secs: float = 300.0,
        seed: int = 0,
    ) -> dict[str, Any]:
        """Queue a job; ``template`` None lets the service take the first template that runs
        the workload on the target (``blis.gemm`` for a CPU matmul, ``blis.bmm`` for a bmm)."""
        body: dict[str, Any] = {
            "workload": {"op": "matmul", **workload},
            "target": target,
            "strategy": strategy,
            "budget": {"max_trials": max_trials, "max_secs": max_secs},
            "seed": seed,
        }
        if template is not None:
            body["template"] = template
        result: dict[str, Any] = self._call("POST", "/api/v1/jobs", json=body)
        return result

    def get_job(self, job_id: int) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/api/v1/jobs/{job_id}")
        return result

    def list_jobs(self, *, limit: int = 50, offset: int = 0) -> dict[str, Any]:
        result: dict[str, Any] = self._call(
            "GET", "/api/v1/jobs", params={"limit": limit, "offset": offset}
        )
        return result

    def job_records(self, job_id: int, *, after: int | None = None) -> list[dict[str, Any]]:
        """The job's records stored after the ``after`` cursor (all by default), every page."""
        items: list[dict[str, Any]] = []
        while True:
            params = {} if after is None else {"after": after}
            page = self._call("GET", f"/api/v1/jobs/{job_id}/records", params=params)
            items.extend(page["items"])
            if not page["items"]:
                return items
            after = page["next_after"]

    def list_targets(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/api/v1/targets")["items"]
        return result

    def cancel_job(self, job_id: int) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", f"/api/v1/jobs/{job_id}/cancel")
        return result

    def wait(self, job_id: int, *, timeout_secs: float = 600.0, poll_secs: float = 0.5) -> Any:
        """Poll until the job is finished; return it. Raises TimeoutError past ``timeout_secs``."""
        deadline = time.monotonic() + timeout_secs
        while True:
            job = self.get_job(job_id)
            if job["state"] in FINISHED:
                return job
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {job['state']} after {timeout_secs}s")
            time.sleep(poll_secs)

    def best_schedule(
        self, workload: dict[str, Any], *, target: str = "local-cpu"
    ) -> dict[str, Any] | None:
        """The best known schedule, or None when the service knows nothing for it (404)."""
        params = {k: query_value(v) for k, v in workload.items()}
        try:
            result: dict[str, Any] = self._call(
                "GET", "/api/v1/schedules/best", params={**params, "target": target}
            )
        except TunehubError as exc:
            if exc.status_code == 404:
                return None
            raise
        return result
