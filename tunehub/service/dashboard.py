"""Dashboard: the HTML page routes (jobs, workers, schedules, models), their /static mount, the
dashboard's 404 page, and the API's documentation pages (/docs, /redoc) served offline."""

from __future__ import annotations

import html
import os
from functools import lru_cache
from importlib.resources import files
from os import PathLike
from pathlib import Path

from fastapi import APIRouter, FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException
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


# --- the 404 page ----------------------------------------------------------------------------

# Paths whose 404 stays JSON whatever the client accepts: the API and its machine-read files.
API_PREFIXES = ("/api/", "/healthz", "/openapi.json", STATIC_URL + "/", "/docs/assets/")


def wants_page(request: Request) -> bool:
    """Whether a 404 here is a browser's: a GET of a dashboard path that accepts HTML."""
    path = request.url.path
    if request.method not in ("GET", "HEAD") or path == "/api" or path.startswith(API_PREFIXES):
        return False
    return "text/html" in request.headers.get("accept", "")


def not_found_page(path: str) -> HTMLResponse:
    """The dashboard's 404: what was asked for, and the way home."""
    template = (STATIC_DIR / "404.html").read_text(encoding="utf-8")
    body = template.replace("{{path}}", html.escape(path[:300]))
    return HTMLResponse(body, status_code=404, headers=NO_CACHE)


def install_not_found(app: FastAPI) -> None:
    """Answer a browser's 404 on a dashboard path with a page linking home; the API (and any
    client that does not ask for HTML) keeps FastAPI's JSON ``{"detail": ...}``."""

    async def not_found(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code == 404 and wants_page(request):
            return not_found_page(request.url.path)
        return await http_exception_handler(request, exc)

    app.add_exception_handler(StarletteHTTPException, not_found)


# --- the API's documentation, offline ----------------------------------------------------------

# Swagger UI's and ReDoc's files as the fastapi-offline package installs them: the pages load
# nothing from outside the service, so they work on a cluster with no internet.
DOCS_ASSETS_URL = "/docs/assets"


def docs_assets_dir() -> Path:
    return Path(str(files("fastapi_offline") / "static"))


# ReDoc's bundle shows Redocly's logo from their CDN once its menu is up (the page's CSP then
# refuses the request; a browser test saw the attempt whenever the menu rendered in time). The
# bundle is served with that address replaced by an empty image of this page's own.
REDOC_CDN_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"
EMPTY_IMAGE = "data:image/svg+xml,%3Csvg xmlns='http://www.w3.org/2000/svg'/%3E"


@lru_cache(maxsize=1)
def redoc_bundle() -> bytes:
    """ReDoc's installed bundle with nothing in it that loads from outside the service."""
    text = (docs_assets_dir() / "redoc.standalone.js").read_text(encoding="utf-8")
    return text.replace(REDOC_CDN_LOGO, EMPTY_IMAGE).encode("utf-8")


def mount_api_docs(app: FastAPI, openapi_url: str = "/openapi.json") -> None:
    """``/docs`` (Swagger UI) and ``/redoc`` (ReDoc) from the installed assets. The app is made
    with ``docs_url=None, redoc_url=None`` (FastAPI's own pages load them from a CDN)."""

    # Before the assets' mount, which would answer this path with the bundle as installed.
    @app.get(f"{DOCS_ASSETS_URL}/redoc.standalone.js", include_in_schema=False)
    def redoc_js() -> Response:
        return Response(redoc_bundle(), media_type="text/javascript; charset=utf-8")

    app.mount(DOCS_ASSETS_URL, StaticFiles(directory=docs_assets_dir()), name="docs-assets")
    favicon = f"{DOCS_ASSETS_URL}/favicon.png"

    @app.get("/docs", include_in_schema=False)
    def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{app.title} API",
            swagger_js_url=f"{DOCS_ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{DOCS_ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=favicon,
            # No badge that sends the schema's address to swagger.io's online validator.
            swagger_ui_parameters={"validatorUrl": None},
        )

    @app.get("/redoc", include_in_schema=False)
    def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url=openapi_url,
            title=f"{app.title} API",
            redoc_js_url=f"{DOCS_ASSETS_URL}/redoc.standalone.js",
            redoc_favicon_url=favicon,
            with_google_fonts=False,
        )
