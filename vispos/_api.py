"""The public API's imports: what ``vispos/__init__.py`` binds on first use of any of its names.

``import vispos`` itself imports nothing heavy (so the ``vispos`` command answers ``--help``
without torch); the first ``vispos.NAME`` imports this module, and :mod:`vispos._lazy` binds
each name of ``vispos.__all__`` from here. Add a public name here and to ``vispos.__all__``.
"""

from ._cache import CacheInfo, caching, is_caching_enabled, set_caching
from .config import build_from_config, register
from .encodings import (
    AxialRotaryEmbedding,
    CoordSineEmbedding,
    LearnableSinusoidalPositionalEncoding,
    PositionEmbeddingSineDepthAdded,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    SpeechainPositionalEncoding,
    apply_rotary,
    DinoV3RotaryEmbedding,
    MixedRotaryEmbedding,
    apply_rot_embed_cat,
    init_mixed_freqs,
    dino_sine,
    mae_sincos_2d,
    monai_sincos,
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
    PositionEmbeddingSine,
    Summer,
    resample_abs_pos_embed,
)
from .padding import Padding, attn_mask_from_padding
from .nested_tensor import (
    NestedTensor,
    PaddedCollate,
    collate_fn,
    interpolate_mask,
    nested_tensor_from_tensor_list,
)
