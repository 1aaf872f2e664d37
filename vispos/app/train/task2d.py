"""A small DETR trained on padded batches of real photographs, and the position-embedding ablation.

Data (:mod:`vispos.app.train.shapes2d`): solid shapes with exact boxes (three classes:
rectangle, circle, triangle) pasted onto real photographs shipped with scikit-image and
matplotlib, flipped and resized to several scales, so every batch is padded by
:class:`vispos.PaddedCollate`. Held-out images use other photographs.

Model and training come from the shared core (:mod:`vispos.app.train`, also used by the 3D task): a
timm backbone (``pretrained=False``) -> :class:`vispos.backbones.Joiner` -> ``DetrEncoder`` ->
DETR's decoder (zero targets, learned query positions on queries and keys at every layer, memory
positions on the cross-attention's keys only) -> class and box heads; Hungarian matching and
DETR's losses with ``torchvision.ops`` geometry; held-out COCO mAP / AP50 / AP75 from
``torchmetrics`` and the mean IoU of matched boxes.

Position embeddings (``--pos``, same seed, data, initial weights and steps in every arm):
``none`` (zeros), ``grid`` (``vispos.PositionalEncodingPermute2D`` over the padded canvas, blind
to the mask), ``sine`` (``vispos.PositionEmbeddingSine(normalize=True)`` on the mask).

    vispos train --steps 3000 --out runs/detr --pos sine --seed 0 --threads 1
    vispos train --out runs/detr --report     # tables over seeds, curves
    torchrun --nproc_per_node 2 -m vispos.app.train.task2d --steps 3000 --batch-size 4 --out runs/ddp
    vispos train --tiny --out /tmp/detr-tiny    # seconds, for CI

Writes ``OUT/<arm>/seed<S>/metrics.json`` (per step: losses, learning rate, seconds, resident
memory, padded fraction; every ``--eval-every`` steps the held-out metrics), optionally
``checkpoint.pt`` next to it, and ``OUT/ablation.md`` and ``OUT/curves.png`` over every run found
under ``OUT``. See docs/training.md.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import NoReturn

import torch
from torch import nn

import vispos

from ...backbones import TimmBackbone
from ...invariance import rule_for
from .._model_names import backbone_problem
from ._task_args import FLAGS_2D, MAX_SIDE, MAX_VIT_REGISTERS, TRAIN_PHOTOS, VIT, VIT_NAME, VIT_POS, VIT_STEMS
from .cli import run
from .criterion import BOX_OPS_2D
from .metrics import coco_map
from .shapes2d import CLASSES, HELDOUT_PHOTOS, ShapesOnPhotos, load_photos
from .task import DetrTask

__all__ = ["TASK", "VIT_NAME", "build_backbone", "build_datasets", "conv_stem", "vit_model_kwargs", "main"]

#: ``--backbone vit``; the timm model it is built from (:data:`VIT` sets its sizes)
VIT_BASE = "vit_small_patch16_rope_224"


def validate(args: argparse.Namespace, error) -> NoReturn | None:
    if args.photos > len(TRAIN_PHOTOS):
        error("--photos", f"at most {len(TRAIN_PHOTOS)} training photographs exist, got {args.photos}")
    if args.photo_size > MAX_SIDE:
        error("--photo-size", f"must be <= {MAX_SIDE}, got {args.photo_size}")
    if any(s > MAX_SIDE for s in args.scales):
        error("--scales", f"must be <= {MAX_SIDE}, got {args.scales}")
    if args.min_object > args.max_object:
        error("--min-object", f"must be <= --max-object {args.max_object}, got {args.min_object}")
    if args.max_object > args.photo_size:
        error("--max-object", f"must be <= --photo-size {args.photo_size}, got {args.max_object}")
    if args.queries < args.max_objects:
        error("--queries", f"must be >= --max-objects {args.max_objects} (one query per object), got {args.queries}")
    if args.size_divisibility > max(args.scales):
        error("--size-divisibility", f"must be <= the largest of --scales ({max(args.scales)}): a larger one "
              f"only adds padding, got {args.size_divisibility}")
    for flag, value in (("--vit-pos", args.vit_pos), ("--vit-patch", getattr(args, "vit_patch", None)),
                        ("--vit-stem", getattr(args, "vit_stem", None)),
                        ("--vit-depth", getattr(args, "vit_depth", None)),
                        ("--vit-width", getattr(args, "vit_width", None)),
                        ("--vit-registers", getattr(args, "vit_registers", 0) or None)):
        if args.backbone != VIT_NAME and value is not None:
            error(flag, f"only with --backbone {VIT_NAME} (the small ViT's own setting), got --backbone "
                  f"{args.backbone}")
    if getattr(args, "vit_registers", 0) > MAX_VIT_REGISTERS:
        error("--vit-registers", f"must be <= {MAX_VIT_REGISTERS}, got {args.vit_registers}")
    if args.backbone == VIT_NAME:
        args.vit_pos = args.vit_pos or "learned"
        args.vit_patch = getattr(args, "vit_patch", None) or VIT["patch_size"]
        args.vit_stem = getattr(args, "vit_stem", None) or VIT_STEMS[0]
        if args.vit_stem == "conv" and (args.vit_patch < 2 or args.vit_patch & (args.vit_patch - 1)):
            error("--vit-patch", f"must be a power of 2 >= 2 with --vit-stem conv (stride-2 convolutions), got "
                  f"{args.vit_patch}")
        args.vit_depth = getattr(args, "vit_depth", None) or VIT["depth"]
        args.vit_width = getattr(args, "vit_width", None) or VIT["embed_dim"]
        if args.vit_width % VIT["num_heads"]:
            error("--vit-width", f"must be a multiple of the ViT's {VIT['num_heads']} heads, got {args.vit_width}")
        if args.vit_stem == "conv" and args.vit_width % (args.vit_patch // 2):
            error("--vit-width", f"must be a multiple of patch / 2 = {args.vit_patch // 2} with --vit-stem conv "
                  f"(the stem's channels halve per stride-2 convolution), got {args.vit_width}")
        if min(args.scales) < args.vit_patch:
            error("--scales", f"must be >= the ViT's patch ({args.vit_patch} px), got {args.scales}")
    else:
        import timm

        if not timm.is_model(args.backbone):
            problem = backbone_problem(args.backbone, "timm", also=(VIT_NAME,)) or f"{args.backbone!r} is not a timm model name"
            error("--backbone", f"{problem} ({VIT_NAME}: a small ViT)")
    if args.out_index is None:
        args.out_index = args.vit_depth - 1 if args.backbone == VIT_NAME else 2
    if args.packed and args.padding_invariant:
        error("--packed", "is exact per image already (the invariant run without padding tokens): pass --packed "
              "or --padding-invariant, not both")
    try:
        build_backbone(args, padding_invariant=False, packed=False)
    except (ValueError, IndexError) as exc:
        error("--out-index", str(exc))
    for flag, on in (("--padding-invariant", args.padding_invariant), ("--packed", args.packed)):
        if on:
            try:
                build_backbone(args)
            except ValueError as exc:
                error(flag, f"--backbone {args.backbone}: {str(exc).splitlines()[0]}")
    return None


def build_datasets(args: argparse.Namespace) -> tuple[ShapesOnPhotos, ShapesOnPhotos]:
    obj = dict(max_objects=args.max_objects, min_size=args.min_object, max_size=args.max_object)
    train = ShapesOnPhotos(load_photos(TRAIN_PHOTOS[: args.photos], args.photo_size), args.train_images,
                           args.seed, args.scales, True, **obj)
    held = ShapesOnPhotos(load_photos(HELDOUT_PHOTOS, args.photo_size), args.eval_images, args.seed + 1,
                          args.scales, False, **obj)
    return train, held


def vit_model_kwargs(vit_pos: str, img_size: int, patch_size: int = VIT["patch_size"], registers: int = 0,
                     depth: int = VIT["depth"], embed_dim: int = VIT["embed_dim"]) -> dict:
    """``timm.create_model`` options of ``--backbone vit`` (:data:`VIT`) with position arm ``vit_pos``.

    The model is timm's ``vit_small_patch16_rope_224`` (class ``Eva``) resized to :data:`VIT`, with
    ``img_size`` the side of its position table's grid (``img_size / patch`` cells, resampled to
    each image's grid), ``patch_size`` its patch (``--vit-patch``). ``none``: no table, no RoPE;
    ``sincos`` / ``learned``: a table (filled by :func:`build_backbone`); ``rope``: timm's axial
    RoPE (temperature 100, patch coordinates), no table. ``registers`` (``--vit-registers``):
    ``Eva``'s ``num_reg_tokens``, learned prefix tokens after the class token (no RoPE on them,
    like the class token; a table has a row for each). ``depth`` / ``embed_dim``
    (``--vit-depth`` / ``--vit-width``): the blocks and the token width.

    Raises:
        ValueError: ``vit_pos`` not in :data:`VIT_POS`; ``registers`` negative.
    """
    if vit_pos not in VIT_POS:
        raise ValueError(f"vit_pos must be one of {VIT_POS}, got {vit_pos!r}")
    if not isinstance(registers, int) or registers < 0:
        raise ValueError(f"registers must be an int >= 0, got {registers!r}")
    kwargs = {**VIT, "patch_size": patch_size, "depth": depth, "embed_dim": embed_dim, "img_size": img_size,
              "init_values": None,
              "use_abs_pos_emb": vit_pos in ("sincos", "learned"), "use_rot_pos_emb": vit_pos == "rope"}
    return {**kwargs, "num_reg_tokens": registers} if registers else kwargs


def conv_stem(patch: int, embed_dim: int, in_chans: int = 3) -> nn.Sequential:
    """``--vit-stem conv``: ``log2(patch)`` 3x3 stride-2 convolutions (padding 1, no bias), each
    followed by batch norm and ReLU, channels doubling up to ``embed_dim`` (``embed_dim / 2^(k-1)``
    ... ``embed_dim``), then a 1x1 convolution: one token per ``patch`` x ``patch`` cell of the
    image, as the patch projection it replaces (``PatchEmbed.proj``), each token reading a
    neighbourhood wider than its patch.

    Args:
        patch (int): the patch side (px), a power of 2 >= 2.
        embed_dim (int): the tokens' width (divisible by ``patch / 2``).
        in_chans (int): the image's channels.

    Returns:
        nn.Sequential: ``(B, in_chans, H, W)`` -> ``(B, embed_dim, H / patch, W / patch)`` for sides
        that are multiples of ``patch`` (``PatchEmbed`` pads to them).

    Raises:
        ValueError: ``patch`` not a power of 2 >= 2, or ``embed_dim`` not divisible by ``patch / 2``.

    References:
        Xiao et al., Early Convolutions Help Transformers See Better, NeurIPS 2021 (3x3 stride-2
        convolutions, batch norm, ReLU, a final 1x1).
    """
    if patch < 2 or patch & (patch - 1):
        raise ValueError(f"patch must be a power of 2 >= 2, got {patch!r}")
    n = patch.bit_length() - 1
    if embed_dim % 2 ** (n - 1):
        raise ValueError(f"embed_dim must be divisible by patch / 2 = {2 ** (n - 1)}, got {embed_dim!r}")
    widths = [in_chans] + [embed_dim // 2 ** (n - 1 - k) for k in range(n)]
    layers: list[nn.Module] = []
    for c_in, c_out in zip(widths[:-1], widths[1:]):
        layers += [nn.Conv2d(c_in, c_out, 3, 2, 1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True)]
    return nn.Sequential(*layers, nn.Conv2d(embed_dim, embed_dim, 1))


def _vit(args: argparse.Namespace, vit_pos: str, **options) -> TimmBackbone:
    """The small ViT of ``--vit-pos vit_pos`` with ``--vit-stem`` (the conv stem drawn after timm's
    weights, from the same random state); a padding-invariant or packed one is checked again once
    its stem is in (the rule book refuses what it cannot make exact, by name)."""
    patch = getattr(args, "vit_patch", None) or VIT["patch_size"]
    registers = getattr(args, "vit_registers", 0) or 0
    sizes = {"depth": getattr(args, "vit_depth", None) or VIT["depth"],
             "embed_dim": getattr(args, "vit_width", None) or VIT["embed_dim"]}
    backbone = TimmBackbone(VIT_BASE, model_kwargs=vit_model_kwargs(vit_pos, max(args.scales), patch, registers,
                                                                    **sizes), **options)
    if (getattr(args, "vit_stem", None) or VIT_STEMS[0]) == "conv":
        model = backbone.body.model
        model.patch_embed.proj = conv_stem(patch, model.embed_dim)
        if options.get("padding_invariant") or options.get("packed"):
            rule_for(model).check(model)
    return backbone


def build_backbone(args: argparse.Namespace, padding_invariant: bool | None = None,
                   packed: bool | None = None) -> TimmBackbone:
    """The task's backbone: ``--backbone`` (a timm model or ``vit``), ``--out-index``,
    ``--padding-invariant`` and ``--packed`` (``padding_invariant`` / ``packed``, when given, win).

    ``--backbone vit``: every ``--vit-pos`` arm starts from the weights the ``learned`` arm draws
    from the same random state (and leaves the random state as it does), less the table: the arms
    differ only in the position signal. With ``sincos`` the table is MAE's fixed 2D sin-cos
    (:func:`vispos.mae_sincos_2d`, zero for the class token) and is not trained. ``--vit-stem
    conv`` puts :func:`conv_stem` in ``patch_embed.proj``; ``--vit-registers N`` gives the ViT ``N``
    register tokens (their rows of a sin-cos table are zeros, as the class token's).

    Raises:
        ValueError: from :class:`~vispos.backbones.TimmBackbone` (a model ``padding_invariant`` or
            ``packed`` refuses, by name; an unavailable ``out_index``).
    """
    options = dict(out_indices=(args.out_index,), pretrained=False,
                   padding_invariant=args.padding_invariant if padding_invariant is None else padding_invariant,
                   packed=getattr(args, "packed", False) if packed is None else packed)
    if args.backbone != VIT_NAME:
        return TimmBackbone(args.backbone, **options)
    if args.vit_pos == "learned":
        backbone = _vit(args, "learned", **options)
    else:  # the learned arm's weights (same random draws), without its table: the arms differ in position only
        before = torch.random.get_rng_state()
        learned = _vit(args, "learned", pretrained=False, out_indices=(args.out_index,))
        after = torch.random.get_rng_state()
        torch.random.set_rng_state(before)
        backbone = _vit(args, args.vit_pos, **options)
        torch.random.set_rng_state(after)
        state = learned.body.state_dict()
        if backbone.body.model.pos_embed is None:
            state = {k: v for k, v in state.items() if not k.endswith("pos_embed")}
        backbone.body.load_state_dict(state)
    if args.vit_pos == "sincos":
        vit = backbone.body.model
        table = vit.pos_embed  # (1, P + gh * gw, C): the prefix tokens' rows first (class, registers)
        sincos = vispos.mae_sincos_2d(table.shape[-1], vit.patch_embed.grid_size, cls_token=True, dtype=table.dtype)
        with torch.no_grad():  # MAE's zero row for the class token, and one for each register
            table.copy_(torch.cat([sincos.new_zeros(vit.num_prefix_tokens - 1, sincos.shape[-1]), sincos])[None])
        table.requires_grad_(False)
    return backbone


TASK = DetrTask.from_flags(
    FLAGS_2D,
    classes=CLASSES,
    box_ops=BOX_OPS_2D,
    validate=validate,
    build_datasets=build_datasets,
    build_backbone=build_backbone,
    metric=coco_map,
    metric_names=("map", "ap50", "ap75"),
    headline="ap50",
)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m vispos.app.train.task2d`` (and ``python -m demos.train_detr`` in a clone); see
    the module docstring and ``--help``."""
    return run(TASK, argv)


if __name__ == "__main__":
    raise SystemExit(main())