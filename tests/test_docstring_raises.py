"""Docstrings true to the code (issue 19, item 4): for every public class of ``vispos``,
``vispos.backbones`` and ``vispos.transformer``, the exception types its docstring's ``Raises:``
section names are each raised by some bad input (construction, call or indexing), and every bad
input in the table raises only documented types. A class added without a row here fails
``test_every_public_class_has_a_table``; a docstring that promises ``ValueError`` where the code
raises ``TypeError`` (the old ``grid._CLASS_DOC`` drift) fails ``test_bad_inputs_raise_only_documented_types``.
"""

from __future__ import annotations

import builtins
import inspect
import re
from collections.abc import Callable

import pytest
import torch
from torch import nn

import vispos
import vispos.backbones as bb
import vispos.transformer as tr

try:
    import vispos.monai as vm
except ImportError:  # the monai extra is not installed: its classes are not checked
    vm = None

MODULES = (vispos, bb, tr) + ((vm,) if vm is not None else ())

#: public classes with no constructor checks to document: why each is left out
EXEMPT = {
    "CacheInfo": "a plain named tuple of statistics, never built from user input",
    "FlatLevels": "a named tuple of tensors returned by Joiner.flatten",
    "Backbone": "a typing.Protocol (no constructor)",
    "SpatialPositionEmbedding": "a typing.Protocol (no constructor)",
}

_ENTRY = re.compile(r"^    ([A-Z]\w*(?:\s*[,/]\s*[A-Z]\w*)*)\s*:", re.M)


def documented_raises(cls: type) -> set[type]:
    """The exception classes named in ``cls``'s ``Raises:`` section (``A / B: ...`` and
    ``A, B: ...`` entries name several)."""
    doc = inspect.getdoc(cls) or ""
    match = re.search(r"^Raises:\n((?:[ \t]+\S.*\n?|[ \t]*\n)*)", doc, re.M)
    if match is None:
        return set()
    out = set()
    for entry in _ENTRY.findall(match.group(1)):
        for name in re.split(r"\s*[,/]\s*", entry):
            exc = getattr(builtins, name, None)
            assert isinstance(exc, type) and issubclass(exc, BaseException), (
                f"{cls.__name__}'s Raises names {name!r}, which is not a built-in exception"
            )
            out.add(exc)
    return out


def _public_classes() -> dict[str, type]:
    out = {}
    for mod in MODULES:
        for name in mod.__all__:
            obj = getattr(mod, name)
            if inspect.isclass(obj):
                out[name] = obj
    return out


# ---------------------------------------------------------------------------------- inputs
def _nt(*sizes, c=3):
    return vispos.nested_tensor_from_tensor_list([torch.rand(c, *s) for s in sizes])


def _mask(*shape):
    return torch.zeros(shape, dtype=torch.bool)


_BACKBONES: dict[str, nn.Module] = {}


def _backbone(kind: str) -> nn.Module:
    """One small backbone per kind, built once (construction runs a probe forward)."""
    if kind not in _BACKBONES:
        _BACKBONES[kind] = {
            "timm": lambda: bb.TimmBackbone("resnet18", out_indices=(3, 4)),
            "torchvision": lambda: bb.TorchvisionBackbone("resnet18", return_interm_layers=True),
            "volume": lambda: bb.VolumeBackbone("r3d_18", return_nodes=["layer1"]),
        }[kind]()
    return _BACKBONES[kind]


Case = tuple[str, Callable[[], object]]

def _grid(cls, n: int, first: bool) -> list[Case]:
    shape = (1, 8, *([3] * n)) if first else (1, *([3] * n), 8)
    return [
        ("channels str", lambda: cls("8")),
        ("channels zero", lambda: cls(0)),
        ("dtype_override int", lambda: cls(8, torch.int32)),
        ("input not tensor", lambda: cls(8)("x")),
        ("input rank", lambda: cls(8)(torch.zeros(shape[1:]))),
        ("input int dtype", lambda: cls(8)(torch.zeros(shape, dtype=torch.int64))),
    ]


