"""Hooks on a backbone's modules run, or the forward is refused naming the module.

A traced graph (``padding_invariant=True``; torchvision's feature extraction) calls leaf layers as
modules but runs containers and rewritten layers (batch norm over valid cells) inline, and the
token-model rules (SAM's windowed ViT, Swin, packed mode) run some blocks' code themselves: a
hook on such a module would silently not run. Each case below was accepted and gave the
unhooked numbers before the check.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import vispos
from vispos.backbones import Joiner, TimmBackbone, TorchvisionBackbone

pytest.importorskip("timm")


def _scale(module, inputs, output):
    return output * 1.5 if torch.is_tensor(output) else None


def _randomise_norms(model: nn.Module) -> nn.Module:
    """Batch norm scales off 1 and layer scales on, so every block changes the features (timm
    zero-inits the last norm of a residual branch)."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.copy_(torch.rand(m.weight.shape, generator=gen, dtype=m.weight.dtype) + 0.5)
    return model


def _cnn(kind: str, padding_invariant: bool) -> nn.Module:
    torch.manual_seed(0)
    if kind == "timm":
        bb = TimmBackbone("resnet18", pretrained=False, out_indices=(2,), padding_invariant=padding_invariant)
    else:
        bb = TorchvisionBackbone("resnet18", padding_invariant=padding_invariant)
    return _randomise_norms(bb.double())


def _batch():
    gen = torch.Generator().manual_seed(0)
    images = [torch.randn(3, 64, 48, generator=gen, dtype=torch.float64),
              torch.randn(3, 40, 64, generator=gen, dtype=torch.float64)]
    return vispos.nested_tensor_from_tensor_list(images)


def _last(bb, x):
    return bb(x)[-1].tensors


@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("kind, padding_invariant, inline", [
    ("timm", True, ["body.layer1", "body.layer1.0", "body.layer1.0.bn1", "body.bn1"]),
    ("tv", True, ["body.layer1", "body.layer1.0", "body.layer1.0.bn1", "body.bn1"]),
    ("tv", False, ["body.layer1", "body.layer1.0"]),   # torchvision's feature extraction
])
def test_a_hook_the_traced_graph_would_skip_is_refused_by_name(kind, padding_invariant, inline, training):
    bb = _cnn(kind, padding_invariant).train(training)
    x = _batch()
    for name in inline:
        for register in ("register_forward_hook", "register_forward_pre_hook", "register_full_backward_hook"):
            module = bb.get_submodule(name)
            fn = {"register_forward_hook": _scale,
                  "register_forward_pre_hook": lambda m, i: None,
                  "register_full_backward_hook": lambda m, gi, go: None}[register]
            handle = getattr(module, register)(fn)
            with pytest.raises(ValueError, match=rf"does not call {name.removeprefix('body.')} \("):
                bb(x)
            handle.remove()
    bb(x)  # the hooks removed: it runs again


@pytest.mark.parametrize("kind, padding_invariant", [("timm", True), ("tv", True), ("tv", False), ("timm", False)])
def test_hooks_on_the_layers_the_graph_calls_run_as_in_the_model(kind, padding_invariant):
    stock = _cnn(kind, False).eval()
    bb = _cnn(kind, padding_invariant).eval()
    bb.load_state_dict(stock.state_dict())
    x = vispos.nested_tensor_from_tensor_list([_batch().tensors[0]])  # one item, no padding: stock's numbers
    calls = []
    for name in ("body.conv1", "body.layer1.0.conv1", "body.maxpool"):
        handles = [m.get_submodule(name).register_forward_hook(_scale) for m in (stock, bb)]
        handles.append(bb.get_submodule(name).register_forward_pre_hook(lambda m, i: calls.append(1)))
        torch.testing.assert_close(_last(bb, x), _last(stock, x), rtol=1e-12, atol=1e-12)
        for h in handles:
            h.remove()
    assert len(calls) == 3
    handle = bb.register_forward_hook(lambda m, i, o: calls.append(2))  # the backbone itself
    bb(x)
    handle.remove()
    assert calls[-1] == 2


@pytest.mark.parametrize("register, hook", [("register_forward_hook", lambda m, i, o: o + 1.0),
                                            ("register_forward_pre_hook", lambda m, i: (i[0] + 1.0,))])
