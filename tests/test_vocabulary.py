"""The old words of vispos' own API (docs/api-conventions.md, "One word per concept") still work
for one release: each keyword, attribute, protocol member and subclass attribute warns with a
``DeprecationWarning`` naming the new word, and gives the same result as the new word.
"""

from __future__ import annotations

import inspect

import pytest
import torch
from torch import nn
from torch.testing import assert_close

import vispos
from vispos import _deprecation
from vispos.backbones import BackboneAdapter, Joiner, backbone_border_effect, freeze_batch_norm
from vispos.invariance import rules
from vispos.nested_tensor import parse_spatial_input
from vispos.padding import resize_image_sizes


def _old(pattern: str):
    return pytest.warns(DeprecationWarning, match=pattern)


def _batch() -> vispos.NestedTensor:
    return vispos.nested_tensor_from_tensor_list([torch.rand(3, 6, 5), torch.rand(3, 4, 7)])


# ------------------------------------------------------------------------------ attributes
@pytest.mark.parametrize("make", [
    lambda: vispos.Padding.from_sizes([(2, 3)], (4, 4)),
    lambda: vispos.Padding.none(2, (3, 4, 5)),
    _batch,
    lambda: vispos.PositionEmbeddingSine(8),
    lambda: vispos.PositionEmbeddingSineDepthAdded(8),
    lambda: vispos.PositionalEncoding3D(12),
    lambda: vispos.PositionalEncodingPermute1D(12),
    lambda: vispos.PositionEmbeddingLearned(4, num_axes=1),
    lambda: vispos.AxialRotaryEmbedding(12, num_axes=3),
    lambda: vispos.backbones.VolumeBackbone(),
], ids=["padding", "padding-none", "nested", "sine", "depth-added", "grid", "grid-permute", "learned", "axial",
        "volume-backbone"])
def test_n_spatial_reads_num_axes_with_a_warning(make):
    obj = make()
    with _old(rf"{type(obj).__name__}\.n_spatial is deprecated and will be removed; use \.num_axes instead"):
        old = obj.n_spatial
    assert old == obj.num_axes


def test_learned_spatial_dims_keyword_and_attribute():
    with _old(r"PositionEmbeddingLearned\(spatial_dims=\.\.\.\) is deprecated.*use num_axes="):
        old = vispos.PositionEmbeddingLearned(4, num_embeddings=6, spatial_dims=3)
    new = vispos.PositionEmbeddingLearned(4, num_embeddings=6, num_axes=3)
    new.load_state_dict(old.state_dict())
    x = torch.zeros(2, 1, 3, 4, 5)
    assert torch.equal(old(x), new(x)) and repr(old) == repr(new)
    with _old(r"PositionEmbeddingLearned\.spatial_dims is deprecated.*use \.num_axes"):
        assert old.spatial_dims == 3
    with pytest.raises(TypeError, match=r"got both spatial_dims= \(deprecated\) and num_axes="):
        vispos.PositionEmbeddingLearned(4, spatial_dims=3, num_axes=3)


@pytest.mark.parametrize("make, axes", [
    (lambda: vispos.PositionEmbeddingSine(8), 2),
    (lambda: vispos.PositionEmbeddingSineDepthAdded(8), 3),
    (lambda: vispos.PositionEmbeddingLearned(8), 2),
    (lambda: vispos.PositionEmbeddingRandom(8), 2),
])
def test_out_channels_n_axes_keyword(make, axes):
    pe = make()
    with _old(rf"{type(pe).__name__}\.out_channels\(n_axes=\.\.\.\) is deprecated.*use num_axes="):
        old = pe.out_channels(n_axes=axes)
    assert old == pe.out_channels(num_axes=axes) == pe.out_channels(axes)


def test_random_fourier_normalize_is_frame():
    """``normalize="canvas"/"item"`` was the frame's old name; the bool ``normalize`` is DETR's."""
    batch = _batch()
    for frame in ("canvas", "item"):
        with _old(r"PositionEmbeddingRandom\(normalize=\.\.\.\) is deprecated.*use frame="):
            old = vispos.PositionEmbeddingRandom(8, normalize=frame, generator=torch.Generator().manual_seed(0))
        new = vispos.PositionEmbeddingRandom(8, frame=frame, generator=torch.Generator().manual_seed(0))
        assert torch.equal(old(batch), new(batch)) and repr(old) == repr(new)
        with _old(r"PositionEmbeddingRandom\.normalize is deprecated.*use \.frame"):
            assert old.normalize == new.frame == frame
    with _old(r"PositionEmbeddingRandom\(normalize=\.\.\.\) is deprecated.*use frame="):  # its constructor
        assert vispos.SamPositionalEmbedding(8, normalize="item").frame == "item"
    with _old("use frame="), pytest.raises(TypeError, match=r"frame must be one of \('canvas', 'item'\), got True"):
        vispos.PositionEmbeddingRandom(8, normalize=True)  # the sine's bool: refused, naming frame


