"""``vispos plot KIND``: one figure of an encoder, written to a PNG.

Kinds (one per :mod:`vispos.app.figures` figure function):

* ``channels``: channel heatmaps over a 1D or 2D grid (:func:`vispos.app.figures.plot_channels`);
* ``curves``: sin / cos curves of chosen channels with their wavelengths
  (:func:`vispos.app.figures.plot_sincos_curves`);
* ``wavelengths``: wavelength against channel for several temperatures and both ladders
  (:func:`vispos.app.figures.plot_wavelengths`);
* ``similarity``: cosine-similarity maps of query cells, 2D or 3D slices
  (:func:`vispos.app.figures.plot_similarity`);
* ``batch``: a padded batch of scikit-image's sample photos and its masks
  (:func:`vispos.app.figures.plot_padded_batch`);
* ``coords``: DETR's normalised coordinates of those items at a feature stride, next to a
  mask-blind grid (:func:`vispos.app.figures.plot_normalized_coords`);
* ``rotary``: the relative-offset invariance of ``q . k`` (:func:`vispos.app.figures.plot_rotary_invariance`).

The encoder is chosen by a registered name and keyword arguments
(``--encoder PositionEmbeddingSine --kw normalize=true``) or by a config file (``--config``; a
``Joiner`` config gives its ``position_embedding``). The CLI owns the terminal; this module
only builds the figure and writes it.
"""

from __future__ import annotations

import argparse
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
    "wavelengths": ("wavelength against channel for several temperatures and both ladders", None),
    "similarity": ("cosine similarity of query cells to every cell (2D, or 3D slices)",
                   {"type": "PositionEmbeddingSine", "num_pos_feats": 64, "normalize": True}),
    "batch": ("a padded batch of sample photos with its masks", None),
    "coords": ("DETR's normalised coordinates of padded items next to a mask-blind grid",
               {"type": "PositionEmbeddingSine", "num_pos_feats": 64, "normalize": True}),
    "rotary": ("rotary embeddings: q . k depends on the offset only",
               {"type": "RotaryEmbedding", "dim": 32}),
}

_DEFAULT_SHAPES = {"channels": (100,), "curves": (100,), "similarity": (32, 48)}


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
    p.add_argument("--num-feats", type=int, default=128, help="channels per axis (wavelengths)")
    p.add_argument("--temperatures", nargs="+", type=float, default=[20.0, 100.0, 10000.0],
                   help="temperatures (wavelengths)")
    p.add_argument("--ladders", nargs="+", default=["standard", "t2t"], choices=["standard", "t2t"],
                   help="frequency ladders (wavelengths)")
    p.add_argument("--frequency", action="store_true", help="plot frequency instead of wavelength")
    p.add_argument("--samples", nargs="+", default=["astronaut", "coffee", "chelsea"],
                   help="scikit-image sample photos (batch, coords)")
    p.add_argument("--max-size", type=int, default=192, help="longest side of the photos (batch, coords)")
    p.add_argument("--stride", type=int, default=16, help="feature stride of the mask (coords)")
    p.add_argument("--length", type=int, default=64, help="positions (rotary)")
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
    inner = getattr(built, "position_embedding", None)  # a Joiner: draw its embedding
    if isinstance(inner, torch.nn.Module):
        built = inner
    if not isinstance(built, torch.nn.Module):
        raise CLIError(f"the encoder must be a module, the config built a {type(built).__name__}")
    return built.eval()


def _shape(args: argparse.Namespace) -> tuple[int, ...]:

    shape = tuple(args.shape) if args.shape else _DEFAULT_SHAPES[args.kind]
    if not 1 <= len(shape) <= 3 or any(s < 1 for s in shape):
        raise CLIError(f"--shape must be 1 to 3 positive ints, got {' '.join(map(str, shape))}")
    return shape


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


def _batch(args: argparse.Namespace):
    from .data import sample_images
    from ..nested_tensor import nested_tensor_from_tensor_list

    samples = sample_images(args.samples, max_size=args.max_size)
    return [n for n, _ in samples], nested_tensor_from_tensor_list([t for _, t in samples])


def _figure(args: argparse.Namespace):
    from . import figures
    from ..encodings import PositionEmbeddingSine
    from ..nested_tensor import interpolate_mask

    kind = args.kind
    if kind == "wavelengths":
        return figures.plot_wavelengths(args.num_feats, args.temperatures, args.ladders, frequency=args.frequency)
    if kind == "batch":
        names, batch = _batch(args)
        return figures.plot_padded_batch(batch, names=names)
    encoder = _encoder(args)
    name = type(encoder).__name__
    if kind == "rotary":
        return figures.plot_rotary_invariance(encoder, args.length)
    if kind == "coords":
        if args.stride < 1:
            raise CLIError(f"--stride must be >= 1, got {args.stride}")
        _, batch = _batch(args)
        h, w = batch.tensors.shape[-2:]
        mask = interpolate_mask(batch.mask, (max(1, h // args.stride), max(1, w // args.stride)))
        params = {k: getattr(encoder, k) for k in ("scale", "offset", "eps") if hasattr(encoder, k)}
        return figures.plot_normalized_coords(mask, **params)
    shape = _shape(args)
    pos = figures.encode_grid(encoder, shape)
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
    return figures.plot_similarity(pos, _queries(args), title=f"{name}: cosine similarity to query cells")


def write_plot(args: argparse.Namespace) -> str:
    """Runs ``vispos plot``: builds the figure and writes it atomically (:mod:`vispos.app.png`).

    Args:
        args (argparse.Namespace): the parsed ``vispos plot`` arguments.

    Returns:
        str: the path written (``--out``, default ``vispos-plot-KIND.png``).

    Raises:
        CLIError, ValueError, TypeError, OSError: a bad argument or file; :func:`vispos.app.cli.main`
            prints them as one line and exits with 2.
    """
    from .png import save_figure

    out = args.out or f"vispos-plot-{args.kind}.png"
    if not out.lower().endswith(".png"):
        raise CLIError(f"--out must name a .png file, got {out!r}")
    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder):
        raise CLIError(f"--out {out!r}: folder {folder!r} does not exist")
    if args.dpi < 10:
        raise CLIError(f"--dpi must be >= 10, got {args.dpi}")
    save_figure(_figure(args), out, dpi=args.dpi)
    return out
