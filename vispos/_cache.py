"""The one cache behind every encoder: a small, bounded, thread-safe LRU of derived tensors.

What holds (tested in ``tests/test_cache.py``):

* **Bounded.** A cache keeps at most ``maxsize`` entries *and* at most ``max_bytes`` bytes
  (:data:`DEFAULT_MAX_BYTES`, 8 MiB, unless the owner says otherwise). The bytes of an entry are
  its storage plus the copy of the ``content`` tensor (a mask) it is keyed on. An entry larger
  than the budget is never stored; inserting one that fits evicts the least recently used
  entries until both bounds hold again. Changing ``maxsize`` or ``max_bytes`` evicts at once.
* **No aliasing by default.** :meth:`TensorCache.get` with ``copy=True`` (the default) returns a
  tensor the caller owns: a fresh build that was not stored, or a copy of the stored entry. The
  stored tensors never leave the cache, so no write by any route (in place, ``.data``,
  ``.numpy()``, DLPack) can reach another call's result or a later hit. ``copy=False`` returns
  the stored tensor itself: the zero-copy opt-in of the encoders (``zero_copy=True``), whose
  results share storage between calls and must be treated as read-only. A write that bumps the
  version counter is still noticed there (the entry is rebuilt); writes through ``.data``,
  ``.numpy()`` or DLPack are not, and reach every later result.
* **Thread-safe.** Lookups, insertions, evictions and the counters are guarded by one lock per
  cache; builds run outside it (two threads missing the same key may both build; the results
  are equal).
* **Switchable.** :func:`caching` turns every cache off (or on) for the calls made inside a
  ``with`` block in the current thread; :func:`set_caching` sets the process-wide default.
  While off, every call builds afresh and nothing is stored or counted.

Entries are built outside autograd and outside inference mode (so a table first built under
``torch.inference_mode()`` can later serve a training step). Keys must hold everything that
changes the result (shape, device, dtype, parameters); an optional ``content`` tensor (a mask)
is compared by value. The cache is bypassed while compiling or tracing, and a pickled or
deep-copied owner starts empty.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Any, NamedTuple

import torch
from torch import Tensor

from ._checks import check_bool, check_int
from ._tracing import tracing

__all__ = [
    "DEFAULT_MAX_BYTES",
    "CacheInfo",
    "CacheOwner",
    "DerivedBuffers",
    "TensorCache",
    "caching",
    "check_max_bytes",
    "expand_batch",
    "is_caching_enabled",
    "set_caching",
    "tracing",
]

#: Default byte budget of one cache: 8 MiB. Enough for DETR's C5 embedding of a batch of four
#: 800x1333 images (256 channels, 4.1 MiB) or one unbatched 256-channel grid table up to about
#: 90x90 cells; a training loop whose sizes change every step holds no more than this per module.
DEFAULT_MAX_BYTES = 8 * 2**20


# ------------------------------------------------------------------------------ the switch
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
    check_bool(enabled, "enabled")
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
def caching(enabled: bool = False) -> Iterator[None]:
    """Context manager: every encoder cache on or off inside the block, in this thread.

    ``with vispos.caching(False): model(batch)`` runs a whole model without any encoder cache
    (nothing stored, served or counted); blocks nest, and other threads are not affected.

    Args:
        enabled (bool): the setting inside the block. Default False.

    Raises:
        TypeError: ``enabled`` is not a bool.

    Yields:
        None: the block runs with the setting; the previous one is restored on exit.

    References:
        ``torch.no_grad`` (the same thread-local, nestable pattern).
    """
    check_bool(enabled, "enabled")
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    stack.append(enabled)
    try:
        yield
    finally:
        stack.pop()


# ------------------------------------------------------------------------------ the cache
class CacheInfo(NamedTuple):
    """Statistics of a :class:`TensorCache`, as ``functools.lru_cache``'s ``cache_info()``.

    Attributes:
        hits (int): lookups served from the cache.
        misses (int): lookups that built the result (stored or not).
        maxsize (int): the entry bound.
        currsize (int): entries held now.
        maxbytes (int or None): the byte budget (None: unbounded).
        currbytes (int): bytes held now (entries plus the content tensors they are keyed on).

    Raises:
        Nothing: a plain named tuple, made by :meth:`TensorCache.info`.

    References:
        ``functools._CacheInfo`` (hits, misses, maxsize, currsize), with the byte fields added.
    """

    hits: int
    misses: int
    maxsize: int
    currsize: int
    maxbytes: int | None
    currbytes: int


def _check_maxsize(maxsize: object, name: str) -> int:
    return check_int(maxsize, name, minimum=0)


def check_max_bytes(max_bytes: object, name: str) -> int | None:
    """A byte budget: an int >= 0, or None for no bound (see :mod:`vispos._checks`)."""
    return check_int(max_bytes, name, minimum=0, optional=True)


def _nbytes(tensor: Tensor | None) -> int:
    if tensor is None:
        return 0
    try:
        return int(tensor.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):  # pragma: no cover - storage-less subclasses
        return tensor.numel() * tensor.element_size()


def _copy(tensor: Tensor) -> Tensor:
    """A new tensor with ``tensor``'s values and strides (dense tensors), sharing nothing."""
    return tensor.clone()