def test_config_with_old_keys_builds_and_warns():
    cfg = {"type": "PositionEmbeddingRandom", "num_pos_feats": 8, "normalize": "item"}
    with _old("use frame="):
        assert vispos.build_from_config(cfg).frame == "item"
    with _old("use num_axes="):
        assert vispos.build_from_config({"type": "PositionEmbeddingLearned", "spatial_dims": 1}).num_axes == 1


# ------------------------------------------------------------------------ keyword arguments
def test_axial_rope_grid_shape_is_spatial():
    rope = vispos.AxialRotaryEmbedding(12, num_axes=3)
    x = torch.randn(2, 4, 60, 16)
    with _old(r"AxialRotaryEmbedding\.forward\(grid_shape=\.\.\.\) is deprecated.*use spatial="):
        old = rope(x, grid_shape=(3, 4, 5))
    assert torch.equal(old, rope(x, spatial=(3, 4, 5)))
    assert torch.equal(old, rope(x.unflatten(-2, (3, 4, 5))).flatten(-4, -2))


def test_parse_spatial_input_and_classify_module_n_spatial():
    x = torch.zeros(2, 4, 5)
    with _old(r"parse_spatial_input\(n_spatial=\.\.\.\) is deprecated.*use num_axes="):
        old = parse_spatial_input(x, n_spatial=1)
    assert old == parse_spatial_input(x, num_axes=1) and old.padding.spatial == (5,)
    assert rules.classify_module(nn.Conv3d(1, 1, 3))[0] == "conv"  # its unused num_axes (n_spatial) is gone


def test_freeze_batch_norm_n_spatial():
    def net():
        torch.manual_seed(0)
        return nn.Sequential(nn.Conv3d(1, 2, 1), nn.SyncBatchNorm(2)).eval()

    x = torch.randn(1, 1, 2, 3, 4)
    with _old(r"freeze_batch_norm\(n_spatial=\.\.\.\) is deprecated.*use num_axes="):
        old = freeze_batch_norm(net(), n_spatial=3)
    new = freeze_batch_norm(net(), num_axes=3)
    assert type(old[1]) is type(new[1]) is vispos.backbones.FrozenBatchNorm3d
    assert torch.equal(old(x), new(x))


def test_resize_image_sizes_and_border_effect_keywords():
    with _old(r"resize_image_sizes\(image_sizes=\.\.\.\) is deprecated.*use sizes="):
        old = resize_image_sizes(image_sizes=[(5, 3), (2, 7)], old=(8, 8), new=(4, 4))
    assert old == resize_image_sizes(sizes=[(5, 3), (2, 7)], old=(8, 8), new=(4, 4))
    backbone = vispos.backbones.TorchvisionBackbone("resnet18").eval()
    item = torch.rand(3, 40, 36, generator=torch.Generator().manual_seed(0))
    with _old(r"backbone_border_effect\(padded_size=\.\.\.\) is deprecated.*use spatial="):
        old = backbone_border_effect(backbone, item, padded_size=(64, 64))
    assert old == backbone_border_effect(backbone, item, spatial=(64, 64))


# --------------------------------------------------- protocols and subclasses with the old word
class _OldBackbone(nn.Module):
    """A user's backbone written against the protocol's old member name."""

    def __init__(self, n_spatial: int) -> None:
        super().__init__()
        self.num_channels, self.strides, self.n_spatial = [8], [1], n_spatial
        self.proj = nn.Conv2d(3, 8, 1) if n_spatial == 2 else nn.Conv3d(1, 8, 1)

    def forward(self, x):
        return [x.with_features(self.proj(x.tensors))]


def test_a_backbone_reporting_n_spatial_still_joins():
    with _old(r"_OldBackbone\.n_spatial \(the Backbone protocol\) is deprecated.*name it num_axes") as record:
        joiner = Joiner(_OldBackbone(3), vispos.PositionEmbeddingSineDepthAdded(8), hidden_dim=16, num_groups=8)
    assert all(r.filename == __file__ for r in record)  # the user's line, not vispos'
    assert joiner.num_axes == 3 and isinstance(joiner.input_proj[0][0], nn.Conv3d)
    volumes = vispos.nested_tensor_from_tensor_list([torch.rand(1, 4, 5, 6), torch.rand(1, 3, 5, 2)])
    features, pos = joiner(volumes)
    assert features[0].tensors.shape == (2, 16, 4, 5, 6) and pos[0].shape == (2, 16, 4, 5, 6)
    with _old(r"Joiner\.n_spatial is deprecated.*use \.num_axes"):
        assert joiner.n_spatial == 3


