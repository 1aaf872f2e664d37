"""Every public encoder that takes a padded batch compiles with ``fullgraph=True`` on masks and
``NestedTensor``s (vispos' and DETR's), and the ones docs/deployment.md lists export with dynamic batch and spatial
dims (in each ``frame`` of the random Fourier features), equal to eager at sizes other than the example's.

Compiles use the ``eager`` backend (the graph capture is what can break; no C++ build). The
random Fourier features and the RT-DETR table run by default, the rest under ``exhaustive``
(``pytest -m exhaustive``).
"""

from __future__ import annotations

import pytest
import torch
from torch.export import Dim

import vispos
from vispos import nested_tensor_from_tensor_list


@pytest.fixture(autouse=True)
def _reset_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _mask(*shape, seed=0):
    mask = torch.rand(*shape, generator=torch.Generator().manual_seed(seed)) > 0.6
    mask[(slice(None),) + (0,) * (len(shape) - 1)] = False
    return mask


def _nested(n_axes, seed=0):
    g = torch.Generator().manual_seed(seed)
    sizes = [(5, 6, 7)[:n_axes], (4, 7, 3)[:n_axes]]
    return nested_tensor_from_tensor_list([torch.randn(3, *s, generator=g) for s in sizes])


class _DetrNestedTensor:
    """DETR's own ``util.misc.NestedTensor`` interface (a ``NestedTensorLike``)."""

    def __init__(self, tensors, mask):
        self.tensors, self.mask = tensors, mask

    def decompose(self):
        return self.tensors, self.mask


class _OnMask(torch.nn.Module):
    """Exporters take tensors: ``fn(mask)`` as a module."""

    def __init__(self, fn, owner=None):
        super().__init__()
        self.owner = owner  # registers the encoder's buffers with the exported program
        self.fn = fn

    def forward(self, mask):
        return self.fn(mask)


def _rope(cls, **kwargs):
    torch.manual_seed(0)
    rope = cls(32, **kwargs)
    return (lambda x: rope.get_embed(mask=x)), rope


def _module(factory):
    def build():
        torch.manual_seed(0)
        pe = factory()
        return pe, pe

    return build


def _rtdetr(batch):
    height, width = (batch.shape if isinstance(batch, torch.Tensor) else batch.tensors.shape)[-2:]
    return vispos.rtdetr_sincos_2d(height, width, 16, padding=batch)


# name -> (n_axes, build() -> (fn(batch), the module holding its state, or None))
ENCODERS = {
    "PositionEmbeddingSine": (2, _module(lambda: vispos.PositionEmbeddingSine(8, normalize=True))),
    "PositionEmbeddingSine3d": (3, _module(lambda: vispos.PositionEmbeddingSine(8))),
    "PositionEmbeddingLearned": (2, _module(lambda: vispos.PositionEmbeddingLearned(8, 64))),
    "PositionEmbeddingSineDepthAdded": (3, _module(lambda: vispos.PositionEmbeddingSineDepthAdded(8, normalize=True))),
    "dino_sine": (2, _module(lambda: vispos.dino_sine(8))),
    "PositionEmbeddingRandom_canvas": (2, _module(lambda: vispos.PositionEmbeddingRandom(8))),
    "PositionEmbeddingRandom_item": (2, _module(lambda: vispos.PositionEmbeddingRandom(8, frame="item"))),
    "PositionEmbeddingRandom_3d": (3, _module(lambda: vispos.PositionEmbeddingRandom(8, num_axes=3, coord_order="ij"))),
    "rtdetr_sincos_2d": (2, lambda: (_rtdetr, None)),
    "DinoV3RotaryEmbedding": (2, lambda: _rope(vispos.DinoV3RotaryEmbedding)),
    "MixedRotaryEmbedding": (2, lambda: _rope(vispos.MixedRotaryEmbedding, depth=1, num_heads=2)),
}
#: the modules docs/deployment.md says export with dynamic batch and spatial dims
EXPORTED = [
    "PositionEmbeddingSine", "PositionEmbeddingSine3d", "PositionEmbeddingSineDepthAdded", "dino_sine",
    "PositionEmbeddingRandom_canvas", "PositionEmbeddingRandom_item", "PositionEmbeddingRandom_3d",
    "rtdetr_sincos_2d",
]


#: the ones this file runs by default (the others are covered, mask only, by test_compile.py /
#: test_export.py; here under ``slow``)
_FAST = {"PositionEmbeddingRandom_canvas", "PositionEmbeddingRandom_item", "rtdetr_sincos_2d"}


def _params(names):
    return [pytest.param(n, marks=() if n in _FAST else (pytest.mark.slow, pytest.mark.exhaustive)) for n in names]


def _assert_equal(a, b):
    torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", _params(ENCODERS))
def test_fullgraph_on_masks_and_nested_tensors(name):
    n_axes, build = ENCODERS[name]
    fn, _ = build()
    eager_fn, _ = build()
    compiled = torch.compile(fn, fullgraph=True, backend="eager")
    shape = (2, 5, 6, 7)[: 1 + n_axes]
    nested = _nested(n_axes)
    inputs = [_mask(*shape), nested]
    if "Rotary" not in name:  # the RoPEs' get_embed(mask=) takes a mask, a Padding or vispos' NestedTensor
        inputs.append(_DetrNestedTensor(*nested.decompose()))
    for x in inputs:
        _assert_equal(compiled(x), eager_fn(x))


@pytest.mark.parametrize("name", _params(EXPORTED))
def test_export_with_dynamic_batch_and_sizes(name):
    n_axes, build = ENCODERS[name]
    fn, owner = build()
    axes = [Dim("B", min=1, max=32)] + [Dim(f"S{i}", min=2, max=1024) for i in range(n_axes)]
    example = _mask(*(2, 5, 6, 7)[: 1 + n_axes])
    ep = torch.export.export(_OnMask(fn, owner), (example,), dynamic_shapes={"mask": dict(enumerate(axes))})
    eager_fn, _ = build()
    for seed, shape in enumerate([(3, 9, 4, 5), (1, 2, 11, 3), (4, 7, 3, 8)]):
        mask = _mask(*shape[: 1 + n_axes], seed=seed + 1)
        _assert_equal(ep.module()(mask), eager_fn(mask))
