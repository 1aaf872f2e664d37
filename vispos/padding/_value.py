"""The :class:`Padding` value: which cells of a padded batch are valid, and every view of it.

Its public home is :mod:`vispos.padding` (the package's docstring says what it is and what it
derives); the mask algorithms it asks live beside it in the package's private rooms.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch import Tensor

from .. import _deprecation, _tracing
from . import _mask_resize, _mask_views, _masks
from .._checks import MAX_SPATIAL, as_sequence, check_bool, check_float_dtype, check_int, describe
from ._mask_checks import Spans, check_mask, check_spans, check_spatial_mask, check_spatial_size
from ._mask_origin import is_rectangular, matches_rectangle, rectangular_sizes, rectangular_valid
from ._mask_resize import interpolate_mask, resize_image_sizes
from ._mask_views import attn_mask_from_padding, mask_valid_ratios
from ._masks import mask_sizes

__all__ = ["Padding", "Kind"]

Kind = Literal["none", "rectangular", "arbitrary"]
_is_compiling = torch.compiler.is_compiling  # _tracing.compiling, without a call on the hot path


def _resolve(device: Any) -> torch.device:
    """A device with its index (``"cuda"`` -> ``cuda:0``), as tensors report theirs."""
    device = torch.device(device)
    if device.index is None and device.type not in ("cpu", "meta"):
        device = torch.empty(0, device=device).device
    return device


class Padding:
    """Which cells of a padded batch ``(B, *S)`` are valid: an immutable value.

    Build it with :meth:`from_sizes`, :meth:`from_mask` or :meth:`none` (the constructor itself
    is not public). Its :attr:`kind` is one of

    * ``"none"``: no padding, every cell valid (DETR's ``mask=None``; :attr:`mask` gives zeros);
    * ``"rectangular"``: item ``b`` is valid exactly on a box ``[starts[b], stops[b])`` known on
      the host. DETR pads at the end of every axis (boxes at the origin); MONAI's symmetric
      padding centres them (``starts="symmetric"``). Proven, never assumed: from sizes the mask
      is derived from the box; from a mask the box is found in it;
    * ``"arbitrary"``: any mask, no box known (holes, or a mask that was not read: one on an
      accelerator, or while tracing). Exact for every mask, rectangular ones included.

    Encoders give every kind the same numbers for the same cells (DETR's cumulative counts;
    rectangular padding only takes a faster path). Equality is about the cells: two paddings
    are equal when they have the same ``batch``, ``spatial``, ``device`` and valid cells, whatever
    their kinds; ``hash`` agrees with it. Pickles (DataLoader workers) with its mask when it
    has one; ``to`` / ``pin_memory`` return new paddings. A mask written in place after the
    padding read (or built) it is the truth from then on: it is read again on next use.

    Attributes:
        kind (str): ``"none"``, ``"rectangular"`` or ``"arbitrary"``.
        batch (int): ``B``. spatial (tuple of int): ``S``. device (torch.device): of the mask.

    Raises:
        TypeError: ``Padding(...)`` called directly (use the class methods); an argument of a
            class method or of :meth:`resize` / :meth:`to` of the wrong type.
        ValueError: sizes, starts or a target size out of range (see each method).

    References:
        Carion et al., DETR, ECCV 2020 (mask True = padding); detectron2 ``ImageList``
        (``image_sizes``); MONAI ``SpatialPad``.
    """

    __slots__ = ("_kind", "_batch", "_spatial", "_device", "_starts", "_stops", "_mask", "_at_origin", "_version",
                 "_valid", "_channel")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("build a Padding with Padding.from_sizes, Padding.from_mask or Padding.none")

    @classmethod
    def _make(cls, kind, batch, spatial, device, starts=None, stops=None, mask=None) -> "Padding":
        self = object.__new__(cls)
        self._kind, self._batch, self._spatial, self._device = kind, batch, spatial, device
        self._starts, self._stops, self._mask = starts, stops, mask
        self._at_origin = kind == "none" or (
            kind == "rectangular" and all(v == 0 for start in starts for v in start)
        )
        # the mask's version counter when it was read (or built): a later in-place write to it
        # is noticed (see :meth:`_sync`); not read while TorchDynamo traces
        self._version = _version_of(mask)
        self._valid = None  # (mask, its version, ~mask): see :attr:`valid`
        self._channel = None  # (mask, its version, mask[:, None], count): see :meth:`_channel_facts`
        return self

    def _sync(self) -> None:
        """Follows the mask when it was written in place after this padding read or built it:
        the mask in the caller's hands is then the truth (read again, as :meth:`from_mask`
        does), so boxes never disagree with it."""
        version = self._version
        if version is None or _is_compiling() or self._mask._version == version:
            return
        fresh = Padding.from_mask(self._mask)
        self._kind, self._starts, self._stops = fresh._kind, fresh._starts, fresh._stops
        self._at_origin, self._version = fresh._at_origin, fresh._version

    # ---------------------------------------------------------------------- constructors
    @classmethod
    def none(cls, batch: int, spatial: Sequence[int], device: Any = None) -> "Padding":
        """No padding: every cell of the ``(batch, *spatial)`` grid is valid.

        Args:
            batch (int): ``B >= 0``.
            spatial (sequence of int): ``S``, 1 to 3 sizes ``>= 0``.
            device (torch.device or str, optional): where :attr:`mask` is built; CPU by default.

        Returns:
            Padding: ``kind == "none"``.

        Raises:
            TypeError: non-int ``batch`` or ``spatial`` entries. ValueError: negative sizes, or
                not 1 to 3 spatial axes.
        """
        batch = check_int(batch, "batch", minimum=0)
        spatial = cls._check_spatial(spatial)
        return cls._make("none", batch, spatial, _resolve("cpu" if device is None else device))

    @classmethod
    def from_sizes(
        cls,
        sizes: Any,
        spatial: Sequence[int],
        *,
        starts: Any = None,
        device: Any = None,
    ) -> "Padding":
        """Rectangular padding from each item's valid size (and, optionally, where it starts).

        Args:
            sizes (sequence of B sequences of n ints, or Tensor[B, n] int): item ``b`` covers
                ``sizes[b][i]`` cells along axis ``i`` (detectron2's ``image_sizes``). A tensor
                is read on the host.
            spatial (sequence of int): ``S``, the padded size, 1 to 3 axes.
            starts (same form as ``sizes``, or "symmetric", optional): the first valid index of
                each item along each axis. None (default): 0, DETR's padding at the end of every
                axis. ``"symmetric"``: ``(S_i - sizes[b][i]) // 2``, MONAI's
                ``SpatialPad(method="symmetric")``.
            device (torch.device or str, optional): where :attr:`mask` is built; CPU by default.

        Returns:
            Padding: ``kind == "rectangular"``; an item with a size 0 along some axis has no
            valid cell, and its box is stored as ``(0, .., 0)`` twice.

        Raises:
            TypeError: ``sizes`` / ``starts`` not sequences of ints (or integer tensors).
            ValueError: wrong number of entries; a negative size or start; a box that does not
                fit in ``spatial``.

        References:
            detectron2 ``ImageList.from_tensors``; MONAI ``SpatialPad``.
        """
        spatial = cls._check_spatial(spatial)
        starts, stops = _masks.sized_boxes(check_spans(sizes, "sizes", len(spatial)), spatial, starts)
        device = _resolve("cpu" if device is None else device)
        return cls._make("rectangular", len(starts), spatial, device, starts, stops)

    @classmethod
    def from_mask(cls, mask: Tensor, *, classify: bool | None = None) -> "Padding":
        """Padding from a ``bool`` mask, True = padding (the mask is kept, not copied).

        Args:
            mask (Tensor[B, *S], bool): 1 to 3 spatial axes.
            classify (bool, optional): read the mask to find out whether it is rectangular
                (per-item boxes, at the origin or not). None (default): on the host (a CPU
                mask, not while tracing or capturing), where it costs one pass and no
                synchronisation. True: also on an accelerator (one synchronisation). False:
                never (``kind == "arbitrary"``).

        Returns:
            Padding: ``"rectangular"`` when the mask was read and is per-item boxes, else
            ``"arbitrary"``.

        Raises:
            TypeError: ``mask`` is not a bool tensor (with a hint on how to convert);
                ``classify`` is not a bool or None.
            ValueError: ``mask`` has not 1 to 3 spatial axes.

        References:
            Carion et al., DETR, ECCV 2020 (True = padding).
        """
        check_spatial_mask(mask)
        check_bool(classify, "classify", optional=True)
        if classify is None:
            classify = _tracing.host_side(mask.device) and _tracing.host_facts(mask.device)
        batch, spatial = mask.shape[0], tuple(mask.shape[1:])
        boxes = _masks.find_boxes(mask) if classify else None
        if boxes is None:
            return cls._make("arbitrary", batch, spatial, mask.device, mask=mask)
        return cls._make("rectangular", batch, spatial, mask.device, boxes[0], boxes[1], mask)

    @staticmethod
    def _check_spatial(spatial: Any) -> tuple[int, ...]:
        if as_sequence(spatial) is None:
            raise TypeError(f"spatial must be a sequence of 1 to {MAX_SPATIAL} ints, got {describe(spatial)}")
        spatial = as_sequence(spatial)
        if not 1 <= len(spatial) <= MAX_SPATIAL:
            raise ValueError(f"spatial must hold 1 to {MAX_SPATIAL} sizes, got {tuple(spatial)}")
        return check_spatial_size(spatial, len(spatial), "spatial", minimum=0)

    # ----------------------------------------------------------------------------- views
    @property
    def kind(self) -> Kind:
        """str: ``"none"``, ``"rectangular"`` or ``"arbitrary"`` (see the class docstring)."""
        self._sync()
        return self._kind

    @property
    def batch(self) -> int:
        """int: ``B`` (read from the mask's shape when there is one, so it stays symbolic under
        ``torch.compile``)."""
        return self._batch if self._mask is None else self._mask.shape[0]

    @property
    def spatial(self) -> tuple[int, ...]:
        """tuple of int: ``S`` (from the mask's shape when there is one)."""
        return self._spatial if self._mask is None else tuple(self._mask.shape[1:])

    @property
    def num_axes(self) -> int:
        """int: number of spatial axes (1 to 3), ``len(spatial)``."""
        return len(self._spatial)

    n_spatial = _deprecation.renamed_attribute("n_spatial", "num_axes")

    @property
    def device(self) -> torch.device:
        """torch.device: where the mask is (or is built)."""
        return self._device if self._mask is None else self._mask.device

    @property
    def at_origin(self) -> bool:
        """bool: every item's box starts at index 0 of every axis (DETR's padding). False for
        ``"arbitrary"`` (no box is known)."""
        self._sync()
        return self._at_origin

    @property
    def mask(self) -> Tensor:
        """Tensor[B, *S], bool: True marks padding. Derived from the boxes on first use for
        ``"none"`` / ``"rectangular"`` built from sizes (then kept); never to be written to."""
        mask = self._mask
        if mask is None:
            if self._kind == "none":
                mask = torch.zeros((self._batch, *self._spatial), dtype=torch.bool, device=self._device)
            else:
                mask = _masks.boxes_mask(self._starts, self._stops, self._spatial, self._device)
            if not _tracing.tracing():  # a traced tensor must not outlive its trace
                self._mask, self._version = mask, _version_of(mask)
        return mask

    @property
    def valid(self) -> Tensor:
        """Tensor[B, *S], bool: True marks valid cells, ``~mask``. Derived once per mask and kept (a
        layer that reads it costs no kernel after the first), again after the mask is written in
        place; never to be written to."""
        mask = self.mask
        # a traced tensor must not outlive its trace; an inference mask has no version counter to
        # key the kept value on, and a value derived in inference mode is an inference tensor that
        # a later training step could not save for backward
        if _tracing.tracing() or mask.is_inference() or torch.is_inference_mode_enabled():
            return ~mask
        kept = self._valid
        if kept is None or kept[0] is not mask or kept[1] != mask._version:
            kept = self._valid = (mask, mask._version, ~mask)
        return kept[2]

    def _channel_facts(self) -> tuple[Tensor, int]:
        """What a norm over the channels of ``Tensor[B, C, *S]`` reads: ``(Tensor[B, 1, *S] bool,
        int)``, the mask as a view (never to be written to) and the batch's valid cells from the
        boxes (at least 1; 0 for ``"arbitrary"``: the caller counts on the device). Kept once per
        padding and mask version in plain eager mode (every norm of a network asks for the same);
        afresh wherever a tracer, a dispatch mode or functorch watches. Raises nothing."""
        kept = self._channel
        if kept is not None and not _is_compiling():  # _version is not read while TorchDynamo traces
            mask = kept[0]
            if mask is self._mask and mask._version == kept[1] and _tracing.plain_eager(mask):
                return kept[2], kept[3]
        mask = self.mask
        kind = self.kind
        if kind == "none":
            count = max(self._batch * math.prod(self._spatial), 1)
        elif kind == "rectangular":
            count = _boxes_total(self.starts, self.stops)
        else:
            count = 0
        channel = mask.unsqueeze(1)
        if (self._mask is mask and _tracing.plain_eager(mask) and not mask.is_inference()
                and not torch.is_inference_mode_enabled()):
            self._channel = (mask, mask._version, channel, count)
        return channel, count

    @property
    def starts(self) -> Spans:
        """tuple of B tuples: each item's first valid index along every axis: its box for
        ``"rectangular"``, the bounding box of its valid cells for ``"arbitrary"`` (read from
        the mask once, one synchronisation). ``(0, .., 0)`` for an item without a valid cell."""
        self._sync()
        if self._starts is None:
            if self._kind == "none":
                return tuple(tuple(0 for _ in self._spatial) for _ in range(self._batch))
            self._starts, self._stops = _masks.bounding_boxes(self._mask)
        return self._starts

    @property
    def stops(self) -> Spans:
        """tuple of B tuples: one past each item's last valid index along every axis (the
        extent; see :attr:`starts`)."""
        self._sync()
        if self._kind == "none":
            return (self._spatial,) * self._batch
        if self._stops is None:
            self.starts  # noqa: B018 - fills both
        return self._stops

    @property
    def sizes(self) -> Spans:
        """tuple of B tuples: each item's valid size along every axis, ``stops - starts``
        (detectron2's ``image_sizes``). Host values; read from the mask for ``"arbitrary"``."""
        return tuple(tuple(e - s for s, e in zip(a, b)) for a, b in zip(self.starts, self.stops))

    def region(self, index: int) -> tuple[slice, ...]:
        """The slices ``(start:stop, ...)`` of item ``index``'s box (bounding box for
        ``"arbitrary"``), one per spatial axis."""
        return tuple(slice(s, e) for s, e in zip(self.starts[index], self.stops[index]))

    def valid_ratios(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """Deformable-DETR's ``get_valid_ratio`` from this padding (its boxes where it can): valid
        cells on the line through index 0 of the other axes, over ``S_i``, **last axis first**
        (``(w, h)`` in 2D). For a bare mask use :func:`mask_valid_ratios`.

        For rectangular padding the counts come from the boxes (no device read), equal to
        :func:`mask_valid_ratios` of the mask (tested). Deformable-DETR assumes boxes at the origin;
        for others this is its formula's value all the same.

        Args:
            dtype (torch.dtype): a floating dtype.

        Returns:
            Tensor[B, n] in ``dtype`` on :attr:`device`.

        Raises:
            TypeError: ``dtype`` is not a floating ``torch.dtype``.

        References:
            Zhu et al., Deformable DETR, ICLR 2021 (``get_valid_ratio``).
        """
        check_float_dtype(dtype)
        self._sync()
        device = self.device
        if self._kind == "arbitrary" or not _tracing.host_facts(device):
            return mask_valid_ratios(self.mask, dtype)
        counts = _mask_views.origin_line_counts(self.starts, self.stops)
        counts_t = _tracing.host_tensor(counts, torch.int64, device).view(len(counts), len(self._spatial))
        return _mask_views.ratios(counts_t, self._spatial, dtype)

    # ------------------------------------------------------------------------- transforms
    def resize(self, size: int | Sequence[int]) -> "Padding":
        """This padding at a feature level of spatial size ``size`` (DETR's nearest rule).

        ``"rectangular"`` resizes its boxes on the host, exactly to what
        :func:`interpolate_mask` gives for its mask (tested), and stays rectangular; an
        ``"arbitrary"`` mask is interpolated. While tracing, masks are interpolated on the
        device and nothing is read on the host. The same size returns ``self``.

        Args:
            size (int or sequence of int): the level's spatial size ``S'`` (positive ints).

        Returns:
            Padding: of shape ``(B, *S')``.

        Raises:
            TypeError: ``size`` holds non-integers. ValueError: wrong length, or a size < 1.

        References:
            DETR ``models/backbone.py`` (``F.interpolate(m[None].float(), size).to(torch.bool)[0]``).
        """
        size = check_spatial_size(size, len(self._spatial))
        self._sync()
        host = _tracing.host_facts(self.device)
        if host and size == self.spatial:  # compilers: no guard on the sizes
            return self
        if self._kind == "none":
            return Padding._make("none", self.batch, size, self.device)
        if self._kind == "rectangular" and host:
            starts, stops = _mask_resize.resize_boxes(self._starts, self._stops, self._spatial, size)
            return Padding._make("rectangular", self._batch, size, self.device, starts, stops)
        mask = _mask_resize.interpolate(self.mask, size)
        return Padding.from_mask(mask, classify=host and _tracing.host_side(mask.device))

    def to(self, device: Any = None, *, non_blocking: bool = False, copy: bool = False) -> "Padding":
        """This padding on ``device`` (a new object unless nothing changes).

        Args:
            device (torch.device or str, optional): the target (default: the current one).
            non_blocking (bool): passed to the mask's copy.
            copy (bool): a mask of its own even on the same device (never shares storage).

        Returns:
            Padding: the same cells; a rectangular padding without a built mask builds it on
            the new device when asked (no copy).

        Raises:
            TypeError: ``non_blocking`` or ``copy`` not a bool.
        """
        check_bool(non_blocking, "non_blocking")
        check_bool(copy, "copy")
        self._sync()
        device = self.device if device is None else _resolve(device)
        if device == self.device and not copy:
            return self
        mask = self._mask
        if mask is not None:
            mask = mask.to(device, non_blocking=non_blocking, copy=copy)
        return Padding._make(self._kind, self.batch, self.spatial, device, self._starts, self._stops, mask)

    def pin_memory(self) -> "Padding":
        """This padding with its mask in page-locked host memory (``"none"``: itself).

        Raises:
            RuntimeError: from torch, when no accelerator is available to pin for.
        """
        if self.kind == "none":
            return self
        mask = self.mask.pin_memory()
        return Padding._make(self._kind, self.batch, self.spatial, self.device, self._starts, self._stops, mask)

    # --------------------------------------------------------------------- value semantics
    def _host_key(self) -> tuple[tuple, Tensor | None]:
        """``(key, content)`` for an encoder's cache: rectangular and unpadded batches by their
        boxes, an arbitrary mask by its values (``content``)."""
        self._sync()
        if self._kind == "none":
            return ("none", self.spatial), None
        if self._kind == "rectangular":
            return ("rect", self.spatial, self._starts, self._stops), None
        return ("mask", tuple(self._mask.shape)), self._mask

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Padding):
            return NotImplemented
        if (self.batch, self.spatial, self.device) != (other.batch, other.spatial, other.device):
            return False
        if "arbitrary" not in (self.kind, other.kind):
            return (self.starts, self.stops) == (other.starts, other.stops)
        return bool(torch.equal(self.mask, other.mask))

    def __hash__(self) -> int:
        return hash((self.batch, self.spatial, self.device))

    def __reduce__(self):
        self._sync()
        return (_restore, (self._kind, self.batch, self.spatial, self.device, self._starts, self._stops, self._mask))

    def __repr__(self) -> str:
        text = f"Padding(kind={self.kind!r}, batch={self.batch}, spatial={self.spatial}"
        if self._kind == "rectangular":
            text += f", sizes={_short(self.sizes)}"
            if not self._at_origin:
                text += f", starts={_short(self._starts)}"
        return text + f", device={self.device})"


@functools.lru_cache(maxsize=1024)
def _boxes_total(starts: tuple, stops: tuple) -> int:
    """The number of valid cells of boxes ``starts`` / ``stops`` (at least 1), once per batch's boxes."""
    return max(sum(math.prod(e - s for s, e in zip(a, b)) for a, b in zip(starts, stops)), 1)


def _version_of(mask: Tensor | None) -> int | None:
    """``mask``'s version counter, or None where there is none to follow (no mask, inference
    tensors, TorchDynamo tracing)."""
    if mask is None or _is_compiling() or mask.is_inference():
        return None
    return mask._version


def _short(spans: Spans, most: int = 8) -> str:
    items = ", ".join(map(str, spans[:most]))
    return f"[{items}{', ...' if len(spans) > most else ''}]"


def _restore(kind, batch, spatial, device, starts, stops, mask) -> Padding:
    """Unpickles a :class:`Padding` (module level, so DataLoader workers can pickle it)."""
    return Padding._make(kind, batch, tuple(spatial), torch.device(device), starts, stops, mask)
