"""TimmBackbone's levels and refusals: levels in block order with duplicates removed (as timm's
``forward_intermediates`` and the stock ``features_only`` model return them) in every mode, the
reported metadata in that order, refusals that name their real cause."""

import re

import pytest
import timm
import torch

from vispos import NestedTensor, nested_tensor_from_tensor_list
from vispos.backbones import TimmBackbone

VIT = ("vit_tiny_patch16_224", {"img_size": 64, "depth": 3})
EVA = ("vit_small_patch16_rope_224", {"depth": 3, "embed_dim": 32, "num_heads": 2})
SWIN = ("swin_tiny_patch4_window7_224", {"img_size": 64, "depths": (1, 1, 1, 1), "embed_dim": 16,
                                          "num_heads": (1, 1, 1, 1), "window_size": 4})

# out_indices -> the blocks the stock backbone returns, in its order (depth 3 / four stages)
ORDERS = [((2, 0), [0, 2]), ((-1, 0), [0, 2]), ((1, 1), [1]), ((0, 2, 1), [0, 1, 2]), ((-1, -3, 2), [0, 2])]


def _image(side=64, seed=0):
    return torch.randn(3, side, side, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _build(spec, out_indices, **options):
    name, kwargs = spec
    torch.manual_seed(0)
    bb = TimmBackbone(name, out_indices=out_indices, model_kwargs=kwargs, **options)
    with torch.no_grad():  # trained-like layer scales (timm starts them at 1e-5: blocks near identity)
        for key, p in bb.named_parameters():
            if key.endswith(("gamma", "gamma_1", "gamma_2")):
                p.fill_(1.0)
    return bb.double().eval()


def _reference(spec, stock, x, out_indices):
    """timm's own unpruned model with the stock backbone's weights: its forward_intermediates for
    ``out_indices`` as listed."""
    name, kwargs = spec
    model = timm.create_model(name, pretrained=False, dynamic_img_size=True, dynamic_img_pad=True, **kwargs)
    report = model.load_state_dict(stock.body.model.state_dict(), strict=False)
    last = max(i % len(model.blocks) for i in out_indices)  # the stock backbone drops the blocks after it
    assert not report.unexpected_keys
    assert all(k.startswith(("norm.", "head.")) or int(k.split(".")[1]) > last for k in report.missing_keys)
    with torch.no_grad():
        return model.double().eval().forward_intermediates(x, indices=list(out_indices), intermediates_only=True)


@pytest.mark.parametrize("spec", [VIT, EVA], ids=["vit", "eva"])
@pytest.mark.parametrize("out_indices, blocks", ORDERS)
def test_vit_levels_in_block_order_without_duplicates_in_every_mode(spec, out_indices, blocks):
    stock = _build(spec, out_indices)
    x = nested_tensor_from_tensor_list([_image()])
    reference = _reference(spec, stock, x.tensors, out_indices)
    assert len(reference) == len(blocks)  # timm: block order, each block once
    for mode in ("padding_invariant", "packed", "stock"):
        bb = stock if mode == "stock" else _build(spec, out_indices, **{mode: True})
        bb.load_state_dict(stock.state_dict())
        with torch.no_grad():
            levels = bb(x)
        assert len(levels) == len(blocks), mode
        for level, ref in zip(levels, reference):
            torch.testing.assert_close(level.tensors, ref, rtol=1e-10, atol=1e-10, msg=lambda m: f"{mode}: {m}")
        assert bb.out_indices == tuple(blocks), mode
        assert len(bb.num_channels) == len(bb.strides) == len(blocks), mode
        assert list(bb.body.feature_info.out_indices) == blocks, mode


@pytest.mark.parametrize("name, kwargs", [SWIN, ("resnet18", {})], ids=["swin", "resnet18"])
@pytest.mark.parametrize("out_indices", [(2, 0), (-1, 0), (1, 1), (3, 1, 2)])
@pytest.mark.parametrize("padding_invariant", [False, True])
def test_reported_channels_and_strides_are_those_of_the_returned_levels(name, kwargs, out_indices, padding_invariant):
    bb = _build((name, kwargs), out_indices, padding_invariant=padding_invariant)
    blocks = sorted({i % (5 if name == "resnet18" else 4) for i in out_indices})
    with torch.no_grad():
        levels = bb(nested_tensor_from_tensor_list([_image()]))
    assert bb.out_indices == tuple(blocks)
    assert [lv.tensors.shape[1] for lv in levels] == bb.num_channels
    assert [64 // lv.tensors.shape[-1] for lv in levels] == bb.strides
    if not padding_invariant or name != "resnet18":  # a traced CNN's body is its graph, without feature_info
        assert bb.body.feature_info.channels() == bb.num_channels
        assert bb.body.feature_info.reduction() == bb.strides


def test_invariant_levels_in_block_order_on_a_padded_batch():
    images = [_image(64, 0), _image(48, 1)]
    bb = _build(VIT, (2, 0), padding_invariant=True)
    ordered = _build(VIT, (0, 2), padding_invariant=True)
    ordered.load_state_dict(bb.state_dict())
    with torch.no_grad():
        got, want = bb(nested_tensor_from_tensor_list(images)), ordered(nested_tensor_from_tensor_list(images))
        alone = ordered(NestedTensor(images[1][None], None))
    for level, ref, one in zip(got, want, alone):
        torch.testing.assert_close(level.tensors, ref.tensors, rtol=0, atol=0)
        torch.testing.assert_close(level.tensors[1, :, :3, :3], one.tensors[0], rtol=1e-10, atol=1e-10)


# ----------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("name, kwargs, cls", [
    ("beit_base_patch16_224", {"depth": 1, "embed_dim": 32, "num_heads": 2}, "Beit"),
    ("vit_relpos_small_patch16_224", {"depth": 1, "embed_dim": 32, "num_heads": 2}, "VisionTransformerRelPos"),
    ("mvitv2_tiny", {}, "MultiScaleVit"),  # its depths come from a config object; builds in < 1 s
    ("cait_xxs24_224", {"depth": 1, "embed_dim": 32, "num_heads": 2}, "Cait"),
    ("xcit_nano_12_p16_224", {"depth": 1}, "Xcit"),
    ("convit_tiny", {"depth": 1}, "ConVit"),
    ("crossvit_tiny_240", {}, "CrossVit"),
])
def test_token_models_without_a_rule_are_refused_by_class(name, kwargs, cls):
    with pytest.raises(ValueError, match=rf"no padding-invariance rule covers {cls} \({name!r}, .*rules for .*VisionTransformer"):
        TimmBackbone(name, padding_invariant=True, model_kwargs=kwargs)


