"""The ``vispos`` command.

``vispos demo``: scikit-image's sample photos, batched with padding, through the default
config's backbone and position embedding; ``vispos demo --volume``: the same on volumes cut from
nilearn's MNI152 T1 template through a 3D ResNet; ``vispos run``: the same on the user's images
(``--images``) or NIfTI volumes (``--volumes``). All print a table per feature level and write
``embeddings.pt`` and ``figure.png``.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass
from importlib import resources
from collections.abc import Sequence
from typing import Any

import torch

from ._config_command import add_config_parser
from ._errors import CLIError
from ._io import Terminated, write_files
from ._plot_command import add_plot_parser, write_plot
from .. import caching
from ..config import build_from_config, load_config, packaged_configs
from .data._args import shrunk_size
from .data.images import displayed_size
from .data.volumes import volume_shape
from .data import (
    SAMPLE_IMAGES,
    VOLUME_NORMALIZATIONS,
    imagenet_normalize,
    load_images,
    load_volumes,
    sample_images,
    sample_volumes,
)
from ..backbones import Joiner
from ..batching import nested_tensor_from_tensor_list
from ..nested_tensor import NestedTensor

__all__ = ["main", "DEFAULT_CONFIG", "DEFAULT_VOLUME_CONFIG"]

def _packaged_config(name: str) -> dict[str, Any]:
    """A config shipped inside the package (``vispos/configs/``; the repository's top-level
    ``configs/`` is the same folder), never a file of that name in the working directory."""
    with resources.as_file(packaged_configs()[name]) as path:
        return load_config(path)


#: the default for images: the packaged ``configs/detr_resnet50.yaml`` itself
DEFAULT_CONFIG: dict[str, Any] = _packaged_config("detr_resnet50")

#: the default for volumes: the packaged ``configs/volume_r3d18.yaml`` itself
DEFAULT_VOLUME_CONFIG: dict[str, Any] = _packaged_config("volume_r3d18")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vispos",
        description="Position embeddings for padded batches of real images on a real backbone.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser, default_out: str) -> None:
        p.add_argument("--config", help="YAML config (default: the embedded DETR ResNet-50 config, "
                       "or the 3D ResNet-18 volume config for volumes)")
        p.add_argument("--out", default=None,
                       help=f"output folder (default: {default_out}, or {default_out}-volume for volumes)")
        p.add_argument("--checkpoint", help="local backbone checkpoint (.pt/.safetensors); never downloaded")
        p.add_argument("--max-size", type=int, default=None,
                       help="shrink images / volumes so the longest side is at most this")
        p.add_argument("--normalize", default="percentile", choices=[str(m) for m in VOLUME_NORMALIZATIONS],
                       help="volume intensity normalisation (default: percentile, so background and "
                       "padding are both 0)")
        p.add_argument("--size-divisibility", type=int, default=0, help="pad to a multiple of this")
        p.add_argument("--device", default="cpu", help="torch device (default: cpu)")
        p.add_argument("--queries", type=int, default=3, help="query cells per level in the figure")
        p.add_argument("--repeats", type=int, default=5, help="timing repeats per level (median reported)")

    demo = sub.add_parser("demo", help="run on scikit-image's sample photos (or, with --volume, on MNI152)")
    common(demo, "vispos-demo")
    demo.add_argument("--samples", nargs="+", default=list(SAMPLE_IMAGES), help="scikit-image sample names")
    demo.add_argument("--volume", action="store_true",
                      help="run on three volumes cut from nilearn's MNI152 T1 template (3D backbone)")
    run = sub.add_parser("run", help="run on your own images or NIfTI volumes")
    common(run, "vispos-out")
    inputs = run.add_mutually_exclusive_group(required=True)
    inputs.add_argument("--images", nargs="+", help="image files")
    inputs.add_argument("--volumes", nargs="+", help="NIfTI volumes (.nii / .nii.gz)")
    add_plot_parser(sub)
    add_config_parser(sub)
    return parser


def _is_volume(args: argparse.Namespace) -> bool:
    """``vispos demo --volume`` or ``vispos run --volumes ...`` (each subcommand parses its own flags)."""
    if args.command == "demo":
        return bool(args.volume)
    return args.command == "run" and bool(args.volumes)


def _config(args: argparse.Namespace) -> dict[str, Any]:
    default = DEFAULT_VOLUME_CONFIG if _is_volume(args) else DEFAULT_CONFIG
    cfg = copy.deepcopy(default) if args.config is None else load_config(args.config)
    if args.checkpoint is not None:
        backbone = cfg.get("backbone")
        if not isinstance(backbone, dict):
            raise CLIError("--checkpoint needs a config with a 'backbone' section")
        backbone["checkpoint_path"] = args.checkpoint
    return cfg


def _weights_note(cfg: dict[str, Any]) -> str:
    backbone = cfg.get("backbone", {}) if isinstance(cfg.get("backbone"), dict) else {}
    if backbone.get("checkpoint_path"):
        return f"backbone weights: loaded from {backbone['checkpoint_path']}"
    if backbone.get("pretrained"):
        return "backbone weights: timm pretrained (from timm's local cache)"
    if backbone.get("weights"):
        return f"backbone weights: torchvision {backbone['weights']} (from torchvision's local cache)"
    return "backbone weights: random (no checkpoint given; vispos never downloads)"


def _uncached(position_embedding, level: NestedTensor):
    """One embedding computed from scratch: no encoder cache is read or filled (:func:`vispos.caching`)."""
    with caching(False):
        return position_embedding(level, dtype=level.tensors.dtype)


def _median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths))
    sep = "  ".join("-" * w for w in widths)
    body = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join([line, sep, *body])


def _write_outputs(folder: str, outputs: list[tuple[str, Any]]) -> None:
    """Writes every output or none (see :func:`vispos.app._io.write_files`): each ``writer(tmp_path)``
    fills a hidden temporary file, every target is checked before any is replaced, a failed
    rename puts the old files back, and on an error, SIGINT or SIGTERM the temporaries and the
    folders this call created are removed."""
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise CLIError(f"--out {folder!r} exists and is not a folder")
    write_files(outputs, make_dirs=True)


#: upper bounds of the integer flags (each value above is a typo or a way to exhaust memory:
#: --queries draws one figure panel per query and item, --size-divisibility pads every axis)
_FLAG_LIMITS = {"queries": 16, "repeats": 1000, "size_divisibility": 4096}
#: most inputs of one run (each adds a row of panels to figure.png)
MAX_INPUTS = 64
#: most values (items x channels x padded cells) of the padded input batch: 256 MiB as float32.
#: The backbone holds several times that at its peak (a ResNet-50 about 16x: 4 GB), so a batch
#: beyond it is refused from the file headers, before anything is decoded (issue 26 item 11)
MAX_BATCH_VALUES = 2**26
#: padding to a multiple of --size-divisibility may multiply the batch's cells at most by this
#: (ViTDet's 1024 on 800x600 photos: 2.2x; --size-divisibility 4096 on a 48x64 photo: 5461x)
MAX_DIVISIBILITY_GROWTH = 4
#: pixels of figure.png at most: a figure of many items and levels is drawn at a lower dpi
MAX_FIGURE_PIXELS = 2**26


def _check_args(args: argparse.Namespace) -> None:
    """Refuses flag values that would exhaust memory or write somewhere unexpected."""
    for flag, limit in _FLAG_LIMITS.items():
        value = getattr(args, flag)
        if value > limit:
            raise CLIError(f"--{flag.replace('_', '-')} must be <= {limit}, got {value}")
    if args.size_divisibility < 0:
        raise CLIError(f"--size-divisibility must be >= 0, got {args.size_divisibility}")
    if args.max_size is not None and args.max_size < 1:
        raise CLIError(f"--max-size must be >= 1, got {args.max_size}")
    if getattr(args, "volume", False) and args.max_size is not None and not 8 <= args.max_size <= 256:
        raise CLIError(f"--max-size must be from 8 to 256 with --volume (the MNI152 template's "
                       f"longest axis is 233), got {args.max_size}")
    for flag in ("images", "volumes", "samples"):
        given = getattr(args, flag, None)
        if given is not None and len(given) > MAX_INPUTS:
            raise CLIError(f"--{flag} takes at most {MAX_INPUTS} files per run (one figure row each), "
                           f"got {len(given)}; run several times")
    if not args.out.strip():
        raise CLIError("--out must name a folder, got an empty string")
    if args.device.strip().lower().startswith("meta"):
        raise CLIError(f"--device {args.device!r} holds no data; use cpu or cuda")


def _padded(shapes: list[tuple[int, ...]], divisor: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The batch's spatial extent (largest item per axis) and that extent padded to a multiple
    of ``divisor`` (as :func:`~vispos.nested_tensor_from_tensor_list`)."""
    extent = tuple(max(s[1 + a] for s in shapes) for a in range(len(shapes[0]) - 1))
    if divisor <= 1:
        return extent, extent
    return extent, tuple(-(-e // divisor) * divisor for e in extent)


def check_batch(args: argparse.Namespace, shapes: list[tuple[int, ...]]) -> None:
    """Refuses, from the items' shapes ``(C, *S)`` (after ``--max-size``, read from the file
    headers where possible), a padded batch that cannot fit: ``--size-divisibility`` growing
    its cells more than :data:`MAX_DIVISIBILITY_GROWTH` times, or more than
    :data:`MAX_BATCH_VALUES` values. The messages name the flag and the largest value that fits.

    Raises:
        CLIError: as above.
    """
    if not shapes:
        return
    extent, padded = _padded(shapes, args.size_divisibility)

    def grows(divisor: int) -> float:
        return math.prod(_padded(shapes, divisor)[1]) / math.prod(extent)

    def values(items: list[tuple[int, ...]]) -> int:
        return len(items) * max(s[0] for s in items) * math.prod(_padded(items, args.size_divisibility)[1])

    growth = grows(args.size_divisibility)
    if growth > MAX_DIVISIBILITY_GROWTH:
        fits = 1  # the largest divisor such that it and every smaller one fit
        while fits < args.size_divisibility and grows(fits + 1) <= MAX_DIVISIBILITY_GROWTH:
            fits += 1
        raise CLIError(
            f"--size-divisibility {args.size_divisibility} would pad the batch from {_fmt_size(extent)} "
            f"to {_fmt_size(padded)} ({growth:,.0f}x its cells, at most {MAX_DIVISIBILITY_GROWTH}x); "
            f"give --size-divisibility {fits} or less"
        )
    total = values(shapes)
    if total > MAX_BATCH_VALUES:
        hint = max(1, int(max(extent) * (MAX_BATCH_VALUES / total) ** (1 / len(extent))))
        while hint > 1 and values([(s[0], *shrunk_size(s[1:], hint)) for s in shapes]) > MAX_BATCH_VALUES:
            hint -= 1
        raise CLIError(
            f"the {len(shapes)} {'inputs make' if len(shapes) > 1 else 'input makes'} a padded batch of {len(shapes)}x{max(s[0] for s in shapes)}x"
            f"{_fmt_size(padded)} = {total:,} values ({total * 4 / 2**30:.1f} GiB as float32), more "
            f"than {MAX_BATCH_VALUES:,}; give --max-size {hint} or less, or fewer inputs"
        )


def _check_headers(args: argparse.Namespace) -> None:
    """:func:`check_batch` on the shapes ``load_images`` / ``load_volumes`` will return, read
    from the file headers (skipped when one cannot be read: its loader then reports the file)."""
    if getattr(args, "images", None):
        sizes = [displayed_size(p) for p in args.images]
        shapes = [(3, *shrunk_size(s, args.max_size)) for s in sizes if s is not None]
    else:
        found = [volume_shape(p) for p in args.volumes]
        sizes = found
        shapes = [(s[0], *shrunk_size(s[1:], args.max_size)) for s in found if s is not None]
    if None not in sizes:
        check_batch(args, shapes)


def _fmt_size(size) -> str:
    return "x".join(str(s) for s in size)


@dataclass
class _Run:
    """What one run computed: the batch, the model's levels and embeddings, the timings."""

    batch: NestedTensor
    features: list[NestedTensor]
    pos: list[torch.Tensor]
    strides: list[Any]
    rows: list[list[str]]
    total_ms: float
    flat: Any


def _build(args: argparse.Namespace) -> tuple[dict[str, Any], Any, torch.device]:
    """Checks the options, reads the config and builds the model on the asked device."""
    volume = _is_volume(args)
    for flag in ("queries", "repeats"):
        if getattr(args, flag) < 1:
            raise CLIError(f"--{flag} must be >= 1, got {getattr(args, flag)}")
    cfg = _config(args)
    try:
        device = torch.device(args.device)
    except RuntimeError as exc:
        raise CLIError(f"--device {args.device!r} is not a torch device: {exc}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise CLIError("--device cuda was asked for but no CUDA device is available")
    model = build_from_config(cfg).to(device).eval()
    if not isinstance(model, Joiner):
        raise CLIError(f"--config must build a Joiner (backbone + position embedding), got {type(model).__name__}")
    want = 3 if volume else 2
    if model.n_spatial != want:
        kind = "volumes" if volume else "images"
        raise CLIError(f"--config builds a {model.n_spatial}D backbone but the inputs are {kind} ({want}D)")
    return cfg, model, device


def _run(args: argparse.Namespace, model: Any, device: torch.device, items: list[torch.Tensor]) -> _Run:
    """Pads the items into one batch, runs the model and times each level's embedding."""
    inputs = items if _is_volume(args) else [imagenet_normalize(im) for im in items]
    batch = nested_tensor_from_tensor_list(inputs, size_divisibility=args.size_divisibility).to(device)
    with torch.inference_mode():
        t0 = time.perf_counter()
        features, pos = model(batch)
        total_ms = (time.perf_counter() - t0) * 1e3
        strides = list(model.strides)
        rows = []
        for lvl, (level, p) in enumerate(zip(features, pos)):
            ms = _median_ms(lambda lv=level: _uncached(model.position_embedding, lv), args.repeats)
            valid = 1.0 if level.mask is None else float((~level.mask).float().mean())
            rows.append([
                str(lvl), str(tuple(level.tensors.shape)), str(strides[lvl]), f"{valid:.3f}",
                str(tuple(p.shape)), f"{ms:.2f}",
            ])
        flat = model.flatten(features, pos) if model.hidden_dim is not None else None
    return _Run(batch, features, pos, strides, rows, total_ms, flat)


def _report(args: argparse.Namespace, cfg: dict[str, Any], names: list[str], run: _Run, device: torch.device) -> None:
    """Prints the run's summary (the CLI owns the terminal)."""
    kind = "volumes" if _is_volume(args) else "images"
    batch = run.batch
    print(f"vispos {args.command}: {len(names)} {kind} -> batch {tuple(batch.tensors.shape)}, "
          f"padding {float(batch.mask.float().mean()):.1%} of the cells")
    for name, size in zip(names, batch.image_sizes):
        print(f"  {name}: {_fmt_size(size)}")
    print(_weights_note(cfg))
    print(_table(run.rows, ["level", "feature shape", "stride", "valid frac", "pos shape", "pos time (ms)"]))
    print(f"backbone + position embedding: {run.total_ms:.1f} ms on {device}")
    flat = run.flat
    if flat is not None:
        print(f"flattened for the encoder: src {tuple(flat.src.shape)}, key_padding_mask "
              f"{tuple(flat.key_padding_mask.shape)}, spatial_shapes {flat.spatial_shapes_list}, "
              f"level_start_index {flat.level_start_index.tolist()}")


#: resolution of ``figure.png`` for images and for volumes (their figures hold more panels)
_IMAGE_DPI, _VOLUME_DPI = 90, 80


def _figure_dpi(fig, dpi: int) -> int:
    """``dpi``, lowered so the rendered canvas holds at most :data:`MAX_FIGURE_PIXELS` (a figure
    of many items, levels and queries would otherwise need gigabytes to render)."""
    width, height = (float(v) for v in fig.get_size_inches())
    fits = int(math.sqrt(MAX_FIGURE_PIXELS / (width * height)))
    if fits < dpi:
        print(f"figure.png drawn at {fits} dpi instead of {dpi}: it holds many panels")
        return max(fits, 1)
    return dpi


def _save(args: argparse.Namespace, cfg: dict[str, Any], names: list[str], run: _Run) -> None:
    """Writes ``embeddings.pt`` and ``figure.png`` together through :func:`_write_outputs`."""
    from . import figures
    from .png import png_writer

    volume = _is_volume(args)
    batch, strides = run.batch, run.strides
    emb_path = os.path.join(args.out, "embeddings.pt")
    fig_path = os.path.join(args.out, "figure.png")
    saved: dict[str, Any] = {
        "names": names,
        "image_sizes": batch.image_sizes,
        "config": cfg,
        "levels": [
            {"stride": s, "mask": lv.mask.cpu(), "pos": p.cpu(), "feature_shape": tuple(lv.tensors.shape)}
            for s, lv, p in zip(strides, run.features, run.pos)
        ],
    }
    if run.flat is not None:
        flat = run.flat
        saved["flat"] = {
            "spatial_shapes": flat.spatial_shapes.cpu(),
            "level_start_index": flat.level_start_index.cpu(),
            "valid_ratios": flat.valid_ratios.cpu(),
            "key_padding_mask": flat.key_padding_mask.cpu(),
        }
    cpu_levels = [lv.to("cpu") for lv in run.features]
    cpu_pos = [p.cpu() for p in run.pos]

    def write_figure(path: str) -> None:
        if volume:
            fig = figures.plot_volume_level_similarity(batch.to("cpu"), cpu_levels, cpu_pos, names=names,
                                                       strides=strides)
            png_writer(fig, _figure_dpi(fig, _VOLUME_DPI))(path)
        else:
            fig = figures.plot_level_similarity(batch.to("cpu"), cpu_levels, cpu_pos, names=names,
                                                strides=strides, n_queries=args.queries)
            png_writer(fig, _figure_dpi(fig, _IMAGE_DPI))(path)

    _write_outputs(args.out, [(emb_path, lambda path: torch.save(saved, path)), (fig_path, write_figure)])
    print(f"wrote {emb_path}")
    print(f"wrote {fig_path}")


def _execute(args: argparse.Namespace, names: list[str], items: list[torch.Tensor]) -> None:
    """check the batch -> build -> run -> report -> save."""
    check_batch(args, [tuple(t.shape) for t in items])
    cfg, model, device = _build(args)
    run = _run(args, model, device, items)
    _report(args, cfg, names, run, device)
    _save(args, cfg, names, run)


def _one_line(exc: BaseException) -> str:
    """An exception's message on one line (YAML and torch errors span several)."""
    text = " ".join(str(exc).split())
    return text if text else type(exc).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``vispos`` command.

    Every error is printed to stderr as one line ``vispos: error: ...`` (no traceback) and no
    output file is left behind, whole or partial. Returns the exit status: 0 ok, 2 a user
    error (bad arguments, files, configs: ``ValueError``, ``TypeError``, ``OSError``, ...),
    1 any other failure (named by its exception type), 130 on Ctrl-C, 128 + the signal
    number on SIGTERM / SIGHUP while the outputs are written (143 for SIGTERM). argparse's own usage
    errors exit with status 2 through ``SystemExit``.
    """
    args = _parser().parse_args(argv)
    if args.command == "config":
        from ._config_command import execute

        try:
            execute(args)
        except (ValueError, OSError) as exc:
            print(f"vispos: error: {_one_line(exc)}", file=sys.stderr)
            return 2
        return 0
    if args.command != "plot" and args.out is None:
        base = "vispos-demo" if args.command == "demo" else "vispos-out"
        args.out = f"{base}-volume" if _is_volume(args) else base
    try:
        if args.command == "plot":
            print(f"wrote {write_plot(args)}")
            return 0
        _check_args(args)
        normalize = None if args.normalize == "None" else args.normalize
        if args.command == "demo" and args.volume:
            samples = sample_volumes(max_size=args.max_size or 64, normalize=normalize)
        elif args.command == "demo":
            samples = sample_images(args.samples, max_size=args.max_size)
        elif args.volumes:
            _check_headers(args)  # before any voxel is read
            samples = [(os.path.basename(p), v) for p, v in zip(
                args.volumes, load_volumes(args.volumes, normalize=normalize, max_size=args.max_size))]
        else:
            _check_headers(args)  # before any pixel is decoded
            samples = [(os.path.basename(p), im) for p, im in zip(
                args.images, load_images(args.images, max_size=args.max_size))]
        _execute(args, [n for n, _ in samples], [t for _, t in samples])
    except (CLIError, ValueError, TypeError, FileNotFoundError, ImportError, OSError) as exc:
        print(f"vispos: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("vispos: error: interrupted", file=sys.stderr)
        return 130
    except Terminated as exc:
        print(f"vispos: error: {exc}", file=sys.stderr)
        return 128 + exc.signum
    except Exception as exc:  # noqa: BLE001 - the command never shows a traceback
        print(f"vispos: error: {type(exc).__name__}: {_one_line(exc)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
