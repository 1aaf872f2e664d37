"""Argument checks (``vispos/_checks.py``), issue 32 item 8: every integer argument accepts NumPy and
0-d torch integer scalars and every real-number argument also their floating scalars, converted
to Python numbers without losing a digit; bools (of any library) and, for integers, floats are
refused with the house's ``TypeError``.
"""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest
import torch

import vispos
import vispos.encodings
from vispos._checks import (
    as_int,
    as_real,
    check_choice,
    check_dropout,
    check_int,
    check_multiple,
    check_number,
    check_sizes,
    is_int,
)

INT_SCALARS = {
    "numpy int64": np.int64(7),
    "numpy int8": np.int8(7),
    "numpy uint64": np.uint64(7),
    "numpy 0-d array": np.array(7),
    "torch int64": torch.tensor(7),
    "torch int32": torch.tensor(7, dtype=torch.int32),
    "torch uint8": torch.tensor(7, dtype=torch.uint8),
}
REAL_SCALARS = {
    "numpy float64": (np.float64(0.1), 0.1),
    "numpy float32": (np.float32(0.1), 0.10000000149011612),  # float32's 0.1, every digit kept
    "numpy float16": (np.float16(0.5), 0.5),
    "numpy 0-d array": (np.array(0.1), 0.1),
    "torch float64": (torch.tensor(0.1, dtype=torch.float64), 0.1),
    "torch float32": (torch.tensor(0.1), 0.10000000149011612),
    "torch bfloat16": (torch.tensor(0.1, dtype=torch.bfloat16), 0.10009765625),
}
NOT_INTS = {
    "bool": True, "numpy bool": np.bool_(True), "torch bool": torch.tensor(True), "float": 7.0,
    "numpy float": np.float32(7.0), "torch float": torch.tensor(7.0), "1-d tensor": torch.tensor([7]),
    "1-d array": np.array([7]), "str": "7", "None": None,
}
NOT_REALS = {
    "bool": False, "numpy bool": np.bool_(False), "torch bool": torch.tensor(False),
    "complex": 1j, "numpy complex": np.complex64(1), "torch complex": torch.tensor(1j),
    "1-d tensor": torch.tensor([0.5]), "str": "0.5", "meta tensor": torch.tensor(0.5, device="meta"),
}


@pytest.mark.parametrize("kind", INT_SCALARS)
def test_integer_scalars_become_python_ints(kind):
    value = INT_SCALARS[kind]
    for got in (check_int(value, "n", minimum=1), check_multiple(value, 7, "n"), check_number(value, "x"),
                check_choice(value, (5, 7), "n"), as_int(value)):
        assert type(got) is int and got == 7
    assert is_int(value)
    assert check_sizes(value, "size", n=2) == (7, 7) and all(type(s) is int for s in check_sizes([value, 3], "s"))


@pytest.mark.parametrize("kind", REAL_SCALARS)
def test_real_scalars_become_python_floats_exactly(kind):
    value, exact = REAL_SCALARS[kind]
    got = check_number(value, "x", positive=True)
    assert type(got) is float and got == exact  # ==, not approx: no digit lost
    assert type(as_real(value)) is float and check_dropout(value) == exact
    with pytest.raises(TypeError, match=r"n must be an int, got"):
        check_int(value, "n")


def test_float64_and_int64_precision_kept():
    third = np.float64(1) / 3
    assert check_number(third, "x") == float(third) and check_number(torch.tensor(float(third), dtype=torch.float64), "x") == 1 / 3
    big = 2**53 + 1  # not a float64: an int must never go through a float
    for value in (np.int64(big), torch.tensor(big), np.array(big)):
        assert check_number(value, "pad_value") == big and type(check_number(value, "pad_value")) is int
    assert check_int(np.uint64(2**64 - 1), "n") == 2**64 - 1


@pytest.mark.skipif(np.finfo(np.longdouble).nmant <= np.finfo(np.float64).nmant, reason="longdouble is float64 here")
def test_longdouble_that_would_round_is_refused():
    assert check_number(np.longdouble(0.5), "x") == 0.5  # exactly a float64: accepted
    with pytest.raises(ValueError, match=r"x = .* \(longdouble\) cannot be held by a Python float without rounding"):
        check_number(np.longdouble(1) / 3, "x")


@pytest.mark.parametrize("kind", NOT_INTS)
def test_not_integers_are_refused(kind):
    with pytest.raises(TypeError, match=r"n must be a positive int, got .*"):
        check_int(NOT_INTS[kind], "n", minimum=1)
    assert not is_int(NOT_INTS[kind])


