import copy
import pickle

import positional_encodings.torch_encodings as peer
import pytest
import torch
from torch import nn
from torch.testing import assert_close

from vispos.encodings.grid import (
    FixEncoding,
    PositionalEncoding1D,
    PositionalEncoding2D,
    PositionalEncoding3D,
    PositionalEncodingPermute1D,
    PositionalEncodingPermute2D,
    PositionalEncodingPermute3D,
    Summer,
)

OURS = {
    (1, False): PositionalEncoding1D,
    (2, False): PositionalEncoding2D,
    (3, False): PositionalEncoding3D,
    (1, True): PositionalEncodingPermute1D,
    (2, True): PositionalEncodingPermute2D,
    (3, True): PositionalEncodingPermute3D,
}
KINDS = list(OURS)
KIND_IDS = [f"{'Permute' if p else ''}{n}D" for n, p in KINDS]
SMALL_SPATIAL = {1: (7,), 2: (5, 6), 3: (3, 4, 5)}
F32 = dict(rtol=0, atol=1e-6)


def _peer_cls(n, permute):
    return getattr(peer, f"PositionalEncoding{'Permute' if permute else ''}{n}D")


def _input(batch, spatial, channels, permute, dtype=torch.float32, device="cpu"):
    x = torch.randn(batch, *spatial, channels, device=device).to(dtype)
    return x.movedim(-1, 1) if permute else x


# ------------------------------------------------------------------------------------- parity
@pytest.mark.parametrize("channels", range(1, 131))
@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
def test_parity_every_channel_count(kind, channels):
    n, permute = kind
    x = _input(2, SMALL_SPATIAL[n], channels, permute)
    expected = _peer_cls(n, permute)(channels)(x)
    got = OURS[kind](channels)(x)
    assert got.shape == x.shape
    assert_close(got, expected, **F32)


SHAPES = {
    1: [(1, (1,)), (3, (50,)), (4, (129,))],
    2: [(1, (1, 1)), (2, (16, 16)), (3, (9, 31)), (1, (40, 3))],
    3: [(1, (1, 1, 1)), (2, (4, 6, 8)), (3, (9, 2, 5))],
}
CASES = [(n, b, s) for n in SHAPES for b, s in SHAPES[n]]


