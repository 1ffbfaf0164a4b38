"""tunehub's Triton kernels compiled on a thread beside the compile that needs them.

Inductor compiles a graph's kernels in its compile workers once those are ready, and in the
compiling thread, one after another, until then. Its workers take 7.6-9.3 s to come up on a
16-core H200 machine (docs/benchmarks.md, "Where a compile's time goes"), longer than most first
compiles, so every kernel of those compiles in the compiling thread. tunehub's GEMM kernels are
the longest among them: a TMA kernel took about 1 s, and its gcc-built launcher 0.3 s more. A
process of tunehub's own would be ready no sooner: one that imported what a compile needs took
8.8-10.6 s to come up on a lent H100.

While a compile that planned one of tunehub's kernels runs, ``compiling_aside`` sends that
kernel to a thread: it compiles the kernel as Inductor's compile workers do (into Triton's
cache, from the source Inductor generated) and builds its launcher where the kernel needs the
gcc-built one (host TMA descriptors), while the compiling thread goes on with Inductor's own
kernels. The two threads share Python's lock, which a thread gives up while it waits on
ptxas or gcc (processes of their own) and in those parts of Triton's compile that release it.
When Inductor waits for its kernels, the kernel is readied for launch from Triton's cache, as
Inductor readies one its workers compiled.

The kernel compiles in the compiling thread, as Inductor would compile it, where the route
cannot help: when Inductor's own workers are ready, when Inductor compiles with one thread
only (it then takes each kernel as compiled when asked), under Triton's interpreter, and
whenever the thread fails the kernel (it is compiled again, so an error is Inductor's own).
``options={"compile_aside": False}`` turns the route off.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import re
import sys
import textwrap
import threading
import types
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

log = logging.getLogger(__name__)

# What ``compiling_aside`` did with tunehub's kernels in this process: "aside" (compiled on
# the thread), "here" (compiled as Inductor would: its workers were ready, or it compiles
# with one thread), "failed" (the thread failed it, and it compiled here).
STATS: Counter[str] = Counter()

_THREAD: ThreadPoolExecutor | None = None
_THREAD_LOCK = threading.Lock()


def _thread() -> ThreadPoolExecutor:
    global _THREAD
    with _THREAD_LOCK:
        if _THREAD is None:
            _THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tunehub-compile")
        return _THREAD


def is_tunehub_kernel(kernel_name: str, source_code: str) -> bool:
    """Whether Inductor's ``async_compile.triton(kernel_name, source_code)`` is for one of
    tunehub's kernels: a user-defined kernel named as a ``@triton.jit`` function of a loaded
    ``tunehub.kernels`` module (with or without Inductor's ``_<n>`` suffix) whose body the
    source holds."""
    if "custom_kernel=True" not in source_code:
        return False
    base = kernel_name
    stem, _, suffix = kernel_name.rpartition("_")
    bodies = _kernel_bodies()
    if base not in bodies and suffix.isdigit():
        base = stem
    body = bodies.get(base)
    return body is not None and body in source_code


def _kernel_bodies() -> dict[str, str]:
    """Each loaded tunehub kernel's name -> its source after the ``def`` line (the line
    Inductor may rename), escaped as Inductor escapes it."""
    bodies: dict[str, str] = {}
    for name, module in list(sys.modules.items()):
        if name.startswith("tunehub.kernels.") and module is not None:
            bodies.update(_module_bodies(module))
    return bodies


_MODULE_BODIES: dict[str, tuple[Any, dict[str, str]]] = {}


def _module_bodies(module: Any) -> dict[str, str]:
    seen = _MODULE_BODIES.get(module.__name__)
    if seen is not None and seen[0] is module:
        return seen[1]
    bodies: dict[str, str] = {}
    for value in list(vars(module).values()):
        fn = kernel_function(value)
        source = _function_source(fn) if fn is not None else None
        if fn is not None and source is not None:
            body = source.split("):\n", 1)[-1]
            bodies[fn.__name__] = body.replace("\\", "\\\\").replace("'''", "\\'\\'\\'")
    _MODULE_BODIES[module.__name__] = (module, bodies)
    return bodies


def kernel_function(kernel: Any) -> types.FunctionType | None:
    """The Python function of a tunehub Triton kernel (a ``@triton.jit`` function, an
    autotuned or interpreted one), or None for anything else."""
    fn = kernel
    while fn is not None and not isinstance(fn, types.FunctionType):
        fn = getattr(fn, "fn", None)
    if fn is None or fn is kernel or not fn.__module__.startswith("tunehub."):
        return None  # a plain function is not a kernel
    return fn


def kernel_source(kernel: Any) -> str | None:
    """A tunehub Triton kernel's source from its ``def`` on, or None for anything else."""
    fn = kernel_function(kernel)
    return _function_source(fn) if fn is not None else None


