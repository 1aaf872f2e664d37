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


def _padding_of(window: Window | TransposedWindow, axis: int) -> int:
    """A window's padding before the item along ``axis``, for messages (a scaled window, an
    interpolation, has ``pad_lo`` too)."""
    return window.padding[axis] if isinstance(window, TransposedWindow) else window.pad_lo[axis]


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
        self._steps_of: tuple | None = None  # see :meth:`_steps`

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
            self._steps_of = None
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
            list (one per geometry id) of ``(starts, sizes, canvas)``; ids whose boxes a window
            leaves as they were share one tuple (host values: the list is fresh, the tuples
            immutable).

        Raises:
            ValueError: an item starts at an offset that is not a multiple of a stride on its way
                (symmetric padding that cannot be exact); an item too small for a layer (it would
                fail alone as well); two maps that meet in a sum differ for an item (the item alone
                would fail with a shape mismatch), or whose padded canvases differ (the batch would).
        """
        out = self._fast_boxes(starts, sizes, canvas)
        if out is None:  # a refused item, or input off the common form: the item-by-item replay
            out = self._item_boxes(starts, sizes, canvas)
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

    def _item_boxes(self, starts, sizes, canvas) -> list[Boxes]:
        """:meth:`boxes` without its sum checks, item by item and axis by axis: the definition, and
        the path that raises (the first refused geometry id, item, then axis is the one named)."""
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
                            f"{_padding_of(window, axis)}): the item alone cannot run through the backbone either"
                        )
                    item_start.append(out_start if size[axis] > 0 else 0)
                    item_size.append(max(n_out, 0))
                new_starts.append(tuple(item_start))
                new_sizes.append(tuple(item_size))
            new_canvas = tuple(window.out_size(c, a) for a, c in enumerate(p_canvas))
            out.append((tuple(new_starts), tuple(new_sizes), new_canvas))
        return out

    def _steps(self) -> tuple | None:
        """Per geometry id after 0, ``(parent, axes)``: ``axes`` None where the window leaves every
        axis as it was, else per axis None (left as it was) or ``(transposed, stride, c, lo,
        ceil_mode)`` (see :meth:`_fast_boxes`); None for a window of another type. Derived once
        from the windows, again after :meth:`child` adds one."""
        steps = getattr(self, "_steps_of", None)  # (len(parents) when derived, the steps)
        if steps is not None and steps[0] == len(self.parents):
            return steps[1]
        plan: list | None = []
        for parent, window in zip(self.parents[1:], self.windows[1:]):
            axes = _axis_steps(window, self.num_axes)
            if axes is None:
                plan = None
                break
            plan.append((parent, None if all(a is None for a in axes) else axes))
        steps = (len(self.parents), None if plan is None else tuple(plan))
        self._steps_of = steps
        return steps[1]

    def _fast_boxes(self, starts, sizes, canvas) -> list[Boxes] | None:
        """:meth:`_item_boxes` an axis at a time over the batch's columns of starts and sizes; None
        where an item is refused or the input is off the form this path knows (a negative size, an
        item without every axis, another number of sizes than starts, another canvas rank, a window
        of another type), for :meth:`_item_boxes` to replay (and raise) from the start.

        Every id's columns are *normal*: an item with size 0 starts at 0 (the input's are made
        so; a window gives that). On normal columns a window's start rule needs no look at the
        sizes (``0 // s`` and ``0 * s`` are 0), and a window that keeps every size and start
        (stride 1, padding filling the kernel's reach) gives its parent's columns themselves."""
        first: Boxes = (tuple(starts), tuple(sizes), tuple(canvas))
        out: list[Boxes] = [first]
        if len(self.parents) == 1:
            return out
        steps = self._steps()
        n = self.num_axes
        starts, sizes, canvas = first
        batch = len(starts)
        if steps is None or n == 0 or len(canvas) != n or len(sizes) != batch:
            return None
        if batch:
            try:
                s_cols, z_cols = tuple(zip(*starts)), tuple(zip(*sizes))
            except TypeError:  # items that are not sequences: the item-by-item replay's error
                return None
            if len(s_cols) < n or len(z_cols) < n:  # zip stops at the shortest item: one without every axis
                return None
            s_cols, z_cols = s_cols[:n], z_cols[:n]
            normal = []
            for s_col, z_col in zip(s_cols, z_cols):
                if min(z_col) < 0:
                    return None
                if 0 in z_col and any(s_col):
                    s_col = tuple([s if z else 0 for s, z in zip(s_col, z_col)])
                normal.append(s_col)
            s_cols = tuple(normal)
        else:
            s_cols = z_cols = ((),) * n
        # per id: its columns, and its boxes as per-item tuples (built once per distinct columns)
        cols = [(s_cols, z_cols, canvas)]
        boxes = [(tuple(zip(*s_cols)), tuple(zip(*z_cols)), canvas)]
        for parent, axes in steps:
            if axes is None:  # the window keeps every axis: the parent's boxes themselves
                cols.append(cols[parent])
                boxes.append(boxes[parent])
                out.append(boxes[parent])
                continue
            p_s, p_z, p_c = cols[parent]
            new_s, new_z, new_c = [], [], []
            for s_col, z_col, c, step in zip(p_s, p_z, p_c, axes):
                if step is None:
                    new_s.append(s_col)
                    new_z.append(z_col)
                    new_c.append(c)
                    continue
                transposed, s, k, lo, ceil = step
                if transposed:  # n -> n * s + k for n > 0; start -> start * s
                    z = [v * s + k if v else 0 for v in z_col]
                    out_c = c * s + k if c else 0
                    if any(s_col):
                        s_col = tuple([v * s for v in s_col])
                else:  # n -> (n + k) // s + 1, one less where ceil_mode's last window starts in the padding
                    if ceil:
                        z = [(q := (v + k) // s) + 1 - (q * s >= v + lo) if v else 0 for v in z_col]
                        out_c = (q := (c + k) // s) + 1 - (q * s >= c + lo) if c else 0
                    else:
                        z = [(v + k) // s + 1 if v else 0 for v in z_col]
                        out_c = (c + k) // s + 1 if c else 0
                    if s != 1 and any(s_col):
                        if any([v % s for v in s_col]):
                            return None  # an item off the stride
                        s_col = tuple([v // s for v in s_col])
                if z and min(z) < 1 and (min(z) < 0 or z.count(0) != z_col.count(0)):
                    return None  # an item too small for the window
                new_s.append(s_col)
                new_z.append(tuple(z))
                new_c.append(out_c)
            p_boxes = boxes[parent]
            new_s, new_z = tuple(new_s), tuple(new_z)
            item_starts = p_boxes[0] if all(a is b for a, b in zip(new_s, p_s)) else tuple(zip(*new_s))
            item_sizes = tuple(zip(*new_z))
            cols.append((new_s, new_z, tuple(new_c)))
            boxes.append((item_starts, item_sizes, tuple(new_c)))
            out.append(boxes[-1])
        return out


def _axis_steps(window, num_axes: int) -> tuple | None:
    """Per axis of ``window``: None where it keeps every size, start and canvas size (see
    :meth:`Geometry._fast_boxes`), else ``(transposed, stride, c, pad_lo, ceil_mode)`` with ``c``
    the constant of its output-size formula; None for a window of another type."""
    axes = []
    if type(window) is Window:
        for axis in range(num_axes):
            k, s, d = window.kernel[axis], window.stride[axis], window.dilation[axis]
            lo, hi = window.pad_lo[axis], window.pad_hi[axis]
            if s == 1 and lo + hi == d * (k - 1) and (lo >= 0 or not window.ceil_mode):
                axes.append(None)  # n + lo + hi - d (k - 1) = n; ceil_mode's correction never fires
            else:
                c = lo + hi - d * (k - 1) - 1 + (s - 1 if window.ceil_mode else 0)
                axes.append((False, s, c, lo, window.ceil_mode))
    elif type(window) is TransposedWindow:
        for axis in range(num_axes):
            k, s, d = window.kernel[axis], window.stride[axis], window.dilation[axis]
            c = -s - 2 * window.padding[axis] + d * (k - 1) + window.output_padding[axis] + 1
            axes.append(None if s == 1 and c == 0 else (True, s, c, 0, False))
    else:
        return None
    return tuple(axes)
