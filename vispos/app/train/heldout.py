"""The held-out set in several batch compositions: the demo's padded batches, one item at a time,
any other batch size, and each item beside the largest held-out item.

A CNN backbone run on a padded batch sees the padding, so an item's predictions (and the
held-out metric) depend on what it is batched with (DETR's README; facebookresearch/detr#217 and
#239). ``--eval-batch-sizes B1 B2 ...`` evaluates the held-out set in
batches of each size (``B1``, the headline, at every evaluation; all of them at the last three
evaluations, the ones the report averages), and ``--eval-beside-largest`` adds a composition in
which each item is batched with the held-out item that has the most cells (the most padding an
item of this set can get).

Composition keys (in ``metrics.json``): ``"batch<B>"`` and ``"beside_largest"``; the first key
is the headline, the one ``metrics["eval"]`` holds at every evaluation.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import torch
from torch.utils.data import DataLoader, Subset

import vispos

from .distributed import DistContext

__all__ = ["BESIDE_LARGEST", "composition_keys", "held_out_compositions", "full_evaluation_steps"]

#: the key of the composition "each item in a batch of two beside the largest held-out item"
BESIDE_LARGEST = "beside_largest"

#: one held-out batch: the padded batch, its targets, and how many leading items are scored (the
#: others are partners that only pad the scored ones)
Batch = tuple[vispos.NestedTensor, tuple, int]


def composition_keys(args: argparse.Namespace) -> list[str]:
    """The compositions to evaluate, headline first: ``batch<B>`` for each of
    ``args.eval_batch_sizes``, then ``beside_largest`` with ``args.eval_beside_largest``."""
    keys = [f"batch{b}" for b in args.eval_batch_sizes]
    if getattr(args, "eval_beside_largest", False):
        keys.append(BESIDE_LARGEST)
    return keys


def full_evaluation_steps(steps: int, eval_every: int, last: int = 3) -> set[int]:
    """The steps of the last ``last`` evaluations of a run (every ``eval_every`` steps and at
    ``steps``), where every composition is evaluated.

    Example:
        ``full_evaluation_steps(3000, 300)`` is ``{2400, 2700, 3000}``;
        ``full_evaluation_steps(1000, 300)`` is ``{600, 900, 1000}``.
    """
    at = sorted({*range(eval_every, steps + 1, eval_every), steps})
    return set(at[-last:])


def _batches(items: Any, batch_size: int, collate: vispos.PaddedCollate) -> list[Batch]:
    loader = DataLoader(items, batch_size=batch_size, collate_fn=collate, generator=torch.Generator())
    return [(nested, targets, len(targets)) for nested, targets in loader]


def held_out_compositions(held_set: Any, args: argparse.Namespace, ctx: DistContext) -> dict[str, list[Batch]]:
    """This process's share of the held-out set (items ``rank::world_size``, none repeated) in
    every composition of :func:`composition_keys`, in that order.

    ``batch<B>``: the share in batches of ``B`` (the last one smaller), padded by
    :class:`vispos.PaddedCollate` (``args.size_divisibility``). ``beside_largest``: every item of
    the share in a batch of two, first, beside the held-out item with the most cells (for that
    item itself, the one with the next most); only the first item is scored.

    Returns:
        dict: ``{key: [(NestedTensor, targets, n_scored), ...]}``.
    """
    share = Subset(held_set, range(ctx.rank, len(held_set), ctx.world_size))
    collate = vispos.PaddedCollate(size_divisibility=args.size_divisibility)
    out: dict[str, list[Batch]] = {}
    for key in composition_keys(args):
        if key == BESIDE_LARGEST:
            out[key] = _beside_largest(held_set, share, collate)
        else:
            out[key] = _batches(share, int(key.removeprefix("batch")), collate)
    return out


def _beside_largest(held_set: Any, share: Subset, collate: vispos.PaddedCollate) -> list[Batch]:
    cells = [math.prod(held_set[i][0].shape[1:]) for i in range(len(held_set))]
    order = sorted(range(len(cells)), key=lambda i: (-cells[i], i))  # most cells first, ties by index
    batches = []
    for i in share.indices:
        partner = order[1] if i == order[0] and len(order) > 1 else order[0]
        nested, targets = collate([held_set[i], held_set[partner]] if partner != i else [held_set[i]])
        batches.append((nested, targets, 1))
    return batches
