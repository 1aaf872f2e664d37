import copy
import inspect
import itertools
import math
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from vispos.encodings.sequence import LearnableSinusoidalPositionalEncoding, SinusoidalPositionalEncoding

# fairseq2's golden table: SinusoidalPositionEncoder(encoding_dim=32, max_seq_len=10).freqs, from
# fairseq2's tests/unit/nn/test_position_encoder.py (tensor2tensor ladder, sines then cosines).
# Printed to 5 significant digits, hence the tolerance below.
# fmt: off
FAIRSEQ2_TABLE = [
    [0.0] * 16 + [1.0] * 16,
    [8.4147e-01, 5.1514e-01, 2.8870e-01, 1.5783e-01, 8.5664e-02, 4.6399e-02, 2.5116e-02, 1.3593e-02,
     7.3564e-03, 3.9811e-03, 2.1544e-03, 1.1659e-03, 6.3096e-04, 3.4146e-04, 1.8479e-04, 1.0000e-04,
     5.4030e-01, 8.5711e-01, 9.5742e-01, 9.8747e-01, 9.9632e-01, 9.9892e-01, 9.9968e-01, 9.9991e-01,
     9.9997e-01, 9.9999e-01, 1.0000e+00, 1.0000e+00, 1.0000e+00, 1.0000e+00, 1.0000e+00, 1.0000e+00],
    [9.0930e-01, 8.8306e-01, 5.5281e-01, 3.1170e-01, 1.7070e-01, 9.2699e-02, 5.0217e-02, 2.7184e-02,
     1.4712e-02, 7.9621e-03, 4.3089e-03, 2.3318e-03, 1.2619e-03, 6.8291e-04, 3.6957e-04, 2.0000e-04,
     -4.1615e-01, 4.6926e-01, 8.3331e-01, 9.5018e-01, 9.8532e-01, 9.9569e-01, 9.9874e-01, 9.9963e-01,
     9.9989e-01, 9.9997e-01, 9.9999e-01, 1.0000e+00, 1.0000e+00, 1.0000e+00, 1.0000e+00, 1.0000e+00],
    [1.4112e-01, 9.9861e-01, 7.6984e-01, 4.5775e-01, 2.5448e-01, 1.3880e-01, 7.5285e-02, 4.0769e-02,
     2.2067e-02, 1.1943e-02, 6.4633e-03, 3.4977e-03, 1.8929e-03, 1.0244e-03, 5.5436e-04, 3.0000e-04,
     -9.8999e-01, -5.2688e-02, 6.3823e-01, 8.8908e-01, 9.6708e-01, 9.9032e-01, 9.9716e-01, 9.9917e-01,
     9.9976e-01, 9.9993e-01, 9.9998e-01, 9.9999e-01, 1.0000e+00, 1.0000e+00, 1.0000e+00, 1.0000e+00],
    [-7.5680e-01, 8.2877e-01, 9.2132e-01, 5.9234e-01, 3.3639e-01, 1.8460e-01, 1.0031e-01, 5.4347e-02,
     2.9421e-02, 1.5924e-02, 8.6176e-03, 4.6636e-03, 2.5238e-03, 1.3658e-03, 7.3914e-04, 4.0000e-04,
     -6.5364e-01, -5.5958e-01, 3.8881e-01, 8.0569e-01, 9.4172e-01, 9.8281e-01, 9.9496e-01, 9.9852e-01,
     9.9957e-01, 9.9987e-01, 9.9996e-01, 9.9999e-01, 1.0000e+00, 1.0000e+00, 1.0000e+00, 1.0000e+00],
    [-9.5892e-01, 4.2209e-01, 9.9434e-01, 7.1207e-01, 4.1582e-01, 2.3000e-01, 1.2526e-01, 6.7916e-02,
     3.6774e-02, 1.9904e-02, 1.0772e-02, 5.8295e-03, 3.1548e-03, 1.7073e-03, 9.2393e-04, 5.0000e-04,
     2.8366e-01, -9.0656e-01, 1.0627e-01, 7.0211e-01, 9.0945e-01, 9.7319e-01, 9.9212e-01, 9.9769e-01,
     9.9932e-01, 9.9980e-01, 9.9994e-01, 9.9998e-01, 1.0000e+00, 1.0000e+00, 1.0000e+00, 1.0000e+00],
    [-2.7942e-01, -1.0523e-01, 9.8268e-01, 8.1396e-01, 4.9220e-01, 2.7491e-01, 1.5014e-01, 8.1471e-02,
     4.4124e-02, 2.3884e-02, 1.2926e-02, 6.9954e-03, 3.7857e-03, 2.0487e-03, 1.1087e-03, 6.0000e-04,
     9.6017e-01, -9.9445e-01, -1.8531e-01, 5.8092e-01, 8.7048e-01, 9.6147e-01, 9.8866e-01, 9.9668e-01,
     9.9903e-01, 9.9971e-01, 9.9992e-01, 9.9998e-01, 9.9999e-01, 1.0000e+00, 1.0000e+00, 1.0000e+00],
    [6.5699e-01, -6.0247e-01, 8.8734e-01, 8.9544e-01, 5.6496e-01, 3.1922e-01, 1.7493e-01, 9.5011e-02,
     5.1472e-02, 2.7864e-02, 1.5080e-02, 8.1613e-03, 4.4167e-03, 2.3902e-03, 1.2935e-03, 7.0000e-04,
     7.5390e-01, -7.9814e-01, -4.6112e-01, 4.4518e-01, 8.2512e-01, 9.4768e-01, 9.8458e-01, 9.9548e-01,
     9.9867e-01, 9.9961e-01, 9.9989e-01, 9.9997e-01, 9.9999e-01, 1.0000e+00, 1.0000e+00, 1.0000e+00],
    [9.8936e-01, -9.2754e-01, 7.1643e-01, 9.5448e-01, 6.3357e-01, 3.6285e-01, 1.9960e-01, 1.0853e-01,
     5.8817e-02, 3.1843e-02, 1.7235e-02, 9.3272e-03, 5.0476e-03, 2.7316e-03, 1.4783e-03, 8.0000e-04,
     -1.4550e-01, -3.7374e-01, -6.9766e-01, 2.9827e-01, 7.7369e-01, 9.3185e-01, 9.7988e-01, 9.9409e-01,
     9.9827e-01, 9.9949e-01, 9.9985e-01, 9.9996e-01, 9.9999e-01, 1.0000e+00, 1.0000e+00, 1.0000e+00],
    [4.1212e-01, -9.8752e-01, 4.8452e-01, 9.8959e-01, 6.9752e-01, 4.0570e-01, 2.2415e-01, 1.2204e-01,
     6.6159e-02, 3.5822e-02, 1.9389e-02, 1.0493e-02, 5.6786e-03, 3.0731e-03, 1.6631e-03, 9.0000e-04,
     -9.1113e-01, 1.5748e-01, -8.7478e-01, 1.4389e-01, 7.1657e-01, 9.1401e-01, 9.7455e-01, 9.9253e-01,
     9.9781e-01, 9.9936e-01, 9.9981e-01, 9.9994e-01, 9.9998e-01, 1.0000e+00, 1.0000e+00, 1.0000e+00],
]
# fmt: on
PRINTED = dict(rtol=0, atol=5.1e-5)  # half a unit in the 5th significant digit of values <= 1


