"""Probe: where a compile's time goes inside Inductor, by function, for the default and the
tunehub backend (issue 25's compile-time target).

Runs ``benchmarks/compile_models.py`` with its arguments, except that each worker process first
wraps a few functions of torch and Triton that a compile may spend its time in, outermost calls
only, and adds ``funcs`` ({name: [calls, secs]}) to its result: Triton compiles in this process,
the mutation analysis of user-defined Triton kernels (which generates TTIR each time), the
launcher build, and the kernels handed to Inductor's compile workers.

    python benchmarks/probes/compile_funcs.py --home /tmp/cm --skip-tune --models vit \
        --cases b64 --contenders default,tunehub --repeats 2 --warm --out probe.json
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import compile_models

FUNCS = (
    ("torch._higher_order_ops.triton_kernel_wrap", "identify_accessed_tensors"),
    ("torch._higher_order_ops.triton_kernel_wrap", "identify_mutated_tensors"),
    ("torch._higher_order_ops.triton_kernel_wrap", "generate_ttir"),
    ("triton", "compile"),
    ("triton.compiler.compiler", "compile"),
    ("torch._inductor.async_compile", "AsyncCompile.triton"),
    ("torch._inductor.async_compile", "AsyncCompile.wait"),
    ("torch._inductor.runtime.triton_heuristics", "CachingAutotuner.precompile"),
    ("torch._inductor.runtime.triton_heuristics", "CachingAutotuner._make_launchers"),
    ("triton.runtime.build", "compile_module_from_src"),
    ("triton.backends.nvidia.driver", "compile_module_from_src"),
)


def wrap_all() -> dict[str, list[float]]:
    spent: dict[str, list[float]] = {}
    depth = [0]
    for module_name, qualname in FUNCS:
        try:
            owner: Any = importlib.import_module(module_name)
        except ImportError:
            continue
        *parents, name = qualname.split(".")
        for parent in parents:
            owner = getattr(owner, parent)
        inner = getattr(owner, name, None)
        if inner is None:
            continue
        label = f"{module_name}.{qualname}"
        spent[label] = [0, 0.0]

        def timed(*args: Any, __inner: Any = inner, __label: str = label, **kwargs: Any) -> Any:
            depth[0] += 1
            start = time.perf_counter()
            try:
                return __inner(*args, **kwargs)
            finally:
                depth[0] -= 1
                spent[__label][0] += 1
                spent[__label][1] += time.perf_counter() - start

        setattr(owner, name, timed)
    return spent


def count_pool_answers() -> dict[str, int]:
    """How often Inductor asked whether its compile workers are ready, by answer."""
    from torch._inductor.async_compile import AsyncCompile

    answers = {"ready": 0, "not_ready": 0}
    inner = AsyncCompile.use_process_pool.__func__  # type: ignore[attr-defined]

    def use_process_pool(cls: Any) -> Any:
        ready = inner(cls)
        answers["ready" if ready else "not_ready"] += 1
        return ready

    AsyncCompile.use_process_pool = classmethod(use_process_pool)  # type: ignore[assignment]
    return answers


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        if os.environ.get("PROBE_NO_MEMO") == "1":  # the backend as it was before the memo
            import contextlib

            import tunehub.client.triton_op

            tunehub.client.triton_op.one_analysis_per_kernel = contextlib.nullcontext
        spent = wrap_all()
        pool = count_pool_answers()
        keys: list[str] = []
        import tunehub.client.triton_op as op

        key_of = op._analysis_key

        def logged(*args: Any) -> Any:
            key = key_of(*args)
            keys.append(repr(key)[:600] if key is not None else f"None for {args[0]!r}"[:200])
            return key

        op._analysis_key = logged
        result = compile_models.worker(json.loads(sys.argv[2]))
        result["funcs"] = spent
        from torch._inductor import config

        result["funcs"]["pool"] = {**pool, "compile_threads": config.compile_threads}
        result["funcs"]["keys"] = keys
        print(json.dumps(result))
        return 0
    compile_models.__file__ = __file__  # its workers run here, wrapped
    processes: list[dict[str, Any]] = []
    run_in = compile_models._run_in

    def recorded(*args: Any, **kwargs: Any) -> dict[str, Any]:
        result = run_in(*args, **kwargs)
        keys = ("model", "case", "contender", "compile_secs", "compile_phases", "funcs", "error")
        processes.append({k: result.get(k) for k in keys})
        return result

    compile_models._run_in = recorded
    code = compile_models.main()
    for process in processes:  # in the order they ran: a cold process, then its warm one
        print("PROCESS " + json.dumps(process))
    return code


if __name__ == "__main__":
    raise SystemExit(main())
