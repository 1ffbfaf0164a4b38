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
    gpus: str = Field(
        default="auto",
        description="GPU workers to start: `auto` (every GPU nvidia-smi lists), `none`, or "
        "indices such as `0,1`.",
    )
    measure_timeout_secs: float | None = Field(
        default=None,
        gt=0,
        description="Per-candidate limit for checking and timing; default: a fixed allowance "
        "plus a run allowance that grows with the workload's FLOPs.",
    )
    max_candidate_secs: float = Field(
        default=900.0,
        gt=0,
        description="Hard cap on any candidate's build and on its run, whatever the FLOPs.",
    )
    build_timeout_secs: float = Field(default=300.0, gt=0, description="Per-candidate build limit.")
    builders: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="Build processes per device; default: the cores less one, at most 8.",
    )
    min_repeat_secs: float = Field(
        default=0.2, gt=0, description="Time each candidate for at least this long."
    )
    max_repeats: int = Field(default=50, ge=3)
    train_models: bool = Field(
        default=True,
        description="Run the background trainer of the global cost models in this process.",
    )
    train_interval_secs: float = Field(
        default=60.0, gt=0, description="How often the trainer looks for new records."
    )
    train_min_new_records: int = Field(
        default=200, ge=1, description="Retrain a family's model after this many new records."
    )
    tune_unseen: bool = Field(
        default=False,
        description="Queue a tuning job for every looked-up workload nobody tuned.",
    )

    @property
    def build_dir(self) -> Path:
        return self.home / "build"

    def resolved_database_url(self) -> str:
        return self.database_url or database_url(self.home)

    def gpu_indices(self) -> list[int]:
        """The GPUs to start workers for (``auto``: those ``nvidia-smi -L`` lists)."""
        text = self.gpus.strip().lower()
        if text in ("none", "", "off"):
            return []
        if text == "auto":
            from tunehub.workers.gpus import visible_gpus

            return visible_gpus()
        try:
            return sorted({int(part) for part in text.split(",") if part.strip()})
        except ValueError:
            raise ValueError(
                f"TUNEHUB_GPUS: expected auto, none or indices like 0,1; got {self.gpus!r}"
            ) from None