@pytest.mark.parametrize("kwargs, exc, match", [
    ({"embed_dim": 33, "num_heads": 2}, ValueError,
     r"timm.create_model\('vit_tiny_patch16_224', .*\) failed: AssertionError: dim should be divisible by num_heads"),
    ({"not_a_timm_option": 1}, TypeError, "unexpected keyword argument 'not_a_timm_option'"),
])
def test_a_bad_model_kwarg_raises_timm_own_error(kwargs, exc, match):
    with pytest.raises(exc, match=match) as info:
        TimmBackbone("vit_tiny_patch16_224", model_kwargs={"depth": 1, **kwargs})
    assert "are not available" not in str(info.value)


@pytest.mark.parametrize("name, kwargs, out_indices", [
    ("resnet18", {}, (7,)), ("resnet18", {}, (-9,)), ("vit_tiny_patch16_224", {"depth": 2}, (2,)),
    ("vit_tiny_patch16_224", {"depth": 2}, (-3,)), SWIN + ((4,),),
])
def test_an_index_beyond_the_model_still_names_out_indices(name, kwargs, out_indices):
    with pytest.raises(ValueError, match=re.escape(f"out_indices {tuple(out_indices)} are not available for {name!r}")):
        TimmBackbone(name, out_indices=out_indices, model_kwargs=kwargs)


def test_swin_strict_img_size_is_accepted_dynamic_img_size_wins():
    """timm's ``dynamic_img_size=True`` (TimmBackbone's default for Swin) overrides ``strict_img_size``."""
    name, kwargs = SWIN
    bb = _build((name, {**kwargs, "strict_img_size": True}), (-1,), padding_invariant=True)
    images = [_image(64, 0), _image(40, 1)]
    with torch.no_grad():
        (level,) = bb(nested_tensor_from_tensor_list(images))
        (alone,) = bb(NestedTensor(images[1][None], None))
    h, w = alone.tensors.shape[-2:]
    torch.testing.assert_close(level.tensors[1, :, :h, :w], alone.tensors[0], rtol=1e-10, atol=1e-10)
    with pytest.raises(ValueError, match="strict_img_size=True"):
        _build((name, {**kwargs, "strict_img_size": True, "dynamic_img_size": False}), (-1,), padding_invariant=True)


@pytest.mark.parametrize("mode", ["stock", "padding_invariant", "packed"])
def test_hooks_on_the_vit_containers_never_fire_in_any_mode(mode):
    """timm's features_only ViT calls ``forward_intermediates`` (not the model's ``forward``) and
    iterates ``blocks`` (never calls the Sequential): hooks there fire in no mode, stock included."""
    bb = _build(VIT, (1,), **({} if mode == "stock" else {mode: True}))
    calls = []
    for module in (bb.body.model, bb.body.model.blocks):
        module.register_forward_hook(lambda *args: calls.append(1))
        module.register_forward_pre_hook(lambda *args: calls.append(1))
    with torch.no_grad():
        bb(nested_tensor_from_tensor_list([_image(), _image(48, 1)]))
    assert calls == []