def slow_reference(positions, d_model, layout="interleaved", ladder="standard", temperature=10000.0,
                   dtype=torch.float32):
    """The formulas written channel by channel in float64 (Vaswani et al. / tensor2tensor /
    speechain's continued ladder: cosine k on rung D/2 + k), cast to ``dtype``."""
    half = d_model // 2
    pos = torch.as_tensor(positions, dtype=torch.float64)
    out = torch.empty(*pos.shape, d_model, dtype=torch.float64)
    for k in range(half):
        if ladder == "t2t":
            w_sin = w_cos = math.exp(-math.log(temperature) * k / (half - 1))
        else:
            w_sin = w_cos = 1.0 / temperature ** (2 * k / d_model)
            if ladder == "continued":
                w_cos = 1.0 / temperature ** ((d_model + 2 * k) / d_model)
        sin_ch, cos_ch = (2 * k, 2 * k + 1) if layout == "interleaved" else (k, half + k)
        out[..., sin_ch] = torch.sin(pos * w_sin)
        out[..., cos_ch] = torch.cos(pos * w_cos)
    return out.to(dtype)


def fairseq2_table(encoding_dim, max_seq_len, dtype=torch.float32, legacy_pad_idx=None):
    """fairseq2's ``SinusoidalPositionEncoder.freqs``, statement by statement from its
    ``reset_non_persistent_buffers`` / ``_fill_sin_freq_table`` (the buffer in ``dtype``)."""
    freqs = torch.empty((max_seq_len, encoding_dim), dtype=dtype)
    start_step = 0 if legacy_pad_idx is None else 1 + legacy_pad_idx
    num_sin = encoding_dim // 2
    l_half = freqs[:, :num_sin]
    r_half = freqs[:, num_sin:]
    steps = torch.arange(start_step, start_step + max_seq_len, dtype=dtype)
    indices = torch.arange(num_sin, dtype=dtype)
    # "This is identical to tensor2tensor's implementation."
    table_freqs = torch.exp(indices * -math.log(10000.0) / (num_sin - 1))
    torch.outer(steps, table_freqs, out=l_half)
    r_half.copy_(l_half)
    l_half.sin_()
    r_half.cos_()
    return freqs


