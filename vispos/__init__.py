"""vispos: spatial positional embeddings for vision models.

Padded 2D/3D batches (:class:`NestedTensor`), one N-D sinusoidal core behind every sine
encoding, DETR's :class:`PositionEmbeddingSine`, and backbone adapters that join them.

The names below are imported on first use (PEP 562, :mod:`vispos._lazy`): ``import vispos``
alone does not import torch, and the first ``vispos.NAME`` (or ``from vispos import NAME``)
imports the whole public API from :mod:`vispos._api` at once, submodules included, exactly as
an eager import would.
"""

import typing as _typing

from . import _deprecation, _lazy

__version__ = "0.1.0"

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
    "register_invariance_rule",
    "CellWise",
    "PaddingAware",
    "Refuse",
]

_load, __dir__ = _lazy.load_on_first_use(globals(), ["._api"])
#: renamed public names, each a deprecated alias for one release (docs/migration.md); any other
#: missing name loads the API (vispos._lazy)
__getattr__ = _deprecation.alias_getattr(
    __name__, {"apply_rotary": "vispos.encodings.rotary:apply_rotary_sincos"}, fallback=_load
)


if _typing.TYPE_CHECKING:  # type checkers and IDEs see the names eagerly
    from ._api import *  # noqa: F403
