"""``tunehub.triton.autotune``: ``triton.autotune`` whose results are shared by every process on
machines of the same GPU target, through the service's autotune cache.

The kernel never leaves the user's process. When a tuning key (Triton's: the ``key=`` argument
values and the dtypes of the tensor arguments) is met for the first time, the results are
looked for in this process's memory, then on disk (``<cache dir>/autotune/<cache key>.json``),
then in the service (``GET /api/v1/autotune/<cache key>``); only when none has them are the
configs benchmarked locally, exactly as Triton does (``do_bench``, the same pruning and
hooks), and the result is written to memory, disk and, with a write key
(``$TUNEHUB_API_KEY``), the service (``$TUNEHUB_URL``, the client's default
``http://127.0.0.1:8000``; empty or ``$TUNEHUB_OFFLINE=1``: none). A service that is down or
slow costs one bounded request and never an exception: tuning then goes on locally as
Triton's would.

The cache key is the sha256 of a document holding everything that can change the answer: the
kernel's source (and Triton's own hash of it and the functions it calls), the tuning key's
values and names, the (pruned) config list with every field of each config, the target (GPU
name, compute capability, SM count, CUDA, driver and Triton's backend hash; under the
interpreter, the CPU), the Triton version and Triton's cache-invalidating environment. The
document travels with the entry, and the service checks that it hashes to the key.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import logging
import os
import platform
import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

import triton
from triton.runtime.autotuner import Autotuner as _TritonAutotuner

from tunehub.client.gemm_choice import cache_dir
from tunehub.client.schedules import DEFAULT_URL, OFFLINE_ENV, URL_ENV
from tunehub.core.damped import DampedLog
from tunehub.core.keys import sha256_key

log = logging.getLogger(__name__)
# Both repeat for every call (a key nothing can describe) or every upload (a service that
# refuses them): said once, then counted once a minute.
_no_key = DampedLog(log)
_refused = DampedLog(log)

API_KEY_ENV = "TUNEHUB_API_KEY"
TIMEOUT_ENV = "TUNEHUB_AUTOTUNE_TIMEOUT_SECS"
DEFAULT_TIMEOUT_SECS = 2.0
KEY_FORMAT = 1

# Results this process has seen, by cache key (shared by every kernel of the process).
_MEMORY: dict[str, dict[str, Any]] = {}


def _interpreting() -> bool:
    return bool(triton.knobs.runtime.interpret)


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else str(value)
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return str(value)


def config_dict(config: triton.Config) -> dict[str, Any]:
    """Every field of a ``triton.Config`` that can change what runs."""
    hook = config.pre_hook
    return {
        "kwargs": {str(k): _jsonable(v) for k, v in sorted(config.kwargs.items())},
        "num_warps": config.num_warps,
        "num_stages": config.num_stages,
        "num_ctas": config.num_ctas,
        "maxnreg": config.maxnreg,
        "ir_override": _jsonable(getattr(config, "ir_override", None)),
        "pre_hook": _callable_identity(hook) if hook is not None else None,
    }


def _callable_identity(fn: Callable[..., Any]) -> dict[str, str]:
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        source = ""
    return {
        "name": f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', repr(fn))}",
        "source_sha256": hashlib.sha256(source.encode()).hexdigest(),
    }


def kernel_identity(fn: Any) -> dict[str, Any]:
    """The kernel's name, the sha256 of its source and, compiled (not interpreted), Triton's
    own cache key of it (which covers the @jit functions it calls)."""
    base = fn
    while not inspect.isfunction(base):
        base = base.fn
    try:
        source = inspect.getsource(base)
    except (OSError, TypeError):
        source = getattr(fn, "src", "")
    identity: dict[str, Any] = {
        "name": f"{base.__module__}.{base.__qualname__}",
        "source_sha256": hashlib.sha256(source.encode()).hexdigest(),
    }
    jit = fn
    while not isinstance(jit, triton.runtime.jit.JITFunction) and hasattr(jit, "fn"):
        jit = jit.fn
    if isinstance(jit, triton.runtime.jit.JITFunction):
        with contextlib.suppress(Exception):
            identity["triton_cache_key"] = str(jit.cache_key)
    return identity


@lru_cache(maxsize=8)
def _gpu_target(index: int) -> dict[str, Any]:
    import torch

    from tunehub.kernels.cuda_device import _driver_version

    props = torch.cuda.get_device_properties(index)
    doc: dict[str, Any] = {
        "kind": "cuda",
        "name": props.name,
        "compute_capability": f"{props.major}.{props.minor}",
        "sms": int(props.multi_processor_count),
        "cuda": str(torch.version.cuda or ""),
        "driver": _driver_version(),
    }
    with contextlib.suppress(Exception):
        from triton.compiler.compiler import make_backend
        from triton.runtime.driver import driver

        doc["backend"] = make_backend(driver.active.get_current_target()).hash()
    return doc


def target_doc() -> dict[str, Any]:
    """What ``target`` means in the cache key: the current GPU, or the CPU the interpreter
    runs on."""
    if _interpreting():
        from tunehub.core import local_cpu_target

        cpu = local_cpu_target()
        return {"kind": "triton-interpreter", "cpu": cpu.name, "machine": platform.machine()}
    import torch

    return _gpu_target(torch.cuda.current_device())


def _cache_env() -> list[list[str]]:
    try:
        from triton._C.libtriton import get_cache_invalidating_env_vars

        return [[str(k), str(v)] for k, v in sorted(get_cache_invalidating_env_vars().items())]
    except Exception:
        return []


def cpu_do_bench(fn: Callable[[], Any], quantiles: Sequence[float] | None = None) -> Any:
    """Wall-clock timing of ``fn`` in milliseconds (the interpreter has no CUDA events), with
    ``do_bench``'s return convention."""
    fn()
    times: list[float] = []
    deadline = time.perf_counter() + 0.05
    while len(times) < 3 or (time.perf_counter() < deadline and len(times) < 50):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    times.sort()
    if quantiles is None:
        return statistics.median(times)
    return [times[min(len(times) - 1, int(q * len(times)))] for q in quantiles]