def test_subclass_setting_n_spatial_sets_num_axes():
    """A subclass body written for the old class attribute gets the new one, with a warning at
    its class statement (so a 3D adapter is not silently run as 2D)."""
    with _old(r"Volume\.n_spatial = \.\.\. is deprecated.*set num_axes instead") as record:
        class Volume(BackboneAdapter):
            n_spatial = 3

    assert Volume.num_axes == 3 and all(r.filename == __file__ for r in record)
    with _old(r"Sine3D\.n_spatial = \.\.\. is deprecated"):
        class Sine3D(vispos.PositionEmbeddingSine):
            n_spatial = 3

    with pytest.raises(ValueError, match=r"Sine3D embeds .*3 spatial axes"):
        Sine3D(8)(torch.zeros(2, 4, 5, dtype=torch.bool))
    with _old(r"Grid\.n_spatial = \.\.\. is deprecated"):
        class Grid(vispos.PositionalEncoding2D):
            n_spatial = 3

    assert Grid(12)(torch.zeros(1, 2, 3, 4, 12)).shape == (1, 2, 3, 4, 12)
    with pytest.raises(TypeError, match="sets both n_spatial .deprecated. and num_axes"):
        class Both(BackboneAdapter):
            n_spatial = num_axes = 3


def test_rewrite_step_reports_num_axes():
    """A user's invariance rule reads ``step.num_axes`` (``step.n_spatial`` warns, same value)."""
    from vispos.invariance.tracing._trace import trace_dual
    from vispos.invariance.rewrite._rewrite import make_padding_invariant

    seen = {}

    class Probe(rules.InvarianceRule):
        kind = "pointwise"

        def rewrite(self, step, node, module):
            seen["new"] = step.num_axes
            with _old(r"\.n_spatial is deprecated.*use \.num_axes"):
                seen["old"] = step.n_spatial
            step.cell_wise(node)

    class Scale(nn.Module):
        def forward(self, x):
            return 2 * x

    saved = dict(rules._book._RULES)
    try:
        vispos.register_invariance_rule(Scale, Probe())
        body = trace_dual(nn.Sequential(nn.Conv3d(1, 2, 3, padding=1), Scale()), 3)
        make_padding_invariant(body, 3)
    finally:
        rules._book._RULES.clear()
        rules._book._RULES.update(saved)
    assert seen == {"new": 3, "old": 3}


def test_deprecated_aliases_point_at_vispos_words():
    """Every deprecated attribute alias serves one of the vocabulary's words."""
    classes = [vispos.Padding, vispos.NestedTensor, vispos.PositionEmbeddingSine, vispos.PositionalEncoding2D,
               vispos.PositionEmbeddingLearned, vispos.AxialRotaryEmbedding, vispos.PositionEmbeddingRandom,
               BackboneAdapter, Joiner]
    served = {getattr(v.fget, "__deprecated_alias__", None) for c in classes for k in dir(c)
              if isinstance(v := getattr(c, k, None), property)} - {None}
    assert served == {"num_axes", "frame"}
    assert _deprecation.renamed_attribute("a", "b").fget.__deprecated_alias__ == "b"


# ------------------------------------------------------------------------------ the app's words
def test_app_position_arms_n_axes_is_num_axes():
    from vispos.app.train import BOX_OPS_2D, MaskBlindGrid, ZeroPosition, make_position_embedding

    with _old(r"MaskBlindGrid\(n_axes=\.\.\.\) is deprecated.*use num_axes="):
        old = MaskBlindGrid(8, n_axes=3)
    new = MaskBlindGrid(8, num_axes=3)
    assert repr(old) == repr(new) and "num_axes=3" in repr(new)
    with _old(r"MaskBlindGrid\.n_axes is deprecated.*use \.num_axes"):
        assert old.n_axes == 3
    with _old(r"make_position_embedding\(n_axes=\.\.\.\) is deprecated.*use num_axes="):
        grid = make_position_embedding("grid", 48, n_axes=3)
    assert grid.num_axes == 3
    for pe in (new, ZeroPosition(8)):
        with _old(rf"{type(pe).__name__}\.out_channels\(n_axes=\.\.\.\) is deprecated.*use num_axes="):
            assert pe.out_channels(n_axes=3) == pe.out_channels(num_axes=3) == 24
    with _old(r"BoxOps\.n_axes is deprecated.*use \.num_axes"):
        assert BOX_OPS_2D.n_axes == BOX_OPS_2D.num_axes == 2


