"""The token grid of vision RoPE: per-item valid boxes, coordinate lines, augmentation, layout.

Shared by :class:`~vispos.DinoV3RotaryEmbedding` and :class:`~vispos.MixedRotaryEmbedding`.
Every coordinate they use is *separable*: along coordinate channel ``j`` (spatial axis
``perm[j]``; ``perm`` swaps the first two axes for timm's ``grid_indexing="xy"``) it depends on
the item and on the cell's index along that axis only. So coordinates are built as *lines*,
``Tensor[B, n, M]`` (``M`` = the longest axis), and sin / cos are evaluated once per line
cell, never once per token; the per-token tables are written once, by broadcast copies.

A padded batch is described per item by its valid *box*: the first valid cell and the valid
extent along every axis, read from the mask on the device (no host synchronisation). An item
padded on any side (DETR's bottom / right padding, MONAI's symmetric ``SpatialPad``) has its
coordinates measured from its own origin and normalized by its own extent, so that its valid
tokens get exactly the rotation they get alone; a token the mask marks as padding gets the
identity rotation (sin 0, cos 1), also inside the box of a non-rectangular mask.

Layout of a table with ``X`` rotated channels (``K = X / 2`` frequencies), timm's
``get_embed``: ``Tensor[..., 2 * X]``, ``[sin, cos]`` concatenated, each half either
``rotate_half`` (``f0 .. f_{K-1}, f0 .. f_{K-1}``) or interleaved (``f0, f0, f1, f1, ...``).

References:
    Simeoni et al., DINOv3, 2025 (coordinate normalization and augmentation);
    Heo et al., Rotary Position Embedding for Vision Transformer, ECCV 2024;
    timm ``layers/pos_embed_sincos.py`` (``_build_grid``, ``_apply_coord_augs``, ``_rope_layout``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, NamedTuple

import torch
from torch import Tensor

from .._checks import check_number
from ..padding._masks import box_tensors
from .. import _tracing
from .._tracing import host_facts, host_side, tracing
from ..padding import Padding, check_mask

__all__ = [
    "ItemBoxes",
    "read_padding",
    "grid_boxes",
    "axis_order",
    "coordinate_lines",
    "check_coord_augs",
    "draw_coord_augs",
    "augment_lines",
    "write_cat",
    "line_view",
    "sum_axes",
    "identity_at_padding",
    "wide_dtype",
    "padded_scope",
    "scoped_padding",
]

# (module id, padding) pairs of the ``with module.padded(mask):`` blocks entered in this thread /
# task: a context variable, so concurrent threads and tasks never see each other's batches
_SCOPES: ContextVar[tuple[tuple[int, Any], ...]] = ContextVar("vispos_rope_padding", default=())


@contextmanager
def padded_scope(module: object, padding: Any) -> Iterator[None]:
    """Within the block, ``scoped_padding(module)`` returns ``padding`` (innermost block wins)."""
    token = _SCOPES.set(_SCOPES.get() + ((id(module), padding),))
    try:
        yield
    finally:
        _SCOPES.reset(token)


def scoped_padding(module: object) -> Any:
    """The padding of the innermost ``padded_scope`` entered for ``module``, or None."""
    for key, padding in reversed(_SCOPES.get()):
        if key == id(module):
            return padding
    return None


def wide_dtype(dtype: torch.dtype | None) -> torch.dtype:
    """Frequencies and positions are kept at float32 or wider (timm's ``_freq_buffer_dtype``):
    ``.half()`` on a model must not quantize the angles' inputs."""
    dtype = dtype if dtype is not None else torch.get_default_dtype()
    return torch.float32 if dtype.is_floating_point and torch.finfo(dtype).bits < 32 else dtype


class ItemBoxes(NamedTuple):
    """Which tokens of a (padded) grid are valid, per item (read from a :class:`~vispos.Padding`).

    Attributes:
        spatial (tuple[int, ...]): ``S``, the grid.
        start (Tensor[B, n], int64): first valid cell of each item along each axis.
        size (Tensor[B, n], int64): valid extent (bounding box; 0 for an item with no valid cell).
        valid (Tensor[B, *S] bool or None): True = valid token, when the padding is not known as
            boxes on the host (None: no padding, or ``host`` says it all).
        host (tuple of starts, stops, or None): the boxes on the host, when the padding is
            exactly those boxes (``Padding.kind == "rectangular"``, host facts allowed).
    """

    spatial: tuple[int, ...]
    start: Tensor
    size: Tensor
    valid: Tensor | None
    host: tuple | None = None

    @property
    def batch(self) -> int:
        """``B``."""
        return self.start.shape[0]


def grid_boxes(spatial: Sequence[int], device: torch.device, batch: int = 1) -> ItemBoxes:
    """Unpadded items covering the whole grid ``S``."""
    n = len(spatial)
    start = torch.zeros((batch, n), dtype=torch.int64, device=device)
    size = torch.empty((batch, n), dtype=torch.int64, device=device)
    for axis, extent in enumerate(spatial):  # scalar fills: no host-to-device copy
        size[:, axis].fill_(extent)
    return ItemBoxes(tuple(spatial), start, size, None)


def read_padding(padding: Any, num_axes: int, name: str = "mask") -> ItemBoxes:
    """Reads a padded grid: a bool mask ``Tensor[B, *S]`` (True = padding, classified once by
    :meth:`Padding.from_mask <vispos.Padding.from_mask>`), a :class:`~vispos.Padding`, or a
    :class:`~vispos.NestedTensor` of token features (its ``padding``).

    Boxes known on the host (``kind == "rectangular"``) are used as they are; otherwise (a mask
    on an accelerator, traced calls, masks that are not boxes) the bounding boxes are computed
    on the device (:func:`vispos.padding._masks.box_tensors`, no synchronisation).

    Raises:
        TypeError: none of those (or a mask that is not bool).
        ValueError: not ``num_axes`` spatial axes.
    """
    if isinstance(padding, Tensor):
        check_mask(padding, name)
        if padding.dim() != num_axes + 1:
            raise ValueError(
                f"{name} must have shape (B, *S) with num_axes={num_axes} spatial axes, got {tuple(padding.shape)}"
            )
        padding = Padding.from_mask(padding)
    elif not isinstance(padding, Padding) and isinstance(getattr(padding, "padding", None), Padding):
        padding = padding.padding  # a NestedTensor
    if not isinstance(padding, Padding):
        raise TypeError(
            f"{name} must be a bool Tensor (B, *S), a Padding or a NestedTensor, got {type(padding).__name__}"
        )
    if padding.num_axes != num_axes:
        raise ValueError(
            f"{name} must have num_axes={num_axes} spatial axes, got a padding of grid {padding.spatial}"
        )
    spatial, device = padding.spatial, padding.device
    if padding.kind == "none":
        return grid_boxes(spatial, device, padding.batch)
    if padding.kind == "rectangular" and host_facts(device):
        starts, stops = padding.starts, padding.stops
        start = _tracing.host_tensor(starts, torch.int64, device).view(padding.batch, num_axes)
        stop = _tracing.host_tensor(stops, torch.int64, device).view(padding.batch, num_axes)
        return ItemBoxes(spatial, start, stop - start, None, (starts, stops))
    mask = padding.mask
    start, stop = box_tensors(mask)
    return ItemBoxes(spatial, start, stop - start, ~mask)


def axis_order(num_axes: int, grid_indexing: str) -> tuple[int, ...]:
    """Spatial axis of each coordinate channel: identity for ``"ij"``; the first two swapped for
    ``"xy"`` (timm's ``swap_shape_xy``: channel 0 holds ``x``, the width coordinate in 2D)."""
    order = list(range(num_axes))
    if grid_indexing == "xy":
        order[0], order[1] = order[1], order[0]
    return tuple(order)


def coordinate_lines(
    boxes: ItemBoxes,
    perm: Sequence[int],
    *,
    centered: bool,
    normalize_coords: str = "separate",
    grid_offset: float = 0.0,
) -> Tensor:
    """Coordinates of every cell of every axis, per item: ``Tensor[B, n, M]``, float32.

    ``lines[b, j, c]`` is the coordinate, along channel ``j`` (spatial axis ``perm[j]``), of cell
    ``c`` for item ``b``; ``i = c - start`` counts from the item's first valid cell.

    * ``centered=False`` (RoPE-Mixed, timm's "index" grid): ``i + grid_offset``.
    * ``centered=True`` (DINOv3, timm's "centered" grid): ``2 * ((i + 0.5 + grid_offset) / d) - 1``
      with ``d`` the item's valid extent along that axis (``"separate"``) or the smallest /
      largest extent over the axes (``"min"`` / ``"max"``).

    The float ops are timm's ``_build_grid`` ones, in its order, so an item alone gets the same
    float32 numbers. Cells beyond an axis' size hold values that no token reads.
    """
    start, size = boxes.start, boxes.size
    n = len(perm)
    length = max(boxes.spatial) if boxes.spatial else 0
    device = start.device
    if list(perm) != list(range(n)):
        # columns by slicing: an index list would be copied from the host (a synchronisation)
        start = torch.stack([start[:, p] for p in perm], 1)
        size = torch.stack([size[:, p] for p in perm], 1)
    cells = torch.arange(length, device=device, dtype=torch.float32)
    lines = cells - start.to(torch.float32).unsqueeze(-1)  # [B, n, M]
    if not centered:
        return lines + grid_offset if grid_offset else lines
    extent = size.to(torch.float32)
    if normalize_coords == "min":
        extent = extent.amin(1, keepdim=True).expand(-1, n)
    elif normalize_coords == "max":
        extent = extent.amax(1, keepdim=True).expand(-1, n)
    # an item with no valid cell: any finite denominator (every token gets the identity)
    denom = extent.clamp_min(1.0).unsqueeze(-1)
    t = lines + 0.5
    if grid_offset:  # (i + 0.5) + offset, timm's order; adding 0.0 would change nothing
        t = t + grid_offset
    return 2.0 * (t / denom) - 1.0


def check_coord_augs(shift: Any, jitter: Any, rescale: Any) -> tuple[float | None, float | None, float | None]:
    """Validates DINOv3's augmentation strengths (timm's ``_coord_aug_config`` rules).

    Raises:
        TypeError: a strength that is not a real number (or None).
        ValueError: ``shift_coords`` negative or not finite; ``jitter_coords`` or
            ``rescale_coords`` below 1 (they are multiplicative factors) or not finite.
    """
    out = []
    checks = (("shift_coords", shift, 0.0), ("jitter_coords", jitter, 1.0), ("rescale_coords", rescale, 1.0))
    for name, value, low in checks:
        if value is None:
            out.append(None)
            continue
        value = check_number(value, name)
        if value < low:
            why = "a shift in coordinate units" if low == 0 else "a multiplicative factor"
            raise ValueError(f"{name} must be >= {low:g} ({why}), got {value}")
        out.append(float(value))
    return out[0], out[1], out[2]


def draw_coord_augs(
    num_axes: int,
    shift: float | None,
    jitter: float | None,
    rescale: float | None,
    device: torch.device,
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """One draw of DINOv3's coordinate augmentation, from torch's generator on ``device``.

    In DINOv3's order (which fixes the random stream): a shift per axis ``U(-shift, shift)``,
    a jitter factor per axis ``exp(U(-ln J, ln J))``, one rescale factor ``exp(U(-ln R, ln R))``;
    float32, one value per coordinate channel.
    """
    kw = dict(device=device, dtype=torch.float32)
    s = j = r = None
    if shift is not None:
        s = torch.empty(num_axes, **kw).uniform_(-shift, shift)
    if jitter is not None:
        high = math.log(jitter)
        j = torch.empty(num_axes, **kw).uniform_(-high, high).exp()
    if rescale is not None:
        high = math.log(rescale)
        r = torch.empty(1, **kw).uniform_(-high, high).exp()
    return s, j, r


def augment_lines(lines: Tensor, draws: tuple[Tensor | None, Tensor | None, Tensor | None]) -> Tensor:
    """``((lines + shift) * jitter) * rescale`` per coordinate channel (a new tensor)."""
    shift, jitter, rescale = draws
    if shift is not None:
        lines = lines + shift.view(1, -1, 1)
    if jitter is not None:
        lines = lines * jitter.view(1, -1, 1)
    if rescale is not None:
        lines = lines * rescale
    return lines


def line_view(line: Tensor, axis: int, n: int) -> Tensor:
    """``Tensor[R, S_axis, *C]`` viewed as ``[R, 1, .., S_axis, .., 1, *C]`` over ``n`` spatial axes."""
    shape = [line.shape[0]] + [1] * n + list(line.shape[2:])
    shape[1 + axis] = line.shape[1]
    return line.view(shape)


def write_cat(out: Tensor, src: Tensor, start: int, half: bool) -> None:
    """Writes sin / cos of ``k`` frequencies into a ``[sin, cos]`` table, both copies of each.

    Args:
        out (Tensor[..., 2 * X]): the table (contiguous); ``K = X / 2`` frequencies.
        src (Tensor broadcastable to [..., 2, k]): sin (row 0) and cos (row 1) of frequencies
            ``start .. start + k - 1``; cast to ``out``'s dtype as written.
        start (int): the first frequency written.
        half (bool): timm's ``rotate_half`` layout, else interleaved.
    """
    lead = tuple(out.shape[:-1])
    k_all = out.shape[-1] // 4
    k = src.shape[-1]
    if half:
        dst = out.view(*lead, 2, 2, k_all).narrow(-1, start, k)  # [..., sc, copy, k]
        src = src.unsqueeze(-2)
    else:
        dst = out.view(*lead, 2, k_all, 2).narrow(-2, start, k)  # [..., sc, k, copy]
        src = src.unsqueeze(-1)
    dst.copy_(src.expand(dst.shape))


def sum_axes(parts: Sequence[Tensor], out: Tensor) -> Tensor:
    """``out = parts[0] + parts[1] (+ parts[2])``, broadcasting: the per-token table from one
    table per axis (``line_view`` shapes), each zero outside its own channels, so every
    channel of the sum is one part's value exactly. The last add writes ``out`` in one pass
    with the whole channel dim innermost (a broadcast copy of short channel runs costs 2.7x)."""
    acc = parts[0]
    for p in parts[1:-1]:
        acc = acc + p
    if parts[-1].requires_grad or acc.requires_grad or tracing():
        out.copy_(acc + parts[-1])
    else:
        torch.add(acc, parts[-1], out=out)
    return out


def _fill_outside_boxes(out: Tensor, boxes: ItemBoxes) -> None:
    lead, batch, mid, _, c = out.shape
    grid = out.view(lead, batch, mid, *boxes.spatial, 2, c // 2)
    for b, (start, stop) in enumerate(zip(*boxes.host)):
        item = grid[:, b]
        for axis, (lo, hi, side) in enumerate(zip(start, stop, boxes.spatial)):
            for a, z in ((0, lo), (hi, side - hi)) if hi > lo else ((0, side),):
                if z:
                    slab = item.narrow(2 + axis, a, z)
                    slab.select(-2, 0).fill_(0.0)
                    slab.select(-2, 1).fill_(1.0)
            if hi <= lo:
                break  # no valid cell: the whole item is filled


def identity_at_padding(out: Tensor, boxes: ItemBoxes) -> None:
    """Writes the identity rotation (sin 0, cos 1) at every padding token, in place.

    Args:
        out (Tensor[L, B, M, N, 2 * X]): tables, ``B`` items of ``N = prod(S)`` tokens (``L``,
            ``M``: leading dims that share the padding, e.g. blocks and heads of RoPE-Mixed).
        boxes (ItemBoxes): the padding (nothing to do without ``valid`` nor ``host``).

    Boxes known on the host: the slabs outside each box are filled (two fills per slab, no
    mask). A mask on the host (CPU, not traced): only the padding rows are written (an index of
    the padding tokens). Elsewhere: one select over the tables (no host read).
    """
    if boxes.host is not None:
        _fill_outside_boxes(out, boxes)
        return
    valid = boxes.valid
    if valid is None:
        return
    lead, batch, mid, n, c = out.shape
    view = out.view(lead, batch, mid, n, 2, c // 2)
    flat = valid.reshape(batch, n)
    if host_side(out.device) and not tracing() and not out.requires_grad:
        if lead == 1 and mid == 1:  # the padding rows of the flat table: two index fills
            rows = (~flat).view(-1).nonzero().squeeze(1)
            pairs = view.view(batch * n, 2, c // 2)
            pairs[:, 0].index_fill_(0, rows, 0.0)
            pairs[:, 1].index_fill_(0, rows, 1.0)
            return
        items, tokens = (~flat).nonzero(as_tuple=True)
        if items.numel():
            view[:, items, :, tokens] = torch.tensor([0.0, 1.0], dtype=out.dtype).view(2, 1)
        return
    ident = torch.arange(2, dtype=out.dtype, device=out.device).view(2, 1)  # (sin, cos) = (0, 1), no host copy
    cond = flat.view(1, batch, 1, n, 1, 1)
    if out.requires_grad or tracing():
        view.copy_(torch.where(cond, view, ident))
    else:
        torch.where(cond, view, ident, out=view)
