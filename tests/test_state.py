"""State of every public module: state_dict round trips, deepcopy, pickle, ``.to(dtype/device)``,
construction on the meta device (then ``to_empty`` + ``load_state_dict``), derived tables kept
out of ``state_dict``, and caches that never return stale results."""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch

import vispos
from vispos import nested_tensor_from_tensor_list
from vispos.transformer import DetrEncoder
from vispos.backbones import (
    FrozenBatchNorm3d,
    Joiner,
    TimmBackbone,
    TorchvisionBackbone,
    VolumeBackbone,
)

G = torch.Generator().manual_seed(0)
MASK = torch.rand(2, 5, 6, generator=G) > 0.4
NT2D = nested_tensor_from_tensor_list([torch.randn(3, 64, 48, generator=G), torch.randn(3, 40, 64, generator=G)])
NT3D = nested_tensor_from_tensor_list([torch.randn(1, 16, 16, 12, generator=G), torch.randn(1, 12, 16, 16, generator=G)])


def _tiny_joiner():
    return Joiner(
        TimmBackbone("resnet18", out_indices=(3, 4), frozen_batch_norm=True),
        vispos.PositionEmbeddingSine(16, normalize=True), hidden_dim=32, num_feature_levels=3, num_groups=8,
    )


# name -> (factory, input); every public nn.Module of the package
MODULES = {
    "PositionEmbeddingSine": (lambda: vispos.PositionEmbeddingSine(8, normalize=True, offset=-0.5), MASK),
    "PositionEmbeddingSineDepthAdded": (lambda: vispos.PositionEmbeddingSineDepthAdded(8, normalize=True), torch.rand(2, 3, 4, 5, generator=G) > 0.3),
    "PositionEmbeddingLearned": (lambda: vispos.PositionEmbeddingLearned(8, num_embeddings=10), torch.randn(2, 3, 5, 6, generator=G)),
    "PositionalEncoding1D": (lambda: vispos.PositionalEncoding1D(6), torch.randn(2, 7, 6, generator=G)),
    "PositionalEncoding2D": (lambda: vispos.PositionalEncoding2D(6), torch.randn(2, 5, 4, 6, generator=G)),
    "PositionalEncodingPermute3D": (lambda: vispos.PositionalEncodingPermute3D(6), torch.randn(2, 6, 3, 4, 5, generator=G)),
    "Summer": (lambda: vispos.Summer(vispos.PositionalEncodingPermute2D(6)), torch.randn(2, 6, 4, 5, generator=G)),
    "FixEncoding": (lambda: vispos.FixEncoding(vispos.PositionalEncoding2D(6), (5, 4)), torch.randn(2, 5, 4, 6, generator=G)),
    "SinusoidalPositionalEncoding": (lambda: vispos.SinusoidalPositionalEncoding(16, learnable_scale=True), torch.randn(2, 7, 16, generator=G)),
    "LearnableSinusoidalPositionalEncoding": (lambda: vispos.LearnableSinusoidalPositionalEncoding(16, hidden_dim=8), torch.randn(2, 7, 16, generator=G)),
    "SpeechainPositionalEncoding": (lambda: vispos.SpeechainPositionalEncoding("sep", 16, emb_scale=True, emb_layernorm=True, posenc_scale=True), torch.randn(2, 7, 16, generator=G)),
    "CoordSineEmbedding": (lambda: vispos.CoordSineEmbedding(4, d_model=32, hidden_dim=16), torch.rand(2, 5, 4, generator=G)),
    "RotaryEmbedding": (lambda: vispos.RotaryEmbedding(8), torch.randn(2, 5, 8, generator=G)),
    "AxialRotaryEmbedding": (lambda: vispos.AxialRotaryEmbedding(8), torch.randn(2, 12, 8, generator=G)),
    "DetrEncoder": (lambda: DetrEncoder(32, nhead=4, num_layers=1, dim_feedforward=32, dropout=0.0), torch.randn(2, 5, 32, generator=G)),
    "FrozenBatchNorm3d": (lambda: FrozenBatchNorm3d(4), torch.randn(2, 4, 3, 3, 3, generator=G)),
    "TimmBackbone": (lambda: TimmBackbone("resnet18", out_indices=(3, 4), frozen_batch_norm=True), NT2D),
    "TorchvisionBackbone": (lambda: TorchvisionBackbone("resnet18", frozen_batch_norm=True), NT2D),
    "VolumeBackbone": (lambda: VolumeBackbone("r3d_18", return_nodes=("layer2",), stem_stride=2, frozen_batch_norm=True), NT3D),
    "Joiner": (_tiny_joiner, NT2D),
}
DERIVED = ("dim_t", "inv_freq", "pe")


def _call(module, x):
    if isinstance(module, vispos.AxialRotaryEmbedding):
        return module(x, spatial=(3, 4))
    return module(x)