def fairseq2_forward(seqs, freqs, start_step=0):
    """fairseq2's ``_do_forward``: the padding mask is not read; the sum is taken in float32."""
    seq_len = seqs.size(-2)
    fp32_seqs = seqs.float() + freqs[start_step : start_step + seq_len]
    return fp32_seqs.type_as(seqs)


# ----------------------------------------------------------------------------- golden tables
def test_fairseq2_golden_table(device):
    m = SinusoidalPositionalEncoding(32, max_len=10, layout="split", ladder="t2t").to(device)
    out = m(torch.zeros(1, 10, 32, device=device))
    assert_close(out[0].cpu(), torch.tensor(FAIRSEQ2_TABLE), **PRINTED)
    assert_close(m.pe.cpu(), torch.tensor(FAIRSEQ2_TABLE), **PRINTED)


def test_fairseq2_docstring_example():
    # fairseq2's docstring: SinusoidalPositionEncoder(encoding_dim=4, max_seq_len=16)(torch.ones(3, 4)).
    # Its printed row 0 is [1, 1, 2, 2]; rows 1 and 2 as printed there are not ones + encoding
    # (e.g. 0.94147 where 1 + sin(1) = 1.84147), so they are checked against the formula instead.
    m = SinusoidalPositionalEncoding(4, max_len=16, layout="split", ladder="t2t")
    out = m(torch.ones(1, 3, 4))[0]
    assert_close(out[0], torch.tensor([1.0, 1.0, 2.0, 2.0]))
    expected = 1 + torch.tensor(
        [[math.sin(p), math.sin(p * 1e-4), math.cos(p), math.cos(p * 1e-4)] for p in range(3)]
    )
    assert_close(out, expected.float())


@pytest.mark.parametrize("layout", ["interleaved", "split"])
@pytest.mark.parametrize("ladder", ["standard", "t2t", "continued"])
@pytest.mark.parametrize("d_model", [4, 10, 64])
def test_table_against_formula(layout, ladder, d_model):
    m = SinusoidalPositionalEncoding(d_model, max_len=60, layout=layout, ladder=ladder)
    out = m(torch.zeros(2, 60, d_model))
    assert_close(out, slow_reference(torch.arange(60), d_model, layout, ladder).expand(2, -1, -1))


def test_pytorch_tutorial_encoding():
    # PyTorch's "Language modeling with nn.Transformer" tutorial: sin at even, cos at odd channels,
    # div_term = exp(arange(0, d, 2) * (-ln(10000) / d)), input (L, B, D).
    d, length = 16, 40
    position = torch.arange(length, dtype=torch.float32).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d, 2).float() * (-math.log(10000.0) / d))
    pe = torch.zeros(length, 1, d)
    pe[:, 0, 0::2] = torch.sin(position * div_term)
    pe[:, 0, 1::2] = torch.cos(position * div_term)
    x = torch.randn(length, 3, d)
    m = SinusoidalPositionalEncoding(d, batch_first=False)
    assert_close(m(x), x + pe)


# ----------------------------------------------------------------------------- options
def test_batch_first_false_is_transpose(device):
    x = torch.randn(2, 7, 8, device=device)
    a = SinusoidalPositionalEncoding(8)(x)
    b = SinusoidalPositionalEncoding(8, batch_first=False)(x.transpose(0, 1))
    assert_close(b.transpose(0, 1), a)


def test_emb_scale_and_layernorm_without_modifying_input(device):
    x = torch.randn(2, 5, 8, device=device)
    before = x.clone()
    m = SinusoidalPositionalEncoding(8, emb_scale=True, emb_layernorm=True).to(device)
    with torch.no_grad():
        m.layernorm.weight.uniform_(0.5, 1.5)
        m.layernorm.bias.uniform_(-0.5, 0.5)
    out = m(x)
    pe = slow_reference(torch.arange(5), 8).to(device)
    # speechain's order: LayerNorm first, then the scale (not LayerNorm(x * sqrt(D)), which would
    # undo the scale)
    assert_close(out, m.layernorm(x) * math.sqrt(8) + pe)
    assert torch.equal(x, before)
    out2 = SinusoidalPositionalEncoding(8, emb_scale=True)(x)
    assert_close(out2, x * math.sqrt(8) + pe)
    assert torch.equal(x, before)