def expand_batch(table: Tensor, batch: int, *, shared: bool, zero_copy: bool) -> Tensor:
    """``table`` ``(1, ...)`` as a ``(batch, ...)`` result.

    ``zero_copy``: a broadcast view of ``table`` (stride 0 over the batch; shares its storage).
    Otherwise a tensor the caller owns: ``table`` itself when it is a fresh build that nobody
    else holds and ``batch == 1``, else a new contiguous tensor filled once.
    """
    if zero_copy:
        return table.expand(batch, *table.shape[1:])
    if batch == 1 and not shared:
        return table
    out = torch.empty((batch, *table.shape[1:]), dtype=table.dtype, device=table.device)
    return out.copy_(table.expand(out.shape))


class _Entry:
    __slots__ = ("tensor", "version", "content", "nbytes")

    def __init__(self, tensor: Tensor, content: Tensor | None) -> None:
        self.tensor = tensor
        self.version = tensor._version
        self.content = content
        self.nbytes = _nbytes(tensor) + _nbytes(content)


class TensorCache:
    """Bounded, thread-safe LRU of ``key -> Tensor``; see the module docstring for what holds.

    Args:
        maxsize (int): entries kept; 0 disables caching.
        max_bytes (int, optional): byte budget; :data:`DEFAULT_MAX_BYTES` (8 MiB) by default,
            None for no byte bound (only for tables whose size the owner fixes, as
            ``FixEncoding``'s), 0 disables caching.

    Raises:
        ValueError: ``maxsize`` or ``max_bytes`` < 0.
        TypeError: ``maxsize`` is not an int; ``max_bytes`` is not an int or None.

    References:
        ``functools.lru_cache`` (LRU order, ``cache_info()``).
    """

    def __init__(self, maxsize: int, max_bytes: int | None = DEFAULT_MAX_BYTES) -> None:
        self._maxsize = _check_maxsize(maxsize, "cache size")
        self._max_bytes = check_max_bytes(max_bytes, "max_bytes")
        self._lock = threading.RLock()
        self._entries: OrderedDict[Hashable, _Entry] = OrderedDict()
        self._bytes = 0
        self._hits = 0
        self._misses = 0

    # ---------------------------------------------------------------------------- bounds
    @property
    def maxsize(self) -> int:
        """int: the entry bound; setting it evicts at once (0 empties and disables)."""
        return self._maxsize

    @maxsize.setter
    def maxsize(self, value: int) -> None:
        value = _check_maxsize(value, "cache size")
        with self._lock:
            self._maxsize = value
            self._evict()

    @property
    def max_bytes(self) -> int | None:
        """int or None: the byte budget; setting it evicts at once (0 empties and disables)."""
        return self._max_bytes

    @max_bytes.setter
    def max_bytes(self, value: int | None) -> None:
        value = check_max_bytes(value, "max_bytes")
        with self._lock:
            self._max_bytes = value
            self._evict()

    def _evict(self) -> None:
        """Drops least recently used entries until both bounds hold (lock held)."""
        while self._entries and (
            len(self._entries) > self._maxsize
            or (self._max_bytes is not None and self._bytes > self._max_bytes)
        ):
            _, entry = self._entries.popitem(last=False)
            self._bytes -= entry.nbytes

    def _enabled(self) -> bool:
        return self._maxsize > 0 and self._max_bytes != 0 and is_caching_enabled() and not tracing()

    # ---------------------------------------------------------------------------- lookups
    def get(
        self,
        key: Hashable,
        build: Callable[[], Tensor],
        content: Tensor | None = None,
        *,
        copy: bool = True,
    ) -> Tensor:
        """The tensor for ``key`` (and ``content``'s values): served, or ``build()`` and stored.

        Args:
            key (hashable): everything that changes the result except ``content``.
            build (callable): makes the tensor (run without autograd, outside inference mode,
                when the result may be stored).
            content (Tensor, optional): compared by value on a hit (a copy is stored).
            copy (bool): True: a tensor the caller owns (never the stored one). False: the
                stored tensor itself (shared with every other ``copy=False`` call; read-only).

        Returns:
            Tensor: as ``build()`` returns it, or a copy.
        """
        tensor, stored = self.lookup(key, build, content)
        return _copy(tensor) if copy and stored else tensor

    def lookup(
        self, key: Hashable, build: Callable[[], Tensor], content: Tensor | None = None
    ) -> tuple[Tensor, bool]:
        """Like :meth:`get` with ``copy=False``, and says whether the tensor is the stored one.

        Returns:
            (Tensor, bool): the tensor, and True when it is held by the cache (so it must not
            be handed out unless the caller opted in to shared results), False when it is a
            fresh build that nobody else holds.
        """
        if not self._enabled():
            return build(), False
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                saved = entry.content
                if entry.tensor._version == entry.version and (
                    saved is None or (content is not None and torch.equal(saved, content))
                ):
                    self._entries.move_to_end(key)
                    self._hits += 1
                    return entry.tensor, True
                del self._entries[key]
                self._bytes -= entry.nbytes
            self._misses += 1
        with torch.inference_mode(False), torch.no_grad():
            tensor = build()
            saved = None if content is None else content.clone()
        entry = _Entry(tensor, saved)
        if self._max_bytes is not None and entry.nbytes > self._max_bytes:
            return tensor, False  # larger than the whole budget: never stored
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old.nbytes
            self._entries[key] = entry
            self._bytes += entry.nbytes
            self._evict()
        return tensor, True

    def clear(self) -> None:
        """Drops every entry; the hit and miss counters are kept (see :meth:`reset_info`)."""
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def reset_info(self) -> None:
        """Sets the hit and miss counters to 0."""
        with self._lock:
            self._hits = self._misses = 0

    def info(self) -> CacheInfo:
        """The current :class:`CacheInfo` (hits, misses, maxsize, currsize, maxbytes, currbytes)."""
        with self._lock:
            return CacheInfo(
                self._hits,
                self._misses,
                self._maxsize,
                len(self._entries),
                self._max_bytes,
                self._bytes,
            )

    # ----------------------------------------------------------------------- plumbing
    def __len__(self) -> int:
        return len(self._entries)

    def __getstate__(self) -> dict[str, Any]:
        return {"maxsize": self._maxsize, "max_bytes": self._max_bytes}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["maxsize"], state.get("max_bytes", DEFAULT_MAX_BYTES))

    def __deepcopy__(self, memo: dict) -> "TensorCache":
        return TensorCache(self._maxsize, self._max_bytes)


