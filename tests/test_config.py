import glob
import os

import pytest
import yaml

import vispos
from vispos import PositionEmbeddingSine, build_from_config
import torch

from vispos import nested_tensor_from_tensor_list
from vispos.backbones import Joiner, TimmBackbone, TorchvisionBackbone, VolumeBackbone
from vispos.cli import DEFAULT_CONFIG, DEFAULT_VOLUME_CONFIG

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = sorted(glob.glob(os.path.join(ROOT, "configs", "*.yaml")))


def test_configs_exist():
    assert any(p.endswith("detr_resnet50.yaml") for p in CONFIGS)


def test_issue_configs_shipped():
    names = {os.path.basename(p) for p in CONFIGS}
    assert {"detr_resnet50.yaml", "detr_resnet50_dc5.yaml", "deformable_detr_resnet50.yaml",
            "dino_convnext_tiny.yaml", "volume_r3d18.yaml"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
def test_every_config_builds_and_reports_what_it_outputs(path):
    """Every shipped config builds, and the channels and strides it reports are the ones its
    levels really have on a small padded batch."""
    torch.manual_seed(0)
    obj = build_from_config(path).eval()
    assert isinstance(obj, Joiner)
    raw = yaml.safe_load(open(path))
    name = raw["backbone"].get("model_name", raw["backbone"].get("name_or_model"))
    assert obj.backbone.model_name == name
    assert obj.position_embedding.num_pos_feats == raw["position_embedding"]["num_pos_feats"]
    for key in ("hidden_dim", "num_feature_levels"):
        if key in raw:
            assert getattr(obj, key) == raw[key]
    if obj.n_spatial == 3:
        items = [torch.randn(1, 40, 36, 28), torch.randn(1, 28, 44, 36)]
    else:
        items = [torch.randn(3, 96, 128), torch.randn(3, 128, 80)]
    batch = nested_tensor_from_tensor_list(items)
    with torch.no_grad():
        features, pos = obj(batch)
    assert len(features) == len(pos) == len(obj.num_channels) == len(obj.strides)
    for f, p, c, s in zip(features, pos, obj.num_channels, obj.strides):
        per_axis = s if isinstance(s, tuple) else (s,) * obj.n_spatial
        assert f.tensors.shape[1] == c
        assert tuple(f.tensors.shape[2:]) == tuple(-(-n // st) for n, st in zip(batch.tensors.shape[2:], per_axis))
        assert p.shape == (2, obj.n_spatial * obj.position_embedding.num_pos_feats, *f.tensors.shape[2:])
    if obj.hidden_dim is not None:
        flat = obj.flatten(features, pos)
        assert flat.src.shape[-1] == obj.hidden_dim and flat.valid_ratios.shape == (2, len(features), obj.n_spatial)


def test_detr_dc5_and_volume_configs():
    dc5 = build_from_config(os.path.join(ROOT, "configs", "detr_resnet50_dc5.yaml"))
    assert isinstance(dc5.backbone, TorchvisionBackbone) and dc5.strides == [16] and dc5.num_channels == [2048]
    vol_path = os.path.join(ROOT, "configs", "volume_r3d18.yaml")
    vol = build_from_config(vol_path)
    assert isinstance(vol.backbone, VolumeBackbone) and vol.strides == [4, 8, 16, 32]
    assert yaml.safe_load(open(vol_path)) == DEFAULT_VOLUME_CONFIG


def test_detr_resnet50_config_values_and_default():
    path = os.path.join(ROOT, "configs", "detr_resnet50.yaml")
    model = build_from_config(path)
    assert isinstance(model.backbone, TimmBackbone) and model.backbone.out_indices == (4,)
    pe = model.position_embedding
    assert isinstance(pe, PositionEmbeddingSine)
    assert (pe.num_pos_feats, pe.normalize) == (128, True)
    assert yaml.safe_load(open(path)) == DEFAULT_CONFIG


def test_dict_not_modified():
    cfg = {"type": "PositionEmbeddingSine", "num_pos_feats": 16}
    before = dict(cfg)
    assert isinstance(build_from_config(cfg), PositionEmbeddingSine)
    assert cfg == before


@pytest.mark.parametrize(
    "cfg, exc, match",
    [
        ({"type": "Nope"}, ValueError, r"unknown type 'Nope'; registered types are \[.*'PositionEmbeddingSine'"),
        ({"type": "PositionEmbeddingSine", "num_feats": 4}, ValueError, r"unknown keys \['num_feats'\]; allowed keys are \['num_pos_feats'"),
        ({"type": "TimmBackbone"}, ValueError, r"missing required keys \['model_name'\]"),
        ({"num_pos_feats": 4}, ValueError, "needs a 'type' key"),
        ({"type": "Joiner", "backbone": {"type": "Bad"}, "position_embedding": {}}, ValueError, r"config.backbone: unknown type 'Bad'"),
        ([1, 2], TypeError, "path or a mapping"),
    ],
)
def test_errors(cfg, exc, match):
    with pytest.raises(exc, match=match):
        build_from_config(cfg)


def test_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        build_from_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("type: [unclosed\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        build_from_config(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42\n")
    with pytest.raises(ValueError, match="must hold a mapping"):
        build_from_config(scalar)


def test_register_custom():
    class Custom:
        def __init__(self, a, b=2):
            self.a, self.b = a, b

    vispos.register(Custom, name="CustomForTest")
    obj = build_from_config({"type": "CustomForTest", "a": {"type": "PositionEmbeddingSine", "num_pos_feats": 4}})
    assert isinstance(obj.a, PositionEmbeddingSine) and obj.b == 2
    with pytest.raises(ValueError, match="already registered"):
        vispos.register(int, name="CustomForTest")
