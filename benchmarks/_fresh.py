"""New batches every call, for the benchmark rows of the loop as it runs (issue 23).

A training loop with multi-scale augmentation gives the position embedding a batch of new
sizes every step, so a persistent module's cache never sees an input twice. These helpers make
such batches for a workload: the same padded shape and the same padded axes per item as the
workload's own batch (so every call does the same work), other per-item sizes (so other cache
keys) and other random holes. They are built before a timed pass, never inside a timed call.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from vispos import NestedTensor

__all__ = ["FreshBatches", "FreshInputs", "arbitrary", "fresh_levels", "shrink"]


def arbitrary(mask: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """``mask`` with 5 % of its cells (seeded) turned into padding: an arbitrary mask."""
    g = torch.Generator().manual_seed(seed)
    holes = torch.rand(mask.shape, generator=g) < 0.05
    return (mask.cpu() | holes).to(mask.device)



class FreshBatches:
    """Batches of one workload that no module has seen: batch ``i`` is ``make(i)``, built before
    a timed pass (:meth:`FreshInputs.prepare`), never inside a timed call. Every batch has the
    workload's padded shape and the same padded axes per item as batch 0, so every call does
    the same work; only the per-item sizes (hence the cache keys) and the holes differ.

    ``make(i)`` returns ``{"nested": [level NestedTensors], "mask": [their masks], "arbitrary":
    [the masks with 5 % random holes]}``.
    """

    def __init__(self, make: Callable[[int], dict]) -> None:
        self._make = make
        self._items: dict[int, dict] = {}

    def ensure(self, stop: int) -> None:
        for i in range(stop):
            if i not in self._items:
                self._items[i] = self._make(i)

    def release(self, stop: int) -> None:
        for i in [i for i in self._items if i < stop]:
            del self._items[i]

    def get(self, i: int) -> dict:
        try:
            return self._items[i]
        except KeyError:
            raise RuntimeError(f"fresh batch {i} was not prepared before the call") from None


class FreshInputs:
    """One row's cursor over :class:`FreshBatches`: call ``n`` gets batch ``n`` (``kind`` of it),
    so every call of the row sees a batch it has never seen, and the cache-off row and the
    default-module row of one input kind see the same batches in the same order."""

    def __init__(self, batches: FreshBatches, kind: str) -> None:
        self.batches, self.kind, self.next = batches, kind, 0

    def prepare(self, calls: int) -> None:
        self.batches.ensure(self.next + calls)

    def __call__(self) -> list:
        item = self.batches.get(self.next)[self.kind]
        self.next += 1
        return item


#: a cycle of distinct batches must be longer than any module's cache (8 entries by default,
#: LRU) for a batch seen a cycle ago to be a miss again
MIN_CYCLE = 64


def _offsets(i: int, ranges: list[range]) -> list[int]:
    """The ``i``-th point of the grid ``ranges[0] x ranges[1] x ...`` (mixed radix, first fastest).
    Past the last point the grid starts again: a GPU runs thousands of calls per sample, more than
    a workload has size combinations, and a cache of fewer entries than the cycle never hits."""
    total = math.prod(len(r) for r in ranges)
    if i >= total and total < MIN_CYCLE:
        raise RuntimeError(f"fresh batch {i}: only {total} distinct size combinations in this workload "
                           f"(a cycle needs at least {MIN_CYCLE})")
    i %= total
    out = []
    for r in ranges:
        i, digit = divmod(i, len(r))
        out.append(r[digit])
    return out


def _nested_from_sizes(sizes, padded, device) -> NestedTensor:
    """A rectangular NestedTensor ``(B, 1, *padded)`` with item ``b`` valid on ``[0, sizes[b])``
    (its claims checked by the constructor, as a loader's batch would be)."""
    mask = torch.ones(len(sizes), *padded, dtype=torch.bool)
    for b, size in enumerate(sizes):
        mask[(b, *(slice(0, s) for s in size))] = False
    features = torch.zeros(len(sizes), 1, *padded)
    nt = NestedTensor(features, mask, [tuple(s) for s in sizes], rectangular=True)
    return nt.to(device)


def fresh_levels(images, strides, vary, device, scale: int = 1) -> FreshBatches:
    """Fresh batches of ``images`` (full-resolution sizes) seen at ``strides``. ``vary`` lists
    ``(items, ranges)``: batch ``i`` shrinks every item in ``items`` by ``scale`` times the
    ``i``-th offsets of ``ranges`` (one range per spatial axis; ``scale`` = the largest stride,
    so that every level's sizes change)."""
    ranges = [r for _, rs in vary for r in rs]
    n = len(images[0])

    def make(i: int) -> dict:
        offsets = iter(_offsets(i, ranges))
        sizes = [list(s) for s in images]
        for items, _ in vary:
            shrink = [scale * next(offsets) for _ in range(n)]
            for b in items:
                sizes[b] = [v - d for v, d in zip(sizes[b], shrink)]
        levels = []
        for stride in strides:
            padded = [math.ceil(max(s[a] for s in images) / stride) for a in range(n)]
            levels.append(_nested_from_sizes([[math.ceil(v / stride) for v in s] for s in sizes], padded, device))
        masks = [lv.mask for lv in levels]
        return {"nested": levels, "mask": masks, "arbitrary": [arbitrary(m, seed=1 + i) for m in masks]}

    return FreshBatches(make)


def shrink(size: int, scale: int, first: int, most: int) -> range:
    """Offsets ``first .. most - 1`` that leave at least one cell of ``size`` at ``scale``."""
    return range(first, max(first + 1, min(most, (size - 1) // scale + 1)))