@pytest.mark.parametrize("kind", NOT_REALS)
def test_not_reals_are_refused(kind):
    with pytest.raises(TypeError, match=r"x must be a finite number, got .*"):
        check_number(NOT_REALS[kind], "x")
    with pytest.raises(TypeError, match=r"dropout must be a float in \[0, 1\), got"):
        check_dropout(NOT_REALS[kind])


def test_ranges_apply_to_the_converted_value():
    with pytest.raises(ValueError, match=r"n must be a positive int, got 0"):
        check_int(np.int64(0), "n", minimum=1)
    with pytest.raises(ValueError, match=r"x must be > 0, got -0.5"):
        check_number(torch.tensor(-0.5), "x", positive=True)
    with pytest.raises(ValueError, match=r"x must be a finite number, got inf"):
        check_number(np.float32("inf"), "x")
    with pytest.raises(ValueError, match=r"n must be a positive multiple of 4 .*got 6"):
        check_multiple(torch.tensor(6), 4, "n", "why")


# -------------------------------------------------------------------- the example, end to end
@pytest.mark.parametrize("pad_value", [np.float32(0.5), np.float64(0.5), np.array(0.5), torch.tensor(0.5)])
def test_numpy_and_torch_pad_value(pad_value):
    items = [torch.zeros(1, 2, 3), torch.zeros(1, 3, 2)]
    nt = vispos.nested_tensor_from_tensor_list(items, pad_value=pad_value)
    assert nt.tensors[0, 0, 2, 0] == 0.5 and nt.tensors[1, 0, 0, 2] == 0.5
    collate = vispos.PaddedCollate(size_divisibility=np.int64(4), pad_value=pad_value)
    assert type(collate.pad_value) is float and collate.size_divisibility == 4
    assert collate([(items[0], None), (items[1], None)])[0].tensors.shape == (2, 1, 4, 4)


def test_int64_pad_value_kept_exactly():
    big = 2**53 + 1
    nt = vispos.nested_tensor_from_tensor_list(
        [torch.zeros(1, 1, 1, dtype=torch.int64), torch.zeros(1, 2, 2, dtype=torch.int64)], pad_value=np.int64(big)
    )
    assert int(nt.tensors[0, 0, 1, 1]) == big


# ------------------------------------------------------------- every numeric argument of every encoder
#: required arguments of the public encoders whose signatures have none with a numeric default
REQUIRED = {
    "AxialRotaryEmbedding": dict(dim=8),
    "DinoV3RotaryEmbedding": dict(dim=16),
    "MixedRotaryEmbedding": dict(dim=16, depth=2, num_heads=2),
    "RotaryEmbedding": dict(dim=8),
    "SinusoidalPositionalEncoding": dict(dim=8),
    "LearnableSinusoidalPositionalEncoding": dict(dim=8),
    "init_mixed_freqs": dict(head_dim=16, depth=2, num_heads=2),
    "timm_sincos_2d": dict(feat_shape=[3, 4]),
    "mae_sincos_2d": dict(embed_dim=16, grid_size=3),
    "monai_sincos": dict(grid_size=3, embed_dim=12),
    **{f"PositionalEncoding{p}{n}D": dict(channels=8) for p in ("", "Permute") for n in (1, 2, 3)},
    # drop-ins added beside this test in issue 32 (the rff engineer); used once they exist
    "monai_fourier": dict(grid_size=3, embed_dim=12),
    "rtdetr_sincos_2d": dict(height=3, width=4, embed_dim=16),
}
#: public encoders with no numeric argument to test here (and why)
NO_NUMBERS = {
    "Summer": "wraps a module", "FixEncoding": "wraps a module and a shape", "cumulative_positions": "takes a mask",
    "sine_embed_coords": "takes coordinates first (tested below)", "resample_abs_pos_embed": "takes a table first",
    "apply_rotary_sincos": "takes tensors", "apply_rot_embed_cat": "takes tensors",
}


def _encoders() -> dict[str, object]:
    return {n: getattr(vispos.encodings, n) for n in vispos.encodings.__all__}


def _numeric_defaults(obj) -> dict[str, int | float]:
    out = {}
    for p in inspect.signature(obj).parameters.values():
        d = p.default
        if isinstance(d, (int, float)) and not isinstance(d, bool):
            out[p.name] = d
    return out


