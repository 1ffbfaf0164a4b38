"""Service settings, read from TUNEHUB_* environment variables."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from tunehub.core.fairshare import DEFAULT_WINDOW_SECS, FairShare
from tunehub.core.job import MAX_SECS, MAX_TRIALS
from tunehub.core.owner import DEFAULT_LEASE_SECS
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
    ray_address: str | None = Field(
        default=None,
        description="Measure through the Ray cluster at this address (`host:port` of its head) "
        "instead of this machine's devices; `local` starts Ray in the process with this "
        "machine's CPU and GPUs as its workers. Unset: no Ray.",
    )
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
        description="Build processes per device; default: the cores less one, at most 16.",
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
        description="Queue a tuning job for every looked-up workload nobody tuned (no key "
        "needed: the operator's policy), within the lookup-job limits below.",
    )
    max_lookup_jobs: int = Field(
        default=20,
        ge=0,
        description="Tuning jobs that lookups (`tune=true`, `tune_unseen`) may have queued or "
        "running at once, over every caller; beyond, a lookup says it queued none.",
    )
    lookup_job_trials: int = Field(
        default=64, ge=1, le=MAX_TRIALS, description="Trial budget of a job a lookup queues."
    )
    lookup_job_secs: float = Field(
        default=600.0,
        gt=0,
        le=MAX_SECS,
        description="Tuning-time budget (seconds) of a job a lookup queues.",
    )

    # --- serving lookups (see README "Fast lookups") ---------------------------------------
    workers: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Worker processes of `tunehub serve`; the job runner and the trainer run "
        "in one of them.",
    )
    switch_interval_secs: float = Field(
        default=0.0005,
        gt=0,
        le=0.1,
        description="Python's thread switch interval in each `tunehub serve` process "
        "(sys.setswitchinterval; Python's default is 0.005): how long the event loop may hold "
        "the interpreter while the thread that read an uncached lookup's answer waits for it.",
    )
    lookup_cache_entries: int = Field(
        default=50_000,
        ge=0,
        description="Lookup answers each serving process keeps encoded, single lookups' and "
        "batch items' together (0: no cache).",
    )
    lookup_refresh_secs: float = Field(
        default=0.25,
        gt=0,
        le=60,
        description="How often each serving process reads the store's change feed: a cached "
        "answer is at most about this much older than the database.",
    )
    metrics_cache_secs: float = Field(
        default=5.0,
        ge=0,
        le=300,
        description="How long GET /metrics reuses what it read from the database (jobs by state "
        "and key, workers by state): several scrapes within it cost one round of queries.",
    )

    # --- exposure: keys, limits, headers (see README "Keys, limits and headers") ------------
    read_requires_key: bool = Field(
        default=False,
        description="Close the API's reads too: GET routes then need a key of any scope.",
    )
    allowed_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["127.0.0.1", "localhost", "::1"],
        description="Host header values served (port ignored); `*` serves any. Others get a "
        "400, which stops DNS rebinding.",
    )
    cors_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Origins allowed to call the API from a browser (CORS); none by default.",
    )
    max_job_trials: int = Field(
        default=5000, ge=1, le=MAX_TRIALS, description="Most trials one job may ask for."
    )
    max_job_secs: float = Field(
        default=6 * 3600.0,
        gt=0,
        le=MAX_SECS,
        description="Most tuning seconds one job may ask for.",
    )
    max_queued_jobs_per_key: int = Field(
        default=20,
        ge=1,
        description="Jobs one key may have queued or running at once; the jobs its `tune=true` "
        "lookups queued do not count (TUNEHUB_MAX_LOOKUP_JOBS bounds those).",
    )
    max_queued_jobs: int = Field(
        default=500, ge=1, description="Jobs the whole service may have queued or running."
    )
    max_body_bytes: int = Field(
        default=1 << 20, ge=1024, description="Largest request body accepted (413 above)."
    )
    body_timeout_secs: float = Field(
        default=10.0, gt=0, description="Time allowed to send a request body (408 after)."
    )
    max_connections: int | None = Field(
        default=1000,
        ge=1,
        description="Connections `tunehub serve` keeps at once; beyond, it answers 503.",
    )
    keyless_requests_per_sec: float = Field(
        default=0.0,
        ge=0,
        description="API requests a second one client address may send without a key (a "
        "token bucket; 429 with Retry-After beyond; 0: no limit). Cached single lookups are "
        "not counted.",
    )
    keyless_burst: int = Field(
        default=400, ge=1, description="Keyless requests one address may send at once."
    )
    job_slice_secs: float = Field(
        default=300.0,
        gt=0,
        description="A running job is handed back to the queue after this long when another "
        "job of its target waits, so jobs share a device fairly.",
    )
    job_min_slice_secs: float = Field(
        default=5.0,
        gt=0,
        description="While other keys' first jobs wait, a running job's slice is shortened so "
        "that each of them starts within job_slice_secs of queueing, but never below this.",
    )
    fair_share_window_secs: float = Field(
        default=DEFAULT_WINDOW_SECS,
        gt=0,
        description="Fair share between keys: the device time a key's jobs used counts for "
        "this long after they end (fading linearly); the runner claims next the job of the key "
        "with the least time over its weight.",
    )
    fair_share_weights: Annotated[dict[str, float], NoDecode] = Field(
        default_factory=dict,
        description="Fair-share weights of keys by name, `name=weight,...` (e.g. `ci=0.5,"
        "alice=2`: alice's jobs may use four times ci's device time); others weigh 1.",
    )
    lease_secs: float = Field(
        default=DEFAULT_LEASE_SECS,
        gt=0,
        le=24 * 3600.0,
        description="How long a job runner holds a job without renewing its lease (renewed "
        "every third of it). A replica that dies loses its jobs to the others after this long; "
        "a restarted `tunehub serve` resumes its interrupted job after it too.",
    )
    replica_id: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9._-]{1,64}$",
        description="A stable name for this replica (e.g. its host or pod name), unique among "
        "the replicas sharing the database: restarted, it takes back its interrupted jobs at "
        "once instead of waiting TUNEHUB_LEASE_SECS for their leases to expire.",
    )
    db_outage_secs: float = Field(
        default=120.0,
        gt=0,
        description="How long a running job keeps its results in memory while the database "
        "cannot be reached; longer, and they go to the result journal (TUNEHUB_JOURNAL_MAX_"
        "BYTES) until it is back.",
    )
    journal_max_bytes: int = Field(
        default=64 << 20,
        ge=0,
        description="Size limit of the result journal ($TUNEHUB_HOME/journal/results.jsonl): "
        "results measured while the database is away past TUNEHUB_DB_OUTAGE_SECS wait there, "
        "fsynced, and are stored when it is back (also after a restart). 0: no journal (the "
        "job fails after the outage limit).",
    )
    health_check_secs: float = Field(
        default=10.0, gt=0, description="How often the runner checks the build dir and database."
    )
    min_free_bytes: int = Field(
        default=256 << 20,
        ge=0,
        description="Free space the build dir needs; below it the service is degraded.",
    )
    build_cache_max_bytes: int = Field(
        default=4 << 30,
        ge=0,
        description="Size of the kernel build cache; least recently used entries are evicted "
        "above it (0: no limit).",
    )

    @field_validator("fair_share_weights", mode="before")
    @classmethod
    def _weights(cls, value: object) -> object:
        if not isinstance(value, str):
            return value
        weights: dict[str, object] = {}
        for part in (p.strip() for p in value.split(",")):
            if not part:
                continue
            name, sep, weight = part.rpartition("=")
            if not sep or not name.strip():
                raise ValueError(f"{part!r} is not name=weight")
            weights[name.strip()] = weight.strip()
        return weights

    @field_validator("fair_share_weights")
    @classmethod
    def _positive_weights(cls, value: dict[str, float]) -> dict[str, float]:
        for name, weight in value.items():
            if not weight > 0:
                raise ValueError(f"the weight of {name!r} must be > 0, got {weight!r}")
        return value

    @property
    def fair_share(self) -> FairShare:
        return FairShare(
            window_secs=self.fair_share_window_secs, weights=dict(self.fair_share_weights)
        )

    @field_validator("allowed_hosts", "cors_origins", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

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
