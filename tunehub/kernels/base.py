"""Template: a kernel generator plus its search space, split into build (any CPU) and run (device).

The split follows TVM's Builder / Runner: ``build`` turns a config into an Artifact (generated
source compiled into a library, a Triton kernel compiled into the shared cache) and may run in
any build process, in parallel, ahead of timing; ``run`` loads the artifact on the device,
checks its output against a reference and times it, one candidate at a time per device. Both
are called inside sandbox processes (``tunehub.workers``): either may crash or hang, and the
worker survives.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from tunehub.core import Config, MeasureRequest, MeasureResult, MeasureStatus, Target, Workload
from tunehub.core.capabilities import Capabilities, Unsupported
from tunehub.kernels.space import Knob, SearchSpace


@dataclass(frozen=True)
class Artifact:
    """What ``Template.build`` made for one request: plain, picklable data that a build
    process hands to the device's run process.

    ``key`` identifies the built code (a hash of what went into it); ``path`` is what the run
    process loads (a shared library, a cache directory), ``data`` anything else the template
    needs to load it; ``environment`` is merged into the measurement's environment (compiler,
    flags, versions).
    """

    template: str
    key: str
    path: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    compile_secs: float = 0.0
    cached: bool = False
    environment: dict[str, Any] = field(default_factory=dict)


class BuildFailed(Exception):
    """``build`` could not make an artifact: the config is ``invalid`` for the target, or
    generating or compiling it failed (``build_error``). The message is the reason."""

    def __init__(
        self,
        status: MeasureStatus,
        message: str,
        *,
        compile_secs: float = 0.0,
        environment: dict[str, Any] | None = None,
    ) -> None:
        if status not in (MeasureStatus.INVALID, MeasureStatus.BUILD_ERROR):
            raise ValueError(f"a build fails as invalid or build_error, not {status.value}")
        super().__init__(message)
        self.status = status
        self.message = message
        self.compile_secs = compile_secs
        self.environment = dict(environment or {})

    def result(self) -> MeasureResult:
        return MeasureResult(
            self.status,
            error=self.message,
            compile_secs=self.compile_secs,
            environment=self.environment,
        )


@contextmanager
def compile_errors(start: float, *, invalid: tuple[type[Exception], ...] = ()) -> Iterator[None]:
    """A build's compile step: an exception of an ``invalid`` type becomes an ``invalid``
    BuildFailed with its message, any other a ``build_error`` with the compiler's text (its
    last 3,000 characters) and the seconds since ``start``."""
    try:
        yield
    except BuildFailed:
        raise
    except invalid as exc:
        raise BuildFailed(MeasureStatus.INVALID, str(exc)) from None
    except Exception as exc:  # Triton's CompilationError, an MLIR pass failure, ...
        text = f"{type(exc).__name__}: {exc}"
        raise BuildFailed(
            MeasureStatus.BUILD_ERROR, text[-3000:], compile_secs=time.perf_counter() - start
        ) from None


class DeviceContextLost(Exception):
    """``run`` saw the device's context break (a CUDA illegal memory access poisons it for
    the rest of the process): ``result`` is the candidate's verdict, and the run sandbox
    restarts before the next candidate."""

    def __init__(self, result: MeasureResult) -> None:
        super().__init__(result.error)
        self.result = result


@dataclass(frozen=True)
class TimingPolicy:
    """How ``run`` times a candidate: warm up, then repeats until ``min_secs`` in total, at
    most ``max_repeats`` of them (templates keep at least three where time allows)."""

    min_secs: float = 0.2
    max_repeats: int = 50

    def __post_init__(self) -> None:
        if not self.min_secs > 0:
            raise ValueError("min_secs must be positive")
        if self.max_repeats < 1:
            raise ValueError("max_repeats must be at least 1")


class Template(ABC):
    """A kernel family, e.g. ``"blis.gemm"``, ``"triton.gemm"``.

    Rules for every template: ``run`` checks the output against a reference on fresh random
    inputs into a NaN-poisoned buffer before timing, returns a MeasureResult whose status says
    how it ended, and never returns sentinel times. ``build`` raises BuildFailed rather than
    returning something unusable.
    """

    name: str
    version: int
    # "cpu" or "cuda": the kind of target this template's run() needs.
    device_kind: ClassVar[str] = "cpu"
    # A baseline template times a vendor library: its results are Baselines, never Schedules,
    # and it is not offered for tuning jobs.
    baseline: ClassVar[bool] = False
    # The baseline template a job of this template is compared against, if any.
    baseline_template: ClassVar[str | None] = None
    # The slowest speed worth waiting for, which sizes the measurer's run allowance.
    slowest_gflops: ClassVar[float] = 1.0

    # --- what it can do ----------------------------------------------------------------------
    @abstractmethod
    def capabilities(self, target: Target) -> Capabilities:
        """The workloads this template runs on ``target``."""

    def check(self, workload: Workload, target: Target) -> None:
        """Raise Unsupported (naming the field) if ``workload`` cannot run on ``target``.

        The default checks ``capabilities``; templates add what those cannot say.
        """
        if self.baseline:
            raise Unsupported(
                "template",
                f"{self.name} is a baseline: the vendor library tuned schedules are compared "
                "with; it is measured, not tuned",
            )
        self.capabilities(target).check(self.name, workload, target)

    def problem(self, workload: Workload, target: Target) -> Unsupported | None:
        """``check``'s complaint, or None."""
        try:
            self.check(workload, target)
        except Unsupported as exc:
            return exc
        return None

    # --- the space ---------------------------------------------------------------------------
    @abstractmethod
    def space(self, workload: Workload, target: Target) -> SearchSpace:
        """The knobs and constraints for this workload on this target."""

    @abstractmethod
    def default_config(self, workload: Workload, target: Target) -> Config:
        """A config that is always valid and reasonable, used when nothing is tuned."""

    def seed_configs(self, workload: Workload, target: Target) -> list[Config]:
        """Configs a search should measure first (the default; templates add model variants)."""
        return [self.default_config(workload, target)]

    def invalid_reason(self, workload: Workload, target: Target, config: Config) -> str | None:
        """Why ``config`` is not in the space (None if it is). Templates that can say more
        than "not in the space" (shared memory, registers) override this."""
        if self.space(workload, target).is_valid(config):
            return None
        return f"config is not in the space of {self.name}"

    # --- where and how it runs ---------------------------------------------------------------
    def cores_used(self, config: Config) -> int:
        """CPU cores ``run`` occupies while timing this config (its threads; 1 for a GPU
        kernel's launching thread). The measurer reserves them host-wide."""
        threads = config.typed_get("threads", 1)
        return max(1, threads)

    def run_allowance_secs(self, workload: Workload, timing: TimingPolicy) -> float:
        """How long ``run`` may take before the candidate is a ``timeout``: a fixed overhead,
        the timing itself, and six calls (check, warm-up, three repeats, slack) at
        ``slowest_gflops``. The measurer caps it with its per-candidate limit."""
        return 10.0 + 4 * timing.min_secs + 6 * workload.flops / (self.slowest_gflops * 1e9)

    # --- build and run -----------------------------------------------------------------------
    @abstractmethod
    def build(self, request: MeasureRequest, *, build_dir: Path) -> Artifact:
        """Generate and compile ``request.config`` (cached in ``build_dir``); BuildFailed if
        the config is invalid or does not compile. Runs in a build process, on a CPU core
        reserved for building, never on the cores being timed."""

    @abstractmethod
    def run(
        self, request: MeasureRequest, artifact: Artifact, *, timing: TimingPolicy
    ) -> MeasureResult:
        """Load ``artifact``, check it against the reference, and time it on the device."""

    def measure(
        self, request: MeasureRequest, *, build_dir: Path, timing: TimingPolicy
    ) -> MeasureResult:
        """Build then run in this process (for direct use; workers split the two)."""
        start = time.perf_counter()
        try:
            artifact = self.build(request, build_dir=build_dir)
        except BuildFailed as exc:
            failed = exc.result()
            return MeasureResult(
                failed.status,
                error=failed.error,
                compile_secs=failed.compile_secs or time.perf_counter() - start,
                environment=failed.environment,
            )
        return self.run(request, artifact, timing=timing)

    # --- baselines ---------------------------------------------------------------------------
    def baseline_configs(self, workload: Workload, target: Target) -> list[Config]:
        """(A baseline template:) the configs to measure for ``workload`` on ``target``."""
        return [self.default_config(workload, target)]

    def baseline_config(self, config: Config, workload: Workload, target: Target) -> Config:
        """(A tuned template:) the config of ``baseline_template`` that ``config`` is compared
        with, e.g. OpenBLAS with the same thread count. Default: the baseline's default."""
        return Config({"threads": config.typed_get("threads", 1)})

    def request_problem(self, request: MeasureRequest) -> str | None:
        """Why ``request`` cannot be measured by this template (None if it can)."""
        if request.template != self.name:
            return f"request is for template {request.template!r}, not {self.name!r}"
        if request.template_version != self.version:
            return (
                f"request is for {self.name} v{request.template_version}, this is v{self.version}"
            )
        if not self.baseline:
            problem = self.problem(request.workload, request.target)
            if problem is not None:
                return problem.reason
        return self.invalid_reason(request.workload, request.target, request.config)


