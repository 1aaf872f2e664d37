"""The catalogue of malformed inputs across the public API (issue 7).

Each case is answered by a ``ValueError`` / ``TypeError`` / ``FileNotFoundError`` whose message
names the parameter and what was expected, or by a documented, well-defined result (tested in
the second half of the file). The CLI turns every error into one line on stderr, a non-zero exit
status and no output file.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from PIL import Image

import vispos
from vispos import (
    NestedTensor,
    PositionalEncoding2D,
    PositionalEncodingPermute3D,
    PositionEmbeddingLearned,
    PositionEmbeddingSine,
    PositionEmbeddingSineDepthAdded,
    SinusoidalPositionalEncoding,
    interpolate_mask,
    nested_tensor_from_tensor_list,
)
from vispos.backbones import (
    Joiner,
    TimmBackbone,
    TorchvisionBackbone,
    VolumeBackbone,
    flatten_levels,
)
from vispos.padding import mask_valid_ratios
from vispos.transformer import DetrEncoder
from vispos.app.cli import main
from vispos.config import build_from_config, load_config
from vispos.app.data import imagenet_normalize, load_image, load_images, load_volume, load_volumes


# --------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def backbone():
    return TimmBackbone("resnet18", out_indices=(3, 4), frozen_batch_norm=True).eval()


@pytest.fixture(scope="module")
def joiner(backbone):
    return Joiner(backbone, PositionEmbeddingSine(16, normalize=True))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Good, corrupt and truncated image / volume / config / checkpoint files."""
    import nibabel as nib

    d = tmp_path_factory.mktemp("bad_input")
    paths = {}
    png = d / "ok.png"
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(png)
    paths["png"] = str(png)
    raw = png.read_bytes()
    (d / "truncated.png").write_bytes(raw[: len(raw) // 2])
    paths["truncated_png"] = str(d / "truncated.png")
    (d / "text.png").write_text("not an image")
    paths["text_png"] = str(d / "text.png")
    vol = d / "ok.nii.gz"
    nib.save(nib.Nifti1Image(np.random.default_rng(0).random((8, 8, 8)).astype(np.float32), np.eye(4)), vol)
    paths["nii"] = str(vol)
    raw = vol.read_bytes()
    (d / "truncated.nii.gz").write_bytes(raw[: len(raw) // 2])
    paths["truncated_nii"] = str(d / "truncated.nii.gz")
    (d / "garbage.nii.gz").write_text("garbage")
    paths["garbage_nii"] = str(d / "garbage.nii.gz")
    flat = d / "flat.nii.gz"
    nib.save(nib.Nifti1Image(np.zeros((8, 8), np.float32), np.eye(4)), flat)
    paths["flat_nii"] = str(flat)
    (d / "corrupt.yaml").write_text("type: [unclosed\n  - :")
    paths["corrupt_yaml"] = str(d / "corrupt.yaml")
    (d / "list.yaml").write_text("- a\n- b\n")
    paths["list_yaml"] = str(d / "list.yaml")
    (d / "binary.yaml").write_bytes(b"\xff\xfe\x00\x01garbage")
    paths["binary_yaml"] = str(d / "binary.yaml")
    (d / "corrupt.pt").write_text("garbage")
    paths["corrupt_pt"] = str(d / "corrupt.pt")
    (d / "corrupt.safetensors").write_text("garbage")
    paths["corrupt_st"] = str(d / "corrupt.safetensors")
    torch.save({"a": 1}, d / "nontensor.pt")
    paths["nontensor_pt"] = str(d / "nontensor.pt")
    paths["dir"] = str(d)
    paths["missing"] = str(d / "missing.file")
    return paths


def _nt(*shapes, channels=3):
    return nested_tensor_from_tensor_list([torch.zeros(channels, *s) for s in shapes])


MASK = torch.zeros(2, 4, 4, dtype=torch.bool)
PE = PositionEmbeddingSine(8, normalize=True)

# (id, call(fixtures) -> None, exception, match). ``call`` gets a dict of fixtures.
CASES = [
    # ---- PositionEmbeddingSine: construction
    ("sine/num_pos_feats odd", lambda f: PositionEmbeddingSine(7), ValueError, r"num_pos_feats must be a positive even int.*got 7"),
    ("sine/num_pos_feats zero", lambda f: PositionEmbeddingSine(0), ValueError, r"num_pos_feats .*got 0"),
    ("sine/num_pos_feats float", lambda f: PositionEmbeddingSine(4.0), TypeError, r"num_pos_feats .*4\.0 \(float\)"),
    ("sine/temperature negative", lambda f: PositionEmbeddingSine(4, temperature=-1), ValueError, r"temperature must be a finite number > 0, got -1"),
    ("sine/temperature nan", lambda f: PositionEmbeddingSine(4, temperature=float("nan")), ValueError, r"temperature .*nan"),
    ("sine/scale without normalize", lambda f: PositionEmbeddingSine(4, scale=1.0), ValueError, r"normalize should be True if scale is passed"),
    ("sine/scale negative", lambda f: PositionEmbeddingSine(4, normalize=True, scale=-1.0), ValueError, r"scale must be > 0, got -1"),
    ("sine/eps negative", lambda f: PositionEmbeddingSine(4, eps=-1.0), ValueError, r"eps must be >= 0, got -1"),
    ("sine/eps zero with normalize", lambda f: PositionEmbeddingSine(4, normalize=True, eps=0.0), ValueError, r"eps must be > 0 with normalize=True"),
    ("sine/normalize not bool", lambda f: PositionEmbeddingSine(4, normalize="yes"), TypeError, r"normalize must be a bool, got 'yes'"),
    ("sine/cache_size negative", lambda f: PositionEmbeddingSine(4, cache_size=-1), ValueError, r"cache_size must be >= 0, got -1"),
    # ---- PositionEmbeddingSine: forward
    ("sine/rank 1", lambda f: PE(torch.zeros(5)), ValueError, r"feature map must have shape \(B, C, \*S\).*got \(5,\)"),
    ("sine/rank 6", lambda f: PE(torch.zeros(1, 2, 3, 4, 5, 6)), ValueError, r"1 to 3 spatial axes, got \(1, 2, 3, 4, 5, 6\)"),
    ("sine/mask rank 5", lambda f: PE(torch.zeros(1, 2, 3, 4, 5, dtype=torch.bool)), ValueError, r"mask must have shape \(B, \*S\) with 1 to 3 spatial axes"),
    ("sine/uint8 mask", lambda f: PE(MASK.to(torch.uint8)), TypeError, r"mask must have dtype torch.bool.*torch.uint8.*Convert with"),
    ("sine/int64 mask", lambda f: PE(MASK.long()), TypeError, r"mask must have dtype torch.bool.*torch.int64"),
    ("sine/list input", lambda f: PE([1, 2]), TypeError, r"x must be a NestedTensor, a bool mask .* got list"),
    ("sine/dtype int", lambda f: PE(MASK, dtype=torch.int64), TypeError, r"dtype must be a floating torch.dtype .*torch.int64"),
    ("sine/dtype str", lambda f: PE(MASK, dtype="float16"), TypeError, r"dtype must be a floating torch.dtype .*'float16'"),
    # ---- NestedTensor
    ("nt/tensors rank 2", lambda f: NestedTensor(torch.zeros(2, 3), None), ValueError, r"tensors must have shape \(B, C, \*S\).*\(2, 3\)"),
    ("nt/tensors not tensor", lambda f: NestedTensor(np.zeros((2, 3, 4, 4)), None), TypeError, r"tensors must be a torch.Tensor.*ndarray"),
    ("nt/float mask", lambda f: NestedTensor(torch.zeros(2, 3, 4, 4), torch.zeros(2, 4, 4)), TypeError, r"mask must have dtype torch.bool.*float32.*~pixel_mask.bool\(\)"),
    ("nt/uint8 mask", lambda f: NestedTensor(torch.zeros(2, 3, 4, 4), torch.zeros(2, 4, 4, dtype=torch.uint8)), TypeError, r"mask must have dtype torch.bool.*uint8"),
    ("nt/mask shape", lambda f: NestedTensor(torch.zeros(2, 3, 4, 4), torch.zeros(2, 4, 5, dtype=torch.bool)), ValueError, r"mask must have shape \(B, \*S\) = \(2, 4, 4\).*got \(2, 4, 5\)"),
    ("nt/mask batch", lambda f: NestedTensor(torch.zeros(2, 3, 4, 4), torch.zeros(3, 4, 4, dtype=torch.bool)), ValueError, r"mask must have shape .*got \(3, 4, 4\)"),
    ("nt/mask device", lambda f: NestedTensor(torch.zeros(2, 3, 4, 4), torch.zeros(2, 4, 4, dtype=torch.bool, device="meta")), ValueError, r"mask is on meta but tensors are on cpu"),
    ("nt/image_sizes negative", lambda f: NestedTensor(torch.zeros(2, 3, 4, 4), MASK, [(-1, 4), (4, 4)]), ValueError, r"image_sizes\[0\] = \(-1, 4\) must have 2 entries, each within"),
    ("nt/image_sizes too big", lambda f: NestedTensor(torch.zeros(2, 3, 4, 4), MASK, [(5, 4), (4, 4)]), ValueError, r"image_sizes\[0\] = \(5, 4\)"),
    ("nt/image_sizes float", lambda f: NestedTensor(torch.zeros(2, 3, 4, 4), MASK, [(2.5, 4), (4, 4)]), TypeError, r"image_sizes\[0\] must hold ints, got \(2.5, 4\)"),
    ("nt/image_sizes str", lambda f: NestedTensor(torch.zeros(2, 3, 4, 4), MASK, [("a", 4), (4, 4)]), TypeError, r"image_sizes\[0\] must hold ints"),
    ("nt/image_sizes flat", lambda f: NestedTensor(torch.zeros(2, 3, 4, 4), MASK, [4, 4]), TypeError, r"image_sizes\[0\] must be a sequence of 2 ints"),
    ("nt/image_sizes length", lambda f: NestedTensor(torch.zeros(2, 3, 4, 4), MASK, [(4, 4)]), ValueError, r"image_sizes must have one entry per batch item \(2\), got 1"),
    ("nt/rectangular not bool", lambda f: NestedTensor(torch.zeros(2, 3, 4, 4), MASK, rectangular="yes"), TypeError, r"rectangular must be a bool, got 'yes'"),
    ("nt/rectangular claim on a holed mask", lambda f: NestedTensor(torch.zeros(2, 3, 4, 4), MASK.index_put((torch.tensor([0]), torch.tensor([1]), torch.tensor([1])), torch.tensor(True)), rectangular=True), ValueError, r"rectangular=True but the mask is not per-item boxes"),
    ("nt/index type", lambda f: _nt((4, 4))["a"], TypeError, r"index must be an int, got str"),
    ("nt/index out of range", lambda f: _nt((4, 4))[5], IndexError, r"index 5 is out of range for a batch of 1 item$"),
    ("ntl/empty list", lambda f: nested_tensor_from_tensor_list([]), ValueError, r"tensors must hold at least one tensor"),
    ("ntl/single tensor", lambda f: nested_tensor_from_tensor_list(torch.zeros(2, 3, 4, 4)), TypeError, r"tensors must be a list or tuple of tensors"),
    ("ntl/zero-size axis", lambda f: nested_tensor_from_tensor_list([torch.zeros(3, 0, 4)]), ValueError, r"tensors\[0\] has a zero-size spatial axis: shape \(3, 0, 4\)"),
    ("ntl/rank mismatch", lambda f: nested_tensor_from_tensor_list([torch.zeros(3, 4, 4), torch.zeros(3, 4)]), ValueError, r"tensors\[1\] has shape \(3, 4\) \(2 dims\)"),
    ("ntl/channel mismatch", lambda f: nested_tensor_from_tensor_list([torch.zeros(3, 4, 4), torch.zeros(1, 4, 4)]), ValueError, r"tensors\[1\] has 1 channel \(shape"),
    ("ntl/dtype mismatch", lambda f: nested_tensor_from_tensor_list([torch.zeros(3, 4, 4), torch.zeros(3, 4, 4, dtype=torch.float64)]), ValueError, r"tensors\[1\] has dtype torch.float64"),
    ("ntl/device mismatch", lambda f: nested_tensor_from_tensor_list([torch.zeros(3, 4, 4), torch.zeros(3, 4, 4, device="meta")]), ValueError, r"tensors\[1\] is on meta but tensors\[0\] is on cpu"),
    ("ntl/1-D item", lambda f: nested_tensor_from_tensor_list([torch.zeros(4)]), ValueError, r"tensors\[0\] must have shape \(C, H, W\)"),
    ("ntl/size_divisibility negative", lambda f: nested_tensor_from_tensor_list([torch.zeros(3, 4, 4)], size_divisibility=-1), ValueError, r"size_divisibility must be >= 0, got -1"),
    ("ntl/size_divisibility float", lambda f: nested_tensor_from_tensor_list([torch.zeros(3, 4, 4)], size_divisibility=2.5), TypeError, r"size_divisibility must be a non-negative int, got 2.5"),
    ("ntl/pad_value str", lambda f: nested_tensor_from_tensor_list([torch.zeros(3, 4, 4)], pad_value="a"), TypeError, r"pad_value must be a real number, got 'a'"),
    ("interpolate_mask/size zero", lambda f: interpolate_mask(MASK, 0), ValueError, r"size must hold 2 positive ints"),
    ("interpolate_mask/size float", lambda f: interpolate_mask(MASK, 2.5), TypeError, r"size must be an int or a sequence of 2 ints, got 2.5"),
    ("interpolate_mask/float mask", lambda f: interpolate_mask(MASK.float(), 2), TypeError, r"mask must have dtype torch.bool"),
    ("with_features/batch", lambda f: _nt((4, 4)).with_features(torch.zeros(2, 3, 4, 4)), ValueError, r"tensors must have shape \(B=1, C, \*S\) with 2 spatial axes, got \(2, 3, 4, 4\)"),
    # ---- other encoders
    ("grid/channels zero", lambda f: PositionalEncoding2D(0), ValueError, r"channels must be a positive int, got 0"),
    ("grid/wrong rank", lambda f: PositionalEncoding2D(4)(torch.zeros(1, 4, 4)), ValueError, r"PositionalEncoding2D expects a 4-D tensor \(B, X, Y, C\), got shape \(1, 4, 4\)"),
    ("grid/wrong channels", lambda f: PositionalEncoding2D(4)(torch.zeros(1, 4, 4, 5)), ValueError, r"channels=4\) got an input with 5 channels"),
    ("grid/int input", lambda f: PositionalEncoding2D(4)(torch.zeros(1, 4, 4, 4, dtype=torch.int64)), TypeError, r"dtype torch.int64.*must be floating.*dtype_override"),
    ("grid/permute rank", lambda f: PositionalEncodingPermute3D(4)(torch.zeros(1, 4, 4, 4)), ValueError, r"expects a 5-D tensor \(B, C, X, Y, Z\)"),
    ("learned/too large", lambda f: PositionEmbeddingLearned(8, num_embeddings=4)(torch.zeros(1, 3, 5, 5)), ValueError, r"5 cells along spatial axis 1 but the col_embed table has num_embeddings=4"),
    ("learned/axes", lambda f: PositionEmbeddingLearned(8)(torch.zeros(2, 5, 5)), ValueError, r"num_axes=2\) got an input with 1 spatial axes"),
    ("sequence/wrong width", lambda f: SinusoidalPositionalEncoding(8)(torch.zeros(2, 5, 6)), ValueError, r"x must have shape \(B, L, D\) with D = dim = 8"),
    ("coords/int", lambda f: vispos.sine_embed_coords(torch.zeros(2, 3, 2, dtype=torch.int64)), TypeError, r"pos_tensor must be a floating tensor"),
    # ---- backbones, Joiner, encoder
    ("timm/unknown model", lambda f: TimmBackbone("resnet_nonexistent"), ValueError, r"model_name 'resnet_nonexistent' is not a timm model"),
    ("timm/out_indices int", lambda f: TimmBackbone("resnet18", out_indices=4), TypeError, r"out_indices must be a non-empty sequence of ints, got 4"),
    ("timm/out_indices range", lambda f: TimmBackbone("resnet18", out_indices=(9,)), ValueError, r"out_indices \(9,\) are not available for 'resnet18'"),
    ("timm/in_chans zero", lambda f: TimmBackbone("resnet18", in_chans=0), ValueError, r"in_chans must be a positive int, got 0"),
    ("timm/in_chans str", lambda f: TimmBackbone("resnet18", in_chans="3"), TypeError, r"in_chans must be a positive int, got '3' \(str\)"),
    ("timm/frozen_stages", lambda f: TimmBackbone("resnet18", frozen_stages=9), ValueError, r"frozen_stages=9 but 'resnet18' has feature indices 0..4"),
    ("timm/checkpoint missing", lambda f: TimmBackbone("resnet18", checkpoint_path=f["files"]["missing"]), FileNotFoundError, r"checkpoint_path .*missing.file' does not exist"),
    ("timm/checkpoint corrupt", lambda f: TimmBackbone("resnet18", checkpoint_path=f["files"]["corrupt_pt"]), ValueError, r"checkpoint_path .*corrupt.pt' could not be read"),
    ("timm/checkpoint corrupt safetensors", lambda f: TimmBackbone("resnet18", checkpoint_path=f["files"]["corrupt_st"]), ValueError, r"checkpoint_path .*corrupt.safetensors' could not be read"),
    ("timm/checkpoint not tensors", lambda f: TimmBackbone("resnet18", checkpoint_path=f["files"]["nontensor_pt"]), ValueError, r"does not hold a state dict of tensors"),
    ("timm/plain tensor input", lambda f: f["backbone"](torch.zeros(1, 3, 32, 32)), TypeError, r"x must be a NestedTensor \(B, C, H, W\), got Tensor"),
    ("timm/wrong channels", lambda f: f["backbone"](_nt((32, 32), channels=1)), ValueError, r"x.tensors must have shape \(B, 3, H, W\), got \(1, 1, 32, 32\)"),
    ("timm/volume input", lambda f: f["backbone"](_nt((8, 32, 32))), ValueError, r"x.tensors must have shape \(B, 3, H, W\), got \(1, 3, 8, 32, 32\)"),
    ("timm/device mismatch", lambda f: f["backbone"](_nt((32, 32)).to("meta")), ValueError, r"x is on meta but the backbone's weights are on cpu"),
    ("torchvision/unknown model", lambda f: TorchvisionBackbone("nonexistent"), ValueError, r"name_or_model 'nonexistent' is not a torchvision classification model"),
    ("torchvision/unknown node", lambda f: TorchvisionBackbone("resnet18", return_nodes=["nope"]), ValueError, r"return_nodes \['nope'\] are not all nodes"),
    ("volume/unknown model", lambda f: VolumeBackbone("nonexistent"), ValueError, r"name_or_model 'nonexistent' is not a supported 3D model"),
    ("joiner/backbone str", lambda f: Joiner("resnet50", PE), TypeError, r"backbone must be an nn.Module, got str"),
    ("joiner/hidden_dim mismatch", lambda f: Joiner(f["backbone"], PositionEmbeddingSine(16), hidden_dim=64), ValueError, r"hidden_dim=64 must equal the position embedding's channels"),
    ("joiner/hidden_dim negative", lambda f: Joiner(f["backbone"], PE, hidden_dim=-1), ValueError, r"hidden_dim must be a positive int, got -1"),
    ("joiner/num_groups", lambda f: Joiner(f["backbone"], PositionEmbeddingSine(16), hidden_dim=32, num_groups=5), ValueError, r"hidden_dim=32 must be divisible by num_groups=5"),
    ("joiner/fewer levels", lambda f: Joiner(f["backbone"], PositionEmbeddingSine(16), hidden_dim=32, num_feature_levels=1, num_groups=8), ValueError, r"num_feature_levels=1 is fewer than the backbone's 2 levels"),
    ("joiner/list input", lambda f: f["joiner"]([torch.zeros(3, 32, 32)]), TypeError, r"x must be a NestedTensor"),
    ("flatten/no levels", lambda f: flatten_levels([], []), ValueError, r"features must hold at least one level"),
    ("flatten/pos shape", lambda f: flatten_levels([torch.zeros(1, 4, 2, 2)], [torch.zeros(1, 4, 2, 3)]), ValueError, r"pos\[0\] must have its level's shape \(1, 4, 2, 2\), got \(1, 4, 2, 3\)"),
    ("valid_ratios/float mask", lambda f: mask_valid_ratios(torch.zeros(2, 3, 3)), TypeError, r"mask must have dtype torch.bool .*got torch.float32"),
    ("encoder/nhead", lambda f: DetrEncoder(30, nhead=4), ValueError, r"nhead=4 must divide d_model=30"),
    ("encoder/src width", lambda f: DetrEncoder(32, nhead=4, num_layers=1)(torch.zeros(1, 5, 16)), ValueError, r"src must be a Tensor\[B, N, 32\]"),
    ("encoder/float key_padding_mask", lambda f: DetrEncoder(32, nhead=4, num_layers=1)(torch.zeros(1, 5, 32), None, torch.zeros(1, 5)), TypeError, r"key_padding_mask must have dtype torch.bool"),
    # ---- configs
    ("config/missing file", lambda f: build_from_config(f["files"]["missing"]), FileNotFoundError, r"config file .*missing.file' does not exist"),
    ("config/directory", lambda f: load_config(f["files"]["dir"]), IsADirectoryError, r"config file .* is a directory, not a YAML file"),
    ("config/corrupt yaml", lambda f: build_from_config(f["files"]["corrupt_yaml"]), ValueError, r"config file .*corrupt.yaml' is not valid YAML"),
    ("config/binary file", lambda f: build_from_config(f["files"]["binary_yaml"]), ValueError, r"config file .*binary.yaml' is not UTF-8 text"),
    ("config/list at top", lambda f: build_from_config(f["files"]["list_yaml"]), ValueError, r"must hold a mapping with a 'type' key, got list"),
    ("config/no type", lambda f: build_from_config({"num_pos_feats": 4}), ValueError, r"a config needs a 'type' key; registered types are"),
    ("config/unknown type", lambda f: build_from_config({"type": "Nope"}), ValueError, r"unknown type 'Nope'; registered types are \[.*'PositionEmbeddingSine'"),
    ("config/unknown key", lambda f: build_from_config({"type": "PositionEmbeddingSine", "num_feats": 4}), ValueError, r"unknown keys \['num_feats'\]; allowed keys are \['num_pos_feats'"),
    ("config/missing key", lambda f: build_from_config({"type": "TimmBackbone"}), ValueError, r"missing required keys \['model_name'\]"),
    ("config/nested unknown type", lambda f: build_from_config({"type": "Joiner", "backbone": {"type": "Nope"}, "position_embedding": {"type": "PositionEmbeddingSine"}}), ValueError, r"config.backbone: unknown type 'Nope'"),
    ("config/bad dtype", lambda f: build_from_config({"type": "PositionalEncoding2D", "channels": 4, "dtype_override": "float99"}), ValueError, r"'float99' is not a torch dtype"),
    ("config/not a mapping", lambda f: build_from_config(5), TypeError, r"path_or_dict must be a path or a mapping, got int"),
    # ---- data
    ("image/missing", lambda f: load_image(f["files"]["missing"]), FileNotFoundError, r"image file .*missing.file' does not exist"),
    ("image/not an image", lambda f: load_image(f["files"]["text_png"]), ValueError, r"image file .*text.png' could not be read as an image"),
    ("image/truncated", lambda f: load_image(f["files"]["truncated_png"]), ValueError, r"image file .*truncated.png' could not be read as an image"),
    ("image/max_size zero", lambda f: load_image(f["files"]["png"], max_size=0), ValueError, r"max_size must be a positive int, got 0"),
    ("images/single path", lambda f: load_images(f["files"]["png"]), TypeError, r"paths must be a list or tuple of file paths, got str"),
    ("imagenet_normalize/list", lambda f: imagenet_normalize([1.0]), TypeError, r"image must be a floating Tensor\[3, H, W\]"),
    ("imagenet_normalize/1 channel", lambda f: imagenet_normalize(torch.zeros(1, 4, 4)), ValueError, r"image must have shape \(3, H, W\) or \(B, 3, H, W\), got \(1, 4, 4\)"),
    ("volume/missing", lambda f: load_volume(f["files"]["missing"]), FileNotFoundError, r"volume file .*missing.file' does not exist"),
    ("volume/garbage", lambda f: load_volume(f["files"]["garbage_nii"]), ValueError, r"volume file .*garbage.nii.gz' could not be read as a NIfTI volume"),
    ("volume/truncated", lambda f: load_volume(f["files"]["truncated_nii"]), ValueError, r"volume file .*truncated.nii.gz' could not be read as a NIfTI volume"),
    ("volume/2-D file", lambda f: load_volume(f["files"]["flat_nii"]), ValueError, r"must be 3-D or 4-D, got shape \(8, 8\)"),
    ("volume/bad intensity", lambda f: load_volume(f["files"]["nii"], intensity="foo"), ValueError, r"intensity must be one of \('zscore', 'minmax', 'percentile', None\), got 'foo'"),
    ("volumes/single path", lambda f: load_volumes(f["files"]["truncated_nii"]), TypeError, r"paths must be a list or tuple of file paths, got str"),
    # ---- issue 10: DepthAdded shares the parent's checks; one exception type per kind of mistake
    ("depth/dtype int", lambda f: PositionEmbeddingSineDepthAdded(4)(torch.zeros(1, 2, 3, 4, dtype=torch.bool), dtype=torch.int64), TypeError, r"dtype must be a floating torch.dtype .*torch.int64"),
    ("depth/dtype str", lambda f: PositionEmbeddingSineDepthAdded(4)(torch.zeros(1, 2, 3, 4, dtype=torch.bool), dtype="float16"), TypeError, r"dtype must be a floating torch.dtype .*'float16'"),
    ("depth/cache_size negative", lambda f: PositionEmbeddingSineDepthAdded(4, cache_size=-1), ValueError, r"cache_size must be >= 0, got -1"),
    ("depth/2D input", lambda f: PositionEmbeddingSineDepthAdded(4)(MASK), ValueError, r"embeds volumes \(3 spatial axes\).*got spatial shape \(4, 4\)"),
    ("joiner/hidden_dim float", lambda f: Joiner(f["backbone"], PE, hidden_dim=16.0), TypeError, r"hidden_dim must be a positive int or None, got 16\.0 \(float\)"),
    ("joiner/num_groups zero", lambda f: Joiner(f["backbone"], PE, hidden_dim=16, num_groups=0), ValueError, r"num_groups must be a positive int, got 0"),
    ("joiner/hidden_dim undescribed backbone", lambda f: Joiner(torch.nn.Identity(), PE, hidden_dim=16), TypeError, r"hidden_dim needs a backbone that reports num_channels, strides and num_axes.*Identity"),
    ("sine/eps nan", lambda f: PositionEmbeddingSine(4, eps=float("nan")), ValueError, r"eps must be a finite number, got nan"),
    ("sine/offset str", lambda f: PositionEmbeddingSine(4, offset="a"), TypeError, r"offset must be a finite number, got 'a' \(str\)"),
    ("grid/dtype_override int", lambda f: PositionalEncoding2D(4, dtype_override=torch.int32), TypeError, r"dtype_override must be a floating torch.dtype \(sin/cos values\), got torch.int32"),
    ("grid/org_channels set to zero", lambda f: setattr(PositionalEncoding2D(4), "org_channels", 0), ValueError, r"org_channels must be a positive int, got 0"),
    ("detr-like/mask shape", lambda f: PE(_DetrNT(torch.zeros(2, 3, 4, 4), torch.zeros(2, 4, 5, dtype=torch.bool))), ValueError, r"_DetrNT.mask must have shape \(B, \*S\) = \(2, 4, 4\), got \(2, 4, 5\)"),
    ("detr-like/int mask", lambda f: PE(_DetrNT(torch.zeros(2, 3, 4, 4), torch.zeros(2, 4, 4, dtype=torch.int64))), TypeError, r"_DetrNT.mask must have dtype torch.bool"),
    ("detr-like/tensors rank", lambda f: PE(_DetrNT(torch.zeros(2, 4), None)), ValueError, r"_DetrNT.tensors must be a Tensor \(B, C, \*S\) with 1 to 3 spatial axes, got \(2, 4\)"),
    # ---- issue 12, items 13-16
    ("learned/dtype int", lambda f: PositionEmbeddingLearned(4, 8)(MASK, dtype=torch.int32), TypeError, r"dtype must be a floating torch.dtype .*torch.int32"),
    ("learned/dtype str", lambda f: PositionEmbeddingLearned(4, 8)(MASK, dtype="float16"), TypeError, r"dtype must be a floating torch.dtype such as torch.float16, got 'float16'"),
    ("pad/uint8 negative", lambda f: nested_tensor_from_tensor_list([torch.zeros(1, 2, 2, dtype=torch.uint8)], pad_value=-1), ValueError, r"pad_value=-1 cannot be stored in the items' dtype torch.uint8: expected an integer in \[0, 255\]"),
    ("pad/uint8 fraction", lambda f: nested_tensor_from_tensor_list([torch.zeros(1, 2, 2, dtype=torch.uint8)], pad_value=0.5), ValueError, r"pad_value=0.5 cannot be stored in the items' dtype torch.uint8"),
    ("pad/uint8 too large", lambda f: nested_tensor_from_tensor_list([torch.zeros(1, 2, 2, dtype=torch.uint8)], pad_value=300), ValueError, r"pad_value=300 cannot be stored in the items' dtype torch.uint8"),
    ("pad/bool 2", lambda f: nested_tensor_from_tensor_list([torch.zeros(1, 2, 2, dtype=torch.bool)], pad_value=2), ValueError, r"pad_value=2 cannot be stored in the items' dtype torch.bool: expected 0 or 1"),
    ("index/float", lambda f: _nt((4, 4))[0.0], TypeError, r"index must be an int, got float"),
    ("index/float tensor", lambda f: _nt((4, 4))[torch.tensor(0.0)], TypeError, r"index must be an int, got Tensor"),
    ("index/out of range numpy", lambda f: _nt((4, 4))[np.int64(3)], IndexError, r"index 3 is out of range for a batch of 1 item$"),
    ("image/directory", lambda f: load_image(os.path.dirname(f["files"]["nii"])), IsADirectoryError, r"image file .* is a directory, not an image file"),
]


class _DetrNT:
    """A stand-in for DETR's ``util.misc.NestedTensor`` (its whole interface)."""

    def __init__(self, tensors, mask):
        self.tensors = tensors
        self.mask = mask

    def decompose(self):
        return self.tensors, self.mask


@pytest.mark.parametrize("call, exc, match", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_answered_clearly(call, exc, match, backbone, joiner, files):
    with pytest.raises(exc, match=match):
        call({"backbone": backbone, "joiner": joiner, "files": files})


def test_catalogue_size():
    assert len(CASES) >= 40
    assert len({c[0] for c in CASES}) == len(CASES)


# ------------------------------------------------------------------ well-defined results
@pytest.mark.parametrize("normalize, offset", [(False, 0.0), (True, 0.0), (True, -0.5)])
@pytest.mark.parametrize("n_axes", [1, 2, 3])
def test_fully_padded_item_is_finite(normalize, offset, n_axes):
    """A fully padded item gets a finite embedding (documented value: that of count 0)."""
    pe = PositionEmbeddingSine(8, normalize=normalize, offset=offset)
    spatial = (4, 5, 3)[:n_axes]
    mask = torch.zeros(2, *spatial, dtype=torch.bool)
    mask[1] = True
    pos = pe(mask)
    assert torch.isfinite(pos).all()
    # count 0 -> position (0 + offset) / (0 + eps) * scale when normalising, else 0 + offset
    zero = torch.zeros(())
    p0 = (zero + offset) / (zero + pe.eps) * pe.scale if normalize else zero + offset
    angles = p0 / pe.dim_t
    expected = torch.stack([angles.sin(), angles.cos()], 1).flatten().repeat(n_axes)
    torch.testing.assert_close(pos[1].movedim(0, -1), expected.expand(*spatial, -1), rtol=0, atol=1e-6)
    # the same through a NestedTensor whose mask is all padding for that item
    nt = NestedTensor(torch.zeros(2, 3, *spatial), mask)
    torch.testing.assert_close(pe(nt), pos)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_nan_inf_features_do_not_reach_the_embedding(bad, joiner):
    """The embedding depends on shapes and masks only: non-finite features are passed through
    untouched in ``features`` and never poison ``pos``."""
    pe = PositionEmbeddingSine(8, normalize=True)
    x = torch.full((2, 3, 5, 6), bad)
    torch.testing.assert_close(pe(x), pe(torch.zeros(2, 3, 5, 6)))
    nt = nested_tensor_from_tensor_list([torch.full((3, 64, 64), bad), torch.zeros(3, 32, 48)])
    with torch.no_grad():
        _, pos = joiner(nt)
    assert all(torch.isfinite(p).all() for p in pos)
    clean = nested_tensor_from_tensor_list([torch.zeros(3, 64, 64), torch.zeros(3, 32, 48)])
    with torch.no_grad():
        _, pos_clean = joiner(clean)
    for p, q in zip(pos, pos_clean):
        torch.testing.assert_close(p, q)


@pytest.mark.parametrize(
    "x",
    [
        torch.zeros(0, 4, 4, dtype=torch.bool),
        torch.zeros(2, 0, 4, dtype=torch.bool),
        torch.zeros(2, 3, 0, 4),
        torch.zeros(0, 3, 4, 4),
    ],
    ids=["empty batch mask", "zero axis mask", "zero axis features", "empty batch features"],
)
def test_empty_inputs_give_empty_embeddings(x):
    pe = PositionEmbeddingSine(8)
    spatial = tuple(x.shape[1:]) if x.dtype == torch.bool else tuple(x.shape[2:])
    out = pe(x, dtype=torch.float16)
    assert out.shape == (x.shape[0], 8 * len(spatial), *spatial) and out.dtype == torch.float16


def test_float_tensor_of_mask_rank_is_refused_not_read_as_a_1d_map():
    """Issue 26 item 6: a float 0/1 ``(B, H, W)`` tensor cannot be told from a 1-D feature map
    ``(B, C, L)``; it was silently embedded as one (``(2, 16, 6)`` instead of ``(2, 32, 5, 6)``).
    Now it is refused with both readings in the message; a 1D map goes in as a NestedTensor."""
    pe = PositionEmbeddingSine(16)
    mask = torch.zeros(2, 5, 6)
    mask[0, 3:] = 1.0
    with pytest.raises(TypeError, match=r"a float mask \(B, H, W\) and a 1D feature map \(B, C, L\) look alike.*mask\.bool\(\)"):
        pe(mask)
    torch.testing.assert_close(pe(mask.bool()), pe(NestedTensor(torch.zeros(2, 1, 5, 6), mask.bool())), rtol=0, atol=0)
    assert pe(NestedTensor(torch.zeros(2, 4, 5), None)).shape == (2, 16, 5)
    with pytest.raises(TypeError, match="mask must have dtype torch.bool"):
        NestedTensor(torch.zeros(2, 3, 4, 5), torch.zeros(2, 4, 5))
    # encoders of a fixed rank read the tensor as a feature map and say what a mask-rank one is
    with pytest.raises(ValueError, match=r"x has the rank of a mask \(B, \*S\) with 3 spatial axes"):
        PositionEmbeddingSineDepthAdded(4)(torch.zeros(2, 3, 4, 5))


# ------------------------------------------------------------------------------------- CLI
TINY = """
type: Joiner
backbone: {type: TimmBackbone, model_name: resnet18, out_indices: [4]}
position_embedding: {type: PositionEmbeddingSine, num_pos_feats: 16, normalize: true}
"""


@pytest.mark.parametrize(
    "argv, match, status",
    [
        (["run", "--images", "{png}", "--config", "{corrupt_yaml}"], "is not valid YAML", 2),
        (["run", "--images", "{png}", "--config", "{binary_yaml}"], "is not UTF-8 text", 2),
        (["run", "--images", "{png}", "--config", "{list_yaml}"], "must hold a mapping", 2),
        (["run", "--images", "{truncated_png}"], "could not be read as an image", 2),
        (["run", "--images", "{png}", "--checkpoint", "{corrupt_pt}"], "could not be read as a torch or safetensors", 2),
        (["run", "--volumes", "{truncated_nii}"], "could not be read as a NIfTI volume", 2),
        (["run", "--images", "{png}", "--size-divisibility", "-1"], "--size-divisibility must be >= 0, got -1", 2),
        (["run", "--images", "{png}", "--max-size", "0"], "--max-size must be >= 1, got 0", 2),
        (["run", "--images", "{png}", "--device", "nonsense"], "--device 'nonsense' is not a torch device", 2),
    ],
)
def test_cli_errors_are_one_line(tmp_path, capsys, files, argv, match, status):
    argv = [a.format(**files) for a in argv]
    out = tmp_path / "out"
    rc = main([*argv, "--out", str(out), "--repeats", "1"])
    err = capsys.readouterr().err
    assert rc == status
    assert err.startswith(f"vispos {argv[0]}: error:") and match in err, err
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in err
    assert not out.exists()


def test_cli_unexpected_error_is_one_line_and_writes_nothing(tmp_path, capsys, files, monkeypatch):
    """A failure while the figure is drawn (after the embeddings were computed) leaves no file:
    neither a half-written one nor ``embeddings.pt`` without its figure."""
    import vispos.app.figures

    def broken(*args, **kwargs):
        raise RuntimeError("figure backend crashed\nsecond line")

    monkeypatch.setattr(vispos.app.figures, "plot_level_similarity", broken)
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(TINY)
    out = tmp_path / "out"
    rc = main(["run", "--config", str(cfg), "--images", files["png"], "--out", str(out), "--repeats", "1"])
    err = capsys.readouterr().err
    assert rc == 1
    assert err.strip() == "vispos run: error: RuntimeError: figure backend crashed second line"
    assert not out.exists()
    # an existing output folder keeps its earlier files and gets no temporary left behind
    out.mkdir()
    (out / "embeddings.pt").write_text("earlier run")
    rc = main(["run", "--config", str(cfg), "--images", files["png"], "--out", str(out), "--repeats", "1"])
    assert rc == 1
    assert sorted(os.listdir(out)) == ["embeddings.pt"]
    assert (out / "embeddings.pt").read_text() == "earlier run"


# ------------------------------------------------------ issue 12, items 9-16: empty and odd
def test_zero_axis_batch_sizes_and_items_are_empty():
    """Item 9: a zero-size spatial axis gives sizes 0 along it and empty items, no IndexError."""
    nt = NestedTensor(torch.zeros(2, 3, 0, 4), torch.zeros(2, 0, 4, dtype=torch.bool))
    assert nt.image_sizes == [(0, 0), (0, 0)]
    assert nt[0].shape == (3, 0, 0)
    empty = NestedTensor(torch.zeros(0, 3, 4, 4), torch.zeros(0, 4, 4, dtype=torch.bool))
    assert empty.image_sizes == [] and list(empty) == []


@pytest.mark.parametrize("mask", [torch.zeros(0, 4, 4, dtype=torch.bool), torch.zeros(2, 0, 4, dtype=torch.bool)], ids=["empty batch", "zero axis"])
def test_interpolate_empty_mask(mask):
    """Item 10: an empty batch resizes to an empty mask; a mask with no cell at all (zero-size
    axis) resizes to all padding (there is no valid cell to keep)."""
    out = interpolate_mask(mask, (2, 2))
    torch.testing.assert_close(out, torch.ones(mask.shape[0], 2, 2, dtype=torch.bool))


def test_joiner_on_an_empty_batch(joiner):
    """Item 11: an empty batch goes through the Joiner and gives empty levels and embeddings."""
    nt = NestedTensor(torch.zeros(0, 3, 64, 64), torch.zeros(0, 64, 64, dtype=torch.bool))
    with torch.no_grad():
        features, pos = joiner(nt)
    assert len(features) == len(pos) >= 1
    for f, p in zip(features, pos):
        assert f.tensors.shape[0] == 0 and f.mask.shape == (0, *f.tensors.shape[2:])
        assert p.shape == (0, joiner.position_embedding.out_channels(2), *f.tensors.shape[2:])


@pytest.mark.parametrize("shape", [(2, 0, 4, 5), (0, 3, 4, 5)])
def test_depth_added_empty_input_is_empty(shape):
    """Item 12: DepthAdded on an empty mask gives an empty embedding of the output shape."""
    out = PositionEmbeddingSineDepthAdded(4)(torch.zeros(shape, dtype=torch.bool), dtype=torch.float16)
    assert out.shape == (shape[0], 8, *shape[1:]) and out.dtype == torch.float16


@pytest.mark.parametrize("index", [np.int64(1), torch.tensor(1), np.int32(-1)], ids=["numpy", "tensor", "numpy negative"])
def test_index_accepts_operator_index(index):
    """Item 15: anything ``operator.index`` accepts indexes a batch."""
    nt = nested_tensor_from_tensor_list([torch.rand(3, 4, 5), torch.rand(3, 2, 6)])
    torch.testing.assert_close(nt[index], nt.tensors[1, :, :2, :6])


@pytest.mark.parametrize("pad, dtype", [(255, torch.uint8), (0, torch.uint8), (-128, torch.int8), (1, torch.bool), (-1.5, torch.float16)])
def test_pad_value_within_dtype_is_written(pad, dtype):
    """Item 14: a pad value the dtype holds is written exactly."""
    nt = nested_tensor_from_tensor_list([torch.zeros(1, 2, 2, dtype=dtype), torch.zeros(1, 1, 1, dtype=dtype)], pad_value=pad)
    torch.testing.assert_close(nt.tensors[1, 0, 1, 1], torch.tensor(pad, dtype=dtype))


def test_org_channels_change_rebuilds_the_table():
    """Item 16: changing ``org_channels`` after a call returns the new width, equal to a module
    built with it, not the stale cached table."""
    x = torch.zeros(2, 5, 6, 8)
    enc = PositionalEncoding2D(8)
    enc(x)
    enc.org_channels = 6
    torch.testing.assert_close(enc(x[..., :6]), PositionalEncoding2D(6)(x[..., :6]))


def test_registered_lists_only_types():
    """Item 16: ``registered()`` lists config types only (no internal flag)."""
    names = vispos.config.registered()
    assert "_builtins_done" not in names and "PositionEmbeddingSine" in names
    assert all(not n.startswith("_") for n in names)


def test_directory_as_volume_says_so(tmp_path):
    with pytest.raises(IsADirectoryError, match=r"volume file .* is a directory, not a NIfTI file"):
        load_volume(tmp_path)


# ============================================================ issue 12: files, images, configs
@pytest.fixture(scope="module")
def files12(tmp_path_factory):
    """Hostile files of issue 12: a PNG bomb, odd NIfTI headers, YAML bombs, bad keys."""
    import struct
    import zlib

    import nibabel as nib

    d = tmp_path_factory.mktemp("bad_input_12")
    p = {}

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    for name, side in (("bomb", 100_000), ("big", 10_000)):
        (d / f"{name}.png").write_bytes(
            b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b""))
        p[f"{name}_png"] = str(d / f"{name}.png")
    Image.fromarray(np.full((4, 4), np.nan, np.float32), mode="F").save(d / "nan.tif")
    p["nan_tif"] = str(d / "nan.tif")
    Image.fromarray(np.full((4, 4), 70000, np.int32), mode="I").save(d / "int32.tif")
    p["int32_tif"] = str(d / "int32.tif")
    rgb = np.zeros((4, 5, 6), dtype=[("R", "u1"), ("G", "u1"), ("B", "u1")])
    nib.save(nib.Nifti1Image(rgb, np.eye(4)), d / "rgb24.nii")
    p["rgb_nii"] = str(d / "rgb24.nii")
    nib.save(nib.Nifti1Image(np.zeros((4, 5, 6), np.complex64), np.eye(4)), d / "complex.nii.gz")
    p["complex_nii"] = str(d / "complex.nii.gz")

    def forged(name, shape, data=b"", vox_offset=352):
        hdr = nib.Nifti1Header()
        hdr.set_data_shape(shape)
        hdr.set_data_dtype(np.float32)
        hdr["vox_offset"] = vox_offset
        (d / name).write_bytes(hdr.binaryblock + b"\0" * 4 + data)
        p[name.replace(".", "_")] = str(d / name)

    forged("huge.nii", (4000, 4000, 4000), b"\0" * 64)
    forged("short.nii", (40, 40, 40), b"\0" * 64)
    forged("empty_axis.nii", (4, 0, 6))
    forged("offset0.nii", (2, 2, 2), b"\0" * 32, vox_offset=0)
    bomb = ["type: PositionEmbeddingSine", "a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    bomb += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 8)]
    (d / "bomb.yaml").write_text("\n".join([*bomb, "num_pos_feats: *a7"]))
    p["bomb_yaml"] = str(d / "bomb.yaml")
    (d / "int_key.yaml").write_text("type: PositionEmbeddingSine\n1: 2\nfoo: 3\n")
    p["int_key_yaml"] = str(d / "int_key.yaml")
    (d / "null_key.yaml").write_text("type: PositionEmbeddingSine\nnull: 2\n")
    p["null_key_yaml"] = str(d / "null_key.yaml")
    (d / "self.yaml").write_text("type: PositionEmbeddingSine\nnum_pos_feats: &a [*a]\n")
    p["self_yaml"] = str(d / "self.yaml")
    (d / "deep.yaml").write_text("type: PositionEmbeddingSine\nnum_pos_feats: " + "[" * 2000 + "]" * 2000 + "\n")
    p["deep_yaml"] = str(d / "deep.yaml")
    p["dir"] = str(d)
    return p


def _write_group(paths):
    from vispos.app._io import write_files

    return write_files([(q, lambda tmp: open(tmp, "w").close()) for q in paths])


CASES_12 = [
    # ---- images (items 4-6)
    ("12/image bomb over Pillow's limit", lambda f: load_image(f["bomb_png"]), ValueError,
     r"bomb.png' declares 100000x100000 = 10000000000 pixels, more than Pillow's limit of \d+ pixels"),
    ("12/image over max_pixels", lambda f: load_image(f["big_png"]), ValueError,
     r"big.png' declares 10000x10000 = 100000000 pixels, more than max_pixels=89478485"),
    ("12/images over max_pixels", lambda f: load_images([f["big_png"]], max_pixels=99), ValueError, r"more than max_pixels=99"),
    ("12/max_pixels bool", lambda f: load_image(f["big_png"], max_pixels=True), TypeError, r"max_pixels must be a positive int or None, got True \(bool\)"),
    ("12/max_size checked first", lambda f: load_image(f["bomb_png"], max_size=-1), ValueError, r"max_size must be a positive int, got -1"),
    ("12/float image NaN", lambda f: load_image(f["nan_tif"]), ValueError, r"nan.tif' holds non-finite values"),
    ("12/int32 image over 16 bits", lambda f: load_image(f["int32_tif"]), ValueError,
     r"int32.tif' holds I integers from 70000 to 70000; .* at most 16 bits"),
    # ---- volumes (item 6)
    ("12/nifti RGB24", lambda f: load_volume(f["rgb_nii"]), ValueError, r"rgb24.nii' stores RGB voxels .*real scalar voxels"),
    ("12/nifti complex", lambda f: load_volume(f["complex_nii"]), ValueError, r"complex.nii.gz' stores complex64 voxels"),
    ("12/nifti 4000^3 header", lambda f: load_volume(f["huge_nii"]), ValueError,
     r"huge.nii' declares shape \(4000, 4000, 4000\) = 64000000000 voxels, more than max_voxels=268435456"),
    ("12/nifti max_voxels", lambda f: load_volumes([f["short_nii"]], max_voxels=10), ValueError, r"= 64000 voxels, more than max_voxels=10"),
    ("12/nifti max_voxels zero", lambda f: load_volume(f["short_nii"], max_voxels=0), ValueError, r"max_voxels must be a positive int, got 0"),
    ("12/nifti shorter than header says", lambda f: load_volume(f["short_nii"]), ValueError, r"short.nii' is truncated: its header declares shape \(40, 40, 40\)"),
    ("12/nifti empty axis", lambda f: load_volume(f["empty_axis_nii"]), ValueError, r"empty_axis.nii' has an empty axis"),
    ("12/nifti voxels inside header", lambda f: load_volume(f["offset0_nii"]), ValueError, r"offset0.nii' is corrupt: its voxels would start at byte 0"),
    ("12/nifti bad intensity before reading", lambda f: load_volume(f["huge_nii"], intensity="z"), ValueError, r"intensity must be one of .* got 'z'"),
    # ---- configs (items 7-8)
    ("12/yaml bomb", lambda f: load_config(f["bomb_yaml"]), ValueError, r"bomb.yaml: the config expands to more than 10000 values"),
    ("12/yaml self alias", lambda f: build_from_config(f["self_yaml"]), ValueError, r"self.yaml: the config contains itself"),
    ("12/yaml too deep for the parser", lambda f: load_config(f["deep_yaml"]), ValueError, r"deep.yaml' nests too deeply for the YAML parser"),
    ("12/int key", lambda f: build_from_config(f["int_key_yaml"]), TypeError, r"\(PositionEmbeddingSine\): keys must be strings .*got 1$"),
    ("12/null key", lambda f: build_from_config(f["null_key_yaml"]), TypeError, r"keys must be strings .*got None \(YAML reads"),
    ("12/dict with int key", lambda f: build_from_config({"type": "PositionEmbeddingSine", 7: 1}), TypeError, r"config \(PositionEmbeddingSine\): keys must be strings .*got 7"),
    ("12/long type value cut", lambda f: build_from_config({"type": "x" * 10**6}), ValueError, r"unknown type 'x{27}\.\.\.x{28}'; registered"),
    ("12/constructor error says where", lambda f: build_from_config({"type": "PositionEmbeddingSine", "num_pos_feats": 7}), ValueError,
     r"^config \(PositionEmbeddingSine\): num_pos_feats must be a positive even int"),
    # ---- group writes (items 1-3)
    ("12/write into a directory", lambda f: _write_group([os.path.join(f["dir"], "a.pt"), f["dir"]]), IsADirectoryError, r"it is a directory"),
    ("12/write one file twice", lambda f: _write_group([os.path.join(f["dir"], "a"), os.path.join(f["dir"], ".", "a")]), ValueError, r"are the same file"),
    ("12/write into a missing folder", lambda f: _write_group([os.path.join(f["dir"], "no", "a")]), FileNotFoundError, r"folder .*no' does not exist"),
]


@pytest.mark.parametrize("call, exc, match", [c[1:] for c in CASES_12], ids=[c[0] for c in CASES_12])
def test_issue12_bad_input_is_answered_clearly(call, exc, match, files12):
    with pytest.raises(exc, match=match):
        call(files12)
    assert not [n for n in os.listdir(files12["dir"]) if n.startswith(".vispos-")]


@pytest.mark.parametrize(
    "argv, match",
    [
        (["run", "--images", "{bomb_png}"], "declares 100000x100000 = 10000000000 pixels"),
        (["run", "--volumes", "{rgb_nii}"], "rgb24.nii' stores RGB voxels"),
        (["run", "--volumes", "{huge_nii}"], "= 64000000000 voxels, more than max_voxels="),
        (["run", "--images", "{nan_tif}", "--config", "{bomb_yaml}"], "holds non-finite values"),
        (["run", "--images", "{big_png}", "--max-size", "0"], "--max-size must be >= 1, got 0"),
        (["demo", "--samples", "camera", "--config", "{bomb_yaml}"], "expands to more than 10000 values"),
        (["demo", "--samples", "camera", "--config", "{int_key_yaml}"], "keys must be strings"),
        (["demo", "--samples", "camera", "--out", "{bomb_png}"], "exists and is not a folder"),
    ],
)
def test_issue12_cli_errors_are_one_line(tmp_path, capsys, files12, argv, match):
    """Exit 2 (a user error, not 1 with a foreign exception name), one line, no output."""
    argv = [a.format(**files12) for a in argv]
    out = [] if "--out" in argv else ["--out", str(tmp_path / "out")]
    rc = main([*argv, *out, "--max-size", "16", "--repeats", "1"] if "--max-size" not in argv else [*argv, *out])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith(f"vispos {argv[0]}: error:") and match in err, err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()
