"""One training step of the detector demos, as ``vispos.app.train.engine.train_arm`` takes it: collate the
padded batch, forward, DETR's set criterion, backward, gradient clipping, the optimiser's step.
Shared by the benchmarks that time demo steps."""

from __future__ import annotations

import time

import torch

__all__ = ["timed_step"]


def timed_step(model, optim, criterion, collate, items, clip: float):
    """Runs one step; returns ``(wall seconds, CPU seconds, the collated batch)``."""
    t0, c0 = time.perf_counter(), time.process_time()
    nested, targets = collate(items)
    losses = criterion(model(nested), targets)
    optim.zero_grad(set_to_none=True)
    losses["loss"].backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    optim.step()
    return time.perf_counter() - t0, time.process_time() - c0, nested
