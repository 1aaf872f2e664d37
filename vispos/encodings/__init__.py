"""Position-encoding modules, one file per family, all over the N-D core in ``vispos._sincos``."""

from .sine import PositionEmbeddingSine, cumulative_positions

__all__ = ["PositionEmbeddingSine", "cumulative_positions"]
