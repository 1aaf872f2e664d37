"""SpeechainPositionalEncoding against speechain's ``PositionalEncoding``, written statement by
statement from its source (``speechain/module/transformer/pos_enc.py``), for every option."""

import copy
import itertools
import math
import pickle

import pytest
import torch
from torch.testing import assert_close

import vispos
from vispos import SinusoidalPositionalEncoding, SpeechainPositionalEncoding

EPS32 = torch.finfo(torch.float32).eps


class SpeechainReference(torch.nn.Module):
    """speechain's ``PositionalEncoding`` (``module_init``, ``update_posenc``, ``forward``), its
    ``Module`` base replaced by ``nn.Module``; nothing else changed, its quirks included."""

    def __init__(self, posenc_type="mix", d_model=512, emb_scale=False, emb_layernorm=False,
                 posenc_scale=False, init_alpha=1.0, max_len=5000, dropout=0.0):
        super().__init__()
        assert posenc_type in ["mix", "sep"]
        assert d_model % 2 == 0
        self.posenc_type = posenc_type
        self.d_model = d_model
        self.emb_scale = emb_scale
        if emb_layernorm:
            self.emb_layernorm = torch.nn.LayerNorm(d_model)
        self.init_alpha = init_alpha if isinstance(init_alpha, float) else float(init_alpha)
        if posenc_scale:
            self.alpha = torch.nn.Parameter(torch.tensor(self.init_alpha))
        self.update_posenc(max_len)
        self.dropout = torch.nn.Dropout(p=dropout)

    def update_posenc(self, max_len):
        position = torch.arange(0, max_len, dtype=torch.float).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, self.d_model, 2, dtype=torch.float) * (math.log(10000.0) / self.d_model))
        posenc = torch.zeros(max_len, self.d_model)
        if self.posenc_type == "mix":
            posenc[:, 0::2] = torch.sin(position / div_term)
            posenc[:, 1::2] = torch.cos(position / div_term)
        elif self.posenc_type == "sep":
            div_term_ext = torch.exp(
                torch.arange(self.d_model, self.d_model * 2, 2, dtype=torch.float) * (math.log(10000.0) / self.d_model)
            )
            posenc[:, : int(self.d_model / 2)] = torch.sin(position / div_term)
            posenc[:, int(self.d_model / 2) :] = torch.cos(position / div_term_ext)
        self.register_buffer("posenc", posenc.unsqueeze(0))

    def forward(self, emb_feat):
        if emb_feat.size(1) > self.posenc.size(1):
            self.update_posenc(emb_feat.size(1), self.d_model)  # speechain's call (one argument too many)
        if hasattr(self, "emb_layernorm"):
            emb_feat = self.emb_layernorm(emb_feat)
        if self.emb_scale:
            emb_feat *= math.sqrt(self.d_model)
        posenc = self.posenc[:, : emb_feat.size(1)]
        if hasattr(self, "alpha"):
            posenc = posenc * self.alpha
        return self.dropout(emb_feat + posenc)