def test_volume_intensity_was_normalize(tmp_path):
    """The volume loaders' ``normalize="zscore"`` is ``intensity="zscore"`` (``normalize`` is DETR's bool)."""
    nib = pytest.importorskip("nibabel")
    import numpy as np

    from vispos.app.data import load_volume, load_volumes

    path = tmp_path / "v.nii.gz"
    nib.save(nib.Nifti1Image(np.arange(60, dtype=np.float32).reshape(3, 4, 5), np.eye(4)), path)
    for mode in ("minmax", None):
        with _old(r"load_volume\(normalize=\.\.\.\) is deprecated.*use intensity="):
            old = load_volume(path, normalize=mode)
        assert torch.equal(old, load_volume(path, intensity=mode))
    with _old(r"load_volumes\(normalize=\.\.\.\) is deprecated.*use intensity="):
        assert torch.equal(load_volumes([path], normalize="minmax")[0], load_volume(path, intensity="minmax"))
    with pytest.raises(ValueError, match=r"intensity must be one of .* got 'foo'"):
        load_volume(path, intensity="foo")


def test_volume_intensity_flag_was_normalize():
    from vispos.app.cli import _parser

    argv = ["run", "--volumes", "a.nii.gz"]
    assert _parser().parse_args(argv + ["--intensity", "minmax"]).intensity == "minmax"
    with pytest.warns(FutureWarning, match=r"--normalize is deprecated.*use --intensity"):
        assert _parser().parse_args(argv + ["--normalize", "zscore"]).intensity == "zscore"
    assert _parser().parse_args(argv).intensity == "percentile"


def test_figures_imagenet_normalized_was_normalized():
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from vispos.app.figures import plot_padded_batch

    with _old(r"plot_padded_batch\(normalized=\.\.\.\) is deprecated.*use imagenet_normalized="):
        fig = plot_padded_batch(_batch(), normalized=False)
    plt.close(fig)
    plt.close(plot_padded_batch(_batch(), imagenet_normalized=False))


# ----------------------------------------------------------- the scan of every public signature
#: the packages whose public names (``__all__``) speak vispos' vocabulary: the core and the app
SCANNED_PACKAGES = (
    "vispos", "vispos.encodings", "vispos.backbones", "vispos.padding", "vispos.invariance", "vispos.monai",
    "vispos.config", "vispos.nested_tensor", "vispos.levels", "vispos.batching", "vispos.transformer",
    "vispos.app.data", "vispos.app.figures", "vispos.app.train", "vispos.app.png",
)
#: the number of spatial axes is ``num_axes``; these synonyms fail the scan
AXIS_SYNONYMS = {"n_spatial", "n_axes", "spatial_dims"}
#: ``name -> (words, peer)``: a drop-in that keeps its peer's word for the number of axes
AXIS_DROP_INS = {
    "monai_sincos": ({"spatial_dims"}, "MONAI build_sincos_position_embedding(grid_size, embed_dim, "
                     "spatial_dims, temperature)"),
    "monai_fourier": ({"spatial_dims"}, "MONAI build_fourier_position_embedding(grid_size, embed_dim, "
                      "spatial_dims, scales)"),
}
#: ``name -> (word, peer)``: a ``normaliz*`` word other than DETR's bool ``normalize``, kept from a peer
NORMALIZE_ALLOWED = {
    "DinoV3RotaryEmbedding": ("normalize_coords", "timm RotaryEmbeddingDinoV3(normalize_coords='separate')"),
}
#: ``word -> peer``: a ``normaliz*`` word that names another thing than positions, in its peer's words
NORMALIZE_PEER_WORDS = {
    "normalize_before": "DETR models/transformer.py TransformerEncoderLayer(normalize_before): LayerNorm first",
}


def _scanned_objects() -> dict[str, object]:
    """``"module.name" -> object`` for every public callable and class of :data:`SCANNED_PACKAGES`."""
    import importlib

    out = {}
    for package in SCANNED_PACKAGES:
        module = importlib.import_module(package)
        for name in module.__all__:
            obj = getattr(module, name)
            if callable(obj):
                out[f"{package}.{name}"] = obj
    return out


def _signature_params(func) -> dict[str, inspect.Parameter]:
    try:
        return dict(inspect.signature(func).parameters)
    except (TypeError, ValueError):  # a builtin without a signature
        return {}


