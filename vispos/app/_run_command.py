"""The work of ``vispos demo`` and ``vispos run``: read the inputs, build the config's model,
print a table per feature level and write ``embeddings.pt`` and ``figure.png``.

Imported only when one of them runs (torch, the core, the loaders and the figures come with it;
the backbone libraries come with the config that names a backbone). Its arguments are parsed by
:mod:`vispos.app._run_args`.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch

from .. import caching
from .._checks import count
from ..config import build_from_config, load_config
from ..batching import nested_tensor_from_tensor_list
from ..nested_tensor import NestedTensor
from . import figures
from ._errors import CLIError
from ._io import write_files
from ._progress import StageProgress
from ._run_args import DEFAULT_CONFIG, DEFAULT_VOLUME_CONFIG, WARMUP_CALLS, input_files, is_volume
from .data import imagenet_normalize, load_images, load_volumes, sample_images, sample_volumes
from .data._args import shrunk_size
from .data.images import displayed_size
from .data.volumes import volume_shape
from .png import png_writer

__all__ = ["check_batch", "execute", "TABLE_HEADER"]

#: the columns of the table printed per feature level
TABLE_HEADER = ("level", "feature shape", "stride", "valid frac", "pos shape", "pos time (ms)", "first call (ms)")
#: the stages of a run, shown with the time spent once a run takes over 2 s (:mod:`vispos.app._progress`)
_STAGES = ("reading the inputs", "building the model", "backbone + position embedding",
           "timing the position embeddings", "drawing the figure and writing the files")


def _config(args: argparse.Namespace) -> dict[str, Any]:
    default = DEFAULT_VOLUME_CONFIG if is_volume(args) else DEFAULT_CONFIG
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


def _timings_ms(fn, repeats: int) -> tuple[float, float]:
    """``(first, steady)``: the first call's time, and the median of ``repeats`` calls after
    :data:`WARMUP_CALLS` untimed ones (the steady state, as the README's speed table is measured), in ms."""
    t0 = time.perf_counter()
    fn()
    first = (time.perf_counter() - t0) * 1e3
    for _ in range(WARMUP_CALLS):
        fn()
    times = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return first, statistics.median(times)


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths))
    sep = "  ".join("-" * w for w in widths)
    body = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join([line, sep, *body])


def _write_outputs(folder: str, outputs: list[tuple[str, Any]], replace: bool = True, keep: Any = ()) -> None:
    """Writes every output or none (see :func:`vispos.app._io.write_files`): each ``writer(tmp_path)``
    fills a hidden temporary file, every target is checked before any is replaced, a failed
    rename puts the old files back, and on an error, SIGINT or SIGTERM the temporaries and the
    folders this call created are removed."""
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise CLIError(f"--out {folder!r} exists and is not a folder")
    write_files(outputs, make_dirs=True, replace=replace, keep=keep)


