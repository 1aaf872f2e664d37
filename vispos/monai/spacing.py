"""Per-item voxel spacing in millimetres, read from MONAI's metadata (``MetaTensor`` affines).

The spacing of tensor axis ``j`` is the length of column ``j`` of the affine's ``3 x 3`` (``2 x 2``)
block: the world distance between two cells one step apart along that axis (MONAI's
``affine_to_spacing``, which ``MetaTensor.pixdim`` returns). It is in the tensor's spatial axis
order, the order vispos' position embeddings take a spacing in.

References:
    MONAI ``monai/data/utils.py`` (``affine_to_spacing``), ``MetaTensor.pixdim``; NIfTI-1
    (``pixdim``, the ``qform`` / ``sform`` affine), millimetres by convention.
"""

from __future__ import annotations

from typing import Any

import torch
from monai.data import MetaTensor
from monai.data.utils import affine_to_spacing
from torch import Tensor

from ..nested_tensor import NestedTensor

__all__ = ["meta_spacing"]


def meta_spacing(x: Any, dtype: torch.dtype = torch.float32) -> Tensor:
    """Each item's voxel spacing (mm) from the affine of a ``MetaTensor`` batch.

    Args:
        x (NestedTensor | MetaTensor): a batch from :class:`~vispos.monai.NestedPadCollate` (its
            ``tensors`` a batched ``MetaTensor``) or a batched ``MetaTensor`` ``(B, C, *S)``
            (``is_batch``); a single item ``(C, *S)`` gives a batch of one.
        dtype (torch.dtype): of the result. Default float32.

    Returns:
        Tensor[B, n], ``dtype``, on ``x``'s device: the spacing of every spatial axis, in tensor
        axis order (``n = len(S)``). Axes with a zero column (a degenerate affine) get 1, as in
        MONAI.

    Raises:
        TypeError: ``x`` does not hold a ``MetaTensor``.
        ValueError: the affine is not ``(n + 1) x (n + 1)`` or larger per item.

    References:
        MONAI ``affine_to_spacing`` / ``MetaTensor.pixdim``.
    """
    tensors = x.tensors if isinstance(x, NestedTensor) else x
    if not isinstance(tensors, MetaTensor):
        raise TypeError(
            "x must be a MetaTensor batch or a NestedTensor holding one (NestedPadCollate keeps "
            f"MONAI's metadata), got {type(tensors).__name__}; pass spacing as a Tensor[B, n] instead"
        )
    batched = tensors.is_batch
    n = tensors.dim() - (2 if batched else 1)
    affine = tensors.affine
    affines = affine if affine.dim() == 3 else affine.unsqueeze(0)
    if affines.shape[-1] < n + 1 or affines.shape[-1] != affines.shape[-2]:
        raise ValueError(f"the affine of shape {tuple(affine.shape)} does not cover {n} spatial axes")
    rows = [affine_to_spacing(a, r=n, dtype=torch.float64) for a in affines]
    if batched and len(rows) != tensors.shape[0]:
        rows = rows * tensors.shape[0] if len(rows) == 1 else rows
    return torch.stack([torch.as_tensor(r) for r in rows]).to(device=tensors.device, dtype=dtype)
