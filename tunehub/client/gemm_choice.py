"""Which kernel and config the compiler integrations run for one GEMM: looked up once per
shape, then answered from a dict; never raises into the caller.

The answer comes from ``tunehub.client.best`` (memory and disk cache, a deadline, a fallback
that never raises; ``$TUNEHUB_URL`` names the service), else from the template's analytical
default computed here. Every integration (``tunehub.triton.matmul``, the ``tunehub``
torch.compile backend) asks here, so a process looks each shape up once and afterwards pays a
dict lookup.

A lookup, the first of a process included, takes no longer than the client's deadline: what
it may need is made ahead of it. Importing this module starts, on a background thread, the
client and its connection to the service. The integrations whose calls may run a template's
default (``tunehub.triton.matmul``, the CPU ops) call ``ready_defaults`` when they are
imported: the templates, the default configs' code, a few hundred ms of imports, loaded on the
importing thread rather than on one beside the first lookup, which would hold the interpreter
lock in C for tens of ms at a time. The torch.compile backend does not: it takes measured
answers only, and a compile would pay the imports for nothing.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tunehub.client import schedules
from tunehub.core import Config, InvalidSpec, Target, Workload
from tunehub.core.damped import DampedLog

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)
# A service that sends answers this client cannot use sends them for every shape: said once,
# then counted once a minute.
_unusable = DampedLog(log)

URL_ENV = "TUNEHUB_URL"


def ready_defaults() -> None:
    """Load what a template's default config needs (the template registry) now, on this
    thread, so that a first call falling back to a default stays within its deadline."""
    schedules.load_templates()


@lru_cache(maxsize=1)
def interpreter_target() -> Target:
    """The target lookups use under Triton's interpreter (CPU tensors, no GPU): an Ampere-like
    device, so the template's defaults are its portable variants."""
    import triton

    return Target(
        kind="cuda",
        name="triton-interpreter",
        arch=("sm_80",),
        cores=3,
        toolchain={"triton": triton.__version__},
        properties={
            "compute_capability": 80,
            "smem_per_block_bytes": 166912,
            "regs_per_sm": 65536,
        },
    )


@lru_cache(maxsize=16)
def _cuda_target(index: int) -> Target:
    from tunehub.kernels.cuda_device import cuda_target

    return cuda_target(index)


def device_target(device: torch.device) -> Target:
    """The fingerprint lookups of tunehub's Triton templates are keyed by for tensors on
    ``device`` (CPU tensors: the interpreter's)."""
    if device.type == "cuda":
        import torch

        return _cuda_target(
            device.index if device.index is not None else torch.cuda.current_device()
        )
    return interpreter_target()


def allow_tf32(dtype: str, device_type: str) -> bool:
    """Whether a float32 GEMM may use TF32 here: torch's own setting, as torch.matmul reads."""
    import torch

    return dtype == "float32" and device_type == "cuda" and torch.backends.cuda.matmul.allow_tf32


def cache_dir() -> Path:
    """Where the integrations keep files (built CPU kernels, autotune results):
    ``$TUNEHUB_CACHE_DIR``, else the platform's user cache directory for tunehub."""
    explicit = os.environ.get("TUNEHUB_CACHE_DIR")
    if explicit:
        return Path(explicit)
    from tunehub.client.cache import default_cache_dir

    return default_cache_dir()


@dataclass(frozen=True)
class GemmChoice:
    """What to run: ``config`` of ``template`` (``source``: ``exact``, ``family``,
    ``predicted``, ``default`` as the service says, or ``local-default`` when no service
    answered), or the vendor library when ``use_library`` (the service measured it faster;
    ``library-fallback``: no config of the template runs here)."""

    template: str
    config: Config
    source: str
    use_library: bool = False
    detail: dict[str, Any] = field(default_factory=dict, compare=False)


# Raw fields rather than Workload.key: building and hashing a Workload per call would cost
# more than the GEMM of a decode step. The last entry is the operator's own fields (``bmm``'s
# batch, ...): empty for ``matmul``.
ChoiceKey = tuple[int, int, int, str, str, str, str, bool, str, str, tuple[Any, ...]]


