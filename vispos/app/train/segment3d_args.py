"""The flags of 3D segmentation training (``vispos train --volume --task segment``), torch-free.

So ``--help`` and a usage error are answered before torch is imported. The run flags (``--steps``,
``--out``, ``--seed``, ``--threads``, ``--tiny``, ``--report``, ``--save-every``, ``--resume``,
``--device``, ``--workers``, ``--batch-size``, ``--train-images``, ``--eval-images``,
``--eval-every``, ``--lr``, ``--weight-decay``, ``--warmup``, ``--clip``, ``--volumes``,
``--heldout-volumes``, ``--max-objects``, ``--min-object``, ``--max-object``, ``--contrast``)
keep the detection task's names and meanings (:mod:`vispos.app.train._args`,
:mod:`vispos.app.train._task_args`); the others are the segmentation task's own. The checks
that need the data or torch are :mod:`vispos.app.train.segment3d`'s.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from .._errors import OneLineParser
from .._flags import add_threads_argument, int_at_least, nonnegative_float, positive_float
from ._args import flag_error
from ._task_args import HELDOUT_VOLUMES, TRAIN_VOLUMES, VOLUMES, add_lesion_arguments, check_volume_names

__all__ = ["SEGMENT_DOC", "PIPELINES", "NETWORKS", "UNETR_POS", "TINY_SEGMENT", "SIZE_MULTIPLE", "build_segment_parser",
           "parse_segment_flags", "run_folder"]

#: the page that documents the segmentation training (``--help``, ``--tiny``'s closing hint)
SEGMENT_DOC = "docs/segmentation3d.md"
#: ``--pipeline``: (a) MONAI's crop-and-slide, (b) whole volumes in padded batches through the
#: stock network, (c) the same through the network made exact by ``vispos.make_padding_invariant``
PIPELINES = ("crop", "whole", "invariant")
#: ``--network``: MONAI SegResNet (default), DynUNet, or UNETR as :class:`vispos.monai.AnySizeUNETR`
NETWORKS = ("segresnet", "dynunet", "unetr")
#: ``--unetr-pos``: UNETR's position embedding: its learned table (resampled to each item's
#: patch grid) or MONAI's sin-cos table (recomputed for each grid)
UNETR_POS = ("learned", "sincos")
#: every volume side is a multiple of this (the total stride of SegResNet and DynUNet here, so
#: that their skip connections line up on every volume and every padded batch)
SIZE_MULTIPLE = 8
#: ``--tiny``'s defaults: seconds per pipeline on one core, shows that the run goes end to end
TINY_SEGMENT = {"steps": 6, "batch_size": 2, "eval_images": 4, "train_images": 0, "sizes": [16, 24],
                "patch": 16, "features": 4, "min_object": 3, "max_object": 6, "eval_every": 3, "warmup": 2,
                "unetr_hidden": 24}


def _add_arguments(p: argparse.ArgumentParser) -> None:
    pos1, pos0 = int_at_least(1), int_at_least(0)
    g = p.add_argument_group("run")
    g.add_argument("--volume", action="store_true", help="a 3D task (required with --task segment)")
    g.add_argument("--task", choices=("detect", "segment"), default="segment",
                   help="segment: this task; detect: the 3D DETR (`vispos train --volume --help`)")
    g.add_argument("--pipeline", choices=PIPELINES, default="invariant",
                   help="crop: MONAI RandCropByPosNegLabeld patches and sliding_window_inference; whole: padded "
                        "batches of whole volumes, stock network; invariant: as whole, the network made exact "
                        "by vispos.make_padding_invariant")
    g.add_argument("--network", choices=NETWORKS, default="segresnet",
                   help="MONAI SegResNet, DynUNet, or UNETR (vispos.monai.AnySizeUNETR; --pipeline invariant only)")
    g.add_argument("--unetr-pos", choices=UNETR_POS, default="learned",
                   help="--network unetr: its learned position table resampled per item, or MONAI's sin-cos")
    g.add_argument("--steps", type=pos1, default=250, help="optimiser steps (default %(default)s)")
    g.add_argument("--out", default="runs/segment3d",
                   help="output root: OUT/<pipeline>/<network>/seed<S>/ (metrics.json, prediction.pt, "
                        "checkpoint.pt); --report and --figure read every run under it")
    g.add_argument("--device", default="cpu", help="cpu or cuda (under torchrun: cuda:LOCAL_RANK)")
    g.add_argument("--seed", type=pos0, default=0, help="data, held-out volumes, initial weights and data order")
    add_threads_argument(g, machine_default=False)
    g.add_argument("--workers", type=pos0, default=0, help="DataLoader worker processes")
    g.add_argument("--tiny", action="store_true",
                   help=f"a quick run ({TINY_SEGMENT['steps']} steps, {TINY_SEGMENT['sizes'][0]}-"
                        f"{TINY_SEGMENT['sizes'][1]} voxel volumes, {TINY_SEGMENT['eval_images']} held-out); shows "
                        "that the run goes end to end, not accuracy (explicit flags win)")
    g.add_argument("--force", action="store_true",
                   help="replace a finished run of the same pipeline, network and seed under OUT (without it, such "
                        "a run is never overwritten: give another --out, or --resume an unfinished run)")
    g.add_argument("--report", action="store_true",
                   help="train nothing: write OUT/segment3d.md, the tables over every run under OUT")
    g.add_argument("--figure", action="store_true",
                   help="train nothing: draw OUT/segment3d_seed<S>.png, one held-out volume's slices with the "
                        "ground truth and each pipeline's prediction (from OUT/*/<network>/seed<S>/prediction.pt)")
    g.add_argument("--save-every", type=pos0, default=0, help="write checkpoint.pt every K steps (0: never)")
    g.add_argument("--resume", default=None, help="continue from this checkpoint")
    g = p.add_argument_group("data")
    g.add_argument("--volumes", nargs="+", default=list(TRAIN_VOLUMES),
                   help=f"training volumes: of {tuple(VOLUMES)} or nifti:<path>")
    g.add_argument("--heldout-volumes", nargs="+", default=list(HELDOUT_VOLUMES),
                   help="held-out volumes, never trained on")
    g.add_argument("--sizes", type=pos1, nargs=2, default=[32, 64], metavar=("MIN", "MAX"),
                   help=f"volume side in voxels, drawn per axis from the multiples of {SIZE_MULTIPLE} in [MIN, MAX]")
    g.add_argument("--spacings", type=positive_float, nargs=2, default=[2.0, 4.0], metavar=("MIN", "MAX"),
                   help="voxel size in mm, drawn per axis (anisotropic); the source is resampled to MIN mm first")
    add_lesion_arguments(g, "volume", max_objects=3, min_object=4, contrast=(1.5, 3.0))
    g.add_argument("--batch-size", type=pos1, default=2, help="volumes (or patches, crop) per process and step")
    g.add_argument("--train-images", type=pos0, default=0,
                   help="training volumes per epoch (0: a fresh volume for every sample of the run)")
    g.add_argument("--eval-images", type=pos1, default=8, help="held-out volumes (fixed per seed)")
    g.add_argument("--eval-every", type=pos1, default=50,
                   help="held-out Dice every K steps (batches of 4; crop: sliding window); every composition, "
                        "time and memory at the last step")
    g.add_argument("--patch", type=pos1, default=32, help="crop: the patch side (voxels), training and window")
    g = p.add_argument_group("model and optimisation")
    g.add_argument("--features", type=pos1, default=8,
                   help="width of the first level (SegResNet init_filters, DynUNet filters[0]; doubling per level)")
    g.add_argument("--unetr-hidden", type=int_at_least(8), default=96,
                   help="--network unetr: the ViT width, a multiple of 12 (4 heads, MLP twice as wide, 4 layers, patch 16)")
    g.add_argument("--lr", type=positive_float, default=1e-3)
    g.add_argument("--weight-decay", type=nonnegative_float, default=1e-5)
    g.add_argument("--warmup", type=pos1, default=20, help="linear warm-up steps (1: none)")
    g.add_argument("--clip", type=nonnegative_float, default=1.0, help="gradient max norm (0: no clipping)")


def build_segment_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The parser of ``vispos train --volume --task segment`` (no abbreviated flags)."""
    p = OneLineParser(prog=prog, allow_abbrev=False,
                      description="3D segmentation on whole volumes of different sizes: MONAI networks on padded "
                                  f"batches, exact per volume, against MONAI's crop-and-slide pipeline. See {SEGMENT_DOC}.")
    _add_arguments(p)
    return p