TABLE: dict[str, list[Case]] = {
    "CellWise": [("alias not bool", lambda: vispos.CellWise(alias=1))],
    "PaddingAware": [("fn not callable", lambda: vispos.PaddingAware("item_mean"))],
    "Refuse": [("why not str", lambda: vispos.Refuse(3))],
    "RuleBook": [("key an instance", lambda: vispos.RuleBook().register(torch.nn.Hardtanh(0.5, 2), vispos.CellWise())),
                 ("rule not a rule", lambda: vispos.RuleBook().register(torch.nn.ReLU, "cell-wise"))],
    "NestedTensor": [
        ("tensors not tensor", lambda: vispos.NestedTensor([[1.0]], None)),
        ("mask not bool", lambda: vispos.NestedTensor(torch.zeros(1, 3, 4, 4), torch.zeros(1, 4, 4))),
        ("tensors 2-D", lambda: vispos.NestedTensor(torch.zeros(3, 4), None)),
        ("mask shape", lambda: vispos.NestedTensor(torch.zeros(1, 3, 4, 4), _mask(1, 4, 5))),
        ("index out of range", lambda: _nt((4, 4))[3]),
        ("index not int", lambda: _nt((4, 4))["a"]),
        ("sizes disagree with mask", lambda: vispos.NestedTensor(torch.zeros(1, 3, 4, 5), _mask(1, 4, 5), [(2, 3)], rectangular=True)),
        ("rectangular not bool", lambda: vispos.NestedTensor(torch.zeros(1, 3, 4, 5), None, rectangular=1)),
    ],
    "Padding": [
        ("called directly", lambda: vispos.Padding()),
        ("sizes do not fit", lambda: vispos.Padding.from_sizes([(5, 2)], (4, 4))),
        ("sizes floats", lambda: vispos.Padding.from_sizes([(2.0, 2)], (4, 4))),
        ("mask not bool", lambda: vispos.Padding.from_mask(torch.zeros(1, 4, 4))),
        ("mask rank", lambda: vispos.Padding.from_mask(_mask(1, 2, 2, 2, 2))),
        ("resize to 0", lambda: vispos.Padding.none(1, (4, 4)).resize((0, 2))),
        ("to copy int", lambda: vispos.Padding.none(1, (4, 4)).to(copy=1)),
    ],
    "PaddedCollate": [
        ("size_divisibility float", lambda: vispos.PaddedCollate(size_divisibility=2.0)),
        ("size_divisibility negative", lambda: vispos.PaddedCollate(size_divisibility=-1)),
        ("pad_value str", lambda: vispos.PaddedCollate(pad_value="0")),
        ("batch not list", lambda: vispos.PaddedCollate()(torch.zeros(2, 3, 4, 4))),
        ("empty batch", lambda: vispos.PaddedCollate()([])),
        ("pair of 3", lambda: vispos.PaddedCollate()([(torch.zeros(3, 4, 4), {}, 1)])),
    ],
    "PositionEmbeddingSine": [
        ("num_pos_feats float", lambda: vispos.PositionEmbeddingSine(8.0)),
        ("num_pos_feats odd", lambda: vispos.PositionEmbeddingSine(7)),
        ("scale without normalize", lambda: vispos.PositionEmbeddingSine(8, scale=1.0)),
        ("temperature zero", lambda: vispos.PositionEmbeddingSine(8, temperature=0)),
        ("mask uint8", lambda: vispos.PositionEmbeddingSine(8)(torch.zeros(1, 4, 4, dtype=torch.uint8))),
        ("input list", lambda: vispos.PositionEmbeddingSine(8)([[True]])),
        ("mask rank", lambda: vispos.PositionEmbeddingSine(8)(_mask(4))),
        ("dtype int", lambda: vispos.PositionEmbeddingSine(8)(_mask(1, 4, 4), dtype=torch.int32)),
        ("extent without normalize", lambda: vispos.PositionEmbeddingSine(8, extent=10.0)),
        ("spacing int", lambda: vispos.PositionEmbeddingSine(8)(_mask(1, 4, 4), spacing=torch.ones(1, 2, dtype=torch.int64))),
        ("spacing shape", lambda: vispos.PositionEmbeddingSine(8)(_mask(1, 4, 4), spacing=torch.ones(1, 3))),
        ("spacing zero", lambda: vispos.PositionEmbeddingSine(8)(_mask(1, 4, 4), spacing=torch.zeros(1, 2))),
    ],
    "PositionEmbeddingSineDepthAdded": [
        ("num_pos_feats float", lambda: vispos.PositionEmbeddingSineDepthAdded(8.0)),
        ("num_pos_feats odd", lambda: vispos.PositionEmbeddingSineDepthAdded(7)),
        ("normalize int", lambda: vispos.PositionEmbeddingSineDepthAdded(8, normalize=1)),
        ("eps negative", lambda: vispos.PositionEmbeddingSineDepthAdded(8, eps=-1.0)),
        ("feature map 2D", lambda: vispos.PositionEmbeddingSineDepthAdded(8)(torch.zeros(1, 2, 4, 4))),
        ("mask 2D", lambda: vispos.PositionEmbeddingSineDepthAdded(8)(_mask(1, 4, 4))),
        ("mask uint8", lambda: vispos.PositionEmbeddingSineDepthAdded(8)(torch.zeros(1, 2, 4, 4, dtype=torch.uint8))),
    ],
    "PositionEmbeddingRandom": [
        ("num_pos_feats float", lambda: vispos.PositionEmbeddingRandom(8.0)),
        ("scale zero", lambda: vispos.PositionEmbeddingRandom(8, 0.0)),
        ("num_axes 4", lambda: vispos.PositionEmbeddingRandom(8, num_axes=4)),
        ("normalize unknown", lambda: vispos.PositionEmbeddingRandom(8, normalize="batch")),
        ("align_corners int", lambda: vispos.PositionEmbeddingRandom(8, align_corners=1)),
        ("size 3 for 2 axes", lambda: vispos.PositionEmbeddingRandom(8)((4, 4, 4))),
        ("input list", lambda: vispos.PositionEmbeddingRandom(8)(["a"])),
        ("mask 3D for 2 axes", lambda: vispos.PositionEmbeddingRandom(8)(_mask(1, 2, 3, 4))),
        ("spacing shape", lambda: vispos.PositionEmbeddingRandom(8)(_mask(1, 4, 4), spacing=torch.ones(1, 3))),
        ("coords width", lambda: vispos.PositionEmbeddingRandom(8).forward_with_coords(torch.zeros(2, 3), (4, 4))),
    ],
    "SamPositionalEmbedding": [
        ("num_pos_feats zero", lambda: vispos.SamPositionalEmbedding(0)),
        ("coord_order unknown", lambda: vispos.SamPositionalEmbedding(8, coord_order="yx")),
        ("input_coords list", lambda: vispos.SamPositionalEmbedding(8)([[0.5, 0.5]])),
        ("input_coords width", lambda: vispos.SamPositionalEmbedding(8)(torch.zeros(2, 3))),
    ],
    "PositionEmbeddingLearned": [
        ("num_pos_feats str", lambda: vispos.PositionEmbeddingLearned("8")),
        ("num_embeddings zero", lambda: vispos.PositionEmbeddingLearned(8, 0)),
        ("num_axes str", lambda: vispos.PositionEmbeddingLearned(8, num_axes="2")),
        ("num_axes 4", lambda: vispos.PositionEmbeddingLearned(8, num_axes=4)),
        ("interpolate int", lambda: vispos.PositionEmbeddingLearned(8, interpolate=1)),
        ("input list", lambda: vispos.PositionEmbeddingLearned(8, 10)([[True]])),
        ("too long", lambda: vispos.PositionEmbeddingLearned(8, 4)(_mask(1, 5, 5))),
    ],
    **{
        name: _grid(getattr(vispos, name), n, "Permute" in name)
        for name, n in [
            ("PositionalEncoding1D", 1), ("PositionalEncoding2D", 2), ("PositionalEncoding3D", 3),
            ("PositionalEncodingPermute1D", 1), ("PositionalEncodingPermute2D", 2),
            ("PositionalEncodingPermute3D", 3),
        ]
    },
    "Summer": [
        ("encoding not module", lambda: vispos.Summer(lambda x: x)),
        ("shape mismatch", lambda: vispos.Summer(vispos.PositionalEncoding2D(8))(torch.zeros(1, 3, 4, 6))),
    ],
    "FixEncoding": [
        ("encoding not grid", lambda: vispos.FixEncoding(nn.Identity(), (3, 4))),
        ("shape str", lambda: vispos.FixEncoding(vispos.PositionalEncoding2D(8), "ab")),
        ("shape wrong length", lambda: vispos.FixEncoding(vispos.PositionalEncoding2D(8), (3,))),
        ("input not tensor", lambda: vispos.FixEncoding(vispos.PositionalEncoding2D(8), (3, 4))("x")),
        ("input shape", lambda: vispos.FixEncoding(vispos.PositionalEncoding2D(8), (3, 4))(torch.zeros(1, 3, 5, 8))),
    ],
    "SinusoidalPositionalEncoding": [
        ("dim float", lambda: vispos.SinusoidalPositionalEncoding(8.0)),
        ("dim odd", lambda: vispos.SinusoidalPositionalEncoding(7)),
        ("dropout str", lambda: vispos.SinusoidalPositionalEncoding(8, dropout="0.1")),
        ("dropout 1", lambda: vispos.SinusoidalPositionalEncoding(8, dropout=1.0)),
        ("layout unknown", lambda: vispos.SinusoidalPositionalEncoding(8, layout="zigzag")),
        ("batch_first int", lambda: vispos.SinusoidalPositionalEncoding(8, batch_first=1)),
        ("x int", lambda: vispos.SinusoidalPositionalEncoding(8)(torch.zeros(1, 4, 8, dtype=torch.int64))),
        ("x width", lambda: vispos.SinusoidalPositionalEncoding(8)(torch.zeros(1, 4, 6))),
    ],
    "LearnableSinusoidalPositionalEncoding": [
        ("hidden_dim float", lambda: vispos.LearnableSinusoidalPositionalEncoding(8, hidden_dim=4.0)),
        ("hidden_dim zero", lambda: vispos.LearnableSinusoidalPositionalEncoding(8, hidden_dim=0)),
        ("dropout str", lambda: vispos.LearnableSinusoidalPositionalEncoding(8, dropout="0.1")),
        ("dropout negative", lambda: vispos.LearnableSinusoidalPositionalEncoding(8, dropout=-0.1)),
    ],
    "SpeechainPositionalEncoding": [
        ("posenc_type int", lambda: vispos.SpeechainPositionalEncoding(1)),
        ("posenc_type unknown", lambda: vispos.SpeechainPositionalEncoding("sin")),
        ("d_model odd", lambda: vispos.SpeechainPositionalEncoding("mix", 7)),
        ("dropout str", lambda: vispos.SpeechainPositionalEncoding("mix", 8, dropout="0.1")),
        ("dropout 1", lambda: vispos.SpeechainPositionalEncoding("mix", 8, dropout=1.0)),
        ("emb_feat int", lambda: vispos.SpeechainPositionalEncoding("mix", 8)(torch.zeros(1, 4, 8, dtype=torch.int64))),
        ("emb_feat width", lambda: vispos.SpeechainPositionalEncoding("mix", 8)(torch.zeros(1, 4, 6))),
    ],
    "CoordSineEmbedding": [
        ("num_coords str", lambda: vispos.CoordSineEmbedding("4")),
        ("d_model zero", lambda: vispos.CoordSineEmbedding(4, 0)),
        ("scale str", lambda: vispos.CoordSineEmbedding(4, 32, scale="2pi")),
        ("coords int", lambda: vispos.CoordSineEmbedding(4, 32)(torch.zeros(2, 4, dtype=torch.int64))),
        ("coords width", lambda: vispos.CoordSineEmbedding(4, 32)(torch.zeros(2, 3))),
    ],
    "RotaryEmbedding": [
        ("dim float", lambda: vispos.RotaryEmbedding(8.0)),
        ("dim odd", lambda: vispos.RotaryEmbedding(7)),
        ("theta zero", lambda: vispos.RotaryEmbedding(8, theta=0)),
        ("x int", lambda: vispos.RotaryEmbedding(8)(torch.zeros(4, 8, dtype=torch.int64))),
        ("x narrow", lambda: vispos.RotaryEmbedding(8)(torch.zeros(4, 6))),
    ],
    "AxialRotaryEmbedding": [
        ("num_axes str", lambda: vispos.AxialRotaryEmbedding(16, num_axes="2")),
        ("num_axes 4", lambda: vispos.AxialRotaryEmbedding(16, num_axes=4)),
        ("spatial floats", lambda: vispos.AxialRotaryEmbedding(8)(torch.zeros(6, 8), spatial=(2.0, 3))),
        ("spatial product", lambda: vispos.AxialRotaryEmbedding(8)(torch.zeros(6, 8), spatial=(2, 4))),
    ],
    "DinoV3RotaryEmbedding": [
        ("dim odd multiple", lambda: vispos.DinoV3RotaryEmbedding(30)),
        ("dim float", lambda: vispos.DinoV3RotaryEmbedding(32.0)),
        ("one period", lambda: vispos.DinoV3RotaryEmbedding(32, min_period=1.0)),
        ("normalize_coords int", lambda: vispos.DinoV3RotaryEmbedding(32, normalize_coords=1)),
        ("jitter below 1", lambda: vispos.DinoV3RotaryEmbedding(32, jitter_coords=0.5)),
        ("mask float", lambda: vispos.DinoV3RotaryEmbedding(32).get_embed(mask=torch.zeros(1, 4, 4))),
        ("mask 3D for 2 axes", lambda: vispos.DinoV3RotaryEmbedding(32).get_embed(mask=_mask(1, 2, 3, 4))),
        ("x int", lambda: vispos.DinoV3RotaryEmbedding(8)(torch.zeros(1, 8, 3, 3, dtype=torch.int64))),
    ],
    "MixedRotaryEmbedding": [
        ("dim not divisible", lambda: vispos.MixedRotaryEmbedding(64, 2, 3)),
        ("depth float", lambda: vispos.MixedRotaryEmbedding(64, 2.0, 4)),
        ("head_dim odd axes", lambda: vispos.MixedRotaryEmbedding(24, 2, 4)),
        ("grid_indexing int", lambda: vispos.MixedRotaryEmbedding(64, 2, 4, grid_indexing=0)),
        ("shape rank", lambda: vispos.MixedRotaryEmbedding(64, 2, 4).get_embed([2, 2, 2])),
        ("block_index out of range", lambda: vispos.MixedRotaryEmbedding(32, 2, 2)(torch.zeros(1, 32, 2, 2), 2)),
    ],
    "FrozenBatchNorm3d": [
        ("num_features float", lambda: bb.FrozenBatchNorm3d(4.0)),
        ("num_features zero", lambda: bb.FrozenBatchNorm3d(0)),
        ("input 4-D", lambda: bb.FrozenBatchNorm3d(4)(torch.zeros(1, 4, 3, 3))),
    ],
    "BackboneAdapter": [
        ("x not NestedTensor", lambda: _backbone("torchvision")(torch.zeros(1, 3, 32, 32))),
        ("x channels", lambda: _backbone("torchvision")(_nt((32, 32), c=1))),
    ],
    "TimmBackbone": [
        ("model_name int", lambda: bb.TimmBackbone(18)),
        ("out_indices int", lambda: bb.TimmBackbone("resnet18", out_indices=4)),
        ("unknown model", lambda: bb.TimmBackbone("resnet_does_not_exist")),
        ("in_chans zero", lambda: bb.TimmBackbone("resnet18", in_chans=0)),
        ("missing checkpoint", lambda: bb.TimmBackbone("resnet18", checkpoint_path="/nonexistent/ckpt.pt")),
        ("x not NestedTensor", lambda: _backbone("timm")(torch.zeros(1, 3, 32, 32))),
        ("x channels", lambda: _backbone("timm")(_nt((32, 32), c=1))),
    ],
    "TorchvisionBackbone": [
        ("name_or_model int", lambda: bb.TorchvisionBackbone(3)),
        ("dilation int", lambda: bb.TorchvisionBackbone("resnet18", dilation=1)),
        ("unknown model", lambda: bb.TorchvisionBackbone("resnet_does_not_exist")),
        ("missing checkpoint", lambda: bb.TorchvisionBackbone("resnet18", checkpoint_path="/nonexistent/ckpt.pt")),
        ("x not NestedTensor", lambda: _backbone("torchvision")(torch.zeros(1, 3, 32, 32))),
    ],
    "VolumeBackbone": [
        ("name_or_model int", lambda: bb.VolumeBackbone(3)),
        ("stem_stride floats", lambda: bb.VolumeBackbone(stem_stride=(1, 2.0, 2))),
        ("stem_stride length", lambda: bb.VolumeBackbone(stem_stride=(1, 2))),
        ("unknown name", lambda: bb.VolumeBackbone("resnet18")),
        ("missing checkpoint", lambda: bb.VolumeBackbone(return_nodes=["layer1"], checkpoint_path="/nonexistent/c.pt")),
        ("x 2D", lambda: _backbone("volume")(_nt((16, 16), c=1))),
    ],
    "Joiner": [
        ("backbone not module", lambda: bb.Joiner("resnet", vispos.PositionEmbeddingSine(32))),
        ("hidden_dim float", lambda: bb.Joiner(_backbone("timm"), vispos.PositionEmbeddingSine(32), hidden_dim=64.0)),
        ("levels without hidden_dim", lambda: bb.Joiner(_backbone("timm"), vispos.PositionEmbeddingSine(32), num_feature_levels=3)),
    ],
    "SimpleFeaturePyramid": [
        ("in_channels float", lambda: bb.SimpleFeaturePyramid(16.0, 8)),
        ("scale unknown", lambda: bb.SimpleFeaturePyramid(16, 8, scale_factors=(3.0,))),
        ("in_channels odd for scale 2", lambda: bb.SimpleFeaturePyramid(15, 8, scale_factors=(2.0,))),
        ("top_block int", lambda: bb.SimpleFeaturePyramid(16, 8, top_block=1)),
        ("x tensor", lambda: bb.SimpleFeaturePyramid(16, 8)(torch.zeros(1, 16, 4, 4))),
        ("x channels", lambda: bb.SimpleFeaturePyramid(16, 8)(_nt((4, 4), c=8))),
    ],
    "ChannelLayerNorm": [
        ("num_channels float", lambda: bb.ChannelLayerNorm(4.0)),
        ("num_channels zero", lambda: bb.ChannelLayerNorm(0)),
    ],
    "DetrEncoderLayer": [
        ("d_model float", lambda: tr.DetrEncoderLayer(16.0)),
        ("nhead does not divide", lambda: tr.DetrEncoderLayer(16, nhead=3)),
        ("dropout str", lambda: tr.DetrEncoderLayer(16, nhead=4, dropout="0.1")),
        ("dropout 1", lambda: tr.DetrEncoderLayer(16, nhead=4, dropout=1.0)),
        ("activation int", lambda: tr.DetrEncoderLayer(16, nhead=4, activation=1)),
        ("activation unknown", lambda: tr.DetrEncoderLayer(16, nhead=4, activation="tanh")),
        ("src list", lambda: tr.DetrEncoderLayer(16, nhead=4)([[0.0]])),
        ("mask float", lambda: tr.DetrEncoderLayer(16, nhead=4)(torch.zeros(1, 5, 16), key_padding_mask=torch.zeros(1, 5))),
        ("src width", lambda: tr.DetrEncoderLayer(16, nhead=4)(torch.zeros(1, 5, 8))),
    ],
    "DetrEncoder": [
        ("num_layers float", lambda: tr.DetrEncoder(16, nhead=4, num_layers=1.0)),
        ("num_layers zero", lambda: tr.DetrEncoder(16, nhead=4, num_layers=0)),
        ("dropout str", lambda: tr.DetrEncoder(16, nhead=4, num_layers=1, dropout="0.1")),
        ("src width", lambda: tr.DetrEncoder(16, nhead=4, num_layers=1)(torch.zeros(1, 5, 8))),
    ],
}


