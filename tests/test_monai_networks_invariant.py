"""Every MONAI network of vispos.make_padding_invariant's list, at small widths, float64: an item
alone gets what it gets in a padded batch (eval: beside a partner of another size; training: batch
statistics over its cells, running statistics, gradients), or the network is refused with a
ValueError that names the layer and the reason."""

import pytest
import torch

import vispos
from vispos import NestedTensor

from item_alone import region
from padded_batch import assert_item_alone, assert_training_is_the_item_alone, padded_batch
from trained_norms import trained_like

nets = pytest.importorskip("monai.networks.nets")

_GROUP = ("group", {"num_groups": 2})
_HIGHRES_LAYERS = (
    {"name": "conv_0", "n_features": 4, "kernel_size": 3},
    {"name": "res_1", "n_features": 4, "kernels": (3, 3), "repeat": 1},
    {"name": "res_2", "n_features": 8, "kernels": (3, 3), "repeat": 1},
    {"name": "res_3", "n_features": 8, "kernels": (3, 3), "repeat": 1},
    {"name": "conv_1", "n_features": 8, "kernel_size": 1},
    {"name": "conv_2", "kernel_size": 1},
)

_TINY_BLOCKS = ["r1_k3_s11_e1_i32_o16_se0.25", "r2_k3_s22_e6_i16_o24_se0.25"]

# name -> (builder, item size, partner's size, canvas multiple): item sizes are multiples of each
# segmentation network's total stride (as the network alone needs), the canvas a multiple of it too;
# the networks with fixed wide channels (VNet, EfficientNetBN and FlexibleUNet's encoder) run in 2D
EXACT = {
    "SegResNet": (lambda: nets.SegResNet(3, init_filters=4, in_channels=1, out_channels=2, blocks_down=(1, 1, 1),
                                         blocks_up=(1, 1), norm=_GROUP), (8, 16, 12), (12, 8, 16), 4),
    "SegResNetDS": (lambda: nets.SegResNetDS(3, init_filters=4, in_channels=1, out_channels=2, blocks_down=(1, 1, 1),
                                             dsdepth=2), (8, 12, 16), (16, 8, 8), 4),
    "DynUNet": (lambda: nets.DynUNet(3, 1, 2, kernel_size=[3, 3, 3], strides=[1, 2, 2], upsample_kernel_size=[2, 2],
                                     filters=[4, 8, 16]), (12, 8, 16), (8, 16, 8), 4),
    "UNet": (lambda: nets.UNet(3, 1, 2, channels=(4, 8, 16), strides=(2, 2), num_res_units=1, norm="batch"),
             (8, 12, 16), (16, 8, 4), 4),
    "BasicUNet": (lambda: nets.BasicUNet(2, 1, 2, features=(4, 4, 4, 8, 8, 4)), (32, 48), (48, 16), 16),
    "BasicUNetPlusPlus": (lambda: nets.BasicUNetPlusPlus(2, 1, 2, features=(4, 4, 4, 8, 8, 4)), (32, 48), (16, 32),
                          16),
    "AttentionUnet": (lambda: nets.AttentionUnet(3, 1, 2, channels=(4, 8, 16), strides=(2, 2)), (8, 12, 16),
                      (16, 8, 4), 4),
    "HighResNet": (lambda: nets.HighResNet(3, 1, 2, layer_params=_HIGHRES_LAYERS), (6, 9, 7), (9, 5, 8), 4),
    "DenseNet121": (lambda: nets.DenseNet121(2, 1, 3, init_features=4, growth_rate=4, block_config=(1, 1, 1, 1)),
                    (64, 72), (72, 48), 4),
    "ResNet": (lambda: nets.ResNet("basic", (1, 1, 1, 1), (4, 8, 8, 16), spatial_dims=3, n_input_channels=1,
                                   num_classes=3), (20, 24, 12), (12, 20, 28), 4),
    "EfficientNet": (lambda: nets.EfficientNet(_TINY_BLOCKS, spatial_dims=3, in_channels=1, num_classes=3,
                                               width_coefficient=0.25, image_size=32), (12, 16, 20), (20, 12, 8), 4),
    "EfficientNetBN": (lambda: nets.EfficientNetBN("efficientnet-b0", pretrained=False, spatial_dims=2, in_channels=1,
                                                   num_classes=3), (64, 64), (32, 72), 4),
    "FlexibleUNet": (lambda: nets.FlexibleUNet(1, 2, "efficientnet-b0", pretrained=False, spatial_dims=2,
                                               decoder_channels=(8, 8, 8, 8, 8)), (32, 64), (64, 32), 32),
    # its first block copies the input over 16 channels, x.repeat(1, 16, 1, 1): the repeat rule's case
    "VNet": (lambda: nets.VNet(2, 1, 2), (32, 48), (48, 32), 16),
}
#: fixed wide channels (their blocks are the tiny EfficientNet's above): slow in eval, and in
#: training (a minute each on a CPU) left to the exhaustive run, the tiny EfficientNet standing for them
SLOW = {"EfficientNetBN", "FlexibleUNet"}
_EVAL = [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in sorted(EXACT)]
_TRAIN = [pytest.param(n, marks=pytest.mark.exhaustive) if n in SLOW else n for n in sorted(EXACT)]
CLASSIFIERS = {"DenseNet121", "ResNet", "EfficientNet", "EfficientNetBN"}


def _build(name):
    builder, item, other, _ = EXACT[name]
    torch.manual_seed(0)
    return trained_like(builder()).double(), item, other


