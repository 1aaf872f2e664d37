import copy
import pickle

import pytest
import torch
from rotary_embedding_torch import RotaryEmbedding as PeerRotary
from rotary_embedding_torch import apply_rotary_emb as peer_apply
from torch.testing import assert_close

from vispos.encodings.rotary import AxialRotaryEmbedding, RotaryEmbedding, apply_rotary_sincos

EXACT = dict(rtol=0, atol=0)


def slow_rotary(x, positions, dim, theta=10000.0):
    """RoFormer's rotation written pair by pair in float64: positions (L,), x (..., L, C)."""
    out = x.double().clone()
    for i in range(dim // 2):
        angle = positions.double()[:, None] * theta ** (-2 * i / dim)
        c, s = torch.cos(angle), torch.sin(angle)
        x0, x1 = x[..., 2 * i].double(), x[..., 2 * i + 1].double()
        out[..., 2 * i] = x0 * c[:, 0] - x1 * s[:, 0]
        out[..., 2 * i + 1] = x0 * s[:, 0] + x1 * c[:, 0]
    return out


# ----------------------------------------------------------------------------- parity
@pytest.mark.parametrize("dim, head", [(64, 64), (32, 64), (16, 24)])
def test_1d_parity_with_rotary_embedding_torch(dim, head):
    torch.manual_seed(0)
    q = torch.randn(2, 3, 257, head)
    expected = PeerRotary(dim).rotate_queries_or_keys(q)
    assert_close(RotaryEmbedding(dim)(q), expected, **EXACT)


def test_1d_parity_seq_before_heads_and_offset():
    torch.manual_seed(0)
    q = torch.randn(2, 50, 4, 32)  # (B, L, H, C)
    peer = PeerRotary(32, seq_before_head_dim=True)
    assert_close(RotaryEmbedding(32, seq_dim=-3)(q), peer.rotate_queries_or_keys(q), **EXACT)
    q = torch.randn(2, 4, 10, 32)
    expected = PeerRotary(32, cache_if_possible=False).rotate_queries_or_keys(q, offset=7)
    positions = torch.arange(7, 17)
    assert_close(RotaryEmbedding(32)(q, positions=positions), expected, **EXACT)


@pytest.mark.parametrize("shape", [(9, 11), (4, 5, 6)])
def test_axial_parity_with_rotary_embedding_torch(shape):
    torch.manual_seed(0)
    n = len(shape)
    axis_dim = 16
    x = torch.randn(2, *shape, n * axis_dim + 8)
    freqs = PeerRotary(axis_dim).get_axial_freqs(*shape)
    expected = peer_apply(freqs, x)
    assert_close(AxialRotaryEmbedding(n * axis_dim, num_axes=n)(x), expected, **EXACT)


def test_1d_against_formula(device):
    torch.manual_seed(0)
    x = torch.randn(2, 40, 12, device=device)
    out = RotaryEmbedding(8, theta=100.0)(x)
    assert_close(out, slow_rotary(x.cpu(), torch.arange(40), 8, 100.0).float().to(device))


# ----------------------------------------------------------------------------- invariants
def test_norm_is_preserved(device):
    torch.manual_seed(0)
    x = torch.randn(3, 4, 100, 32, device=device)
    assert_close(RotaryEmbedding(32)(x).norm(dim=-1), x.norm(dim=-1))
    g = torch.randn(2, 6, 7, 48, device=device)
    assert_close(AxialRotaryEmbedding(48)(g).norm(dim=-1), g.norm(dim=-1))


@pytest.mark.parametrize("shift", [1, 5, 333])
def test_dot_product_depends_on_relative_offset_only(shift, device):
    torch.manual_seed(0)
    rope = RotaryEmbedding(32)
    q, k = torch.randn(32, device=device, dtype=torch.float64), torch.randn(32, device=device, dtype=torch.float64)
    m, n = torch.tensor([3.0], device=device), torch.tensor([10.0], device=device)
    qm, kn = rope(q[None], positions=m), rope(k[None], positions=n)
    qs, ks = rope(q[None], positions=m + shift), rope(k[None], positions=n + shift)
    assert_close((qm * kn).sum(), (qs * ks).sum(), rtol=1e-5, atol=1e-5)


def test_axial_dot_product_depends_on_offsets_only(device):
    torch.manual_seed(0)
    rope = AxialRotaryEmbedding(24, num_axes=3)
    q, k = torch.randn(24, device=device), torch.randn(24, device=device)

    def dot(pq, pk):
        a = rope(q[None], positions=torch.tensor([pq], device=device, dtype=torch.float32))
        b = rope(k[None], positions=torch.tensor([pk], device=device, dtype=torch.float32))
        return (a * b).sum()

    base = dot((1, 2, 3), (4, 0, 7))
    assert_close(dot((11, 7, 5), (14, 5, 9)), base, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(dot((1, 2, 3), (4, 0, 8)), base)


# ----------------------------------------------------------------------------- layouts
def test_axial_spatial_and_positions_agree(device):
    torch.manual_seed(0)
    rope = AxialRotaryEmbedding(32)
    x = torch.randn(2, 4, 6, 7, 40, device=device)  # (B, heads, H, W, C)
    grid = rope(x)
    flat = rope(x.flatten(2, 3), spatial=(6, 7))
    assert_close(flat, grid.flatten(2, 3), **EXACT)
    coords = torch.stack(torch.meshgrid(torch.arange(6), torch.arange(7), indexing="ij"), -1).flatten(0, 1)
    per_token = rope(x.flatten(2, 3), positions=coords.to(device))
    assert_close(per_token, grid.flatten(2, 3), **EXACT)
    # a subset of tokens (MAE-style kept tokens) rotates like the same tokens of the full grid
    keep = torch.tensor([0, 5, 17, 41], device=device)
    kept = rope(x.flatten(2, 3)[:, :, keep], positions=coords.to(device)[keep])
    assert_close(kept, grid.flatten(2, 3)[:, :, keep], **EXACT)


def test_axial_blocks_are_1d_rotary_per_axis(device):
    torch.manual_seed(0)
    x = torch.randn(5, 7, 16, device=device)
    out = AxialRotaryEmbedding(16)(x)
    rows = RotaryEmbedding(8)(x[..., :8].transpose(0, 1)).transpose(0, 1)  # position = row index
    cols = RotaryEmbedding(8)(x[..., 8:])  # position = column index
    assert_close(out, torch.cat((rows, cols), dim=-1), **EXACT)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_uses_exact_positions(dtype, device):
    torch.manual_seed(0)
    x = torch.randn(1, 1, 2000, 16, device=device)
    out = RotaryEmbedding(16)(x.to(dtype))
    assert out.dtype == dtype
    # positions and angles in float32: equal to rotating the rounded input in float32, cast once
    assert_close(out, RotaryEmbedding(16)(x.to(dtype).float()).to(dtype), **EXACT)


def test_apply_rotary_function(device):
    torch.manual_seed(0)
    rope = RotaryEmbedding(16)
    q, k = torch.randn(2, 3, 9, 16, device=device), torch.randn(2, 3, 9, 20, device=device)
    q_before, k_before = q.clone(), k.clone()
    sin, cos = rope.sincos(torch.arange(9, device=device))
    assert sin.shape == cos.shape == (9, 8) and sin.dtype == torch.float32
    rq, rk = apply_rotary_sincos(q, k, sin, cos)
    assert_close(rq, rope(q), **EXACT)
    assert_close(rk, rope(k), **EXACT)
    assert torch.equal(rk[..., 16:], k[..., 16:])
    assert apply_rotary_sincos(q, None, sin, cos)[1] is None
    assert torch.equal(q, q_before) and torch.equal(k, k_before)


def test_modules_are_stateless_and_repr():
    rope = RotaryEmbedding(32, theta=500.0, seq_dim=-3)
    assert rope.extra_repr() == "dim=32, theta=500.0, seq_dim=-3"
    assert RotaryEmbedding(8).extra_repr() == "dim=8, theta=10000.0, seq_dim=-2"
    axial = AxialRotaryEmbedding(48, num_axes=3, theta=100)
    assert axial.extra_repr() == "dim=48, num_axes=3, theta=100"
    assert AxialRotaryEmbedding(8).extra_repr() == "dim=8, num_axes=2, theta=10000.0"
    assert axial.axis_dim == 16
    assert rope.state_dict() == {} and axial.state_dict() == {}
    x = torch.randn(2, 5, 3, 32)
    for clone in (pickle.loads(pickle.dumps(rope)), copy.deepcopy(rope)):
        assert_close(clone(x), rope(x), **EXACT)


def test_gradients_flow(device):
    x = torch.randn(2, 4, 16, device=device, requires_grad=True)
    RotaryEmbedding(16)(x).pow(2).sum().backward()
    assert_close(x.grad, 2 * x.detach())  # rotation is orthogonal: d|Rx|^2/dx = 2x


# ----------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    "ctor, exc, match",
    [
        (lambda: RotaryEmbedding(7), ValueError, r"dim must be a positive multiple of 2 \(channels are rotated in pairs\), got 7"),
        (lambda: RotaryEmbedding(0), ValueError, r"dim must be a positive multiple of 2 .*got 0"),
        (lambda: RotaryEmbedding(8.0), TypeError, r"dim must be a positive int, got 8.0 \(float\)"),
        (lambda: RotaryEmbedding(8, theta=0), ValueError, r"theta must be a finite number > 0, got 0"),
        (lambda: RotaryEmbedding(8, theta="1e4"), TypeError, r"theta must be a positive number, got '1e4'"),
        (lambda: RotaryEmbedding(8, seq_dim=-1), ValueError, r"seq_dim must be <= -2 .*got -1"),
        (lambda: RotaryEmbedding(8, seq_dim=1.0), TypeError, r"seq_dim must be an int, got 1.0 \(float\)"),
        (lambda: AxialRotaryEmbedding(16, num_axes=4), ValueError, r"num_axes must be one of \(2, 3\), got 4"),
        (lambda: AxialRotaryEmbedding(16, num_axes="2"), TypeError, r"num_axes must be one of \(2, 3\), got '2' \(str\)"),
        (lambda: AxialRotaryEmbedding(20, num_axes=3), ValueError, r"dim must be a positive multiple of 6 .*got 20"),
        (lambda: AxialRotaryEmbedding(16, theta=-1.0), ValueError, r"theta must be a finite number > 0, got -1.0"),
    ],
)
def test_constructor_errors(ctor, exc, match):
    with pytest.raises(exc, match=match):
        ctor()


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda: RotaryEmbedding(8)([1.0]), TypeError, r"x must be a floating Tensor .*got list"),
        (lambda: RotaryEmbedding(8)(torch.zeros(4, 8, dtype=torch.long)), TypeError, r"x must be a floating tensor, got torch.int64"),
        (lambda: RotaryEmbedding(8)(torch.zeros(8)), ValueError, r"x must have shape \(\.\.\., L, C\) with L at seq_dim=-2, got \(8,\)"),
        (lambda: RotaryEmbedding(8)(torch.zeros(4, 6)), ValueError, r"x has 6 channels but dim=8 are rotated"),
        (lambda: RotaryEmbedding(8)(torch.zeros(4, 8), positions=torch.arange(5)), ValueError,
         r"positions of shape \(5,\) must broadcast to \(4,\)"),
        (lambda: RotaryEmbedding(8)(torch.zeros(4, 8), positions=torch.ones(4, dtype=torch.bool)), TypeError,
         r"positions must be a real-valued tensor, got torch.bool"),
        (lambda: RotaryEmbedding(8)(torch.zeros(4, 8), positions=[0, 1, 2, 3]), TypeError,
         r"positions must be a Tensor .*got list"),
        (lambda: AxialRotaryEmbedding(8)(torch.zeros(5, 8)), ValueError, r"x must have shape \(\.\.\., \*S, C\) with 2 grid axes, got \(5, 8\)"),
        (lambda: AxialRotaryEmbedding(8)(torch.zeros(2, 3, 4)), ValueError, r"x has 4 channels but dim=8 are rotated"),
        (lambda: AxialRotaryEmbedding(8)(torch.zeros(6, 8), spatial=(2, 3), positions=torch.zeros(6, 2)), ValueError,
         r"pass spatial or positions, not both"),
        (lambda: AxialRotaryEmbedding(8)(torch.zeros(6, 8), spatial=(2, 4)), ValueError,
         r"spatial \(2, 4\) has 8 cells but x has N=6 tokens"),
        (lambda: AxialRotaryEmbedding(8)(torch.zeros(6, 8), spatial=(6,)), ValueError,
         r"spatial must hold 2 ints, got \(6,\)"),
        (lambda: AxialRotaryEmbedding(8)(torch.zeros(6, 8), spatial=(2.0, 3)), TypeError,
         r"spatial must hold ints, got \(2.0, 3\)"),
        (lambda: AxialRotaryEmbedding(8)(torch.zeros(6, 8), spatial=(-2, -3)), ValueError,
         r"spatial must hold positive ints, got \(-2, -3\)"),
        (lambda: AxialRotaryEmbedding(8)(torch.zeros(6, 8), positions=torch.zeros(6, 3)), ValueError,
         r"positions must have shape \(\.\.\., num_axes=2\), got \(6, 3\)"),
        (lambda: AxialRotaryEmbedding(8)(torch.zeros(6, 8), positions=torch.zeros(5, 2)), ValueError,
         r"positions of shape \(5,\) must broadcast to \(6,\)"),
    ],
)
def test_forward_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


