"""MONAI integration: padded MONAI batches with masks, and MONAI's ViT / UNETR on any volume size.

Imported only on use (``import vispos.monai``), never by ``import vispos``; needs the ``monai``
extra (``pip install 'vispos[monai]'``, MONAI >= 1.5 for attention masks in ``SABlock``).

* :class:`NestedPadCollate`, :func:`decollate_nested_batch`, :func:`recorded_padding_mask`: MONAI
  dict samples in, a ``NestedTensor`` per image key out, mask True wherever a cell is padding
  (the collate's own and what MONAI's pad transforms recorded); and back.
* :class:`AnySizeViT`, :class:`AnySizeUNETR`: MONAI's ``ViT`` / ``UNETR`` with the position
  embedding computed for each input's patch grid and padded patches masked out of attention.
* :func:`meta_spacing`: each item's voxel spacing (mm) from a ``MetaTensor`` batch's affines, for
  the ``spacing`` of vispos' position embeddings.

References:
    Cardoso et al., MONAI: An open-source framework for deep learning in healthcare, 2022.
"""

try:
    import monai as _monai  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("vispos.monai needs MONAI: pip install 'vispos[monai]'") from exc

from .collate import NestedPadCollate, decollate_nested_batch, recorded_padding_mask
from .networks import AnySizeUNETR, AnySizeViT
from .spacing import meta_spacing

__all__ = [
    "NestedPadCollate",
    "decollate_nested_batch",
    "recorded_padding_mask",
    "AnySizeViT",
    "AnySizeUNETR",
    "meta_spacing",
]