class LibraryBaseline(Template):
    """A vendor library's call as a Baseline template: nothing to build, so ``build`` checks
    the request and names the library (``library_key``, plus ``library_environment``) in the
    artifact; ``run`` is the template's own."""

    baseline = True
    library_key: ClassVar[str]

    def build(self, request: MeasureRequest, *, build_dir: Path) -> Artifact:
        """Nothing to compile: the library is the vendor's. Checks the request only."""
        problem = self.request_problem(request) or self.capabilities(request.target).problem(
            self.name, request.workload, request.target
        )
        if problem:
            raise BuildFailed(MeasureStatus.INVALID, str(problem))
        return Artifact(
            template=self.name, key=self.library_key, environment=self.library_environment()
        )

    def library_environment(self) -> dict[str, Any]:
        """What the artifact records of the library (nothing unless a template says)."""
        return {}


class ThreadedCpuBaseline(LibraryBaseline):
    """A CPU library whose one knob is ``threads``, set for its timed calls."""

    device_kind = "cpu"

    def space(self, workload: Workload, target: Target) -> SearchSpace:
        return SearchSpace(knobs=(Knob("threads", tuple(range(1, max(1, target.cores) + 1))),))

    def default_config(self, workload: Workload, target: Target) -> Config:
        return Config({"threads": 1})

    def baseline_configs(self, workload: Workload, target: Target) -> list[Config]:
        """One thread and every core: the thread counts tuned CPU templates offer."""
        return [Config({"threads": n}) for n in sorted({1, max(1, target.cores)})]


class GpuLibraryBaseline(LibraryBaseline):
    """A GPU library: its timing occupies one core (the launching thread)."""

    device_kind = "cuda"

    def cores_used(self, config: Config) -> int:
        return 1


class Tf32GpuBaseline(GpuLibraryBaseline):
    """A GPU library whose one knob is ``allow_tf32`` (cuBLAS's TF32 switch for float32),
    set from the workload: the baseline runs what the workload allows."""

    def space(self, workload: Workload, target: Target) -> SearchSpace:
        return SearchSpace(knobs=(Knob("allow_tf32", (False, True)),))

    def default_config(self, workload: Workload, target: Target) -> Config:
        return Config({"allow_tf32": workload.allow_tf32})

    def baseline_configs(self, workload: Workload, target: Target) -> list[Config]:
        """cuBLAS with TF32 exactly when the workload allows it."""
        return [Config({"allow_tf32": workload.allow_tf32})]
