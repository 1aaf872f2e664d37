import pytest
import torch
import torchvision

from vispos import NestedTensor, PositionEmbeddingSine, interpolate_mask, nested_tensor_from_tensor_list
from vispos.backbones import FrozenBatchNorm3d, Joiner, VolumeBackbone, freeze_batch_norm


def _volumes(c=1):
    torch.manual_seed(2)
    return nested_tensor_from_tensor_list([torch.randn(c, 20, 24, 28), torch.randn(c, 32, 16, 16)])


@pytest.mark.parametrize("name", ["r3d_18", "mc3_18", "r2plus1d_18"])
def test_reports_match_outputs(name):
    bb = VolumeBackbone(name, return_nodes=["layer1", "layer2", "layer3", "layer4"]).eval()
    batch = _volumes()
    with torch.no_grad():
        levels = bb(batch)
    assert bb.num_channels == [64, 128, 256, 512]
    padded = batch.tensors.shape[2:]
    for level, c, s in zip(levels, bb.num_channels, bb.level_strides):
        assert level.tensors.shape[1] == c and len(s) == 3
        assert tuple(level.tensors.shape[2:]) == tuple(-(-p // st) for p, st in zip(padded, s))
        assert level.mask.shape == (2, *level.tensors.shape[2:]) and level.mask.dtype == torch.bool
        assert torch.equal(level.mask, interpolate_mask(batch.mask, tuple(level.tensors.shape[2:])))


def test_strides_torchvision_and_isotropic_stem():
    assert VolumeBackbone("r3d_18").level_strides == [(2, 4, 4), (4, 8, 8), (8, 16, 16)]
    assert VolumeBackbone("mc3_18").strides[-1] == (1, 16, 16)  # mc3: 3D convs in the stem only
    iso = VolumeBackbone("r3d_18", stem_stride=2)
    assert iso.strides == [4, 8, 16] and iso.body.get_submodule("stem.0").stride == (2, 2, 2)


def test_single_channel_stem_is_average_of_rgb():
    torch.manual_seed(0)
    model = torchvision.models.video.r3d_18().eval()
    grey = VolumeBackbone(model, return_nodes=["layer2"], in_chans=1).eval()
    rgb = VolumeBackbone(model, return_nodes=["layer2"], in_chans=3).eval()
    w = model.stem[0].weight
    torch.testing.assert_close(grey.body.get_submodule("stem.0").weight, w.mean(1, keepdim=True) * 3)
    assert model.stem[0].in_channels == 3  # caller's model untouched
    x = torch.randn(1, 1, 8, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(
            grey(NestedTensor(x, None))[0].tensors, rgb(NestedTensor(x.repeat(1, 3, 1, 1, 1), None))[0].tensors,
            rtol=1e-4, atol=1e-4,
        )
    two = VolumeBackbone(model, return_nodes=["layer2"], in_chans=2)
    torch.testing.assert_close(two.body.get_submodule("stem.0").weight.sum(1), w.sum(1))


def test_frozen_batch_norm_3d_matches_eval_batch_norm():
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm3d(6).eval()
    bn.running_mean.uniform_(-1, 1)
    bn.running_var.uniform_(0.5, 2)
    bn.weight.data.uniform_(0.5, 1.5)
    bn.bias.data.uniform_(-1, 1)
    frozen = freeze_batch_norm(bn, num_axes=3)
    assert isinstance(frozen, FrozenBatchNorm3d) and repr(frozen) == "FrozenBatchNorm3d(6, eps=1e-05)"
    x = torch.randn(2, 6, 3, 4, 5)
    torch.testing.assert_close(frozen(x), bn(x), rtol=1e-5, atol=1e-6)
    assert set(frozen.state_dict()) == {"weight", "bias", "running_mean", "running_var"}
    with pytest.raises(ValueError, match=r"expects \(N, C, D, H, W\)"):
        frozen(torch.randn(2, 6, 3, 4))


def test_frozen_backbone_and_checkpoint(tmp_path):
    torch.manual_seed(0)
    src = torchvision.models.video.r3d_18()
    path = tmp_path / "r3d.pt"
    torch.save(src.state_dict(), path)  # 3-channel Kinetics-style checkpoint
    bb = VolumeBackbone("r3d_18", checkpoint_path=str(path), frozen_batch_norm=True, frozen_stages=1)
    assert bb.load_report["missing"] == [] and "fc.weight" in bb.load_report["unexpected"]
    torch.testing.assert_close(bb.body.get_submodule("stem.0").weight, src.stem[0].weight.mean(1, keepdim=True) * 3)
    torch.testing.assert_close(bb.body.get_submodule("layer3.0.conv1.0").weight, src.layer3[0].conv1[0].weight, rtol=0, atol=0)
    assert not any(isinstance(m, torch.nn.BatchNorm3d) for m in bb.modules())
    grads = {n: p.requires_grad for n, p in bb.named_parameters()}
    assert not any(v for n, v in grads.items() if n.startswith(("body.stem", "body.layer1.")))
    assert all(v for n, v in grads.items() if n.startswith("body.layer2."))
    # a checkpoint already trained on one channel loads as it is
    torch.save(bb.body.state_dict(), tmp_path / "grey.pt")
    again = VolumeBackbone("r3d_18", checkpoint_path=str(tmp_path / "grey.pt"))
    torch.testing.assert_close(again.body.get_submodule("stem.0").weight, bb.body.get_submodule("stem.0").weight, rtol=0, atol=0)


def test_joiner_3d_position_embedding():
    bb = VolumeBackbone("r3d_18", return_nodes=["layer3", "layer4"], stem_stride=2)
    pe = PositionEmbeddingSine(16, normalize=True)
    joiner = Joiner(bb, pe).eval()
    batch = _volumes()
    with torch.no_grad():
        features, pos = joiner(batch)
    for f, p in zip(features, pos):
        assert p.shape == (2, 48, *f.tensors.shape[2:])
        torch.testing.assert_close(p, pe(f.mask), rtol=0, atol=0)


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(name_or_model="resnet18"), ValueError, r"not a supported 3D model; expected one of \('r3d_18'"),
        (dict(name_or_model=torchvision.models.resnet18()), ValueError, "must be a 3D network"),
        (dict(name_or_model=3), TypeError, "name_or_model must be one of"),
        (dict(in_chans=0), ValueError, "in_chans must be a positive int"),
        (dict(stem_stride=(1, 2)), ValueError, r"stem_stride must be an int or a sequence of 3 ints, got \(1, 2\)"),
        (dict(stem_stride=(1, 2.0, 2)), TypeError, "stem_stride must hold ints"),
        (dict(stem_stride=0), ValueError, r"stem_stride must hold positive ints, got \(0, 0, 0\)"),
        (dict(return_nodes=["layer7"]), ValueError, "not all nodes"),
    ],
)
def test_errors(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        VolumeBackbone(**kwargs)


def test_forward_errors_and_repr():
    bb = VolumeBackbone("r3d_18")
    with pytest.raises(ValueError, match=r"\(B, 1, D, H, W\)"):
        bb(nested_tensor_from_tensor_list([torch.randn(1, 16, 16)]))
    with pytest.raises(TypeError, match="NestedTensor"):
        bb(torch.randn(1, 1, 8, 8, 8))
    assert "name_or_model='r3d_18', return_nodes=['layer2', 'layer3', 'layer4'], in_chans=1, stem_stride=None" in repr(bb)