def choice_key(workload: Workload, target: Target, template: str) -> ChoiceKey:
    w = workload
    return (
        w.m,
        w.n,
        w.k,
        w.dtype,
        w.a_layout,
        w.b_layout,
        w.epilogue,
        w.allow_tf32,
        target.target_key,
        template,
        () if w.op == "matmul" else (w.op, w.params),
    )


class GemmChooser:
    """Per-process memo of lookups, keyed by shape, dtype, layouts, epilogue, target and
    template. ``lookups`` counts the lookups actually made (tests and benchmarks read it)."""

    def __init__(self) -> None:
        self._answers: dict[ChoiceKey, GemmChoice] = {}
        self._lock = threading.Lock()
        self.lookups: Counter[str] = Counter()
        self.prefetched = 0  # of the lookups, those made in batches (``prefetch``)
        # Bumped whenever an answer given out may change (``demote``, ``clear``): what callers
        # built from answers (``tunehub.triton.matmul``'s bound launches) is stale past it.
        self.generation = 0
        # Ask the service to queue tuning for shapes it has no schedule for (needs a write
        # key, $TUNEHUB_API_KEY): the torch.compile backend's ``tune`` option, or
        # $TUNEHUB_TUNE_UNSEEN=1.
        self.tune = os.environ.get("TUNEHUB_TUNE_UNSEEN", "") in ("1", "true", "yes")

    def choose_shape(
        self,
        m: int,
        n: int,
        k: int,
        dtype: str,
        a_layout: str,
        b_layout: str,
        epilogue: str,
        allow_tf32: bool,
        target: Target,
        template: str,
    ) -> GemmChoice | None:
        """``choose`` from raw fields: a dict lookup once the shape is known (no Workload is
        built); None for a shape no Workload can describe (the caller runs the library)."""
        key = (
            m,
            n,
            k,
            dtype,
            a_layout,
            b_layout,
            epilogue,
            allow_tf32,
            target.target_key,
            template,
            (),
        )
        found = self._answers.get(key)
        if found is not None:
            return found
        try:
            workload = Workload(
                m=m,
                n=n,
                k=k,
                dtype=dtype,
                a_layout=a_layout,
                b_layout=b_layout,
                epilogue=epilogue,
                allow_tf32=allow_tf32,
            )
        except InvalidSpec:
            return None
        return self.choose(workload, target, template)

    def choose(self, workload: Workload, target: Target, template: str) -> GemmChoice:
        key = choice_key(workload, target, template)
        found = self._answers.get(key)
        if found is not None:
            return found
        answer = self._lookup(workload, target, template)
        with self._lock:
            return self._answers.setdefault(key, answer)

    def prefetch(self, workloads: list[Workload], target: Target, template: str) -> int:
        """Look the shapes not known yet up in one batch (``tunehub.client.best_many``: one
        round trip, one deadline), so a compiled graph's first run finds them in the memo.
        Returns how many were looked up; never raises."""
        missing: dict[ChoiceKey, Workload] = {}
        for workload in workloads:
            key = choice_key(workload, target, template)
            if key not in self._answers:
                missing.setdefault(key, workload)
        if not missing:
            return 0
        try:
            answers = schedules.best_many(
                list(missing.values()), target=target.target_key, template=template, tune=self.tune
            )
        except Exception as exc:  # the first run looks them up one by one instead
            log.info("tunehub batch lookup failed: %s", exc)
            return 0
        self.lookups[template] += len(missing)
        self.prefetched += len(missing)
        for (key, workload), answer in zip(missing.items(), answers, strict=True):
            choice = None
            try:
                choice = _from_answer(answer, template)
            except (KeyError, TypeError, ValueError) as exc:
                _unusable.warning("tunehub: unusable answer for %s: %s", workload.label, exc)
            if choice is None:
                choice = _local_default(workload, target, template)
            with self._lock:
                self._answers.setdefault(key, choice)
        return len(missing)

    def demote(self, workload: Workload, target: Target, template: str, why: str) -> GemmChoice:
        """Mark the looked-up config of this shape unusable here (it failed to launch): the
        template's default from now on, or the library if that is what failed."""
        key = choice_key(workload, target, template)
        old = self._answers.get(key)
        default = _default_config(workload, target, template)
        if default is None or old is None or old.use_library or old.config == default:
            new = GemmChoice(template, Config({}), "library-fallback", use_library=True)
        else:
            new = GemmChoice(template, default, "local-default")
        log.warning("tunehub: %s on %s: %s; now %s", workload.label, template, why, new.source)
        with self._lock:
            self._answers[key] = new
            self.generation += 1
        return new

    def clear(self) -> None:
        """Forget every answer (and the lookup counts)."""
        with self._lock:
            self._answers.clear()
            self.lookups.clear()
            self.prefetched = 0
            self.generation += 1

    def _lookup(self, workload: Workload, target: Target, template: str) -> GemmChoice:
        self.lookups[template] += 1
        try:
            answer = _ask_service(workload, target, template, self.tune)
        except Exception as exc:  # never into the compile: the default config serves
            log.info("tunehub lookup of %s failed: %s", workload.label, exc)
            answer = None
        if answer is not None:
            try:
                choice = _from_answer(answer, template)
            except (KeyError, TypeError, ValueError) as exc:
                _unusable.warning("tunehub: unusable answer for %s: %s", workload.label, exc)
            else:
                if choice is not None:
                    return choice
        return _local_default(workload, target, template)