class Autotuner(_TritonAutotuner):  # type: ignore[misc]
    """Triton's Autotuner with the cache of the module docstring. Counters: ``bench_runs``
    (configs benchmarked by this process) and ``sources`` (where each tuning key's config
    came from: ``memory``, ``disk``, ``service``, ``benchmark``)."""

    def __init__(
        self,
        fn: Any,
        arg_names: list[str],
        configs: list[triton.Config],
        key: list[str],
        reset_to_zero: list[str] | None,
        restore_value: list[str] | None,
        *,
        url: str | None = None,
        api_key: str | None = None,
        timeout_secs: float | None = None,
        **options: Any,
    ) -> None:
        super().__init__(fn, arg_names, configs, key, reset_to_zero, restore_value, **options)
        # Triton consults its own disk cache only when asked (and never when interpreting);
        # this one is always consulted.
        self.cache_results = True
        self.url = url
        self.api_key = api_key
        self.timeout_secs = timeout_secs
        self.bench_runs = 0
        self.sources: Counter[str] = Counter()
        self.last_cache_key: str | None = None

    @cached_property
    def do_bench(self) -> Any:
        if self._do_bench is None and _interpreting():
            return cpu_do_bench
        return super().do_bench

    def _bench(self, *args: Any, config: triton.Config, **meta: Any) -> Any:
        self.bench_runs += 1
        return super()._bench(*args, config=config, **meta)

    # --- the shared cache -------------------------------------------------------------------
    def key_document(
        self, tuning_key: tuple[Any, ...], configs: Sequence[triton.Config]
    ) -> dict[str, Any]:
        """What the cache key hashes (see the module docstring)."""
        return {
            "format": KEY_FORMAT,
            "kernel": kernel_identity(self.fn),
            "key_names": list(self.keys),
            "key": _jsonable(list(tuning_key)),
            "configs": [config_dict(c) for c in configs],
            "target": target_doc(),
            "triton": triton.__version__,
            "env": _cache_env(),
        }

    def check_disk_cache(
        self, tuning_key: Any, configs: list[triton.Config], bench_fn: Callable[[], None]
    ) -> bool:
        try:
            doc = self.key_document(tuple(tuning_key), configs)
            cache_key = sha256_key(doc)
        except Exception as exc:  # a key that cannot be described: tune as Triton would
            _no_key.warning("tunehub autotune: no cache key for %s: %s", self.base_fn.__name__, exc)
            self.sources["benchmark"] += 1
            bench_fn()
            return False
        self.last_cache_key = cache_key
        found, source = self._find(cache_key, doc)
        if found is not None:
            index = int(found["best_index"])
            self.cache[tuning_key] = configs[index]
            self.configs_timings = {
                c: t for c, t in zip(configs, found["timings_ms"], strict=True) if t is not None
            }
            self.sources[source] += 1
            return True
        bench_fn()
        self.sources["benchmark"] += 1
        best = self.cache[tuning_key]
        entry = {
            "key_doc": doc,
            "best_index": next(i for i, c in enumerate(configs) if c is best),
            "timings_ms": [_timings(self.configs_timings.get(c)) for c in configs],
        }
        _MEMORY[cache_key] = entry
        _write_disk(cache_key, entry)
        self._upload(cache_key, entry)
        return False

    def _find(self, cache_key: str, doc: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
        entry = _MEMORY.get(cache_key)
        if entry is not None:
            return entry, "memory"
        for source, read in (("disk", _read_disk), ("service", self._download)):
            entry = read(cache_key)
            if entry is not None and _valid(entry, doc):
                _MEMORY[cache_key] = entry
                if source == "service":
                    _write_disk(cache_key, entry)
                return entry, source
        return None, ""

    def _service(self) -> tuple[str, str, float]:
        url = self.url if self.url is not None else os.environ.get(URL_ENV, DEFAULT_URL)
        if os.environ.get(OFFLINE_ENV, "").lower() in ("1", "true", "yes"):
            url = ""
        key = self.api_key if self.api_key is not None else os.environ.get(API_KEY_ENV, "")
        timeout = self.timeout_secs
        if timeout is None:
            timeout = float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_SECS))
        return url.rstrip("/"), key, timeout

    def _download(self, cache_key: str) -> dict[str, Any] | None:
        url, key, timeout = self._service()
        if not url:
            return None
        import httpx

        try:
            response = httpx.get(
                f"{url}/api/v1/autotune/{cache_key}",
                headers={"X-API-Key": key} if key else {},
                timeout=timeout,
            )
        except httpx.HTTPError as exc:
            log.info("tunehub autotune: service unreachable (%s); tuning locally", exc)
            return None
        if response.status_code != 200:
            if response.status_code != 404:
                log.info("tunehub autotune: service answered %s", response.status_code)
            return None
        try:
            data = response.json()
        except ValueError:
            return None
        return data if isinstance(data, dict) else None

    def _upload(self, cache_key: str, entry: dict[str, Any]) -> None:
        url, key, timeout = self._service()
        if not url:
            return
        if not key:
            log.info("tunehub autotune: no %s, results of %s kept local", API_KEY_ENV, cache_key)
            return
        import httpx

        try:
            response = httpx.put(
                f"{url}/api/v1/autotune/{cache_key}",
                json=entry,
                headers={"X-API-Key": key},
                timeout=timeout,
            )
        except httpx.HTTPError as exc:
            log.info("tunehub autotune: upload failed (%s)", exc)
            return
        if response.status_code not in (200, 201):
            _refused.warning(
                "tunehub autotune: upload refused (%s): %s",
                response.status_code,
                response.text[:300],
            )


