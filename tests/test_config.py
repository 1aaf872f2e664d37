import glob
import os
import re

import pytest
import yaml

import vispos
from vispos import PositionEmbeddingSine, build_from_config
import torch

from vispos import nested_tensor_from_tensor_list
from vispos.backbones import Joiner, TimmBackbone, TorchvisionBackbone, VolumeBackbone
from vispos.app.cli import DEFAULT_CONFIG, DEFAULT_VOLUME_CONFIG

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
    if obj.num_axes == 3:
        items = [torch.randn(1, 40, 36, 28), torch.randn(1, 28, 44, 36)]
    else:
        items = [torch.randn(3, 96, 128), torch.randn(3, 128, 80)]
    batch = nested_tensor_from_tensor_list(items)
    with torch.no_grad():
        features, pos = obj(batch)
    assert len(features) == len(pos) == len(obj.num_channels) == len(obj.strides)
    for f, p, c, s in zip(features, pos, obj.num_channels, obj.strides):
        per_axis = s if isinstance(s, tuple) else (s,) * obj.num_axes
        assert f.tensors.shape[1] == c
        assert tuple(f.tensors.shape[2:]) == tuple(-(-n // st) for n, st in zip(batch.tensors.shape[2:], per_axis))
        assert p.shape == (2, obj.num_axes * obj.position_embedding.num_pos_feats, *f.tensors.shape[2:])
    if obj.hidden_dim is not None:
        flat = obj.flatten(features, pos)
        assert flat.src.shape[-1] == obj.hidden_dim and flat.valid_ratios.shape == (2, len(features), obj.num_axes)


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


# -------------------------------------------------------------- hostile configs (issue 12, 7-8)
def _bomb(depth):
    """A "billion laughs" YAML: 9**depth strings under ``num_pos_feats`` in ~60*depth bytes."""
    lines = ["type: PositionEmbeddingSine", "a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, depth)]
    return "\n".join([*lines, f"num_pos_feats: *a{depth - 1}"])


@pytest.mark.parametrize("depth", [7, 8])
def test_yaml_bomb_is_refused_at_once(tmp_path, depth):
    """Item 7: depth 8 (a 460-byte file, 43 million strings) took 72 s and a MemoryError; now
    load_config and build_from_config refuse it in milliseconds."""
    import time

    from vispos.config import load_config

    path = tmp_path / "bomb.yaml"
    path.write_text(_bomb(depth))
    assert path.stat().st_size < 600
    vispos.config.registered()  # the registry's imports are not part of the timing
    for fn in (load_config, build_from_config):
        t0 = time.perf_counter()
        with pytest.raises(ValueError, match=r"bomb.yaml: the config expands to more than 10000 values"):
            fn(path)
        assert time.perf_counter() - t0 < 1.0


def test_aliases_within_the_cap_still_work(tmp_path):
    """Anchors, aliases and merge keys are allowed while the config stays small."""
    path = tmp_path / "ok.yaml"
    path.write_text("type: Joiner\n"
                    "backbone: {type: TimmBackbone, model_name: resnet18, out_indices: &idx [4]}\n"
                    "position_embedding:\n  <<: {type: PositionEmbeddingSine, num_pos_feats: 16}\n  normalize: true\n")
    obj = build_from_config(path)
    assert obj.position_embedding.num_pos_feats == 16 and obj.position_embedding.normalize


@pytest.mark.parametrize(
    "text, match",
    [
        ("type: PositionEmbeddingSine\nnum_pos_feats: &a [1, *a]\n", "the config contains itself"),
        ("type: PositionEmbeddingSine\nnum_pos_feats: " + "[" * 60 + "]" * 60 + "\n", "nests deeper than 50 levels"),
        ("type: PositionEmbeddingSine\nnum_pos_feats: " + "[" * 3000 + "]" * 3000 + "\n",
         "nests too deeply for the YAML parser"),
    ],
)
def test_self_containing_and_deep_configs(tmp_path, text, match):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=match):
        build_from_config(path)


def test_large_config_file_is_refused(tmp_path):
    from vispos.config import MAX_CONFIG_BYTES, load_config

    path = tmp_path / "big.yaml"
    path.write_text("type: PositionEmbeddingSine\n" + "#" * MAX_CONFIG_BYTES + "\n")
    with pytest.raises(ValueError, match=rf"big.yaml' has {MAX_CONFIG_BYTES + 29} bytes, more than the {MAX_CONFIG_BYTES}"):
        load_config(path)


def test_long_values_are_cut_in_messages(tmp_path):
    """Item 7: a message prints at most a few hundred characters of a value, however long."""
    path = tmp_path / "long.yaml"
    path.write_text("type: PositionEmbeddingSine\nnum_pos_feats: [" + ", ".join(["12345"] * 3000) + "]\n")
    with pytest.raises(TypeError, match=r"long.yaml \(PositionEmbeddingSine\): num_pos_feats .*\.\.\.") as info:
        build_from_config(path)
    assert len(str(info.value)) - len(str(path)) < 600
    path.write_text("type: [" + ", ".join(["12345"] * 3000) + "]\n")
    with pytest.raises(ValueError, match=r"unknown type \[12345, 12345, 12345, 12345, 12345, 12345, \.\.\.\]; registered"):
        build_from_config(path)
    with pytest.raises(ValueError, match=r"dtype_override: 'x{27}\.\.\.x{28}' is not a torch dtype"):
        build_from_config({"type": "PositionalEncoding2D", "channels": 8, "dtype_override": "x" * 100_000})


@pytest.mark.parametrize(
    "text, match",
    [
        ("type: PositionEmbeddingSine\n1: 2\nfoo: 3\n", r"keys must be strings \(the constructor's keyword names\), got 1$"),
        ("type: PositionEmbeddingSine\n~: 2\n", r"got None \(YAML reads unquoted yes/no/on/off/true/false as booleans"),
        ("type: PositionEmbeddingSine\non: 2\n", r"got True \(YAML reads"),
        ("type: Joiner\nbackbone: {type: TimmBackbone, model_name: resnet18, 3.5: 1, null: 2}\n"
         "position_embedding: {type: PositionEmbeddingSine}\n", r"c.yaml.backbone \(TimmBackbone\): keys must be strings.*got 3.5, None"),
    ],
)
def test_non_string_keys_are_named(tmp_path, text, match):
    """Item 8: before, ``TypeError: '<' not supported between instances of 'str' and 'int'``."""
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(TypeError, match=match):
        build_from_config(path)


def test_config_dict_with_shared_references_is_measured_too():
    inner = [1] * 100
    for _ in range(4):
        inner = [inner] * 100
    with pytest.raises(ValueError, match="config: the config expands to more than 10000 values"):
        build_from_config({"type": "PositionEmbeddingSine", "num_pos_feats": inner})


# ------------------------------------------------ configs by name, from any directory (issue 32, 1)
SHIPPED = sorted(os.path.splitext(os.path.basename(p))[0] for p in CONFIGS)


@pytest.mark.parametrize("form", ["{}", "{}.yaml", "configs/{}.yaml", "configs/{}"])
@pytest.mark.parametrize("name", SHIPPED)
def test_packaged_configs_resolve_from_any_directory(tmp_path, monkeypatch, form, name):
    """Before, every one of these raised FileNotFoundError outside the repository root."""
    from vispos.config import load_config, resolve_config

    monkeypatch.chdir(tmp_path)
    found = resolve_config(form.format(name))
    assert os.path.samefile(found, os.path.join(ROOT, "vispos", "configs", f"{name}.yaml"))
    with open(found) as fh:
        assert load_config(form.format(name)) == yaml.safe_load(fh)


def test_packaged_configs_lists_what_ships():
    from vispos.config import packaged_configs

    shipped = packaged_configs()
    assert list(shipped) == SHIPPED
    assert all(os.path.samefile(shipped[n], os.path.join(ROOT, "configs", f"{n}.yaml")) for n in SHIPPED)


def test_build_by_short_name_outside_the_checkout(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = build_from_config("detr_resnet50")
    assert isinstance(model, Joiner) and isinstance(model.backbone, TimmBackbone)
    assert model.position_embedding.num_pos_feats == 128 and model.strides == [32]


def test_a_file_of_yours_wins_over_a_packaged_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "detr_resnet50.yaml").write_text("type: PositionEmbeddingSine\nnum_pos_feats: 8\n")
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "detr_resnet50.yaml").write_text("type: PositionEmbeddingSine\nnum_pos_feats: 6\n")
    assert build_from_config("detr_resnet50.yaml").num_pos_feats == 8
    assert build_from_config("configs/detr_resnet50.yaml").num_pos_feats == 6
    assert isinstance(build_from_config("detr_resnet50"), Joiner)  # no file of that exact name here


@pytest.mark.parametrize(
    "name, exc, match",
    [
        ("detr_resnet51", FileNotFoundError,
         r"config file 'detr_resnet51' does not exist \(relative to '.*'\) and is not a config vispos "
         r"ships \(did you mean 'detr_resnet50', .*\?\); it ships deformable_detr_resnet50, detr_resnet18, "
         r"detr_resnet50, detr_resnet50_dc5, "
         r"dino_convnext_tiny, volume_r3d18 \(by short name"),
        ("configs/nope.yaml", FileNotFoundError, r"'configs/nope.yaml' does not exist .* it ships deformable_detr"),
        ("other/detr_resnet50.yaml", FileNotFoundError, r"'other/detr_resnet50.yaml' does not exist"),
        ("detr_resnet50.json", FileNotFoundError, r"'detr_resnet50.json' does not exist"),
        ("", FileNotFoundError, r"config file '' does not exist"),
        ("sub", IsADirectoryError, r"config file 'sub' is a directory, not a YAML file"),
        (b"detr_resnet50", TypeError, r"a config must be named by a str or PathLike, got bytes"),
    ],
)
def test_unknown_config_names_list_what_ships(tmp_path, monkeypatch, name, exc, match):
    from vispos.config import load_config, resolve_config

    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    for fn in (resolve_config, load_config):
        with pytest.raises(exc, match=match):
            fn(name)
    if not isinstance(name, bytes):
        with pytest.raises(exc, match=match):
            build_from_config(name)


def test_config_list_names_what_each_builds(tmp_path, monkeypatch, capsys):
    """``vispos config list``: one line per shipped config with what it builds, even where a
    file named like a packaged config sits in the working directory."""
    from vispos.app.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "detr_resnet50").write_text("type: PositionEmbeddingSine\n")
    assert main(["config", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == SHIPPED
    by_name = {line.split()[0]: line for line in lines}
    assert re.search(r"Joiner: TimmBackbone resnet50 \+ PositionEmbeddingSine +DETR \(Carion et al. 2020\)$",
                     by_name["detr_resnet50"])
    assert "Joiner: VolumeBackbone r3d_18 + PositionEmbeddingSine" in by_name["volume_r3d18"]
    assert "Joiner: TorchvisionBackbone resnet50 + PositionEmbeddingSine" in by_name["deformable_detr_resnet50"]
    assert "TimmBackbone convnext_tiny" in by_name["dino_convnext_tiny"]


@pytest.mark.parametrize(
    "cfg, text",
    [
        ({"type": "PositionEmbeddingSine", "num_pos_feats": 8}, "PositionEmbeddingSine"),
        ({"type": "Joiner", "backbone": {"type": "TimmBackbone", "model_name": "resnet18"},
          "position_embedding": {"type": "PositionEmbeddingSine"}},
         "Joiner: TimmBackbone resnet18 + PositionEmbeddingSine"),
        ({"type": "Summer", "penc": {"type": "PositionalEncoding2D", "channels": 8}}, "Summer: PositionalEncoding2D"),
        ({"type": "A", "items": [{"type": "B", "x": {"type": "C"}}, {"type": "D"}]}, "A: B: C + D"),
        ({"num_pos_feats": 8}, "(no 'type' key)"),
    ],
)
def test_config_builds_line(cfg, text):
    from vispos.app._config_command import builds

    assert builds(cfg) == text


def test_config_command_needs_an_action(capsys):
    from vispos.app.cli import main

    with pytest.raises(SystemExit) as info:
        main(["config"])
    assert info.value.code == 2
    assert "the following arguments are required: action" in capsys.readouterr().err


@pytest.mark.parametrize("given", ["configs/deformable_detr_resnet50.yaml", "deformable_detr_resnet50"])
def test_plot_config_by_name_outside_the_checkout(tmp_path, monkeypatch, capsys, given):
    """``vispos plot coords --config configs/...`` exited 2 outside the checkout."""
    from vispos.app.cli import main

    monkeypatch.chdir(tmp_path)
    rc = main(["plot", "coords", "--config", given, "--samples", "astronaut", "--max-size", "64",
               "--stride", "32", "--dpi", "30", "--out", "c.png"])
    assert rc == 0, capsys.readouterr().err
    assert (tmp_path / "c.png").stat().st_size > 1000


def test_cli_unknown_config_exits_2_listing_what_ships(tmp_path, monkeypatch, capsys):
    from vispos.app.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["plot", "similarity", "--config", "detr_resnet51"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vispos plot: error: config file 'detr_resnet51' does not exist") and err.count("\n") == 1
    assert "it ships deformable_detr_resnet50, detr_resnet18, detr_resnet50, detr_resnet50_dc5" in err
    assert list(tmp_path.iterdir()) == []
    from PIL import Image

    Image.new("RGB", (40, 30)).save(tmp_path / "x.png")
    assert main(["run", "--config", "nope", "--images", "x.png"]) == 2
    assert "config file 'nope' does not exist" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["x.png"]


@pytest.mark.slow
def test_command_with_a_config_name_from_an_empty_directory(tmp_path):
    """The command in a fresh process, run from a directory outside the checkout."""
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": ROOT}
    out = subprocess.run([sys.executable, "-m", "vispos.app.cli", "config", "list"], cwd=tmp_path,
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0 and out.stdout.split()[0] == SHIPPED[0], out.stderr
    out = subprocess.run([sys.executable, "-m", "vispos.app.cli", "plot", "coords", "--config", "detr_resnet50",
                          "--samples", "astronaut", "--max-size", "48", "--dpi", "30", "--out", "c.png"],
                         cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "c.png").is_file()
def test_a_renamed_keyword_still_builds_and_warns():
    """Issue 32 renamed ``SinusoidalPositionalEncoding``'s ``d_model`` to ``dim``: a config (or
    ``vispos plot --kw``) with the old key builds the same module for one release, warning."""
    import warnings

    with pytest.warns(DeprecationWarning, match=r"SinusoidalPositionalEncoding\(d_model=\.\.\.\) is deprecated.*use dim="):
        old = build_from_config({"type": "SinusoidalPositionalEncoding", "d_model": 8, "layout": "split"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = build_from_config({"type": "SinusoidalPositionalEncoding", "dim": 8, "layout": "split"})
    assert old.extra_repr() == new.extra_repr()
    with pytest.raises(ValueError, match=r"unknown keys \['d_modl'\]"):
        build_from_config({"type": "SinusoidalPositionalEncoding", "d_modl": 8})


class _NeedsTwoArgs(ValueError):
    """A constructor's own error type whose ``__init__`` does not take one message."""

    def __init__(self, value, expected):
        super().__init__(f"got {value}, expected {expected}")


class _RaisesSubclass:
    def __init__(self, value: int = 0):
        raise _NeedsTwoArgs(value, "a positive int")


def test_constructor_errors_keep_their_category_and_gain_their_place():
    """A constructor's ``TypeError`` / ``ValueError``, subclasses included, is re-raised as its
    category with where in the config it comes from, the original chained (before, a subclass
    passed through without its place: the re-raise tested ``type(exc)``)."""
    vispos.register(_RaisesSubclass, name="RaisesSubclassForTest")
    with pytest.raises(ValueError, match=r"^config \(RaisesSubclassForTest\): got 3, expected a positive int$") as info:
        build_from_config({"type": "RaisesSubclassForTest", "value": 3})
    assert type(info.value) is ValueError and isinstance(info.value.__cause__, _NeedsTwoArgs)
    with pytest.raises(TypeError, match=r"^config \(PositionEmbeddingSine\): normalize"):
        build_from_config({"type": "PositionEmbeddingSine", "normalize": "yes"})