def test_learnable_scale_is_trained():
    m = SinusoidalPositionalEncoding(8, learnable_scale=True, init_alpha=0.5)
    assert isinstance(m.alpha, torch.nn.Parameter) and m.alpha.item() == 0.5
    x = torch.randn(2, 5, 8)
    out = m(x)
    assert_close(out, x + 0.5 * slow_reference(torch.arange(5), 8))
    out.sum().backward()
    assert_close(m.alpha.grad, slow_reference(torch.arange(5), 8).sum() * 2)
    assert "alpha" in m.state_dict()


def test_longer_than_max_len_extends_the_table(device):
    m = SinusoidalPositionalEncoding(8, max_len=4).to(device)
    x = torch.randn(2, 11, 8, device=device)
    out = m(x)
    assert_close(out, x + slow_reference(torch.arange(11), 8).to(device))
    assert m.pe.shape == (11, 8) and m.pe.device == x.device
    assert "pe" not in m.state_dict()
    assert_close(m(x[:, :3]), x[:, :3] + slow_reference(torch.arange(3), 8).to(device))
    assert m.max_len == 4  # the constructor argument, as extra_repr reports it


def test_table_extended_under_inference_mode_serves_training():
    m = SinusoidalPositionalEncoding(8, max_len=4, learnable_scale=True)
    with torch.inference_mode():
        m(torch.randn(1, 9, 8))
    assert not m.pe.is_inference()
    out = m(torch.randn(1, 9, 8))
    out.sum().backward()  # alpha's gradient needs the table saved for backward
    assert_close(m.alpha.grad, slow_reference(torch.arange(9), 8).sum())


def test_positions_offsets_and_incremental_decoding(device):
    m = SinusoidalPositionalEncoding(16).to(device)
    x = torch.randn(3, 6, 16, device=device)
    full = m(x)
    step = m(x[:, 4:5], positions=torch.tensor([4], device=device))
    assert_close(step, full[:, 4:5])
    pos = torch.tensor([[0, 1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12], [0.5, 1.5, 2.5, 3.5, 4.5, 5.5]], device=device)
    assert_close(m(x, positions=pos), x + slow_reference(pos.cpu(), 16).to(device))
    assert_close(m(x, positions=torch.arange(6, device=device)), full)


def test_key_padding_mask_left_and_right(device):
    m = SinusoidalPositionalEncoding(8).to(device)
    x = torch.randn(2, 5, 8, device=device)
    mask = torch.tensor([[True, True, False, False, False], [False, False, False, True, True]], device=device)
    out = m(x, key_padding_mask=mask)
    pe = slow_reference(torch.arange(5), 8).to(device)
    # left padding: the first valid step gets position 0
    assert_close(out[0, 2:], x[0, 2:] + pe[:3])
    assert_close(out[1, :3], x[1, :3] + pe[:3])
    # padded steps get no position
    assert torch.equal(out[0, :2], x[0, :2])
    assert torch.equal(out[1, 3:], x[1, 3:])
    # explicit positions take precedence, padded steps still get none
    pos = torch.arange(5, device=device).expand(2, 5)
    out = m(x, positions=pos, key_padding_mask=mask)
    assert_close(out[0, 2:], x[0, 2:] + pe[2:])
    assert torch.equal(out[0, :2], x[0, :2])


def test_seq_first_with_mask(device):
    m = SinusoidalPositionalEncoding(8, batch_first=False).to(device)
    x = torch.randn(5, 2, 8, device=device)
    mask = torch.tensor([[True, False, False, False, False], [False] * 5], device=device)
    out = m(x, key_padding_mask=mask)
    ref = SinusoidalPositionalEncoding(8).to(device)(x.transpose(0, 1), key_padding_mask=mask)
    assert_close(out, ref.transpose(0, 1))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_dtype_follows_input(dtype):
    m = SinusoidalPositionalEncoding(32)
    x = torch.randn(2, 300, 32).to(dtype)
    out = m(x)
    assert out.dtype == dtype
    if dtype == torch.float64:  # the encoding is computed in float64 for a float64 input
        expected = x + slow_reference(torch.arange(300), 32, dtype=torch.float64)
        assert_close(out, expected, rtol=0, atol=300 * 4 * torch.finfo(torch.float64).eps)
        assert m.pe.dtype == torch.float32  # the cached float32 table is left as it was
    else:  # added in float32, rounded once: the correctly rounded sum
        expected = x.double() + slow_reference(torch.arange(300), 32).double()
        assert_close(out, expected.to(dtype))