def test_a_forward_hook_on_a_called_layer_is_refused_on_a_padded_batch(register, hook):
    """The fill is written before the layer that reads it: a hook adding 1 left ones in the padding
    of the map the next convolution reads (silently wrong); without padding it runs as the model."""
    bb = _cnn("tv", True).eval()
    handle = getattr(bb.get_submodule("body.layer1.0.conv1"), register)(hook)
    with pytest.raises(ValueError, match=r"forward hooks on layer1\.0\.conv1 \(Conv2d\) run on the padded maps.*hook "
                                         r"the backbone's output levels"):
        bb(_batch())
    bb(vispos.nested_tensor_from_tensor_list([_batch().tensors[0]]))  # no padding: the model's numbers
    handle.remove()
    global_handle = torch.nn.modules.module.register_module_forward_hook(lambda m, i, o: None)
    try:
        with pytest.raises(ValueError, match=r"forward hooks on torch's global module hooks"):
            bb(_batch())
    finally:
        global_handle.remove()
    bb(_batch())


def test_a_hook_registered_after_a_copy_or_a_mode_switch_is_checked():
    import copy

    bb = _cnn("timm", True).eval()
    x = _batch()
    bb(x)
    twin = copy.deepcopy(bb).train()
    twin.get_submodule("body.layer2.0.bn2").register_forward_hook(_scale)
    with pytest.raises(ValueError, match=r"layer2\.0\.bn2 \(BatchNorm2d\)"):
        twin(x)
    bb(x)  # the original is untouched


def test_the_joiner_projections_refuse_a_hook_they_would_skip():
    torch.manual_seed(0)
    bb = TimmBackbone("resnet18", pretrained=False, out_indices=(3, 4), padding_invariant=True)
    joiner = Joiner(bb, vispos.PositionEmbeddingSine(32, normalize=True), hidden_dim=64,
                    num_feature_levels=3, padding_invariant=True).eval()
    x = vispos.nested_tensor_from_tensor_list([torch.randn(3, 64, 64), torch.randn(3, 48, 80)])
    ref = joiner(x)[0][0].tensors
    for name in ("input_proj.0", "input_proj.0.1", "input_proj.2"):
        handle = joiner.get_submodule(name).register_forward_hook(_scale)
        with pytest.raises(ValueError, match=rf"calls no {name} \("):
            joiner(x)
        handle.remove()
    handle = joiner.get_submodule("input_proj.0.0").register_forward_hook(_scale)  # a convolution it calls
    assert not torch.allclose(joiner(x)[0][0].tensors, ref)
    handle.remove()


def test_the_monai_decoder_refuses_a_hook_it_would_skip():
    pytest.importorskip("monai")
    from vispos.monai import AnySizeUNETR

    torch.manual_seed(0)
    model = AnySizeUNETR(in_channels=1, out_channels=2, img_size=(32, 32, 32), feature_size=8, hidden_size=48,
                         mlp_dim=96, num_heads=4).eval()
    x = vispos.nested_tensor_from_tensor_list([torch.randn(1, 32, 32, 32), torch.randn(1, 16, 32, 16)])
    model(x)
    for name in ("decoder5", "decoder2.conv_block", "out"):
        handle = model.get_submodule(name).register_forward_hook(_scale)
        with pytest.raises(ValueError, match=rf"calls no {name} \("):
            model(x)
        handle.remove()
    model(x)


# ----------------------------------------------------------------------------- token models
TOKEN_MODELS = {
    "vit": ("vit_tiny_patch16_224", {"img_size": 64, "depth": 2}),
    "samvit": ("samvit_base_patch16", {"img_size": 64, "depth": 2, "embed_dim": 96, "num_heads": 2,
                                        "window_size": 2, "global_attn_indexes": (1,)}),
    "swin": ("swin_tiny_patch4_window7_224", {"img_size": 56, "depths": (1, 1, 1, 1)}),
}


def _token_backbone(key, mode):
    name, kwargs = TOKEN_MODELS[key]
    torch.manual_seed(0)
    options = {mode: True} if mode != "stock" else {}
    return TimmBackbone(name, pretrained=False, out_indices=(-1,), model_kwargs=kwargs, **options).double().eval()


