"""Figures of encodings and padded batches, each returned as a ``matplotlib.figure.Figure``.

Nothing here writes a file or shows a window: figures are drawn with matplotlib's object API on
an Agg canvas (importing vispos never changes the global backend) and handed back; the app's
:mod:`vispos.app.png` writes them as PNGs, all or nothing. Padding is drawn one way everywhere
(opaque grey, hatched, on top of the cells; one legend wording). One module per kind of figure:

* :mod:`~vispos.app.figures.channels`: :func:`encode_grid`, channel heatmaps, sin/cos curves,
  the wavelength ladder;
* :mod:`~vispos.app.figures.similarity`: cosine-similarity maps of query cells, per item and
  per feature level (2D images and 3D volume slices);
* :mod:`~vispos.app.figures.batches`: padded batches and DETR's normalised coordinates;
* :mod:`~vispos.app.figures.rotary`: the relative-offset invariance of rotary embeddings;
* :mod:`~vispos.app.figures.vision_rope`: vision RoPE's period bands and its padded batches;
* :mod:`~vispos.app.figures.leak`: a backbone's features alone against in a padded batch.
"""

from .batches import plot_normalized_coords, plot_padded_batch
from .leak import padding_leak_maps, plot_padding_leak
from .channels import channel_wavelengths, encode_grid, plot_channels, plot_sincos_curves, plot_wavelengths
from .rotary import plot_rotary_invariance
from .vision_rope import plot_rope_padding, plot_rope_periods, rope_grid, rope_periods, rope_variants
from .similarity import (
    cosine_similarity_map,
    plot_level_similarity,
    plot_similarity,
    plot_volume_level_similarity,
    query_cells,
)

__all__ = [
    "cosine_similarity_map",
    "query_cells",
    "plot_similarity",
    "plot_level_similarity",
    "plot_volume_level_similarity",
    "encode_grid",
    "channel_wavelengths",
    "plot_channels",
    "plot_sincos_curves",
    "plot_wavelengths",
    "plot_padded_batch",
    "plot_normalized_coords",
    "plot_rotary_invariance",
    "rope_variants",
    "rope_grid",
    "rope_periods",
    "plot_rope_periods",
    "plot_rope_padding",
    "padding_leak_maps",
    "plot_padding_leak",
]
