"""AutotuneResult: a user kernel's autotuning result (``tunehub.triton.autotune``), shared by
its cache key."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tunehub.core.errors import InvalidSpec
from tunehub.core.keys import sha256_key

CACHE_KEY_PATTERN = r"^[0-9a-f]{64}$"
MAX_CONFIGS = 1000
MAX_KERNEL_NAME = 256


@dataclass(frozen=True)
class AutotuneResult:
    """The configs a kernel was tuned over, which one won and every config's timings.

    ``key_doc`` is the document ``cache_key`` is the sha256 of (kernel source hash, tuning
    key values, the config list, target, Triton version; see
    ``tunehub.client.triton_autotune``); ``best_index`` indexes its ``configs``;
    ``timings_ms`` holds one entry per config (``do_bench``'s quantiles in milliseconds, or
    None for a config that failed). ``kernel`` is the kernel's name, for people.
    """

    cache_key: str
    key_doc: dict[str, Any]
    best_index: int
    timings_ms: tuple[tuple[float, ...] | None, ...]
    created_at: datetime
    api_key_id: int | None = None

    def __post_init__(self) -> None:
        problem = self.problem()
        if problem is not None:
            raise InvalidSpec(*problem)

    def problem(self) -> tuple[str, str] | None:
        """(field, reason) of what is wrong with the result, or None."""
        if not re.fullmatch(CACHE_KEY_PATTERN, self.cache_key):
            return "cache_key", "must be 64 lowercase hex digits (a sha256)"
        if sha256_key(self.key_doc) != self.cache_key:
            return "key_doc", "does not hash to the cache key (sha256 of its canonical JSON)"
        configs = self.key_doc.get("configs")
        if not isinstance(configs, list) or not 1 <= len(configs) <= MAX_CONFIGS:
            return "key_doc.configs", f"must be a list of 1 to {MAX_CONFIGS} configs"
        if not 0 <= self.best_index < len(configs):
            return "best_index", f"must index the {len(configs)} configs"
        if len(self.timings_ms) != len(configs):
            return "timings_ms", f"must hold one entry per config ({len(configs)})"
        if self.timings_ms[self.best_index] is None:
            return "timings_ms", "the best config has no timings"
        if not isinstance(self.kernel, str) or not self.kernel:
            return "key_doc.kernel.name", "must name the kernel"
        return None

    @property
    def kernel(self) -> str:
        kernel = self.key_doc.get("kernel")
        name = kernel.get("name") if isinstance(kernel, dict) else None
        return str(name)[:MAX_KERNEL_NAME] if name else ""

    @property
    def best_config(self) -> Any:
        return self.key_doc["configs"][self.best_index]

    def to_dict(self) -> dict[str, Any]:
        return {
            "cache_key": self.cache_key,
            "kernel": self.kernel,
            "key_doc": self.key_doc,
            "best_index": self.best_index,
            "best_config": self.best_config,
            "timings_ms": [list(t) if t is not None else None for t in self.timings_ms],
            "created_at": self.created_at.isoformat(),
        }
