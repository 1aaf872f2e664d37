"""Packages whose public names are imported on first use (PEP 562).

``import vispos`` and ``import vispos.app.data`` cost nothing until a name is used: the first
lookup of a name the package does not hold imports its modules (torch with them) and binds every
name of the package's ``__all__``, so afterwards the package holds exactly what an eager
``from .module import name`` list would have bound (its submodules included). This is what lets
the ``vispos`` command parse its arguments and answer ``--help`` without importing torch.

References:
    PEP 562 (module ``__getattr__`` and ``__dir__``); SciPy's and scikit-image's lazy
    submodule loading.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Callable, MutableMapping, Sequence
from typing import Any

from ._suggest import did_you_mean, public_homes

__all__ = ["load_on_first_use"]


def load_on_first_use(
    namespace: MutableMapping[str, Any], modules: Sequence[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's ``__getattr__`` and ``__dir__`` that import ``modules`` on first use.

    Use in a package's ``__init__.py`` after its ``__all__``::

        __getattr__, __dir__ = load_on_first_use(globals(), [".images", ".volumes"])

    Args:
        namespace (MutableMapping[str, Any]): the package's ``globals()``; must hold
            ``__name__`` and ``__all__``.
        modules (Sequence[str]): modules imported on first use, relative to the package
            (``".images"``); each name of ``__all__`` is bound from the first that has it.

    Returns:
        tuple: ``(__getattr__, __dir__)``. ``__getattr__(name)`` imports the modules (once),
        binds the names of ``__all__`` in ``namespace`` and returns ``name``; a submodule not
        yet imported (``package.padding``) is imported alone and returned, as
        ``import package.padding`` would; dunder names are answered without importing
        anything. ``__dir__()`` lists the bound names and ``__all__``.

    Raises:
        AttributeError: (from ``__getattr__``) ``name`` is not in the package once loaded, with
            the message Python gives for a missing module attribute, then where the name lives
            when a public submodule exports it (``vispos.TimmBackbone``: in
            ``vispos.backbones``), else the nearest public names (:mod:`vispos._suggest`).
        ImportError: (from ``__getattr__``) a module cannot be imported.
    """
    package = namespace["__name__"]

    def _load() -> None:
        loaded = [importlib.import_module(m, package) for m in modules]
        for name in namespace["__all__"]:
            if name in namespace:
                continue
            for module in loaded:
                if name in vars(module):  # bound there (a module's deprecated aliases are not)
                    namespace[name] = vars(module)[name]
                    break

    def __getattr__(name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            pass
        elif name not in namespace["__all__"] and importlib.util.find_spec(f"{package}.{name}") is not None:
            # a submodule (``from . import _masks`` asks for it while the API is loading): that
            # module alone, as ``import package.name`` would
            return importlib.import_module(f"{package}.{name}")
        else:
            _load()
            if name in namespace:
                return namespace[name]
        raise AttributeError(f"module {package!r} has no attribute {name!r}{_hint(name)}")

    def _hint(name: str) -> str:
        """Where ``name`` lives instead (a public submodule's ``__all__``), else the nearest public
        names; nothing for private names (tools probe ``_repr_html_`` and the like)."""
        if name.startswith("_"):
            return ""
        folder = os.path.dirname(namespace.get("__file__") or "")
        homes = public_homes(package, folder, name) if folder else []
        if homes:
            return f"; it is in {' and '.join(homes)}: from {homes[0]} import {name}"
        near = did_you_mean(name, namespace["__all__"])
        return f"; {near}" if near else ""

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(namespace["__all__"]))

    return __getattr__, __dir__