def _flat(out):
    """Every tensor of a module's output, in order (levels, pos, ...)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, vispos.NestedTensor):
        return [out.tensors, out.mask]
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _flat(o)]
    raise TypeError(type(out))


def _assert_same(a, b):
    fa, fb = _flat(a), _flat(b)
    assert len(fa) == len(fb)
    for x, y in zip(fa, fb):
        torch.testing.assert_close(x, y, rtol=0, atol=0)


def _randomise(module):
    """Gives every parameter and persistent float buffer new values, so a loaded state shows."""
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 0.01)
    return module


@pytest.fixture(params=list(MODULES), scope="module")
def case(request):
    factory, x = MODULES[request.param]
    torch.manual_seed(0)
    module = _randomise(factory()).eval()
    with torch.no_grad():
        ref = _call(module, x)
    return request.param, factory, x, module, ref


def test_state_dict_round_trip(case):
    _, factory, x, module, ref = case
    state = module.state_dict()
    assert not any(k.split(".")[-1] in DERIVED for k in state), sorted(state)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    torch.manual_seed(123)
    other = factory().eval()
    other.load_state_dict(torch.load(buffer, weights_only=True), strict=True)
    with torch.no_grad():
        _assert_same(_call(other, x), ref)


def test_deepcopy_and_pickle(case):
    _, _, x, module, ref = case
    for clone in (copy.deepcopy(module), pickle.loads(pickle.dumps(module))):
        with torch.no_grad():
            _assert_same(_call(clone, x), ref)
    with torch.no_grad():  # the original still answers the same after being copied
        _assert_same(_call(module, x), ref)


def _to64(x):
    if isinstance(x, vispos.NestedTensor) or (isinstance(x, torch.Tensor) and x.is_floating_point()):
        return x.to(torch.float64)
    return x


def test_to_dtype_and_back(case):
    """float64 and back is lossless for float32 weights: the same outputs, no stale cache."""
    _, _, x, module, ref = case
    m = copy.deepcopy(module).to(torch.float64)
    with torch.no_grad():
        out = _call(m, _to64(x))
    for o, r in zip(_flat(out), _flat(ref)):
        assert o.shape == r.shape
        if o.is_floating_point():
            torch.testing.assert_close(o.float(), r.float(), rtol=1e-4, atol=1e-4)
    for n, b in m.named_buffers():
        if n.split(".")[-1] in DERIVED:
            assert b.dtype == torch.float32, n  # derived tables stay float32 whatever the cast
    m = m.to(torch.float32)
    with torch.no_grad():
        _assert_same(_call(m, x), ref)


def test_meta_construction(case):
    """Built on the meta device (no memory, no compute), materialised with ``to_empty`` and
    loaded from a checkpoint: the same outputs as the original, derived tables included."""
    _, factory, x, module, ref = case
    with torch.device("meta"):
        meta = factory()
    assert all(p.is_meta for p in meta.parameters())
    real = meta.to_empty(device="cpu").eval()
    real.load_state_dict(module.state_dict(), strict=True)
    with torch.no_grad():
        _assert_same(_call(real, x), ref)


# -------------------------------------------------------------------------------- staleness
def test_sine_cache_not_stale_after_to_and_parameter_change():
    pe = vispos.PositionEmbeddingSine(8, normalize=True)
    first = pe(MASK).clone()
    pe(MASK)  # the second sighting is stored
    assert len(pe._cache) == 1
    pe.to(torch.float64)  # a move or cast empties the cache and rebuilds dim_t in float32
    assert len(pe._cache) == 0 and pe.dim_t.dtype == torch.float32
    torch.testing.assert_close(pe(MASK), first, rtol=0, atol=0)
    for attr, value in (("temperature", 20), ("num_pos_feats", 16), ("offset", -0.5), ("normalize", False)):
        setattr(pe, attr, value)
        kwargs = {k: getattr(pe, k) for k in ("num_pos_feats", "temperature", "normalize", "offset")}
        if not kwargs["normalize"]:
            fresh = vispos.PositionEmbeddingSine(**kwargs)
        else:
            fresh = vispos.PositionEmbeddingSine(**kwargs, scale=pe.scale)
        for x in (MASK, NT2D, torch.randn(2, 3, 5, 6)):
            torch.testing.assert_close(pe(x), fresh(x), rtol=0, atol=0)


def test_grid_cache_not_stale_after_to_empty_and_half():
    enc = vispos.PositionalEncodingPermute2D(6)
    x = torch.randn(2, 6, 4, 5)
    ref = enc(x).clone()
    enc.half()
    assert enc.inv_freq.dtype == torch.float32 and len(enc._tables) == 0
    torch.testing.assert_close(enc(x.half()), ref.half(), rtol=0, atol=0)
    with torch.device("meta"):
        meta = vispos.PositionalEncodingPermute2D(6)
    real = meta.to_empty(device="cpu")  # nothing to load: the table must be recomputed
    torch.testing.assert_close(real(x), ref, rtol=0, atol=0)


def test_learned_and_joiner_follow_parameter_updates():
    """Learned tables and the Joiner's level embedding are parameters, never cached: a changed
    weight shows in the next call."""
    learned = vispos.PositionEmbeddingLearned(8, num_embeddings=10)
    x = torch.randn(2, 3, 5, 6)
    before = learned(x).clone()
    with torch.no_grad():
        learned.row_embed.weight.add_(1.0)
    assert not torch.equal(learned(x), before)
    pe = vispos.PositionEmbeddingSine(8, normalize=True)
    out = pe(MASK)
    try:  # a caller writing into a returned embedding never corrupts the next answer
        out.add_(1.0)
    except RuntimeError:
        pass
    torch.testing.assert_close(pe(MASK), vispos.PositionEmbeddingSine(8, normalize=True)(MASK))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_to_cuda_and_back(case):
    """``.to("cuda")`` moves parameters and derived tables (rebuilt on the GPU), and back."""
    _, _, x, module, ref = case
    m = copy.deepcopy(module).to("cuda")
    for n, b in m.named_buffers():
        assert b.is_cuda, n
    with torch.no_grad():
        out = _call(m, x.to("cuda"))
    for o, r in zip(_flat(out), _flat(ref)):
        assert o.is_cuda and o.shape == r.shape
        torch.testing.assert_close(o.cpu().float(), r.float(), rtol=1e-4, atol=1e-4)
    with torch.no_grad():
        _assert_same(_call(m.to("cpu"), x), ref)
