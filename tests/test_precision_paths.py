"""Angles in float32 on every path, for every public encoder: autocast x grad x compile.

DESIGN.md, "Precision": angles are computed in float32 whatever the input dtype, so under
``torch.autocast`` (bfloat16 or float16), with or without autograd, eager or compiled, every
encoder gives its float32 result (float32 outputs), or that result rounded once (when asked for
half outputs). A matrix product is the only op autocast runs in half precision; random Fourier
features project with one (``coords @ G``), so those are the cases that fail without the
guard, by up to ~0.1 (bfloat16).

``CASES`` holds one call per public encoder (``_ENCODERS`` lists the public names each case
covers; a test checks that together they cover :data:`vispos.__all__`'s encoders). Each case
is run four ways against its float32 eager reference: eager, and ``torch.compile(fullgraph=True)``
(``aot_eager``: the traced forward and backward graphs, no C++ build), each without and with
grad, without autocast and under bfloat16 and float16 autocast. The full compiled product is
``slow`` and ``exhaustive`` (not in the default run: ``pytest -m exhaustive``); the fast subset
compiles the cases that hold a matrix product.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

import vispos

HALF = [torch.bfloat16, torch.float16]
_EAGER_ATOL = 0.0  # eager: the same kernels, so the same bits
_COMPILED_ATOL = 1e-5  # compiled graphs may fuse differently: angles up to ~50 rad, ulp 4e-6


def _g(seed=0):
    return torch.Generator().manual_seed(seed)


def _mask(*shape, seed=0):
    mask = torch.rand(*shape, generator=_g(seed)) > 0.7
    mask[:, (0,) * (len(shape) - 1)] = False  # every item has a valid cell
    return mask


def _hooked(module, layer):
    """``fn(x)`` runs ``module`` and returns what reached ``layer`` (the sine table an MLP reads:
    the guarantee covers the sines; the MLP itself follows autocast like any ``nn.Linear``)."""
    store = {}
    layer.register_forward_pre_hook(lambda mod, args: store.__setitem__("x", args[0]))

    def fn(x):
        module(x)
        return store["x"]

    return fn


# name -> builder(grad) -> (fn, args). With grad, float inputs and parameters require grad.
def _sine(grad):
    pe = vispos.PositionEmbeddingSine(8, normalize=True, offset=-0.5)
    return pe, (torch.randn(2, 3, 5, 6, requires_grad=grad),) if grad else (_mask(2, 5, 6),)


def _learned(grad):
    torch.manual_seed(0)
    return vispos.PositionEmbeddingLearned(8, 10).requires_grad_(grad), (torch.randn(2, 3, 5, 6),)


def _depth_added(grad):
    return vispos.PositionEmbeddingSineDepthAdded(8, normalize=True), (_mask(2, 3, 4, 5),)


def _dino(grad):
    return vispos.dino_sine(8), (_mask(2, 5, 6),)


def _random(normalize):
    def build(grad):
        torch.manual_seed(0)
        pe = vispos.PositionEmbeddingRandom(8, 2.0, normalize=normalize, trainable=grad)
        return pe, (_mask(2, 5, 6),)

    return build


def _random_grid(grad):
    torch.manual_seed(0)
    pe = vispos.PositionEmbeddingRandom(8, 2.0, trainable=grad)
    return (lambda: pe((5, 6))), ()


def _random_points(grad):
    torch.manual_seed(0)
    pe = vispos.PositionEmbeddingRandom(16, 4.0)
    points = (torch.rand(2, 7, 2, generator=_g()) * 1024).requires_grad_(grad)
    return (lambda c: pe.forward_with_coords(c, (1024, 1024))), (points,)


def _sam(grad):
    torch.manual_seed(0)
    pe = vispos.SamPositionalEmbedding(16, 4.0).requires_grad_(grad)
    return pe, (torch.rand(1, 2, 7, 2, generator=_g(), requires_grad=grad),)


def _grid(cls, n):
    def build(grad):
        enc = cls(8)
        permute = "Permute" in cls.__name__
        shape = (2, 8, *range(3, 3 + n)) if permute else (2, *range(3, 3 + n), 8)
        return enc, (torch.randn(*shape, requires_grad=grad),)

    return build


def _summer(grad):
    return vispos.Summer(vispos.PositionalEncoding2D(8)), (torch.randn(2, 4, 5, 8, requires_grad=grad),)


def _fix(grad):
    return vispos.FixEncoding(vispos.PositionalEncoding2D(8), (4, 5)), (torch.randn(2, 4, 5, 8, requires_grad=grad),)


def _resample(grad):
    posemb = torch.randn(1, 1 + 16, 8, generator=_g(), requires_grad=grad)
    return (lambda p: vispos.resample_abs_pos_embed(p, (6, 5), (4, 4))), (posemb,)


def _sequence(grad):
    return vispos.SinusoidalPositionalEncoding(8), (torch.randn(2, 9, 8, requires_grad=grad),)


def _learnable_sequence(grad):
    torch.manual_seed(0)
    m = vispos.LearnableSinusoidalPositionalEncoding(8).requires_grad_(grad)
    return _hooked(m, m.ffn[0]), (torch.randn(2, 9, 8, requires_grad=grad),)


def _speechain(grad):
    return vispos.SpeechainPositionalEncoding("sep", d_model=8), (torch.randn(2, 9, 8, requires_grad=grad),)


def _coords(grad):
    boxes = torch.rand(3, 5, 4, generator=_g(), requires_grad=grad)
    return (lambda c: vispos.sine_embed_coords(c, 16)), (boxes,)


def _coord_mlp(grad):
    torch.manual_seed(0)
    m = vispos.CoordSineEmbedding(4, 32).requires_grad_(grad)
    return _hooked(m, m.layers[0]), (torch.rand(3, 5, 4, generator=_g(), requires_grad=grad),)


def _rotary(grad):
    rope = vispos.RotaryEmbedding(8)
    positions = (torch.rand(9, generator=_g()) * 500).requires_grad_(grad)
    return (lambda x, p: rope(x, positions=p)), (torch.randn(2, 9, 8, requires_grad=grad), positions)


def _axial(grad):
    rope = vispos.AxialRotaryEmbedding(8, 2)
    return (lambda x: rope(x, spatial=(4, 5))), (torch.randn(2, 20, 8, requires_grad=grad),)


def _apply_rotary(grad):
    angles = torch.rand(9, 4, generator=_g()) * 100
    sin, cos = angles.sin(), angles.cos()
    q, k = torch.randn(2, 9, 8, requires_grad=grad), torch.randn(2, 9, 8, requires_grad=grad)
    return (lambda q, k: vispos.apply_rotary_sincos(q, k, sin, cos)), (q, k)


def _dinov3(grad):
    rope = vispos.DinoV3RotaryEmbedding(32, feat_shape=[4, 5])
    return (lambda: rope.get_embed([4, 5])), ()


def _mixed(grad):
    torch.manual_seed(0)
    rope = vispos.MixedRotaryEmbedding(32, 2, 2, feat_shape=[4, 5]).requires_grad_(grad)
    return (lambda: rope.get_embed()), ()


def _rot_cat(grad):
    emb = vispos.DinoV3RotaryEmbedding(32, feat_shape=[4, 5]).get_embed([4, 5])
    return (lambda x: vispos.apply_rot_embed_cat(x, emb)), (torch.randn(2, 20, 32, requires_grad=grad),)


def _table(fn, *args, **kwargs):
    return lambda grad: ((lambda: fn(*args, **kwargs)), ())


def _rtdetr_padded(grad):
    return (lambda m: vispos.rtdetr_sincos_2d(5, 6, 16, padding=m)), (_mask(2, 5, 6),)


CASES = {
    "sine": _sine,
    "learned": _learned,
    "depth_added": _depth_added,
    "dino_sine": _dino,
    "random_canvas": _random("canvas"),
    "random_item": _random("item"),
    "random_grid": _random_grid,
    "random_points": _random_points,
    "sam": _sam,
    "pe1d": _grid(vispos.PositionalEncoding1D, 1),
    "pe2d": _grid(vispos.PositionalEncoding2D, 2),
    "pe3d": _grid(vispos.PositionalEncoding3D, 3),
    "permute1d": _grid(vispos.PositionalEncodingPermute1D, 1),
    "permute2d": _grid(vispos.PositionalEncodingPermute2D, 2),
    "permute3d": _grid(vispos.PositionalEncodingPermute3D, 3),
    "summer": _summer,
    "fix": _fix,
    "resample": _resample,
    "sequence": _sequence,
    "learnable_sequence": _learnable_sequence,
    "speechain": _speechain,
    "coords": _coords,
    "coord_mlp": _coord_mlp,
    "rotary": _rotary,
    "axial": _axial,
    "apply_rotary": _apply_rotary,
    "dinov3": _dinov3,
    "mixed": _mixed,
    "rot_cat": _rot_cat,
    "timm": _table(vispos.timm_sincos_2d, (5, 6), 16),
    "mae": _table(vispos.mae_sincos_2d, 16, (5, 6), True),
    "monai_sincos": _table(vispos.monai_sincos, (3, 4, 5), 24),
    "monai_fourier": _table(vispos.monai_fourier, (3, 4, 5), 24, scales=(1.0, 2.0, 4.0)),  # global RNG
    "rtdetr": _table(vispos.rtdetr_sincos_2d, 5, 6, 16),
    "rtdetr_padded": _rtdetr_padded,
}

#: the public names each case covers
_ENCODERS = {
    "PositionEmbeddingSine": "sine", "PositionEmbeddingLearned": "learned",
    "PositionEmbeddingSineDepthAdded": "depth_added", "dino_sine": "dino_sine",
    "PositionEmbeddingRandom": "random_canvas", "SamPositionalEmbedding": "sam",
    "PositionalEncoding1D": "pe1d", "PositionalEncoding2D": "pe2d", "PositionalEncoding3D": "pe3d",
    "PositionalEncodingPermute1D": "permute1d", "PositionalEncodingPermute2D": "permute2d",
    "PositionalEncodingPermute3D": "permute3d", "Summer": "summer", "FixEncoding": "fix",
    "resample_abs_pos_embed": "resample", "SinusoidalPositionalEncoding": "sequence",
    "LearnableSinusoidalPositionalEncoding": "learnable_sequence", "SpeechainPositionalEncoding": "speechain",
    "sine_embed_coords": "coords", "CoordSineEmbedding": "coord_mlp", "RotaryEmbedding": "rotary",
    "AxialRotaryEmbedding": "axial", "apply_rotary_sincos": "apply_rotary", "DinoV3RotaryEmbedding": "dinov3",
    "MixedRotaryEmbedding": "mixed", "apply_rot_embed_cat": "rot_cat", "timm_sincos_2d": "timm",
    "mae_sincos_2d": "mae", "monai_sincos": "monai_sincos", "monai_fourier": "monai_fourier",
    "rtdetr_sincos_2d": "rtdetr",
}
#: public names that are not encoders (containers, batching, helpers, registries)
_NOT_ENCODERS = {
    "__version__", "CacheInfo", "caching", "is_caching_enabled", "set_caching", "Padding", "NestedTensor",
    "nested_tensor_from_tensor_list", "interpolate_mask", "collate_fn", "PaddedCollate",
    "attn_mask_from_padding", "build_from_config", "register",
    "register_invariance_rule", "CellWise", "PaddingAware", "Refuse", "RuleBook",  # the invariance rule book
    "make_padding_invariant",  # a network made padding-invariant (tests/test_make_padding_invariant.py)
    "init_mixed_freqs",  # a random initialiser of MixedRotaryEmbedding's parameter (covered by "mixed")
}
#: the cases with a matrix product (the ones autocast changes): compiled in the fast subset
_MATMUL = ["random_canvas", "random_grid", "random_points", "sam", "monai_fourier"]


def test_cases_cover_every_public_encoder():
    assert set(_ENCODERS) | _NOT_ENCODERS == set(vispos.__all__), set(vispos.__all__) ^ (set(_ENCODERS) | _NOT_ENCODERS)
    assert set(_ENCODERS.values()) <= set(CASES)


def _detached(args):
    return tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)


def _flat(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _check(case, autocast, grad, compiled):
    fn, args = CASES[case](grad)
    torch.manual_seed(0)  # monai_fourier draws from the global RNG (a generator cannot be compiled)
    with torch.no_grad():
        ref = _flat(fn(*_detached(args)))
    if compiled:
        torch._dynamo.reset()
        fn = torch.compile(fn, fullgraph=True, backend="aot_eager")
    amp = torch.autocast("cpu", dtype=autocast) if autocast is not None else contextlib.nullcontext()
    torch.manual_seed(0)
    with (torch.enable_grad() if grad else torch.no_grad()), amp:
        out = _flat(fn(*args))
    assert len(out) == len(ref)
    for o, r in zip(out, ref):
        assert o.dtype == r.dtype, (o.dtype, r.dtype)
        torch.testing.assert_close(o.detach(), r, rtol=0, atol=_COMPILED_ATOL if compiled else _EAGER_ATOL)
    if grad and any(o.requires_grad for o in out):  # the graph reaches its leaves
        sum(o.float().sum() for o in out if o.requires_grad).backward()


@pytest.mark.parametrize("autocast", [None, *HALF], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("grad", [False, True], ids=["nograd", "grad"])
@pytest.mark.parametrize("case", list(CASES))
def test_eager_autocast_equals_float32(case, grad, autocast):
    _check(case, autocast, grad, compiled=False)


@pytest.mark.parametrize("case", _MATMUL)
def test_compiled_autocast_grad_equals_float32(case):
    """The fast subset: the cases with a matrix product, compiled, under bfloat16 autocast with grad."""
    _check(case, torch.bfloat16, True, compiled=True)


@pytest.mark.slow
@pytest.mark.exhaustive
@pytest.mark.parametrize("autocast", [None, *HALF], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("grad", [False, True], ids=["nograd", "grad"])
@pytest.mark.parametrize("case", list(CASES))
def test_compiled_autocast_equals_float32(case, grad, autocast):
    _check(case, autocast, grad, compiled=True)


def _half_calls():
    """Calls that take an output ``dtype``, with inputs that need grad where they can."""
    torch.manual_seed(0)
    rand = vispos.PositionEmbeddingRandom(16, 4.0, trainable=True)
    points = (torch.rand(2, 7, 2, generator=_g()) * 1024).requires_grad_()
    mask = _mask(2, 5, 6)
    sine = vispos.PositionEmbeddingSine(8, normalize=True)
    return {
        "random_canvas": lambda d: rand(mask, dtype=d),
        "random_grid": lambda d: rand((5, 6), dtype=d),
        "random_points": lambda d: rand.forward_with_coords(points, (1024, 1024), dtype=d),
        "sine": lambda d: sine(mask, dtype=d),
        "rtdetr": lambda d: vispos.rtdetr_sincos_2d(5, 6, 16, padding=mask, dtype=d),
        "monai_fourier": lambda d: vispos.monai_fourier((3, 4, 5), 24, generator=_g(), dtype=d),
    }


@pytest.mark.parametrize("case", ["random_canvas", "random_grid", "random_points", "sine", "rtdetr", "monai_fourier"])
@pytest.mark.parametrize("dtype", HALF)
def test_half_output_under_autocast_is_float32_rounded_once(case, dtype):
    """Asked for a half output under autocast, with grad: the float32 result rounded once."""
    call = _half_calls()[case]
    with torch.no_grad():
        ref = call(torch.float32)
    with torch.autocast("cpu", dtype=dtype):
        out = call(dtype)
    assert out.dtype == dtype
    torch.testing.assert_close(out.detach(), ref.to(dtype), rtol=0, atol=0)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("autocast", HALF, ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", ["random_canvas", "random_item", "sam", "sine", "learned", "rtdetr_padded"])
def test_cuda_autocast_grad_equals_float32(case, autocast):
    fn, args = CASES[case](True)
    if isinstance(fn, torch.nn.Module):
        fn = fn.cuda()
    args = tuple(a.detach().cuda().requires_grad_(a.requires_grad) for a in args)
    with torch.no_grad():
        ref = fn(*_detached(args))
    with torch.enable_grad(), torch.autocast("cuda", dtype=autocast):
        out = fn(*args)
    # cuBLAS may pick another kernel for the strided ``out=`` of the no-grad reference
    torch.testing.assert_close(out.detach(), ref, rtol=0, atol=_COMPILED_ATOL)
