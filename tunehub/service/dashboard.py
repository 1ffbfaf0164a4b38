"""Dashboard: the HTML page routes (jobs, workers, schedules, models) and their /static mount."""

from __future__ import annotations

import os
from os import PathLike
from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.types import Scope

STATIC_DIR = Path(__file__).parent / "static"
STATIC_URL = "/static"
# Pages and scripts change with the package; make browsers revalidate instead of guessing.
NO_CACHE = {"Cache-Control": "no-cache"}

router = APIRouter(include_in_schema=False)


def _page(name: str) -> FileResponse:
    return FileResponse(STATIC_DIR / name, media_type="text/html; charset=utf-8", headers=NO_CACHE)


@router.get("/")
def jobs_page() -> FileResponse:
    """The jobs list; the page fetches ``/api/v1/jobs`` itself."""
    return _page("index.html")


@router.get("/models")
def models_page() -> FileResponse:
    """The cost models and their held-out metrics; the page fetches ``/api/v1/models``."""
    return _page("models.html")


@router.get("/workers")
def workers_page() -> FileResponse:
    """Every worker by target with its live state; the page polls ``/api/v1/workers``."""
    return _page("workers.html")


@router.get("/schedules")
def schedules_page() -> FileResponse:
    """The stored schedules, filtered and sorted; the page pages ``/api/v1/schedules``."""
    return _page("schedules.html")


@router.get("/jobs/{job_id}")
def job_page(job_id: str) -> FileResponse:
    """One job's page. Any id is served: the page itself tells "no job N" from the API's 404."""
    return _page("job.html")


class _RevalidatedStaticFiles(StaticFiles):
    """StaticFiles whose answers carry ``Cache-Control: no-cache`` (ETags still apply)."""

    def file_response(
        self,
        full_path: PathLike[str] | str,
        stat_result: os.stat_result,
        scope: Scope,
        status_code: int = 200,
    ) -> Response:
        response = super().file_response(full_path, stat_result, scope, status_code)
        response.headers.update(NO_CACHE)
        return response


def mount_static(app: FastAPI) -> None:
    """Serve the dashboard's CSS and scripts under ``/static``."""
    app.mount(STATIC_URL, _RevalidatedStaticFiles(directory=STATIC_DIR), name="static")
