import math

import pytest
import torch

from vispos._sincos import frequency_divisors, sincos_embed


def _slow(positions, feats, temperature, layout, channel_last=False):
    """Formula reference, float64, cell by cell: w_k = T^(-2k/F)."""
    shape = torch.broadcast_shapes(*(p.shape for p in positions))
    blocks = []
    for p, f in zip(positions, feats):
        p = p.expand(shape).double()
        block = torch.empty(*shape, f, dtype=torch.float64)
        for idx in torch.cartesian_prod(*[torch.arange(s) for s in shape]).reshape(-1, len(shape)).tolist():
            v = float(p[tuple(idx)])
            for k in range(f // 2):
                a = v / temperature ** (2 * k / f)
                if layout == "interleaved":
                    block[(*idx, 2 * k)] = math.sin(a)
                    block[(*idx, 2 * k + 1)] = math.cos(a)
                else:
                    block[(*idx, k)] = math.sin(a)
                    block[(*idx, f // 2 + k)] = math.cos(a)
        blocks.append(block)
    out = torch.cat(blocks, -1)
    return out if channel_last else out.movedim(-1, 1)


@pytest.mark.parametrize("layout", ["interleaved", "split"])
@pytest.mark.parametrize("channel_dim", [1, -1])
@pytest.mark.parametrize("feats", [4, (2, 6)])
def test_matches_formula(layout, channel_dim, feats):
    torch.manual_seed(0)
    positions = [torch.rand(2, 3, 1) * 10, torch.rand(1, 1, 4) * 10]
    f = feats if isinstance(feats, tuple) else (feats, feats)
    out = sincos_embed(positions, feats, temperature=100.0, layout=layout, channel_dim=channel_dim)
    ref = _slow(positions, f, 100.0, layout, channel_last=channel_dim == -1)
    torch.testing.assert_close(out, ref.float(), rtol=0, atol=2e-6)


def test_broadcast_table_equals_full_positions():
    grid = torch.arange(5.0).view(1, 5, 1), torch.arange(7.0).view(1, 1, 7)
    full = [g.expand(3, 5, 7).contiguous() for g in grid]
    a = sincos_embed(list(grid), 8, shape=(3, 5, 7))
    b = sincos_embed(full, 8)
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_output_dtype_computed_in_float32():
    pos = [torch.arange(0, 100000, 997, dtype=torch.float32).view(1, -1)]
    out = sincos_embed(pos, 16, dtype=torch.bfloat16)
    ref = sincos_embed(pos, 16).to(torch.bfloat16)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, ref, rtol=0, atol=0)


def test_t2t_ladder():
    div = frequency_divisors(8, 10000.0, ladder="t2t", dtype=torch.float64)
    ref = torch.tensor([math.exp(math.log(10000.0) * j / 3) for j in range(4)], dtype=torch.float64)
    torch.testing.assert_close(div, ref)


def test_gradients_flow():
    p = torch.rand(2, 3, requires_grad=True)
    sincos_embed([p], 4, channel_dim=-1).sum().backward()
    assert p.grad is not None and torch.isfinite(p.grad).all()


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(positions=[], num_feats=4), ValueError, "at least one"),
        (dict(positions=[torch.zeros(1, 2)], num_feats=3), ValueError, "positive even int"),
        (dict(positions=[torch.zeros(1, 2)], num_feats=4, layout="mixed"), ValueError, "layout"),
        (dict(positions=[torch.zeros(1, 2)], num_feats=4, channel_dim=2), ValueError, "channel_dim"),
        (dict(positions=[torch.zeros(1, 2)], num_feats=[4, 4]), ValueError, "num_feats has 2 entries"),
        (dict(positions=[torch.zeros(1, 2), torch.zeros(2)], num_feats=4), ValueError, "same rank"),
        (dict(positions=[torch.zeros(1, 3)], num_feats=4, shape=(1, 2)), ValueError, "does not broadcast"),
        (dict(positions=[torch.zeros(1, 2, dtype=torch.bool)], num_feats=4), TypeError, "real-valued"),
        (dict(positions=[torch.zeros(1, 2)], num_feats=4, dtype=torch.int32), TypeError, "dtype must be a floating torch.dtype"),
        (dict(positions=[torch.zeros(1, 2)], num_feats=4, layout=1), TypeError, r"layout must be one of \('interleaved', 'split'\), got 1"),
        (dict(positions=[torch.zeros(1, 2)], num_feats=4, compute_dtype=torch.float16), ValueError, "compute_dtype must be one of"),
        (dict(positions=[torch.zeros(1, 2)], num_feats=4, temperature=0), ValueError, "temperature"),
    ],
)
def test_errors(kwargs, exc, match):
    positions = kwargs.pop("positions")
    with pytest.raises(exc, match=match):
        sincos_embed(positions, **kwargs)


# ---------------------------------------------------------------- tables, gathers, out buffers


@pytest.mark.parametrize("layout", ["interleaved", "split"])
@pytest.mark.parametrize("reciprocal", [False, True])
def test_sincos_table_equals_sincos_embed(layout, reciprocal):
    from vispos._sincos import sincos_table

    torch.manual_seed(0)
    positions = torch.rand(3, 2, 11) * 50
    div = frequency_divisors(8, 100.0)
    div = 1.0 / div if reciprocal else div
    table = sincos_table(positions, div, layout=layout, reciprocal=reciprocal)  # [3, 2, 8, 11]
    ref = sincos_embed(
        [positions.reshape(6, 11)], 8, layout=layout, reciprocal=reciprocal, divisors=[div]
    )  # [6, 8, 11]
    torch.testing.assert_close(table.reshape(6, 8, 11), ref, rtol=0, atol=0)
    formula = _slow([positions.reshape(6, 11)], (8,), 100.0, layout)
    torch.testing.assert_close(table.reshape(6, 8, 11), formula.float(), rtol=0, atol=2e-6)