def test_dropout_only_in_training():
    m = SinusoidalPositionalEncoding(8, dropout=0.5)
    x = torch.randn(4, 6, 8)
    m.eval()
    assert_close(m(x), x + slow_reference(torch.arange(6), 8))
    m.train()
    torch.manual_seed(0)
    out = m(x)
    assert (out == 0).any()


def test_repr_state_dict_pickle_deepcopy():
    m = SinusoidalPositionalEncoding(
        8, dropout=0.1, max_len=32, layout="split", batch_first=False, emb_scale=True,
        emb_layernorm=True, learnable_scale=True, init_alpha=0.5, ladder="t2t",
    )
    assert m.extra_repr() == (
        "dim=8, dropout=0.1, max_len=32, layout='split', batch_first=False, emb_scale=True, "
        "emb_layernorm=True, learnable_scale=True, init_alpha=0.5, ladder='t2t', temperature=10000.0"
    )
    assert SinusoidalPositionalEncoding(4).extra_repr() == (
        "dim=4, dropout=0.0, max_len=5000, layout='interleaved', batch_first=True, emb_scale=False, "
        "emb_layernorm=False, learnable_scale=False, init_alpha=1.0, ladder='standard', temperature=10000.0"
    )
    assert set(m.state_dict()) == {"alpha", "layernorm.weight", "layernorm.bias"}
    x = torch.randn(6, 2, 8)
    m.eval()
    for clone in (pickle.loads(pickle.dumps(m)), copy.deepcopy(m)):
        clone.eval()
        assert_close(clone(x), m(x))
    fresh = SinusoidalPositionalEncoding(
        8, max_len=32, layout="split", batch_first=False, emb_scale=True, emb_layernorm=True,
        learnable_scale=True, ladder="t2t",
    ).eval()
    fresh.load_state_dict(m.state_dict())
    assert_close(fresh(x), m(x))


# ----------------------------------------------------------------------------- learnable
def test_learnable_sinusoidal_is_ffn_of_sinusoid(device):
    torch.manual_seed(0)
    m = LearnableSinusoidalPositionalEncoding(8, hidden_dim=12).to(device)
    layers = [type(layer) for layer in m.ffn]
    assert layers == [torch.nn.Linear, torch.nn.Sigmoid, torch.nn.Dropout, torch.nn.Linear]
    assert m.ffn[0].out_features == 12
    x = torch.randn(2, 5, 8, device=device)
    pe = slow_reference(torch.arange(5), 8).to(device)
    expected = x + m.ffn[3](torch.sigmoid(m.ffn[0](pe)))
    out = m(x)
    assert_close(out, expected)
    out.sum().backward()
    assert m.ffn[0].weight.grad is not None and m.ffn[0].weight.grad.abs().sum() > 0
    mask = torch.tensor([[False] * 5, [True, False, False, False, False]], device=device)
    out = m(x, key_padding_mask=mask)
    assert torch.equal(out[1, 0], x[1, 0])
    assert_close(out[1, 1:], x[1, 1:] + m.ffn(pe[:4]))
    seq_first = LearnableSinusoidalPositionalEncoding(8, hidden_dim=12, batch_first=False).to(device)
    seq_first.load_state_dict(m.state_dict())
    assert_close(seq_first(x.transpose(0, 1)).transpose(0, 1), m(x))


def test_learnable_sinusoidal_repr_and_defaults():
    m = LearnableSinusoidalPositionalEncoding(16, dropout=0.1, layout="split")
    assert m.hidden_dim == 16
    assert m.extra_repr() == (
        "dim=16, dropout=0.1, max_len=5000, layout='split', batch_first=True, hidden_dim=16, "
        "ladder='standard', temperature=10000.0"
    )
    assert set(m.state_dict()) == {"ffn.0.weight", "ffn.0.bias", "ffn.3.weight", "ffn.3.bias"}
    x = torch.randn(1, 5001, 16)
    assert m.eval()(x).shape == x.shape  # beyond max_len


