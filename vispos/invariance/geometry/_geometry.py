"""Where each item of a padded batch lies on every feature map of a backbone: convolution arithmetic
on the host.

A padding-invariant backbone (:mod:`vispos.backbones._invariant`) gives every feature map of its
graph a *geometry id*: 0 is the input, and every sliding window (a convolution or pooling with a
kernel, stride, padding, dilation and ceil mode) or transposed convolution (an integer up-sampling
is one) makes a child. :class:`Geometry` replays those windows on each item's box (and on the
padded canvas) with the output-size formula of ``torch.nn.Conv2d`` / ``MaxPool2d`` (``ceil_mode``
included) / ``ConvTranspose2d``, so each feature map's valid cells are exactly those of the item's
feature map alone, never a nearest-neighbour resize of the input mask.

An item placed at ``start > 0`` (MONAI's symmetric padding) stays aligned with what it gives
alone only when ``start`` is a multiple of every stride on the way; otherwise the item's cells
would be sampled at other offsets, and :meth:`Geometry.boxes` refuses it. A transposed
convolution moves the start to ``start * stride``, whatever it is.

References:
    Dumoulin and Visin, A guide to convolution arithmetic for deep learning, 2016;
    ``torch.nn.Conv2d`` / ``torch.nn.MaxPool2d`` (output shape, ``ceil_mode``),
    ``torch.nn.ConvTranspose2d`` (output shape).
"""

from __future__ import annotations

from dataclasses import dataclass

from ... import _deprecation

__all__ = ["Window", "TransposedWindow", "Geometry", "Boxes"]

#: per item: (starts, sizes), each a tuple of ints per axis; plus the canvas size per axis
Boxes = tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...], tuple[int, ...]]


@dataclass(frozen=True)
class Window:
    """A sliding window over every spatial axis (one entry per axis).

    Attributes:
        kernel, stride, dilation (tuple of int): as ``torch.nn.Conv2d``.
        pad_lo, pad_hi (tuple of int): implicit padding before and after (equal unless
            ``padding="same"`` with an even total).
        ceil_mode (bool): pooling's ``ceil_mode``.
    """

    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    pad_lo: tuple[int, ...]
    pad_hi: tuple[int, ...]
    dilation: tuple[int, ...]
    ceil_mode: bool = False

    @property
    def is_identity(self) -> bool:
        """Output cell ``j`` is input cell ``j`` (1x1, stride 1, no padding)."""
        return all(k == 1 for k in self.kernel) and all(s == 1 for s in self.stride) and not any(
            self.pad_lo + self.pad_hi
        )

    @property
    def reads_neighbours(self) -> bool:
        """An output cell reads more than one input cell, or padding: the input needs its padding
        filled before this window runs."""
        return any(k > 1 for k in self.kernel) or any(self.pad_lo + self.pad_hi)

    def out_size(self, n: int, axis: int) -> int:
        """Output size along ``axis`` for an input of size ``n`` (torch's formula; 0 for 0; below 1
        where torch refuses the input as too small)."""
        if n == 0:
            return 0
        k, s, d = self.kernel[axis], self.stride[axis], self.dilation[axis]
        lo, hi = self.pad_lo[axis], self.pad_hi[axis]
        span = n + lo + hi - d * (k - 1) - 1  # floor division rounds down, as torch's div_rtn
        out = (span + (s - 1 if self.ceil_mode else 0)) // s + 1
        if self.ceil_mode and (out - 1) * s >= n + lo:
            out -= 1
        return out

    def start_of(self, start: int, axis: int) -> int | None:
        """Where an item that starts at cell ``start`` of the input starts on the output (None when
        ``start`` is not a multiple of the stride: the item's cells would be sampled at other
        offsets than alone)."""
        s = self.stride[axis]
        return None if start % s else start // s


@dataclass(frozen=True)
class TransposedWindow:
    """A transposed convolution over every spatial axis (one entry per axis), or an integer
    up-sampling written as one (nearest with scale ``s``: kernel ``s``, stride ``s``).

    Attributes:
        kernel, stride, padding, output_padding, dilation (tuple of int): as
            ``torch.nn.ConvTranspose2d``.
    """

    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    output_padding: tuple[int, ...]
    dilation: tuple[int, ...]

    @property
    def is_identity(self) -> bool:
        """Output cell ``j`` is input cell ``j`` (1x1, stride 1, no padding)."""
        return all(k == 1 for k in self.kernel) and all(s == 1 for s in self.stride) and not any(
            self.padding + self.output_padding)

    @property
    def reads_neighbours(self) -> bool:
        """An output cell of the item may read a cell outside it: the input needs zeros in its
        padding. Not so when ``dilation * (kernel - 1) + output_padding < stride``: the taps of
        two input cells never meet, output cell ``j`` reads the one input cell ``(j + padding) //
        stride`` at most, and on the item's output that cell is the item's (UNETR's 2x2x2
        stride-2 up-convolutions, a nearest up-sampling)."""
        return any(d * (k - 1) + o >= s for k, s, o, d in zip(
            self.kernel, self.stride, self.output_padding, self.dilation))

    def out_size(self, n: int, axis: int) -> int:
        """Output size along ``axis`` for an input of size ``n``: ``(n - 1) * stride - 2 * padding +
        dilation * (kernel - 1) + output_padding + 1`` (``torch.nn.ConvTranspose2d``), 0 for 0."""
        if n == 0:
            return 0
        k, s, d = self.kernel[axis], self.stride[axis], self.dilation[axis]
        return (n - 1) * s - 2 * self.padding[axis] + d * (k - 1) + self.output_padding[axis] + 1

    def start_of(self, start: int, axis: int) -> int | None:
        """An item at input cell ``start`` starts at output cell ``start * stride`` (any start)."""
        return start * self.stride[axis]


