"""vispos: spatial positional embeddings for vision models.

Padded 2D/3D batches (:class:`NestedTensor`), one N-D sinusoidal core behind every sine
encoding, DETR's :class:`PositionEmbeddingSine`, and backbone adapters that join them.
"""

__version__ = "0.1.0"

from . import _deprecation
from ._cache import CacheInfo
from ._cache_switch import caching, is_caching_enabled, set_caching
from .config import build_from_config, register
from .encodings import (
    AxialRotaryEmbedding,
    CoordSineEmbedding,
    LearnableSinusoidalPositionalEncoding,
    PositionEmbeddingSineDepthAdded,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    SpeechainPositionalEncoding,
    apply_rotary_sincos,
    DinoV3RotaryEmbedding,
    MixedRotaryEmbedding,
    apply_rot_embed_cat,
    init_mixed_freqs,
    dino_sine,
    mae_sincos_2d,
    monai_fourier,
    monai_sincos,
    rtdetr_sincos_2d,
    sine_embed_coords,
    timm_sincos_2d,
    FixEncoding,
    PositionalEncoding1D,
    PositionalEncoding2D,
    PositionalEncoding3D,
    PositionalEncodingPermute1D,
    PositionalEncodingPermute2D,
    PositionalEncodingPermute3D,
    PositionEmbeddingLearned,
    PositionEmbeddingRandom,
    PositionEmbeddingSine,
    SamPositionalEmbedding,
    Summer,
    resample_abs_pos_embed,
)
from .padding import Padding, attn_mask_from_padding
from .nested_tensor import NestedTensor, interpolate_mask
from .batching import PaddedCollate, collate_fn, nested_tensor_from_tensor_list

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
    "apply_rotary_sincos",
    "DinoV3RotaryEmbedding",
    "MixedRotaryEmbedding",
    "init_mixed_freqs",
    "apply_rot_embed_cat",
    "attn_mask_from_padding",
    "timm_sincos_2d",
    "mae_sincos_2d",
    "monai_sincos",
    "monai_fourier",
    "rtdetr_sincos_2d",
    "dino_sine",
    "PositionEmbeddingSineDepthAdded",
    "PositionEmbeddingRandom",
    "SamPositionalEmbedding",
    "build_from_config",
    "register",
]

#: renamed public names, each a deprecated alias for one release (docs/migration.md)
__getattr__ = _deprecation.alias_getattr(__name__, {"apply_rotary": "vispos.encodings.rotary:apply_rotary_sincos"})
