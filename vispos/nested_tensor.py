"""Padded batches of images and volumes with a padding mask (DETR's ``NestedTensor``).

A batch of items of different spatial sizes is padded to a common size, items placed at the
origin of every axis (top-left for images), and a boolean mask marks the padding: **True =
padding**, as in DETR. Shapes, for ``n`` spatial axes (1 to 3):

* ``tensors``: ``Tensor[B, C, *S]`` (``S = (L,)``, ``(H, W)`` or ``(D, H, W)``)
* ``mask``: ``Tensor[B, *S]``, ``torch.bool``

References:
    Carion et al., End-to-End Object Detection with Transformers, ECCV 2020 (``util/misc.py``);
    detectron2's ``ImageList`` for ``size_divisibility``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from ._checks import MAX_SPATIAL, check_index, check_int
from ._tracing import tracing
from .padding import (
    SpatialInput,
    check_mask,
    interpolate_mask,
    mask_sizes,
    resize_image_sizes,
)

__all__ = [
    "NestedTensor",
    "NestedTensorLike",
    "nested_tensor_from_tensor_list",
    "interpolate_mask",
    "resize_image_sizes",
    "parse_spatial_input",
    "SpatialInput",
]

_check_mask = check_mask  # old private name, kept for callers inside the package


@runtime_checkable
class NestedTensorLike(Protocol):
    """Any padded batch with DETR's ``util.misc.NestedTensor`` interface: ``.tensors``
    ``Tensor[B, C, *S]``, ``.mask`` ``Tensor[B, *S]`` bool (True = padding) or None, and
    ``.decompose() -> (tensors, mask)``. vispos' encoders accept such objects as they are, so
    DETR-family code (DETR, Deformable-DETR, Conditional/DAB-DETR, DINO) can hand its own
    ``NestedTensor`` to them.
    """

    tensors: Tensor
    mask: Tensor | None

    def decompose(self) -> tuple[Tensor, Tensor | None]: ...


def _check_image_sizes(image_sizes: Any) -> list[tuple[int, ...]]:
    """``image_sizes`` as a list of tuples of ints; TypeError for anything else (floats, strs,
    bools and tensors with fractional values are refused rather than truncated)."""
    if isinstance(image_sizes, (str, bytes, Tensor)) or not isinstance(image_sizes, Sequence):
        raise TypeError(
            "image_sizes must be a sequence of per-item sizes (sequences of ints), got "
            f"{type(image_sizes).__name__}"
        )
    out = []
    for i, size in enumerate(image_sizes):
        if isinstance(size, (str, bytes)) or not isinstance(size, Sequence):
            raise TypeError(
                f"image_sizes[{i}] must be a sequence of ints (one per spatial axis), got {size!r}"
            )
        entries = []
        for s in size:
            if isinstance(s, bool) or not isinstance(s, (numbers.Integral, torch.SymInt)):
                raise TypeError(f"image_sizes[{i}] must hold ints, got {tuple(size)!r}")
            entries.append(int(s))
        out.append(tuple(entries))
    return out


class NestedTensor:
    """A padded batch: ``tensors`` ``(B, C, *S)`` and a bool ``mask`` ``(B, *S)``, True = padding.

    Args:
        tensors (Tensor[B, C, *S]): the padded batch, 1 to 3 spatial axes, any dtype.
        mask (Tensor[B, *S], bool, optional): True marks padding. ``None`` means no padding.
        image_sizes (sequence of tuples, optional): each item's unpadded spatial size. When not
            given it is read from ``mask`` on first use (the extent of each item's valid cells,
            one host synchronisation).
        rectangular (bool): a promise that ``mask`` is exactly "item ``b`` is valid on
            ``[0, image_sizes[b])`` along every axis" (what :func:`nested_tensor_from_tensor_list`
            and :meth:`with_features` produce). Needs ``image_sizes``. Lets position embeddings
            take their fast path and cache on the host-known sizes without reading the mask.

    Attributes:
        tensors (Tensor[B, C, *S]): the padded batch.
        mask (Tensor[B, *S] or None): bool, True marks padding.

    Raises:
        TypeError: ``tensors`` is not a tensor; ``mask`` is not a bool tensor; ``image_sizes`` is
            not a sequence of sequences of ints; ``rectangular`` is not a bool.
        ValueError: ``tensors`` has fewer than 3 or more than 5 dims; ``mask``'s shape is not
            ``(B, *S)``; ``mask`` is on another device than ``tensors``; ``image_sizes`` has the
            wrong length or rank, or a size outside ``[0, S_i]``.
        IndexError: (indexing) an item index outside ``[-B, B)``, as for any Python sequence.

    Indexing returns the unpadded item ``Tensor[C, *size]``; ``len()`` is ``B``. ``to()`` returns a
    new object (the mask keeps dtype ``bool``).

    References:
        Carion et al., End-to-End Object Detection with Transformers, ECCV 2020.
    """

    __slots__ = ("tensors", "mask", "_image_sizes", "rectangular")

    def __init__(
        self,
        tensors: Tensor,
        mask: Tensor | None,
        image_sizes: Sequence[Sequence[int]] | None = None,
        rectangular: bool = False,
    ) -> None:
        if not isinstance(tensors, Tensor):
            raise TypeError(f"tensors must be a torch.Tensor (B, C, *S), got {type(tensors).__name__}")
        if not 3 <= tensors.dim() <= 2 + MAX_SPATIAL:
            raise ValueError(
                "tensors must have shape (B, C, *S) with 1 to 3 spatial axes, "
                f"got shape {tuple(tensors.shape)}"
            )
        if mask is not None:
            check_mask(mask)
            expected = (tensors.shape[0], *tensors.shape[2:])
            if tuple(mask.shape) != expected:
                raise ValueError(
                    f"mask must have shape (B, *S) = {expected} to match tensors "
                    f"{tuple(tensors.shape)}, got {tuple(mask.shape)}"
                )
            if mask.device != tensors.device:
                raise ValueError(
                    f"mask is on {mask.device} but tensors are on {tensors.device}; "
                    "move both to one device"
                )
        if not isinstance(rectangular, bool):
            raise TypeError(f"rectangular must be a bool, got {rectangular!r} ({type(rectangular).__name__})")
        sizes = None
        if image_sizes is not None:
            sizes = _check_image_sizes(image_sizes)
            if len(sizes) != tensors.shape[0]:
                raise ValueError(
                    f"image_sizes must have one entry per batch item ({tensors.shape[0]}), "
                    f"got {len(sizes)}"
                )
            for i, size in enumerate(sizes):
                if len(size) != tensors.dim() - 2 or any(
                    not 0 <= s <= m for s, m in zip(size, tensors.shape[2:])
                ):
                    raise ValueError(
                        f"image_sizes[{i}] = {size} must have {tensors.dim() - 2} entries, each "
                        f"within the padded size {tuple(tensors.shape[2:])}"
                    )
        if rectangular and (sizes is None or mask is None):
            raise ValueError("rectangular=True needs both a mask and image_sizes")
        self.tensors = tensors
        self.mask = mask
        self._image_sizes = sizes
        self.rectangular = bool(rectangular)

    # ----------------------------------------------------------------------------- accessors
    def decompose(self) -> tuple[Tensor, Tensor | None]:
        """Returns ``(tensors, mask)`` as DETR's ``NestedTensor.decompose`` does."""
        return self.tensors, self.mask

    @property
    def n_spatial(self) -> int:
        """Number of spatial axes (1 to 3)."""
        return self.tensors.dim() - 2

    @property
    def image_sizes(self) -> list[tuple[int, ...]]:
        """Each item's unpadded spatial size, a list of ``B`` tuples of ``n_spatial`` ints.

        Read from the mask (bounding extent of the valid cells) when the batch was not built by
        :func:`nested_tensor_from_tensor_list`; this reads tensor values on the host.
        """
        if self._image_sizes is None:
            spatial = tuple(self.tensors.shape[2:])
            if self.mask is None:
                self._image_sizes = [spatial] * self.tensors.shape[0]
            else:
                self._image_sizes = mask_sizes(self.mask)
        return list(self._image_sizes)

    def __len__(self) -> int:
        return self.tensors.shape[0]

    def __getitem__(self, index: int) -> Tensor:
        """The unpadded item ``index``: ``Tensor[C, *image_sizes[index]]`` (a view).

        ``index`` is anything :func:`operator.index` accepts (``int``, ``numpy.int64``, a 0-d
        integer tensor), negative from the end, as for any Python sequence.
        """
        index = check_index(index, len(self))
        size = self.image_sizes[index]
        return self.tensors[(index, slice(None), *(slice(0, s) for s in size))]

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def to(self, *args: Any, **kwargs: Any) -> "NestedTensor":
        """Returns a new ``NestedTensor`` with ``tensors.to(*args, **kwargs)``.

        The mask follows to the new device (with the same ``non_blocking``, given by keyword or
        positionally as :meth:`torch.Tensor.to` takes it) and stays ``torch.bool``; the image
        sizes and the ``rectangular`` flag are kept (they are host facts, so a non-blocking copy
        needs no synchronisation to carry them). The original is untouched.
        """
        tensors = self.tensors.to(*args, **kwargs)
        mask = None
        if self.mask is not None:
            non_blocking = bool(kwargs.get("non_blocking", _positional_non_blocking(args)))
            mask = self.mask.to(device=tensors.device, non_blocking=non_blocking)
        return NestedTensor(tensors, mask, self._image_sizes, self.rectangular)

    def pin_memory(self, device: Any = None) -> "NestedTensor":
        """Returns a new ``NestedTensor`` whose tensors and mask are in page-locked host memory.

        ``DataLoader(pin_memory=True)`` calls this on every batch (torch pins any object that has
        a ``pin_memory`` method), so a later ``.to("cuda", non_blocking=True)`` is asynchronous.
        The image sizes and the ``rectangular`` flag are kept; the original is untouched.

        Args:
            device (ignored): accepted for the DataLoader's calling convention.

        Returns:
            NestedTensor: pinned ``tensors`` ``(B, C, *S)`` and ``mask`` ``(B, *S)`` bool.

        Raises:
            RuntimeError: from torch, when no accelerator is available to pin for.

        References:
            PyTorch ``torch.utils.data`` "Memory Pinning" (custom batch types).
        """
        tensors = self.tensors.pin_memory()
        mask = None if self.mask is None else self.mask.pin_memory()
        return NestedTensor(tensors, mask, self._image_sizes, self.rectangular)

    def with_features(self, tensors: Tensor) -> "NestedTensor":
        """Pairs a feature map of this batch with this batch's mask resized to it.

        The mask is resized as DETR does (:func:`interpolate_mask`, nearest). When this batch is
        ``rectangular`` the level's image sizes are computed on the host from the same nearest
        rule, so the result is rectangular too and nothing is read back from the device. At the
        same spatial size (a 1x1 projection) the result shares this batch's mask and sizes: no
        copy and no recomputation (the mask is read, never written, by vispos).

        Args:
            tensors (Tensor[B, C', *S']): features with the same batch size and spatial rank.

        Returns:
            NestedTensor: ``tensors`` with mask ``(B, *S')``.

        Raises:
            ValueError: another batch size or spatial rank.
        """
        # shape[0], not len(self): len() would turn a symbolic batch size into a constant
        if (
            not isinstance(tensors, Tensor)
            or tensors.dim() != self.tensors.dim()
            or tensors.shape[0] != self.tensors.shape[0]
        ):
            shape = tuple(tensors.shape) if isinstance(tensors, Tensor) else type(tensors).__name__
            raise ValueError(
                f"tensors must have shape (B={len(self)}, C, *S) with {self.n_spatial} spatial axes, got {shape}"
            )
        if self.mask is None:
            return NestedTensor(tensors, None)
        size = tuple(tensors.shape[2:])
        if not tracing() and size == tuple(self.tensors.shape[2:]):
            return NestedTensor(tensors, self.mask, self._image_sizes, self.rectangular)
        mask = interpolate_mask(self.mask, size)
        if not self.rectangular or tracing():  # sizes are host work; compilers get the mask alone
            return NestedTensor(tensors, mask)
        sizes = resize_image_sizes(self.image_sizes, tuple(self.tensors.shape[2:]), size)
        return NestedTensor(tensors, mask, sizes, rectangular=True)

    @property
    def device(self) -> torch.device:
        return self.tensors.device

    @property
    def dtype(self) -> torch.dtype:
        return self.tensors.dtype

    @property
    def shape(self) -> torch.Size:
        return self.tensors.shape

    def __repr__(self) -> str:
        mask = "None" if self.mask is None else f"bool{list(self.mask.shape)}"
        return (
            f"NestedTensor(tensors={self.tensors.dtype}{list(self.tensors.shape)}, mask={mask}, "
            f"device={self.tensors.device})"
        )


