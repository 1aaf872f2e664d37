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
        (dict(model_name="resnet18", out_indices=()), ValueError, r"out_indices must be a non-empty sequence of ints, got \(\)"),
        (dict(model_name="resnet18", out_indices=(1, 2.0)), TypeError, r"out_indices\[1\] must be an int, got 2.0"),
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


# ------------------------------------------------------------------ multi-scale options (issue 4)
def test_frozen_batch_norm_same_output_and_no_bn_left():
    from torchvision.ops import FrozenBatchNorm2d

    torch.manual_seed(0)
    plain = TimmBackbone("resnet18", out_indices=(2, 4)).eval()
    for m in plain.modules():  # non-trivial statistics
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    path_state = {k: v.clone() for k, v in plain.body.state_dict().items()}
    frozen = TimmBackbone("resnet18", out_indices=(2, 4), frozen_batch_norm=True).eval()
    frozen.body.load_state_dict(path_state, strict=False)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in frozen.modules())
    assert any(isinstance(m, FrozenBatchNorm2d) for m in frozen.modules())
    batch = _batch()
    with torch.no_grad():
        for a, b in zip(plain(batch), frozen(batch)):
            torch.testing.assert_close(b.tensors, a.tensors, rtol=1e-5, atol=1e-5)
    frozen.train()  # frozen statistics do not move in training mode
    before = frozen.body.bn1.running_mean.clone()
    frozen(batch)
    assert torch.equal(frozen.body.bn1.running_mean, before)


def test_frozen_batch_norm_keeps_timm_fused_activation():
    torch.manual_seed(0)
    plain = TimmBackbone("efficientnet_b0", out_indices=(2,)).eval()
    frozen = TimmBackbone("efficientnet_b0", out_indices=(2,), frozen_batch_norm=True).eval()
    frozen.body.load_state_dict(plain.body.state_dict(), strict=False)
    assert type(frozen.body.bn1).__name__ == "FrozenBatchNormAct2d"
    batch = _batch()
    with torch.no_grad():
        torch.testing.assert_close(frozen(batch)[0].tensors, plain(batch)[0].tensors, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "kwargs, frozen_prefixes, trainable_prefixes",
    [
        (dict(), (), ("conv1", "layer1", "layer4")),
        (dict(frozen_stages=0), ("conv1", "bn1"), ("layer1", "layer4")),
        (dict(frozen_stages=1), ("conv1", "bn1", "layer1."), ("layer2", "layer4")),
        (dict(frozen_stages=3), ("conv1", "layer1.", "layer3."), ("layer4",)),
        (dict(train_backbone=False), ("conv1", "layer1.", "layer4."), ()),
    ],
)
def test_frozen_stages(kwargs, frozen_prefixes, trainable_prefixes):
    bb = TimmBackbone("resnet18", out_indices=(4,), **kwargs)
    grads = dict((n, p.requires_grad) for n, p in bb.body.named_parameters())
    for name, req in grads.items():
        if name.startswith(frozen_prefixes) and frozen_prefixes:
            assert not req, name
        if name.startswith(trainable_prefixes) and trainable_prefixes:
            assert req, name


def test_frozen_stages_convnext_uses_feature_info():
    bb = TimmBackbone("convnext_atto", out_indices=(1, 2, 3), frozen_stages=1)
    grads = {n: p.requires_grad for n, p in bb.body.named_parameters()}
    assert not any(v for n, v in grads.items() if n.startswith(("stem", "stages_0", "stages_1")))
    assert all(v for n, v in grads.items() if n.startswith(("stages_2", "stages_3")))


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(frozen_stages=-2), ValueError, "frozen_stages must be >= -1, got -2"),
        (dict(frozen_stages=9), ValueError, r"frozen_stages=9 but 'resnet18' has feature indices 0..4"),
        (dict(train_backbone="yes"), TypeError, "train_backbone must be a bool"),
        (dict(frozen_batch_norm=1), TypeError, "frozen_batch_norm must be a bool"),
    ],
)
def test_freeze_errors(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        TimmBackbone("resnet18", **kwargs)


def test_load_report_and_shape_mismatch(tmp_path):
    import timm

    from vispos.backbones import format_load_report

    full = timm.create_model("resnet18", pretrained=False)
    state = {f"backbone.0.body.{k}": v for k, v in full.state_dict().items() if "num_batches" not in k}
    path = tmp_path / "detr_style.pth"
    torch.save({"model": state}, path)
    bb = TimmBackbone("resnet18", out_indices=(4,), checkpoint_path=str(path), frozen_batch_norm=True)
    report = bb.load_report
    assert report["prefix_stripped"] == "backbone.0.body." and report["missing"] == []
    assert report["unexpected"] == ["fc.bias", "fc.weight"]
    assert len(report["loaded"]) == len([k for k in full.state_dict() if not k.startswith("fc") and "num_batches" not in k])
    text = format_load_report(report)
    assert "prefix 'backbone.0.body.' stripped" in text and "ignored 2 keys" in text
    bad = dict(full.state_dict())
    bad["conv1.weight"] = torch.zeros(64, 3, 3, 3)
    torch.save(bad, tmp_path / "bad.pt")
    with pytest.raises(ValueError, match=r"wrong shape, e.g. \['conv1.weight: checkpoint \(64, 3, 3, 3\) vs backbone \(64, 3, 7, 7\)'\]"):
        TimmBackbone("resnet18", out_indices=(4,), checkpoint_path=str(tmp_path / "bad.pt"))


def test_extra_repr_new_options():
    bb = TimmBackbone("resnet18", out_indices=(4,), frozen_stages=1, frozen_batch_norm=True)
    assert "train_backbone=True, frozen_stages=1, frozen_batch_norm=True" in repr(bb)


def test_levels_keep_rectangular_sizes(resnet18):
    batch = _batch()
    with torch.no_grad():
        levels = resnet18(batch)
    for level in levels:
        assert level.rectangular
        rebuilt = NestedTensor(level.tensors, level.mask).image_sizes  # read back from the mask
        assert level.image_sizes == rebuilt


# ------------------------------------------------------------------- pretrained, no network
@pytest.fixture
def empty_caches(tmp_path, monkeypatch):
    """Empty Hugging Face and torch hub caches; any network access fails at once."""
    import socket

    import huggingface_hub.constants

    hf, hub = tmp_path / "hf", tmp_path / "torchhub"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hf))
    old = torch.hub.get_dir()
    torch.hub.set_dir(str(hub))

    def no_network(*args, **kwargs):
        raise AssertionError("vispos tried to open a network connection")

    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    yield hf, hub
    torch.hub.set_dir(old)


