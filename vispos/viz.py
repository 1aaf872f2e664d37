"""Deprecated alias of the figure API (:mod:`vispos.app.figures` and :mod:`vispos.app.png`),
kept so ``vispos.viz`` imports work for one more release; importing it warns.

Figures that return a ``matplotlib.figure.Figure`` live in :mod:`vispos.app.figures`; the
functions that write PNGs (:func:`~vispos.app.png.save_figure`, ``plot_position_similarity``,
``plot_volume_similarity``, ``png_writer``) in :mod:`vispos.app.png`. Moved; import from those
modules. Every public name of both is here (``__all__`` is theirs, joined).
"""

from ._deprecation import warn_module

warn_module("vispos.viz", "vispos.app.figures (figures) and vispos.app.png (PNG files)")

from .app import figures as _figures, png as _png  # noqa: E402 - after the warning
from .app.figures import *  # noqa: E402,F401,F403 - the alias re-exports the modules' public API
from .app.png import *  # noqa: E402,F401,F403

__all__ = list(_figures.__all__) + [n for n in _png.__all__ if n not in _figures.__all__]
