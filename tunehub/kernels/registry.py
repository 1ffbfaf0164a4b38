"""The template registry: built-in templates and plugin modules, looked up by name.

Plugin modules are named in ``$TUNEHUB_TEMPLATE_MODULES`` (comma-separated) and imported on
first use of the registry; each calls ``register`` at import. This is how a sandbox process
finds templates that live outside the package (e.g. test-only ones).

>>> get_template("blis.gemm").name
'blis.gemm'
>>> "blis.gemm" in template_names()
True
"""

from __future__ import annotations

import importlib
import logging
import os
import threading

from tunehub.kernels.base import Template
from tunehub.kernels.blis_gemm import BlisGemmTemplate
from tunehub.kernels.numpy_gemm import NumpyGemmBaseline

log = logging.getLogger(__name__)

PLUGINS_ENV = "TUNEHUB_TEMPLATE_MODULES"

_templates: dict[str, Template] = {}
_loaded_plugins: set[str] = set()
_lock = threading.RLock()


class UnknownTemplate(KeyError):
    """No template is registered under the name. ``args[0]`` is a readable message."""

    def __init__(self, name: str, known: tuple[str, ...]) -> None:
        super().__init__(f"unknown template {name!r}; known: {', '.join(known) or 'none'}")
        self.name = name
        self.known = known

    def __str__(self) -> str:
        return str(self.args[0])


def register(template: Template) -> Template:
    """Make ``template`` available under ``template.name`` (replacing one of the same name)."""
    if not getattr(template, "name", ""):
        raise ValueError("a template needs a non-empty name")
    with _lock:
        if template.name in _templates and _templates[template.name] is not template:
            log.info("template %s replaced by %r", template.name, template)
        _templates[template.name] = template
    return template


def _load_plugins() -> None:
    """Import the modules named in $TUNEHUB_TEMPLATE_MODULES not imported yet."""
    names = [m.strip() for m in os.environ.get(PLUGINS_ENV, "").split(",") if m.strip()]
    with _lock:
        for module in names:
            if module in _loaded_plugins:
                continue
            importlib.import_module(module)  # a failing import raises again on the next lookup
            _loaded_plugins.add(module)
            log.debug("loaded template plugin module %s", module)


def get_template(name: str) -> Template:
    """The template registered as ``name``; UnknownTemplate (a KeyError) if none.

    ImportError (or whatever a plugin module raises) if a plugin module cannot be imported.
    """
    _load_plugins()
    with _lock:
        template = _templates.get(name)
        if template is None:
            raise UnknownTemplate(name, tuple(sorted(_templates)))
        return template


def template_names() -> tuple[str, ...]:
    """Names of all registered templates, sorted."""
    _load_plugins()
    with _lock:
        return tuple(sorted(_templates))


register(BlisGemmTemplate())
register(NumpyGemmBaseline())