# ----------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(dim=7), ValueError, r"dim must be a positive even int .*got 7"),
        (dict(dim=0), ValueError, r"dim must be a positive even int .*got 0"),
        (dict(dim=8.0), TypeError, r"dim must be a positive even int, got 8.0 \(float\)"),
        (dict(dim=2, ladder="t2t"), ValueError, r"ladder='t2t' needs dim >= 4 .*got 2"),
        (dict(dim=8, dropout=1.0), ValueError, r"dropout must be a float in \[0, 1\), got 1.0"),
        (dict(dim=8, dropout=-0.1), ValueError, r"dropout must be a float in \[0, 1\), got -0.1"),
        (dict(dim=8, dropout="0.1"), TypeError, r"dropout must be a float in \[0, 1\), got '0.1' \(str\)"),
        (dict(dim=8, max_len=0), ValueError, r"max_len must be a positive int, got 0"),
        (dict(dim=8, max_len=10.0), TypeError, r"max_len must be a positive int, got 10.0 \(float\)"),
        (dict(dim=8, layout="mix"), ValueError, r"layout must be one of \('interleaved', 'split'\), got 'mix'"),
        (dict(dim=8, layout=1), TypeError, r"layout must be one of \('interleaved', 'split'\), got 1 \(int\)"),
        (dict(dim=8, ladder="log"), ValueError, r"ladder must be one of \('standard', 't2t', 'continued'\), got 'log'"),
        (dict(dim=8, batch_first=1), TypeError, r"batch_first must be a bool, got 1 \(int\)"),
        (dict(dim=8, emb_scale="yes"), TypeError, r"emb_scale must be a bool, got 'yes'"),
        (dict(dim=8, temperature=0), ValueError, r"temperature must be a finite number > 0, got 0"),
        (dict(dim=8, init_alpha=2.0), ValueError, r"init_alpha=2.0 has no effect without learnable_scale=True"),
        (dict(dim=8, learnable_scale=True, init_alpha=float("nan")), ValueError, r"init_alpha must be a finite number, got nan"),
    ],
)
def test_constructor_errors(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        SinusoidalPositionalEncoding(**kwargs)


@pytest.mark.parametrize("cls", [SinusoidalPositionalEncoding, LearnableSinusoidalPositionalEncoding])
def test_d_model_is_a_deprecated_name_of_dim(cls):
    """Issue 32: vispos' own encoders name their width ``dim`` (docs/api-conventions.md); the old
    keyword and attribute ``d_model`` work for one release, with a warning naming ``dim``."""
    with pytest.warns(DeprecationWarning, match=rf"{cls.__name__}\(d_model=\.\.\.\) is deprecated.*use dim= instead"):
        old = cls(d_model=8, max_len=16)
    new = cls(dim=8, max_len=16)
    assert old.dim == new.dim == 8 and old.extra_repr() == new.extra_repr()
    with pytest.warns(DeprecationWarning, match=rf"{cls.__name__}.d_model is deprecated.*use .dim instead"):
        assert old.d_model == 8
    with pytest.raises(TypeError, match=r"got both d_model= \(deprecated\) and dim="):
        cls(d_model=8, dim=8)
    assert list(inspect.signature(cls).parameters)[0] == "dim"


def test_learnable_constructor_errors():
    with pytest.raises(ValueError, match=r"hidden_dim must be a positive int, got 0"):
        LearnableSinusoidalPositionalEncoding(8, hidden_dim=0)
    with pytest.raises(TypeError, match=r"hidden_dim must be a positive int, got 4.0 \(float\)"):
        LearnableSinusoidalPositionalEncoding(8, hidden_dim=4.0)
    with pytest.raises(ValueError, match=r"dim must be a positive even int .*got 5"):
        LearnableSinusoidalPositionalEncoding(5)


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda m: m([1.0]), TypeError, r"x must be a Tensor, got list"),
        (lambda m: m(torch.zeros(2, 5, 8, dtype=torch.long)), TypeError, r"x must be a floating tensor .*got torch.int64"),
        (lambda m: m(torch.zeros(5, 8)), ValueError, r"x must have shape \(B, L, D\) with D = dim = 8 .*got \(5, 8\)"),
        (lambda m: m(torch.zeros(2, 5, 6)), ValueError, r"x must have shape \(B, L, D\) .*got \(2, 5, 6\)"),
        (lambda m: m(torch.zeros(2, 5, 8), positions=torch.zeros(2, 4)), ValueError,
         r"positions must have shape \(B, L\) = \(2, 5\) or \(L,\) = \(5,\), got \(2, 4\)"),
        (lambda m: m(torch.zeros(2, 5, 8), positions=[0, 1]), TypeError, r"positions must be a Tensor .*got list"),
        (lambda m: m(torch.zeros(2, 5, 8), positions=torch.zeros(5, dtype=torch.bool)), TypeError,
         r"positions must be a real-valued tensor, got torch.bool"),
        (lambda m: m(torch.zeros(2, 5, 8), key_padding_mask=torch.zeros(2, 5, dtype=torch.long)), TypeError,
         r"key_padding_mask must have dtype torch.bool .*got torch.int64\. Convert with `key_padding_mask.bool\(\)`.*attention_mask where 1 marks valid tokens"),
        (lambda m: m(torch.zeros(2, 5, 8), key_padding_mask=torch.zeros(5, 2, dtype=torch.bool)), ValueError,
         r"key_padding_mask must have shape \(B, L\) = \(2, 5\), got \(5, 2\)"),
        (lambda m: m(torch.zeros(2, 5, 8), key_padding_mask="none"), TypeError,
         r"key_padding_mask must be a torch.Tensor of dtype torch.bool, got str"),
    ],
)
def test_forward_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call(SinusoidalPositionalEncoding(8))