def _old_monai(build: Callable[[], object]) -> Callable[[], object]:
    """``build`` run as if MONAI were older than 1.5 (no ``attn_mask`` in its attention blocks)."""

    def run():
        from unittest import mock

        with mock.patch("vispos.monai._anysize._supports_attn_mask", return_value=False):
            return build()

    return run


if vm is not None:
    _VIT = dict(in_channels=1, img_size=8, patch_size=4, hidden_size=12, mlp_dim=8, num_layers=1, num_heads=2)
    _UNETR = dict(in_channels=1, out_channels=2, img_size=16, feature_size=2, hidden_size=12, mlp_dim=8, num_heads=2)
    TABLE.update({
        "NestedPadCollate": [
            ("keys empty", lambda: vm.NestedPadCollate(keys=[])),
            ("method unknown", lambda: vm.NestedPadCollate(method="center")),
            ("size_divisibility float", lambda: vm.NestedPadCollate(size_divisibility=2.0)),
            ("size_divisibility negative", lambda: vm.NestedPadCollate(size_divisibility=-1)),
            ("batch a dict", lambda: vm.NestedPadCollate()({"image": torch.zeros(1, 2, 2)})),
            ("empty batch", lambda: vm.NestedPadCollate()([])),
            ("missing key", lambda: vm.NestedPadCollate()([{"img": torch.zeros(1, 2, 2)}])),
            ("image a list", lambda: vm.NestedPadCollate()([{"image": [1.0]}])),
            ("channels differ", lambda: vm.NestedPadCollate()([{"image": torch.zeros(1, 2, 2)}, {"image": torch.zeros(2, 2, 2)}])),
        ],
        "AnySizeViT": [
            ("pos_embed unknown", lambda: vm.AnySizeViT(**_VIT, pos_embed="table")),
            ("antialias int", lambda: vm.AnySizeViT(**_VIT, antialias=1)),
            ("from_monai not a ViT", lambda: vm.AnySizeViT.from_monai(nn.Linear(2, 2))),
            ("input list", lambda: vm.AnySizeViT(**_VIT)([[0.0]])),
            ("input 2D", lambda: vm.AnySizeViT(**_VIT)(torch.zeros(1, 1, 8, 8))),
            ("MONAI < 1.5", _old_monai(lambda: vm.AnySizeViT(**_VIT))),
        ],
        "AnySizeUNETR": [
            ("pos_embed unknown", lambda: vm.AnySizeUNETR(**_UNETR, pos_embed="table")),
            ("temperature zero", lambda: vm.AnySizeUNETR(**_UNETR, temperature=0)),
            ("from_monai not a UNETR", lambda: vm.AnySizeUNETR.from_monai(nn.Linear(2, 2))),
            ("input list", lambda: vm.AnySizeUNETR(**_UNETR)([[0.0]])),
            ("input 2D", lambda: vm.AnySizeUNETR(**_UNETR)(torch.zeros(1, 1, 16, 16))),
            ("MONAI < 1.5", _old_monai(lambda: vm.AnySizeUNETR(**_UNETR))),
        ],
    })

