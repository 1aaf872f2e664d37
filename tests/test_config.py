import glob
import os

import pytest
import yaml

import vispos
from vispos import PositionEmbeddingSine, build_from_config
from vispos.backbones import Joiner, TimmBackbone
from vispos.cli import DEFAULT_CONFIG

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = sorted(glob.glob(os.path.join(ROOT, "configs", "*.yaml")))


def test_configs_exist():
    assert any(p.endswith("detr_resnet50.yaml") for p in CONFIGS)


@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
def test_every_config_builds(path):
    obj = build_from_config(path)
    assert isinstance(obj, Joiner)
    raw = yaml.safe_load(open(path))
    assert obj.backbone.model_name == raw["backbone"]["model_name"]
    assert obj.position_embedding.num_pos_feats == raw["position_embedding"]["num_pos_feats"]


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