def test_seq_first_shape_error_names_layout():
    with pytest.raises(ValueError, match=r"x must have shape \(L, B, D\) .*batch_first=False"):
        SinusoidalPositionalEncoding(8, batch_first=False)(torch.zeros(2, 5, 4))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_device_mismatch_errors():
    m = SinusoidalPositionalEncoding(8).cuda()
    x = torch.zeros(2, 5, 8, device="cuda")
    with pytest.raises(ValueError, match=r"positions is on cpu but x is on cuda"):
        m(x, positions=torch.arange(5))
    with pytest.raises(ValueError, match=r"key_padding_mask is on cpu but x is on cuda"):
        m(x, key_padding_mask=torch.zeros(2, 5, dtype=torch.bool))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.booleans(), min_size=7, max_size=7), min_size=1, max_size=4))
def test_property_padding_anywhere(rows):
    # whatever the padding pattern, valid steps get 0, 1, 2, ... in order and padded steps nothing
    mask = torch.tensor(rows)
    x = torch.randn(mask.shape[0], 7, 8)
    out = SinusoidalPositionalEncoding(8)(x, key_padding_mask=mask)
    pe = slow_reference(torch.arange(7), 8)
    for b in range(mask.shape[0]):
        valid = (~mask[b]).nonzero().flatten()
        assert_close(out[b, valid], x[b, valid] + pe[: len(valid)])
        assert torch.equal(out[b, mask[b]], x[b, mask[b]])


