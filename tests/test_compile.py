"""torch.compile(fullgraph=True) of the encoders: no graph breaks through the shared core."""

import pytest
import torch

import vispos
from vispos import PositionEmbeddingSine, nested_tensor_from_tensor_list


@pytest.fixture(autouse=True)
def _reset_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("normalize, offset", [(True, -0.5), (False, 0.0)])
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
