import copy
import pickle

import pytest
import torch
import torch.nn.functional as F
from timm.layers import resample_abs_pos_embed as timm_resample
from torch.testing import assert_close
from transformers.models.detr.modeling_detr import DetrLearnedPositionEmbedding

from vispos.encodings.learned import PositionEmbeddingLearned, resample_abs_pos_embed
from vispos.batching import nested_tensor_from_tensor_list
from vispos.nested_tensor import NestedTensor


def _hf(num_pos_feats, seed=0):
    torch.manual_seed(seed)
    hf = DetrLearnedPositionEmbedding(num_pos_feats)
    torch.nn.init.uniform_(hf.row_embeddings.weight)
    torch.nn.init.uniform_(hf.column_embeddings.weight)
    return hf


def _from_hf(hf, **kwargs):
    ours = PositionEmbeddingLearned(hf.row_embeddings.embedding_dim, **kwargs)
    with torch.no_grad():
        ours.row_embed.weight.copy_(hf.row_embeddings.weight)
        ours.col_embed.weight.copy_(hf.column_embeddings.weight)
    return ours


def slow_reference(tables, spatial, batch):
    """Cell by cell: channel block j holds the table of tensor axis n-1-j (x, then y, then z)."""
    n, feats = len(spatial), tables[0].shape[1]
    out = torch.empty(batch, n * feats, *spatial, dtype=tables[0].dtype)
    for idx in torch.cartesian_prod(*[torch.arange(s) for s in spatial]).reshape(-1, n).tolist():
        for j in range(n):
            axis = n - 1 - j
            out[(slice(None), slice(j * feats, (j + 1) * feats), *idx)] = tables[axis][idx[axis]]
    return out


