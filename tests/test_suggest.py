"""Suggestions for mistyped names (vispos/_suggest.py) where vispos names a thing: timm and
torchvision models, shipped configs, config types and keys, and the top-level package."""

from __future__ import annotations

import pytest

import vispos
from vispos._suggest import close_names, did_you_mean, public_homes
from vispos.app.cli import main


def test_close_names_rank_the_nearest_first():
    names = ["cspresnet50", "ecaresnet50d", "resnet18", "resnet50", "resnet50d"]
    assert close_names("resnet5O", names)[0] == "resnet50"
    assert close_names("resnet18x", names)[0] == "resnet18"
    assert close_names("RESNET50", names)[0] == "resnet50"  # case is not a typo
    assert close_names("zzz", names) == []
    assert did_you_mean("resnt50", ["resnet50"]) == "did you mean 'resnet50'?"
    assert did_you_mean("zzz", ["resnet50"]) == ""


@pytest.mark.parametrize("typo, want", [("resnet5O", "resnet50"), ("resnet18x", "resnet18")])
def test_timm_backbone_suggests_the_nearest_model(typo, want):
    """Before: ``similar names: ['cspresnet50', 'ecaresnet...']`` (a substring search on the first
    six characters), never ``resnet50`` / ``resnet18``."""
    pytest.importorskip("timm")
    from vispos.backbones import TimmBackbone

    with pytest.raises(ValueError, match=rf"model_name '{typo}' is not a timm model; nearest names: \['{want}', "):
        TimmBackbone(typo)


def test_torchvision_backbone_suggests_the_nearest_model():
    pytest.importorskip("torchvision")
    from vispos.backbones import TorchvisionBackbone

    with pytest.raises(ValueError, match=r"nearest names: \['resnet50', "):
        TorchvisionBackbone("resnet5O")


def test_config_typo_says_did_you_mean(capsys):
    with pytest.raises(FileNotFoundError, match=r"is not a config vispos ships \(did you mean 'detr_resnet50'"):
        vispos.build_from_config("detr_resnt50")
    assert main(["config", "show", "detr_resnt50"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "(did you mean 'detr_resnet50'" in err


def test_config_type_and_key_typos_say_did_you_mean():
    with pytest.raises(ValueError, match=r"unknown type 'PositionEmbeddingSin'; registered types are .*; "
                                         r"did you mean 'PositionEmbeddingSine'"):
        vispos.build_from_config({"type": "PositionEmbeddingSin"})
    with pytest.raises(ValueError, match=r"unknown keys \['normalise'\]; allowed keys are .*; "
                                         r"did you mean 'normalize' for 'normalise'\?$"):
        vispos.build_from_config({"type": "PositionEmbeddingSine", "normalise": True})


def test_top_level_name_of_a_subpackage_points_there():
    """Before: ``module 'vispos' has no attribute 'TimmBackbone'`` and nothing more."""
    with pytest.raises(AttributeError, match=r"module 'vispos' has no attribute 'TimmBackbone'; it is in "
                                             r"vispos.backbones: from vispos.backbones import TimmBackbone$"):
        vispos.TimmBackbone  # noqa: B018
    with pytest.raises(AttributeError, match=r"no attribute 'PositionEmbeddingSin'; did you mean 'PositionEmbeddingSine'"):
        vispos.PositionEmbeddingSin  # noqa: B018
    with pytest.raises(AttributeError, match=r"no attribute '_repr_html_'$"):  # tools probe these: no search
        vispos._repr_html_  # noqa: B018
    assert public_homes("vispos", vispos.__path__[0], "Joiner") == ["vispos.backbones"]
