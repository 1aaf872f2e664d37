"""The public names of vispos, written once: ``vispos.__all__`` and ``vispos.encodings.__all__``.

Torch-free, so ``import vispos`` can state its ``__all__`` without importing the API
(:mod:`vispos._lazy` imports it on first use). :mod:`vispos.encodings` takes its ``__all__`` from
:data:`ENCODINGS`; :mod:`vispos` takes :data:`TOP_LEVEL` and finds each name in
:data:`TOP_LEVEL_MODULES`. Add a public name here, then import it in its package.
"""

from __future__ import annotations

__all__ = ["ENCODINGS", "CORE", "TOP_LEVEL", "TOP_LEVEL_MODULES"]

#: ``vispos.encodings.__all__``: every encoding, in the order of the docs
ENCODINGS: tuple[str, ...] = (
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
    "timm_sincos_2d",
    "mae_sincos_2d",
    "monai_sincos",
    "monai_fourier",
    "dino_sine",
    "PositionEmbeddingSineDepthAdded",
    "PositionEmbeddingRandom",
    "SamPositionalEmbedding",
    "rtdetr_sincos_2d",
)

#: the encodings' names that stay in :mod:`vispos.encodings` only
_ENCODINGS_ONLY = frozenset({"cumulative_positions"})

#: vispos' own public names besides the encodings: caching, padded batches, configs
CORE: tuple[str, ...] = (
    "CacheInfo",
    "caching",
    "is_caching_enabled",
    "set_caching",
    "Padding",
    "attn_mask_from_padding",
    "NestedTensor",
    "nested_tensor_from_tensor_list",
    "interpolate_mask",
    "collate_fn",
    "PaddedCollate",
    "build_from_config",
    "register",
    "register_invariance_rule",
    "make_padding_invariant",
    "CellWise",
    "PaddingAware",
    "Refuse",
    "RuleBook",
)

#: ``vispos.__all__`` (``__version__`` lives in ``vispos/__init__.py`` itself)
TOP_LEVEL: tuple[str, ...] = ("__version__", *CORE, *(n for n in ENCODINGS if n not in _ENCODINGS_ONLY))

#: the modules (relative to ``vispos``) that the first use of a top-level name imports; each
#: name is bound from the first of them that has it
TOP_LEVEL_MODULES: tuple[str, ...] = (
    "._cache", "._cache_switch", ".padding", ".nested_tensor", ".batching", ".encodings", ".config",
    ".invariance",
)