# --------------------------------------------------------------------------------- DETR parity
@pytest.mark.parametrize("batch, h, w", [(1, 1, 1), (2, 17, 23), (3, 50, 50), (4, 7, 50), (1, 32, 3)])
@pytest.mark.parametrize("feats", [8, 128, 256])
def test_parity_with_transformers(batch, h, w, feats, device):
    hf = _hf(feats).to(device)
    ours = _from_hf(hf).to(device)
    x = torch.randn(batch, 3, h, w, device=device)
    expected = hf(x.shape, x.device, x.dtype)
    assert_close(ours(x), expected, rtol=0, atol=0)
    mask = torch.zeros(batch, h, w, dtype=torch.bool, device=device)
    mask[:, h // 2:] = True  # padding is ignored, as in DETR
    assert_close(ours(mask), expected, rtol=0, atol=0)
    assert_close(ours(NestedTensor(x, mask)), expected, rtol=0, atol=0)


def test_loads_detr_and_transformers_state_dicts():
    hf = _hf(16)
    detr = {"row_embed.weight": hf.row_embeddings.weight.detach().clone(),
            "col_embed.weight": hf.column_embeddings.weight.detach().clone()}
    a, b = PositionEmbeddingLearned(16), PositionEmbeddingLearned(16)
    assert not a.load_state_dict(detr, strict=True).unexpected_keys
    b.load_state_dict(hf.state_dict(), strict=True)  # row_embeddings / column_embeddings renamed
    x = torch.zeros(2, 1, 9, 11)
    assert_close(a(x), hf(x.shape, x.device, x.dtype), rtol=0, atol=0)
    assert_close(b(x), a(x), rtol=0, atol=0)
    assert set(a.state_dict()) == {"row_embed.weight", "col_embed.weight"}


def test_loads_inside_a_detr_backbone_joiner_prefix():
    ours = torch.nn.Sequential(torch.nn.Identity(), PositionEmbeddingLearned(4))
    state = {"1.row_embed.weight": torch.rand(50, 4), "1.col_embed.weight": torch.rand(50, 4)}
    ours.load_state_dict(state, strict=True)
    assert_close(ours[1].col_embed.weight, state["1.col_embed.weight"])


@pytest.mark.parametrize("spatial", [(5,), (3, 4), (2, 3, 4), (1, 6, 1)])
def test_n_d_against_slow_reference(spatial):
    m = PositionEmbeddingLearned(5, num_embeddings=(9,) * len(spatial), num_axes=len(spatial))
    x = torch.zeros(2, 7, *spatial)
    tables = [getattr(m, name).weight.detach() for name in ("depth_embed", "row_embed", "col_embed")[3 - len(spatial):]]
    assert_close(m(x), slow_reference(tables, spatial, 2), rtol=0, atol=0)


def test_table_names_and_sizes_per_axis():
    m = PositionEmbeddingLearned(4, num_embeddings=(3, 5, 7))
    assert m.num_axes == 3
    assert {k: tuple(v.shape) for k, v in m.state_dict().items()} == {
        "depth_embed.weight": (3, 4), "row_embed.weight": (5, 4), "col_embed.weight": (7, 4)}
    assert set(PositionEmbeddingLearned(4, 6, num_axes=1).state_dict()) == {"col_embed.weight"}


def test_uniform_init_as_detr():
    torch.manual_seed(0)
    m = PositionEmbeddingLearned(64, 100)
    for w in (m.row_embed.weight, m.col_embed.weight):
        assert 0 <= w.min() and w.max() < 1 and abs(w.mean().item() - 0.5) < 0.02
    before = m.row_embed.weight.detach().clone()
    m.reset_parameters()
    assert not torch.equal(before, m.row_embed.weight)


def test_output_dtype_view_and_gradient():
    m = PositionEmbeddingLearned(6, 10)
    x = torch.zeros(3, 2, 4, 5)
    out = m(x)
    assert out.shape == (3, 12, 4, 5) and out.stride(0) == 0
    assert m(x, dtype=torch.float16).dtype == torch.float16
    out.sum().backward()
    grad = torch.zeros(10, 6)
    grad[:4] = 3 * 5  # each row feeds 5 cells in 3 items
    assert_close(m.row_embed.weight.grad, grad)
    assert m.double()(x).dtype == torch.float64


def test_padded_batch_from_list():
    m = PositionEmbeddingLearned(4)
    batch = nested_tensor_from_tensor_list([torch.zeros(3, 5, 7), torch.zeros(3, 6, 4)])
    out = m(batch)
    assert out.shape == (2, 8, 6, 7)
    assert_close(out[0], out[1])


# ----------------------------------------------------------------------------- large feature maps
def test_too_large_map_raises():
    m = PositionEmbeddingLearned(4, num_embeddings=(50, 20))
    with pytest.raises(ValueError, match=r"21 cells along spatial axis 1 but the col_embed table has num_embeddings=20 rows.*interpolate=True"):
        m(torch.zeros(1, 3, 10, 21))
    hf = _hf(4)
    with pytest.raises(IndexError):  # what DETR / transformers do instead
        hf((1, 3, 51, 10), "cpu", torch.float32)


def test_interpolate_resizes_only_tables_that_are_too_short():
    m = PositionEmbeddingLearned(3, num_embeddings=(10, 4), interpolate=True)
    out = m(torch.zeros(2, 1, 6, 9))
    col = m.col_embed.weight.detach()
    resized = F.interpolate(col.t()[None], size=9, mode="linear", align_corners=False)[0].t()
    assert_close(out[0, :3], resized.t()[:, None, :].expand(3, 6, 9))
    assert_close(out[0, 3:], m.row_embed.weight.detach()[:6].t()[:, :, None].expand(3, 6, 9))
    # a linear ramp stays a ramp in the interior; the ends are the table's end rows
    with torch.no_grad():
        m.col_embed.weight.copy_(torch.arange(4.0)[:, None].expand(4, 3))
    row = m(torch.zeros(1, 1, 1, 8))[0, 0, 0]
    assert_close(row, torch.tensor([0, 0.25, 0.75, 1.25, 1.75, 2.25, 2.75, 3.0]))


def test_interpolate_half_table_in_float32_and_grad():
    m = PositionEmbeddingLearned(2, 3, interpolate=True, num_axes=1).to(torch.bfloat16)
    out = m(torch.zeros(1, 1, 7, dtype=torch.bfloat16))
    ref = F.interpolate(m.col_embed.weight.float().t()[None], size=7, mode="linear")[0].to(torch.bfloat16)
    assert out.dtype == torch.bfloat16
    assert_close(out[0], ref, rtol=0, atol=0)
    m.float()(torch.zeros(1, 1, 7)).sum().backward()
    assert_close(m.col_embed.weight.grad.sum(), torch.tensor(14.0))


# ----------------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(num_pos_feats=0), ValueError, "num_pos_feats must be a positive int, got 0"),
        (dict(num_pos_feats=2.5), TypeError, r"num_pos_feats must be a positive int, got 2.5 \(float\)"),
        (dict(num_embeddings=0), ValueError, "num_embeddings must be a positive int, got 0"),
        (dict(num_embeddings=(50, -1)), ValueError, r"num_embeddings\[1\] must be a positive int, got -1"),
        (dict(num_embeddings=()), ValueError, r"one int per spatial axis \(1 to 3\), got \(\)"),
        (dict(num_embeddings=(5,) * 4), ValueError, r"one int per spatial axis \(1 to 3\)"),
        (dict(num_embeddings="50"), TypeError, "num_embeddings must be a positive int or a sequence"),
        (dict(num_embeddings=(5, 5), num_axes=3), ValueError, r"num_embeddings has 2 entries \(5, 5\) but num_axes=3"),
        (dict(num_axes=4), ValueError, r"num_axes must be one of \(1, 2, 3\), got 4"),
        (dict(num_axes="2"), TypeError, r"num_axes must be one of \(1, 2, 3\), got '2'"),
        (dict(interpolate=1), TypeError, "interpolate must be a bool, got 1"),
    ],
)
def test_constructor_errors(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        PositionEmbeddingLearned(**kwargs)


def test_forward_errors():
    m = PositionEmbeddingLearned(4)
    with pytest.raises(ValueError, match=r"num_axes=2\) got an input with 3 spatial axes \(2, 3, 4\)"):
        m(torch.zeros(1, 1, 2, 3, 4))
    with pytest.raises(TypeError, match="must have dtype torch.bool"):
        m(torch.zeros(1, 3, 4, dtype=torch.int64))
    with pytest.raises(TypeError, match="x must be a NestedTensor"):
        m([1, 2])
    with pytest.raises(ValueError, match=r"the input is on meta but the embedding tables are on cpu"):
        m(torch.zeros(1, 1, 3, 4, device="meta"))


def test_extra_repr_and_copies():
    m = PositionEmbeddingLearned(8, num_embeddings=(5, 6), interpolate=True)
    assert repr(m) == (
        "PositionEmbeddingLearned(\n"
        "  num_pos_feats=8, num_embeddings=(5, 6), interpolate=True, num_axes=2\n"
        "  (row_embed): Embedding(5, 8)\n"
        "  (col_embed): Embedding(6, 8)\n"
        ")"
    )
    x = torch.zeros(2, 1, 4, 9)
    for clone in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
        assert_close(clone(x), m(x), rtol=0, atol=0)


# -------------------------------------------------------------------------- resample_abs_pos_embed
TIMM_CASES = [
    # (old grid, new grid, old_size given, prefix tokens)
    ((14, 14), (20, 20), False, 1),
    ((14, 14), (24, 16), False, 1),
    ((14, 14), (7, 9), True, 0),
    ((16, 12), (8, 20), True, 4),
    ((7, 7), (3, 3), False, 2),
]


MODES = [("bicubic", True), ("bicubic", False), ("bilinear", True), ("bilinear", False),
         ("nearest", False), ("area", False)]


@pytest.mark.parametrize("mode, antialias", MODES)
@pytest.mark.parametrize("old, new, give_old, prefix", TIMM_CASES)
def test_resample_parity_with_timm(old, new, give_old, prefix, mode, antialias):
    posemb = torch.randn(1, prefix + old[0] * old[1], 32, generator=torch.Generator().manual_seed(0))
    old_size = list(old) if give_old else None
    expected = timm_resample(posemb, list(new), old_size, prefix, mode, antialias)
    got = resample_abs_pos_embed(posemb, new, old_size, num_prefix_tokens=prefix, interpolation=mode, antialias=antialias)
    assert_close(resample_abs_pos_embed(posemb, new, old_size, prefix, mode, antialias), got, rtol=0, atol=0)  # timm's order
    assert_close(got, expected, rtol=0, atol=1e-6)


def test_resample_mode_is_a_deprecated_name_of_interpolation():
    """Issue 32: the argument is timm's ``interpolation`` (a drop-in keeps its peer's names);
    ``mode=`` works for one release, with a warning naming the new keyword."""
    posemb = torch.randn(1, 1 + 16, 4, generator=torch.Generator().manual_seed(0))
    with pytest.warns(DeprecationWarning, match=r"resample_abs_pos_embed\(mode=\.\.\.\) is deprecated.*use interpolation="):
        old = resample_abs_pos_embed(posemb, (6, 6), mode="bilinear")
    assert_close(old, timm_resample(posemb, [6, 6], interpolation="bilinear"), rtol=0, atol=1e-6)
    assert_close(old, resample_abs_pos_embed(posemb, (6, 6), interpolation="bilinear"), rtol=0, atol=0)


def test_resample_antialias_ignored_where_torch_has_none():
    posemb = torch.randn(1, 1 + 64, 4)
    with pytest.raises(ValueError, match="Anti-alias"):  # timm passes it on to torch, which refuses
        timm_resample(posemb, [4, 4], interpolation="nearest", antialias=True)
    got = resample_abs_pos_embed(posemb, (4, 4), interpolation="nearest", antialias=True)
    assert_close(got, timm_resample(posemb, [4, 4], interpolation="nearest", antialias=False), rtol=0, atol=0)


def test_resample_identity_returns_input_and_never_modifies_it():
    posemb = torch.randn(1, 1 + 6 * 8, 4)
    before = posemb.clone()
    assert resample_abs_pos_embed(posemb, (6, 8), (6, 8)) is posemb
    resample_abs_pos_embed(posemb, (3, 3), (6, 8))
    assert torch.equal(posemb, before)


def test_resample_nonsquare_needs_old_size():
    posemb = torch.randn(1, 1 + 6 * 8, 4)
    with pytest.raises(RuntimeError):  # timm guesses a 6x6 grid and fails
        timm_resample(posemb, [12, 16])
    with pytest.raises(ValueError, match="48 grid tokens .* not a perfect square; pass old_size"):
        resample_abs_pos_embed(posemb, (12, 16))
    # and a grid from old_size is laid out row-major: nearest x2 repeats every token
    got = resample_abs_pos_embed(posemb, (12, 16), (6, 8), interpolation="nearest")
    grid = posemb[:, 1:].reshape(1, 6, 8, 4).repeat_interleave(2, 1).repeat_interleave(2, 2)
    assert_close(got, torch.cat([posemb[:, :1], grid.reshape(1, -1, 4)], 1), rtol=0, atol=0)


@pytest.mark.parametrize("mode", ["nearest", "trilinear"])
def test_resample_3d(mode):
    vol = torch.randn(2, 3, 4, 5, 6)  # (B, D, H, W, C)
    posemb = torch.cat([torch.randn(2, 1, 6), vol.reshape(2, -1, 6)], 1)
    got = resample_abs_pos_embed(posemb, (6, 8, 10), (3, 4, 5), interpolation=mode)
    assert got.shape == (2, 1 + 6 * 8 * 10, 6)
    assert_close(got[:, :1], posemb[:, :1], rtol=0, atol=0)
    if mode == "nearest":
        ref = vol
        for axis in (1, 2, 3):
            ref = ref.repeat_interleave(2, axis)
        assert_close(got[:, 1:], ref.reshape(2, -1, 6), rtol=0, atol=0)
    # a constant volume stays constant
    const = torch.full((1, 27, 3), 0.5)
    assert_close(resample_abs_pos_embed(const, (5, 4, 2), num_prefix_tokens=0, interpolation=mode), torch.full((1, 40, 3), 0.5))


def test_resample_cube_inferred_and_dtypes():
    posemb = torch.randn(1, 1 + 27, 8, dtype=torch.float64)
    got = resample_abs_pos_embed(posemb, (5, 5, 5), interpolation="trilinear")
    assert got.dtype == torch.float64 and got.shape == (1, 126, 8)
    ref = F.interpolate(posemb[:, 1:].reshape(1, 3, 3, 3, 8).movedim(-1, 1), size=(5, 5, 5), mode="trilinear")
    assert_close(got[:, 1:], ref.movedim(1, -1).reshape(1, -1, 8), rtol=0, atol=1e-12)
    half = torch.randn(1, 1 + 16, 8).to(torch.bfloat16)
    out = resample_abs_pos_embed(half, (6, 6))
    assert out.dtype == torch.bfloat16
    assert_close(out, timm_resample(half, [6, 6]), rtol=0, atol=0)


@pytest.mark.parametrize(
    "args, kwargs, exc, match",
    [
        ((torch.zeros(17, 4), (4, 4)), {}, ValueError, r"posemb must have shape \(B, N, C\), got \(17, 4\)"),
        ((torch.zeros(1, 17, 4, dtype=torch.long), (4, 4)), {}, TypeError, "posemb must be a floating tensor"),
        (([0.0], (4, 4)), {}, TypeError, "posemb must be a Tensor"),
        ((torch.zeros(1, 17, 4), 4), {}, TypeError, "new_size must be a sequence of 2 or 3 ints"),
        ((torch.zeros(1, 17, 4), (4,)), {}, ValueError, r"new_size must hold 2 or 3 ints, got \(4,\)"),
        ((torch.zeros(1, 17, 4), (4, 0)), {}, ValueError, "new_size must hold positive ints"),
        ((torch.zeros(1, 17, 4), (4, 4), (4, 4, 1)), {}, ValueError, r"old_size must be an int or a sequence of 2 ints, got \(4, 4, 1\)"),
        ((torch.zeros(1, 17, 4), (4, 4), (3, 5)), {}, ValueError, r"old_size \(3, 5\) holds 15 tokens but .* has 16 grid tokens"),
        ((torch.zeros(1, 17, 4), (4, 4)), dict(num_prefix_tokens=18), ValueError, r"num_prefix_tokens must be in \[0, N=17\]"),
        ((torch.zeros(1, 17, 4), (4, 4)), dict(num_prefix_tokens=1.0), TypeError, "num_prefix_tokens must be an int"),
        ((torch.zeros(1, 17, 4), (4, 4)), dict(interpolation="linear"), ValueError, "interpolation for a 2D grid must be one of"),
        ((torch.zeros(1, 28, 4), (4, 4, 4)), {}, ValueError, "interpolation for a 3D grid .* got 'bicubic'; use 'trilinear'"),
        ((torch.zeros(1, 28, 4), (4, 4, 4)), dict(interpolation="trilinear", num_prefix_tokens=0), ValueError, "not a perfect cube"),
        ((torch.zeros(1, 17, 4), (4, 4)), dict(antialias=None), TypeError, "antialias must be a bool"),
    ],
)
def test_resample_errors(args, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        resample_abs_pos_embed(*args, **kwargs)
