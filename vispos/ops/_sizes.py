"""The masked norms' Triton launch sizes: strides with the spatial axes flattened, tiles and warps per
memory format, chunks per reduction, the outputs' layout.

The kernels (:mod:`._batch_norm_kernels`, :mod:`._group_norm_kernels`) read ``Tensor[B, C, *S]``
through its batch, channel and spatial strides, the spatial axes flattened to one stride: any
memory format where they flatten (channels first or channels last, 1 to 3 spatial axes, an
expanded gradient), a contiguous copy otherwise. They read the padding mask ``Tensor[B, 1, *S]``
(True = padding) as it is: no valid map is built. Each norm runs two kernels per direction: the
first cuts every reduction (a channel for batch norm, an item and group for group norm) into
``SPLIT`` chunks of ``CHUNK`` cells, one program each, and writes per-chunk partial results; the
second merges its rows' chunks (a few values) and writes its block of the output.

Nothing here imports Triton. Tiles are powers of two of fixed sizes per memory format, and the
number of chunks is read through a fixed block (:data:`SPLIT_BLOCK`), so a kernel compiles one
variant per memory format and dtype, whatever the batch's sizes.

References:
    Liger-Kernel's ``calculate_settings`` (block and warps from the sizes) and inductor's Triton
    norms (a statistics kernel, then an elementwise one).
"""

import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

import torch

__all__ = ["p2", "cdiv", "flat", "tiles", "warps", "split", "out_like", "out_format", "plan", "flat_or_copy",
           "SPLIT_BLOCK"]

#: cells per block along the flattened spatial axis, and channels per block in channels last;
#: tests lower them to run several chunks and blocks on tiny maps
BLOCK_CELLS = 1024
BLOCK_CHANNELS_LAST = 32
#: aim for at least this many programs in a statistics kernel, with chunks of at least this many
#: blocks, and at most this many chunks per reduction
TARGET_PROGRAMS = 512
MIN_CHUNK_BLOCKS = 4
MAX_SPLIT = 64
#: the chunks' block in the kernels that merge them (a power of two >= MAX_SPLIT, fixed so that it
#: compiles no new variant)
SPLIT_BLOCK = 64
_CHANNELS_LAST = {4: torch.channels_last, 5: torch.channels_last_3d}


def p2(n: int) -> int:
    """The smallest power of two >= ``n`` (at least 1)."""
    return 1 << max(int(n) - 1, 0).bit_length()


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for positive ints."""
    return -(-a // b)


def flat(t: torch.Tensor) -> tuple[torch.Tensor, int, tuple[int, int, int]]:
    """``t`` (Tensor[B, C, *S]) with its spatial axes read as one: ``(t, S1 * S2 * ..., (batch,
    channel, spatial) strides)``; ``t.contiguous()`` when its spatial axes do not flatten to one
    stride (each axis's stride the next one's times that one's size, axes of size 1 aside)."""
    step, inner = None, 1
    for axis in range(t.dim() - 1, 1, -1):
        size = t.shape[axis]
        if size == 1:
            continue
        if step is None:
            step = t.stride(axis)
        elif t.stride(axis) != step * inner:
            t, step = t.contiguous(), 1
            break
        inner *= size
    return t, math.prod(t.shape[2:]), (t.stride(0), t.stride(1), 1 if step is None else step)


def tiles(t: torch.Tensor, channels: int) -> tuple[int, int]:
    """``(BLOCK_C, BLOCK_N)``: a tile of channels by cells, wide along the contiguous axis: one
    channel by :data:`BLOCK_CELLS` cells in channels first; in channels last
    :data:`BLOCK_CHANNELS_LAST` channels, or a quarter of them for a few channels (a group norm's
    groups), by as many cells as make :data:`BLOCK_CELLS` elements. Three tiles in all, whatever
    the sizes: each kernel compiles at most three variants per dtype and option set."""
    if t.stride(1) == 1 and channels > 1:  # two tiles only, so that few variants compile
        block_c = BLOCK_CHANNELS_LAST if channels > BLOCK_CHANNELS_LAST // 4 else max(BLOCK_CHANNELS_LAST // 4, 1)
        return block_c, max(BLOCK_CELLS // block_c, 1)
    return 1, BLOCK_CELLS


def split(rows: int, cells: int, block_n: int) -> tuple[int, int]:
    """``(SPLIT, CHUNK)``: each of ``rows`` reductions over ``cells`` cells cut into ``SPLIT``
    chunks of ``CHUNK`` cells (a multiple of ``block_n``), enough programs to fill a GPU."""
    want = min(MAX_SPLIT, cdiv(TARGET_PROGRAMS, max(rows, 1)), cdiv(cells, MIN_CHUNK_BLOCKS * block_n))
    chunk = cdiv(cdiv(cells, max(want, 1)), block_n) * block_n
    return cdiv(cells, chunk), chunk


def warps(block_c: int, block_n: int) -> int:
    """``num_warps`` for a tile of ``block_c * block_n`` elements, as Liger-Kernel's
    ``calculate_settings`` picks them (4 up to 2048 elements, 8 up to 8192, then 16)."""
    size = block_c * block_n
    return 4 if size <= 2048 else 8 if size <= 8192 else 16


def out_like(x: torch.Tensor) -> torch.Tensor:
    """An uninitialised map like ``x`` (Tensor[B, C, *S]) whose spatial axes flatten to one stride:
    ``x``'s own strides with one spatial axis, channels last where ``x`` is, else contiguous. The
    layout of the Triton path's outputs (and of their fakes)."""
    return torch.empty_like(x, memory_format=plan(("out_like", x.shape, x.stride()), lambda: out_format(x)))


def out_format(x: torch.Tensor) -> torch.memory_format:
    """The memory format of :func:`out_like`'s map for ``x``."""
    fmt = _CHANNELS_LAST.get(x.dim())
    if x.dim() <= 3:
        return torch.preserve_format
    if fmt is not None and not x.is_contiguous() and x.is_contiguous(memory_format=fmt):
        return fmt
    return torch.contiguous_format


_PLANS: OrderedDict = OrderedDict()
_PLANS_MAX = 4096
_PLANS_LOCK = threading.Lock()


def plan(key: Hashable, build: Callable[[], Any]) -> Any:
    """A launch's sizes computed once per ``key`` (the shapes, strides, dtypes and options they
    depend on): ``build()`` on the first call, the cached value after. The cache is bounded (the
    oldest entries go first) and thread-safe; the tile constants are part of the key, so a
    test that lowers them gets fresh sizes. Symbolic sizes (tracing with dynamic shapes) are
    computed every time."""
    key = (key, BLOCK_CELLS, BLOCK_CHANNELS_LAST, TARGET_PROGRAMS, MIN_CHUNK_BLOCKS, MAX_SPLIT)
    try:
        found = _PLANS.get(key)  # a dict read is atomic: no lock on the hot path
    except TypeError:  # symbolic sizes (a trace with dynamic shapes) are not hashable: not cached
        return build()
    if found is not None:
        return found
    value = build()
    with _PLANS_LOCK:
        _PLANS[key] = value
        while len(_PLANS) > _PLANS_MAX:
            _PLANS.popitem(last=False)
    return value


def flat_or_copy(t: torch.Tensor) -> torch.Tensor:
    """``t`` when its spatial axes flatten to one stride (:func:`flat`), else a contiguous copy;
    the answer is cached per shape and strides."""
    return t if plan(("flattens", t.shape, t.stride()), lambda: flat(t)[0] is t) else t.contiguous()
