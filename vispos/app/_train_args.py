"""The arguments of ``vispos train``: DETR training in 2D (photographs) or 3D (``--volume``).

torch-free, so ``vispos train --help`` and a usage error are answered before any heavy import.
The flags are the training core's own (:mod:`vispos.app.train._args`, the task's flags from
:mod:`vispos.app.train._task_args`): ``vispos train`` takes every flag of ``python -m
demos.train_detr`` and, with ``--volume``, of ``python -m demos.train_detr3d``. The training is
run by :mod:`vispos.app._train_command`.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from ._errors import CLIError, OneLineParser
from ._model_names import backbone_problem
from .train._args import finished_arms, finished_run, parse_flags
from .train._task_args import FLAGS_2D, FLAGS_3D, VIT_NAME

__all__ = ["PROG", "add_train_parser", "parse_train_args", "check_train_args"]

#: the program's name in the messages of ``vispos train``
PROG = "vispos train"


def add_train_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Adds ``train`` to the ``vispos`` parser's subcommands, for ``vispos --help``: its flags
    are parsed by :func:`parse_train_args` (:func:`vispos.app.cli.main` hands it every argument
    after ``train``)."""
    return sub.add_parser(
        "train", add_help=False,
        help="train a small DETR on padded batches (2D photographs; --volume: 3D MRI volumes); "
             "--tiny: a quick run",
        description="Train a small DETR on padded batches: `vispos train --help` lists the flags.",
    )


def _task_of(argv: Sequence[str]):
    """None (3D segmentation) when ``--task segment`` is among the arguments, else
    :data:`FLAGS_3D` when ``--volume`` is, else :data:`FLAGS_2D`."""
    pre = OneLineParser(prog=PROG, add_help=False, allow_abbrev=False)
    pre.add_argument("--volume", action="store_true")
    pre.add_argument("--task", default="detect")
    first, _ = pre.parse_known_args(list(argv))
    if first.task == "segment":
        return None
    return FLAGS_3D if first.volume else FLAGS_2D


def parse_train_args(argv: Sequence[str]) -> argparse.Namespace:
    """Parses the arguments after ``vispos train``: the task's flags, its defaults and
    ``--tiny``'s (as :func:`vispos.app.train._args.parse_flags`). ``--help`` is answered and a
    usage error ends the program (argparse's exit status 2). The namespace also holds
    ``command`` (``"train"``) and ``train_argv`` (the arguments, handed to the training core)."""
    argv = list(argv)
    task = _task_of(argv)
    if task is None:  # vispos train --volume --task segment: its own flags
        from .train.segment3d_args import parse_segment_flags

        _, args = parse_segment_flags(argv, prog=PROG)
    else:
        _, args = parse_flags(task, argv, prog=PROG, command=True)
    args.command, args.train_argv = "train", argv
    return args


def check_train_args(args: argparse.Namespace) -> None:
    """Refuses, before torch is imported, what the arguments alone show cannot run.

    Raises:
        CLIError: ``--resume`` names no file; ``--out`` exists and is not a folder, or holds the
            finished run of an arm and seed this training would write (without ``--force``,
            :func:`vispos.app.train._args.finished_run`; the training core checks it again, for
            the demos' entry points); ``--backbone``
            is neither a timm model nor ``vit`` (with the nearest names, answered in well under a
            second: :func:`vispos.app._model_names.backbone_problem` imports neither timm nor torch).
    """
    backbone = getattr(args, "backbone", None)
    if backbone is not None and not args.report:
        problem = backbone_problem(backbone, "timm", also=(VIT_NAME,))
        if problem:
            raise CLIError(f"argument --backbone: {problem} ({VIT_NAME}: a small ViT)")
    if args.resume is not None and not args.report and not os.path.isfile(args.resume):
        raise CLIError(f"argument --resume: no such checkpoint file: {args.resume!r}")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise CLIError(f"argument --out: {args.out!r} exists and is not a folder")
    if not (args.report or getattr(args, "figure", False) or args.force):  # in a fraction of a second
        if getattr(args, "task", "detect") == "segment":
            from .train.segment3d_args import run_folder

            taken = finished_run([run_folder(args)], args.resume)
        else:
            taken = finished_arms(args.out, args.pos, args.seed, args.resume)
        if taken:
            raise CLIError(f"argument --out: {taken}")
