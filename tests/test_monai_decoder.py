"""AnySizeUNETR's decoder through vispos' padding-invariance rule book: every item of a padded batch
gets, in float64, eval and train, the logits and the gradients it gets alone; copies, pickles and
replaced layers keep the graph on the model's own layers; what the rule book cannot run exactly
is refused by name when the model is built."""

import copy
import pickle

import pytest
import torch
from torch import nn
from torch.testing import assert_close

pytest.importorskip("monai")

from monai.networks.nets import UNETR  # noqa: E402

import vispos  # noqa: E402
from item_alone import assert_same_gradients, region  # noqa: E402
from vispos import NestedTensor, Padding  # noqa: E402
from vispos.monai import AnySizeUNETR  # noqa: E402

F64 = torch.float64
KW = dict(in_channels=1, out_channels=2, img_size=(32, 32, 32), feature_size=2, hidden_size=12, mlp_dim=8, num_heads=2)


def _net(**kw) -> AnySizeUNETR:
    torch.manual_seed(0)
    return AnySizeUNETR(**{**KW, **kw}).to(F64)


def _batch(sizes, canvas, starts, seed=0):
    """Items of ``sizes`` placed at ``starts`` on ``canvas`` (5.0 in every padded voxel)."""
    g = torch.Generator().manual_seed(seed)
    items = [torch.randn((1, *s), generator=g, dtype=F64) for s in sizes]
    images = torch.full((len(sizes), 1, *canvas), 5.0, dtype=F64)
    for b, (item, start) in enumerate(zip(items, starts)):
        images[(b, slice(None), *(slice(a, a + s) for a, s in zip(start, item.shape[1:])))] = item
    return items, images, Padding.from_sizes(sizes, canvas, starts=starts)


#: (sizes, canvas, starts): at the origin with partial patches; symmetric-like starts on whole patches
LAYOUTS = {
    "end": ([(32, 29, 16), (16, 32, 13)], (32, 32, 16), [(0, 0, 0)] * 2),
    "starts": ([(16, 16, 16), (13, 16, 16)], (32, 32, 32), [(16, 0, 16), (0, 16, 0)]),
    # starts off the patch grid (MONAI's symmetric padding), sizes not multiples of the patch
    "off_grid": ([(30, 29, 17), (10, 22, 11), (13, 9, 7)], (30, 32, 17), [(0, 0, 0), (0, 7, 5), (6, 3, 0)]),
}


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("pos_embed", ["auto", "sincos"])
def test_every_item_gets_its_logits_and_gradients_alone(layout, train, pos_embed):
    """Logits on each item's voxels, and the gradients of a loss on one item's logits (every
    parameter, and the item's voxels), equal the item's alone, float64."""
    sizes, canvas, starts = LAYOUTS[layout]
    net = _net(pos_embed=pos_embed).train(train)
    twin = copy.deepcopy(net)
    items, images, padding = _batch(sizes, canvas, starts)
    images.requires_grad_(True)
    out = net(NestedTensor(images, padding))
    assert out.shape == (len(sizes), 2, *canvas)
    for b, (item, start) in enumerate(zip(items, starts)):
        alone_in = item[None].clone().requires_grad_(True)
        alone = twin(alone_in)[0]
        got = out[(b, slice(None), *region(start, item.shape[1:]))]
        assert_close(got, alone, rtol=1e-10, atol=1e-10)
        if train and b == len(items) - 1:  # one item's loss: the gradients it gets alone
            weights = torch.randn(alone.shape, generator=torch.Generator().manual_seed(b), dtype=F64)
            (alone * weights).sum().backward()
            (got * weights).sum().backward(retain_graph=True)
            assert_same_gradients(net, twin)
            assert_close(images.grad[(b, slice(None), *region(start, item.shape[1:]))], alone_in.grad[0],
                         rtol=1e-8, atol=1e-12)


def test_without_padding_it_is_monais_unetr_bit_for_bit():
    """A plain tensor (no mask): the rewritten graph runs MONAI's layers as they are."""
    ref = UNETR(**KW).to(F64).eval()
    net = AnySizeUNETR.from_monai(ref).eval()
    x = torch.randn(2, 1, 32, 32, 32, dtype=F64)
    assert torch.equal(net(x), ref(x))