def _local_default(workload: Workload, target: Target, template: str) -> GemmChoice:
    """The template's default config here, else the library."""
    default = _default_config(workload, target, template)
    if default is None:
        return GemmChoice(template, Config({}), "library-fallback", use_library=True)
    return GemmChoice(template, default, "local-default")


def _default_config(workload: Workload, target: Target, template: str) -> Config | None:
    """The template's default config for the workload here, or None when the template does not
    run it (then the library does)."""
    from tunehub.kernels.registry import get_template

    try:
        tmpl = get_template(template)
        if tmpl.problem(workload, target) is not None:
            return None
        return tmpl.default_config(workload, target)
    except Exception as exc:
        log.info("tunehub: no %s default for %s: %s", template, workload.label, exc)
        return None


def _from_answer(answer: Any, template: str) -> GemmChoice | None:
    """The choice an answer of ``tunehub.client.best`` (or the service's JSON) gives; None
    when it has no config to run and does not say the library is faster (a fallback for a
    target the client cannot compute defaults for, such as another machine's GPU): the
    caller's own default serves then."""
    data = answer if isinstance(answer, dict) else _answer_dict(answer)
    config = data.get("config")
    if data.get("template") not in (None, template):
        raise ValueError(f"answer is for template {data.get('template')!r}")
    if config is None:
        if data.get("fallback"):
            return None
        return GemmChoice(template, Config({}), str(data.get("source")), use_library=True)
    return GemmChoice(
        template=template,
        config=Config(dict(config)),
        source=str(data.get("source", "unknown")),
        use_library=bool(data.get("baseline_faster") or data.get("use_library")),
        detail={
            "fallback": bool(data.get("fallback")),
            "reason": data.get("reason", ""),
            "speedup_vs_baseline": data.get("speedup_vs_baseline"),
            "tuning_job_id": data.get("tuning_job_id"),
            # The schedule's time (confirmed where confirmed): how long the kernel runs.
            "median_secs": data.get("confirmed_median_secs") or data.get("median_secs"),
        },
    )


def _answer_dict(answer: Any) -> dict[str, Any]:
    """A ``tunehub.client.ScheduleAnswer`` as a dict of the fields used here."""
    data = {
        name: getattr(answer, name, None)
        for name in (
            "config",
            "template",
            "source",
            "use_library",
            "fallback",
            "reason",
            "speedup_vs_baseline",
            "tuning_job_id",
        )
    }
    schedule = getattr(answer, "schedule", None) or {}
    for name in ("median_secs", "confirmed_median_secs"):
        data[name] = schedule.get(name)
    return data


def _ask_service(workload: Workload, target: Target, template: str, tune: bool) -> Any:
    """The client's answer: cached in memory and on disk, bound by its deadline, never
    raising (``tunehub.client.best``; ``$TUNEHUB_URL`` names the service). The target is
    named by its key: ``local-cpu`` would be the service's own CPU, not this one."""
    return schedules.best(workload, target=target.target_key, template=template, tune=tune)


CHOOSER = GemmChooser()
# A compiler integration imported this: its client connects ahead of the first lookup.
schedules.warm_up()
# Which kernel each GEMM call of the integrations ran: "blis.gemm", "triton.gemm", or
# "library" (torch's own). Tests and benchmarks read it.
CALLS: Counter[str] = Counter()
