"""The one cache behind every encoder: a small, bounded, thread-safe LRU of derived tensors.

What holds (tested in ``tests/test_cache.py``):

* **Admission on second sight.** A result is stored the second time its key is seen, not the
  first (:data:`ADMIT_AT`): a small key-only *doorkeeper* remembers the keys seen once (at most
  :data:`DOORKEEPER_FACTOR` times ``maxsize`` of them, least recently seen forgotten first; a
  content tensor is remembered by a hash of its bytes, never by a copy). A first-sight miss
  builds the result exactly as a disabled cache does and hands it to the caller: no copy, no
  store, no mask copy, nothing held. So a loop whose sizes change every call (multi-scale
  training) pays for the cache only a dictionary lookup, and fixed-size inference is served
  from the third call on. This is the doorkeeper of TinyLFU and the "cache on second hit" rule
  of content delivery networks; see ``docs/caching.md`` for the trade-offs.
* **Bounded.** A cache keeps at most ``maxsize`` entries *and* at most ``max_bytes`` bytes
  (:data:`DEFAULT_MAX_BYTES`, 8 MiB, unless the owner says otherwise). The bytes of an entry are
  its storage plus the copy of the ``content`` tensor (a mask) it is keyed on. An entry larger
  than the budget is never stored; inserting one that fits evicts the least recently used
  entries until both bounds hold again. Changing ``maxsize`` or ``max_bytes`` evicts at once.
  The doorkeeper holds keys only (host-side tuples and ints), at most ``4 * maxsize`` of them.
* **No aliasing by default.** :meth:`TensorCache.get` with ``copy=True`` (the default) returns a
  tensor the caller owns: a fresh build that was not stored, or a copy of the stored entry. The
  stored tensors never leave the cache, so no write by any route (in place, ``.data``,
  ``.numpy()``, DLPack) can reach another call's result or a later hit. ``copy=False`` returns
  the stored tensor itself: the zero-copy opt-in of the encoders (``zero_copy=True``), whose
  results share storage between calls and must be treated as read-only. A write that bumps the
  version counter is still noticed there (the entry is rebuilt); writes through ``.data``,
  ``.numpy()`` or DLPack are not, and reach every later result.
* **Thread-safe.** Lookups, insertions, evictions, the doorkeeper and the counters are guarded
  by one lock per cache; builds run outside it (two threads missing the same key may both
  build; the results are equal).
* **Switchable.** :func:`~vispos._cache_switch.caching` turns every cache on or off for the
  calls made inside a ``with`` block in the current thread;
  :func:`~vispos._cache_switch.set_caching` sets the process-wide default
  (:mod:`vispos._cache_switch`). While off, every call builds afresh and nothing is stored,
  remembered or counted.

Entries are built outside autograd and outside inference mode (so a table first built under
``torch.inference_mode()`` can later serve a training step); a first-sight build runs in the
caller's mode, as with the cache off. Keys must hold everything that changes the result
(shape, device, dtype, parameters); an optional ``content`` tensor (a mask, in host memory) is
compared by value. The cache is bypassed while compiling or tracing, and a pickled or
deep-copied owner starts empty. What an encoder that owns a cache shows its users
(``cache_info()``, ``clear_cache()``, ``cache_bytes``) and how it hands out batched results is in
:mod:`vispos._cache_owner`.

References:
    Einziger, Friedman and Manes, TinyLFU: A Highly Efficient Cache Admission Policy, ACM
    Transactions on Storage 13(4), 2017 (the doorkeeper); Maggs and Sitaraman, Algorithmic
    Nuggets in Content Delivery, ACM SIGCOMM CCR 45(3), 2015 ("cache on second hit").
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, NamedTuple

import torch
from torch import Tensor

from ._cache_switch import is_caching_enabled
from ._checks import check_int
from ._tracing import tracing

__all__ = [
    "ADMIT_AT",
    "DEFAULT_MAX_BYTES",
    "DOORKEEPER_FACTOR",
    "CacheInfo",
    "TensorCache",
    "check_max_bytes",
]

#: Default byte budget of one cache: 8 MiB. Enough for DETR's C5 embedding of a batch of four
#: 800x1333 images (256 channels, 4.1 MiB) or one unbatched 256-channel grid table up to about
#: 90x90 cells; a training loop whose sizes change every step holds no more than this per module.
DEFAULT_MAX_BYTES = 8 * 2**20

#: Default admission: a result is stored on the second sighting of its key (1: on the first).
ADMIT_AT = 2

#: The doorkeeper remembers at most this many times ``maxsize`` keys seen fewer than
#: ``admit_at`` times: a key seen again within that many other first-sight misses is admitted.
DOORKEEPER_FACTOR = 4


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


def _fingerprint(content: Tensor) -> Hashable:
    """A hash of ``content``'s values, for the doorkeeper (never for a hit: a hit compares the
    stored copy by value). Host memory only: elsewhere reading the values would synchronise, and
    None stands for any content (a collision only admits a result one sighting early)."""
    if content.device.type != "cpu":
        return None
    return (content.dtype, tuple(content.shape), hash(content.detach().numpy().tobytes()))


def _copy(tensor: Tensor) -> Tensor:
    """A new tensor with ``tensor``'s values and strides (dense tensors), sharing nothing."""
    return tensor.clone()