def test_pretrained_without_cached_weights_fails_at_once(empty_caches):
    """Issue 26 item 13: timm retried the network for ~50 s, then raised huggingface_hub's
    error; now a FileNotFoundError at once, saying how to pass a local checkpoint."""
    import time

    start = time.perf_counter()
    with pytest.raises(FileNotFoundError, match=r"pretrained=True needs timm's weights for model_name='resnet18'.*"
                       r"timm/resnet18.a1_in1k.*resnet18_a1_0-d63eafa0.pth.*checkpoint_path="):
        TimmBackbone("resnet18", pretrained=True)
    assert time.perf_counter() - start < 5
    with pytest.raises(TypeError, match="pretrained must be a bool, got 'yes'"):
        TimmBackbone("resnet18", pretrained="yes")


@pytest.mark.parametrize("where", ["hf", "torchhub"])
def test_pretrained_loads_timm_cached_weights_without_network(empty_caches, where):
    import timm
    from safetensors.torch import save_file

    hf, hub = empty_caches
    torch.manual_seed(3)
    reference = timm.create_model("resnet18", pretrained=False)
    state = {k: v.contiguous() for k, v in reference.state_dict().items()}
    if where == "hf":  # the layout huggingface_hub writes
        repo = hf / "models--timm--resnet18.a1_in1k"
        (repo / "refs").mkdir(parents=True)
        (repo / "refs" / "main").write_text("0" * 40)
        (repo / "snapshots" / ("0" * 40)).mkdir(parents=True)
        save_file(state, str(repo / "snapshots" / ("0" * 40) / "model.safetensors"))
    else:  # timm's URL weights, as torch.hub.download_url_to_file leaves them
        (hub / "checkpoints").mkdir(parents=True)
        torch.save(state, hub / "checkpoints" / "resnet18_a1_0-d63eafa0.pth")
    bb = TimmBackbone("resnet18", out_indices=(4,), pretrained=True)
    torch.testing.assert_close(bb.body.layer4[1].conv2.weight, reference.layer4[1].conv2.weight, rtol=0, atol=0)
    torch.testing.assert_close(bb.body.conv1.weight, reference.conv1.weight, rtol=0, atol=0)


@pytest.mark.parametrize("cls, name", [("TorchvisionBackbone", "resnet18"), ("VolumeBackbone", "r3d_18")])
def test_torchvision_weights_are_read_from_the_cache_only(empty_caches, cls, name):
    """Careful-user pass: ``TorchvisionBackbone("resnet18", weights="DEFAULT")`` printed
    "Downloading ..." and raised urllib's URLError without network; now weights that are not
    in the torch hub cache raise FileNotFoundError at once, and cached ones load with no
    network access."""
    import torchvision

    import vispos.backbones as backbones

    make = getattr(backbones, cls)
    url = torchvision.models.get_model_weights(name).DEFAULT.url
    file = url.rsplit("/", 1)[1]
    with pytest.raises(FileNotFoundError, match=rf"weights='DEFAULT' \(.*\) needs torchvision's file '{file}' "
                       r"in the torch hub cache .*vispos never downloads. Pass checkpoint_path="):
        make(name, weights="DEFAULT")
    with pytest.raises(ValueError, match=rf"weights='NOPE' is not one of '{name}''s weights: \['DEFAULT', "):
        make(name, weights="NOPE")
    _, hub = empty_caches
    (hub / "checkpoints").mkdir(parents=True)
    torch.manual_seed(5)
    reference = torchvision.models.get_model(name)
    torch.save(reference.state_dict(), hub / "checkpoints" / file)
    bb = make(name, weights="DEFAULT")
    assert "weights='DEFAULT'" in repr(bb)
    key = "layer4.0.conv1.0.weight" if cls == "VolumeBackbone" else "layer4.0.conv1.weight"
    torch.testing.assert_close(bb.body.state_dict()[key], reference.state_dict()[key], rtol=0, atol=0)
