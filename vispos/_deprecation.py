"""Deprecated names: old attributes, keyword arguments and modules that warn and still work.

A renamed public name keeps its old spelling for one release. Every use of the old spelling
raises a ``DeprecationWarning`` that names the new one, attributed to the caller's line (not to
vispos or to the import machinery), so Python's default filters show it in scripts and
``__main__`` and pytest shows it in tests. The forms:

* :func:`alias_getattr`: a module's ``__getattr__`` (PEP 562) serving old attribute names; the
  new home is named by a string and imported on first access, so an alias never makes its
  module import a room above it;
* :func:`renamed_kwargs`: a constructor or function decorator accepting an old keyword;
* :func:`warn_module`: a whole module kept at an old import path;
* :func:`renamed_attribute`: a property serving an attribute's old name (read and set);
  :class:`RenamedAttributes`, a base class that also moves an old name a subclass body sets
  (``n_spatial = 3``) to the new one.

Every alias is recorded in :data:`ALIASES` (filled when its module is imported), which the
tests read to check that each one warns and resolves to its new home.

References:
    PEP 562 (module ``__getattr__``); PEP 387 (backwards compatibility: a deprecation period
    with warnings before removal); NumPy and PyTorch deprecation practice (the warning names the
    replacement).
"""

from __future__ import annotations

import functools
import importlib
import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "ALIASES", "RenamedAttributes", "alias_getattr", "renamed_attribute", "renamed_kwargs", "warn",
    "warn_module",
]

#: ``(module, old name) -> "new.module:attr"`` for every deprecated attribute alias registered
#: so far (a module's aliases are registered when it is imported)
ALIASES: dict[tuple[str, str], str] = {}

_OWN_PREFIXES = ("<frozen importlib", __file__)


def warn(message: str, *, skip: tuple[str, ...] = ()) -> None:
    """Raises a ``DeprecationWarning`` with ``message``, attributed to the first caller outside
    vispos' deprecation machinery, importlib and the files in ``skip``."""
    prefixes = _OWN_PREFIXES + skip
    frame, level = sys._getframe(1), 2  # the caller of warn() is what stacklevel=2 names
    while frame is not None and frame.f_code.co_filename.startswith(prefixes):
        if not _importlib_frame(frame):  # warnings.warn does not count importlib's frames
            level += 1
        frame = frame.f_back
    warnings.warn(message, DeprecationWarning, stacklevel=level)


def _importlib_frame(frame: Any) -> bool:
    """The frames ``warnings.warn`` skips when it counts ``stacklevel`` (its own rule)."""
    name = frame.f_code.co_filename
    return "importlib" in name and "_bootstrap" in name


def alias_getattr(
    module: str, aliases: Mapping[str, str], fallback: Callable[[str], Any] | None = None
) -> Callable[[str], Any]:
    """A module ``__getattr__`` serving deprecated names.

    Args:
        module (str): the module's ``__name__``.
        aliases (mapping): old name -> ``"new.module:attr"`` (its new home).
        fallback (callable, optional): called with any other missing name (it must raise
            ``AttributeError`` for names it does not know).

    Returns:
        callable: ``__getattr__(name)``: the object at the new home, after a
        ``DeprecationWarning`` naming it; ``AttributeError`` for unknown names.
    """
    for old, new in aliases.items():
        ALIASES[(module, old)] = new

    def __getattr__(name: str) -> Any:
        target = aliases.get(name)
        if target is None:
            if fallback is not None:
                return fallback(name)
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        home, _, attr = target.partition(":")
        warn(f"{module}.{name} is deprecated and will be removed; use {home}.{attr} instead")
        return getattr(importlib.import_module(home), attr)

    __getattr__.__doc__ = f"Deprecated names of :mod:`{module}` (PEP 562), each warning once per access."
    return __getattr__


def renamed_kwargs(**renames: str) -> Callable[[Callable], Callable]:
    """Decorator: keyword ``old=value`` still works as ``new=value`` (``renames`` maps old -> new),
    with a ``DeprecationWarning`` naming the new keyword. Passing both is a ``TypeError``.

    The signature seen by ``inspect`` (and the docs) is the new one; the renames are kept in
    the wrapper's ``__deprecated_kwargs__`` (so a config naming an old key still builds, and
    warns).
    """

    def decorate(func: Callable) -> Callable:
        owner = func.__qualname__.removesuffix(".__init__")

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            for old, new in renames.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(f"{owner}() got both {old}= (deprecated) and {new}=; pass {new}= only")
                    warn(f"{owner}({old}=...) is deprecated and will be removed; use {new}= instead")
                    kwargs[new] = kwargs.pop(old)
            return func(*args, **kwargs)

        wrapper.__deprecated_kwargs__ = dict(renames)  # read by vispos.config (old YAML keys)
        return wrapper

    return decorate


def warn_module(old: str, new: str) -> None:
    """Called at the top of a module kept at an old import path: a ``DeprecationWarning`` saying
    that ``old`` moved to ``new``, attributed to the line that imported it."""
    caller = sys._getframe(1)  # the old module itself: name its importer, unless it is run as a
    run_as_main = caller.f_globals.get("__name__") == "__main__"  # script (python -m old)
    skip = () if run_as_main else (caller.f_code.co_filename,)
    warn(f"{old} is deprecated and will be removed; import from {new} instead", skip=skip)


def renamed_attribute(old: str, new: str) -> property:
    """A property for a class body, ``old = renamed_attribute("old", "new")``: reading or setting
    ``obj.old`` reads or sets ``obj.new``, with a ``DeprecationWarning`` naming the new name."""

    def message(self: Any) -> str:
        return f"{type(self).__name__}.{old} is deprecated and will be removed; use .{new} instead"

    def fget(self: Any) -> Any:
        warn(message(self))
        return getattr(self, new)

    def fset(self: Any, value: Any) -> None:
        warn(message(self))
        setattr(self, new, value)

    fget.__deprecated_alias__ = fset.__deprecated_alias__ = new  # read by the vocabulary test
    return property(fget, fset, doc=f"Deprecated: :attr:`{new}`.")


class RenamedAttributes:
    """A base class whose ``_renamed`` (old name -> new name, in the class body) gives every old
    name a :func:`renamed_attribute`; a subclass body that still sets an old name (``n_spatial =
    3``) sets the new one instead, with a ``DeprecationWarning`` attributed to the class
    statement. Setting both is a ``TypeError``."""

    _renamed: Mapping[str, str] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for old, new in cls.__dict__.get("_renamed", {}).items():
            setattr(cls, old, renamed_attribute(old, new))
        for old, new in cls._renamed.items():
            value = cls.__dict__.get(old)
            if old in cls.__dict__ and not isinstance(value, property):
                if new in cls.__dict__:
                    raise TypeError(f"{cls.__qualname__} sets both {old} (deprecated) and {new}; set {new} only")
                warn(f"{cls.__qualname__}.{old} = ... is deprecated and will be removed; set {new} instead")
                delattr(cls, old)
                setattr(cls, new, value)