def _check(args: argparse.Namespace, error) -> None:
    """Cross-flag checks that need neither torch nor the data."""
    if not args.volume:
        error("--task", "segment needs --volume (a 3D task)")
    if args.report and args.figure:
        error("--figure", "train nothing twice: give --report or --figure, not both")
    for flag, pair in (("--sizes", args.sizes), ("--spacings", args.spacings), ("--contrast", args.contrast)):
        if pair[0] > pair[1]:
            error(flag, f"MIN must be <= MAX, got {pair[0]:g} {pair[1]:g}")
    lo = -(-args.sizes[0] // SIZE_MULTIPLE) * SIZE_MULTIPLE
    if lo > args.sizes[1]:
        error("--sizes", f"no multiple of {SIZE_MULTIPLE} in [{args.sizes[0]}, {args.sizes[1]}]")
    if args.sizes[1] > 256:
        error("--sizes", f"MAX must be <= 256 voxels, got {args.sizes[1]}")
    if args.min_object > args.max_object:
        error("--min-object", f"must be <= --max-object {args.max_object}, got {args.min_object}")
    if args.max_object > lo:
        error("--max-object", f"must be <= the smallest volume side {lo}, got {args.max_object}")
    if args.pipeline == "crop":
        if args.patch % SIZE_MULTIPLE:
            error("--patch", f"must be a multiple of {SIZE_MULTIPLE} (the network's stride), got {args.patch}")
        if args.patch > lo:
            error("--patch", f"must be <= the smallest volume side {lo} (--sizes), got {args.patch}")
    if args.network == "unetr":
        if args.pipeline != "invariant":
            error("--network", f"unetr runs as vispos.monai.AnySizeUNETR, exact on padded batches: use --pipeline "
                               f"invariant, got --pipeline {args.pipeline}")
        if args.unetr_hidden % 12:
            error("--unetr-hidden", f"must be divisible by 12 (4 heads; a sin and a cos per axis for --unetr-pos "
                                    f"sincos, the same width in both arms), got {args.unetr_hidden}")
    if args.features % 2:
        error("--features", f"must be even (SegResNet's group norm has 2 groups at least), got {args.features}")
    if args.features > 64:
        error("--features", f"must be <= 64, got {args.features}")
    check_volume_names(args, error)
    if args.resume is not None and (args.report or args.figure):
        error("--resume", "trains; it does not go with --report or --figure")


def parse_segment_flags(
    argv: Sequence[str] | None = None, prog: str | None = None,
) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """Parses the flags (defaults, then ``--tiny``'s, then those given) and checks what the flags
    alone show; exits with argparse's status 2 and one line naming the flag otherwise."""
    parser = build_segment_parser(prog)
    first, _ = parser.parse_known_args(argv)
    if first.tiny:
        parser.set_defaults(**TINY_SEGMENT)
    args = parser.parse_args(argv)
    _check(args, flag_error(parser))
    return parser, args


def run_folder(args: argparse.Namespace) -> str:
    """``<pipeline>[-<unetr-pos>]/<network>/seed<S>`` under ``--out``: the pipelines of one network
    share the arm name (the network), so ``python -m vispos.app.train.compare --stock OUT/whole
    --invariant OUT/invariant`` pairs them by seed."""
    import os

    pipe = args.pipeline + (f"-{args.unetr_pos}" if args.network == "unetr" else "")
    return os.path.join(args.out, pipe, args.network, f"seed{args.seed}")