#: most values (items x channels x padded cells) of the padded input batch: 256 MiB as float32.
#: The backbone holds several times that at its peak (a ResNet-50 about 16x: 4 GB), so a batch
#: beyond it is refused from the file headers, before anything is decoded
MAX_BATCH_VALUES = 2**26
#: padding to a multiple of --size-divisibility may multiply the batch's cells at most by this
#: (ViTDet's 1024 on 800x600 photos: 2.2x; --size-divisibility 4096 on a 48x64 photo: 5461x)
MAX_DIVISIBILITY_GROWTH = 4
#: pixels of figure.png at most: a figure of many items and levels is drawn at a lower dpi
MAX_FIGURE_PIXELS = 2**26


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
            f"the {count(len(shapes), 'input')} make{'s' if len(shapes) == 1 else ''} a padded batch of {len(shapes)}x{max(s[0] for s in shapes)}x"
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
    volume = is_volume(args)
    cfg = _config(args)
    try:
        device = torch.device(args.device)
    except RuntimeError as exc:
        raise CLIError(f"--device {args.device!r} is not a torch device: {exc}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise CLIError("--device cuda was asked for but no CUDA device is available")
    model = build_from_config(cfg).to(device).eval()
    from ..backbones import Joiner  # imported with the backbone by the config, if it built one

    if not isinstance(model, Joiner):
        raise CLIError(f"--config must build a Joiner (backbone + position embedding), got {type(model).__name__}")
    want = 3 if volume else 2
    if model.num_axes != want:
        kind = "volumes" if volume else "images"
        raise CLIError(f"--config builds a {model.num_axes}D backbone but the inputs are {kind} ({want}D)")
    return cfg, model, device


def _run(args: argparse.Namespace, model: Any, device: torch.device, items: list[torch.Tensor],
         progress: StageProgress | None = None) -> _Run:
    """Pads the items into one batch, runs the model and times each level's embedding (the
    first call, then the median after warm-up: :func:`_timings_ms`)."""
    progress = progress if progress is not None else StageProgress(_STAGES, f"vispos {args.command}")
    inputs = items if is_volume(args) else [imagenet_normalize(im) for im in items]
    batch = nested_tensor_from_tensor_list(inputs, size_divisibility=args.size_divisibility).to(device)
    with torch.inference_mode():
        with progress.stage(_STAGES[2]):
            t0 = time.perf_counter()
            features, pos = model(batch)
            total_ms = (time.perf_counter() - t0) * 1e3
        strides = list(model.strides)
        rows = []
        with progress.stage(_STAGES[3]):
            for lvl, (level, p) in enumerate(zip(features, pos)):
                first, ms = _timings_ms(lambda lv=level: _uncached(model.position_embedding, lv), args.repeats)
                valid = 1.0 if level.mask is None else float((~level.mask).float().mean())
                rows.append([
                    str(lvl), str(tuple(level.tensors.shape)), str(strides[lvl]), f"{valid:.3f}",
                    str(tuple(p.shape)), f"{ms:.2f}", f"{first:.2f}",
                ])
        flat = model.flatten(features, pos) if model.hidden_dim is not None else None
    return _Run(batch, features, pos, strides, rows, total_ms, flat)


def _report(args: argparse.Namespace, cfg: dict[str, Any], names: list[str], run: _Run, device: torch.device) -> None:
    """Prints the run's summary (the CLI owns the terminal)."""
    kind = "volume" if is_volume(args) else "image"
    batch = run.batch
    print(f"vispos {args.command}: {count(len(names), kind)} -> batch {tuple(batch.tensors.shape)}, "
          f"padding {float(batch.mask.float().mean()):.1%} of the cells")
    for name, size in zip(names, batch.image_sizes):
        print(f"  {name}: {_fmt_size(size)}")
    print(_weights_note(cfg))
    print(_table(run.rows, [*TABLE_HEADER]))
    print(f"pos time: median of {args.repeats} uncached calls after {WARMUP_CALLS} warm-up calls (the steady "
          "state, as the README's speed table); first call: the cold one, paying one-off costs")
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
    volume = is_volume(args)
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

    _write_outputs(args.out, [(emb_path, lambda path: torch.save(saved, path)), (fig_path, write_figure)],
                   replace=getattr(args, "replace", True), keep=input_files(args))
    print(f"wrote {emb_path}")
    print(f"wrote {fig_path}")


def _execute(args: argparse.Namespace, names: list[str], items: list[torch.Tensor],
             progress: StageProgress | None = None) -> None:
    """check the batch -> build -> run -> report -> save, each stage shown once the run is long."""
    progress = progress if progress is not None else StageProgress(_STAGES, f"vispos {args.command}")
    check_batch(args, [tuple(t.shape) for t in items])
    with progress.stage(_STAGES[1]):
        cfg, model, device = _build(args)
    run = _run(args, model, device, items, progress)
    progress.close()  # before the table: the bar is on stderr, the table on stdout
    _report(args, cfg, names, run, device)
    with StageProgress(_STAGES[4:], f"vispos {args.command}") as saving, saving.stage(_STAGES[4]):
        _save(args, cfg, names, run)


def execute(args: argparse.Namespace) -> None:
    """Runs ``vispos demo`` / ``vispos run`` on arguments checked by
    :func:`vispos.app._run_args.check_args`: reads the inputs (file headers first), then
    check the batch -> build -> run -> report -> save.

    Raises:
        CLIError, ValueError, TypeError, OSError, ImportError: a bad argument, file or config
            (:func:`vispos.app.cli.main` prints it as one line and exits with 2).
    """
    intensity = None if args.intensity == "None" else args.intensity
    progress = StageProgress(_STAGES, f"vispos {args.command}")
    with progress:
        with progress.stage(_STAGES[0]):
            samples = _read(args, intensity)
        _execute(args, [n for n, _ in samples], [t for _, t in samples], progress)


def _read(args: argparse.Namespace, intensity: str | None) -> list[tuple[str, torch.Tensor]]:
    """The inputs as ``(name, tensor)``: the samples, or the user's files (headers first)."""
    if args.command == "demo" and args.volume:
        samples = sample_volumes(max_size=args.max_size or 64, intensity=intensity)
    elif args.command == "demo":
        samples = sample_images(args.samples, max_size=args.max_size)
    elif args.volumes:
        _check_headers(args)  # before any voxel is read
        samples = [(os.path.basename(p), v) for p, v in zip(
            args.volumes, load_volumes(args.volumes, intensity=intensity, max_size=args.max_size))]
    else:
        _check_headers(args)  # before any pixel is decoded
        samples = [(os.path.basename(p), im) for p, im in zip(
            args.images, load_images(args.images, max_size=args.max_size))]
    return samples
