"""The public API's imports: what ``vispos/__init__.py`` binds on first use of any of its names.

``import vispos`` itself imports nothing heavy (so the ``vispos`` command answers ``--help``
without torch); the first ``vispos.NAME`` imports this module, and :mod:`vispos._lazy` binds
each name of ``vispos.__all__`` from here. Add a public name here and to ``vispos.__all__``.
"""

from ._cache import CacheInfo
from ._cache_switch import caching, is_caching_enabled, set_caching
from .batching import PaddedCollate, collate_fn, nested_tensor_from_tensor_list
from .config import build_from_config, register
from .encodings import (
    AxialRotaryEmbedding,
    CoordSineEmbedding,
    DinoV3RotaryEmbedding,
    FixEncoding,
    LearnableSinusoidalPositionalEncoding,
    MixedRotaryEmbedding,
    PositionalEncoding1D,
    PositionalEncoding2D,
    PositionalEncoding3D,
    PositionalEncodingPermute1D,
    PositionalEncodingPermute2D,
    PositionalEncodingPermute3D,
    PositionEmbeddingLearned,
    PositionEmbeddingRandom,
    PositionEmbeddingSine,
    PositionEmbeddingSineDepthAdded,
    RotaryEmbedding,
    SamPositionalEmbedding,
    SinusoidalPositionalEncoding,
    SpeechainPositionalEncoding,
    Summer,
    apply_rot_embed_cat,
    apply_rotary_sincos,
    dino_sine,
    init_mixed_freqs,
    mae_sincos_2d,
    monai_fourier,
    monai_sincos,
    resample_abs_pos_embed,
    rtdetr_sincos_2d,
    sine_embed_coords,
    timm_sincos_2d,
)
from .invariance import CellWise, PaddingAware, Refuse, register_invariance_rule
from .nested_tensor import NestedTensor, interpolate_mask
from .padding import Padding, attn_mask_from_padding
