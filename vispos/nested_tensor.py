"""Padded batches of images and volumes: DETR's ``NestedTensor``, holding tensors and one Padding.

A batch of items of different spatial sizes is padded to a common size and a
:class:`~vispos.Padding` says which cells are valid (its :attr:`~vispos.Padding.mask` is DETR's
mask, **True = padding**). Shapes, for ``n`` spatial axes (1 to 3):

* ``tensors``: ``Tensor[B, C, *S]`` (``S = (L,)``, ``(H, W)`` or ``(D, H, W)``)
* ``mask``: ``Tensor[B, *S]``, ``torch.bool``

:func:`parse_spatial_input` reads what an encoder was given (a batch, a mask or a feature map)
into a Padding. Padding a list of items into a batch, and the DataLoader collates, live in
:mod:`vispos.batching` (the names at their earlier home here are deprecated aliases that warn).

References:
    Carion et al., End-to-End Object Detection with Transformers, ECCV 2020 (``util/misc.py``);
    detectron2's ``ImageList`` for ``size_divisibility``; MONAI ``SpatialPad`` for
    ``method="symmetric"``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

import torch
from torch import Tensor

from . import _deprecation, _tracing
from ._checks import MAX_SPATIAL, check_bool, check_index
from .padding import Padding, check_mask, interpolate_mask, resize_image_sizes
from .padding._mask_checks import check_spans

__all__ = [
    "NestedTensor",
    "NestedTensorLike",
    "Padding",
    "interpolate_mask",
    "resize_image_sizes",
    "parse_spatial_input",
    "SpatialInput",
]

_check_mask = check_mask  # old private name, kept for callers inside the package

#: the batching functions' earlier home (they live in :mod:`vispos.batching`; the old path
#: warns, so this module does not import the one above it)
__getattr__ = _deprecation.alias_getattr(__name__, {
    name: f"vispos.batching:{name}" for name in ("nested_tensor_from_tensor_list", "collate_fn", "PaddedCollate")
})


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


class NestedTensor:
    """A padded batch: ``tensors`` ``(B, C, *S)`` and one :class:`~vispos.Padding`.

    Args:
        tensors (Tensor[B, C, *S]): the padded batch, 1 to 3 spatial axes, any dtype.
        mask (Tensor[B, *S] bool, Padding or None): True marks padding (kept, not copied); or a
            :class:`~vispos.Padding` of shape ``(B, *S)`` on ``tensors``' device; ``None``: no
            padding (or ``image_sizes`` alone, detectron2's ``ImageList``).
        image_sizes (sequence of tuples, optional): each item's valid size. With a mask it is a
            claim checked against the mask (the size of each item's valid region), never
            trusted; without one it defines a rectangular padding at the origin.
        rectangular (bool): a claim that the mask is per-item boxes, checked against the mask.

    With claims (``image_sizes`` or ``rectangular=True``) and a mask on an accelerator, the
    check reads the mask once (one synchronisation). While tracing, claims cannot be checked and
    are ignored: the mask alone is used.

    Attributes:
        tensors (Tensor[B, C, *S]): the padded batch.
        padding (Padding): which cells are valid. ``mask``, ``image_sizes``, ``rectangular``
            are its views.

    Raises:
        TypeError: ``tensors`` is not a tensor; ``mask`` is neither a bool tensor, a Padding nor
            None; ``image_sizes`` is not a sequence of sequences of ints; ``rectangular`` is not
            a bool.
        ValueError: ``tensors`` has fewer than 3 or more than 5 dims; ``mask``'s shape is not
            ``(B, *S)``; ``mask`` is on another device than ``tensors``; ``image_sizes`` has the
            wrong length or rank, a size outside ``[0, S_i]``, or disagrees with the mask;
            ``rectangular=True`` for a mask that is not per-item boxes.
        IndexError: (indexing) an item index outside ``[-B, B)``, as for any Python sequence.

    Indexing returns item ``b``'s valid region ``Tensor[C, *size_b]`` (a view); ``len()`` is
    ``B``. ``to()`` and ``pin_memory()`` return new objects.

    References:
        Carion et al., End-to-End Object Detection with Transformers, ECCV 2020; detectron2
        ``ImageList``.
    """

    __slots__ = ("_tensors", "_padding")

    def __init__(
        self,
        tensors: Tensor,
        mask: Tensor | Padding | None,
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
        rectangular = check_bool(rectangular, "rectangular")
        expected = (tensors.shape[0], *tensors.shape[2:])
        claims = image_sizes is not None or rectangular
        if isinstance(mask, Padding):
            padding = mask
            if tuple((padding.batch, *padding.spatial)) != expected or padding.device != tensors.device:
                raise ValueError(
                    f"mask (a Padding of shape {(padding.batch, *padding.spatial)} on {padding.device}) "
                    f"must have shape (B, *S) = {expected} on {tensors.device} to match tensors"
                )
        elif mask is None:
            if image_sizes is None:
                padding = Padding.none(tensors.shape[0], tensors.shape[2:], tensors.device)
            else:
                sizes = _check_image_sizes(image_sizes, tensors)
                padding = Padding.from_sizes(sizes, tensors.shape[2:], device=tensors.device)
                claims = False  # the sizes are the padding itself
        else:
            check_mask(mask)
            if tuple(mask.shape) != expected:
                raise ValueError(
                    f"mask must have shape (B, *S) = {expected} to match tensors "
                    f"{tuple(tensors.shape)}, got {tuple(mask.shape)}"
                )
            if mask.device != tensors.device:
                raise ValueError(
                    f"mask is on {mask.device} but tensors are on {tensors.device}; move both to one device"
                )
            if claims and _tracing.tracing():  # a claim cannot be checked here: the mask rules
                padding, claims = Padding.from_mask(mask, classify=False), False
            else:
                padding = Padding.from_mask(mask, classify=True if claims else None)
        if claims:
            _check_claims(padding, image_sizes, rectangular, tensors)
        self._tensors = tensors
        self._padding = padding

    # ----------------------------------------------------------------------------- accessors
    @property
    def tensors(self) -> Tensor:
        """Tensor[B, C, *S]: the padded batch."""
        return self._tensors

    @property
    def padding(self) -> Padding:
        """Padding: which cells are valid (the one truth; see :class:`~vispos.Padding`)."""
        return self._padding

    @property
    def mask(self) -> Tensor | None:
        """Tensor[B, *S] bool (True = padding), or None when there is no padding (DETR)."""
        return None if self._padding.kind == "none" else self._padding.mask

    @property
    def rectangular(self) -> bool:
        """bool: the padding is per-item boxes known on the host (``padding.kind ==
        "rectangular"``)."""
        return self._padding.kind == "rectangular"

    @property
    def image_sizes(self) -> list[tuple[int, ...]]:
        """Each item's valid size (:attr:`Padding.sizes`), a list of ``B`` tuples of ``num_axes``
        ints; read from the mask (one host synchronisation) for arbitrary padding."""
        return list(self._padding.sizes)

    def decompose(self) -> tuple[Tensor, Tensor | None]:
        """Returns ``(tensors, mask)`` as DETR's ``NestedTensor.decompose`` does."""
        return self._tensors, self.mask

    @property
    def num_axes(self) -> int:
        """Number of spatial axes (1 to 3)."""
        return self._tensors.dim() - 2

    n_spatial = _deprecation.renamed_attribute("n_spatial", "num_axes")

    def __len__(self) -> int:
        return self._tensors.shape[0]

    def __getitem__(self, index: int) -> Tensor:
        """The valid region of item ``index``: ``Tensor[C, *image_sizes[index]]`` (a view).

        ``index`` is anything :func:`operator.index` accepts (``int``, ``numpy.int64``, a 0-d
        integer tensor), negative from the end, as for any Python sequence.
        """
        index = check_index(index, len(self))
        return self._tensors[(index, slice(None), *self._padding.region(index))]

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def to(self, *args: Any, **kwargs: Any) -> "NestedTensor":
        """Returns a new ``NestedTensor`` with ``tensors.to(*args, **kwargs)``.

        Every call form of :meth:`torch.Tensor.to` is accepted. The padding follows to the new
        device with the same ``non_blocking`` and ``copy`` (given by keyword or positionally,
        as :meth:`torch.Tensor.to` takes them: the first bool is ``non_blocking``, the second
        ``copy``): with ``copy=True`` the mask shares no storage with this one. The mask stays
        ``torch.bool``; the original is untouched.
        """
        tensors = self._tensors.to(*args, **kwargs)
        flags = [a for a in args if isinstance(a, bool)]
        non_blocking = kwargs.get("non_blocking", flags[0] if flags else False)
        copy = kwargs.get("copy", flags[1] if len(flags) > 1 else False)
        padding = self._padding.to(tensors.device, non_blocking=bool(non_blocking), copy=bool(copy))
        return NestedTensor(tensors, padding)

    def pin_memory(self, device: Any = None) -> "NestedTensor":
        """Returns a new ``NestedTensor`` whose tensors and mask are in page-locked host memory.

        ``DataLoader(pin_memory=True)`` calls this on every batch (torch pins any object that has
        a ``pin_memory`` method), so a later ``.to("cuda", non_blocking=True)`` is asynchronous.
        The original is untouched.

        Args:
            device (ignored): accepted for the DataLoader's calling convention.

        Returns:
            NestedTensor: pinned ``tensors`` ``(B, C, *S)`` and ``mask`` ``(B, *S)`` bool.

        Raises:
            RuntimeError: from torch, when no accelerator is available to pin for.

        References:
            PyTorch ``torch.utils.data`` "Memory Pinning" (custom batch types).
        """
        return NestedTensor(self._tensors.pin_memory(), self._padding.pin_memory())

    def with_features(self, tensors: Tensor) -> "NestedTensor":
        """Pairs a feature map of this batch with this batch's padding resized to it
        (:meth:`Padding.resize`, DETR's nearest rule).

        Rectangular padding stays rectangular and is resized on the host (nothing is read back
        from the device); at the same spatial size the padding itself is shared.

        Args:
            tensors (Tensor[B, C', *S']): features with the same batch size and spatial rank.

        Returns:
            NestedTensor: ``tensors`` with padding ``(B, *S')``.

        Raises:
            ValueError: another batch size or spatial rank.
        """
        # shape[0], not len(self): len() would turn a symbolic batch size into a constant
        if (
            not isinstance(tensors, Tensor)
            or tensors.dim() != self._tensors.dim()
            or tensors.shape[0] != self._tensors.shape[0]
        ):
            shape = tuple(tensors.shape) if isinstance(tensors, Tensor) else type(tensors).__name__
            raise ValueError(
                f"tensors must have shape (B={len(self)}, C, *S) with {self.num_axes} spatial axes, got {shape}"
            )
        if self._padding.kind == "none":  # sizes come from the features (symbolic when traced)
            return NestedTensor(tensors, None)
        return NestedTensor(tensors, self._padding.resize(tuple(tensors.shape[2:])))

    @property
    def device(self) -> torch.device:
        return self._tensors.device

    @property
    def dtype(self) -> torch.dtype:
        return self._tensors.dtype

    @property
    def shape(self) -> torch.Size:
        return self._tensors.shape

    def __repr__(self) -> str:
        mask = "None" if self._padding.kind == "none" else f"bool{list(self._tensors.shape[:1]) + list(self._tensors.shape[2:])}"
        return (
            f"NestedTensor(tensors={self._tensors.dtype}{list(self._tensors.shape)}, mask={mask}, "
            f"device={self._tensors.device}, padding={self._padding.kind!r})"
        )


def _check_image_sizes(image_sizes: Any, tensors: Tensor) -> tuple[tuple[int, ...], ...]:
    sizes = check_spans(image_sizes, "image_sizes", tensors.dim() - 2)
    if len(sizes) != tensors.shape[0]:
        raise ValueError(f"image_sizes must have one entry per batch item ({tensors.shape[0]}), got {len(sizes)}")
    for i, size in enumerate(sizes):
        if any(not 0 <= s <= m for s, m in zip(size, tensors.shape[2:])):
            raise ValueError(
                f"image_sizes[{i}] = {size} must have {tensors.dim() - 2} entries, each within the "
                f"padded size {tuple(tensors.shape[2:])}"
            )
    return sizes


def _check_claims(padding: Padding, image_sizes: Any, rectangular: bool, tensors: Tensor) -> None:
    """Holds ``image_sizes`` and ``rectangular`` against the padding read from the mask."""
    if rectangular and padding.kind == "arbitrary":
        raise ValueError(
            "rectangular=True but the mask is not per-item boxes (it has holes, or valid cells "
            "outside one box per item); leave rectangular=False for such masks"
        )
    if image_sizes is None:
        return
    sizes = _check_image_sizes(image_sizes, tensors)
    actual = padding.sizes
    for i, (claimed, found) in enumerate(zip(sizes, actual)):
        if tuple(claimed) != tuple(found):
            raise ValueError(
                f"image_sizes[{i}] = {tuple(claimed)} disagrees with the mask, whose item {i} has "
                f"valid region {found} (starts {padding.starts[i]}); a NestedTensor holds one truth: "
                "pass the mask alone, or image_sizes alone (mask=None)"
            )


# ------------------------------------------------------------------------ reading encoder input
class SpatialInput(NamedTuple):
    """What a spatial encoder was given, read once (see :func:`vispos.nested_tensor.parse_spatial_input`).

    Attributes:
        padding (Padding): which cells are valid; its ``batch``, ``spatial`` and ``device``
            are the input's.
        host (bool): host-side facts may be used for this call (:func:`vispos._tracing.host_facts`:
            False while tracing or capturing a CUDA graph).
    """

    padding: Padding
    host: bool


@_deprecation.renamed_kwargs(n_spatial="num_axes")
def parse_spatial_input(x: Any, num_axes: int | None = None) -> SpatialInput:
    """Reads what a spatial encoder was given: a batch, a padding mask or a feature map.

    Args:
        x (NestedTensor | NestedTensorLike | Padding | Tensor[B, *S] bool | Tensor[B, C, *S]
            float): a padded batch (vispos' :class:`NestedTensor`, or any object with DETR's
            ``.tensors`` / ``.mask`` / ``.decompose()``); its :class:`~vispos.Padding` itself; a
            mask (True = padding); or features meaning "no padding". ``S`` has 1 to 3 axes.
        num_axes (int, optional): the encoder's number of spatial axes, when it has one.
            Without it a 3-dim floating tensor is refused: a 1D feature map ``(B, C, L)`` cannot
            be told from a float mask ``(B, H, W)`` (with it, the encoder checks the rank and
            :func:`float_mask_hint` says what a wrong one may be).

    Returns:
        SpatialInput: ``(padding, host)``. A bool mask on the host is classified (rectangular or
        not) when ``host``; a NestedTensor's own padding is used as it is.

    Raises:
        TypeError: ``x`` is of another type; an integer mask (with a hint on how to convert); a
            3-dim floating tensor without ``num_axes`` (ambiguous, with a hint).
        ValueError: a mask or feature map of the wrong rank; a batch whose mask does not match
            its tensors.

    References:
        DETR's ``PositionEmbeddingSine.forward`` takes a ``NestedTensor``; the mask and feature
        forms follow transformers' and timm's encoders.
    """
    if isinstance(x, NestedTensor):
        tensors = x.tensors
        host = _tracing.host_facts(tensors.device)
        padding = x.padding
        if padding.kind == "none":  # sizes from the tensors: symbolic when traced
            padding = _unpadded(tensors)
        return SpatialInput(padding, host)
    if isinstance(x, Padding):
        return SpatialInput(x, _tracing.host_facts(x.device))
    if not isinstance(x, Tensor) and isinstance(x, NestedTensorLike):
        tensors, mask = x.decompose()
        name = type(x).__name__
        if not isinstance(tensors, Tensor) or not 3 <= tensors.dim() <= 2 + MAX_SPATIAL:
            got = tuple(tensors.shape) if isinstance(tensors, Tensor) else type(tensors).__name__
            raise ValueError(f"{name}.tensors must be a Tensor (B, C, *S) with 1 to 3 spatial axes, got {got}")
        host = _tracing.host_facts(tensors.device)
        if mask is None:
            return SpatialInput(_unpadded(tensors), host)
        check_mask(mask, f"{name}.mask")
        expected = (tensors.shape[0], *tensors.shape[2:])
        if tuple(mask.shape) != expected:
            raise ValueError(f"{name}.mask must have shape (B, *S) = {expected}, got {tuple(mask.shape)}")
        return SpatialInput(Padding.from_mask(mask, classify=host and _tracing.host_side(mask.device)), host)
    if not isinstance(x, Tensor):
        raise TypeError(
            "x must be a NestedTensor, a bool mask (B, *S) or a feature map (B, C, *S) (or, as DETR's "
            f"NestedTensor, any object with .tensors, .mask and .decompose()), got {type(x).__name__}"
        )
    host = _tracing.host_facts(x.device)
    if x.dtype == torch.bool:
        if not 2 <= x.dim() <= 1 + MAX_SPATIAL:
            raise ValueError(f"a mask must have shape (B, *S) with 1 to 3 spatial axes, got {tuple(x.shape)}")
        return SpatialInput(Padding.from_mask(x, classify=host and _tracing.host_side(x.device)), host)
    if not (x.is_floating_point() or x.is_complex()):
        check_mask(x)  # an integer mask: raises the conversion hint
    if x.dim() == 3 and num_axes is None:
        raise TypeError(
            f"x is a floating tensor of shape {tuple(x.shape)}: a float mask (B, H, W) and a 1D "
            "feature map (B, C, L) look alike. A mask must have dtype torch.bool with True "
            "marking padding: pass `mask.bool()` (or `~pixel_mask.bool()` for a transformers-"
            "style pixel_mask where 1 marks valid pixels); pass a 1D feature map as "
            "NestedTensor(x, None)"
        )
    if not 3 <= x.dim() <= 2 + MAX_SPATIAL:
        raise ValueError(
            "a feature map must have shape (B, C, *S) with 1 to 3 spatial axes, got "
            f"{tuple(x.shape)}; pass a bool mask (B, *S) to embed padded positions"
        )
    return SpatialInput(_unpadded(x), host)


def _unpadded(tensors: Tensor) -> Padding:
    """No padding over ``tensors`` ``(B, C, *S)`` (a shape that is valid by construction)."""
    return Padding._make("none", tensors.shape[0], tuple(tensors.shape[2:]), tensors.device)


def float_mask_hint(x: Any, num_axes: int) -> str:
    """A hint for an encoder's rank error: empty, or, for a bare floating tensor with the rank of
    a mask ``(B, *S)`` of ``num_axes`` axes, how to pass a mask."""
    if isinstance(x, Tensor) and x.is_floating_point() and x.dim() == num_axes + 1:
        return (
            f"; x has the rank of a mask (B, *S) with {num_axes} spatial axes: a mask must have "
            "dtype torch.bool with True marking padding (pass `mask.bool()`)"
        )
    return ""
