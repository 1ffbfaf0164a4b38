"""tunehub's GEMM answers inside Inductor's own generated code: a choices handler that, for each
``mm``/``addmm``/``bmm`` Inductor lowers on a GPU, offers exactly what tunehub measured fastest.

Inductor picks a GEMM's kernel at compile time (``select_algorithm``): the lowering of
``aten.mm``/``aten.addmm`` asks its *choices handler* (``V.choices``) for candidate kernels, and
when one candidate is left it takes it without benchmarking and emits it into the generated
wrapper like any of its own kernels. :class:`TunehubChoices` is that handler. Per GEMM site
(op, batch, M, N, K, dtype, layouts) it answers from the plan (:func:`plan_table`):

- ``template``: tunehub measured its ``triton.gemm`` ``tiled`` kernel (``triton.bmm`` for a
  ``bmm``) fastest with a config that Inductor's own Triton mm (bmm) template runs unchanged
  (same tile, group, warps, stages; no split-K, no composite tile, no K padding; for ``bmm``
  the batch outermost in the launch order, as Inductor's grid puts it): the one candidate is
  Inductor's template with that config, so Inductor fuses the bias, activations and whatever
  follows into its epilogue.
- ``aten``: tunehub measured the vendor library faster (or as fast): the one candidate is the
  library call Inductor's default makes (``extern_kernels.mm``/``addmm``).
- anything else (nothing measured for the site, the service unreachable, a winner Inductor's
  template cannot express): what Inductor would offer on its own in the mode the user asked
  for, so an untuned shape compiles exactly as without tunehub.

The plan is carried in Inductor's config (``lookup_table.table``, under keys of tunehub's own
that start with ``tunehub:``), so Inductor's FX graph cache keys compiled code by the answers
it was built from; sites not in it (backward GEMMs of a training graph, shapes first seen while
lowering) are looked up while lowering through the same per-process memo, within the client's
deadline.

Import only where torch is installed.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Generator, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from tunehub.client.gemm_choice import CHOOSER, GemmChoice

log = logging.getLogger(__name__)

TABLE_PREFIX = "tunehub:"
TEMPLATE = "triton.gemm"
# tunehub's template measured for each kind of site.
TEMPLATES = {"mm": TEMPLATE, "addmm": TEMPLATE, "bmm": "triton.bmm"}
# Sources of a lookup answer that rest on a measurement of this (workload, target family).
MEASURED = ("exact", "family")
# The template and library candidates Inductor's mm/bmm lowerings name (``KernelTemplate.uid``).
INDUCTOR_MM_TEMPLATE = "triton::mm"
INDUCTOR_TEMPLATE_UID = {"mm": INDUCTOR_MM_TEMPLATE, "addmm": INDUCTOR_MM_TEMPLATE,
                         "bmm": "triton::bmm"}  # fmt: skip
LIBRARY_UID = {"mm": "aten::mm", "addmm": "aten::addmm", "bmm": "aten::bmm"}
_DTYPES = {"torch.float16": "float16", "torch.bfloat16": "bfloat16", "torch.float32": "float32"}
# Config keys of triton.gemm that Inductor's mm template takes under the same names.
_TEMPLATE_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages")

# What the handler answered while lowering, by kind ("template", "aten", "inductor"); tests and
# benchmarks read it. ``SITES`` keeps the last answer per site key.
DECISIONS: Counter[str] = Counter()
SITES: dict[str, str] = {}


@dataclass(frozen=True)
class GemmSite:
    """One GEMM as Inductor lowers it: ``op`` (``mm``, ``addmm`` or ``bmm``), sizes, dtype and
    the layouts of A (M x K) and B (K x N), read off the strides; for ``bmm`` the ``batch`` and
    whether one B serves every entry (``b_broadcast``: batch stride 0). ``activation``
    (``relu``, ``gelu``): an ``addmm`` whose only user applies it, as the backend's graph
    shows (Inductor's lowering does not see it, so the key leaves it out): its measured
    workload is the fused one (``bias_gelu``), against the library with its separate pass."""

    op: str
    m: int
    n: int
    k: int
    dtype: str
    a_layout: str
    b_layout: str
    batch: int = 0
    b_broadcast: bool = False
    activation: str = "none"

    @property
    def key(self) -> str:
        batch = f"{self.batch}{'b' if self.b_broadcast else ''}x" if self.op == "bmm" else ""
        return (
            f"{TABLE_PREFIX}{self.op}:{batch}{self.m}x{self.n}x{self.k}:{self.dtype}:"
            f"{self.a_layout}:{self.b_layout}"
        )

    @property
    def epilogue(self) -> str:
        if self.op != "addmm":
            return "none"
        return "bias" if self.activation == "none" else f"bias_{self.activation}"

    def workload(self, allow_tf32: bool) -> Any:
        """The workload tunehub measured for this site (raises InvalidSpec for none)."""
        from tunehub.core import Workload

        bmm = self.op == "bmm"
        params = (("batch", self.batch), ("b_broadcast", self.b_broadcast)) if bmm else ()
        return Workload(
            op="bmm" if bmm else "matmul",
            m=self.m,
            n=self.n,
            k=self.k,
            dtype=self.dtype,
            a_layout=self.a_layout,
            b_layout=self.b_layout,
            epilogue=self.epilogue,
            allow_tf32=allow_tf32,
            params=params,
        )


def layout_of(rows: int, cols: int, strides: tuple[int, int]) -> str | None:
    """``row_major``/``col_major`` for a dense 2-D operand of that shape and strides (a size-1
    dimension's stride does not matter); None for anything else (no measured layout)."""
    s0, s1 = strides
    if (s1 == 1 or cols == 1) and (s0 == cols or rows == 1):
        return "row_major"
    if (s0 == 1 or rows == 1) and (s1 == rows or cols == 1):
        return "col_major"
    return None


def site_of(
    op: str,
    dtypes: tuple[Any, ...],
    shapes: tuple[tuple[int, ...], ...],
    strides: tuple[tuple[int, ...], ...],
) -> GemmSite | None:
    """The site of an Inductor ``mm``/``addmm``/``bmm`` from its inputs' dtypes, (hinted)
    sizes and strides, A and B being the last two inputs; None where tunehub has no GEMM of
    that kind (for ``bmm``: each entry dense, entries back to back, or B's batch stride 0)."""
    if op not in LIBRARY_UID or len(shapes) < 2:
        return None
    dtype = _DTYPES.get(str(dtypes[-1]))
    if dtype is None or str(dtypes[-2]) != str(dtypes[-1]):
        return None
    a_shape, b_shape = shapes[-2], shapes[-1]
    a_strides, b_strides = strides[-2], strides[-1]
    batch, broadcast = 0, False
    if op == "bmm":
        if len(a_shape) != 3 or len(b_shape) != 3 or a_shape[0] != b_shape[0]:
            return None
        batch = int(a_shape[0])
        (_, m, k), n = a_shape, b_shape[2]
        broadcast = batch > 1 and b_strides[0] == 0
        if batch > 1 and (a_strides[0] != m * k or (b_strides[0] != k * n and not broadcast)):
            return None
        a_shape, b_shape = a_shape[1:], b_shape[1:]
        a_strides, b_strides = a_strides[1:], b_strides[1:]
    if len(a_shape) != 2 or len(b_shape) != 2 or a_shape[1] != b_shape[0]:
        return None
    (m, k), n = a_shape, b_shape[1]
    if min(m, n, k) < 1 or (op == "bmm" and batch < 1):
        return None
    a_layout = layout_of(m, k, (a_strides[0], a_strides[1]))
    b_layout = layout_of(k, n, (b_strides[0], b_strides[1]))
    if a_layout is None or b_layout is None:
        return None
    return GemmSite(op, int(m), int(n), int(k), dtype, a_layout, b_layout, batch, broadcast)


def template_kwargs(config: Mapping[str, Any], k: int) -> dict[str, Any] | None:
    """The kwargs of Inductor's mm template that run ``config`` of ``triton.gemm``; None when
    that config is one the template cannot express (another variant, split-K, a composite
    tile, K padding)."""
    if config.get("variant") != "tiled" or int(config.get("SPLIT_K", 1)) != 1:
        return None
    if config.get("PAD_K") or config.get("FLATTEN"):
        return None
    if any(key not in config for key in _TEMPLATE_KEYS):
        return None
    kwargs = {key: int(config[key]) for key in _TEMPLATE_KEYS}
    for block in ("BLOCK_M", "BLOCK_N", "BLOCK_K"):
        size = kwargs[block]
        if size < 16 or size & (size - 1):  # composite tiles (96, 192, ...) are tunehub's own
            return None
    kwargs["EVEN_K"] = k % kwargs["BLOCK_K"] == 0
    return kwargs


def bmm_template_kwargs(config: Mapping[str, Any], k: int) -> dict[str, Any] | None:
    """The kwargs of Inductor's bmm template that run ``config`` of ``triton.bmm``: its tiles
    with the batch outermost (``BATCH_MAJOR``: Inductor's grid runs a batch entry's tiles
    together); None for the batch-interleaved order and the persistent TMA kernel, which that
    template has no way to run."""
    if config.get("BATCH_MAJOR") is not True or config.get("TMA", False):
        return None
    return template_kwargs({**config, "variant": "tiled", "SPLIT_K": 1}, k)


def site_template_kwargs(site: GemmSite, config: Mapping[str, Any]) -> dict[str, Any] | None:
    """The Inductor template kwargs that run ``config`` of the site's tunehub template."""
    if site.op == "bmm":
        return bmm_template_kwargs(config, site.k)
    return template_kwargs(config, site.k)


@dataclass(frozen=True)
class Decision:
    """What one site runs: ``kind`` is ``template`` (with ``kwargs`` for Inductor's mm
    template), ``aten`` (the library) or ``inductor`` (whatever Inductor would pick);
    ``why`` says so in words."""

    kind: str
    kwargs: Mapping[str, Any] | None = None
    why: str = ""

    def entry(self) -> list[dict[str, Any]]:
        """The plan's table entry (plain JSON-able data, part of Inductor's cache key)."""
        row: dict[str, Any] = {"template_id": self.kind, "why": self.why}
        if self.kwargs:
            row.update(self.kwargs)
        return [row]

    @classmethod
    def from_entry(cls, rows: list[dict[str, Any]]) -> Decision:
        row = dict(rows[0])
        kind = str(row.pop("template_id"))
        why = str(row.pop("why", ""))
        return cls(kind, row or None, why)


def decide(site: GemmSite, choice: GemmChoice | None) -> Decision:
    """What a site runs given tunehub's answer for it."""
    if choice is None:
        return Decision("inductor", why="no answer")
    if choice.source not in MEASURED:
        return Decision("inductor", why=f"not measured here ({choice.source})")
    if choice.use_library:
        return Decision("aten", why="the library measured faster")
    kwargs = site_template_kwargs(site, choice.config)
    if kwargs is None:
        return Decision(
            "inductor", why=f"winner {choice.config.get('variant')} is not Inductor's template"
        )
    return Decision("template", kwargs, why="tunehub's tuned config")


# Inductor's generated code launches a user-defined Triton kernel (the ops' kernels) through
# Triton's Python launcher, which costs host time Inductor's own kernels do not (an H200: a
# LLaMA decode step on such a kernel of 34 us ran at 0.87-0.96x of Inductor in plain
# launch, 1.02x under CUDA graphs). Without CUDA graphs a winner goes through the op only
# where its measured kernel runs at least this long, about 1.5x Triton's own launch of a
# GEMM on that machine (26 us host time a call, matmul_overhead-h200-20261126T1019.json), so
# the GPU stays busy while the host launches it.
PLAIN_LAUNCH_MIN_SECS = 40e-6


def hides_its_launch(choice: GemmChoice, *, graphs: bool) -> bool:
    """Whether a measured winner may run as a user-defined Triton kernel in Inductor's code:
    always where steps replay as CUDA graphs (``graphs``), in plain launch only where it was
    measured to run at least ``PLAIN_LAUNCH_MIN_SECS`` (no time known: no)."""
    return graphs or (choice.detail.get("median_secs") or 0.0) >= PLAIN_LAUNCH_MIN_SECS


def kernel_config(
    choice: GemmChoice | None, site: GemmSite, *, graphs: bool = True
) -> dict[str, Any] | None:
    """The config to run through tunehub's own op for a site (``tunehub::triton_gemm``, or
    ``tunehub::triton_bmm`` for a bmm: its kernel in Inductor's code) given its answer: one
    measured faster than the library whose winner Inductor's template cannot express and the
    op runs; else None. Without CUDA graphs (``graphs`` false) only a winner measured to run
    at least ``PLAIN_LAUNCH_MIN_SECS``."""
    if choice is None or choice.source not in MEASURED or choice.use_library:
        return None
    if site_template_kwargs(site, choice.config) is not None:
        return None  # Inductor's own template runs it, and fuses around it
    if not hides_its_launch(choice, graphs=graphs):
        return None
    if site.op == "bmm":
        from tunehub.client.triton_bmm_op import runs
    else:
        from tunehub.client.triton_op import runs

    config = dict(choice.config)
    return config if runs(config) else None


def lookup(site: GemmSite, device: Any) -> GemmChoice | None:
    """tunehub's answer for a site on ``device`` (memoised per process; never raises)."""
    try:
        from tunehub.client.gemm_choice import allow_tf32, device_target

        if site.op == "bmm":
            target = device_target(device)
            workload = site.workload(allow_tf32(site.dtype, device.type))
            return CHOOSER.choose(workload, target, TEMPLATES[site.op])
        return CHOOSER.choose_shape(
            site.m,
            site.n,
            site.k,
            site.dtype,
            site.a_layout,
            site.b_layout,
            site.epilogue,
            allow_tf32(site.dtype, device.type),
            device_target(device),
            TEMPLATE,
        )
    except Exception as exc:  # never into the compile: Inductor decides
        log.info("tunehub: no answer for %s: %s", site.key, exc)
        return None


def plan_table(sites: list[GemmSite], device: Any) -> dict[str, list[dict[str, Any]]]:
    """The plan's table for the sites of a graph: one batch lookup (``CHOOSER.prefetch``),
    then a decision per site."""
    if not sites:
        return {}
    try:
        from tunehub.client.gemm_choice import allow_tf32, device_target
        from tunehub.core import InvalidSpec

        target = device_target(device)
        by_template: dict[str, list[Any]] = {}
        for site in dict.fromkeys(sites):
            try:
                workload = site.workload(allow_tf32(site.dtype, device.type))
            except InvalidSpec:
                continue
            by_template.setdefault(TEMPLATES[site.op], []).append(workload)
        for template, workloads in by_template.items():
            CHOOSER.prefetch(workloads, target, template)
    except Exception as exc:  # the sites are looked up one by one while lowering
        log.info("tunehub: batch lookup failed: %s", exc)
    table: dict[str, list[dict[str, Any]]] = {}
    for site in dict.fromkeys(sites):
        entry = decide(site, lookup(site, device)).entry()
        if table.setdefault(site.key, entry) != entry:
            # Two sites Inductor lowers alike (one shape, another activation after each) were
            # answered apart: the lowering cannot tell them apart, so neither answer is taken.
            table[site.key] = Decision(
                "inductor", why="sites of this shape answered differently"
            ).entry()
    return table


class _Handler:
    """Builds the choices handler class on first use (it subclasses Inductor's, which needs
    torch._inductor imported)."""

    cls: type | None = None


def choices_class() -> type:
    """:class:`TunehubChoices`, a subclass of Inductor's ``InductorChoices``."""
    if _Handler.cls is not None:
        return _Handler.cls
    from torch._inductor import config as inductor_config
    from torch._inductor.choices import InductorChoices
    from torch._inductor.kernel_template_choice import KernelTemplateChoice
    from torch._inductor.select_algorithm import ExternKernelChoice
    from torch._inductor.template_heuristics.params import DictKernelTemplateParams

    class TunehubChoices(InductorChoices):
        """Inductor's choices, with tunehub's answer for each GPU ``mm``/``addmm``."""

        def __init__(self, *, autotune_rest: bool = False) -> None:
            super().__init__()
            # The user asked for max-autotune: sites tunehub has no answer for autotune as
            # Inductor would; otherwise they get Inductor's default (the library).
            self.autotune_rest = autotune_rest

        def _finalize_template_configs(
            self,
            template_choices: dict[str, Generator[Any, None, None]],
            kernel_inputs: Any,
            templates: list[Any],
            op_name: str,
            kwarg_overrides: dict[str, dict[str, Any]] | None = None,
        ) -> list[Any]:
            decision = self._decision(kernel_inputs, op_name)
            if decision.kind == "template":
                return self._template_choice(kernel_inputs, templates, op_name, decision)
            if decision.kind == "aten" or not self.autotune_rest:
                # The library call Inductor's default lowering makes, and nothing else.
                keep = _default_uids(op_name, templates)
                template_choices = {
                    uid: gen for uid, gen in template_choices.items() if uid in keep
                }
            return list(
                super()._finalize_template_configs(
                    template_choices, kernel_inputs, templates, op_name, kwarg_overrides
                )
            )

        def _decision(self, kernel_inputs: Any, op_name: str) -> Decision:
            try:
                device = kernel_inputs.device()
                if not _static(kernel_inputs):
                    # A kernel compiled for symbolic sizes serves every size: a config (and
                    # its EVEN_K) measured for one of them is not an answer for all.
                    return Decision("inductor", why="symbolic sizes")
                site = site_of(
                    op_name,
                    tuple(kernel_inputs.dtypes()),
                    tuple(tuple(int(d) for d in s) for s in kernel_inputs.shapes_hinted()),
                    tuple(tuple(int(d) for d in s) for s in kernel_inputs.strides_hinted()),
                )
            except Exception as exc:  # a kind of input this code does not know
                log.debug("tunehub: %s not planned: %s", op_name, exc)
                return Decision("inductor", why="unknown inputs")
            if site is None:
                return Decision("inductor", why="not a GEMM tunehub measures")
            if device.type != "cuda":
                SITES[site.key] = "inductor"
                return Decision("inductor", why="not a CUDA GEMM")
            table = inductor_config.lookup_table.table or {}
            rows = table.get(site.key)
            decision = Decision.from_entry(rows) if rows else decide(site, lookup(site, device))
            DECISIONS[decision.kind] += 1
            SITES[site.key] = decision.kind
            log.info("tunehub: %s -> %s (%s)", site.key, decision.kind, decision.why)
            return decision

        def _template_choice(
            self, kernel_inputs: Any, templates: list[Any], op_name: str, decision: Decision
        ) -> list[Any]:
            by_uid = {t.uid: t for t in templates}
            template = by_uid.get(INDUCTOR_TEMPLATE_UID[op_name])
            if template is None:
                if _template_offered_later(kernel_inputs, op_name, by_uid):
                    return []  # the template's own list carries the one candidate
                # Inductor offers no mm template for this site (e.g. it decomposes K):
                # the library, as its default would.
                return self._library(kernel_inputs, op_name)
            base = next(iter(self.get_ktc(kernel_inputs, template, op_name)), None)
            if base is None:
                return self._library(kernel_inputs, op_name)
            kwargs = {**base.params.to_kwargs(), **dict(decision.kwargs or {})}
            return [
                KernelTemplateChoice(
                    template=base.template,
                    params=DictKernelTemplateParams(kwargs),
                    extra_kwargs=base.extra_kwargs,
                    layout=base.layout,
                    inputs=base.inputs,
                )
            ]

        def _library(self, kernel_inputs: Any, op_name: str) -> list[Any]:
            from torch._inductor.kernel import bmm as inductor_bmm
            from torch._inductor.kernel import mm as inductor_mm

            library = {
                "mm": inductor_mm.aten_mm,
                "addmm": inductor_mm.aten_addmm,
                "bmm": inductor_bmm.aten_bmm,
            }[op_name]
            return list(self.get_ktc(kernel_inputs, library, op_name))

    def _template_offered_later(kernel_inputs: Any, op_name: str, by_uid: dict[str, Any]) -> bool:
        # Under max-autotune, Inductor's addmm asks for the library's candidates first and the
        # templates' in a later call: the first gets none, the later one the template.
        from torch._inductor.utils import use_triton_template

        return (
            op_name == "addmm"
            and LIBRARY_UID["addmm"] in by_uid
            and bool(inductor_config.max_autotune or inductor_config.max_autotune_gemm)
            and use_triton_template(kernel_inputs.output_layout(), check_max_autotune=False)
        )

    def _default_uids(op_name: str, templates: list[Any]) -> set[str]:
        primary = LIBRARY_UID.get(op_name)
        uids = {t.uid for t in templates if isinstance(t, ExternKernelChoice)}
        if primary is not None and primary in uids:
            return {primary}
        return uids

    _Handler.cls = TunehubChoices
    return TunehubChoices


def _static(kernel_inputs: Any) -> bool:
    """Whether every size and stride of the GEMM's inputs is a compile-time integer."""
    for dims in (*kernel_inputs.shapes_symbolic(), *kernel_inputs.strides_symbolic()):
        for dim in dims:
            if not isinstance(dim, int) and not getattr(dim, "is_Integer", False):
                return False
    return True


def with_choices(inner_compile: Callable[..., Any], *, autotune_rest: bool) -> Callable[..., Any]:
    """``inner_compile`` (Inductor's ``compile_fx_inner``) run with :class:`TunehubChoices` as
    the choices handler: the forward and, later and perhaps in another thread, the backward
    graph of a training step."""

    def compile_with_choices(*args: Any, **kwargs: Any) -> Any:
        with installed(autotune_rest=autotune_rest):
            return inner_compile(*args, **kwargs)

    return compile_with_choices


@contextmanager
def installed(*, autotune_rest: bool = False) -> Iterator[Any]:
    """:class:`TunehubChoices` as Inductor's choices handler in this thread, for the block."""
    from torch._inductor.virtualized import V

    handler = choices_class()(autotune_rest=autotune_rest)
    with V.set_choices_handler(handler):
        yield handler
