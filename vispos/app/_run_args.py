"""The arguments of ``vispos demo`` and ``vispos run``: their parsers, defaults and bounds.

torch-free, so the ``vispos`` command parses its arguments and answers ``--help`` before any
heavy import; the work itself is :mod:`vispos.app._run_command`.
"""

from __future__ import annotations

import argparse
import os
import warnings
from importlib import resources
from typing import Any

from ..config import load_config, packaged_configs
from ._errors import CLIError
from ._flags import add_threads_argument
from ._io import same_file
from ._model_names import backbone_problem
from .data._args import SAMPLE_IMAGES, VOLUME_NORMALIZATIONS, unknown_sample

__all__ = ["DEFAULT_CONFIG", "DEFAULT_VOLUME_CONFIG", "WARMUP_CALLS", "add_run_parsers", "check_args", "input_files",
           "is_volume"]


def _packaged_config(name: str) -> dict[str, Any]:
    """A config shipped inside the package (``vispos/configs/``; the repository's top-level
    ``configs/`` is the same folder), never a file of that name in the working directory."""
    with resources.as_file(packaged_configs()[name]) as path:
        return load_config(path)


#: the default for images: the packaged ``configs/detr_resnet50.yaml`` itself
DEFAULT_CONFIG: dict[str, Any] = _packaged_config("detr_resnet50")

#: the default for volumes: the packaged ``configs/volume_r3d18.yaml`` itself
DEFAULT_VOLUME_CONFIG: dict[str, Any] = _packaged_config("volume_r3d18")

#: the output folder of each subcommand when --out is not given (``-volume`` added for volumes)
DEFAULT_OUT = {"demo": "vispos-demo", "run": "vispos-out"}

#: the files each run writes into its folder
OUTPUT_FILES = ("embeddings.pt", "figure.png")

#: upper bounds of the integer flags (each value above is a typo or a way to exhaust memory:
#: --queries draws one figure panel per query and item, --size-divisibility pads every axis)
_FLAG_LIMITS = {"queries": 16, "repeats": 1000, "size_divisibility": 4096}
#: untimed calls between the first (cold) call of a level's embedding and the timed ones: the first
#: calls pay one-off costs (lazy imports, first dispatch of each op, the allocator's growth), tens
#: of ms on a CPU, where a steady call takes tenths of a ms
WARMUP_CALLS = 3
#: most inputs of one run (each adds a row of panels to figure.png)
MAX_INPUTS = 64


class _Intensity(argparse.Action):
    """Stores ``--intensity``; its old name ``--normalize`` (vispos' ``normalize`` is DETR's bool)
    still works, with a ``FutureWarning`` (shown by default, as a command's user should see it)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        if option_string == "--normalize":
            warnings.warn("vispos: --normalize is deprecated and will be removed; use --intensity instead",
                          FutureWarning, stacklevel=2)
        setattr(namespace, self.dest, values)


def add_run_parsers(sub: argparse._SubParsersAction) -> None:
    """Adds the ``demo`` and ``run`` subcommands to the ``vispos`` parser's subparsers."""

    def common(p: argparse.ArgumentParser, default_out: str) -> None:
        p.add_argument("--config", help="YAML config: a file, or a shipped config's name (vispos config "
                       "list; default: detr_resnet50, or volume_r3d18 for volumes)")
        p.add_argument("--out", default=None,
                       help=f"output folder (default: {default_out}, or {default_out}-volume for volumes)")
        p.add_argument("--force", action="store_true",
                       help="replace embeddings.pt / figure.png in the default output folder (files in "
                       "a folder named by --out are replaced without it)")
        p.add_argument("--checkpoint", help="local backbone checkpoint (.pt/.safetensors); never downloaded")
        p.add_argument("--max-size", type=int, default=None,
                       help="shrink images / volumes so the longest side is at most this")
        p.add_argument("--intensity", "--normalize", default="percentile", action=_Intensity,
                       choices=[str(m) for m in VOLUME_NORMALIZATIONS],
                       help="volume intensity normalisation (default: percentile, so background and "
                       "padding are both 0); --normalize is its deprecated old name")
        p.add_argument("--size-divisibility", type=int, default=0, help="pad to a multiple of this")
        p.add_argument("--device", default="cpu", help="torch device (default: cpu)")
        p.add_argument("--queries", type=int, default=3, help="query cells per level in the figure")
        p.add_argument("--repeats", type=int, default=10,
                       help=f"timed calls per level after {WARMUP_CALLS} warm-up calls (default %(default)s; their "
                            "median is the pos time, the steady state; the first, cold call is shown apart)")
        add_threads_argument(p)

    demo = sub.add_parser("demo", help="run on scikit-image's sample photos (or, with --volume, on MNI152)")
    common(demo, DEFAULT_OUT["demo"])
    demo.add_argument("--samples", nargs="+", default=list(SAMPLE_IMAGES),
                      help="scikit-image sample names (default: %(default)s; any of the samples it ships, e.g. "
                           "camera, moon, coins)")
    demo.add_argument("--volume", action="store_true",
                      help="run on three volumes cut from nilearn's MNI152 T1 template (3D backbone)")
    run = sub.add_parser("run", help="run on your own images or NIfTI volumes")
    common(run, DEFAULT_OUT["run"])
    inputs = run.add_mutually_exclusive_group(required=True)
    inputs.add_argument("--images", nargs="+", help="image files")
    inputs.add_argument("--volumes", nargs="+", help="NIfTI volumes (.nii / .nii.gz)")


def is_volume(args: argparse.Namespace) -> bool:
    """``vispos demo --volume`` or ``vispos run --volumes ...`` (each subcommand parses its own flags)."""
    if args.command == "demo":
        return bool(args.volume)
    return args.command == "run" and bool(args.volumes)