def _function_source(fn: types.FunctionType) -> str | None:
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        return None
    start = re.search(r"^def\s+\w+\s*\(", source, re.MULTILINE)
    return source[start.start() :] if start else None


@contextmanager
def compiling_aside(compile_kernel: Callable[[str, str], Any] | None = None) -> Iterator[None]:
    """While compiling: tunehub's kernels that Inductor would compile in the compiling thread
    compile on a thread of their own (see the module's doc), by ``compile_kernel(name,
    source)`` (``compile_warm``; the tests pass a double). Patches Inductor's
    ``AsyncCompile.triton`` meanwhile; nothing is patched where this torch's Inductor lacks
    what the route needs."""
    compile_kernel = compile_kernel or compile_warm
    try:  # what the route takes from Inductor, all of it present before anything is patched
        from torch._inductor import async_compile as inductor_async
        from torch._inductor import codecache

        for owner, name in (
            (inductor_async, "CompiledTritonKernels"),
            (inductor_async, "get_compile_threads"),
            (inductor_async.AsyncCompile, "use_process_pool"),
            (codecache, "LambdaFuture"),
            (codecache, "_load_triton_kernel_from_source"),
        ):
            getattr(owner, name)
    except (ImportError, AttributeError) as exc:
        log.debug("tunehub: kernels compile as Inductor compiles them: %s", exc)
        yield
        return
    klass = inductor_async.AsyncCompile
    original = klass.triton

    @functools.wraps(original)
    def triton(self: Any, kernel_name: str, source_code: str, device_str: str = "cuda") -> Any:
        if device_str != "cuda" or not is_tunehub_kernel(kernel_name, source_code):
            return original(self, kernel_name, source_code, device_str)
        if not _aside_possible(self, source_code):
            STATS["here"] += 1
            return original(self, kernel_name, source_code, device_str)
        STATS["aside"] += 1
        task = _thread().submit(compile_kernel, kernel_name, source_code)
        return _readied(self, original, task, kernel_name, source_code, device_str)

    setattr(klass, "triton", triton)  # noqa: B010 (a method patched, as mypy sees it)
    try:
        yield
    finally:
        setattr(klass, "triton", original)  # noqa: B010


def _aside_possible(compiler: Any, source_code: str) -> bool:
    from torch._inductor.async_compile import CompiledTritonKernels, get_compile_threads

    return (
        os.environ.get("TRITON_INTERPRET", "0") != "1"
        and get_compile_threads() > 1  # else Inductor takes every kernel as compiled at once
        and not compiler.use_process_pool()  # else Inductor's workers compile it
        and CompiledTritonKernels.get(source_code) is None
    )


def _readied(
    compiler: Any,
    original: Callable[..., Any],
    task: Future[Any],
    kernel_name: str,
    source_code: str,
    device_str: str,
) -> Any:
    """A future of the kernel ``task`` compiles, readied for launch here as Inductor readies a
    kernel its workers compiled (its launchers made, loading the binary from Triton's cache);
    the kernel compiled here as Inductor would if ``task`` failed."""
    import torch
    from torch._inductor import async_compile as inductor_async
    from torch._inductor.codecache import LambdaFuture
    from torch._inductor.virtualized import V

    getattr(inductor_async, "_compile_start", lambda: None)()
    compile_id = torch._guards.CompileContext.current_compile_id()
    is_backward = getattr(V.graph, "is_backward", False)
    key = inductor_async.CompiledTritonKernels.key(source_code)

    def result() -> Any:
        try:
            kernel = task.result()
        except Exception as exc:
            STATS["failed"] += 1
            log.info("tunehub: %s compiles in the compiling thread: %s", kernel_name, exc)
            here = original(compiler, kernel_name, source_code, device_str)
            return here.result() if hasattr(here, "result") else here
        kernel.set_compile_info(compile_id, is_backward)
        kernel.precompile(warm_cache_only=False, static_triton_bundle_key=key)
        return kernel

    return LambdaFuture(result, future=task)


def compile_warm(kernel_name: str, source_code: str) -> Any:
    """The kernel Inductor's ``source_code`` defines, compiled into Triton's cache as
    Inductor's compile workers compile it, and its launcher built where it takes host TMA
    descriptors (Inductor's static launcher does not, and Triton's own is built by gcc)."""
    from torch._inductor.codecache import _load_triton_kernel_from_source

    kernel = _load_triton_kernel_from_source(kernel_name, source_code)
    kernel.precompile(warm_cache_only=True)
    for compiled in getattr(kernel, "compile_results", []):
        binary = getattr(compiled, "kernel", None)
        signature = getattr(getattr(binary, "src", None), "signature", {}) or {}
        if binary is not None and any(str(k).startswith("tensordesc") for k in signature.values()):
            from triton.runtime.driver import driver

            driver.active.launcher_cls(binary.src, binary.metadata)  # built into Triton's cache
    return kernel
