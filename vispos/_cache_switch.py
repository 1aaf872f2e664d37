"""The switch of every encoder cache: on or off process-wide, or for a ``with`` block in one thread.

The default is on. :func:`set_caching` sets the process-wide default; :func:`caching` overrides
it for the calls made inside a ``with`` block in the current thread (blocks nest, other threads
are not affected); :func:`is_caching_enabled` is what a cache asks before every lookup
(:class:`vispos._cache.TensorCache`). While off, every call builds afresh and nothing is stored,
remembered or counted.

References:
    ``torch.no_grad`` / ``torch.is_grad_enabled`` (the thread-local, nestable pattern);
    ``functools.lru_cache`` (``maxsize=0``: a cache that stores nothing).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from . import _deprecation
from ._checks import check_bool

__all__ = ["caching", "is_caching_enabled", "set_caching"]

_global_enabled = True
_local = threading.local()


def set_caching(enabled: bool) -> None:
    """Turns every encoder cache on or off, process-wide (the default is on).

    Args:
        enabled (bool): False: every call builds its result afresh; nothing is stored, served
            or counted. Entries already stored stay until evicted or cleared.

    Raises:
        TypeError: ``enabled`` is not a bool.

    References:
        ``functools.lru_cache`` (the behaviour of ``maxsize=0``).
    """
    global _global_enabled
    enabled = check_bool(enabled, "enabled")
    _global_enabled = enabled


def is_caching_enabled() -> bool:
    """Whether encoder caches are used by calls made now, in this thread.

    Returns:
        bool: the innermost :func:`caching` block of this thread, else the process-wide
        :func:`set_caching` setting.

    Raises:
        Nothing: it only reads the setting.

    References:
        ``torch.is_grad_enabled`` (the same thread-local reading).
    """
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else _global_enabled


@contextlib.contextmanager
def caching(enabled: bool | None = None) -> Iterator[None]:
    """Context manager: every encoder cache on (``caching(True)``) or off (``caching(False)``)
    inside the block, in this thread.

    ``with vispos.caching(False): model(batch)`` runs a whole model without any encoder cache
    (nothing stored, served or counted); ``with vispos.caching(True):`` turns them on inside a
    program that called ``set_caching(False)``. Blocks nest, and other threads are not affected.

    Args:
        enabled (bool): the setting inside the block. Not given: True, as the name reads, with a
            ``DeprecationWarning`` for one release, because before this release ``caching()``
            without an argument turned the caches *off*; pass it explicitly.

    Raises:
        TypeError: ``enabled`` is not a bool.

    Yields:
        None: the block runs with the setting; the previous one is restored on exit.

    References:
        ``torch.no_grad`` / ``torch.enable_grad`` (the same thread-local, nestable pattern).
    """
    if enabled is None:
        _deprecation.warn(
            "vispos.caching() without an argument now turns the caches ON (until this release it "
            "turned them off); write vispos.caching(False) for a block without caches, or "
            "vispos.caching(True) to silence this warning"
        )
        enabled = True
    enabled = check_bool(enabled, "enabled")
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    stack.append(enabled)
    try:
        yield
    finally:
        stack.pop()