def test_copies_and_pickles_run_their_own_layers():
    """A deep copy and an unpickled model run their own layers (a change to the copy's weights
    changes the copy's output only); a replaced decoder layer is traced again."""
    net = _net().eval()
    items, images, padding = _batch(*LAYOUTS["end"])
    x = NestedTensor(images, padding)
    want = net(x)
    for twin in (copy.deepcopy(net), pickle.loads(pickle.dumps(net))):
        assert_close(twin(x), want, rtol=0, atol=0)
        with torch.no_grad():
            twin.decoder2.transp_conv.conv.weight.mul_(2.0)
        assert (twin(x) - want).abs().max() > 1e-3
        assert_close(net(x), want, rtol=0, atol=0)
    new = nn.Conv3d(2, 2, 1).to(F64)  # replaced after construction: the new layer runs
    net.out.conv.conv = new
    seen = []
    new.register_forward_hook(lambda m, args, out: seen.append(out))
    replaced = net(x)
    assert len(seen) == 1 and (replaced - want).abs().max() > 1e-3
    assert_close(replaced, seen[0], rtol=0, atol=0)
    # a layer replaced by one of other settings is traced again: a 3x3x3 output convolution reads
    # zeros around each item
    net.out.conv.conv = nn.Conv3d(2, 2, 3, padding=1).to(F64)
    out = net(x)
    for b, item in enumerate(items):
        assert_close(out[(b, slice(None), *region((0, 0, 0), item.shape[1:]))], net(item[None])[0],
                     rtol=1e-10, atol=1e-10)


class _ChannelCentre(nn.Module):
    """Cell-wise (each cell minus the mean of its channels' Gaussian CDF), but ndtr has no row in
    the function table: refused until declared cell-wise."""

    def forward(self, x):
        return x - torch.special.ndtr(x).mean(1, keepdim=True)


class _DataDependent(nn.Module):
    def forward(self, x):
        return x if x.sum() > 0 else -x


def _with(unetr, path, layer):
    parent, _, name = path.rpartition(".")
    setattr(unetr.get_submodule(parent), name, layer)
    return unetr


def test_the_open_rule_book_serves_the_decoder(registry):
    """A layer of the user's own in the decoder is refused until a rule is registered for it;
    then the item alone and in a batch agree."""
    centre = _ChannelCentre()
    with pytest.raises(ValueError, match=r"AnySizeUNETR: the decoder cannot be made exact .* encoder1\.layer\.lrelu"):
        AnySizeUNETR.from_monai(_with(UNETR(**KW), "encoder1.layer.lrelu", centre))
    vispos.register_invariance_rule(_ChannelCentre, vispos.CellWise())
    net = AnySizeUNETR.from_monai(_with(UNETR(**KW), "encoder1.layer.lrelu", centre)).to(F64).eval()
    items, images, padding = _batch(*LAYOUTS["end"])
    out = net(NestedTensor(images, padding))
    for b, item in enumerate(items):
        assert_close(out[(b, slice(None), *region((0, 0, 0), item.shape[1:]))], net(item[None])[0],
                     rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("path,layer,match", [
    ("decoder3.conv_block.norm1", nn.LayerNorm(32), r"decoder3\.conv_block\.norm1 \(LayerNorm\)"),
    ("decoder4.conv_block.lrelu", _DataDependent(), r"torch.fx cannot trace layer 'decoder4\.conv_block\.lrelu'"),
    ("encoder2.transp_conv_init", nn.Upsample(size=(4, 4, 4)), r"encoder2\.transp_conv_init \(Upsample\).*fixed size"),
])
def test_what_cannot_be_exact_is_refused_by_name(path, layer, match):
    with pytest.raises(ValueError, match=match):
        AnySizeUNETR.from_monai(_with(UNETR(**KW), path, layer))


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_mask_without_boxes_gives_the_same_logits(monkeypatch, train):
    """The decoder's padding as a plain mask (what runs on an accelerator, or under torch.export:
    no host read, every map's mask DETR's nearest resize of the token mask) gives the logits of
    the box path."""
    import vispos.monai.networks as networks

    net = _net().train(train)
    items, images, padding = _batch(*LAYOUTS["end"])
    x = NestedTensor(images, padding)
    boxes = net(x)
    made = []

    def as_mask(*args):
        found = networks_decoder_padding(*args)
        made.append(found.kind)
        return Padding.from_mask(found.mask, classify=False)

    networks_decoder_padding = networks.decoder_padding
    monkeypatch.setattr(networks, "decoder_padding", as_mask)
    masked = net(x)
    assert made == ["rectangular"]
    assert_close(masked, boxes, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("path,layer", [
    ("encoder1.layer.norm1", nn.InstanceNorm3d(2, track_running_stats=True)),
    ("decoder2.transp_conv", nn.Sequential(nn.Upsample(scale_factor=2, mode="trilinear", align_corners=True),
                                           nn.Conv3d(4, 2, 1))),
], ids=["instance-norm-tracking", "upsample-align-corners"])
def test_layers_the_rule_book_makes_exact_serve_the_decoder(path, layer):
    """A tracked instance norm and an align_corners up-sampling in the decoder (once refused): the
    item alone and in a batch agree."""
    torch.manual_seed(0)
    net = AnySizeUNETR.from_monai(_with(UNETR(**KW), path, layer)).to(F64).eval()
    items, images, padding = _batch(*LAYOUTS["end"])
    out = net(NestedTensor(images, padding))
    for b, item in enumerate(items):
        assert_close(out[(b, slice(None), *region((0, 0, 0), item.shape[1:]))], net(item[None])[0],
                     rtol=1e-10, atol=1e-10)
