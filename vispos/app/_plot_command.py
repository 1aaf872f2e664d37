"""``vispos plot KIND``: one figure of an encoder, written to a PNG.

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
import os
from typing import Any

import torch

from ._errors import CLIError

__all__ = ["KINDS", "add_plot_parser", "write_plot"]

#: kind -> (one-line help, default encoder config)
KINDS: dict[str, tuple[str, dict[str, Any] | None]] = {
    "channels": ("channel heatmaps over a 1D or 2D grid",
                 {"type": "PositionEmbeddingSine", "num_pos_feats": 64}),
    "curves": ("sin/cos curves of chosen channels, wavelengths marked",
               {"type": "PositionEmbeddingSine", "num_pos_feats": 64}),
    "wavelengths": ("wavelength against channel for several temperatures and ladders", None),
    "similarity": ("cosine similarity of query cells to every cell (2D, or 3D slices)",
                   {"type": "PositionEmbeddingSine", "num_pos_feats": 64, "normalize": True}),
    "batch": ("a padded batch of sample photos with its masks", None),
    "coords": ("DETR's normalised coordinates of padded items next to a mask-blind grid",
               {"type": "PositionEmbeddingSine", "num_pos_feats": 64, "normalize": True}),
    "rotary": ("rotary embeddings: q . k depends on the offset only",
               {"type": "RotaryEmbedding", "dim": 32}),
    "rope": ("vision RoPE on a padded batch of sample photos: mask-blind, mask-aware, each item alone",
             {"type": "DinoV3RotaryEmbedding", "dim": 64}),
    "rope-periods": ("period bands of axial RoPE, DINOv3 and RoPE-Mixed at a token grid", None),
}

_DEFAULT_SHAPES = {"channels": (100,), "curves": (100,), "similarity": (32, 48), "rope-periods": (32, 32)}

# Upper bounds, checked from the arguments before anything is computed or drawn. Beyond them a
# figure shows nothing more (a cell would be smaller than a pixel of the default canvas) and the
# memory asked for grows without limit (issue 26: --shape 20000 20000 asked for hundreds of GB,
# --dpi 100000 ended in std::bad_alloc).
#: --shape: cells of the grid (512 x 512, 64 x 64 x 64, or 262,144 positions)
MAX_CELLS = 2**18
#: the encoding of the grid (or the rotary scores), float32, all channels together
MAX_WORK_BYTES = 256 * 2**20
#: --dpi: from screen to print resolution
DPI_RANGE = (10, 1200)
#: pixels of the rendered figure (width x height at --dpi): 268 MB as RGBA
MAX_CANVAS_PIXELS = 2**26
#: most entries of the list flags (each adds a panel, a curve or a line)
MAX_ENTRIES = {"channels": 64, "queries": 16, "temperatures": 16, "samples": 16, "ladders": 4}
#: --num-feats (wavelengths), --length (rotary), --max-size and --stride (batch, coords)
INT_RANGES = {"num_feats": (2, 2**16), "length": (2, 4096), "max_size": (8, 4096), "stride": (1, 1024)}


def add_plot_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Adds the ``plot`` subcommand to the ``vispos`` parser's subparsers."""
    kinds = "; ".join(f"{k}: {h}" for k, (h, _) in KINDS.items())
    p = sub.add_parser("plot", help="draw one figure of an encoder (channels, curves, similarity, ...)",
                       description=f"Draw one figure and write it as a PNG. Kinds: {kinds}.")
    p.add_argument("kind", choices=list(KINDS), help="what to draw")
    p.add_argument("--encoder", help="registered encoder name, e.g. PositionEmbeddingSine, "
                   "PositionalEncoding2D, SinusoidalPositionalEncoding, RotaryEmbedding")
    p.add_argument("--kw", nargs="+", default=[], metavar="KEY=VALUE",
                   help="encoder keyword arguments, values read as YAML (normalize=true, temperature=20)")
    p.add_argument("--config", help="YAML config of an encoder, or of a Joiner (its position_embedding)")
    p.add_argument("--shape", nargs="+", type=int, help="grid size, 1 to 3 ints (default: 100 for "
                   "channels / curves, 32 48 for similarity)")
    p.add_argument("--channels", nargs="+", type=int, help="channels to draw (channels, curves)")
    p.add_argument("--queries", nargs="+", metavar="I,J[,K]",
                   help="query cells for similarity, e.g. 8,12 20,40")
    p.add_argument("--spacing", nargs="+", type=float, metavar="MM",
                   help="cell size along each axis of --shape in mm, tensor axis order (similarity): "
                   "the figure is drawn to scale and the cells are placed at their physical coordinates")
    p.add_argument("--voxel-positions", action="store_true",
                   help="with --spacing: draw to scale but keep voxel-index positions (for comparison)")
    p.add_argument("--num-feats", type=int, default=128, help="channels per axis (wavelengths)")
    p.add_argument("--temperatures", nargs="+", type=float, default=[20.0, 100.0, 10000.0],
                   help="temperatures (wavelengths)")
    p.add_argument("--ladders", nargs="+", default=["standard", "t2t"], choices=["standard", "t2t", "continued"],
                   help="frequency ladders (wavelengths)")
    p.add_argument("--frequency", action="store_true", help="plot frequency instead of wavelength")
    p.add_argument("--samples", nargs="+", default=["astronaut", "coffee", "chelsea"],
                   help="scikit-image sample photos (batch, coords)")
    p.add_argument("--max-size", type=int, default=192, help="longest side of the photos (batch, coords)")
    p.add_argument("--stride", type=int, default=16, help="feature stride of the mask (coords)")
    p.add_argument("--length", type=int, default=64, help="positions (rotary)")
    p.add_argument("--pad", choices=["end", "symmetric"], default="end",
                   help="where items sit in the padded canvas (rope): at the origin as DETR pads, "
                   "or centred as MONAI's SpatialPad pads")
    p.add_argument("--dpi", type=int, default=100, help="resolution of the PNG")
    p.add_argument("--out", help="the PNG to write (default: vispos-plot-KIND.png)")
    return p


