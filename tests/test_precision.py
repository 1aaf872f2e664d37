"""Half precision and autocast: embeddings equal the float32 result rounded once to the output
dtype, for positions up to 100,000 along an axis; a naive half-precision computation does not.

Angles are computed in float32 whatever the input or output dtype (DESIGN.md, "Precision").
"""

from __future__ import annotations

import pytest
import torch

from vispos import (
    NestedTensor,
    PositionalEncodingPermute1D,
    PositionEmbeddingSine,
    SinusoidalPositionalEncoding,
    nested_tensor_from_tensor_list,
)

HALF = [torch.float16, torch.bfloat16]
LONG = 100_000


def _long_mask(device, n_axes=1):
    """Two items, the second padded; positions up to LONG along the last axis. In 2D the second
    item's padding is not rectangular (the general path)."""
    if n_axes == 1:
        mask = torch.zeros(2, LONG, dtype=torch.bool, device=device)
        mask[1, 60_000:] = True
        return mask
    mask = torch.zeros(2, 2, LONG, dtype=torch.bool, device=device)
    mask[1, 0, 70_000:] = True
    mask[1, 1, 30_000:] = True
    return mask


def _assert_rounded(out, ref32, dtype):
    assert out.dtype == dtype and ref32.dtype == torch.float32
    torch.testing.assert_close(out, ref32.to(dtype), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("n_axes", [1, 2])
def test_half_output_is_rounded_float32(device, dtype, normalize, n_axes):
    pe = PositionEmbeddingSine(8, normalize=normalize)
    mask = _long_mask(device, n_axes)
    ref = pe(mask)
    assert (~mask).sum(-1).max() == LONG
    _assert_rounded(pe(mask, dtype=dtype), ref, dtype)


@pytest.mark.parametrize("dtype", HALF)
def test_half_inputs(device, dtype):
    """Half-precision feature maps and batches: float32 embeddings unless asked, and the same
    positions as float32 inputs."""
    pe = PositionEmbeddingSine(8, offset=-0.5, normalize=True)
    items = [torch.randn(1, LONG, device=device), torch.randn(1, 40_000, device=device)]
    nt32 = nested_tensor_from_tensor_list(items)
    nt = nested_tensor_from_tensor_list([t.to(dtype) for t in items])
    ref = pe(nt32)
    torch.testing.assert_close(pe(nt), ref, rtol=0, atol=0)
    _assert_rounded(pe(nt, dtype=dtype), ref, dtype)
    # the same batch without the rectangular promise (mask read as it is)
    plain = NestedTensor(nt.tensors, nt.mask)
    _assert_rounded(pe(plain, dtype=dtype), ref, dtype)
    # an unmasked half feature map
    x = torch.randn(2, 3, LONG, device=device, dtype=dtype)
    _assert_rounded(pe(NestedTensor(x, None), dtype=dtype), pe(NestedTensor(x.float(), None)), dtype)


@pytest.mark.parametrize("dtype", HALF)
def test_grid_and_sequence_encoders_in_half(device, dtype):
    """The encoders that take the input's dtype (positional-encodings, sequence) round once too."""
    enc = PositionalEncodingPermute1D(16)
    x = torch.randn(1, 16, LONG, device=device, dtype=dtype)
    _assert_rounded(enc(x), enc(x.float()), dtype)
    seq = SinusoidalPositionalEncoding(16)
    y = torch.randn(1, LONG, 16, device=device, dtype=dtype)
    out, ref = seq(y), seq(y.float())
    assert out.dtype == dtype
    torch.testing.assert_close(out, ref.to(dtype), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", HALF)
def test_autocast(device, dtype):
    """Under autocast the embedding is computed exactly as without it."""
    if device.type == "cpu" and dtype == torch.float16:
        pytest.skip("CPU autocast is bfloat16")
    pe = PositionEmbeddingSine(8, normalize=True)
    mask = _long_mask(device, 2)
    ref = pe(mask)
    pe.clear_cache()
    with torch.autocast(device.type, dtype=dtype):
        out = pe(mask)
        half = pe(mask, dtype=dtype)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    _assert_rounded(half, ref, dtype)


def test_joiner_under_autocast(device):
    """Levels computed under autocast or by a bfloat16 model get ``pos`` in their own dtype: the
    float32 embedding rounded once."""
    from vispos.backbones import Joiner, TimmBackbone

    dtype = torch.bfloat16
    model = Joiner(
        TimmBackbone("resnet18", out_indices=(3, 4), frozen_batch_norm=True),
        PositionEmbeddingSine(16, normalize=True, offset=-0.5),
    ).to(device).eval()
    nt = nested_tensor_from_tensor_list(
        [torch.randn(3, 64, 96, device=device), torch.randn(3, 40, 50, device=device)]
    )
    with torch.no_grad(), torch.autocast(device.type, dtype=dtype):
        features, pos = model(nt)
    for level, p in zip(features, pos):  # frozen batch norm may bring levels back to float32
        _assert_rounded(p, model.position_embedding(level), level.tensors.dtype)
    # a model cast to bfloat16 end to end: bfloat16 levels, pos rounded from float32 once
    model = model.to(dtype)
    with torch.no_grad():
        features, pos = model(nt.to(dtype))
    for level, p in zip(features, pos):
        assert level.tensors.dtype == dtype
        _assert_rounded(p, model.position_embedding(level), dtype)


@pytest.mark.parametrize("dtype, limit", [(torch.float16, 65504.0), (torch.bfloat16, 256.0)])
def test_naive_half_computation_is_wrong(dtype, limit):
    """What a peer computing positions and angles in the input's half dtype gets: float16
    counts overflow to inf past 65504 (NaN embeddings), bfloat16 counts lose integers past
    256 (sines off by up to 2). vispos gives the float32 values rounded once."""
    pe = PositionEmbeddingSine(8)
    mask = _long_mask("cpu")
    ref = pe(mask)
    counts = (~mask).to(dtype).cumsum(1)  # naive: DETR's cumsum in the input dtype
    angles = counts[:, None, :] / pe.dim_t.to(dtype)[None, :, None]
    naive = torch.stack([angles.sin(), angles.cos()], 2).flatten(1, 2).float()
    err = (naive - ref).abs().nan_to_num(float("inf")).max().item()
    ours = (pe(mask, dtype=dtype).float() - ref).abs().max().item()
    assert err > 1.0, err  # a wrong embedding (or NaN)
    # ours errs by the output's rounding only: half an ulp of values in [-1, 1]
    assert ours <= torch.finfo(dtype).eps / 2 + 1e-12, ours
    # the float64 truth: float32 angles are accurate to about 1e-3 at position 100,000
    counts64 = (~mask).cumsum(1, dtype=torch.float64)
    a64 = counts64[:, None, :] / (10000.0 ** (torch.arange(0, 8, 2, dtype=torch.float64) / 8))[None, :, None]
    truth = torch.stack([a64.sin(), a64.cos()], 2).flatten(1, 2)
    assert (ref.double() - truth).abs().max().item() < 3e-3
    assert (naive.double() - truth).abs().nan_to_num(float("inf")).max().item() > 1.0
    assert limit < LONG