@pytest.mark.parametrize(
    "args, exc, match",
    [
        ((torch.zeros(3, 8), None, torch.zeros(3, 4), torch.zeros(3, 3)), ValueError,
         r"sin and cos must have the same shape, got \(3, 4\) and \(3, 3\)"),
        ((torch.zeros(3, 6), None, torch.zeros(3, 4), torch.zeros(3, 4)), ValueError,
         r"q has 6 channels but sin / cos rotate 8 \(2 \* 4\)"),
        ((torch.zeros(3, 8), torch.zeros(3, 4), torch.zeros(3, 4), torch.zeros(3, 4)), ValueError,
         r"k has 4 channels but sin / cos rotate 8"),
        ((torch.zeros(3, 8), None, torch.zeros(5, 4), torch.zeros(5, 4)), ValueError,
         r"sin / cos of shape \(5, 4\) do not broadcast against q of shape \(3, 8\)"),
        ((torch.zeros(3, 8, dtype=torch.long), None, torch.zeros(3, 4), torch.zeros(3, 4)), TypeError,
         r"q must be a floating tensor, got torch.int64"),
        ((torch.zeros(3, 8), None, "sin", torch.zeros(3, 4)), TypeError, r"sin must be a floating Tensor, got str"),
    ],
)
def test_apply_rotary_errors(args, exc, match):
    with pytest.raises(exc, match=match):
        apply_rotary_sincos(*args)