def _check_pad_value(pad_value: Any, dtype: torch.dtype) -> None:
    """``pad_value`` (a real number, checked by the caller) must be a value ``dtype`` holds
    exactly: no wrap-around (-1 -> 255 in uint8), no silent rounding (0.5 -> 0)."""
    if dtype.is_floating_point or dtype.is_complex:
        return
    if dtype == torch.bool:
        ok = pad_value in (0, 1)
        want = "0 or 1"
    else:
        info = torch.iinfo(dtype)
        ok = float(pad_value).is_integer() and info.min <= pad_value <= info.max
        want = f"an integer in [{info.min}, {info.max}]"
    if not ok:
        raise ValueError(f"pad_value={pad_value!r} cannot be stored in the items' dtype {dtype}: expected {want}")


def nested_tensor_from_tensor_list(
    tensors: Sequence[Tensor],
    size_divisibility: int = 0,
    pad_value: float = 0.0,
) -> NestedTensor:
    """Pads a list of images ``(C, H, W)`` or volumes ``(C, D, H, W)`` into a :class:`NestedTensor`.

    Every item is placed at the origin of each spatial axis; the padded size is the largest
    size along each axis, rounded up to a multiple of ``size_divisibility`` when it is > 0.
    Items with one spatial axis ``(C, L)`` are accepted too. The inputs are not modified.

    Args:
        tensors (sequence of Tensor[C, *S_i]): same rank, channel count, dtype and device.
        size_divisibility (int): pad every spatial axis to a multiple of this (0: no rounding).
        pad_value (float): value written into the padding of ``tensors``.

    Returns:
        NestedTensor: ``tensors`` ``(B, C, *S_max)`` in the items' dtype, ``mask`` ``(B, *S_max)``
        bool with True = padding, ``image_sizes`` the items' own sizes.

    Raises:
        TypeError: ``tensors`` is not a list/tuple, an item is not a tensor,
            ``size_divisibility`` is not an int, or ``pad_value`` is not a number.
        ValueError: ``pad_value`` cannot be stored in the items' dtype (e.g. -1, 0.5 or 300 for
            ``uint8``).
        ValueError: empty list; an item with another rank, channel count, dtype or device than
            item 0; a zero-size axis; negative ``size_divisibility``.

    References:
        DETR ``util/misc.py`` (``nested_tensor_from_tensor_list``); detectron2 ``ImageList``.
    """
    if isinstance(tensors, Tensor) or not isinstance(tensors, Sequence):
        raise TypeError(
            "tensors must be a list or tuple of tensors shaped (C, *S), "
            f"got {type(tensors).__name__}"
        )
    if len(tensors) == 0:
        raise ValueError("tensors must hold at least one tensor, got an empty sequence")
    divisor = check_int(size_divisibility, "size_divisibility", minimum=0)
    if isinstance(pad_value, bool) or not isinstance(pad_value, (int, float)):
        raise TypeError(f"pad_value must be a real number, got {pad_value!r} ({type(pad_value).__name__})")
    for i, t in enumerate(tensors):
        if not isinstance(t, Tensor):
            raise TypeError(f"tensors[{i}] must be a torch.Tensor shaped (C, *S), got {type(t).__name__}")
    first = tensors[0]
    _check_pad_value(pad_value, first.dtype)
    if not 2 <= first.dim() <= 1 + MAX_SPATIAL:
        raise ValueError(
            "tensors[0] must have shape (C, H, W), (C, D, H, W) or (C, L), "
            f"got shape {tuple(first.shape)}"
        )
    for i, t in enumerate(tensors):
        if t.dim() != first.dim():
            raise ValueError(
                f"tensors[{i}] has shape {tuple(t.shape)} ({t.dim()} dims) but tensors[0] has "
                f"shape {tuple(first.shape)} ({first.dim()} dims); all items need the same rank"
            )
        if t.shape[0] != first.shape[0]:
            raise ValueError(
                f"tensors[{i}] has {t.shape[0]} channels (shape {tuple(t.shape)}) but tensors[0] "
                f"has {first.shape[0]} (shape {tuple(first.shape)})"
            )
        if t.dtype != first.dtype:
            raise ValueError(f"tensors[{i}] has dtype {t.dtype} but tensors[0] has {first.dtype}")
        if t.device != first.device:
            raise ValueError(f"tensors[{i}] is on {t.device} but tensors[0] is on {first.device}")
        if any(s == 0 for s in t.shape[1:]):
            raise ValueError(f"tensors[{i}] has a zero-size spatial axis: shape {tuple(t.shape)}")

    sizes = [tuple(t.shape[1:]) for t in tensors]
    padded = [max(axis) for axis in zip(*sizes)]
    if divisor > 1:
        padded = [int(math.ceil(s / divisor) * divisor) for s in padded]
    batch = first.new_full((len(tensors), first.shape[0], *padded), pad_value)
    mask = torch.ones((len(tensors), *padded), dtype=torch.bool, device=first.device)
    for i, (t, size) in enumerate(zip(tensors, sizes)):
        region = tuple(slice(0, s) for s in size)
        batch[(i, slice(None), *region)].copy_(t)
        mask[(i, *region)] = False
    return NestedTensor(batch, mask, sizes, rectangular=True)


