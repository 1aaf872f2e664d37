"""vispos: spatial positional embeddings for vision models.

Padded 2D/3D batches (:class:`NestedTensor`), one N-D sinusoidal core behind every sine
encoding, DETR's :class:`PositionEmbeddingSine`, and backbone adapters that join them.

The names below are imported on first use (PEP 562, :mod:`vispos._lazy`): ``import vispos``
alone does not import torch, and the first ``vispos.NAME`` (or ``from vispos import NAME``)
imports the whole public API at once (the modules :data:`vispos._public.TOP_LEVEL_MODULES`),
submodules included, exactly as an eager import would. The names are written once, in
:mod:`vispos._public`.
"""

from . import _deprecation, _lazy, _public

__version__ = "0.1.0"

__all__ = list(_public.TOP_LEVEL)

_load, __dir__ = _lazy.load_on_first_use(globals(), _public.TOP_LEVEL_MODULES)
#: renamed public names, each a deprecated alias for one release (docs/migration.md); any other
#: missing name loads the API (vispos._lazy)
__getattr__ = _deprecation.alias_getattr(
    __name__, {"apply_rotary": "vispos.encodings.rotary:apply_rotary_sincos"}, fallback=_load
)