@pytest.mark.parametrize(
    "args, exc, match",
    [
        ((torch.zeros(2, 4), torch.zeros(2, 6)), ValueError, "2 \\* C channels"),
        ((torch.zeros(2, 3), torch.zeros(2, 6)), ValueError, "even"),
        ((torch.zeros(2, 4), torch.zeros(3, 8)), ValueError, "does not broadcast"),
        ((torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 8)), TypeError, "floating"),
        (("x", torch.zeros(2, 8)), TypeError, "Tensor"),
        ((torch.zeros(2, 4), torch.zeros(2, 8), 1), TypeError, "half"),
    ],
)
def test_apply_rot_embed_cat_errors(args, exc, match):
    from vispos import apply_rot_embed_cat

    with pytest.raises(exc, match=match):
        apply_rot_embed_cat(*args)


@pytest.mark.parametrize("half", [True, False])
def test_apply_rot_embed_cat_is_a_rotation_and_leaves_inputs(half):
    """Norm preserved per pair, inputs untouched, bf16 in float32 then cast (timm's promotion)."""
    from vispos import apply_rot_embed_cat

    torch.manual_seed(0)
    angles = torch.rand(5, 3) * 6
    sin, cos = angles.sin(), angles.cos()
    lay = (lambda t: torch.cat([t, t], -1)) if half else (lambda t: t.repeat_interleave(2, -1))
    emb = torch.cat([lay(sin), lay(cos)], -1)
    x = torch.randn(2, 5, 6)
    x0, e0 = x.clone(), emb.clone()
    out = apply_rot_embed_cat(x, emb, half)
    pairs = (lambda t: t.view(*t.shape[:-1], 2, 3).transpose(-1, -2)) if half else (lambda t: t.view(*t.shape[:-1], 3, 2))
    torch.testing.assert_close(pairs(out).norm(dim=-1), pairs(x).norm(dim=-1))
    assert torch.equal(x, x0) and torch.equal(emb, e0)
    low = apply_rot_embed_cat(x.bfloat16(), emb, half)
    assert low.dtype == torch.bfloat16
    torch.testing.assert_close(low.float(), apply_rot_embed_cat(x.bfloat16().float(), emb, half), atol=1e-2, rtol=1e-2)
