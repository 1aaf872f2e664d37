"""Every public function and method that produces sines and takes a ``dtype`` refuses an integer
or bool dtype, and a dtype given as a string, with a ``TypeError`` naming the argument (an
integer table would hold truncated sines, 0 and 1; ``.to("float16")`` reads a device string).

``CALLS`` holds one call per (public name, method) that takes ``dtype``; a test finds every such
signature in :data:`vispos.__all__` and checks that ``CALLS`` covers it.
"""

from __future__ import annotations

import inspect

import pytest
import torch

import vispos

_MASK = torch.zeros(1, 3, 4, dtype=torch.bool)

CALLS = {
    ("PositionEmbeddingSine", "forward"): lambda d: vispos.PositionEmbeddingSine(8)(_MASK, dtype=d),
    ("PositionEmbeddingLearned", "forward"): lambda d: vispos.PositionEmbeddingLearned(8)(_MASK, dtype=d),
    ("PositionEmbeddingSineDepthAdded", "forward"): lambda d: vispos.PositionEmbeddingSineDepthAdded(8)(
        torch.zeros(1, 2, 3, 4, dtype=torch.bool), dtype=d),
    ("PositionEmbeddingRandom", "forward"): lambda d: vispos.PositionEmbeddingRandom(8)((3, 4), dtype=d),
    ("PositionEmbeddingRandom", "forward_with_coords"): lambda d: vispos.PositionEmbeddingRandom(8).forward_with_coords(
        torch.rand(3, 2), (4, 4), dtype=d),
    ("SamPositionalEmbedding", "forward_with_coords"): lambda d: vispos.SamPositionalEmbedding(8).forward_with_coords(
        torch.rand(3, 2), (4, 4), dtype=d),
    ("DinoV3RotaryEmbedding", "__init__"): lambda d: vispos.DinoV3RotaryEmbedding(32, dtype=d),
    ("DinoV3RotaryEmbedding", "get_embed"): lambda d: vispos.DinoV3RotaryEmbedding(32).get_embed([4, 4], dtype=d),
    ("DinoV3RotaryEmbedding", "get_batch_embeds"): lambda d: vispos.DinoV3RotaryEmbedding(32).get_batch_embeds(
        [(4, 4)], dtype=d),
    ("MixedRotaryEmbedding", "__init__"): lambda d: vispos.MixedRotaryEmbedding(32, 1, 2, dtype=d),
    ("MixedRotaryEmbedding", "get_embed"): lambda d: vispos.MixedRotaryEmbedding(32, 1, 2).get_embed([4, 4], dtype=d),
    ("MixedRotaryEmbedding", "get_batch_embeds"): lambda d: vispos.MixedRotaryEmbedding(32, 1, 2).get_batch_embeds(
        [(4, 4)], dtype=d),
    ("init_mixed_freqs", ""): lambda d: vispos.init_mixed_freqs(32, 1, 2, dtype=d),
    ("timm_sincos_2d", ""): lambda d: vispos.timm_sincos_2d((4, 5), 16, dtype=d),
    ("mae_sincos_2d", ""): lambda d: vispos.mae_sincos_2d(16, (4, 5), dtype=d),
    ("monai_sincos", ""): lambda d: vispos.monai_sincos((4, 4, 4), 24, dtype=d),
    ("monai_fourier", ""): lambda d: vispos.monai_fourier((4, 4, 4), 24, dtype=d),
    ("rtdetr_sincos_2d", ""): lambda d: vispos.rtdetr_sincos_2d(4, 5, 16, dtype=d),
    ("rtdetr_sincos_2d", "padding"): lambda d: vispos.rtdetr_sincos_2d(3, 4, 16, padding=_MASK, dtype=d),
}
#: methods with a ``dtype`` parameter that are not entry points (private helpers, Padding's ratios)
_NOT_SINES = {("Padding", "valid_ratios")}


def _public_dtype_signatures():
    found = set()
    for name in vispos.__all__:
        obj = getattr(vispos, name)
        if inspect.isclass(obj):
            for meth, fn in inspect.getmembers(obj, inspect.isfunction):
                if meth.startswith("_") and meth != "__init__":
                    continue
                if "dtype" in inspect.signature(fn).parameters:
                    found.add((name, meth))
        elif callable(obj):
            try:
                params = inspect.signature(obj).parameters
            except (TypeError, ValueError):
                continue
            if "dtype" in params:
                found.add((name, ""))
    return found


def test_calls_cover_every_public_dtype_argument():
    missing = _public_dtype_signatures() - set(CALLS) - _NOT_SINES
    assert not missing, missing


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.bool])
@pytest.mark.parametrize("call", list(CALLS), ids=lambda c: ".".join(filter(None, c)))
def test_integer_and_bool_dtypes_are_refused(call, dtype):
    with pytest.raises(TypeError, match=rf"dtype must be a floating torch\.dtype.*got {dtype}"):
        CALLS[call](dtype)


@pytest.mark.parametrize("call", list(CALLS), ids=lambda c: ".".join(filter(None, c)))
def test_string_dtypes_are_refused_with_the_reason(call):
    with pytest.raises(TypeError, match=r"dtype must be a floating torch\.dtype such as torch\.float16, got 'float16' \(str\)"):
        CALLS[call]("float16")


@pytest.mark.parametrize("call", list(CALLS), ids=lambda c: ".".join(filter(None, c)))
def test_floating_dtypes_are_taken(call):
    out = CALLS[call](torch.float64)
    if isinstance(out, torch.Tensor):
        assert out.dtype == torch.float64