ROWS = [(cls_name, case, fn) for cls_name, cases in TABLE.items() for case, fn in cases]


#: messages of Python's own call errors: a row that trips one tests the table, not the code
_NOT_OURS = ("positional argument", "unexpected keyword argument", "object is not callable", "has no attribute")


def _raised(fn: Callable[[], object]) -> type[BaseException] | None:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the type is what is checked
        assert not any(s in str(exc) for s in _NOT_OURS), f"the row itself is broken: {exc!r}"
        return type(exc)
    return None


def test_every_public_class_has_a_table():
    classes = _public_classes()
    missing = sorted(set(classes) - set(TABLE) - set(EXEMPT))
    assert not missing, f"public classes without bad-input rows (add them to TABLE or EXEMPT): {missing}"
    assert not set(TABLE) & set(EXEMPT)
    stale = sorted((set(TABLE) | set(EXEMPT)) - set(classes))
    assert not stale, f"rows for names that are no longer public classes: {stale}"
    for name in TABLE:
        assert documented_raises(classes[name]), f"{name}'s docstring has no Raises section"


@pytest.mark.parametrize("cls_name, case, fn", ROWS, ids=[f"{c}/{k}" for c, k, _ in ROWS])
def test_bad_inputs_raise_only_documented_types(cls_name, case, fn):
    documented = documented_raises(_public_classes()[cls_name])
    raised = _raised(fn)
    assert raised is not None, f"{cls_name}: {case!r} raised nothing"
    assert issubclass(raised, tuple(documented)), (
        f"{cls_name}: {case!r} raised {raised.__name__}, but its docstring documents only "
        f"{sorted(e.__name__ for e in documented)}"
    )


@pytest.mark.parametrize("cls_name", sorted(TABLE))
def test_every_documented_type_is_raised(cls_name):
    documented = documented_raises(_public_classes()[cls_name])
    raised = {_raised(fn) for _, fn in TABLE[cls_name]}
    never = sorted(e.__name__ for e in documented if not any(r is not None and issubclass(r, e) for r in raised))
    assert not never, f"{cls_name} documents {never}, which no bad input in its table raises"


def test_parser_reads_combined_entries():
    class Doc:
        """Thing.

        Raises:
            TypeError, ValueError: as something else.
            FileNotFoundError / IndexError: two more, with a
                continuation line that mentions KeyError: not an entry.
        """

    assert documented_raises(Doc) == {TypeError, ValueError, FileNotFoundError, IndexError}
