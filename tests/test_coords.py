import copy
import math
import pickle

import pytest
import torch
from torch.testing import assert_close

from vispos.encodings.coords import CoordSineEmbedding, sine_embed_coords


def _sine_block(values, num_pos_feats, temperature, scale):
    """One coordinate as DINO / Deformable-DETR write it: interleaved sin / cos of c * scale / dim_t."""
    dim_t = torch.arange(num_pos_feats, dtype=torch.float32, device=values.device)
    dim_t = temperature ** (2 * (dim_t // 2) / num_pos_feats)
    angles = (values * scale)[..., None] / dim_t
    return torch.stack((angles[..., 0::2].sin(), angles[..., 1::2].cos()), dim=-1).flatten(-2)


def dino_reference(pos_tensor, num_pos_feats=128, temperature=10000, scale=2 * math.pi):
    """DINO / DAB-DETR ``gen_sineembed_for_position``: input (x, y[, w, h]), blocks (y, x[, w, h])."""
    blocks = [_sine_block(pos_tensor[..., i], num_pos_feats, temperature, scale) for i in range(pos_tensor.shape[-1])]
    blocks[0], blocks[1] = blocks[1], blocks[0]
    return torch.cat(blocks, dim=-1)


def deformable_reference(proposals, num_pos_feats=128, temperature=10000, scale=2 * math.pi):
    """Deformable-DETR ``get_proposal_pos_embed``: sigmoid of logits, blocks in (x, y, w, h) order."""
    boxes = proposals.sigmoid()
    return torch.cat([_sine_block(boxes[..., i], num_pos_feats, temperature, scale) for i in range(4)], dim=-1)


def float64_reference(coords, num_pos_feats, temperature, scale, order):
    out = []
    for i in order:
        c = coords[..., i].double() * scale
        block = torch.empty(*c.shape, num_pos_feats, dtype=torch.float64)
        for k in range(num_pos_feats // 2):
            block[..., 2 * k] = torch.sin(c / temperature ** (2 * k / num_pos_feats))
            block[..., 2 * k + 1] = torch.cos(c / temperature ** (2 * k / num_pos_feats))
        out.append(block)
    return torch.cat(out, dim=-1)


@pytest.mark.parametrize("n", [2, 4])
def test_dino_parity(n, device):
    torch.manual_seed(0)
    coords = torch.rand(900, 2, n, device=device)  # (n_query, bs, n) as DINO calls it
    out = sine_embed_coords(coords)
    assert out.shape == (900, 2, n * 128)
    assert_close(out, dino_reference(coords), rtol=0, atol=0 if device.type == "cpu" else 1e-6)


def test_deformable_two_stage_parity(device):
    torch.manual_seed(0)
    proposals = torch.randn(2, 300, 4, device=device) * 3  # logits
    out = sine_embed_coords(proposals.sigmoid(), exchange_xy=False)
    assert_close(out, deformable_reference(proposals), rtol=0, atol=0 if device.type == "cpu" else 1e-6)


@pytest.mark.parametrize("shape", [(3,), (5, 1), (2, 3, 6), (4, 2, 3, 2)])
@pytest.mark.parametrize("num_pos_feats, temperature", [(8, 10000), (16, 20), (6, 10)])
def test_any_rank_any_n_against_float64(shape, num_pos_feats, temperature):
    torch.manual_seed(1)
    coords = torch.rand(shape)
    n = shape[-1]
    out = sine_embed_coords(coords, num_pos_feats, temperature, scale=math.pi)
    order = [1, 0, *range(2, n)] if n >= 2 else [0]
    assert_close(out, float64_reference(coords, num_pos_feats, temperature, math.pi, order).float())
    order = list(range(n))
    out = sine_embed_coords(coords, num_pos_feats, temperature, scale=math.pi, exchange_xy=False)
    assert_close(out, float64_reference(coords, num_pos_feats, temperature, math.pi, order).float())


def test_gradients_flow_to_coords(device):
    torch.manual_seed(0)
    coords = torch.rand(7, 3, 4, device=device, requires_grad=True)
    ref_coords = coords.detach().clone().requires_grad_(True)
    weight = torch.randn(7, 3, 4 * 16, device=device)
    (sine_embed_coords(coords, 16) * weight).sum().backward()
    (dino_reference(ref_coords, 16) * weight).sum().backward()
    assert coords.grad is not None
    assert_close(coords.grad, ref_coords.grad)


def test_gradcheck_float64():
    coords = torch.rand(3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda c: sine_embed_coords(c, 8, 20), (coords,))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_coords_computed_in_float32(dtype):
    coords = torch.rand(10, 4).to(dtype)
    out = sine_embed_coords(coords, 32)
    assert out.dtype == dtype
    assert_close(out, dino_reference(coords.float(), 32).to(dtype))


def test_float64_coords_stay_float64():
    coords = torch.rand(5, 2, dtype=torch.float64)
    out = sine_embed_coords(coords, 16)
    assert out.dtype == torch.float64
    assert_close(out, float64_reference(coords, 16, 10000, 2 * math.pi, [1, 0]))


def test_does_not_modify_coords():
    coords = torch.rand(4, 4)
    before = coords.clone()
    sine_embed_coords(coords)
    assert torch.equal(coords, before)


@pytest.mark.parametrize(
    "args, kwargs, exc, match",
    [
        (([0.5, 0.5],), {}, TypeError, r"pos_tensor must be a floating Tensor \(\.\.\., n\), got \[0.5, 0.5\] \(list\)"),
        ((torch.zeros(3, 2, dtype=torch.long),), {}, TypeError, r"pos_tensor must be a floating tensor .*got torch.int64"),
        ((torch.tensor(0.5),), {}, ValueError, r"pos_tensor must have shape \(\.\.\., n\) with n >= 1 coordinates, got \(\)"),
        ((torch.zeros(3, 0),), {}, ValueError, r"pos_tensor must have shape \(\.\.\., n\) with n >= 1 coordinates, got \(3, 0\)"),
        ((torch.zeros(3, 2), 7), {}, ValueError, r"num_pos_feats must be a positive even int .*got 7"),
        ((torch.zeros(3, 2), 8.0), {}, TypeError, r"num_pos_feats must be a positive even int, got 8.0"),
        ((torch.zeros(3, 2), 8, 0), {}, ValueError, r"temperature must be a finite number > 0, got 0"),
        ((torch.zeros(3, 2), 8, 20), {"scale": -1.0}, ValueError, r"scale must be > 0, got -1.0"),
        ((torch.zeros(3, 2), 8, 20), {"scale": "2pi"}, TypeError, r"scale must be a finite number, got '2pi' \(str\)"),
        ((torch.zeros(3, 2), 8, 20, "2pi"), {}, TypeError, r"exchange_xy must be a bool, got '2pi' \(str\)"),
        ((torch.zeros(3, 2),), {"exchange_xy": 1}, TypeError, r"exchange_xy must be a bool, got 1"),
    ],
)
def test_function_errors(args, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        sine_embed_coords(*args, **kwargs)


# ----------------------------------------------------------------------------- module
def test_module_is_dab_detr_ref_point_head(device):
    torch.manual_seed(0)
    m = CoordSineEmbedding().to(device)  # DAB-DETR: MLP(query_dim // 2 * d_model, d_model, d_model, 2)
    assert [(layer.in_features, layer.out_features) for layer in m.layers] == [(512, 256), (256, 256)]
    assert set(m.state_dict()) == {"layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias"}
    boxes = torch.rand(300, 2, 4, device=device, requires_grad=True)
    out = m(boxes)
    expected = m.layers[1](torch.relu(m.layers[0](dino_reference(boxes))))
    assert_close(out, expected)
    out.sum().backward()
    assert boxes.grad is not None and boxes.grad.abs().sum() > 0
    assert m.layers[0].weight.grad is not None


def test_module_options_and_repr():
    m = CoordSineEmbedding(num_coords=2, d_model=64, num_pos_feats=16, hidden_dim=32, num_layers=3,
                           temperature=20, scale=1.0, swap_xy=False)
    assert [(layer.in_features, layer.out_features) for layer in m.layers] == [(32, 32), (32, 32), (32, 64)]
    assert m.extra_repr() == (
        "num_coords=2, d_model=64, num_pos_feats=16, hidden_dim=32, num_layers=3, temperature=20, "
        "scale=1.0, swap_xy=False"
    )
    assert CoordSineEmbedding().extra_repr() == (
        f"num_coords=4, d_model=256, num_pos_feats=128, hidden_dim=256, num_layers=2, temperature=10000, "
        f"scale={2 * math.pi}, swap_xy=True"
    )
    pts = torch.rand(5, 2)
    sine = sine_embed_coords(pts, 16, 20, False, scale=1.0)
    expected = m.layers[2](torch.relu(m.layers[1](torch.relu(m.layers[0](sine)))))
    assert_close(m(pts), expected)
    for clone in (pickle.loads(pickle.dumps(m)), copy.deepcopy(m)):
        assert_close(clone(pts), m(pts))
    single = CoordSineEmbedding(num_coords=2, d_model=8, num_layers=1)
    assert len(single.layers) == 1 and single(pts).shape == (5, 8)


def test_module_half_weights():
    m = CoordSineEmbedding(num_coords=2, d_model=16).to(torch.bfloat16)
    out = m(torch.rand(3, 2))
    assert out.dtype == torch.bfloat16


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(num_coords=0), ValueError, r"num_coords must be a positive int, got 0"),
        (dict(d_model=256.0), TypeError, r"d_model must be a positive int, got 256.0 \(float\)"),
        (dict(num_layers=0), ValueError, r"num_layers must be a positive int, got 0"),
        (dict(d_model=6), ValueError, r"num_pos_feats defaults to d_model // 2, which must be even; got d_model=6"),
        (dict(num_pos_feats=5), ValueError, r"num_pos_feats must be a positive even int .*got 5"),
        (dict(hidden_dim=0), ValueError, r"hidden_dim must be a positive int, got 0"),
        (dict(hidden_dim="a"), TypeError, r"hidden_dim must be a positive int, got 'a' \(str\)"),
        (dict(temperature=-1), ValueError, r"temperature must be a finite number > 0, got -1"),
        (dict(scale=0), ValueError, r"scale must be > 0, got 0"),
        (dict(swap_xy=None), TypeError, r"swap_xy must be a bool, got None"),
    ],
)
def test_module_constructor_errors(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        CoordSineEmbedding(**kwargs)


def test_module_forward_errors():
    m = CoordSineEmbedding(num_coords=4, d_model=16)
    with pytest.raises(ValueError, match=r"coords must have shape \(\.\.\., 4\) \(num_coords=4\), got \(3, 2\)"):
        m(torch.rand(3, 2))
    with pytest.raises(TypeError, match=r"coords must be a floating tensor .*got torch.int64"):
        m(torch.zeros(3, 4, dtype=torch.long))


# ------------------------------------------------------------------------- detrex's drop-in
def _detrex_get_sine_pos_embed(pos_tensor, num_pos_feats=128, temperature=10000, exchange_xy=True):
    """detrex ``detrex/layers/position_embedding.py`` ``get_sine_pos_embed``, as published."""
    scale = 2 * math.pi
    dim_t = torch.arange(num_pos_feats, dtype=torch.float32, device=pos_tensor.device)
    dim_t = temperature ** (2 * torch.div(dim_t, 2, rounding_mode="floor") / num_pos_feats)

    def sine_func(x):
        sin_x = x * scale / dim_t
        return torch.stack((sin_x[:, :, 0::2].sin(), sin_x[:, :, 1::2].cos()), dim=3).flatten(2)

    pos_res = [sine_func(x) for x in pos_tensor.split([1] * pos_tensor.shape[-1], dim=-1)]
    if exchange_xy:
        pos_res[0], pos_res[1] = pos_res[1], pos_res[0]
    return torch.cat(pos_res, dim=-1)


@pytest.mark.parametrize("exchange_xy", [True, False])
def test_detrex_call_as_written(exchange_xy):
    """detrex's call, by keyword and by position, gives detrex's numbers."""
    boxes = torch.rand(2, 5, 4)
    want = _detrex_get_sine_pos_embed(boxes, 64, 20, exchange_xy)
    got_kw = sine_embed_coords(pos_tensor=boxes, num_pos_feats=64, temperature=20, exchange_xy=exchange_xy)
    got_pos = sine_embed_coords(boxes, 64, 20, exchange_xy)
    assert_close(got_kw, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(got_kw, got_pos)


def test_old_names_and_positional_scale_warn():
    boxes = torch.rand(3, 4)
    want = sine_embed_coords(boxes, 16, 20, False, scale=1.0)
    with pytest.warns(DeprecationWarning, match="use exchange_xy= instead"):
        assert torch.equal(sine_embed_coords(boxes, 16, 20, scale=1.0, swap_xy=False), want)
    with pytest.warns(DeprecationWarning, match="use pos_tensor= instead"):
        assert torch.equal(sine_embed_coords(coords=boxes, num_pos_feats=16, temperature=20, exchange_xy=False, scale=1.0), want)
    with pytest.warns(DeprecationWarning, match="fourth positional argument is exchange_xy"):
        assert torch.equal(sine_embed_coords(boxes, 16, 20, 1.0), sine_embed_coords(boxes, 16, 20, scale=1.0))