@pytest.mark.parametrize("channels", [6, 64, 127])
@pytest.mark.parametrize("permute", [False, True])
@pytest.mark.parametrize("n, batch, spatial", CASES)
def test_parity_shapes_and_batches(n, batch, spatial, permute, channels, device):
    x = _input(batch, spatial, channels, permute, device=device)
    expected = _peer_cls(n, permute)(channels).to(device)(x)
    got = OURS[n, permute](channels)(x)
    assert got.device == x.device
    assert_close(got, expected, **F32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
def test_parity_input_dtypes(kind, dtype):
    n, permute = kind
    x = _input(3, SMALL_SPATIAL[n], 37, permute, dtype=dtype)
    expected = _peer_cls(n, permute)(37)(x)  # the peer writes float32 angles into the input dtype
    got = OURS[kind](37)(x)
    assert got.dtype == dtype
    assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.parametrize("override", [torch.float32, torch.float16, torch.float64])
@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
def test_dtype_override_with_int64_input(kind, override):
    n, permute = kind
    x = _input(2, SMALL_SPATIAL[n], 21, permute).mul(10).long()
    # the installed peer (6.0.3) predates dtype_override; its output dtype is the input's
    expected = _peer_cls(n, permute)(21)(x.to(override))
    got = OURS[kind](21, dtype_override=override)(x)
    assert got.dtype == override
    assert_close(got, expected, rtol=0, atol=0)


def test_values_from_the_formula():
    # 2D, 6 channels: 4 per axis (rounded up), truncated to 6; x block then 2 channels of y
    got = PositionalEncoding2D(6)(torch.zeros(1, 3, 2, 6, dtype=torch.float64))
    inv = 1 / torch.tensor([1.0, 10000 ** 0.5], dtype=torch.float64)
    for i in range(3):
        for j in range(2):
            ref = torch.stack([torch.sin(i * inv[0]), torch.cos(i * inv[0]), torch.sin(i * inv[1]),
                               torch.cos(i * inv[1]), torch.sin(j * inv[0]), torch.cos(j * inv[0])])
            assert_close(got[0, i, j], ref, rtol=0, atol=1e-6)


# ---------------------------------------------------------------------------- package defects
def test_defect_channel_mismatch_raises():
    x = torch.zeros(2, 4, 4, 16)
    assert peer.PositionalEncoding2D(10)(x).shape[-1] == 12  # the package: silently 12 of 16
    with pytest.raises(ValueError, match=r"PositionalEncoding2D\(channels=10\) got an input with 16 channels"):
        PositionalEncoding2D(10)(x)
    with pytest.raises(ValueError, match="got an input with 12 channels"):
        PositionalEncoding2D(10)(x[..., :12])  # the package: 12 channels from channels=10's ladder
    with pytest.raises(ValueError, match="got an input with 3 channels"):
        PositionalEncodingPermute1D(4)(torch.zeros(1, 3, 5))


def test_defect_cache_keyed_on_dtype():
    x32, x16 = torch.zeros(2, 5, 6, 8), torch.zeros(2, 5, 6, 8, dtype=torch.float16)
    theirs = peer.PositionalEncoding2D(8)
    theirs(x32)
    assert theirs(x16).dtype == torch.float32  # the package hands back the float32 cache
    ours = PositionalEncoding2D(8)
    ours(x32)
    out = ours(x16)
    assert out.dtype == torch.float16
    assert_close(out, peer.PositionalEncoding2D(8)(x16), rtol=0, atol=0)


def test_defect_cache_keyed_on_device():
    # the meta device stands in for a second device on machines without a GPU
    x_cpu, x_meta = torch.zeros(2, 5, 8), torch.zeros(2, 5, 8, device="meta")
    theirs = peer.PositionalEncoding1D(8)
    theirs(x_cpu)
    assert theirs(x_meta).device.type == "cpu"  # the package hands back the cpu cache
    ours = PositionalEncoding1D(8)
    ours(x_cpu)
    assert ours(x_meta).device.type == "meta"
    assert ours(x_cpu).device.type == "cpu"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cache_keyed_on_cuda_device():
    enc = PositionalEncoding3D(12)
    x = torch.randn(2, 3, 4, 5, 12)
    on_cpu = enc(x)
    on_gpu = enc(x.cuda())
    assert on_gpu.device.type == "cuda"
    assert_close(on_gpu.cpu(), on_cpu, **F32)
    for _ in range(enc._tables.admit_at):  # the doorkeeper stores a key on a later sighting
        enc(x), enc(x.cuda())
    assert len(enc._tables) == 2
    assert {e.tensor.device.type for e in enc._tables._entries.values()} == {"cpu", "cuda"}


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
def test_defect_no_derived_buffer_in_state_dict(kind):
    n, permute = kind
    assert "inv_freq" in "".join(_peer_cls(n, permute)(16).state_dict())  # the package saves it
    enc = OURS[kind](16)
    enc(_input(2, SMALL_SPATIAL[n], 16, permute))
    assert enc.state_dict() == {}
    assert [name for name, _ in enc.named_buffers()] == ["inv_freq"]


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
def test_loads_a_checkpoint_of_the_package(kind):
    n, permute = kind
    model = nn.Sequential(nn.Identity(), OURS[kind](16))
    theirs = nn.Sequential(nn.Identity(), _peer_cls(n, permute)(16))
    result = model.load_state_dict(theirs.state_dict(), strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    summer = Summer(OURS[kind](16))
    summer.load_state_dict(peer.Summer(_peer_cls(n, permute)(16)).state_dict(), strict=True)


def test_half_module_keeps_float32_angles():
    x = torch.zeros(2, 300, 64)
    enc = PositionalEncoding1D(64).half()
    assert enc.inv_freq.dtype == torch.float32  # derived tables are rebuilt in float32 after .half()
    assert_close(enc(x), peer.PositionalEncoding1D(64)(x), **F32)


# -------------------------------------------------------------------------------------- cache
def test_zero_copy_reuses_one_table_without_batch_copies():
    enc = PositionalEncoding2D(16, zero_copy=True)
    calls = []
    build = enc._table
    enc._table = lambda *a: calls.append(a) or build(*a)
    x = torch.zeros(4, 5, 6, 16)
    enc(x)  # a first sighting: built, not stored (see vispos._cache)
    first, second = enc(x), enc(x)
    assert len(calls) == 2
    assert first.data_ptr() == second.data_ptr()
    assert first.stride(0) == 0  # a broadcast view: one table for the whole batch
    assert first.untyped_storage().nbytes() == 5 * 6 * 16 * 4
    assert enc(torch.zeros(7, 5, 6, 16)).data_ptr() == first.data_ptr()  # any batch size
    assert len(calls) == 2


def test_zero_copy_in_place_write_is_refused():
    enc = PositionalEncoding2D(16, zero_copy=True)
    out = enc(torch.zeros(3, 5, 6, 16))
    with pytest.raises(RuntimeError, match="single memory location"):
        out.add_(1)
    assert_close(enc(torch.zeros(3, 5, 6, 16)), peer.PositionalEncoding2D(16)(torch.zeros(3, 5, 6, 16)))


def test_cache_batch_of_one_gets_a_copy():
    enc = PositionalEncodingPermute3D(9)
    x = torch.zeros(1, 9, 2, 3, 4)
    out = enc(x)
    out.mul_(0)
    assert_close(enc(x), peer.PositionalEncodingPermute3D(9)(x), **F32)


def test_zero_copy_write_through_an_item_view_is_detected():
    enc = PositionalEncoding1D(10, zero_copy=True)
    x = torch.zeros(2, 7, 10)
    out = enc(x)
    out[0].fill_(123.0)  # an item of the broadcast view is writable: it aliases the table
    fresh = enc(x)
    assert_close(fresh, peer.PositionalEncoding1D(10)(x), **F32)
    assert fresh.data_ptr() != out.data_ptr()


def test_cache_disabled_and_bounded():
    off = PositionalEncoding1D(8, cache=False)
    off(torch.zeros(2, 5, 8))
    assert len(off._tables) == 0
    on = PositionalEncoding1D(8)
    for length in range(1, 13):
        on(torch.zeros(2, length, 8))
    assert len(on._tables) == 0  # every length seen once: nothing stored (second-sight admission)
    for length in range(1, 13):
        on(torch.zeros(2, length, 8))
    assert len(on._tables) == 8
    on.clear_cache()
    assert len(on._tables) == 0


def test_copies_start_with_an_empty_cache_and_work():
    enc = PositionalEncoding2D(12, dtype_override=torch.float64)
    x = torch.zeros(2, 3, 4, 12)
    expected = enc(x)
    for clone in (copy.deepcopy(enc), pickle.loads(pickle.dumps(enc))):
        assert len(clone._tables) == 0
        assert_close(clone(x), expected, rtol=0, atol=0)
        assert repr(clone) == repr(enc)


def test_input_is_not_modified():
    x = torch.randn(2, 5, 6, 7)
    before = x.clone()
    Summer(PositionalEncoding2D(7))(x)
    PositionalEncoding2D(7)(x)
    assert torch.equal(x, before)


# ------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    "args, exc, match",
    [
        ((0,), ValueError, "channels must be a positive int, got 0"),
        ((-3,), ValueError, "channels must be a positive int, got -3"),
        (("8",), TypeError, r"channels must be a positive int, got '8' \(str\)"),
        ((True,), TypeError, "channels must be a positive int, got True"),
        ((8, torch.int64), TypeError, r"dtype_override must be a floating torch.dtype \(sin/cos values\), got torch.int64"),
        ((8, "float16"), TypeError, r"dtype_override must be a floating torch.dtype such as torch.float16, got 'float16' \(str\)"),
    ],
)
def test_constructor_errors(args, exc, match):
    with pytest.raises(exc, match=match):
        PositionalEncoding2D(*args)


def test_cache_flag_must_be_bool():
    with pytest.raises(TypeError, match="cache must be a bool, got 1"):
        PositionalEncoding1D(8, cache=1)


@pytest.mark.parametrize(
    "enc, x, exc, match",
    [
        (PositionalEncoding2D(8), torch.zeros(2, 3, 8), ValueError,
         r"PositionalEncoding2D expects a 4-D tensor \(B, X, Y, C\), got shape \(2, 3, 8\)"),
        (PositionalEncodingPermute3D(8), torch.zeros(2, 8, 3, 3), ValueError,
         r"expects a 5-D tensor \(B, C, X, Y, Z\)"),
        (PositionalEncoding1D(8), torch.zeros(2, 3, 8, dtype=torch.int64), TypeError,
         r"dtype torch.int64.*Pass dtype_override"),
        (PositionalEncoding1D(8), [[0.0] * 8], TypeError, r"expects a torch.Tensor \(B, L, C\), got list"),
    ],
)
def test_forward_errors(enc, x, exc, match):
    with pytest.raises(exc, match=match):
        enc(x)


# --------------------------------------------------------------------------------------- repr
def test_extra_repr():
    assert repr(PositionalEncoding2D(10)) == "PositionalEncoding2D(channels=10, dtype_override=None)"
    assert (
        repr(PositionalEncodingPermute3D(7, torch.float16, cache=False))
        == "PositionalEncodingPermute3D(channels=7, dtype_override=torch.float16, cache=False)"
    )
    assert repr(FixEncoding(PositionalEncoding1D(4), (5,))) == (
        "FixEncoding(\n  shape=(5,)\n  (pos_encoder): PositionalEncoding1D(channels=4, dtype_override=None)\n)"
    )
    assert repr(Summer(PositionalEncoding1D(4))) == (
        "Summer(\n  (penc): PositionalEncoding1D(channels=4, dtype_override=None)\n)"
    )


def test_package_attributes():
    enc = PositionalEncoding3D(11)
    theirs = peer.PositionalEncoding3D(11)
    assert (enc.org_channels, enc.channels) == (theirs.org_channels, theirs.channels) == (11, 4)
    assert PositionalEncodingPermute2D(9).org_channels == peer.PositionalEncodingPermute2D(9).org_channels


# ------------------------------------------------------------------------------------- Summer
@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
def test_summer_parity(kind):
    n, permute = kind
    x = _input(3, SMALL_SPATIAL[n], 13, permute)
    assert_close(Summer(OURS[kind](13))(x), peer.Summer(_peer_cls(n, permute)(13))(x), **F32)


def test_summer_int_input_with_override_and_grad():
    x = torch.arange(2 * 4 * 6).reshape(2, 4, 6)
    out = Summer(PositionalEncoding1D(6, dtype_override=torch.float32))(x)
    assert out.dtype == torch.float32
    assert_close(out, x + peer.PositionalEncoding1D(6)(x.float()), **F32)
    y = torch.randn(2, 4, 6, requires_grad=True)
    Summer(PositionalEncoding1D(6))(y).sum().backward()
    assert_close(y.grad, torch.ones_like(y))


def test_summer_errors():
    with pytest.raises(TypeError, match="encoding must be an nn.Module, got function"):
        Summer(lambda t: t)

    class Wrong(nn.Module):
        def forward(self, t):
            return t[..., :1]

    with pytest.raises(ValueError, match=r"the encoding has shape \(2, 3, 1\) but the input has shape \(2, 3, 4\)"):
        Summer(Wrong())(torch.zeros(2, 3, 4))


# -------------------------------------------------------------------------------- FixEncoding
@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
def test_fix_encoding_matches_the_encoding(kind):
    n, permute = kind
    spatial = SMALL_SPATIAL[n]
    fixed = FixEncoding(OURS[kind](19), spatial)
    for batch in (1, 4):
        x = _input(batch, spatial, 19, permute, dtype=torch.float16)
        out = fixed(x)
        assert out.dtype == torch.float32  # the package: the table's dtype, not the input's
        assert_close(out, _peer_cls(n, permute)(19)(x.float()), **F32)


def test_fix_encoding_dtype_override_devices_and_safety():
    fixed = FixEncoding(PositionalEncoding2D(8, dtype_override=torch.float64), (3, 4))
    x = torch.zeros(2, 3, 4, 8)
    out = fixed(x)
    assert out.dtype == torch.float64 and out.is_contiguous()  # the caller's own tensor
    out.numpy()[:] = 5.0  # a write the version counter does not see reaches no later result
    assert_close(fixed(x), peer.PositionalEncoding2D(8)(x.double()), rtol=0, atol=0)
    shared = FixEncoding(PositionalEncoding2D(8, dtype_override=torch.float64, zero_copy=True), (3, 4))
    out = shared(x)
    assert out.stride(0) == 0  # zero_copy: the table broadcast over the batch
    with pytest.raises(RuntimeError, match="single memory location"):
        out.add_(1)
    out[1].fill_(5.0)  # an in-place write through an item view: detected, the table is rebuilt
    assert_close(shared(x), peer.PositionalEncoding2D(8)(x.double()), rtol=0, atol=0)
    assert fixed(torch.zeros(2, 3, 4, 8, device="meta")).device.type == "meta"
    assert fixed.state_dict() == {}


@pytest.mark.parametrize(
    "encoding, shape, exc, match",
    [
        (nn.Identity(), (3,), TypeError, "encoding must be a PositionalEncoding.*got Identity"),
        (PositionalEncoding2D(4), (3,), ValueError, r"shape must hold 2 ints, got \(3,\)"),
        (PositionalEncoding2D(4), (3, 0), ValueError, r"shape must hold positive ints, got \(3, 0\)"),
        (PositionalEncoding2D(4), "ab", TypeError, "shape must be a sequence of 2 ints"),
        (PositionalEncoding2D(4), (3.0, 2), TypeError, "shape must hold ints"),
    ],
)
def test_fix_encoding_constructor_errors(encoding, shape, exc, match):
    with pytest.raises(exc, match=match):
        FixEncoding(encoding, shape)


def test_fix_encoding_forward_errors():
    fixed = FixEncoding(PositionalEncodingPermute2D(4), torch.Size([3, 5]))
    with pytest.raises(ValueError, match=r"built for inputs \(B, 4, 3, 5\) \(layout \(B, C, X, Y\)\), got shape \(2, 4, 5, 3\)"):
        fixed(torch.zeros(2, 4, 5, 3))
    with pytest.raises(ValueError, match=r"got shape \(2, 4, 3\)"):
        fixed(torch.zeros(2, 4, 3))
    with pytest.raises(TypeError, match="FixEncoding expects a torch.Tensor"):
        fixed(None)


def test_fix_encoding_follows_settings_assigned_later():
    """Issue 26 item 7: ``enc.org_channels = 12`` after ``FixEncoding(enc, ...)`` was answered
    with the old 8-channel table."""
    enc = PositionalEncoding2D(8)
    fixed = FixEncoding(enc, (4, 5))
    assert fixed(torch.zeros(2, 4, 5, 8)).shape == (2, 4, 5, 8)
    enc.org_channels = 12
    x = torch.zeros(2, 4, 5, 12)
    assert_close(fixed(x), peer.PositionalEncoding2D(12)(x), **F32)
    with pytest.raises(ValueError, match=r"built for inputs \(B, 4, 5, 12\).*got shape \(2, 4, 5, 8\)"):
        fixed(torch.zeros(2, 4, 5, 8))
    enc.dtype_override = torch.float64
    assert fixed(x).dtype == torch.float64
    assert_close(fixed(x), peer.PositionalEncoding2D(12)(x.double()), rtol=0, atol=1e-12)
    fixed.shape = (3, 2)
    y = torch.zeros(1, 3, 2, 12)
    assert_close(fixed(y), peer.PositionalEncoding2D(12)(y.double()), rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "attr, value, exc, match",
    [
        ("dtype_override", torch.int64, TypeError, r"dtype_override must be a floating torch.dtype \(sin/cos values\), got torch.int64"),
        ("dtype_override", "float16", TypeError, r"dtype_override must be a floating torch.dtype such as torch.float16, got 'float16'"),
        ("org_channels", 0, ValueError, "org_channels"),
    ],
)
def test_grid_settings_assigned_later_are_checked(attr, value, exc, match):
    enc = PositionalEncodingPermute2D(6)
    with pytest.raises(exc, match=match):
        setattr(enc, attr, value)
    fixed = FixEncoding(enc, (2, 3))
    with pytest.raises(ValueError, match=r"shape must hold positive ints, got \(2, 0\)"):
        fixed.shape = (2, 0)
    with pytest.raises(TypeError, match="shape must be a sequence of 2 ints"):
        fixed.shape = 4
    assert fixed.shape == (2, 3)
