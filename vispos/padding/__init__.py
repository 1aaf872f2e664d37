"""The one truth about which cells of a padded batch are valid: the :class:`Padding` value object.

A :class:`Padding` says, for a batch of ``B`` items on a grid ``S`` (1 to 3 spatial axes), which
cells are valid. It is built from per-item sizes (detectron2's ``image_sizes``; the mask is
derived exactly when asked for), from a ``bool`` mask (DETR's convention, **True = padding**;
rectangularity is decided once, on the host), or as "no padding". Every other fact is a view of
it: the mask, the per-item sizes and boxes, Deformable-DETR's valid ratios, the padding of a
feature level (:meth:`Padding.resize`). :class:`vispos.NestedTensor` holds one; the encoders
branch on :attr:`Padding.kind` only; nothing trusts a flag over it.

The mask functions of the padding's machinery (:func:`check_mask`, :func:`mask_sizes`,
:func:`interpolate_mask`, :func:`mask_valid_ratios`, :func:`attn_mask_from_padding`, ...) are
re-exported here, their documented home; the algorithms themselves live in this package's
private rooms: ``_mask_checks`` (checks), ``_masks`` (boxes), ``_mask_origin`` (DETR's
origin-anchored sizes, read with NumPy on the host by ``_masks_host``), ``_mask_resize`` (DETR's
nearest resize) and ``_mask_views`` (valid ratios, attention masks). ``valid_ratios`` (the
function) and ``SpatialInput`` are deprecated names here: use :func:`mask_valid_ratios` (or
:meth:`Padding.valid_ratios`) and :class:`vispos.nested_tensor.SpatialInput`.

References:
    Carion et al., End-to-End Object Detection with Transformers, ECCV 2020 (``util/misc.py``,
    ``models/backbone.py``); Zhu et al., Deformable DETR, ICLR 2021 (``get_valid_ratio``);
    detectron2 ``ImageList``; MONAI ``SpatialPad`` (``method="symmetric"``).
"""

from .. import _deprecation
from ._mask_checks import check_mask
from ._mask_origin import is_rectangular, matches_rectangle, rectangular_sizes, rectangular_valid
from ._mask_resize import interpolate_mask, resize_image_sizes
from ._mask_views import attn_mask_from_padding, mask_valid_ratios
from ._masks import mask_sizes
from ._value import Kind, Padding
from ._value import _restore  # noqa: F401 - pickles written before the package name vispos.padding._restore

__all__ = [
    "Padding", "Kind", "check_mask", "mask_sizes", "rectangular_sizes", "rectangular_valid",
    "is_rectangular", "matches_rectangle", "interpolate_mask", "resize_image_sizes",
    "mask_valid_ratios", "attn_mask_from_padding",
]

__getattr__ = _deprecation.alias_getattr(__name__, {
    "valid_ratios": "vispos.padding:mask_valid_ratios",  # renamed (beside Padding.valid_ratios)
    "SpatialInput": "vispos.nested_tensor:SpatialInput",  # moved beside parse_spatial_input
})
