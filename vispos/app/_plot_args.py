"""The arguments of ``vispos plot KIND``: the kinds, the parser, the bounds and the output file.

torch-free, so the ``vispos`` command parses ``vispos plot`` and answers ``--help`` before any
heavy import; the figure itself is drawn by :mod:`vispos.app._plot_command`.
"""

from __future__ import annotations

import argparse
import math
import os
from typing import Any

from .._suggest import did_you_mean
from ._errors import CLIError
from ._flags import add_threads_argument
from .data._args import unknown_sample

__all__ = ["KINDS", "add_plot_parser", "check_plot_args", "grid_shape", "output_path"]

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
# memory asked for grows without limit (--shape 20000 20000 would ask for hundreds of GB, --dpi 100000
# ends in std::bad_alloc).
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
    p.add_argument("kind", metavar="KIND", help=f"what to draw: {', '.join(KINDS)}")
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
                   "the figure is drawn to scale and the cells are placed at their physical coordinates "
                   "(the default encoder normalises by the grid's longest side in mm: extent)")
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
    p.add_argument("--out", help="the PNG to write, replaced if it exists (default: vispos-plot-KIND.png, "
                   "never replaced without --force)")
    p.add_argument("--force", action="store_true",
                   help="replace the default vispos-plot-KIND.png if an earlier plot wrote it")
    add_threads_argument(p)
    return p


def grid_shape(args: argparse.Namespace) -> tuple[int, ...]:
    """``--shape`` (or the kind's default grid), checked.

    Raises:
        CLIError: not 1 to 3 positive ints; more than :data:`MAX_CELLS` cells.
    """
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


def output_path(args: argparse.Namespace) -> str:
    """The PNG ``vispos plot`` writes: ``--out``, or ``vispos-plot-KIND.png``."""
    return args.out or f"vispos-plot-{args.kind}.png"


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_plot_args(args: argparse.Namespace) -> None:
    """Refuses, from the arguments alone, what would draw nothing more or exhaust memory.

    Nothing the user did not name is overwritten: the default ``vispos-plot-KIND.png`` is
    written only where no file of that name exists, unless ``--force`` is given (a file named
    by ``--out`` is replaced, as asked).

    Raises:
        CLIError: an unknown kind or ``--samples`` name (one line, no usage, the nearest names
            suggested); ``--out`` not a ``.png`` or in a missing folder; the default output exists
            and ``--force`` is not given; ``--dpi`` outside :data:`DPI_RANGE`; a list flag
            longer than :data:`MAX_ENTRIES`; an int flag outside :data:`INT_RANGES`; a
            ``--shape`` with more than :data:`MAX_CELLS` cells. Each message names the flag,
            the value and the bound.
    """
    if args.kind not in KINDS:
        hint = did_you_mean(args.kind, KINDS)
        raise CLIError(f"unknown plot kind {args.kind!r}; " + (f"{hint} " if hint else "")
                       + f"(expected one of {', '.join(KINDS)})")
    for name in args.samples or ():
        problem = unknown_sample(name)
        if problem:
            raise CLIError(f"--samples: {problem}")
    out = output_path(args)
    if not out.lower().endswith(".png"):
        raise CLIError(f"--out must name a .png file, got {out!r}")
    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder):
        raise CLIError(f"--out {out!r}: folder {folder!r} does not exist")
    if args.out is None and not args.force and os.path.lexists(out):
        raise CLIError(
            f"{out} exists (an earlier vispos plot {args.kind} wrote it?) and is not replaced unless "
            f"asked: give --out FILE.png to name this figure, or --force to replace {out}"
        )
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
        grid_shape(args)
