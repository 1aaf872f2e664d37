"""The work of ``vispos plot KIND``: one figure of an encoder, written to a PNG.

Imported only when ``vispos plot`` runs (torch, the core and the figures come with it; its
arguments are parsed by :mod:`vispos.app._plot_args`).

Kinds (one per :mod:`vispos.app.figures` figure function):

* ``channels``: channel heatmaps over a 1D or 2D grid (:func:`vispos.app.figures.plot_channels`);
* ``curves``: sin / cos curves of chosen channels with their wavelengths
  (:func:`vispos.app.figures.plot_sincos_curves`);
* ``wavelengths``: wavelength against channel for several temperatures and ladders
  (:func:`vispos.app.figures.plot_wavelengths`);
* ``similarity``: cosine-similarity maps of query cells, 2D or 3D slices
  (:func:`vispos.app.figures.plot_similarity`);
* ``batch``: a padded batch of scikit-image's sample photos and its masks
  (:func:`vispos.app.figures.plot_padded_batch`);
* ``coords``: DETR's normalised coordinates of those items at a feature stride, next to a
  mask-blind grid (:func:`vispos.app.figures.plot_normalized_coords`);
* ``rotary``: the relative-offset invariance of ``q . k`` (:func:`vispos.app.figures.plot_rotary_invariance`);
* ``rope``: a vision RoPE (DINOv3, RoPE-Mixed) on the padded batch of sample photos, mask-blind
  against mask-aware against each item alone (:func:`vispos.app.figures.plot_rope_padding`);
* ``rope-periods``: the period bands of axial RoPE, DINOv3 (both schedules) and RoPE-Mixed at a
  token grid (:func:`vispos.app.figures.plot_rope_periods`).

The encoder is chosen by a registered name and keyword arguments
(``--encoder PositionEmbeddingSine --kw normalize=true``) or by a config file (``--config``; a
``Joiner`` config gives its ``position_embedding``). The CLI owns the terminal; this module
only builds the figure and writes it.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

import torch

from ..config import build_from_config, load_config
from ..encodings import PositionEmbeddingSine, RotaryEmbedding
from ..batching import nested_tensor_from_tensor_list
from ..nested_tensor import interpolate_mask
from ..padding import mask_sizes
from . import figures
from ._errors import CLIError
from ._plot_args import (
    _DEFAULT_SHAPES,
    KINDS,
    MAX_CANVAS_PIXELS,
    MAX_WORK_BYTES,
    check_plot_args,
    grid_shape,
    output_path,
)
from .data import sample_images
from .png import save_figure

__all__ = ["execute", "write_plot"]


def _value(text: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _encoder(args: argparse.Namespace) -> torch.nn.Module:
    if args.config is not None and (args.encoder is not None or args.kw):
        raise CLIError("--config cannot be combined with --encoder / --kw")
    if args.config is not None:
        cfg = load_config(args.config)
    else:
        default = KINDS[args.kind][1]
        cfg = dict(default) if args.encoder is None else {"type": args.encoder}
        if args.encoder is None and args.kind == "similarity" and args.spacing and not args.voxel_positions:
            # millimetres survive DETR's normalisation only under one length for every axis:
            # the grid's longest side in mm (without it the spacing would cancel)
            sides = [n * s for n, s in zip(grid_shape(args), args.spacing)]
            if sides and all(0 < v < math.inf for v in sides) and cfg.get("normalize"):
                cfg["extent"] = max(sides)
        for item in args.kw:
            key, sep, text = item.partition("=")
            if not sep or not key:
                raise CLIError(f"--kw expects KEY=VALUE, got {item!r}")
            cfg[key] = _value(text)
    built = build_from_config(cfg)
    # a Joiner exists only once its config imported vispos.backbones (timm, torchvision): an
    # encoder's config draws without importing them
    backbones = sys.modules.get("vispos.backbones")
    if backbones is not None and isinstance(built, backbones.Joiner):  # draw its embedding
        built = built.position_embedding
    if not isinstance(built, torch.nn.Module):
        raise CLIError(f"the encoder must be a module, the config built a {type(built).__name__}")
    return built.eval()


def _check_work(encoder: torch.nn.Module, shape: tuple[int, ...]) -> None:
    """Refuses an encoding of more than :data:`MAX_WORK_BYTES`, measured on one cell (the
    channel count comes from the encoder's own arguments, ``--kw num_pos_feats=...``)."""
    from . import figures

    try:
        channels = figures.encode_grid(encoder, (1,) * len(shape)).shape[0]
    except (TypeError, ValueError):  # an encoder that cannot take this rank: the real call says so
        return
    need = channels * math.prod(shape) * 4
    if need > MAX_WORK_BYTES:
        raise CLIError(
            f"--shape {' '.join(map(str, shape))} with {channels} channels needs "
            f"{need / 2**20:,.0f} MiB for the encoding; at most {MAX_WORK_BYTES // 2**20} MiB: "
            "give a smaller --shape or fewer channels"
        )


def _check_canvas(fig, dpi: int) -> None:
    """Refuses a figure whose rendered canvas would exceed :data:`MAX_CANVAS_PIXELS`."""
    width, height = (float(v) * dpi for v in fig.get_size_inches())
    if width * height > MAX_CANVAS_PIXELS:
        most = int(dpi * math.sqrt(MAX_CANVAS_PIXELS / (width * height)))
        raise CLIError(
            f"--dpi {dpi} would render a {width:,.0f}x{height:,.0f}-pixel figure, more than "
            f"{MAX_CANVAS_PIXELS:,} pixels; give --dpi {most} or less (or fewer panels)"
        )


def _queries(args: argparse.Namespace) -> list[tuple[int, ...]] | None:

    if not args.queries:
        return None
    out = []
    for q in args.queries:
        try:
            out.append(tuple(int(v) for v in q.split(",")))
        except ValueError:
            raise CLIError(f"--queries expects comma-separated ints like 8,12, got {q!r}") from None
    return out


def _spacing(args: argparse.Namespace, shape: tuple[int, ...]) -> list[float] | None:
    if args.spacing is None:
        if args.voxel_positions:
            raise CLIError("--voxel-positions needs --spacing")
        return None
    if args.kind != "similarity":
        raise CLIError(f"--spacing is for the similarity figure, not {args.kind}")
    if len(args.spacing) != len(shape) or not all(0 < s < float("inf") for s in args.spacing):
        raise CLIError(
            f"--spacing must give {len(shape)} positive sizes in mm (one per axis of --shape "
            f"{' '.join(map(str, shape))}), got {' '.join(map(str, args.spacing))}"
        )
    return list(args.spacing)


def _batch(args: argparse.Namespace):
    samples = sample_images(args.samples, max_size=args.max_size)
    return [n for n, _ in samples], nested_tensor_from_tensor_list([t for _, t in samples])


def _figure(args: argparse.Namespace):
    kind = args.kind
    if kind == "wavelengths":
        return figures.plot_wavelengths(args.num_feats, args.temperatures, args.ladders, frequency=args.frequency)
    if kind == "batch":
        names, batch = _batch(args)
        return figures.plot_padded_batch(batch, names=names)
    if kind == "rope-periods":
        return figures.plot_rope_periods(figures.rope_variants(), grid_shape(args))
    encoder = _encoder(args)
    name = type(encoder).__name__
    if kind == "rotary":
        dim = encoder.dim if isinstance(encoder, RotaryEmbedding) else 0  # else: the figure refuses it
        need = (args.length * args.length + 2 * args.length * dim) * 4
        if need > MAX_WORK_BYTES:
            raise CLIError(
                f"--length {args.length} with a rotary dim of {dim} needs {need / 2**20:,.0f} MiB; "
                f"at most {MAX_WORK_BYTES // 2**20} MiB: give a smaller --length or dim"
            )
        return figures.plot_rotary_invariance(encoder, args.length)
    if kind == "rope":
        if getattr(encoder, "num_axes", None) != 2 or not hasattr(encoder, "get_batch_embeds"):
            raise CLIError(f"rope draws a 2D DinoV3RotaryEmbedding or MixedRotaryEmbedding, got {name}")
        names, batch = _batch(args)
        h, w = batch.tensors.shape[-2:]
        mask = interpolate_mask(batch.mask, (max(1, h // args.stride), max(1, w // args.stride)))
        if args.pad == "symmetric":  # each item's valid box moved to the canvas centre
            for b, (rows, cols) in enumerate(mask_sizes(mask)):
                mask[b] = True
                top, left = (mask.shape[1] - rows) // 2, (mask.shape[2] - cols) // 2
                mask[b, top : top + rows, left : left + cols] = False
        return figures.plot_rope_padding(encoder, mask, names=names)
    if kind == "coords":
        _, batch = _batch(args)
        h, w = batch.tensors.shape[-2:]
        mask = interpolate_mask(batch.mask, (max(1, h // args.stride), max(1, w // args.stride)))
        params = {}
        if isinstance(encoder, PositionEmbeddingSine):  # DETR's normalisation of this encoder
            params = {"scale": encoder.scale, "offset": encoder.offset, "eps": encoder.eps}
        return figures.plot_normalized_coords(mask, **params)
    shape = grid_shape(args)
    _check_work(encoder, shape)
    spacing = _spacing(args, shape)
    pos = figures.encode_grid(encoder, shape, spacing=None if args.voxel_positions else spacing)
    if kind == "channels":
        if len(shape) > 2:
            raise CLIError(f"channels draws a 1D or 2D grid, got --shape {' '.join(map(str, shape))}")
        return figures.plot_channels(pos, args.channels, title=f"{name}: channels over a {'x'.join(map(str, shape))} grid")
    if kind == "curves":
        if len(shape) != 1:
            raise CLIError(f"curves draws a 1D grid, got --shape {' '.join(map(str, shape))}")
        channels = args.channels or sorted({0, 1, pos.shape[0] // 8, pos.shape[0] // 4, pos.shape[0] // 2})
        wavelengths = figures.channel_wavelengths(encoder, shape[0])
        start = 1 if isinstance(encoder, PositionEmbeddingSine) else 0  # DETR counts from 1
        positions = torch.arange(start, start + shape[0])
        return figures.plot_sincos_curves(pos, channels, wavelengths=wavelengths, positions=positions,
                                      title=f"{name}: channels against position (cells)")
    # similarity
    if len(shape) == 1:
        raise CLIError("similarity draws a 2D or 3D grid, give --shape H W or --shape D H W")
    title = f"{name}: cosine similarity to query cells"
    if spacing is not None:
        mm = " x ".join(f"{v:g}" for v in spacing)
        extent = encoder.extent if isinstance(encoder, PositionEmbeddingSine) else None
        where = "voxel indices" if args.voxel_positions else "millimetres"
        if extent is not None and not args.voxel_positions:
            where += f" over {extent:g} mm (normalize, extent)"
        title += f"\n{mm} mm cells drawn to scale, positions in {where}"
    return figures.plot_similarity(pos, _queries(args), title=title, spacing=spacing)


def write_plot(args: argparse.Namespace) -> str:
    """Runs ``vispos plot``: builds the figure and writes it atomically (:mod:`vispos.app.png`).

    Args:
        args (argparse.Namespace): the parsed ``vispos plot`` arguments.

    Returns:
        str: the path written (``--out``, default ``vispos-plot-KIND.png``).

    Raises:
        CLIError, ValueError, TypeError, OSError: a bad argument or file, or one beyond the
            bounds of :func:`~vispos.app._plot_args.check_plot_args` (checked before anything is
            computed, the default output file included: it is not replaced without
            ``--force``), an encoding over :data:`MAX_WORK_BYTES` or a canvas over
            :data:`MAX_CANVAS_PIXELS` (checked before it is computed or rendered);
            :func:`vispos.app.cli.main` prints them as one line and exits with 2.
    """
    check_plot_args(args)
    out = output_path(args)
    fig = _figure(args)
    _check_canvas(fig, args.dpi)
    save_figure(fig, out, dpi=args.dpi, replace=args.out is not None or args.force)
    return out


def execute(args: argparse.Namespace) -> None:
    """Runs ``vispos plot`` and says what it wrote (the CLI owns the terminal)."""
    print(f"wrote {write_plot(args)}")