def input_files(args: argparse.Namespace) -> list[str]:
    """The files a run reads and must never write: ``--images`` / ``--volumes``, the
    ``--config`` file (when it names one) and the ``--checkpoint``."""
    files = list(getattr(args, "images", None) or ()) + list(getattr(args, "volumes", None) or ())
    for flag in ("config", "checkpoint"):
        path = getattr(args, flag, None)
        if path is not None and os.path.lexists(path):
            files.append(path)
    return files


def _check_out_folder(args: argparse.Namespace) -> None:
    """Refuses an ``--out`` that cannot become the output folder, from the file system alone:
    a path that exists and is not a folder (one of the run's inputs named as such), a path
    under a file, or a folder (or the nearest existing one above it) that cannot be written.

    Raises:
        CLIError: as above; the message names the path and, for an input, the input.
    """
    out = args.out
    if os.path.lexists(out) and not os.path.isdir(out):
        for source in input_files(args):
            if same_file(out, source):
                raise CLIError(
                    f"--out {out!r} is the input {source!r}, a file: --out names the folder that "
                    "receives embeddings.pt and figure.png, and inputs are never replaced; give --out a folder"
                )
        what = "a broken symbolic link" if not os.path.exists(out) else "a file"
        raise CLIError(f"--out {out!r} exists and is not a folder ({what}); give --out a folder "
                       "(created if missing)")
    nearest = os.path.abspath(out)
    while not os.path.lexists(nearest) and os.path.dirname(nearest) != nearest:
        nearest = os.path.dirname(nearest)
    if not os.path.isdir(nearest):
        raise CLIError(f"--out {out!r} cannot be created: {nearest!r} exists and is not a folder")
    if not os.access(nearest, os.W_OK | os.X_OK):
        raise CLIError(f"--out {out!r}: the folder {nearest!r} is not writable")


#: config backbone type -> (the key naming its model, the library whose model it is)
_BACKBONE_NAMES = {"TimmBackbone": ("model_name", "timm"), "TorchvisionBackbone": ("name_or_model", "torchvision")}


def _check_backbone_name(args: argparse.Namespace) -> None:
    """A ``--config`` whose backbone names a model its library does not have is refused here,
    with the nearest names, before torch is imported (:mod:`vispos.app._model_names`). A config
    that cannot be read is left to the run, whose error names the problem.

    Raises:
        CLIError: the config's backbone is an unknown timm or torchvision model name.
    """
    if args.config is None:
        return
    try:
        config = load_config(args.config)
    except Exception:  # noqa: BLE001 - the run reads it again and says what is wrong
        return
    backbone = config.get("backbone") if isinstance(config, dict) else None
    if not isinstance(backbone, dict) or backbone.get("type") not in _BACKBONE_NAMES:
        return
    key, package = _BACKBONE_NAMES[backbone["type"]]
    name = backbone.get(key)
    problem = backbone_problem(name, package) if isinstance(name, str) else None
    if problem:
        raise CLIError(f"--config {args.config}: backbone {key}: {problem}")


def check_args(args: argparse.Namespace) -> None:
    """Fills the default ``--out`` (and ``args.replace``: whether the outputs may replace
    existing files) and refuses flag values that would exhaust memory or write
    somewhere unexpected, before anything is imported, read or computed.

    Raises:
        CLIError: a flag beyond its bound (the message names it, its value and the bound); the
            default output folder already holds this command's files and ``--force`` is not
            given (nothing the user did not name is overwritten); an output would be one of the
            run's own input files (refused with or without ``--force``); ``--out`` exists and
            is not a folder, lies under a file, or cannot be written (the message names the
            input when ``--out`` is one); an input that exists but is not a regular file (a FIFO
            would block the run).
    """
    named = args.out is not None
    if not named:
        base = DEFAULT_OUT[args.command]
        args.out = f"{base}-volume" if is_volume(args) else base
    #: the outputs may replace files only in a folder the user named, or with --force
    args.replace = named or args.force
    for flag, limit in _FLAG_LIMITS.items():
        value = getattr(args, flag)
        if value > limit:
            raise CLIError(f"--{flag.replace('_', '-')} must be <= {limit}, got {value}")
    for flag in ("queries", "repeats"):
        if getattr(args, flag) < 1:
            raise CLIError(f"--{flag} must be >= 1, got {getattr(args, flag)}")
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
    for name in getattr(args, "samples", None) or ():
        problem = unknown_sample(name)
        if problem:
            raise CLIError(f"--samples: {problem}")
    _check_backbone_name(args)
    if not args.out.strip():
        raise CLIError("--out must name a folder, got an empty string")
    _check_out_folder(args)
    if args.device.strip().lower().startswith("meta"):
        raise CLIError(f"--device {args.device!r} holds no data; use cpu or cuda")
    for flag in ("images", "volumes"):
        for path in getattr(args, flag, None) or ():
            if os.path.exists(path) and not os.path.isfile(path) and not os.path.isdir(path):
                # a FIFO would block the header read; a device never ends
                raise CLIError(f"--{flag}: {path!r} exists but is not a regular file (a device, pipe or socket)")
    for name in OUTPUT_FILES:
        output = os.path.join(args.out, name)
        for source in input_files(args):
            if same_file(output, source):
                raise CLIError(
                    f"--out {args.out!r} would write {output!r} over the input {source!r}; inputs are never "
                    "replaced (--force or not): give --out another folder"
                )
    if not named and not args.force:
        existing = [f for f in OUTPUT_FILES if os.path.lexists(os.path.join(args.out, f))]
        if existing:
            raise CLIError(
                f"{args.out}/ (the default output folder) already holds {' and '.join(existing)} from "
                f"an earlier run; give --out FOLDER for this run, or --force to replace them"
            )