def test_sincos_table_rejects_a_scalar():
    from vispos._sincos import sincos_table

    with pytest.raises(ValueError, match="at least one dim"):
        sincos_table(torch.tensor(1.0), frequency_divisors(4))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_sincos_embed_indexed_equals_embedding_the_gathered_positions(dtype):
    from vispos._sincos_lines import sincos_embed_indexed

    torch.manual_seed(0)
    values = torch.rand(13) * 7
    index = torch.randint(0, 13, (2, 5, 6))
    div = frequency_divisors(6, 50.0)
    out = torch.full((2, 10, 5, 6), float("nan"), dtype=dtype)
    sincos_embed_indexed(values, index, div, out, 4)
    ref = sincos_embed([values[index]], 6, temperature=50.0, dtype=dtype)
    torch.testing.assert_close(out[:, 4:], ref, rtol=0, atol=0)
    assert torch.isnan(out[:, :4]).all()  # other channels untouched
    with pytest.raises(ValueError, match="does not match out"):
        sincos_embed_indexed(values, index[:, :4], div, out, 4)


def test_check_out_errors():
    from vispos._sincos import check_out

    good = torch.empty(2, 3)
    assert check_out(good, (2, 3), torch.float32, good.device) is good
    with pytest.raises(TypeError, match="out must be a torch.Tensor, got list"):
        check_out([0.0], (2, 3), torch.float32, good.device)
    with pytest.raises(ValueError, match=r"out must have shape \(2, 4\).*got shape \(2, 3\)"):
        check_out(good, (2, 4), torch.float32, good.device)
    with pytest.raises(ValueError, match="dtype torch.float16.*dtype torch.float32"):
        check_out(good, (2, 3), torch.float16, good.device)
    with pytest.raises(ValueError, match="must not require grad"):
        check_out(torch.empty(2, 3, requires_grad=True), (2, 3), torch.float32, good.device)


# ----------------------------------------------------------------------------- continued ladder
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("feats", [2, 4, 38, 48, 512])
def test_continued_ladder(feats, dtype):
    # speechain's 'sep' (div_term / div_term_ext): the sines on T^(2k/F), the cosines on the next
    # F/2 rungs T^((F + 2k)/F); the sine half is the standard ladder to the last bit (F = 38 and 48
    # are sizes where a pow over a table of length F would round differently from one of F/2)
    div = frequency_divisors(feats, 10000.0, ladder="continued", dtype=dtype)
    assert div.shape == (feats,) and div.dtype == dtype
    torch.testing.assert_close(div[: feats // 2], frequency_divisors(feats, 10000.0, dtype=dtype), rtol=0, atol=0)
    exact = torch.tensor([10000.0 ** (2 * j / feats) for j in range(feats)], dtype=torch.float64)
    # the exponent 2j/F is rounded (relative eps/2), which T^e turns into e * ln(T) * eps/2 <= 9.3 eps
    torch.testing.assert_close(div.double(), exact, rtol=12 * torch.finfo(dtype).eps, atol=0)
    inv = frequency_divisors(feats, 10000.0, ladder="continued", dtype=dtype, inverse=True)
    torch.testing.assert_close(inv, 1.0 / div, rtol=0, atol=0)


@pytest.mark.parametrize("layout", ["interleaved", "split"])
@pytest.mark.parametrize("channel_dim", [1, -1])
@pytest.mark.parametrize("requires_grad", [False, True])
def test_continued_ladder_embedding(layout, channel_dim, requires_grad):
    # the in-place path and the autograd path write the same numbers, cos on their own divisors
    pos = (torch.arange(12.0) * 7).view(2, 6).requires_grad_(requires_grad)
    out = sincos_embed([pos], 8, layout=layout, ladder="continued", channel_dim=channel_dim)
    div = frequency_divisors(8, 10000.0, ladder="continued")
    angles_sin, angles_cos = pos.detach()[..., None] / div[:4], pos.detach()[..., None] / div[4:]
    ref = torch.empty(2, 6, 8)
    sin_ch, cos_ch = (slice(0, 8, 2), slice(1, 8, 2)) if layout == "interleaved" else (slice(0, 4), slice(4, 8))
    ref[..., sin_ch], ref[..., cos_ch] = angles_sin.sin(), angles_cos.cos()
    ref = ref if channel_dim == -1 else ref.movedim(-1, 1)
    torch.testing.assert_close(out.detach(), ref, rtol=0, atol=0)
    if requires_grad:
        out.sum().backward()
        expected = (angles_sin.cos() / div[:4]).sum(-1) - (angles_cos.sin() / div[4:]).sum(-1)
        torch.testing.assert_close(pos.grad, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_t2t_inverse_is_fairseq2_expression(dtype):
    # fairseq2: freqs = exp(indices * -log(10000) / (num_sin - 1)), evaluated in that order
    for feats in (4, 6, 64, 1024):
        half = feats // 2
        ref = torch.exp(torch.arange(half, dtype=dtype) * -math.log(10000.0) / (half - 1))
        inv = frequency_divisors(feats, 10000.0, ladder="t2t", dtype=dtype, inverse=True)
        torch.testing.assert_close(inv, ref, rtol=0, atol=0)
        torch.testing.assert_close(inv, 1.0 / frequency_divisors(feats, ladder="t2t", dtype=dtype))
