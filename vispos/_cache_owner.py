"""What an encoder that owns a :class:`~vispos._cache.TensorCache` shows and hands out.

:class:`CacheOwner` is the cache API every caching encoder shows its users (``cache_info()``,
``clear_cache()``, the ``cache_bytes`` budget); :func:`expand_batch` turns a cached unbatched
table into a batched result the caller owns (or, with ``zero_copy``, a shared broadcast view).

References:
    ``functools.lru_cache`` (``cache_info()``, ``cache_clear()``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._cache import CacheInfo, TensorCache, check_max_bytes

__all__ = ["CacheOwner", "expand_batch"]


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