# ----------------------------------------------------------------------------- fairseq2, bit for bit
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("encoding_dim, max_seq_len", [(4, 16), (6, 50), (32, 10), (512, 5000), (1022, 300)])
def test_fairseq2_table_bit_identical(encoding_dim, max_seq_len, dtype):
    # fairseq2 multiplies by exp(j * -ln(10000) / (h - 1)); dividing by exp(+...) rounds otherwise
    # (4.9e-4 at position 5000, d=512): the "t2t" ladder uses fairseq2's expression
    ref = fairseq2_table(encoding_dim, max_seq_len, dtype)
    m = SinusoidalPositionalEncoding(encoding_dim, max_len=max_seq_len, layout="split", ladder="t2t")
    out = m(torch.zeros(1, max_seq_len, encoding_dim, dtype=dtype))[0]
    assert out.dtype == dtype
    assert_close(out, ref, rtol=0, atol=0)
    if dtype == torch.float32:
        assert_close(m.pe, ref, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fairseq2_forward_and_incremental_decoding(dtype):
    # fairseq2's forward: step i of a call at state_bag.step_nr = start gets table row start + i;
    # vispos: the same rows through ``positions``, added in float32 and rounded once, as fairseq2
    torch.manual_seed(0)
    freqs = fairseq2_table(64, 40)
    m = SinusoidalPositionalEncoding(64, max_len=8, layout="split", ladder="t2t")  # grows to 40
    x = torch.randn(3, 40, 64).to(dtype)
    assert_close(m(x), fairseq2_forward(x, freqs), rtol=0, atol=0)
    for start, length in ((0, 5), (5, 1), (6, 1), (7, 33)):
        step = x[:, start : start + length]
        out = m(step, positions=start + torch.arange(length))
        assert out.dtype == dtype
        assert_close(out, fairseq2_forward(step, freqs, start_step=start), rtol=0, atol=0)
        assert_close(out, m(x)[:, start : start + length], rtol=0, atol=0)


def test_fairseq2_padded_steps_and_legacy_pad_idx():
    # fairseq2 does not read its padding mask: padded steps get their table row like any other,
    # and a left-padded item's first token sits at its absolute index. vispos' key_padding_mask
    # gives padded steps no encoding and counts valid steps from 0; to reproduce fairseq2, pass
    # the absolute positions and no mask.
    torch.manual_seed(0)
    freqs = fairseq2_table(16, 12)
    m = SinusoidalPositionalEncoding(16, layout="split", ladder="t2t")
    x = torch.randn(2, 12, 16)
    mask = torch.zeros(2, 12, dtype=torch.bool)
    mask[0, 9:] = True  # right padding
    mask[1, :4] = True  # left padding
    fs2 = fairseq2_forward(x, freqs)
    assert_close(m(x, positions=torch.arange(12)), fs2, rtol=0, atol=0)
    ours = m(x, key_padding_mask=mask)
    assert torch.equal(ours[mask], x[mask])  # vispos: padded steps hold the input
    assert not torch.equal(fs2[mask], x[mask])  # fairseq2: they got table rows
    assert_close(ours[0, :9], fs2[0, :9], rtol=0, atol=0)  # right padding: valid steps agree
    assert_close(ours[1, 4:], x[1, 4:] + freqs[:8], rtol=0, atol=0)  # left: counted from 0
    assert_close(fs2[1, 4:], x[1, 4:] + freqs[4:], rtol=0, atol=0)  # fairseq2: absolute index
    # fairseq2's _legacy_pad_idx (fairseq compatibility) starts the steps at 1 + pad_idx
    legacy = fairseq2_table(16, 12, legacy_pad_idx=1)
    assert_close(m(torch.zeros(1, 12, 16), positions=torch.arange(12) + 2)[0], legacy, rtol=0, atol=0)


# ----------------------------------------------------------------------------- every option
FLAGS = list(itertools.product([False, True], repeat=3))  # emb_scale, emb_layernorm, learnable_scale


def _formula_forward(m, x, layout, ladder, emb_scale, emb_layernorm, learnable_scale):
    """``dropout(LayerNorm(x) * sqrt(D) + alpha * PE)`` written out with torch.nn.functional."""
    d = x.shape[-1]
    out = F.layer_norm(x, (d,), m.layernorm.weight, m.layernorm.bias, m.layernorm.eps) if emb_layernorm else x
    out = out * math.sqrt(d) if emb_scale else out
    pe = slow_reference(torch.arange(x.shape[1]), d, layout, ladder, dtype=x.dtype)
    pe = m.alpha * pe if learnable_scale else pe
    return F.dropout(out + pe, m.dropout.p, training=m.training)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("emb_scale, emb_layernorm, learnable_scale", FLAGS)
@pytest.mark.parametrize("layout, ladder", list(itertools.product(["interleaved", "split"], ["standard", "t2t", "continued"])))
def test_every_option_forward_and_gradients(layout, ladder, emb_scale, emb_layernorm, learnable_scale, dtype):
    torch.manual_seed(0)
    d, length = 8, 9
    kwargs = dict(layout=layout, ladder=ladder, emb_scale=emb_scale, emb_layernorm=emb_layernorm,
                  learnable_scale=learnable_scale, init_alpha=0.75 if learnable_scale else 1.0)
    m = SinusoidalPositionalEncoding(d, dropout=0.25, **kwargs).to(dtype)
    if emb_layernorm:
        with torch.no_grad():
            m.layernorm.weight.uniform_(0.5, 1.5)
            m.layernorm.bias.uniform_(-0.5, 0.5)
    x = torch.randn(3, length, d, dtype=dtype)
    for training in (False, True):  # dropout under the same seed draws the same mask
        m.train(training)
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        torch.manual_seed(1)
        out = m(xa)
        torch.manual_seed(1)
        ref = _formula_forward(m, xb, layout, ladder, emb_scale, emb_layernorm, learnable_scale)
        assert out.dtype == dtype
        assert_close(out, ref)
        grad = torch.randn_like(out)
        params = [p for p in m.parameters()]
        got = torch.autograd.grad(out, [xa, *params], grad)
        want = torch.autograd.grad(ref, [xb, *params], grad)
        for g, w in zip(got, want):
            assert_close(g, w)
        assert torch.equal(xa, x)