def exact_table(posenc_type, d, length):
    """speechain's docstring formulas in float64: 'sep' cosine i on 10000^(2i/d), i = d/2 .. d-1."""
    pos = torch.arange(length, dtype=torch.float64).unsqueeze(1)
    i = torch.arange(d // 2, dtype=torch.float64)
    sin = torch.sin(pos / 10000.0 ** (2 * i / d))
    if posenc_type == "mix":
        return torch.stack([sin, torch.cos(pos / 10000.0 ** (2 * i / d))], -1).flatten(1)
    return torch.cat([sin, torch.cos(pos / 10000.0 ** (2 * (i + d // 2) / d))], -1)


def rounding_bound(length, d):
    """Float32 rounding of the angles at position p: two implementations that each round
    ``p / divisor`` once (and the divisor once) differ by at most ``2 (p + 1) eps``."""
    return (2 * EPS32 * (torch.arange(length, dtype=torch.float64) + 1)).unsqueeze(1).expand(length, d)


def _pair(posenc_type, d, emb_scale, emb_layernorm, posenc_scale, dropout=0.0, max_len=64):
    """A reference with random LayerNorm / alpha and ours loaded from its checkpoint."""
    ref = SpeechainReference(posenc_type, d, emb_scale, emb_layernorm, posenc_scale, init_alpha=0.7,
                             max_len=max_len, dropout=dropout)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn(p.shape) * 0.3)
    ours = SpeechainPositionalEncoding(posenc_type, d, emb_scale, emb_layernorm, posenc_scale, init_alpha=0.7,
                                       max_len=max_len, dropout=dropout)
    ours.load_state_dict(ref.state_dict())  # a speechain checkpoint, its posenc table included
    return ref, ours


def _our_table(posenc_type, d, length, dtype):
    """Our raw encoding ``(1, L, d)`` in ``dtype`` (float64 is computed in float64)."""
    return SpeechainPositionalEncoding(posenc_type, d, max_len=1)(torch.zeros(1, length, d, dtype=dtype))


# ----------------------------------------------------------------------------- tables
@pytest.mark.parametrize("posenc_type", ["mix", "sep"])
@pytest.mark.parametrize("d_model, length", [(2, 50), (4, 300), (6, 300), (64, 1000), (512, 5000)])
def test_table_within_float32_rounding(posenc_type, d_model, length):
    ours = SpeechainPositionalEncoding(posenc_type, d_model, max_len=length).posenc[0].double()
    ref = SpeechainReference(posenc_type, d_model, max_len=length).posenc[0].double()
    exact = exact_table(posenc_type, d_model, length)
    bound = rounding_bound(length, d_model)
    assert ((ref - exact).abs() <= bound).all()  # the reference is within it too
    assert ((ours - exact).abs() <= bound).all()
    assert ((ours - ref).abs() <= bound).all()


def test_sep_cosines_continue_the_ladder():
    # the example: d=4, position 1, channel 2 is cos(1 / 10000^(4/4)), not cos(1) (t2t)
    table = SpeechainPositionalEncoding("sep", 4).posenc[0]
    assert_close(table[1], torch.tensor([math.sin(1), math.sin(1e-2), math.cos(1e-4), math.cos(1e-6)]))
    split = SinusoidalPositionalEncoding(4, layout="split").pe
    assert abs(float(table[1, 2]) - float(split[1, 2])) > 0.45  # cos(1e-4) vs cos(1) = 0.5403


@pytest.mark.parametrize("posenc_type, layout, ladder", [("mix", "interleaved", "standard"), ("sep", "split", "continued")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_same_as_general_encoder(posenc_type, layout, ladder, dtype):
    torch.manual_seed(0)
    ours = SpeechainPositionalEncoding(posenc_type, 16, emb_scale=True, emb_layernorm=True, posenc_scale=True,
                                       init_alpha=0.5).to(dtype)
    general = SinusoidalPositionalEncoding(16, layout=layout, ladder=ladder, emb_scale=True, emb_layernorm=True,
                                           learnable_scale=True, init_alpha=0.5).to(dtype)
    with torch.no_grad():
        ours.emb_layernorm.weight.uniform_(0.5, 1.5)
        general.layernorm.load_state_dict(ours.emb_layernorm.state_dict())
    x = torch.randn(2, 30, 16, dtype=dtype)
    assert_close(ours(x), general(x), rtol=0, atol=0)
    assert_close(ours.posenc[0], general.pe, rtol=0, atol=0)


# ----------------------------------------------------------------------------- every option
COMBOS = list(itertools.product(["mix", "sep"], [False, True], [False, True], [False, True]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("posenc_type, emb_scale, emb_layernorm, posenc_scale", COMBOS)
def test_forward_and_gradients_match_speechain(posenc_type, emb_scale, emb_layernorm, posenc_scale, dtype):
    torch.manual_seed(0)
    d, length = 16, 37
    ref, ours = _pair(posenc_type, d, emb_scale, emb_layernorm, posenc_scale, dropout=0.25)
    ref.to(dtype)
    ours.to(dtype)
    x = torch.randn(3, length, d, dtype=dtype)
    speechain_table = ref.posenc.clone()
    for table in ("ours", "speechain"):
        # "ours": the reference runs on our table, so what is left is the order of operations,
        # which must agree to the last bit; "speechain": its own table, float32 rounding apart
        ref.posenc = _our_table(posenc_type, d, 64, dtype) if table == "ours" else speechain_table
        exact = table == "ours"
        for training in (False, True):  # dropout under the same seed draws the same mask
            ref.train(training)
            ours.train(training)
            xr, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
            torch.manual_seed(1)
            out_r = ref(xr * 1)  # speechain scales its input in place: hand it a copy
            torch.manual_seed(1)
            out_o = ours(xo)
            assert out_o.dtype == dtype
            alpha = float(ref.alpha.detach()) if posenc_scale else 1.0
            keep = 1 / 0.75 if training else 1.0
            atol = 0 if exact else float(rounding_bound(length, d).max()) * abs(alpha) * keep + 4 * torch.finfo(dtype).eps
            assert_close(out_o, out_r, rtol=0, atol=atol)
            g = torch.randn_like(out_r)
            out_r.backward(g)
            out_o.backward(g)
            assert_close(xo.grad, xr.grad, rtol=0, atol=0)  # the table does not reach x's gradient
            for name, p in ref.named_parameters():
                q = ours.get_parameter(name)
                tol = 0 if exact or name != "alpha" else float((g.abs().sum((0,)) * rounding_bound(length, d)).sum()) * keep
                assert_close(q.grad, p.grad, rtol=0, atol=tol)
                p.grad = q.grad = None
            assert torch.equal(xo, x)


# ----------------------------------------------------------------------------- vispos' departures
def test_growth_past_max_len():
    ref = SpeechainReference("sep", 8, max_len=40)
    ours = SpeechainPositionalEncoding("sep", 8, max_len=10)
    x = torch.randn(2, 40, 8)
    out = ours(x)
    assert ours.posenc.shape == (1, 40, 8)
    assert_close(out, x + SpeechainPositionalEncoding("sep", 8, max_len=40).posenc, rtol=0, atol=0)
    assert ((out - ref(x.clone())).abs() <= rounding_bound(40, 8)).all()
    with pytest.raises(TypeError):  # speechain's own growth path: update_posenc(L, d_model)
        SpeechainReference("sep", 8, max_len=10)(x.clone())


def test_input_is_never_written():
    x = torch.randn(2, 5, 8)
    before = x.clone()
    ours = SpeechainPositionalEncoding("mix", 8, emb_scale=True)
    out = ours(x)
    assert torch.equal(x, before)
    ref_in = x.clone()
    ref_out = SpeechainReference("mix", 8, emb_scale=True)(ref_in)
    assert torch.equal(ref_in, before * math.sqrt(8))  # speechain scales its input in place
    assert ((out - ref_out).abs() <= rounding_bound(5, 8)).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_keep_their_dtype(dtype):
    torch.manual_seed(0)
    x = torch.randn(2, 300, 16).to(dtype)
    ref = SpeechainReference("sep", 16, emb_scale=True, max_len=300)
    ref.posenc = _our_table("sep", 16, 300, torch.float32)
    ours = SpeechainPositionalEncoding("sep", 16, emb_scale=True)
    want = ref(x.clone())
    assert want.dtype == torch.float32  # speechain: half + its float32 table is float32
    out = ours(x)
    assert out.dtype == dtype
    assert_close(out, want.to(dtype), rtol=0, atol=0)  # the same sum, rounded once


def test_checkpoints_both_ways():
    ref, ours = _pair("sep", 8, True, True, True)
    assert set(ref.state_dict()) == {"alpha", "emb_layernorm.weight", "emb_layernorm.bias", "posenc"}
    assert set(ours.state_dict()) == {"alpha", "emb_layernorm.weight", "emb_layernorm.bias"}
    back = SpeechainReference("sep", 8, True, True, True, max_len=64)
    back.load_state_dict(ours.state_dict(), strict=False)  # speechain rebuilds posenc itself
    x = torch.randn(2, 6, 8)
    ref.posenc = back.posenc = _our_table("sep", 8, 64, torch.float32)
    assert_close(back(x.clone()), ours(x), rtol=0, atol=0)
    state = ref.state_dict()
    state["posenc"] = torch.zeros(1, 64, 6)
    with pytest.raises(RuntimeError, match=r"size mismatch for posenc: a speechain table of shape \(1, max_len, 8\)"):
        SpeechainPositionalEncoding("sep", 8, True, True, True).load_state_dict(state)
    with pytest.raises(RuntimeError, match=r"Missing key\(s\).*alpha"):
        SpeechainPositionalEncoding("sep", 8, True, True, True).load_state_dict(
            {k: v for k, v in ref.state_dict().items() if k != "alpha"}
        )


def test_speechain_attributes_and_methods():
    m = SpeechainPositionalEncoding()
    assert (m.posenc_type, m.d_model, m.emb_scale, m.init_alpha) == ("mix", 512, False, 1.0)
    assert m.posenc.shape == (1, 5000, 512) and m.posenc.dtype == torch.float32
    assert not hasattr(m, "alpha") and not hasattr(m, "emb_layernorm")
    assert m.get_recordable_para() is None
    assert isinstance(m.dropout, torch.nn.Dropout) and m.dropout.p == 0.0
    m = SpeechainPositionalEncoding("sep", 8, emb_layernorm=True, posenc_scale=True, init_alpha=2)
    assert isinstance(m.emb_layernorm, torch.nn.LayerNorm) and isinstance(m.alpha, torch.nn.Parameter)
    assert m.init_alpha == 2.0 and isinstance(m.init_alpha, float)
    assert m.get_recordable_para() == {"alpha": m.alpha}
    m.double()
    with torch.no_grad():
        m.alpha.fill_(-3.0)
    m.reset_parameters()
    assert m.alpha.item() == 2.0 and m.alpha.dtype == torch.float64
    assert m.posenc.dtype == torch.float32  # derived tables stay float32 after .double()
    m.update_posenc(7)
    assert m.posenc.shape == (1, 7, 8)
    assert_close(m.posenc, SpeechainPositionalEncoding("sep", 8, max_len=7).posenc, rtol=0, atol=0)
    assert m(torch.randn(1, 9, 8, dtype=torch.float64)).shape == (1, 9, 8)
    # speechain stores init_alpha without posenc_scale and ignores it: so do we (configs load)
    assert SpeechainPositionalEncoding(init_alpha=0.5).init_alpha == 0.5


def test_repr_pickle_deepcopy():
    m = SpeechainPositionalEncoding("sep", 8, emb_scale=True, emb_layernorm=True, posenc_scale=True,
                                    init_alpha=0.5, max_len=32, dropout=0.1)
    assert m.extra_repr() == (
        "posenc_type='sep', d_model=8, emb_scale=True, emb_layernorm=True, posenc_scale=True, "
        "init_alpha=0.5, max_len=32, dropout=0.1"
    )
    assert SpeechainPositionalEncoding().extra_repr() == (
        "posenc_type='mix', d_model=512, emb_scale=False, emb_layernorm=False, posenc_scale=False, "
        "init_alpha=1.0, max_len=5000, dropout=0.0"
    )
    m.eval()
    x = torch.randn(2, 6, 8)
    for clone in (pickle.loads(pickle.dumps(m)), copy.deepcopy(m)):
        assert_close(clone.eval()(x), m(x), rtol=0, atol=0)
    assert "SpeechainPositionalEncoding" in vispos.__all__
    assert vispos.config.build_from_config({"type": "SpeechainPositionalEncoding", "posenc_type": "sep",
                                            "d_model": 8}).posenc_type == "sep"


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(posenc_type="t2t"), ValueError, r"posenc_type must be one of \('mix', 'sep'\), got 't2t'"),
        (dict(posenc_type=1), TypeError, r"posenc_type must be one of \('mix', 'sep'\), got 1 \(int\)"),
        (dict(d_model=7), ValueError, r"d_model must be a positive even int .*got 7"),
        (dict(d_model=8.0), TypeError, r"d_model must be a positive even int, got 8.0 \(float\)"),
        (dict(emb_scale=1), TypeError, r"emb_scale must be a bool, got 1 \(int\)"),
        (dict(emb_layernorm="yes"), TypeError, r"emb_layernorm must be a bool, got 'yes'"),
        (dict(posenc_scale=None), TypeError, r"posenc_scale must be a bool, got None"),
        (dict(init_alpha="1"), TypeError, r"init_alpha must be a finite number, got '1' \(str\)"),
        (dict(init_alpha=float("inf")), ValueError, r"init_alpha must be a finite number, got inf"),
        (dict(max_len=0), ValueError, r"max_len must be a positive int, got 0"),
        (dict(dropout=1.0), ValueError, r"dropout must be a float in \[0, 1\), got 1.0"),
    ],
)
def test_constructor_errors(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        SpeechainPositionalEncoding(**{"d_model": 8, **kwargs})


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda m: m([1.0]), TypeError, r"emb_feat must be a Tensor, got list"),
        (lambda m: m(torch.zeros(2, 5, 8, dtype=torch.long)), TypeError, r"emb_feat must be a floating tensor .*torch.int64"),
        (lambda m: m(torch.zeros(5, 8)), ValueError, r"emb_feat must have shape \(B, L, D\) with D = d_model = 8 .*got \(5, 8\)"),
        (lambda m: m(torch.zeros(2, 5, 6)), ValueError, r"emb_feat must have shape \(B, L, D\) .*got \(2, 5, 6\)"),
        (lambda m: m.update_posenc(0), ValueError, r"max_len must be a positive int, got 0"),
        (lambda m: m.update_posenc(2.0), TypeError, r"max_len must be a positive int, got 2.0 \(float\)"),
    ],
)
def test_forward_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call(SpeechainPositionalEncoding("sep", 8))
