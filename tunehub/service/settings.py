"""Service settings, read from TUNEHUB_* environment variables."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from tunehub.db import database_url


def default_home() -> Path:
    return Path("~/.tunehub").expanduser()


class Settings(BaseSettings):
    """Everything the service reads from its environment (prefix ``TUNEHUB_``)."""

    model_config = SettingsConfigDict(env_prefix="TUNEHUB_", extra="ignore")

    home: Path = Field(default_factory=default_home, description="Data dir (DB, build cache).")
    database_url: str | None = Field(
        default=None, description="SQLAlchemy URL; default sqlite:///$TUNEHUB_HOME/tunehub.db."
    )
    host: str = "127.0.0.1"
    port: int = 8000
    run_jobs: bool = Field(default=True, description="Run the job runner in this process.")
    measure_timeout_secs: float | None = Field(
        default=None,
        gt=0,
        description="Per-candidate limit (build + verify + time); default: a build allowance "
        "plus a run allowance that grows with the workload's FLOPs.",
    )
    min_repeat_secs: float = Field(
        default=0.2, gt=0, description="Time each candidate for at least this long."
    )
    max_repeats: int = Field(default=50, ge=3)

    @property
    def build_dir(self) -> Path:
        return self.home / "build"

    def resolved_database_url(self) -> str:
        return self.database_url or database_url(self.home)
