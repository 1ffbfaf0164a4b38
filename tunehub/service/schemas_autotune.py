"""API payloads of the shared autotuning results (``/api/v1/autotune``)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from tunehub.core.autotune import CACHE_KEY_PATTERN, MAX_CONFIGS

Timing = Annotated[list[Annotated[float, Field(ge=0)]], Field(min_length=1, max_length=8)]


class AutotuneRequest(BaseModel):
    """A kernel's autotuning result, uploaded under the sha256 of ``key_doc``."""

    model_config = ConfigDict(
        extra="forbid",
        allow_inf_nan=False,
        json_schema_extra={
            "examples": [
                {
                    "key_doc": {
                        "format": 1,
                        "kernel": {"name": "mymodule.add_kernel", "source_sha256": "…"},
                        "key_names": ["n"],
                        "key": [4096, "torch.float16"],
                        "configs": [{"kwargs": {"BLOCK": 64}, "num_warps": 4}],
                        "target": {"kind": "cuda", "name": "NVIDIA H100 80GB HBM3"},
                        "triton": "3.6.0",
                    },
                    "best_index": 0,
                    "timings_ms": [[0.012, 0.011, 0.013]],
                }
            ]
        },
    )

    key_doc: dict[str, Any] = Field(
        description="What the cache key is the sha256 of (canonical JSON: sorted keys, no "
        "whitespace): kernel source hash, tuning key, config list (`configs`), target, Triton "
        "version."
    )
    best_index: int = Field(ge=0, lt=MAX_CONFIGS, description="The winner in `key_doc.configs`.")
    timings_ms: list[Timing | None] = Field(
        max_length=MAX_CONFIGS,
        description="Per config, do_bench's quantiles in ms; null for a config that failed.",
    )


class AutotuneOut(BaseModel):
    cache_key: str = Field(pattern=CACHE_KEY_PATTERN, description="sha256 of `key_doc`.")
    kernel: str = Field(description="The kernel's name (module and qualified name).")
    key_doc: dict[str, Any] = Field(description="What the cache key is the sha256 of.")
    best_index: int = Field(description="The winner's index in `key_doc.configs`.")
    best_config: Any = Field(description="`key_doc.configs[best_index]`.")
    timings_ms: list[list[float] | None] = Field(
        description="Per config, do_bench's quantiles in ms; null for a config that failed."
    )
    created_at: datetime = Field(description="When it was first uploaded (UTC).")
