"""MixedRotaryEmbedding: the paper's initialisation, timm's numbers and gradients, 3D, padding."""

import copy
import math
import pickle

import pytest
import torch
from torch.testing import assert_close

import vispos
from vispos import MixedRotaryEmbedding, init_mixed_freqs
from vispos.encodings import _rope_grid

timm_pe = pytest.importorskip("timm.layers.pos_embed_sincos")
TimmMixed = timm_pe.RotaryEmbeddingMixed

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _paper_init(dim, num_heads, theta=10.0):
    """naver-ai/rope-vit ``init_random_2d_freqs``, statement by statement (one block)."""
    freqs_x, freqs_y = [], []
    mag = 1 / (theta ** (torch.arange(0, dim, 4)[: (dim // 4)].float() / dim))
    for _ in range(num_heads):
        angles = torch.rand(1) * 2 * torch.pi
        freqs_x.append(torch.cat([mag * torch.cos(angles), mag * torch.cos(torch.pi / 2 + angles)], dim=-1))
        freqs_y.append(torch.cat([mag * torch.sin(angles), mag * torch.sin(torch.pi / 2 + angles)], dim=-1))
    return torch.stack([torch.stack(freqs_x, dim=0), torch.stack(freqs_y, dim=0)], dim=0)


def _paper_cis(freqs, end_x, end_y):
    """naver-ai/rope-vit ``init_t_xy`` + ``compute_mixed_cis``: complex ``exp(i angle)``,
    (depth, heads, N, head_dim / 2)."""
    t = torch.arange(end_x * end_y, dtype=torch.float32)
    t_x, t_y = (t % end_x).float(), torch.div(t, end_x, rounding_mode="floor").float()
    depth, heads = freqs.shape[1], freqs.shape[2]
    flat = freqs.reshape(2, depth, -1)
    fx = (t_x.unsqueeze(-1) @ flat[0].unsqueeze(-2)).view(depth, -1, heads, flat.shape[-1] // heads).permute(0, 2, 1, 3)
    fy = (t_y.unsqueeze(-1) @ flat[1].unsqueeze(-2)).view(depth, -1, heads, flat.shape[-1] // heads).permute(0, 2, 1, 3)
    return torch.polar(torch.ones_like(fx), fx + fy)


def test_init_is_the_papers_and_timms():
    torch.manual_seed(0)
    ours = init_mixed_freqs(32, 3, 4)
    torch.manual_seed(0)
    paper = torch.stack([_paper_init(32, 4) for _ in range(3)], dim=1)  # the paper stacks blocks on dim 1
    torch.manual_seed(0)
    theirs = timm_pe.init_random_2d_freqs(32, 3, 4)
    assert torch.equal(ours, paper) and torch.equal(ours, theirs)
    torch.manual_seed(1)
    module = MixedRotaryEmbedding(128, 3, 4)
    torch.manual_seed(1)
    assert torch.equal(module.freqs, TimmMixed(128, 3, 4).freqs)
    assert module.freqs.requires_grad and module.no_weight_decay() == {"freqs"}


def test_3d_init_is_an_orthonormal_frame_per_head():
    torch.manual_seed(0)
    freqs = init_mixed_freqs(24, 2, 3, num_axes=3)  # L = 4 magnitudes per direction
    assert freqs.shape == (3, 2, 3, 12)
    mag = 1 / 10.0 ** (torch.arange(0, 24, 6) / 24)
    frame = freqs.view(3, 2, 3, 3, 4) / mag  # [axis, d, h, group, l]
    assert_close(frame[..., 1:], frame[..., :1].expand_as(frame[..., 1:]))  # one direction per group
    u = frame[..., 0].permute(1, 2, 0, 3)  # [d, h, axis, group]
    assert_close(u.transpose(-1, -2) @ u, torch.eye(3).expand(2, 3, 3, 3), atol=1e-5, rtol=0)
    torch.manual_seed(1)
    a = init_mixed_freqs(24, 200, 1, num_axes=3)
    dirs = a.view(3, 200, 3, 4)[..., 0].permute(1, 2, 0).reshape(-1, 3)
    assert dirs.mean(0).abs().max() < 0.1  # no preferred direction


@pytest.mark.parametrize("indexing", ["xy", "ij"])
@pytest.mark.parametrize("feat_shape", [None, [6, 7]])
def test_equals_timm_bitwise(indexing, feat_shape):
    torch.manual_seed(3)
    theirs = TimmMixed(96, 2, 3, grid_indexing=indexing, feat_shape=feat_shape)
    ours = MixedRotaryEmbedding.from_timm(theirs)
    for shape in ([6, 7], [3, 11], [1, 1]):
        assert torch.equal(ours.get_embed(shape), theirs.get_embed(shape))
        with torch.no_grad():
            assert torch.equal(ours.get_embed(shape), theirs.get_embed(shape))
        assert torch.equal(ours.get_embed(shape, dtype=torch.bfloat16), theirs.get_embed(shape, dtype=torch.bfloat16))
    if feat_shape:
        assert torch.equal(ours.get_embed(), theirs.get_embed())
        ours.update_feat_shape([2, 5])
        theirs.update_feat_shape([2, 5])
        assert torch.equal(ours.get_embed(), theirs.get_embed())
        assert torch.equal(ours.t_x, theirs.t_x) and torch.equal(ours.t_y, theirs.t_y)


def test_equals_the_papers_complex_rotation():
    torch.manual_seed(0)
    rope = MixedRotaryEmbedding(64, 2, 4)  # head_dim 16, "xy": t_x = column, as the paper
    cis = _paper_cis(rope.freqs.detach(), end_x=5, end_y=3)  # W = 5, H = 3
    table = rope.get_embed([3, 5]).detach()
    assert_close(table[..., 0:16:2], cis.imag)
    assert_close(table[..., 16:32:2], cis.real)


def test_gradients_equal_timm():
    torch.manual_seed(0)
    theirs = TimmMixed(64, 2, 4)
    ours = MixedRotaryEmbedding.from_timm(theirs)
    weight = torch.randn(2, 4, 20, 32)
    (theirs.get_embed([4, 5]) * weight).sum().backward()
    (ours.get_embed([4, 5]) * weight).sum().backward()
    assert_close(ours.freqs.grad, theirs.freqs.grad)
    mask = torch.zeros(2, 4, 5, dtype=torch.bool)
    mask[1, 2:] = True
    ours.freqs.grad = None
    (ours.get_embed(mask=mask)[:, 0] * weight).sum().backward()
    assert_close(ours.freqs.grad, theirs.freqs.grad)


def test_batch_embeds_forward_and_state_as_timm():
    torch.manual_seed(0)
    theirs = TimmMixed(64, 3, 2, feat_shape=[4, 4])
    ours = MixedRotaryEmbedding.from_timm(theirs)
    shapes = [(2, 3), (4, 4), (1, 5)]
    for a, b in zip(ours.get_batch_embeds(shapes), theirs.get_batch_embeds(shapes)):
        assert torch.equal(a, b)
    assert torch.equal(ours.get_batch_embeds(shapes, seq_len=20), theirs.get_batch_embeds(shapes, seq_len=20))
    x = torch.randn(2, 64, 3, 5)
    for block in range(3):
        assert_close(ours(x, block), theirs(x, block))
    assert_close(ours(x, -1), theirs(x, 2))
    assert ours.state_dict().keys() == theirs.state_dict().keys() == {"freqs"}
    assert dict(ours.named_buffers()).keys() == dict(theirs.named_buffers()).keys() == {"t_x", "t_y"}
    fresh = MixedRotaryEmbedding(64, 3, 2, feat_shape=[4, 4])
    fresh.load_state_dict(theirs.state_dict(), strict=True)
    assert torch.equal(fresh.get_embed(), theirs.get_embed())
    # .half(): freqs follow, positions stay float32 (timm's rule)
    half_ours, half_theirs = copy.deepcopy(ours).half(), copy.deepcopy(theirs).half()
    assert half_ours.t_x.dtype == half_theirs.t_x.dtype == torch.float32
    assert torch.equal(half_ours.get_embed(), half_theirs.get_embed())


@pytest.mark.parametrize("augs", [dict(shift_coords=1.0), dict(jitter_coords=1.4), dict(rescale_coords=2.0),
                                  dict(shift_coords=0.5, jitter_coords=1.2, rescale_coords=1.3)])
def test_training_draws_equal_timm(augs):
    torch.manual_seed(0)
    theirs = TimmMixed(64, 2, 2, **augs).train()
    ours = MixedRotaryEmbedding.from_timm(theirs)
    for seed in range(3):
        torch.manual_seed(seed)
        a = theirs.get_embed([3, 4])
        torch.manual_seed(seed)
        assert torch.equal(ours.get_embed([3, 4]), a)
    torch.manual_seed(7)
    a = theirs.get_batch_embeds([(2, 2), (3, 4)], seq_len=12)
    torch.manual_seed(7)
    assert torch.equal(ours.get_batch_embeds([(2, 2), (3, 4)], seq_len=12), a)
    state = torch.get_rng_state()
    ours.eval()
    assert torch.equal(ours.get_embed([3, 4]), theirs.eval().get_embed([3, 4]))
    assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.parametrize("indexing", ["xy", "ij"])
def test_3d_equals_the_formula(indexing):
    torch.manual_seed(0)
    rope = MixedRotaryEmbedding(48, 2, 2, grid_indexing=indexing, num_axes=3)
    spatial = (3, 4, 5)
    pos = torch.stack(torch.meshgrid(*[torch.arange(s, dtype=torch.float32) for s in spatial], indexing="ij"), -1)
    pos = pos.reshape(-1, 3)
    if indexing == "xy":
        pos = pos[:, [1, 0, 2]]  # channel 0 <- axis 1, as timm swaps the first two axes
    f = rope.freqs.detach()  # [3, D, H, K]
    angles = torch.einsum("na,adhk->dhnk", pos, f)
    expected = torch.cat([angles.sin().repeat_interleave(2, -1), angles.cos().repeat_interleave(2, -1)], -1)
    assert_close(rope.get_embed(list(spatial)).detach(), expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("num_axes", [2, 3])
@pytest.mark.parametrize("device", DEVICES)
def test_padded_items_get_their_alone_rotation(num_axes, device):
    spatial = (6, 7) if num_axes == 2 else (4, 5, 3)
    boxes = ([((0, 0), (6, 7)), ((1, 2), (4, 3)), ((0, 3), (6, 4))] if num_axes == 2
             else [((0, 0, 0), (4, 5, 3)), ((1, 1, 0), (2, 3, 3)), ((0, 2, 1), (4, 3, 2))])
    mask = torch.ones(len(boxes), *spatial, dtype=torch.bool)
    for b, (start, size) in enumerate(boxes):
        mask[(b,) + tuple(slice(a, a + s) for a, s in zip(start, size))] = False
    torch.manual_seed(0)
    rope = MixedRotaryEmbedding(8 * num_axes * 2, 2, 2, num_axes=num_axes).to(device)
    with torch.no_grad():
        table = rope.get_embed(mask=mask.to(device))
        assert table.shape == (2, len(boxes), 2, math.prod(spatial), 8 * num_axes * 2)
        for b, (start, size) in enumerate(boxes):
            item = table[:, b].reshape(2, 2, *spatial, -1)[(slice(None),) * 2 + tuple(slice(a, a + s) for a, s in zip(start, size))]
            assert torch.equal(item.reshape(2, 2, math.prod(size), -1), rope.get_embed(list(size)))
            pad = mask[b].flatten().to(device)
            hd = table.shape[-1] // 2
            assert (table[:, b][:, :, pad, :hd] == 0).all() and (table[:, b][:, :, pad, hd:] == 1).all()


def test_forward_with_mask_rotates_each_item_at_its_own_grid():
    torch.manual_seed(0)
    rope = MixedRotaryEmbedding(32, 2, 2)
    mask = torch.ones(2, 4, 5, dtype=torch.bool)
    mask[0] = False
    mask[1, 1:3, 2:5] = False
    x = torch.randn(2, 32, 4, 5)
    with torch.no_grad():
        out = rope(x, 1, mask=mask)
        assert_close(out[0], rope(x[:1], 1)[0])
        assert_close(out[1][:, 1:3, 2:5], rope(x[1:, :, 1:3, 2:5], 1)[0])
        assert torch.equal(out[1][:, mask[1]], x[1][:, mask[1]])


def test_padded_scope_and_device_branch(monkeypatch):
    torch.manual_seed(0)
    rope = MixedRotaryEmbedding(32, 2, 2)
    mask = torch.zeros(2, 3, 4, dtype=torch.bool)
    mask[1, :, 2:] = True
    with torch.no_grad():
        direct, plain = rope.get_embed(mask=mask), rope.get_embed([3, 4])
        with rope.padded(mask):
            assert torch.equal(rope.get_embed([3, 4]), direct)
            assert torch.equal(rope.get_batch_embeds([(3, 4)])[0], plain)  # grids: never the scope's batch
        monkeypatch.setattr(vispos._tracing, "host_side", lambda device: False)
        monkeypatch.setattr(_rope_grid, "host_side", lambda device: False)
        assert torch.equal(rope.get_embed(mask=mask), direct)


def test_repr_pickle_and_from_timm_errors():
    rope = MixedRotaryEmbedding(64, 2, 4, feat_shape=[3, 3], grid_indexing="ij", shift_coords=0.5).eval()
    assert repr(rope) == (
        "MixedRotaryEmbedding(dim=64, depth=2, num_heads=4, temperature=10.0, feat_shape=[3, 3], "
        "grid_indexing='ij', shift_coords=0.5, num_axes=2)"
    )
    for clone in (copy.deepcopy(rope), pickle.loads(pickle.dumps(rope))):
        assert torch.equal(clone.get_embed(), rope.get_embed())
    with pytest.raises(TypeError, match="RotaryEmbeddingMixed"):
        MixedRotaryEmbedding.from_timm(vispos.DinoV3RotaryEmbedding(8))


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(dim=64, depth=2, num_heads=3), ValueError, "multiple of num_heads"),
        (dict(dim=24, depth=2, num_heads=4), ValueError, "head_dim must be a multiple of 4"),
        (dict(dim=48, depth=2, num_heads=2, num_axes=3), ValueError, None),
        (dict(dim=64, depth=0, num_heads=4), ValueError, "depth"),
        (dict(dim=64, depth=2.0, num_heads=4), TypeError, "depth"),
        (dict(dim="64", depth=2, num_heads=4), TypeError, "dim"),
        (dict(dim=64, depth=2, num_heads=4, temperature=-1.0), ValueError, "temperature"),
        (dict(dim=64, depth=2, num_heads=4, grid_indexing="ji"), ValueError, "grid_indexing"),
        (dict(dim=64, depth=2, num_heads=4, feat_shape=[3]), ValueError, "feat_shape"),
        (dict(dim=64, depth=2, num_heads=4, jitter_coords=0.9), ValueError, "jitter_coords"),
        (dict(dim=64, depth=2, num_heads=4, num_axes=1), ValueError, "num_axes"),
    ],
)
def test_constructor_errors(kwargs, exc, match):
    if match is None:  # 48 / 2 heads = 24 per head: a multiple of 6, accepted
        MixedRotaryEmbedding(**kwargs)
        return
    with pytest.raises(exc, match=match):
        MixedRotaryEmbedding(**kwargs)


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda r: r.get_embed(), ValueError, "needs a shape"),
        (lambda r: r.get_embed([2, 2, 2]), ValueError, "shape must hold 2 ints"),
        (lambda r: r.get_embed(mask=torch.zeros(1, 3, 3, dtype=torch.uint8)), TypeError, "bool"),
        (lambda r: r(torch.zeros(1, 32, 3, 3), 2), IndexError, "block_index"),
        (lambda r: r(torch.zeros(1, 32, 3, 3), 0.5), TypeError, "block_index"),
        (lambda r: r(torch.zeros(1, 16, 3, 3)), ValueError, "dim=32"),
        (lambda r: r(torch.zeros(2, 32, 3, 3), mask=torch.zeros(1, 3, 3, dtype=torch.bool)), ValueError, "mask has 1 item but x has 2"),
        (lambda r: r.get_batch_embeds([(3, 3)], seq_len=4), ValueError, "seq_len"),
    ],
)
def test_call_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call(MixedRotaryEmbedding(32, 2, 2))


@pytest.mark.slow
@pytest.mark.exhaustive  # the RoPE get_embed(mask=) compile runs by default in test_dinov3_rope.py
def test_compiles_fullgraph_with_a_mask():
    torch.manual_seed(0)
    rope = MixedRotaryEmbedding(32, 2, 2)
    mask = torch.zeros(2, 5, 6, dtype=torch.bool)
    mask[1, 1:4, 2:] = True
    compiled = torch.compile(lambda m: rope.get_embed(mask=m), fullgraph=True, dynamic=False)
    with torch.no_grad():
        assert_close(compiled(mask), rope.get_embed(mask=mask), rtol=0, atol=1e-5)
