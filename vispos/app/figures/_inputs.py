"""Argument checks of the figure functions: grid shapes, one item's encoding, channel lists."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ..._checks import check_int, check_sizes, describe, is_int


def check_shape(shape: object, name: str = "shape") -> tuple[int, ...]:
    """``shape`` as a tuple of 1 to 3 positive ints (an int is one axis)."""
    return check_sizes(shape, name, n=1) if is_int(shape) else check_sizes(shape, name)


def check_pos(pos: object, name: str, ranks: Sequence[int]) -> Tensor:
    """``pos`` as a detached float32 CPU tensor ``(C, *S)`` with ``len(S)`` in ``ranks``."""
    if not isinstance(pos, Tensor):
        raise TypeError(f"{name} must be a Tensor[C, *S], got {type(pos).__name__}")
    if not pos.is_floating_point():
        raise TypeError(f"{name} must be a floating Tensor[C, *S], got dtype {pos.dtype}")
    if pos.dim() - 1 not in ranks:
        raise ValueError(
            f"{name} must be a floating Tensor[C, *S] with {' or '.join(map(str, ranks))} spatial "
            f"axes, got {pos.dtype} of shape {tuple(pos.shape)}"
        )
    return pos.detach().to("cpu", torch.float32)


def check_channels(channels: object, total: int, name: str = "channels") -> list[int]:
    """``channels`` (an int or a non-empty sequence of ints) as a list of indices into ``total``."""
    if is_int(channels):  # one channel
        channels = [channels]
    if not isinstance(channels, Sequence) or isinstance(channels, str):
        raise TypeError(f"{name} must be a non-empty sequence of ints, got {describe(channels)}")
    if len(channels) == 0:
        raise ValueError(f"{name} must be a non-empty sequence of ints, got {describe(channels)}")
    out = []
    for c in channels:
        c = check_int(c, f"{name} entry")
        if not 0 <= c < total:
            raise ValueError(f"{name} must index the {total} channels (0 .. {total - 1}), got {c}")
        out.append(c)
    return out