def _public_words(obj) -> dict[str, inspect.Parameter | None]:
    """Every name ``obj`` shows a caller: its signature's parameters (a class: ``__init__``), and
    for a class also its public methods' parameters and its (and its vispos bases') public class
    attributes and annotations (dataclass fields). Deprecated aliases are left out. A word maps to
    its ``inspect.Parameter`` where it is one, else None."""
    words: dict[str, inspect.Parameter | None] = dict(_signature_params(obj))
    if inspect.isclass(obj):
        for klass in obj.__mro__:
            if not klass.__module__.startswith("vispos"):
                continue
            for attr in getattr(klass, "__annotations__", {}):
                words.setdefault(attr, None) if not attr.startswith("_") else None
            for attr, value in vars(klass).items():
                if attr.startswith("_") and attr != "__call__":
                    continue
                if getattr(getattr(value, "fget", None), "__deprecated_alias__", None):
                    continue  # a renamed_attribute: the old name, kept for one release
                words.setdefault(attr, None) if not attr.startswith("_") else None
                func = getattr(value, "__func__", value)
                if callable(func) and not inspect.isclass(func):
                    for p, param in _signature_params(func).items():
                        words.setdefault(p, param)
    words.pop("self", None), words.pop("cls", None)
    return words


def _vocabulary_faults(objects: dict[str, object]) -> list[str]:
    """What the scan refuses: ``"name: word"`` for a synonym of ``num_axes`` (outside
    :data:`AXIS_DROP_INS`), a ``normalize`` that is not a bool by default, and another
    ``normaliz*`` word (outside :data:`NORMALIZE_ALLOWED`)."""
    faults = []
    for qualname, obj in objects.items():
        name = qualname.rpartition(".")[2]
        for word, param in _public_words(obj).items():
            if word in AXIS_SYNONYMS and word not in AXIS_DROP_INS.get(name, (set(),))[0]:
                faults.append(f"{qualname}: {word}")
            elif word == "normalize":
                if param is not None and not isinstance(param.default, bool):
                    faults.append(f"{qualname}: normalize={param.default!r}")
            elif (word.startswith("normaliz") and word not in NORMALIZE_PEER_WORDS
                  and NORMALIZE_ALLOWED.get(name, ("",))[0] != word):
                faults.append(f"{qualname}: {word}")
    return sorted(set(faults))


def test_every_public_signature_says_num_axes_and_a_bool_normalize():
    """No public callable or class of :data:`SCANNED_PACKAGES` takes or shows ``n_spatial``,
    ``n_axes`` or ``spatial_dims`` (except a listed drop-in, with its peer), nor a ``normalize``
    that is not DETR's bool, nor another ``normaliz*`` word (except a listed peer's)."""
    objects = _scanned_objects()
    assert len(objects) > 100
    assert _vocabulary_faults(objects) == []


def test_the_allow_lists_are_not_stale():
    """Each allow-listed word is one its object really takes (so the lists cannot grow by habit)."""
    objects = {q.rpartition(".")[2]: o for q, o in _scanned_objects().items()}
    for name, (words, _peer) in AXIS_DROP_INS.items():
        assert words <= set(_public_words(objects[name])), name
    for name, (word, _peer) in NORMALIZE_ALLOWED.items():
        assert word in _public_words(objects[name]), name


def test_the_scan_fails_on_each_old_word():
    """The scan catches a keyword, a method argument, a class attribute, a dataclass field, a
    string ``normalize`` and another ``normaliz*`` word; the allow-lists let only their own words by."""
    from dataclasses import dataclass

    class Encoder(nn.Module):
        n_spatial = 2

        def __init__(self, n_axes: int = 2, normalize: str = "zscore") -> None:
            super().__init__()

        def out_channels(self, spatial_dims: int) -> int:  # pragma: no cover - only its signature is read
            return spatial_dims

    @dataclass
    class Ops:
        n_axes: int

    def plot(batch, normalized: bool = True):  # pragma: no cover - only its signature is read
        """A figure."""

    def monai_sincos(grid_size, embed_dim, spatial_dims=2, normalized=False):  # pragma: no cover
        """An allow-listed name."""

    Encoder.__module__ = Ops.__module__ = plot.__module__ = "vispos.stray"
    objects = {"m.Encoder": Encoder, "m.Ops": Ops, "m.plot": plot, "m.monai_sincos": monai_sincos}
    assert _vocabulary_faults(objects) == [
        "m.Encoder: n_axes", "m.Encoder: n_spatial", "m.Encoder: normalize='zscore'", "m.Encoder: spatial_dims",
        "m.Ops: n_axes", "m.monai_sincos: normalized", "m.plot: normalized",
    ]
