"""torch.compile(fullgraph=True) of the encoders: no graph breaks through the shared core."""

import copy

import pytest
import torch

import vispos
from vispos import PositionEmbeddingSine, nested_tensor_from_tensor_list


@pytest.fixture(autouse=True)
def _reset_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("normalize, offset", [(True, -0.5), pytest.param(False, 0.0, marks=pytest.mark.exhaustive)])
def test_sine_fullgraph(normalize, offset):
    pe = PositionEmbeddingSine(16, normalize=normalize, offset=offset)
    compiled = torch.compile(pe, fullgraph=True)
    mask = torch.rand(2, 6, 7, generator=torch.Generator().manual_seed(0)) > 0.5
    nt = nested_tensor_from_tensor_list([torch.randn(3, 5, 6), torch.randn(3, 7, 4)])
    for x in (mask, torch.randn(2, 3, 6, 7), nt):
        torch.testing.assert_close(compiled(x), pe(x), rtol=0, atol=1e-6)


def test_grid_and_sequence_fullgraph():
    enc = vispos.PositionalEncodingPermute2D(12)
    x = torch.randn(2, 12, 5, 6)
    torch.testing.assert_close(torch.compile(enc, fullgraph=True)(x), enc(x), rtol=0, atol=1e-6)
    seq = vispos.SinusoidalPositionalEncoding(32)
    y = torch.randn(2, 5, 32)
    torch.testing.assert_close(torch.compile(seq, fullgraph=True)(y), seq(y), rtol=0, atol=1e-6)


# --------------------------------------------------------------- dynamic shapes, the Joiner
def _inputs(kind, batch, h, w):
    g = torch.Generator().manual_seed(batch * 1000 + h)
    if kind == "mask":
        return torch.rand(batch, h, w, generator=g) > 0.4
    if kind == "features":
        return torch.randn(batch, 3, h, w, generator=g)
    return nested_tensor_from_tensor_list(
        [torch.randn(3, h - i, w - 2 * i, generator=g) for i in range(batch)]
    )


@pytest.mark.parametrize("kind", [pytest.param("mask", marks=pytest.mark.exhaustive), "features", "nested"])  # nested: a mask
def test_sine_dynamic_no_recompile(kind):
    """dynamic=True: one graph serves every batch and spatial size (a recompilation raises)."""
    from torch._dynamo.utils import counters

    pe = PositionEmbeddingSine(16, normalize=True, offset=-0.5)
    eager = copy.deepcopy(pe)  # the reference fills its own cache, not pe's
    counters.clear()
    compiled = torch.compile(pe, fullgraph=True, dynamic=True, backend="eager")
    with torch._dynamo.config.patch(error_on_recompile=True):
        for batch, h, w in [(2, 20, 24), (3, 31, 17), (4, 9, 40)]:
            x = _inputs(kind, batch, h, w)
            torch.testing.assert_close(compiled(x), eager(x), rtol=0, atol=1e-6)
    assert counters["stats"]["unique_graphs"] == 1
    assert len(pe._cache) == 0  # compiled calls never touch the Python-side cache


def _tiny_joiner():
    from vispos.backbones import Joiner, TimmBackbone

    torch.manual_seed(0)
    backbone = TimmBackbone("resnet18", out_indices=(3, 4), frozen_batch_norm=True)
    pe = PositionEmbeddingSine(16, normalize=True, offset=-0.5)
    return Joiner(backbone, pe, hidden_dim=32, num_feature_levels=3, num_groups=8).eval()


@pytest.mark.exhaustive  # 20 CPU s; the joiner's torch.export with dynamic sizes (one graph, no break) runs by default
def test_joiner_fullgraph_dynamic_no_recompile():
    """The Deformable-DETR Joiner (backbone, projections, an extra level, masks resized per level,
    position embeddings) compiles to one graph with no break, reused across input sizes. Sizes
    keep every level at >= 2 cells per axis (a size-1 level is specialised by torch itself)."""
    from torch._dynamo.utils import counters

    model = _tiny_joiner()
    counters.clear()
    compiled = torch.compile(model, fullgraph=True, dynamic=True, backend="eager")
    with torch.no_grad(), torch._dynamo.config.patch(error_on_recompile=True):
        for sizes in [[(160, 192), (130, 140)], [(200, 150), (133, 190)], [(256, 140), (140, 256), (131, 131)]]:
            nt = nested_tensor_from_tensor_list([torch.randn(3, *s) for s in sizes])
            feats, pos = compiled(nt)
            ref_feats, ref_pos = model(nt)
            for a, b in zip(pos, ref_pos):
                torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
            for a, b in zip(feats, ref_feats):
                torch.testing.assert_close(a.tensors, b.tensors)
                assert torch.equal(a.mask, b.mask)
    assert counters["stats"]["unique_graphs"] == 1