class CacheOwner:
    """The cache API every caching encoder shows, over the :class:`TensorCache` held in the
    attribute named by ``_cache_attr``: :meth:`cache_info`, :meth:`clear_cache` and the
    ``cache_bytes`` budget (assigning it evicts at once)."""

    _cache_attr = "_cache"

    def _owned_cache(self) -> TensorCache:
        return getattr(self, self._cache_attr)

    def clear_cache(self) -> None:
        """Drops every cached entry (they are rebuilt on demand)."""
        self._owned_cache().clear()

    def cache_info(self) -> CacheInfo:
        """Cache statistics, as ``functools.lru_cache``'s ``cache_info()``.

        Returns:
            CacheInfo: ``(hits, misses, maxsize, currsize, maxbytes, currbytes)``.
        """
        return self._owned_cache().info()

    @property
    def cache_bytes(self) -> int | None:
        """int or None: the cache's byte budget; assigning evicts at once."""
        return self._owned_cache().max_bytes

    @cache_bytes.setter
    def cache_bytes(self, value: int | None) -> None:
        self._owned_cache().max_bytes = check_max_bytes(value, "cache_bytes")


class DerivedBuffers:
    """Mixin for ``nn.Module``s whose non-persistent buffers are *derived* tables (frequency
    divisors, sinusoid rows): after every ``_apply`` (``.to()``, ``.cuda()``, ``.half()``,
    ``.to_empty()`` after meta-device construction, ...) the tables are rebuilt in float32 on
    their new device and the module's caches are emptied. So a ``.half()`` does not degrade the
    frequencies, ``to_empty`` does not leave uninitialised memory in them, and no cache hands
    out a tensor built before the move. On the meta device nothing is computed.

    Subclasses implement :meth:`_refresh_derived` (and list their caches in it).
    """

    def _refresh_derived(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _apply(self, fn, recurse=True):  # type: ignore[override]
        out = super()._apply(fn, recurse)  # type: ignore[misc]
        with torch.no_grad():
            self._refresh_derived()
        return out
