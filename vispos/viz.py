"""Alias of the figure API (:mod:`vispos.app.figures` and :mod:`vispos.app.png`), kept so
``vispos.viz`` imports work.

Figures that return a ``matplotlib.figure.Figure`` live in :mod:`vispos.app.figures`; the two
functions that write a PNG (:func:`plot_position_similarity`, :func:`plot_volume_similarity`)
in :mod:`vispos.app.png`. Moved in issue 19; import from those modules in new code.
"""

from .app.figures import (
    channel_wavelengths,
    cosine_similarity_map,
    encode_grid,
    plot_channels,
    plot_normalized_coords,
    plot_padded_batch,
    plot_rotary_invariance,
    plot_similarity,
    plot_sincos_curves,
    plot_wavelengths,
    query_cells,
)
from .app.png import plot_position_similarity, plot_volume_similarity

__all__ = [
    "cosine_similarity_map",
    "query_cells",
    "plot_position_similarity",
    "plot_volume_similarity",
    "encode_grid",
    "channel_wavelengths",
    "plot_channels",
    "plot_sincos_curves",
    "plot_wavelengths",
    "plot_similarity",
    "plot_padded_batch",
    "plot_normalized_coords",
    "plot_rotary_invariance",
]