def _value(text: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _encoder(args: argparse.Namespace) -> torch.nn.Module:
    from ..backbones import Joiner
    from ..config import build_from_config, load_config

    if args.config is not None and (args.encoder is not None or args.kw):
        raise CLIError("--config cannot be combined with --encoder / --kw")
    if args.config is not None:
        cfg = load_config(args.config)
    else:
        default = KINDS[args.kind][1]
        cfg = dict(default) if args.encoder is None else {"type": args.encoder}
        for item in args.kw:
            key, sep, text = item.partition("=")
            if not sep or not key:
                raise CLIError(f"--kw expects KEY=VALUE, got {item!r}")
            cfg[key] = _value(text)
    built = build_from_config(cfg)
    if isinstance(built, Joiner):  # draw its embedding
        built = built.position_embedding
    if not isinstance(built, torch.nn.Module):
        raise CLIError(f"the encoder must be a module, the config built a {type(built).__name__}")
    return built.eval()


def _shape(args: argparse.Namespace) -> tuple[int, ...]:

    shape = tuple(args.shape) if args.shape else _DEFAULT_SHAPES[args.kind]
    if not 1 <= len(shape) <= 3 or any(s < 1 for s in shape):
        raise CLIError(f"--shape must be 1 to 3 positive ints, got {' '.join(map(str, shape))}")
    cells = math.prod(shape)
    if cells > MAX_CELLS:
        raise CLIError(
            f"--shape {' '.join(map(str, shape))} has {cells:,} cells; vispos plot draws at most "
            f"{MAX_CELLS:,} (e.g. 512 512 or 64 64 64): a figure shows no more"
        )
    return shape


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_plot_args(args: argparse.Namespace) -> None:
    """Refuses, from the arguments alone, what would draw nothing more or exhaust memory.

    Raises:
        CLIError: ``--dpi`` outside :data:`DPI_RANGE`; a list flag longer than
            :data:`MAX_ENTRIES`; an int flag outside :data:`INT_RANGES`; a ``--shape`` with more
            than :data:`MAX_CELLS` cells. Each message names the flag, the value and the bound.
    """
    lo, hi = DPI_RANGE
    if not lo <= args.dpi <= hi:
        raise CLIError(f"--dpi must be from {lo} to {hi}, got {args.dpi}")
    for name, most in MAX_ENTRIES.items():
        values = getattr(args, name)
        if values is not None and len(values) > most:
            raise CLIError(f"{_flag(name)} takes at most {most} values, got {len(values)}")
    for name, (lo, hi) in INT_RANGES.items():
        value = getattr(args, name)
        if not lo <= value <= hi:
            raise CLIError(f"{_flag(name)} must be from {lo} to {hi}, got {value}")
    if args.kind in _DEFAULT_SHAPES:
        _shape(args)


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
    from .data import sample_images
    from ..batching import nested_tensor_from_tensor_list

    samples = sample_images(args.samples, max_size=args.max_size)
    return [n for n, _ in samples], nested_tensor_from_tensor_list([t for _, t in samples])


def _figure(args: argparse.Namespace):
    from . import figures
    from ..encodings import PositionEmbeddingSine
    from ..nested_tensor import interpolate_mask
    from ..padding import mask_sizes

    kind = args.kind
    if kind == "wavelengths":
        return figures.plot_wavelengths(args.num_feats, args.temperatures, args.ladders, frequency=args.frequency)
    if kind == "batch":
        names, batch = _batch(args)
        return figures.plot_padded_batch(batch, names=names)
    if kind == "rope-periods":
        return figures.plot_rope_periods(figures.rope_variants(), _shape(args))
    encoder = _encoder(args)
    name = type(encoder).__name__
    if kind == "rotary":
        from ..encodings import RotaryEmbedding

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
    shape = _shape(args)
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
        where = "voxel indices" if args.voxel_positions else "millimetres"
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
            bounds of :func:`check_plot_args` (checked before anything is computed), an encoding
            over :data:`MAX_WORK_BYTES` or a canvas over :data:`MAX_CANVAS_PIXELS` (checked
            before it is computed or rendered); :func:`vispos.app.cli.main` prints them as one
            line and exits with 2.
    """
    from .png import save_figure

    out = args.out or f"vispos-plot-{args.kind}.png"
    if not out.lower().endswith(".png"):
        raise CLIError(f"--out must name a .png file, got {out!r}")
    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder):
        raise CLIError(f"--out {out!r}: folder {folder!r} does not exist")
    check_plot_args(args)
    fig = _figure(args)
    _check_canvas(fig, args.dpi)
    save_figure(fig, out, dpi=args.dpi)
    return out
