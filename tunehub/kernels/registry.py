"""The template registry: built-in templates, ``tunehub.templates`` entry points and plugin modules.

Plugin modules are named in ``$TUNEHUB_TEMPLATE_MODULES`` (comma-separated) and imported on
first use of the registry; each calls ``register`` at import. Sandbox processes inherit the
variable, which is how they find templates that live outside the package (e.g. test-only
ones). See ``tunehub.core.registry`` for the order the sources are read in.

>>> get_template("blis.gemm").name
'blis.gemm'
>>> "blis.gemm" in template_names()
True
"""

from __future__ import annotations

from tunehub.core.registry import Registry, UnknownName
from tunehub.kernels.base import Template
from tunehub.kernels.blis_bmm import BlisBmmTemplate
from tunehub.kernels.blis_conv import BlisConv2dTemplate
from tunehub.kernels.blis_gemm import BlisGemmTemplate
from tunehub.kernels.numpy_gemm import NumpyGemmBaseline
from tunehub.kernels.torch_attention import TorchSdpaBaseline
from tunehub.kernels.torch_bmm import TorchBmmBaseline
from tunehub.kernels.torch_conv import TorchConv2dBaseline, TorchConv2dGpuBaseline
from tunehub.kernels.torch_gemm import TorchMatmulBaseline
from tunehub.kernels.triton_attention import TritonAttentionTemplate
from tunehub.kernels.triton_bmm import (
    TorchBmmGpuBaseline,
    TorchGroupedMmBaseline,
    TritonBmmTemplate,
    TritonGroupedMmTemplate,
)
from tunehub.kernels.triton_conv import TritonConv2dTemplate
from tunehub.kernels.triton_gemm import TritonGemmTemplate

PLUGINS_ENV = "TUNEHUB_TEMPLATE_MODULES"

# Kept under its old name: callers catch a missing template as UnknownTemplate.
UnknownTemplate = UnknownName


def _as_template(loaded: object) -> Template:
    """An entry point names a Template subclass (instantiated here) or an instance."""
    item = loaded() if isinstance(loaded, type) else loaded
    if not isinstance(item, Template):
        raise TypeError(f"{loaded!r} is not a tunehub Template")
    return item


TEMPLATES: Registry[Template] = Registry(
    "tunehub.templates", kind="template", env_var=PLUGINS_ENV, coerce=_as_template
)


def register(template: Template) -> Template:
    """Make ``template`` available under ``template.name`` (replacing one of the same name)."""
    if not getattr(template, "name", ""):
        raise ValueError("a template needs a non-empty name")
    return TEMPLATES.register(template.name, template)


def get_template(name: str) -> Template:
    """The template registered as ``name``; UnknownTemplate (a KeyError) if none.

    ImportError (or whatever a plugin module raises) if a plugin module cannot be imported.
    """
    return TEMPLATES.get(name)


def template_names() -> tuple[str, ...]:
    """Names of all registered templates, sorted."""
    return TEMPLATES.names()


register(BlisGemmTemplate())
register(NumpyGemmBaseline())
register(TritonGemmTemplate())
register(TorchMatmulBaseline())
register(BlisBmmTemplate())
register(TorchBmmBaseline())
register(TritonBmmTemplate())
register(TorchBmmGpuBaseline())
register(TritonGroupedMmTemplate())
register(TorchGroupedMmBaseline())
register(TritonAttentionTemplate())
register(TorchSdpaBaseline())
register(BlisConv2dTemplate())
register(TorchConv2dBaseline())
register(TritonConv2dTemplate())
register(TorchConv2dGpuBaseline())