def parse_spatial_input(x: Any) -> SpatialInput:
    """Reads what a spatial encoder was given: a batch, a padding mask or a feature map.

    Args:
        x (NestedTensor | NestedTensorLike | Tensor[B, *S] bool | Tensor[B, C, *S] float): a
            padded batch (vispos' :class:`NestedTensor`, or any object with DETR's
            ``.tensors`` / ``.mask`` / ``.decompose()``); a mask (True = padding); or features
            meaning "no padding". ``S`` has 1 to 3 axes.

    Returns:
        SpatialInput: ``(mask or None, S, B, device, host_sizes, rectangular)``. ``host_sizes``
        and ``rectangular`` come only from a vispos :class:`NestedTensor` that already knows its
        sizes (nothing is read from the device here).

    Raises:
        TypeError: ``x`` is of another type; an integer mask (with a hint on how to convert).
        ValueError: a mask or feature map of the wrong rank; a batch whose mask does not match
            its tensors.

    References:
        DETR's ``PositionEmbeddingSine.forward`` takes a ``NestedTensor``; the mask and feature
        forms follow transformers' and timm's encoders.
    """
    if isinstance(x, NestedTensor):
        tensors, mask = x.decompose()
        # compilers get no host sizes: even touching them would specialise the graph on the batch
        host = None
        if not tracing() and x._image_sizes is not None:
            host = tuple(tuple(s) for s in x._image_sizes)
        return SpatialInput(mask, tuple(tensors.shape[2:]), tensors.shape[0], tensors.device, host, x.rectangular)
    if not isinstance(x, Tensor) and isinstance(x, NestedTensorLike):
        tensors, mask = x.decompose()
        name = type(x).__name__
        if not isinstance(tensors, Tensor) or not 3 <= tensors.dim() <= 2 + MAX_SPATIAL:
            got = tuple(tensors.shape) if isinstance(tensors, Tensor) else type(tensors).__name__
            raise ValueError(f"{name}.tensors must be a Tensor (B, C, *S) with 1 to 3 spatial axes, got {got}")
        if mask is not None:
            check_mask(mask, f"{name}.mask")
            expected = (tensors.shape[0], *tensors.shape[2:])
            if tuple(mask.shape) != expected:
                raise ValueError(f"{name}.mask must have shape (B, *S) = {expected}, got {tuple(mask.shape)}")
        return SpatialInput(mask, tuple(tensors.shape[2:]), tensors.shape[0], tensors.device)
    if not isinstance(x, Tensor):
        raise TypeError(
            "x must be a NestedTensor, a bool mask (B, *S) or a feature map (B, C, *S) (or, as DETR's "
            f"NestedTensor, any object with .tensors, .mask and .decompose()), got {type(x).__name__}"
        )
    if x.dtype == torch.bool:
        if not 2 <= x.dim() <= 1 + MAX_SPATIAL:
            raise ValueError(f"a mask must have shape (B, *S) with 1 to 3 spatial axes, got {tuple(x.shape)}")
        return SpatialInput(x, tuple(x.shape[1:]), x.shape[0], x.device)
    if x.dtype in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64):
        check_mask(x)  # raises the conversion hint
    if not 3 <= x.dim() <= 2 + MAX_SPATIAL:
        raise ValueError(
            "a feature map must have shape (B, C, *S) with 1 to 3 spatial axes, got "
            f"{tuple(x.shape)}; pass a bool mask (B, *S) to embed padded positions"
        )
    return SpatialInput(None, tuple(x.shape[2:]), x.shape[0], x.device)


