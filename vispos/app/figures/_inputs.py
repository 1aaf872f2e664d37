"""Argument checks of the figure functions: grid shapes, one item's encoding, channel lists."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def check_shape(shape: object, name: str = "shape", ranks: Sequence[int] = (1, 2, 3)) -> tuple[int, ...]:
    """``shape`` as a tuple of 1 to 3 positive ints (an int is one axis)."""
    if isinstance(shape, int) and not isinstance(shape, bool):
        shape = (shape,)
    if not isinstance(shape, Sequence) or isinstance(shape, str):
        raise TypeError(f"{name} must be a sequence of ints, got {shape!r} ({type(shape).__name__})")
    if any(isinstance(s, bool) or not isinstance(s, int) for s in shape):
        raise TypeError(f"{name} must hold ints, got {shape!r}")
    if len(shape) not in ranks or any(s < 1 for s in shape):
        raise ValueError(f"{name} must have {' or '.join(map(str, ranks))} axes, each >= 1, got {tuple(shape)}")
    return tuple(shape)


def check_pos(pos: object, name: str, ranks: Sequence[int]) -> Tensor:
    """``pos`` as a detached float32 CPU tensor ``(C, *S)`` with ``len(S)`` in ``ranks``."""
    if not isinstance(pos, Tensor):
        raise TypeError(f"{name} must be a Tensor[C, *S], got {type(pos).__name__}")
    if not (pos.is_floating_point()) or pos.dim() - 1 not in ranks:
        raise ValueError(
            f"{name} must be a floating Tensor[C, *S] with {' or '.join(map(str, ranks))} spatial "
            f"axes, got {pos.dtype} of shape {tuple(pos.shape)}"
        )
    return pos.detach().to("cpu", torch.float32)


def check_channels(channels: object, total: int, name: str = "channels") -> list[int]:
    """``channels`` (an int or a non-empty sequence of ints) as a list of indices into ``total``."""
    if isinstance(channels, int) and not isinstance(channels, bool):
        channels = [channels]
    if not isinstance(channels, Sequence) or isinstance(channels, str) or len(channels) == 0:
        raise TypeError(f"{name} must be a non-empty sequence of ints, got {channels!r}")
    out = []
    for c in channels:
        if isinstance(c, bool) or not isinstance(c, int):
            raise TypeError(f"{name} must hold ints, got {channels!r}")
        if not 0 <= c < total:
            raise ValueError(f"{name} must index the {total} channels (0 .. {total - 1}), got {c}")
        out.append(c)
    return out
