import copy

import pytest
import torch
import torchvision
from torchvision.ops import FrozenBatchNorm2d
from trained_norms import trained_like

from vispos import NestedTensor, Padding, interpolate_mask, nested_tensor_from_tensor_list
from vispos.backbones import TimmBackbone, TorchvisionBackbone


def _batch(c=3):
    torch.manual_seed(1)
    return nested_tensor_from_tensor_list([torch.randn(c, 64, 96), torch.randn(c, 80, 48)])


def _check_reports_match_outputs(bb, batch):
    """The adapter's claimed channels and strides against the shapes it really produces."""
    with torch.no_grad():
        levels = bb(batch)
    assert len(levels) == len(bb.num_channels) == len(bb.strides)
    padded = batch.tensors.shape[2:]
    for level, c, s in zip(levels, bb.num_channels, bb.strides):
        per_axis = s if isinstance(s, tuple) else (s,) * len(padded)
        assert isinstance(level, NestedTensor)
        assert level.tensors.shape[1] == c
        assert tuple(level.tensors.shape[2:]) == tuple(-(-p // st) for p, st in zip(padded, per_axis))
        assert torch.equal(level.mask, interpolate_mask(batch.mask, tuple(level.tensors.shape[2:])))


@pytest.mark.parametrize(
    "kwargs, channels, strides",
    [
        (dict(), [512], [32]),
        (dict(return_interm_layers=True), [64, 128, 256, 512], [4, 8, 16, 32]),
        (dict(return_nodes=["layer2", "layer3", "layer4"]), [128, 256, 512], [8, 16, 32]),
        (dict(return_nodes={"layer3": "c4", "layer4": "c5"}), [256, 512], [16, 32]),
    ],
)
def test_measured_channels_and_strides(kwargs, channels, strides):
    bb = TorchvisionBackbone("resnet18", **kwargs).eval()
    assert bb.num_channels == channels and bb.strides == strides
    _check_reports_match_outputs(bb, _batch())


def test_both_adapters_report_what_they_output():
    batch = _batch()
    for bb in (TimmBackbone("resnet18", out_indices=(1, 2, 3, 4)).eval(),
               TorchvisionBackbone("resnet18", return_interm_layers=True).eval()):
        _check_reports_match_outputs(bb, batch)


def test_dc5_resnet50_stride_16():
    bb = TorchvisionBackbone("resnet50", return_nodes=["layer3", "layer4"], dilation=True).eval()
    assert bb.num_channels == [1024, 2048] and bb.strides == [16, 16]
    _check_reports_match_outputs(bb, _batch())


def test_same_features_as_torchvision_model():
    torch.manual_seed(0)
    model = torchvision.models.resnet18().eval()
    before = copy.deepcopy(model.state_dict())
    bb = TorchvisionBackbone(model, return_nodes=["layer3"], frozen_batch_norm=True).eval()
    x = torch.randn(2, 3, 64, 64)
    ref = model.layer3(model.layer2(model.layer1(model.maxpool(model.relu(model.bn1(model.conv1(x)))))))
    with torch.no_grad():
        (out,) = bb(NestedTensor(x, None))
    torch.testing.assert_close(out.tensors, ref, rtol=1e-5, atol=1e-5)
    assert out.mask is None
    # the caller's model is untouched: same weights, batch norms not replaced
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert isinstance(model.bn1, torch.nn.BatchNorm2d)
    assert any(isinstance(m, FrozenBatchNorm2d) for m in bb.modules())


def test_construction_leaves_batch_norm_statistics_alone():
    bb = TorchvisionBackbone("resnet18")  # training mode: the dry run must not update statistics
    assert bb.training
    assert torch.equal(bb.body.bn1.running_mean, torch.zeros(64))


def test_detr_checkpoint_and_frozen_stages(tmp_path):
    torch.manual_seed(0)
    src = torchvision.models.resnet50()
    # DETR's checkpoints: FrozenBatchNorm (no num_batches_tracked), prefix backbone.0.body., no fc
    state = {f"backbone.0.body.{k}": v for k, v in src.state_dict().items()
             if not k.startswith("fc") and "num_batches" not in k}
    state["transformer.encoder.layers.0.linear1.weight"] = torch.zeros(2, 2)
    path = tmp_path / "detr-r50.pth"
    torch.save({"model": state}, path)
    bb = TorchvisionBackbone("resnet50", checkpoint_path=str(path), frozen_batch_norm=True, frozen_stages=1)
    assert bb.load_report["prefix_stripped"] == "backbone.0.body."
    assert bb.load_report["unexpected"] == ["transformer.encoder.layers.0.linear1.weight"]
    torch.testing.assert_close(bb.body.get_submodule("layer4.2.conv3").weight, src.layer4[2].conv3.weight, rtol=0, atol=0)
    torch.testing.assert_close(bb.body.bn1.running_var, src.bn1.running_var, rtol=0, atol=0)
    grads = {n: p.requires_grad for n, p in bb.named_parameters()}
    assert not any(v for n, v in grads.items() if n.startswith(("body.conv1", "body.layer1.")))
    assert all(v for n, v in grads.items() if n.startswith(("body.layer2.", "body.layer4.")))
    frozen_all = TorchvisionBackbone("resnet18", train_backbone=False)
    assert not any(p.requires_grad for p in frozen_all.parameters())


def test_grey_input_stem_adapted():
    torch.manual_seed(0)
    model = torchvision.models.resnet18().eval()
    grey = TorchvisionBackbone(model, return_nodes=["layer2"], in_chans=1).eval()
    rgb = TorchvisionBackbone(model, return_nodes=["layer2"]).eval()
    assert grey.in_chans == 1 and grey.body.conv1.in_channels == 1
    x = torch.randn(1, 1, 48, 40)
    with torch.no_grad():
        torch.testing.assert_close(
            grey(NestedTensor(x, None))[0].tensors, rgb(NestedTensor(x.repeat(1, 3, 1, 1), None))[0].tensors,
            rtol=1e-4, atol=1e-4,
        )


@pytest.mark.parametrize(
    "args, kwargs, exc, match",
    [
        (("resnet_nope",), {}, ValueError, "is not a torchvision classification model"),
        (("resnet18",), dict(return_nodes=["layer9"]), ValueError, r"are not all nodes of ResNet.*get_graph_node_names"),
        (("resnet18",), dict(return_nodes="layer4"), TypeError, "return_nodes must be a list"),
        ((42,), {}, TypeError, "name_or_model must be a torchvision model name or an nn.Module"),
        (("vgg11",), dict(dilation=True), ValueError, "cannot build 'vgg11'"),
        (("resnet18",), dict(dilation=True), ValueError, "cannot build 'resnet18'.*Dilation > 1 not supported"),
        (("vgg11",), dict(return_nodes=["features.10"], frozen_stages=1), ValueError, "ResNet-style stages"),
        (("resnet18",), dict(frozen_stages=5), ValueError, "frozen_stages=5 but the feature model has stages"),
        (("resnet18",), dict(dilation="yes"), TypeError, "dilation must be a bool"),
        (("resnet18",), dict(checkpoint_path="missing.pt"), FileNotFoundError, "missing.pt"),
    ],
)
def test_errors(args, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        TorchvisionBackbone(*args, **kwargs)


def test_instance_with_build_options_rejected():
    with pytest.raises(ValueError, match="apply when building from a name"):
        TorchvisionBackbone(torchvision.models.resnet18(), dilation=True)


def test_forward_errors_and_repr():
    bb = TorchvisionBackbone("resnet18")
    with pytest.raises(TypeError, match="NestedTensor"):
        bb(torch.randn(1, 3, 32, 32))
    with pytest.raises(ValueError, match=r"\(B, 3, H, W\)"):
        bb(NestedTensor(torch.randn(1, 1, 32, 32), None))
    assert "name_or_model='resnet18', return_nodes=['layer4'], in_chans=3, dilation=False, weights=None" in repr(bb)
    assert "num_channels=[512], strides=[32]" in repr(bb)


@pytest.mark.parametrize("name, interm_nodes", [
    ("efficientnet_b0", ["features.2", "features.3", "features.5", "features.8"]),
    ("mobilenet_v3_small", ["features.1", "features.3", "features.8", "features.12"]),
    ("mobilenet_v2", ["features.3", "features.6", "features.13", "features.18"]),
    ("regnet_y_400mf", [f"trunk_output.block{i}" for i in range(1, 5)]),
    ("convnext_tiny", ["features.1", "features.3", "features.5", "features.7"]),
    ("densenet121", ["features.denseblock1", "features.denseblock2", "features.denseblock3", "features.norm5"]),
])
def test_default_levels_are_each_familys_stage_outputs(name, interm_nodes):
    """Like timm's features_only: the last module of each stride, measured (strides 4..32), and
    the reports match what the levels really are."""
    bb = TorchvisionBackbone(name, return_interm_layers=True)
    assert list(bb.return_nodes) == interm_nodes and bb.strides == [4, 8, 16, 32]
    _check_reports_match_outputs(bb, nested_tensor_from_tensor_list([torch.randn(3, 64, 96), torch.randn(3, 96, 64)]))
    assert list(TorchvisionBackbone(name).return_nodes) == interm_nodes[-1:]


def test_default_levels_of_a_model_without_feature_maps_refused():
    with pytest.raises(ValueError, match=r"cannot find the stage outputs of vit_b_16 .*Expected 224.* pass return_nodes"):
        TorchvisionBackbone("vit_b_16")


@pytest.mark.parametrize("name, kwargs", [
    ("mobilenet_v3_small", {}),
    ("efficientnet_b0", {"stochastic_depth_prob": 0.0}),  # random per item: equal only without it
    ("regnet_y_400mf", {}),
])
def test_conv_norm_activation_and_squeeze_excitation_exact(name, kwargs):
    """torchvision's Conv2dNormActivation / SqueezeExcitation / SimpleStemIN / StochasticDepth are
    traced through: an item alone equals the item in a padded batch in float64, eval (beside a
    larger partner) and training (outputs, running statistics, parameter gradients)."""
    torch.manual_seed(0)
    bb = trained_like(TorchvisionBackbone(name, return_interm_layers=True, model_kwargs=kwargs,
                                           padding_invariant=True).double())
    g = torch.Generator().manual_seed(3)
    item = torch.randn(3, 69, 51, generator=g, dtype=torch.float64)
    other = torch.randn(3, 83, 75, generator=g, dtype=torch.float64)

    def crop(t, i, shape):
        return t[(i, slice(None), *(slice(0, s) for s in shape))]

    bb.eval()
    with torch.no_grad():
        alone = bb(NestedTensor(item[None], None))
        batch = bb(nested_tensor_from_tensor_list([other, item], pad_value=2.0))
    assert len(alone) == 4
    for a, p in zip(alone, batch):
        torch.testing.assert_close(crop(p.tensors, 1, a.tensors.shape[2:]), a.tensors[0], rtol=1e-9, atol=1e-9)
    bb.train()
    twin = copy.deepcopy(bb)
    alone = bb(NestedTensor(item[None], None))
    padded = torch.full((1, 3, 80, 64), -3.0, dtype=torch.float64)
    padded[0, :, :69, :51] = item
    in_batch = twin(NestedTensor(padded, Padding.from_sizes([(69, 51)], (80, 64))))
    for a, p in zip(alone, in_batch):
        torch.testing.assert_close(crop(p.tensors, 0, a.tensors.shape[2:]), a.tensors[0], rtol=1e-9, atol=1e-9)
    for key, value in bb.state_dict().items():
        torch.testing.assert_close(twin.state_dict()[key], value, rtol=1e-9, atol=1e-9, msg=key)
    sum(level.tensors.square().mean() for level in alone).backward()
    sum(crop(p.tensors, 0, a.tensors.shape[2:]).square().mean() for a, p in zip(alone, in_batch)).backward()
    for (n, p1), p2 in zip(bb.named_parameters(), twin.parameters()):
        if p1.grad is not None:
            scale = float(p1.grad.abs().max()) or 1.0
            torch.testing.assert_close(p2.grad, p1.grad, rtol=1e-7, atol=1e-12 + 1e-8 * scale, msg=n)


def test_stochastic_depth_in_training_accepted():
    """EfficientNet's default stochastic depth (one random factor per item) is traced through."""
    bb = TorchvisionBackbone("efficientnet_b0", padding_invariant=True).train()
    out = bb(nested_tensor_from_tensor_list([torch.randn(3, 40, 56), torch.randn(3, 64, 32)]))
    assert out[0].tensors.shape[:2] == (2, 1280) and torch.isfinite(out[0].tensors).all()
