"""Registry: named plugins (templates, strategies) from built-ins, entry points and modules.

Every name tunehub offers lives in one Registry per kind of plugin. Three sources fill it, in
this order, later ones replacing earlier ones of the same name:

1. built-ins, registered by the package itself;
2. package entry points in the registry's group (``tunehub.templates``,
   ``tunehub.strategies``): a plugin package declares, in its ``pyproject.toml``::

       [project.entry-points."tunehub.templates"]
       "acme.gemm" = "acme_kernels:AcmeGemmTemplate"

   and each entry point loads to the object to register (or to a zero-argument factory);
3. modules named in an environment variable (comma-separated), imported on first use; each
   calls ``register`` at import. This override reaches sandbox processes, which inherit the
   environment (tests load test-only templates this way).

>>> reg: Registry[int] = Registry(
...     "test.numbers", kind="number", env_var="TUNEHUB_TEST_NUMBER_MODULES"
... )
>>> reg.register("one", 1)
1
>>> reg.get("one"), reg.names()
(1, ('one',))
>>> reg.get("two")
Traceback (most recent call last):
...
tunehub.core.registry.UnknownName: unknown number 'two'; known: one
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class UnknownName(KeyError):
    """No plugin is registered under the name. ``str()`` is a readable message."""

    def __init__(self, kind: str, name: str, known: tuple[str, ...]) -> None:
        super().__init__(f"unknown {kind} {name!r}; known: {', '.join(known) or 'none'}")
        self.kind = kind
        self.name = name
        self.known = known

    def __str__(self) -> str:
        return str(self.args[0])


class Registry(Generic[T]):
    """Name -> plugin object for one entry-point ``group``; thread-safe.

    ``coerce`` turns what an entry point loads into the registered object (e.g. instantiate a
    template class); it defaults to the identity.
    """

    def __init__(
        self,
        group: str,
        *,
        kind: str,
        env_var: str,
        coerce: Callable[[object], T] | None = None,
    ) -> None:
        self.group = group
        self.kind = kind
        self.env_var = env_var
        self._coerce = coerce
        self._items: dict[str, T] = {}
        self._lock = threading.RLock()
        self._entry_points_loaded = False
        self._modules_loaded: set[str] = set()

    def register(self, name: str, item: T) -> T:
        """Make ``item`` available under ``name`` (replacing one of the same name)."""
        if not name:
            raise ValueError(f"a {self.kind} needs a non-empty name")
        with self._lock:
            old = self._items.get(name)
            if old is not None and old is not item:
                log.debug("%s %s replaced by %r", self.kind, name, item)
            self._items[name] = item
        return item

    def _load(self) -> None:
        with self._lock:
            if not self._entry_points_loaded:
                self._entry_points_loaded = True
                for ep in entry_points(group=self.group):
                    try:
                        loaded = ep.load()
                        item = self._coerce(loaded) if self._coerce else loaded
                        self.register(ep.name, item)
                    except Exception:  # one broken plugin package must not hide the others
                        log.exception(
                            "%s entry point %s (%s) failed to load", self.kind, ep.name, ep.value
                        )
            names = [m.strip() for m in os.environ.get(self.env_var, "").split(",") if m.strip()]
            for module in names:
                if module not in self._modules_loaded:
                    importlib.import_module(module)  # a failing import raises again next time
                    self._modules_loaded.add(module)
                    log.debug("loaded %s plugin module %s", self.kind, module)

    def get(self, name: str) -> T:
        """The plugin registered as ``name``; UnknownName (a KeyError) if none.

        ImportError (or whatever a plugin module raises) if an override module cannot be
        imported.
        """
        self._load()
        with self._lock:
            try:
                return self._items[name]
            except KeyError:
                raise UnknownName(self.kind, name, tuple(sorted(self._items))) from None

    def names(self) -> tuple[str, ...]:
        """Every registered name, sorted."""
        self._load()
        with self._lock:
            return tuple(sorted(self._items))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self.names()