def _timings(value: Any) -> list[float] | None:
    """do_bench's answer as a JSON list; None for a config that failed (inf)."""
    if value is None:
        return None
    values = list(value) if isinstance(value, list | tuple) else [value]
    floats = [float(v) for v in values]
    if not floats or any(v != v or v == float("inf") for v in floats):
        return None
    return floats


def _valid(entry: dict[str, Any], doc: dict[str, Any]) -> bool:
    """An entry whose document is this one and whose best index names one of its configs."""
    try:
        index = entry["best_index"]
        return (
            sha256_key(entry["key_doc"]) == sha256_key(doc)
            and isinstance(index, int)
            and 0 <= index < len(doc["configs"])
            and len(entry["timings_ms"]) == len(doc["configs"])
        )
    except (KeyError, TypeError):
        return False


def _disk_path(cache_key: str) -> Path:
    return cache_dir() / "autotune" / f"{cache_key}.json"


def _read_disk(cache_key: str) -> dict[str, Any] | None:
    try:
        data = json.loads(_disk_path(cache_key).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_disk(cache_key: str, entry: dict[str, Any]) -> None:
    # Temp file and rename: a process reading concurrently sees the old file or the new one.
    path = _disk_path(cache_key)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(entry))
        os.replace(tmp, path)
    except OSError as exc:
        log.info("tunehub autotune: cannot write %s: %s", path, exc)
        with contextlib.suppress(OSError):
            tmp.unlink()


def autotune(
    configs: list[triton.Config],
    key: list[str],
    prune_configs_by: dict[str, Any] | None = None,
    reset_to_zero: list[str] | None = None,
    restore_value: list[str] | None = None,
    pre_hook: Callable[..., Any] | None = None,
    post_hook: Callable[..., Any] | None = None,
    warmup: int | None = None,
    rep: int | None = None,
    use_cuda_graph: bool = False,
    do_bench: Callable[..., Any] | None = None,
    cache_results: bool = False,
    *,
    url: str | None = None,
    api_key: str | None = None,
    timeout_secs: float | None = None,
) -> Callable[[Any], Autotuner]:
    """A drop-in for ``triton.autotune`` (same arguments, same meaning) that shares results
    through tunehub. ``url`` (default ``$TUNEHUB_URL``, else http://127.0.0.1:8000),
    ``api_key`` (default ``$TUNEHUB_API_KEY``, needed to upload) and ``timeout_secs`` (per
    request, default ``$TUNEHUB_AUTOTUNE_TIMEOUT_SECS`` or 2) name the service;
    ``cache_results`` is accepted and implied.

    >>> @autotune(configs=[triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 128})],
    ...           key=["n"])  # doctest: +SKIP
    ... @triton.jit
    ... def kernel(x_ptr, n, BLOCK: tl.constexpr): ...
    """
    del cache_results

    def decorator(fn: Any) -> Autotuner:
        return Autotuner(
            fn,
            fn.arg_names,
            configs,
            key,
            reset_to_zero,
            restore_value,
            pre_hook=pre_hook,
            post_hook=post_hook,
            prune_configs_by=prune_configs_by,
            warmup=warmup,
            rep=rep,
            use_cuda_graph=use_cuda_graph,
            do_bench=do_bench,
            url=url,
            api_key=api_key,
            timeout_secs=timeout_secs,
        )

    return decorator
