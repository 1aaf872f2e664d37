"""The flags of the two DETR training tasks (2D photographs, 3D volumes), with the data names
they offer, torch-free.

:mod:`vispos.app.train.task2d` and :mod:`vispos.app.train.task3d` build their tasks from
:data:`FLAGS_2D` and :data:`FLAGS_3D`; ``vispos train`` parses them before torch is imported.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import NoReturn

from .._flags import int_at_least, positive_float
from ._args import TaskFlags

__all__ = ["FLAGS_2D", "FLAGS_3D", "TRAIN_PHOTOS", "HELDOUT_PHOTOS", "MAX_SIDE", "MAX_VIT_REGISTERS", "VIT", "VIT_NAME", "VIT_POS",
           "VOLUMES", "TRAIN_VOLUMES", "HELDOUT_VOLUMES", "add_lesion_arguments", "check_volume_names"]

# ---------------------------------------------------------------------------------------- 2D
#: scikit-image sample photographs used as training backgrounds (all shipped, no download)
TRAIN_PHOTOS = (
    "astronaut", "coffee", "chelsea", "rocket", "camera", "moon", "page", "immunohistochemistry",
    "hubble_deep_field", "retina", "grass", "gravel", "brick", "colorwheel",
)
#: held-out backgrounds: other scikit-image photographs and matplotlib's grace_hopper.jpg
HELDOUT_PHOTOS = ("text", "clock", "coins", "grace_hopper")
#: the largest photo side and resize scale the demo accepts (px)
MAX_SIDE = 2048
#: the ``--backbone`` value of the small vision transformer below (any other value is a timm model name)
VIT_NAME = "vit"
#: ``--backbone vit``: a small vision transformer trained from scratch (timm ``Eva``, the class of
#: timm's RoPE ViTs and EVA-02): patch 8 (stride 8, as the CNN's default level), 4 blocks of width
#: 64, 4 heads, MLP ratio 4, a class token, no layer scale; the last block is the level
VIT = {"patch_size": 8, "depth": 4, "embed_dim": 64, "num_heads": 4, "mlp_ratio": 4.0}
#: ``--vit-pos``: the ViT's own position signal: none, MAE's fixed 2D sin-cos table, a learned table
#: (both resampled to each image's patch grid, as timm's ``dynamic_img_size``), axial RoPE
VIT_POS = ("none", "sincos", "learned", "rope")
#: ``--backbone vit``'s training defaults: the small ViT from scratch leaves the first plateau at
#: 3e-4 and needs the longer schedule (docs/training.md, "A task the ViT learns")
VIT_TRAINING = {"lr": 3e-4, "steps": 6000, "eval_every": 600}
#: ``--vit-stem``: ``conv``, log2(patch) 3x3 stride-2 convolutions (batch norm and ReLU after each,
#: channels doubling up to the width) and a 1x1 convolution, on the patch grid (Xiao et al., Early
#: convolutions help transformers see better, NeurIPS 2021); ``patch``, ViT's one patch-sized
#: convolution per token
VIT_STEMS = ("conv", "patch")
#: ``--vit-registers``: the most register tokens (Darcet et al., Vision transformers need registers,
#: ICLR 2024, use 4 to 16)
MAX_VIT_REGISTERS = 64


def _add_arguments_2d(g: argparse._ArgumentGroup) -> None:
    pos1 = int_at_least(1)
    g.add_argument("--photo-size", type=pos1, default=128, help="longer side of the photographs (px)")
    g.add_argument("--scales", type=pos1, nargs="+", default=[96, 112, 128],
                   help="multi-scale resize: longer sides (px)")
    g.add_argument("--photos", type=pos1, default=len(TRAIN_PHOTOS), help="training photographs used")
    g.add_argument("--max-objects", type=pos1, default=2, help="objects per image: 1 to this")
    # 32-64 px (was 20-56): the task then learns at every seed (docs/training.md, "A task that learns
    # every time"); at 20-56 some seeds had not left the first plateau after 3000 steps
    g.add_argument("--min-object", type=int_at_least(4), default=32, help="smallest object side (px)")
    g.add_argument("--max-object", type=pos1, default=64, help="largest object side (px)")
    vit = ", ".join(f"{k} {v:g}" for k, v in VIT.items())
    g.add_argument("--backbone", default="test_resnet",
                   help=f"timm model (pretrained=False), or vit: a small ViT from scratch (timm Eva: {vit}; "
                        "class token, no layer scale; its position signal from --vit-pos)")
    g.add_argument("--out-index", type=int_at_least(0), default=None,
                   help="timm feature index (a CNN: 2 stride 8, 3 stride 16; a ViT: the block). Default: 2, "
                        "or the last block of a ViT")
    g.add_argument("--vit-pos", choices=VIT_POS, default=None,
                   help="--backbone vit's own position encoding: none, sincos (MAE's fixed table), learned "
                        "(a table, as ViT), rope (axial RoPE, timm's RoPE ViT); the tables are resampled to "
                        "each image's patch grid (default learned)")
    g.add_argument("--vit-patch", type=pos1, default=None,
                   help=f"--backbone vit's patch size and stride (px; default {VIT['patch_size']}; a power of 2 "
                        "with --vit-stem conv)")
    g.add_argument("--vit-depth", type=pos1, default=None,
                   help=f"--backbone vit's transformer blocks (default {VIT['depth']}; the last is the level)")
    g.add_argument("--vit-width", type=pos1, default=None,
                   help=f"--backbone vit's token width (default {VIT['embed_dim']}; a multiple of its "
                        f"{VIT['num_heads']} heads, and of patch / 2 with --vit-stem conv)")
    g.add_argument("--vit-registers", type=int_at_least(0), default=0, metavar="N",
                   help="--backbone vit's register tokens: N learned prefix tokens beside the class token, "
                        "attended to and kept per image like it (Darcet et al. 2024; timm's num_reg_tokens; "
                        f"at most {MAX_VIT_REGISTERS}; default 0)")
    g.add_argument("--vit-stem", choices=VIT_STEMS, default=None,
                   help="--backbone vit's patch embedding: conv, 3x3 stride-2 convolutions with batch norm and "
                        "ReLU, then a 1x1 (Xiao et al. 2021; the default: the ViT from scratch learns the task "
                        "with it); patch, ViT's one patch-sized convolution")
    g.add_argument("--packed", action="store_true",
                   help="token backbones only (--backbone vit, timm ViT / Eva): every image's tokens in one "
                        "sequence without padding tokens, exact per image like --padding-invariant (not both)")


FLAGS_2D = TaskFlags(
    name="2d",
    description="A small DETR trained on padded batches of real photographs, and the position-embedding "
                "ablation.",
    add_arguments=_add_arguments_2d,
    tiny_defaults={"photo_size": 64, "scales": [48, 64], "min_object": 8, "max_object": 24, "photos": 3},
    backbone_defaults={VIT_NAME: VIT_TRAINING},
)

# ---------------------------------------------------------------------------------------- 3D
#: every shipped volume this module knows: name -> (package, what it is)
VOLUMES = {
    "mni152_t1": ("nilearn", "MNI152 2009 T1 template, 1 mm"),
    "mni152_gm": ("nilearn", "MNI152 2009 grey-matter probability map, 1 mm"),
    "mni152_wm": ("nilearn", "MNI152 2009 white-matter probability map, 1 mm"),
    "epi": ("nibabel", "example4d.nii.gz, first frame: EPI, 2 x 2 x 2.2 mm"),
    "anatomical": ("nibabel", "anatomical.nii: T1, 2 mm, partial field of view"),
    "b0": ("dipy", "aniso_vox.nii.gz: diffusion b0, 4 x 4 x 5 mm"),
}
#: training volumes (whole volumes: none of them is used for evaluation)
TRAIN_VOLUMES = ("mni152_t1", "mni152_gm", "mni152_wm", "epi")
#: held-out volumes (other scans, other subjects, other contrasts)
HELDOUT_VOLUMES = ("anatomical", "b0")


def add_lesion_arguments(g: argparse._ArgumentGroup, where: str, max_objects: int, min_object: int,
                         contrast: tuple[float, float]) -> None:
    """``--max-objects``, ``--min-object``, ``--max-object`` and ``--contrast``: the lesions drawn
    into each ``where`` (a volume, a crop) by the 3D tasks, with that task's defaults."""
    pos1 = int_at_least(1)
    g.add_argument("--max-objects", type=pos1, default=max_objects, help=f"lesions per {where}: 1 .. this")
    g.add_argument("--min-object", type=pos1, default=min_object, help="smallest lesion side (voxels)")
    g.add_argument("--max-object", type=pos1, default=12, help="largest lesion side (voxels)")
    g.add_argument("--contrast", type=positive_float, nargs=2, default=list(contrast), metavar=("MIN", "MAX"),
                   help="lesion contrast against the surrounding tissue (tissue standard deviations, either sign)")