@pytest.mark.parametrize("name", _EVAL)
def test_item_alone_equals_item_in_padded_batch_eval(name):
    net, item_size, other_size = _build(name)
    net.eval()
    inv = vispos.make_padding_invariant(net)
    item = torch.randn(inv.in_channels, *item_size, dtype=torch.float64)
    batch = padded_batch(item, other_size, multiple=EXACT[name][3])
    with torch.no_grad():
        stock = net(item[None])
        batched = inv(batch)
    assert_item_alone(stock, batched)
    if name in CLASSIFIERS:  # per-item logits computed over each item's own cells
        assert isinstance(batched, torch.Tensor) and batched.shape == (2, 3)
    else:  # the decoder's output maps (BasicUNetPlusPlus: a list) at the input's stride, its padding the input's
        maps = torch.utils._pytree.tree_leaves(batched, is_leaf=lambda v: isinstance(v, NestedTensor))
        assert maps and all(isinstance(m, NestedTensor) and m.padding == batch.padding for m in maps)


@pytest.mark.parametrize("name", _TRAIN)
def test_training_outputs_running_statistics_and_gradients(name):
    net, item_size, _ = _build(name)
    assert_training_is_the_item_alone(net, vispos.make_padding_invariant, item_size, multiple=EXACT[name][3])


def test_segresnetds_deep_supervision_is_a_list_in_training():
    net, item_size, _ = _build("SegResNetDS")
    inv = vispos.make_padding_invariant(net.train())
    out = inv(padded_batch(torch.randn(1, *item_size, dtype=torch.float64), (8, 8, 8), multiple=4))
    assert isinstance(out, list) and len(out) == 2 and all(isinstance(o, NestedTensor) for o in out)
    assert out[1].tensors.shape[2:] == tuple(s // 2 for s in out[0].tensors.shape[2:])


@pytest.mark.parametrize("name", ["UNet", "VNet"])
def test_stock_network_leaks_padding_into_the_item(name):
    """Without vispos the item's output in a padded batch is not its output alone (the comparison
    above can fail)."""
    net, item_size, other_size = _build(name)
    net.eval()
    item = torch.randn(1, *item_size, dtype=torch.float64)
    with torch.no_grad():
        alone = net(item[None])
        stock = net(padded_batch(item, other_size, multiple=EXACT[name][3]).tensors)
    part = stock[(slice(0, 1), slice(None), *region((0,) * len(item_size), item_size))]
    assert float((part - alone).abs().max()) > 1e-6 * float(alone.abs().max())


def test_tracing_leaves_monai_networks_as_they_were():
    """The patches made while tracing are gone after: SegResNetDS checks its input's shape,
    torch.as_tensor and EfficientNet's drop_connect are MONAI's and torch's own."""
    from monai.networks.nets import efficientnet

    as_tensor, drop_connect = torch.as_tensor, efficientnet.drop_connect
    net, _, _ = _build("SegResNetDS")
    vispos.make_padding_invariant(net)
    assert "is_valid_shape" not in vars(net)
    with pytest.raises(ValueError, match="must be divisible"):
        net(torch.randn(1, 1, 6, 8, 8, dtype=torch.float64))
    assert torch.as_tensor is as_tensor and efficientnet.drop_connect is drop_connect


def test_basic_unet_off_its_stride_is_refused_when_run():
    """BasicUNet pads a map one cell where an odd size was halved: an item whose size is not a
    multiple of 16 is refused when run, never computed inexactly."""
    net, _, _ = _build("BasicUNet")
    inv = vispos.make_padding_invariant(net)
    with pytest.raises(ValueError, match="cover different cells"):
        inv(padded_batch(torch.randn(1, 16, 24, dtype=torch.float64), (16, 16)))


# name -> (builder, what the ValueError says: the layer's class and the reason)
REFUSED = {
    "UNETR": (lambda: nets.UNETR(1, 2, img_size=16, feature_size=4, hidden_size=24, mlp_dim=48, num_heads=2),
              r"PatchEmbeddingBlock.*fixed patch grid.*AnySizeUNETR"),
    "SwinUNETR": (lambda: nets.SwinUNETR(in_channels=1, out_channels=2, feature_size=12, depths=(1, 1, 1, 1),
                                         num_heads=(1, 1, 1, 1)),
                  r"SwinTransformer.*windows are laid out on the canvas, not on the item"),
    # the interpolation to another map's size is exact; torch.stack of the heads along a new axis
    # (DynUNet's deep supervision in training) has no rule: refused by the op
    "DynUNet-deep-supervision": (lambda: nets.DynUNet(3, 1, 2, kernel_size=[3, 3, 3], strides=[1, 2, 2],
                                                      upsample_kernel_size=[2, 2], filters=[4, 8, 16],
                                                      deep_supervision=True, deep_supr_num=1),
                                 r"cannot run stack .*no rule for this function"),
    "BasicUNet-pixelshuffle": (lambda: nets.BasicUNet(2, 1, 2, features=(4, 4, 4, 8, 8, 4), upsample="pixelshuffle"),
                               r"SubpixelUpsample.*pixel shuffle"),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_by_name_with_the_reason(name):
    builder, match = REFUSED[name]
    torch.manual_seed(0)
    with pytest.raises(ValueError, match=match):
        vispos.make_padding_invariant(builder().double())


def test_probe_size_follows_the_strides():
    """A network that cannot run at 32 cells per axis is probed at the size its strides ask for."""
    assert vispos.make_padding_invariant(_build("HighResNet")[0]).probe_size == (2, 2, 2)
    assert vispos.make_padding_invariant(_build("AttentionUnet")[0]).probe_size == (8, 8, 8)
    unet = nets.UNet(3, 1, 2, channels=(4, 8, 16, 16, 16), strides=(2, 2, 2, 2)).double()
    assert vispos.make_padding_invariant(unet).probe_size == (32, 32, 32)