CONVERSIONS = {  # kind -> (int converter, float converter, the exact Python value it stands for)
    "numpy": (np.int64, np.float64, lambda v: v),
    "numpy 32-bit": (np.int32, np.float32, lambda v: v if isinstance(v, int) else float(np.float32(v))),
    "numpy 0-d array": (np.array, np.array, lambda v: v),
    "torch": (torch.tensor, lambda v: torch.tensor(v, dtype=torch.float64), lambda v: v),
    "torch 32-bit": (lambda v: torch.tensor(v, dtype=torch.int32), torch.tensor,
                     lambda v: v if isinstance(v, int) else float(np.float32(v))),
}


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    return repr(a) == repr(b)


@pytest.mark.parametrize("kind", CONVERSIONS)
@pytest.mark.parametrize("name", sorted(set(_encoders()) - set(NO_NUMBERS)))
def test_every_numeric_argument_of_every_encoder(name, kind):
    """Each int / float argument of each public encoder (its defaults, as NumPy or torch scalars)
    gives the object a Python scalar would (same repr, same output): nothing refused, nothing
    stored as a NumPy or tensor scalar (which the repr would show)."""
    obj = _encoders()[name]
    numbers = _numeric_defaults(obj)
    assert numbers, f"{name} has no numeric argument: list it in NO_NUMBERS"
    to_int, to_float, exact = CONVERSIONS[kind]
    required = REQUIRED.get(name, {})
    numbers.update({k: v for k, v in required.items() if isinstance(v, int)})  # the sizes too
    converted = {k: (to_int(v) if isinstance(v, int) else to_float(v)) for k, v in numbers.items()}
    python = {k: exact(v) for k, v in numbers.items()}
    others = {k: v for k, v in required.items() if k not in numbers}
    torch.manual_seed(0)
    got = obj(**others, **converted)
    torch.manual_seed(0)
    want = obj(**others, **python)
    assert _same(got, want), (got, want)
    if isinstance(got, torch.nn.Module):  # no NumPy or tensor scalar kept as a plain attribute
        kept = {k: v for k, v in vars(got).items() if isinstance(v, np.generic) or (isinstance(v, torch.Tensor) and v.dim() == 0)}
        assert not kept, kept


def test_sine_scale_and_coords_with_scalars():
    pe = vispos.PositionEmbeddingSine(np.int64(8), temperature=np.float32(20), normalize=True,
                                      scale=torch.tensor(math.pi, dtype=torch.float64), offset=np.float64(-0.5))
    ref = vispos.PositionEmbeddingSine(8, temperature=20.0, normalize=True, scale=math.pi, offset=-0.5)
    mask = torch.zeros(1, 3, 4, dtype=torch.bool)
    assert repr(pe) == repr(ref) and torch.equal(pe(mask), ref(mask))
    assert type(pe.scale) is float and pe.scale == math.pi
    coords = torch.rand(2, 4)
    assert torch.equal(vispos.sine_embed_coords(coords, np.int64(8), np.float32(20), scale=np.float64(1.5)),
                       vispos.sine_embed_coords(coords, 8, 20.0, scale=1.5))
    posemb = torch.randn(1, 1 + 16, 4)
    assert torch.equal(vispos.resample_abs_pos_embed(posemb, (np.int64(6), torch.tensor(6)), num_prefix_tokens=np.int64(1)),
                       vispos.resample_abs_pos_embed(posemb, (6, 6), num_prefix_tokens=1))


def test_scalars_beyond_the_encoders():
    """The transformer, the padding value object and the mask functions take them too."""
    from vispos.transformer import DetrEncoderLayer

    layer = DetrEncoderLayer(np.int64(16), nhead=torch.tensor(4), dim_feedforward=np.int32(32), dropout=np.float32(0.25))
    assert repr(layer) == repr(DetrEncoderLayer(16, nhead=4, dim_feedforward=32, dropout=0.25))
    assert type(layer.d_model) is int and type(layer.dropout_p) is float
    padding = vispos.Padding.from_sizes([(np.int64(2), torch.tensor(3))], spatial=(np.int64(4), 4))
    assert padding == vispos.Padding.from_sizes([(2, 3)], spatial=(4, 4)) and padding.none(np.int64(2), (3,)).batch == 2
    mask = padding.mask
    assert torch.equal(vispos.interpolate_mask(mask, np.int64(8)), vispos.interpolate_mask(mask, 8))
    assert torch.equal(vispos.attn_mask_from_padding(mask, num_prefix_tokens=np.int64(1)),
                       vispos.attn_mask_from_padding(mask, num_prefix_tokens=1))


