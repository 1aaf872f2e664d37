"""vispos: spatial positional embeddings for vision models.

Padded 2D/3D batches (:class:`NestedTensor`), one N-D sinusoidal core behind every sine
encoding, DETR's :class:`PositionEmbeddingSine`, and backbone adapters that join them.

The names below are imported on first use (PEP 562, :mod:`vispos._lazy`): ``import vispos``
alone does not import torch, and the first ``vispos.NAME`` (or ``from vispos import NAME``)
imports the whole public API from :mod:`vispos._api` at once, submodules included, exactly as
an eager import would.
"""

import typing as _typing

from . import _lazy

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "CacheInfo",
    "caching",
    "is_caching_enabled",
    "set_caching",
    "Padding",
    "NestedTensor",
    "nested_tensor_from_tensor_list",
    "interpolate_mask",
    "collate_fn",
    "PaddedCollate",
    "PositionEmbeddingSine",
    "PositionEmbeddingLearned",
    "PositionalEncoding1D",
    "PositionalEncoding2D",
    "PositionalEncoding3D",
    "PositionalEncodingPermute1D",
    "PositionalEncodingPermute2D",
    "PositionalEncodingPermute3D",
    "Summer",
    "FixEncoding",
    "resample_abs_pos_embed",
    "SinusoidalPositionalEncoding",
    "LearnableSinusoidalPositionalEncoding",
    "SpeechainPositionalEncoding",
    "sine_embed_coords",
    "CoordSineEmbedding",
    "RotaryEmbedding",
    "AxialRotaryEmbedding",
    "apply_rotary",
    "DinoV3RotaryEmbedding",
    "MixedRotaryEmbedding",
    "init_mixed_freqs",
    "apply_rot_embed_cat",
    "attn_mask_from_padding",
    "timm_sincos_2d",
    "mae_sincos_2d",
    "monai_sincos",
    "dino_sine",
    "PositionEmbeddingSineDepthAdded",
    "build_from_config",
    "register",
]

__getattr__, __dir__ = _lazy.load_on_first_use(globals(), ["._api"])

if _typing.TYPE_CHECKING:  # type checkers and IDEs see the names eagerly
    from ._api import *  # noqa: F403
