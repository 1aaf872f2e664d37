"""The one cache behind every encoder: a small LRU of derived tensors.

Entries are built outside autograd and outside inference mode (so a table first built under
``torch.inference_mode()`` can later serve a training step), and remember the tensor's version
counter, which every view of it shares: a table written in place by a caller is rebuilt rather
than handed out again. Keys must hold everything that changes the result (shape, device, dtype,
parameters); an optional ``content`` tensor (a mask) is compared by value. The cache is
bypassed while compiling or tracing, and a pickled or deep-copied owner starts empty.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

import torch
from torch import Tensor

from ._tracing import tracing

__all__ = ["DerivedBuffers", "TensorCache", "tracing"]


class TensorCache:
    """LRU of ``key -> Tensor`` that notices in-place writes (see the module docstring).

    Args:
        maxsize (int): entries kept; 0 disables caching.
    """

    def __init__(self, maxsize: int) -> None:
        if isinstance(maxsize, bool) or not isinstance(maxsize, int) or maxsize < 0:
            raise ValueError(f"cache size must be an int >= 0, got {maxsize!r}")
        self.maxsize = maxsize
        self._entries: OrderedDict[Hashable, tuple[Tensor, int, Tensor | None]] = OrderedDict()

    def get(self, key: Hashable, build: Callable[[], Tensor], content: Tensor | None = None) -> Tensor:
        """The cached tensor for ``key`` (and ``content``'s values), or ``build()`` stored."""
        if self.maxsize == 0 or tracing():
            return build()
        entry = self._entries.get(key)
        if entry is not None:
            tensor, version, saved = entry
            if tensor._version == version and (
                saved is None or (content is not None and torch.equal(saved, content))
            ):
                self._entries.move_to_end(key)
                return tensor
            del self._entries[key]
        with torch.inference_mode(False), torch.no_grad():
            tensor = build()
            saved = None if content is None else content.clone()
        self._entries[key] = (tensor, tensor._version, saved)
        while len(self._entries) > self.maxsize:
            self._entries.popitem(last=False)
        return tensor

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    def __getstate__(self) -> dict[str, Any]:
        return {"maxsize": self.maxsize}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.maxsize = state["maxsize"]
        self._entries = OrderedDict()

    def __deepcopy__(self, memo: dict) -> "TensorCache":
        return TensorCache(self.maxsize)


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