# ------------------------------------------------------------------------ DataLoader collation
__all__ += ["collate_fn", "PaddedCollate"]

def _positional_non_blocking(args: tuple[Any, ...]) -> bool:
    """``non_blocking`` when given positionally to ``Tensor.to`` (the first bool argument:
    ``to(device, dtype, non_blocking)``, ``to(dtype, non_blocking)``, ``to(other, non_blocking)``)."""
    return next((a for a in args if isinstance(a, bool)), False)


class PaddedCollate:
    """A picklable ``collate_fn`` for ``DataLoader``: pads ``(image, target)`` pairs into a batch.

    Follows DETR's contract (``util/misc.py``, ``collate_fn``): a list of ``(image, target)``
    pairs in, ``(NestedTensor, tuple_of_targets)`` out. Images are 2D ``(C, H, W)`` or 3D
    ``(C, D, H, W)`` (1D ``(C, L)`` too), each at its own size; they are padded at the end of
    every axis by :func:`nested_tensor_from_tensor_list`, so the batch is ``rectangular`` and
    carries its image sizes on the host. Targets are passed through untouched (any object: a
    dict of tensors, a ``tv_tensors.BoundingBoxes``, ``None``). A plain class instance with two
    attributes, so it pickles into ``DataLoader`` worker processes under every start method.

    Args:
        size_divisibility (int): pad every spatial axis to a multiple of this (0: no rounding).
        pad_value (float): value written into the padding of the images.

    Shape:
        - input: ``list[(Tensor[C, *S_i], target_i)]``, ``B`` pairs, same rank, channels, dtype.
        - output: ``(NestedTensor(Tensor[B, C, *S_max], mask Tensor[B, *S_max] bool), tuple of B
          targets)``.

    Raises:
        TypeError: (construction) a non-int ``size_divisibility`` or a non-number ``pad_value``;
            (call) ``batch`` is not a list/tuple of ``(image, target)`` pairs, or an image is not
            a tensor.
        ValueError: (construction) negative ``size_divisibility``; (call) an empty batch, a pair
            of another length than 2, or images that cannot be padded together (rank, channels,
            dtype, device, a zero-size axis; see :func:`nested_tensor_from_tensor_list`).

    References:
        Carion et al., End-to-End Object Detection with Transformers, ECCV 2020
        (``util/misc.py``: ``collate_fn``); detectron2 ``ImageList.from_tensors``.
    """

    def __init__(self, size_divisibility: int = 0, pad_value: float = 0.0) -> None:
        check_int(size_divisibility, "size_divisibility", minimum=0)
        if isinstance(pad_value, bool) or not isinstance(pad_value, (int, float)):
            raise TypeError(f"pad_value must be a real number, got {pad_value!r} ({type(pad_value).__name__})")
        self.size_divisibility = size_divisibility
        self.pad_value = float(pad_value)

    def __call__(self, batch: Sequence[tuple[Tensor, Any]]) -> tuple[NestedTensor, tuple[Any, ...]]:
        if isinstance(batch, (str, bytes, Tensor)) or not isinstance(batch, Sequence):
            raise TypeError(
                f"batch must be a list of (image, target) pairs, got {type(batch).__name__}"
            )
        if len(batch) == 0:
            raise ValueError("batch must hold at least one (image, target) pair, got an empty sequence")
        images, targets = [], []
        for i, pair in enumerate(batch):
            if isinstance(pair, (str, bytes, Tensor)) or not isinstance(pair, Sequence):
                raise TypeError(
                    f"batch[{i}] must be an (image, target) pair, got {type(pair).__name__}; "
                    "a Dataset for this collate returns `image, target`"
                )
            if len(pair) != 2:
                raise ValueError(f"batch[{i}] must be an (image, target) pair, got {len(pair)} elements")
            image, target = pair
            if not isinstance(image, Tensor):
                raise TypeError(
                    f"batch[{i}][0] (the image) must be a torch.Tensor (C, *S), got {type(image).__name__}"
                )
            images.append(image.as_subclass(Tensor) if type(image) is not Tensor else image)
            targets.append(target)
        nested = nested_tensor_from_tensor_list(images, self.size_divisibility, self.pad_value)
        return nested, tuple(targets)

    def __repr__(self) -> str:
        return f"PaddedCollate(size_divisibility={self.size_divisibility}, pad_value={self.pad_value})"


def collate_fn(batch: Sequence[tuple[Tensor, Any]]) -> tuple[NestedTensor, tuple[Any, ...]]:
    """DETR's ``collate_fn``: ``(image, target)`` pairs -> ``(NestedTensor, tuple_of_targets)``.

    Equal to ``PaddedCollate()(batch)`` (no size rounding, zero padding); a module-level function,
    so it pickles into ``DataLoader`` workers.

    Args:
        batch (list of (Tensor[C, *S_i], target)): images or volumes each at its own size.

    Returns:
        tuple: ``(NestedTensor(Tensor[B, C, *S_max], mask Tensor[B, *S_max] bool, True =
        padding), tuple of the B targets)``.

    Raises:
        TypeError, ValueError: as :class:`PaddedCollate`.

    References:
        Carion et al., End-to-End Object Detection with Transformers, ECCV 2020 (``util/misc.py``).
    """
    return _DEFAULT_COLLATE(batch)


_DEFAULT_COLLATE = PaddedCollate()
