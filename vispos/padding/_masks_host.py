"""The first reading of :func:`~vispos.padding._masks.find_boxes`, with NumPy where the mask is on the host.

Whether a padding mask is DETR's origin-anchored boxes is read from the lines through the origin
(each item's valid sizes) and one comparison with the boxes of those sizes. On a small CPU mask
(DETR's C5 is ``4 x 25 x 42``) the few torch ops this takes cost 5-10 us each in dispatch, NumPy's
on the same memory (no copy) about 1 us: a plain CPU tensor is read through ``Tensor.numpy()``,
any other (an accelerator's, a tensor subclass such as a fake tensor) with the torch ops.
Both give the same Python ints and bools.

References:
    The padding of DETR's ``nested_tensor_from_tensor_list`` (items at the origin).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from torch import Tensor

from ._mask_origin import origin_boxes, rectangular_sizes

__all__ = ["origin_mismatch"]


def origin_mismatch(mask: Tensor, spatial: Sequence[int]) -> tuple[list, list]:
    """Each item's valid sizes along the lines through the origin, and whether the item has a
    cell that is padding inside the box ``[0, sizes)`` or valid outside it.

    Args:
        mask (Tensor[B, *S], bool): True marks padding; ``B > 0``, no zero-size axis.
        spatial (sequence of int): ``S``.

    Returns:
        (list, list): ``B`` lists of ``n`` ints (as :func:`~vispos.padding._mask_origin.rectangular_sizes`),
        ``B`` bools (True: not that box).

    Raises:
        Nothing beyond torch's own errors (an internal step: the mask was checked).
    """
    if type(mask) is not Tensor or mask.device.type != "cpu":  # the device form (no host read but the last)
        sizes = rectangular_sizes(mask)
        wrong = (mask == origin_boxes(sizes, spatial)).flatten(1).any(1)
        return sizes.tolist(), wrong.tolist()
    host = mask.numpy()
    n = host.ndim - 1
    valid = ~host
    sizes, inside = [], None
    for i in range(n):
        size = valid[(slice(None),) + tuple(slice(None) if j == i else 0 for j in range(n))].sum(1)
        sizes.append(size)
        shape = [1] * (1 + n)
        shape[1 + i] = spatial[i]
        axis = np.arange(spatial[i]).reshape(shape) < size.reshape([-1] + [1] * n)
        inside = axis if inside is None else inside & axis
    wrong = (host == inside).reshape(host.shape[0], -1).any(1)
    return np.stack(sizes, 1).tolist(), wrong.tolist()