# ------------------------------------------------- NumPy bools, sequences, and what messages quote
def test_numpy_and_torch_bools_are_bools():
    from vispos._checks import check_bool

    for value in (np.bool_(True), np.array(True), torch.tensor(True)):
        assert check_bool(value, "flag") is True
    for value in (1, np.int64(1), torch.tensor(1), "True", np.array([True])):
        with pytest.raises(TypeError, match="flag must be a bool"):
            check_bool(value, "flag")
    pe = vispos.PositionEmbeddingSine(8, normalize=np.bool_(True))
    assert pe.normalize is True and "normalize=True" in repr(pe)


def test_sequences_as_lists_tuples_and_arrays():
    assert check_sizes(np.array([4, 6]), "size") == (4, 6)
    assert check_sizes([np.int64(4), 6], "size") == (4, 6)
    assert vispos.Padding.none(2, np.array([4, 6])).spatial == (4, 6)
    assert vispos.Padding.from_sizes(np.array([[3, 4], [4, 6]]).tolist(), np.array([4, 6])).sizes == ((3, 4), (4, 6))
    assert vispos.PositionEmbeddingLearned(8, num_embeddings=np.array([5, 7])).num_embeddings == (5, 7)


def test_timm_out_indices_as_an_array():
    pytest.importorskip("timm")
    from vispos.backbones import TimmBackbone

    backbone = TimmBackbone("resnet18", out_indices=np.array([3, 4]))
    assert backbone.out_indices == (3, 4)


BIG = {"tensor": torch.full((3, 40, 40), 123.456), "array": np.full((3, 40, 40), 123.456)}


def _quotes_values(message: str) -> bool:
    return "tensor(" in message or "array(" in message or message.count("123.456") > 2


@pytest.mark.parametrize("kind", BIG)
def test_describe_gives_type_shape_and_dtype(kind):
    from vispos._checks import describe

    text = describe(BIG[kind])
    assert text.endswith("of shape (3, 40, 40) and dtype " + str(BIG[kind].dtype)) and "123" not in text
    assert len(describe(list(range(1000)))) < 100


def _public_callables():
    import vispos.encodings

    names = sorted(set(vispos.__all__) | set(vispos.encodings.__all__))
    out = {}
    for name in names:
        obj = getattr(vispos, name, None) or getattr(vispos.encodings, name)
        try:
            params = list(inspect.signature(obj).parameters.values())
        except (TypeError, ValueError):
            continue
        out[name] = (obj, [p for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)])
    return out


#: parameters handed to another library unchecked (its own message), or owned by a module whose
#: messages are still to be brought to the rule
_UNCHECKED = {("PositionEmbeddingRandom", "generator"), ("SamPositionalEmbedding", "generator")}
_PENDING: set = set()


def test_no_error_message_prints_a_tensors_values():
    """Every public callable, with a tensor or an array where any one argument goes (the others
    left at their defaults): no message quotes the values (type, shape and dtype only)."""
    found = []
    for name, (obj, params) in _public_callables().items():
        for p in params:
            if any(q is not p and q.default is q.empty for q in params) or (name, p.name) in _UNCHECKED:
                continue
            for kind, big in BIG.items():
                try:
                    obj(**{p.name: big})
                except Exception as exc:  # noqa: BLE001 - every error is read
                    if _quotes_values(str(exc)) and (name, p.name) not in _PENDING:
                        found.append(f"{name}({p.name}=<{kind}>): {str(exc)[:80]}")
    assert found == []


def test_encoder_call_errors_print_no_values():
    """The calls of the issue: pos(x, pixel_mask) positionally (an integer mask), a float mask,
    a feature map of the wrong rank, a bad spacing: one short line, no values."""
    pe = vispos.PositionEmbeddingSine(64)
    x = torch.full((2, 3, 64, 64), 123.456)
    pixel_mask = torch.ones(2, 64, 64, dtype=torch.long)
    calls = [
        lambda: pe(x, pixel_mask),
        lambda: pe(x, pixel_mask.float()),
        lambda: pe(x, "mask"),
        lambda: pe(torch.full((2, 64, 64), 123.456)),
        lambda: pe(x, spacing=torch.full((2, 7), 123.456)),
        lambda: pe(x, spacing=torch.full((2, 2), 123, dtype=torch.long)),
        lambda: pe(x, dtype=torch.full((2,), 123.456)),
        lambda: pe(x, out=torch.full((2, 5), 123.456)),
        lambda: vispos.PositionEmbeddingLearned(16)(x, pixel_mask),
    ]
    for call in calls:
        with pytest.raises((TypeError, ValueError)) as info:
            call()
        assert not _quotes_values(str(info.value)) and len(str(info.value)) < 500, str(info.value)[:200]
