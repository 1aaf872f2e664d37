"""The tracer behind every adapter (vispos.invariance.tracing._trace): levels it cannot see are an error,
failures inside the tracer are vispos' ValueError naming the layer, timm's hook-based feature
models are traced to their hooked modules."""

import pytest
import torch
from torch import nn
from trained_norms import trained_like

from vispos import NestedTensor, nested_tensor_from_tensor_list
from vispos.backbones import TimmBackbone, TorchvisionBackbone, VolumeBackbone
from vispos.invariance.tracing._trace import hooked_features, trace_dual


class _HookedFeatures(nn.Module):
    """Returns a feature its own forward hook collected (a side channel FX does not see)."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1))
        self.found = {}
        self.body[0].register_forward_hook(lambda m, i, out: self.found.__setitem__("f", out))

    def forward(self, x):
        self.body(x)
        out = self.found.pop("f", None)
        return [] if out is None else [out]


def test_graph_with_fewer_levels_than_asked_is_an_error():
    module = _HookedFeatures()
    assert len(module(torch.randn(1, 3, 8, 8))) == 1  # eager: the hook runs
    with pytest.raises(ValueError, match=r"returns \{'train': 0, 'eval': 0\} feature maps .* 1 levels were asked"):
        trace_dual(module, 2, n_levels=1)


class _GeM(nn.Module):
    """Generalised-mean pooling over the whole map, its kernel read from the input's size."""

    def forward(self, x):
        return nn.functional.avg_pool2d(x.clamp(min=1e-6).pow(3), (x.size(-2), x.size(-1))).pow(1.0 / 3)


def _monai_resnet_a():
    from monai.networks.nets import ResNet

    return ResNet("basic", layers=[1, 1, 1, 1], block_inplanes=[4, 8, 8, 8], spatial_dims=3, n_input_channels=1,
                  shortcut_type="A", num_classes=1)


def _monai_efficientnet():
    from monai.networks.nets import EfficientNetBN

    return EfficientNetBN("efficientnet-b0", spatial_dims=3, in_channels=1, pretrained=False)


@pytest.mark.parametrize("build, match", [
    (lambda pi: TorchvisionBackbone(nn.Sequential(nn.Conv2d(3, 8, 3), _GeM()), return_nodes=["1"], padding_invariant=pi),
     r"padding_invariant=True cannot run avg_pool2d in 1 \(graph node 'avg_pool2d'\).*size of a feature map"),
    (lambda pi: VolumeBackbone(_monai_resnet_a(), return_nodes=["layer2"], padding_invariant=pi),
     r"cannot trace layer 'layer2.0' \(ResNetBlock\): it calls a AvgPool3d that is not one of its registered"),
])
def test_tracer_failures_are_value_errors_naming_the_layer(build, match):
    with pytest.raises(ValueError, match=match):
        build(True)


def test_monai_efficientnet_blocks_trace_and_are_exact():
    """MONAI's MBConvBlock calls ``len`` on its input's shape, which torch.fx cannot trace; the
    tracing patches of ``make_padding_invariant`` cover it, so a cut inside ``_blocks`` gives the item
    alone in a padded batch."""
    stock = _monai_efficientnet().double().eval()
    trained_like(stock)
    bb = VolumeBackbone(stock, return_nodes=["_blocks.3"], padding_invariant=True).double().eval()
    g = torch.Generator().manual_seed(0)
    item = torch.randn(1, 40, 46, 36, generator=g, dtype=torch.float64)
    other = torch.randn(1, 56, 44, 50, generator=g, dtype=torch.float64)
    with torch.no_grad():
        alone = bb(NestedTensor(item[None], None))
        batched = bb(nested_tensor_from_tensor_list([item, other], size_divisibility=32))
    for a, b in zip(alone, batched):
        a = a.tensors if isinstance(a, NestedTensor) else a
        b = b.tensors if isinstance(b, NestedTensor) else b
        s = a.shape[2:]
        torch.testing.assert_close(b[:1, :, :s[0], :s[1], :s[2]], a, rtol=1e-9, atol=1e-9 * float(a.abs().max()))


def test_stock_adapters_name_the_layer_torch_fx_cannot_trace():
    with pytest.raises(ValueError, match=r"ResNet cannot be cut at return_nodes \['layer2'\].*'layer2.0' \(ResNetBlock\)"):
        VolumeBackbone(_monai_resnet_a(), return_nodes=["layer2"])
    TorchvisionBackbone(nn.Sequential(nn.Conv2d(3, 8, 3), _GeM()), return_nodes=["1"])  # stock: traced fine


@pytest.mark.parametrize("name, out_indices", [("xception41", (1, 2)), ("legacy_xception", (1, 3))])
def test_timm_hook_feature_models_exact(name, out_indices):
    """timm builds these with forward hooks (``feature_cls='hook'``): the graph returns the hooked
    modules' outputs, the levels timm's eager model returns, exact in a padded batch."""
    stock = TimmBackbone(name, out_indices=out_indices).double().eval()
    assert hooked_features(stock.body)
    trained_like(stock)
    bb = TimmBackbone(name, out_indices=out_indices, padding_invariant=True).double().eval()
    # the graph keeps only what its levels need (timm's hook model keeps the rest of the last stage)
    assert not bb.load_state_dict(stock.state_dict(), strict=False).missing_keys
    g = torch.Generator().manual_seed(0)
    item, other = torch.randn(3, 66, 54, generator=g, dtype=torch.float64), torch.randn(3, 80, 74, generator=g,
                                                                                        dtype=torch.float64)
    with torch.no_grad():
        ref = stock(NestedTensor(item[None], None))
        alone = bb(NestedTensor(item[None], None))
        batch = bb(nested_tensor_from_tensor_list([other, item]))
    assert len(alone) == len(batch) == len(out_indices) == len(bb.num_channels)
    for r, a, p, channels in zip(ref, alone, batch, bb.num_channels):
        torch.testing.assert_close(a.tensors, r.tensors, rtol=1e-12, atol=1e-12)
        assert a.tensors.shape[1] == channels
        crop = p.tensors[(1, slice(None), *(slice(0, s) for s in a.tensors.shape[2:]))]
        torch.testing.assert_close(crop, a.tensors[0], rtol=1e-9, atol=1e-9)
    assert not hooked_features(bb.body)  # no hook left to hold on to activations