def _item(key):
    side = 56 if key == "swin" else 64
    return torch.randn(3, side, side, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


@pytest.mark.parametrize("key, mode, inline, runs", [
    ("vit", "padding_invariant", [], ["model.patch_drop", "model.blocks.0", "model.blocks.0.attn"]),
    ("vit", "packed", ["model.blocks.0", "model.blocks.1.drop_path1", "model.blocks.1.drop_path2"],
     ["model.patch_drop", "model.blocks.0.attn", "model.blocks.1.mlp"]),
    ("samvit", "padding_invariant", ["model.patch_embed", "model.blocks.0", "model.blocks.1.attn"],
     ["model.blocks.0.attn.qkv", "model.blocks.1.mlp", "model.patch_embed.proj"]),
    ("swin", "padding_invariant", ["model.layers.0", "model.layers.1.blocks", "model.layers.2.blocks.0"],
     ["model.layers.0.downsample", "model.layers.1.downsample", "model.layers.2.blocks.0.mlp"]),
])
def test_token_models_run_the_hooks_the_model_runs_or_refuse_them(key, mode, inline, runs):
    stock, bb = _token_backbone(key, "stock"), _token_backbone(key, mode)
    bb.load_state_dict(stock.state_dict())
    item = _item(key)
    x = vispos.nested_tensor_from_tensor_list([item])
    given = [item] if mode == "packed" else x
    for name in inline:
        handle = bb.get_submodule(f"body.{name}").register_forward_hook(_scale)
        with pytest.raises(ValueError, match=rf"runs the code of {name.removeprefix('model.')} \("):
            bb(given)
        handle.remove()
    for name in runs:  # the item alone, no padding: stock's numbers with the hook too
        handles = [m.get_submodule(f"body.{name}").register_forward_hook(_scale) for m in (stock, bb)]
        hooked = _last(stock, x)
        torch.testing.assert_close(_last(bb, given), hooked, rtol=1e-10, atol=1e-10)
        for h in handles:
            h.remove()
        assert not torch.allclose(_last(stock, x), hooked), name  # the hook mattered


def test_swin_applies_its_final_norm_only_where_the_model_does():
    stock, bb = _token_backbone("swin", "stock"), _token_backbone("swin", "padding_invariant")
    bb.load_state_dict(stock.state_dict())
    x = vispos.nested_tensor_from_tensor_list([_item("swin")])
    handles = [m.get_submodule("body.model.norm").register_forward_hook(_scale) for m in (stock, bb)]
    torch.testing.assert_close(_last(bb, x), _last(stock, x), rtol=1e-10, atol=1e-10)
    for h in handles:
        h.remove()


def test_monai_anysize_vit_runs_block_hooks_and_refuses_the_patch_embedding_hook():
    pytest.importorskip("monai")
    from monai.networks.nets import ViT

    from vispos.monai import AnySizeViT

    torch.manual_seed(0)
    kwargs = dict(in_channels=1, img_size=(32, 32, 32), patch_size=(8, 8, 8), hidden_size=48, mlp_dim=96,
                  num_layers=2, num_heads=4)
    stock, model = ViT(**kwargs).double().eval(), AnySizeViT(**kwargs).double().eval()
    model.load_state_dict(stock.state_dict())
    x = torch.randn(1, 1, 32, 32, 32, dtype=torch.float64)
    handle = model.patch_embedding.register_forward_hook(_scale)
    with pytest.raises(ValueError, match=r"runs the code of patch_embedding \(PatchEmbeddingBlock\)"):
        model(x)
    handle.remove()
    for name in ("patch_embedding.patch_embeddings", "blocks.0", "blocks.1.attn"):
        handles = [m.get_submodule(name).register_forward_hook(_scale) for m in (stock, model)]
        torch.testing.assert_close(model(x)[0], stock(x)[0], rtol=1e-12, atol=1e-12)
        for h in handles:
            h.remove()


def test_the_simple_feature_pyramid_refuses_a_hook_it_would_skip():
    from vispos.backbones import SimpleFeaturePyramid

    torch.manual_seed(0)
    pyramid = SimpleFeaturePyramid(32, 16, padding_invariant=True).eval()
    x = vispos.nested_tensor_from_tensor_list([torch.randn(32, 8, 6), torch.randn(32, 5, 8)])
    ref = [level.tensors for level in pyramid(x)]
    for name in ("stages.0", "stages.1.1", "stages.3.2"):
        handle = pyramid.get_submodule(name).register_forward_hook(_scale)
        with pytest.raises(ValueError, match=rf"calls no {name} \("):
            pyramid(x)
        handle.remove()
    convs = [n for n, m in pyramid.stages.named_modules() if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d))]
    handle = pyramid.get_submodule(f"stages.{convs[0]}").register_forward_hook(_scale)
    assert not torch.allclose(pyramid(x)[0].tensors, ref[0])
    handle.remove()
