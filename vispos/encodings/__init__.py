"""Position-encoding modules, one file per family, all over the N-D core in ``vispos._sincos``.

Names and argument conventions: ``docs/api-conventions.md`` (which encoder mirrors which peer).
"""

from .. import _deprecation, _public

from .grid import (
    FixEncoding,
    PositionalEncoding1D,
    PositionalEncoding2D,
    PositionalEncoding3D,
    PositionalEncodingPermute1D,
    PositionalEncodingPermute2D,
    PositionalEncodingPermute3D,
    Summer,
)
from .coords import CoordSineEmbedding, sine_embed_coords
from .learned import PositionEmbeddingLearned, resample_abs_pos_embed
from .presets import (
    PositionEmbeddingSineDepthAdded,
    dino_sine,
    mae_sincos_2d,
    monai_fourier,
    monai_sincos,
    timm_sincos_2d,
)
from .random_fourier import PositionEmbeddingRandom, SamPositionalEmbedding
from .rtdetr import rtdetr_sincos_2d
from .rotary import AxialRotaryEmbedding, RotaryEmbedding, apply_rot_embed_cat, apply_rotary_sincos
from .dinov3_rope import DinoV3RotaryEmbedding
from .mixed_rope import MixedRotaryEmbedding, init_mixed_freqs
from .sequence import LearnableSinusoidalPositionalEncoding, SinusoidalPositionalEncoding
from .speechain import SpeechainPositionalEncoding
from .sine import PositionEmbeddingSine, cumulative_positions

__all__ = list(_public.ENCODINGS)  # the one list of public names (vispos._public)

__getattr__ = _deprecation.alias_getattr(__name__, {"apply_rotary": "vispos.encodings.rotary:apply_rotary_sincos"})
