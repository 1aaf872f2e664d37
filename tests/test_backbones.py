import pytest
import torch

from vispos import NestedTensor, PositionEmbeddingSine, interpolate_mask, nested_tensor_from_tensor_list
from vispos.backbones import Joiner, TimmBackbone


@pytest.fixture(scope="module")
def resnet18():
    torch.manual_seed(0)
    return TimmBackbone("resnet18", out_indices=(1, 2, 3, 4)).eval()


def _batch():
    return nested_tensor_from_tensor_list([torch.randn(3, 64, 96), torch.randn(3, 80, 48)])


def test_reports_match_outputs(resnet18):
    batch = _batch()
    with torch.no_grad():
        levels = resnet18(batch)
    assert len(levels) == 4
    assert resnet18.num_channels == [64, 128, 256, 512]
    assert resnet18.strides == [4, 8, 16, 32]
    for level, c, s in zip(levels, resnet18.num_channels, resnet18.strides):
        assert isinstance(level, NestedTensor)
        assert level.tensors.shape[1] == c
        assert level.tensors.shape[-2:] == (-(-80 // s), -(-96 // s))
        assert level.mask.dtype == torch.bool
        assert torch.equal(level.mask, interpolate_mask(batch.mask, level.tensors.shape[-2:]))


@pytest.mark.parametrize("name, out_indices", [("resnet50", (4,)), ("convnext_atto", (1, 2, 3)), ("efficientnet_b0", (2, 3, 4))])
def test_other_models_report_their_shapes(name, out_indices):
    bb = TimmBackbone(name, out_indices=out_indices).eval()
    with torch.no_grad():
        levels = bb(_batch())
    assert [lv.tensors.shape[1] for lv in levels] == bb.num_channels
    for lv, s in zip(levels, bb.strides):
        assert lv.tensors.shape[-1] == -(-96 // s)


def test_joiner_pos_per_level_in_feature_dtype(resnet18):
    pe = PositionEmbeddingSine(32, normalize=True)
    joiner = Joiner(resnet18, pe)
    batch = _batch()
    with torch.no_grad():
        features, pos = joiner(batch)
    assert len(features) == len(pos) == 4
    assert joiner.num_channels == resnet18.num_channels and joiner.strides == resnet18.strides
    for f, p in zip(features, pos):
        assert p.shape == (2, 64, *f.tensors.shape[-2:])
        torch.testing.assert_close(p, pe(f.mask), rtol=0, atol=0)
    joiner64 = Joiner(TimmBackbone("resnet18", out_indices=(4,)).double().eval(), pe)
    with torch.no_grad():
        features, pos = joiner64(batch.to(torch.float64))
    assert pos[0].dtype == torch.float64


def test_checkpoint_round_trip(tmp_path, resnet18):
    import timm

    full = timm.create_model("resnet18", pretrained=False)
    state = {f"module.{k}": v for k, v in full.state_dict().items()}  # wrapped, with the fc head
    path = tmp_path / "r18.pt"
    torch.save({"state_dict": state}, path)
    bb = TimmBackbone("resnet18", out_indices=(4,), checkpoint_path=str(path))
    assert bb.load_report["missing"] == []
    assert "fc.weight" in bb.load_report["unexpected"]
    torch.testing.assert_close(bb.body.conv1.weight, full.conv1.weight, rtol=0, atol=0)

    from safetensors.torch import save_file

    st = tmp_path / "r18.safetensors"
    save_file({k: v.contiguous() for k, v in full.state_dict().items()}, str(st))
    bb2 = TimmBackbone("resnet18", out_indices=(4,), checkpoint_path=str(st))
    torch.testing.assert_close(bb2.body.layer4[0].conv1.weight, full.layer4[0].conv1.weight, rtol=0, atol=0)

    partial = tmp_path / "partial.pt"
    torch.save({k: v for k, v in full.state_dict().items() if not k.startswith("layer4")}, partial)
    with pytest.raises(ValueError, match="lacks .* backbone weights"):
        TimmBackbone("resnet18", out_indices=(4,), checkpoint_path=str(partial))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        TimmBackbone("resnet18", checkpoint_path=str(tmp_path / "nope.pt"))


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(model_name="resnet_does_not_exist"), ValueError, "is not a timm model"),
        (dict(model_name="resnet18", out_indices=(7,)), ValueError, "out_indices"),
        (dict(model_name="resnet18", out_indices=4), TypeError, "out_indices must be a non-empty sequence"),
        (dict(model_name="resnet18", out_indices=()), TypeError, "out_indices"),
        (dict(model_name=18), TypeError, "model_name must be a str"),
    ],
)
def test_backbone_errors(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        TimmBackbone(**kwargs)


def test_forward_errors(resnet18):
    with pytest.raises(TypeError, match="NestedTensor"):
        resnet18(torch.randn(1, 3, 32, 32))
    with pytest.raises(ValueError, match=r"\(B, 3, H, W\)"):
        resnet18(NestedTensor(torch.randn(1, 1, 32, 32), None))
    with pytest.raises(TypeError, match="position_embedding must be an nn.Module"):
        Joiner(resnet18, lambda x: x)


def test_extra_repr():
    bb = TimmBackbone("resnet18", out_indices=(3, 4))
    assert "model_name='resnet18', out_indices=(3, 4), pretrained=False, checkpoint_path=None, in_chans=3" in repr(bb)
