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

__all__ = ["TensorCache", "tracing"]


def tracing() -> bool:
    """True under torch.compile, torch.jit tracing/scripting or torch.export."""
    return bool(torch.compiler.is_compiling() or torch.jit.is_tracing() or torch.jit.is_scripting())


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