class Geometry:
    """The tree of windows of one backbone graph, and its evaluation on a batch's boxes.

    Geometry ids: 0 is the input; :meth:`child` returns the id of a window applied to an id
    (the same window on the same parent returns the same id); :meth:`require_equal` records that
    two ids meet in one elementwise operation (a residual sum).
    """

    n_spatial = _deprecation.renamed_attribute("n_spatial", "num_axes")

    def __init__(self, num_axes: int) -> None:
        self.num_axes = num_axes
        self.parents: list[int | None] = [None]
        self.windows: list[Window | TransposedWindow | None] = [None]
        self.layers: list[str] = ["input"]
        self._ids: dict[tuple[int, Window | TransposedWindow], int] = {}
        self.equal: list[tuple[int, int, str]] = []

    def __len__(self) -> int:
        return len(self.parents)

    def child(self, parent: int, window: Window | TransposedWindow, layer: str) -> int:
        """The id of ``window`` applied to feature map ``parent`` (``parent`` itself for a 1x1,
        stride-1 window)."""
        if window.is_identity:
            return parent
        key = (parent, window)
        if key not in self._ids:
            self._ids[key] = len(self.parents)
            self.parents.append(parent)
            self.windows.append(window)
            self.layers.append(layer)
        return self._ids[key]

    def require_equal(self, a: int, b: int, layer: str) -> None:
        if a != b and (a, b) not in {(x, y) for x, y, _ in self.equal}:
            self.equal.append((a, b, layer))

    def boxes(self, starts, sizes, canvas) -> list[Boxes]:
        """Every feature map's per-item boxes and canvas, from the input's.

        Args:
            starts, sizes (tuple of B tuples of int): each item's box on the input.
            canvas (tuple of int): the input's padded spatial size.

        Returns:
            list (one per geometry id) of ``(starts, sizes, canvas)``.

        Raises:
            ValueError: an item starts at an offset that is not a multiple of a stride on its way
                (symmetric padding that cannot be exact); an item too small for a layer (it would
                fail alone as well); two maps that meet in a sum differ for an item (the item alone
                would fail with a shape mismatch), or whose padded canvases differ (the batch would).
        """
        out: list[Boxes] = [(tuple(starts), tuple(sizes), tuple(canvas))]
        for geometry_id in range(1, len(self.parents)):
            parent, window, layer = self.parents[geometry_id], self.windows[geometry_id], self.layers[geometry_id]
            p_starts, p_sizes, p_canvas = out[parent]
            new_starts, new_sizes = [], []
            for b, (start, size) in enumerate(zip(p_starts, p_sizes)):
                item_start, item_size = [], []
                for axis in range(self.num_axes):
                    s = window.stride[axis]
                    out_start = window.start_of(start[axis], axis)
                    if out_start is None and size[axis] > 0:
                        raise ValueError(
                            f"padding_invariant=True: item {b} starts at {start[axis]} on axis {axis} of "
                            f"the input to {layer} (stride {s}); a padded item gives what it gives alone "
                            "only when it starts at a multiple of every stride (pad at the end, DETR's "
                            "layout, or with MONAI's symmetric padding choose sizes so each item's offset "
                            "is a multiple of the backbone's total stride)"
                        )
                    n_out = window.out_size(size[axis], axis)
                    if n_out < 1 and size[axis] > 0:
                        raise ValueError(
                            f"padding_invariant=True: item {b} is {size[axis]} cells long on axis {axis} "
                            f"at {layer}, too small for its window (kernel {window.kernel[axis]}, padding "
                            f"{window.pad_lo[axis]}): the item alone cannot run through the backbone either"
                        )
                    item_start.append(out_start if size[axis] > 0 else 0)
                    item_size.append(max(n_out, 0))
                new_starts.append(tuple(item_start))
                new_sizes.append(tuple(item_size))
            new_canvas = tuple(window.out_size(c, a) for a, c in enumerate(p_canvas))
            out.append((tuple(new_starts), tuple(new_sizes), new_canvas))
        for a, b, layer in self.equal:
            if out[a][1] != out[b][1]:
                raise ValueError(
                    f"padding_invariant=True: the two inputs of {layer} cover different cells for some "
                    f"item ({out[a][1]} against {out[b][1]}): that item alone would fail with a shape "
                    "mismatch there"
                )
            if out[a][2] != out[b][2]:
                raise ValueError(
                    f"padding_invariant=True: the two inputs of {layer} are {out[a][2]} and {out[b][2]} "
                    f"cells on the padded canvas {tuple(canvas)}: the batch fails with a shape mismatch "
                    "there; pad the batch to a canvas every stride of the network divides"
                )
            if out[a] != out[b]:
                raise ValueError(
                    f"padding_invariant=True: the two inputs of {layer} place some item at different "
                    f"cells ({out[a][0]} against {out[b][0]}): the padded batch does not line them up"
                )
        return out
