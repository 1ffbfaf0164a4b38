"""AutotuneResult: a user kernel's autotuning result (``tunehub.triton.autotune``), shared by
its cache key."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tunehub.core.errors import InvalidSpec
from tunehub.core.keys import sha256_key

CACHE_KEY_PATTERN = r"^[0-9a-f]{64}$"
MAX_CONFIGS = 1000
MAX_KERNEL_NAME = 256
# Limits of a key document, checked before it is stored: a document past them could be stored
# but not answered (a deep one overflows every JSON encoder on the way out), and PostgreSQL
# refuses a NUL in text.
MAX_DOC_DEPTH = 32
MAX_DOC_BYTES = 512 * 1024


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
        content = document_problem(self.key_doc, "key_doc")
        if content is not None:
            return content
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


def document_problem(
    doc: Any, name: str, *, max_depth: int = MAX_DOC_DEPTH, max_bytes: int = MAX_DOC_BYTES
) -> tuple[str, str] | None:
    """(field, reason) of the first thing in the JSON document ``doc`` that cannot be stored
    and answered as it is, or None: nesting deeper than ``max_depth``, more than about
    ``max_bytes`` of JSON, a NUL or a lone surrogate in a string or key, a float that is not
    finite, or a value JSON does not have. Walks without recursion, so any depth is safe.

    >>> document_problem({"kernel": {"name": "k\\x00"}}, "key_doc")
    ('key_doc.kernel.name', 'holds a NUL byte')
    >>> document_problem({"a": [[[1]]]}, "key_doc", max_depth=3)
    ('key_doc.a', 'nested deeper than 3 levels')
    """
    size = 0
    stack: list[tuple[Any, str, int]] = [(doc, name, 0)]
    while stack:
        value, path, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth >= max_depth:  # named by its field, not by the dozens of levels below it
                return ".".join(path.split(".")[:2]), f"nested deeper than {max_depth} levels"
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                if isinstance(key, str):
                    why = _text_problem(key)
                    if why is not None:
                        return path, f"a key {why}"
                elif not isinstance(value, list):
                    return path, "keys must be strings"
                size += 2 + (len(key) if isinstance(key, str) else 1)
                stack.append((item, f"{path}.{key}" if isinstance(key, int) else
                              f"{path}.{_printable_key(key)}", depth + 1))  # fmt: skip
        elif isinstance(value, str):
            why = _text_problem(value)
            if why is not None:
                return path, why
            size += len(value) + 2
        elif isinstance(value, float):
            if not math.isfinite(value):
                return path, "must be a finite number"
            size += 24
        elif value is None or isinstance(value, bool | int):
            size += 20 if isinstance(value, int) else 5
        else:
            return path, f"must be a JSON value, not {type(value).__name__}"
        if size > max_bytes:
            return name, f"is larger than {max_bytes} bytes of JSON"
    return None


def _text_problem(text: str) -> str | None:
    if "\x00" in text:
        return "holds a NUL byte"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "holds a lone surrogate (not UTF-8)"
    return None


def _printable_key(key: str) -> str:
    return key if key.isprintable() and "." not in key else repr(key)[:40]