class _Entry:
    __slots__ = ("tensor", "version", "content", "nbytes")

    def __init__(self, tensor: Tensor, content: Tensor | None) -> None:
        self.tensor = tensor
        self.version = tensor._version
        self.content = content
        self.nbytes = _nbytes(tensor) + _nbytes(content)


class TensorCache:
    """Bounded, thread-safe LRU of ``key -> Tensor`` with admission on second sight; see the
    module docstring for what holds.

    Args:
        maxsize (int): entries kept; 0 disables caching.
        max_bytes (int, optional): byte budget; :data:`DEFAULT_MAX_BYTES` (8 MiB) by default,
            None for no byte bound (only for tables whose size the owner fixes, as
            ``FixEncoding``'s), 0 disables caching.
        admit_at (int, keyword-only): the sighting of a key at which its result is stored:
            :data:`ADMIT_AT` (2, the default) stores it when the key is seen the second time;
            1 stores every miss (for an owner whose one key is known to repeat, as
            ``FixEncoding``'s table per device).

    Raises:
        ValueError: ``maxsize`` or ``max_bytes`` < 0; ``admit_at`` < 1.
        TypeError: ``maxsize`` or ``admit_at`` is not an int; ``max_bytes`` is not an int or
            None.

    References:
        ``functools.lru_cache`` (LRU order, ``cache_info()``); Einziger et al., TinyLFU, ACM
        ToS 2017 (the doorkeeper).
    """

    def __init__(
        self, maxsize: int, max_bytes: int | None = DEFAULT_MAX_BYTES, *, admit_at: int = ADMIT_AT
    ) -> None:
        self._maxsize = _check_maxsize(maxsize, "cache size")
        self._max_bytes = check_max_bytes(max_bytes, "max_bytes")
        self._admit_at = check_int(admit_at, "admit_at", minimum=1)
        self._lock = threading.RLock()
        self._entries: OrderedDict[Hashable, _Entry] = OrderedDict()
        #: the doorkeeper: keys (with a content hash) seen fewer than ``admit_at`` times -> count
        self._seen: OrderedDict[Hashable, int] = OrderedDict()
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

    @property
    def admit_at(self) -> int:
        """int: the sighting of a key at which its result is stored (1: every miss)."""
        return self._admit_at

    def _evict(self) -> None:
        """Drops least recently used entries (and doorkeeper keys) until the bounds hold (lock
        held)."""
        while self._entries and (
            len(self._entries) > self._maxsize
            or (self._max_bytes is not None and self._bytes > self._max_bytes)
        ):
            _, entry = self._entries.popitem(last=False)
            self._bytes -= entry.nbytes
        while len(self._seen) > DOORKEEPER_FACTOR * self._maxsize:
            self._seen.popitem(last=False)

    def _enabled(self, traced: bool | None = None) -> bool:
        """Whether this call may use the cache (``traced``: the caller's own answer to
        :func:`~vispos._tracing.tracing` for this call, so it is asked once; None: ask it)."""
        if not (self._maxsize > 0 and self._max_bytes != 0 and is_caching_enabled()):
            return False
        return not (tracing() if traced is None else traced)

    def _admit(self, key: Hashable, content: Tensor | None) -> bool:
        """One more sighting of ``key`` (and ``content``): True when it reaches ``admit_at``
        (the key then leaves the doorkeeper), else it is remembered and False."""
        if self._admit_at == 1:
            return True
        seen = (key, _fingerprint(content)) if content is not None else key
        with self._lock:
            count = self._seen.pop(seen, 0) + 1
            if count >= self._admit_at:
                return True
            self._seen[seen] = count  # most recently seen last
            self._evict()
            return False

    # ---------------------------------------------------------------------------- lookups
    def get(
        self,
        key: Hashable,
        build: Callable[[], Tensor],
        content: Tensor | None = None,
        *,
        copy: bool = True,
        traced: bool | None = None,
    ) -> Tensor:
        """The tensor for ``key`` (and ``content``'s values): served, or ``build()`` (and
        stored when admitted).

        Args:
            key (hashable): everything that changes the result except ``content``.
            build (callable): makes the tensor (run without autograd, outside inference mode,
                when the result is stored; in the caller's mode otherwise).
            content (Tensor, optional): compared by value on a hit (a copy is stored); in host
                memory (on another device the doorkeeper remembers ``key`` alone).
            copy (bool): True: a tensor the caller owns (never the stored one). False: the
                stored tensor itself (shared with every other ``copy=False`` call; read-only).
            traced (bool, optional): whether this call is traced, when the caller has already
                asked :func:`~vispos._tracing.tracing` (None: the cache asks; a traced call
                neither reads nor stores).

        Returns:
            Tensor: as ``build()`` returns it, or a copy.
        """
        tensor, stored = self.lookup(key, build, content, traced=traced)
        return _copy(tensor) if copy and stored else tensor

    def lookup(
        self,
        key: Hashable,
        build: Callable[[], Tensor],
        content: Tensor | None = None,
        *,
        traced: bool | None = None,
    ) -> tuple[Tensor, bool]:
        """Like :meth:`get` with ``copy=False``, and says whether the tensor is the stored one.

        Returns:
            (Tensor, bool): the tensor, and True when it is held by the cache (so it must not
            be handed out unless the caller opted in to shared results), False when it is a
            fresh build that nobody else holds (a miss not admitted, or too large to store).
        """
        if not self._enabled(traced):
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
                if entry.tensor._version != entry.version:  # written into: never served again
                    del self._entries[key]
                    self._bytes -= entry.nbytes
            self._misses += 1
        if not self._admit(key, content):
            return build(), False  # first sight: built as with the cache off, nothing kept
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
        """Drops every entry and every remembered key; the hit and miss counters are kept (see
        :meth:`reset_info`)."""
        with self._lock:
            self._entries.clear()
            self._seen.clear()
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
        return {"maxsize": self._maxsize, "max_bytes": self._max_bytes, "admit_at": self._admit_at}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(
            state["maxsize"],
            state.get("max_bytes", DEFAULT_MAX_BYTES),
            admit_at=state.get("admit_at", ADMIT_AT),
        )

    def __deepcopy__(self, memo: dict) -> "TensorCache":
        return TensorCache(self._maxsize, self._max_bytes, admit_at=self._admit_at)
