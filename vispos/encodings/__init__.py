"""Position-encoding modules, one file per family, all over the N-D core in ``vispos._sincos``."""

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
from .learned import PositionEmbeddingLearned, resample_abs_pos_embed
from .sine import PositionEmbeddingSine, cumulative_positions

__all__ = [
    "PositionEmbeddingSine",
    "cumulative_positions",
    "PositionalEncoding1D",
    "PositionalEncoding2D",
    "PositionalEncoding3D",
    "PositionalEncodingPermute1D",
    "PositionalEncodingPermute2D",
    "PositionalEncodingPermute3D",
    "Summer",
    "FixEncoding",
    "PositionEmbeddingLearned",
    "resample_abs_pos_embed",
]