def check_volume_names(args: argparse.Namespace, error: Callable[[str, str], NoReturn]) -> None:
    """``--volumes`` and ``--heldout-volumes``: each a known volume or ``nifti:<path>``, and no
    held-out volume trained on (``error(flag, message)`` otherwise)."""
    for flag, names in (("--volumes", args.volumes), ("--heldout-volumes", args.heldout_volumes)):
        for name in names:
            if name not in VOLUMES and not name.startswith("nifti:"):
                error(flag, f"unknown volume {name!r}; expected one of {tuple(VOLUMES)} or nifti:<path>")
    overlap = set(args.volumes) & set(args.heldout_volumes)
    if overlap:
        error("--heldout-volumes", f"held-out volumes must not be trained on: {sorted(overlap)}")


def _add_arguments_3d(g: argparse._ArgumentGroup) -> None:
    pos1 = int_at_least(1)
    g.add_argument("--volumes", nargs="+", default=list(TRAIN_VOLUMES),
                   help=f"training volumes: of {tuple(VOLUMES)} or nifti:<path> (default {' '.join(TRAIN_VOLUMES)})")
    g.add_argument("--heldout-volumes", nargs="+", default=list(HELDOUT_VOLUMES),
                   help=f"held-out volumes, never trained on (default {' '.join(HELDOUT_VOLUMES)})")
    g.add_argument("--spacing", type=positive_float, default=3.0, help="common isotropic voxel size (mm)")
    g.add_argument("--crop", type=pos1, nargs=2, default=[16, 32], metavar=("MIN", "MAX"),
                   help="crop side in voxels, drawn per axis (clipped to the volume)")
    add_lesion_arguments(g, "crop", max_objects=1, min_object=6, contrast=(4.0, 6.0))
    g.add_argument("--widths", type=pos1, nargs="+", default=[16],
                   help="MONAI ResNet block widths, one per stage used (1 stage: stride 4, 2: stride 8)")
    g.add_argument("--stem-kernel", type=pos1, default=3, help="MONAI ResNet stem kernel (conv1_t_size)")


FLAGS_3D = TaskFlags(
    name="3d",
    description="A small 3D DETR trained on padded batches of real MRI volumes, and the 3D "
                "position-embedding ablation.",
    add_arguments=_add_arguments_3d,
    defaults={"hidden": 48, "ffn": 96, "batch_size": 4, "steps": 2000, "eval_every": 250, "memory_warmup": 300},
    doc="docs/training3d.md",
    tiny_defaults={"spacing": 4.0, "crop": [12, 20], "min_object": 3, "max_object": 8, "widths": [8, 16],
                   "hidden": 24, "ffn": 48, "eval_every": None, "memory_warmup": None},
)
