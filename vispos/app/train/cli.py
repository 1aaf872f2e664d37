"""The command line of DETR training: the flags' checks against the machine and the data, one
process or torchrun, ``--report``.

The flags themselves are parsed by :mod:`vispos.app.train._args` (torch-free). Every flag is
checked before any work starts; a bad value ends the program with argparse's exit status 2 and
one line naming the flag (``argument --steps: ...``); so does a ``--resume`` checkpoint that is
missing or that this run's settings cannot continue (each differing flag with the checkpoint's
value and the given one). ``--tiny`` only changes defaults: a flag given explicitly keeps its value.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import torch

from .._flags import torch_threads
from .._io import write_files
from ._args import MAX_SIZES, finished_arms, flag_error, full_defaults, parse_flags
from .checkpoint import load_checkpoint
from .distributed import init_distributed, launched_by_torchrun
from .engine import resume_conflict, train_arm
from .report import ablation_table, load_runs, plot_curves, tiny_summary
from .task import DetrTask

__all__ = ["parse_args", "validate", "check_device", "check_resume", "write_report", "run"]


def parse_args(
    task: DetrTask, argv: Sequence[str] | None = None, prog: str | None = None, command: bool = False,
) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """Parses (:func:`vispos.app.train._args.parse_flags`) and validates; exits with status 2 on a
    bad flag (argparse's convention; a flag's value refused here gets one line, no usage).

    Args:
        task (DetrTask): the task whose flags are added.
        argv (sequence of str, optional): the flags (default: ``sys.argv[1:]``).
        prog (str, optional): the program's name in messages.
        command (bool): the ``vispos train`` parser (it has ``--volume``).
    """
    parser, args = parse_flags(task, argv, prog, command)
    validate(args, task, flag_error(parser))
    if args.resume is not None and not args.report:
        check_resume(args, parser, flag_error(parser))
    return parser, args


def validate(args: argparse.Namespace, task: DetrTask, error: Callable[[str, str], NoReturn]) -> None:
    """Cross-flag checks of the shared flags, then the task's."""
    if args.dropout >= 1:
        error("--dropout", f"must be in [0, 1), got {args.dropout}")
    for name, most in MAX_SIZES.items():
        if getattr(args, name) > most:
            error("--" + name.replace("_", "-"), f"must be <= {most}, got {getattr(args, name)}")
    if len(set(args.eval_batch_sizes)) != len(args.eval_batch_sizes):
        error("--eval-batch-sizes", f"each size once, got {args.eval_batch_sizes}")
    if max(args.eval_batch_sizes) > MAX_SIZES["batch_size"]:
        error("--eval-batch-sizes", f"must be <= {MAX_SIZES['batch_size']}, got {args.eval_batch_sizes}")
    if args.hidden % args.heads:
        error("--hidden", f"must be divisible by --heads {args.heads}, got {args.hidden}")
    n = task.box_ops.num_axes
    if args.hidden % (2 * n):
        error("--hidden", f"must be divisible by {2 * n} (sine and cosine for each of {n} axes), got {args.hidden}")
    if args.hidden % 8:
        error("--hidden", f"must be divisible by 8 (the input projection's GroupNorm groups), got {args.hidden}")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        error("--out", f"{args.out!r} exists and is not a folder")
    if args.report:
        return
    dev = check_device(args.device, error)
    if args.norm == "sync" and args.padding_invariant:
        error("--padding-invariant", "does not work with --norm sync (masked batch statistics are per "
              "process); use --norm batch or --norm frozen")
    if args.norm == "sync" and not (dev.type == "cuda" and launched_by_torchrun()):
        error("--norm", "sync needs CUDA under torchrun (SyncBatchNorm has no CPU implementation)")
    world = int(os.environ.get("WORLD_SIZE", 1)) if launched_by_torchrun() else 1
    if args.train_images and args.train_images < args.batch_size * world:
        error("--train-images", f"must hold at least one global batch ({args.batch_size} x {world} processes), "
              f"got {args.train_images}")
    if args.resume is not None:
        if len(args.pos) != 1:
            error("--resume", f"resumes one arm; give exactly one --pos, got {args.pos}")
        if not os.path.isfile(args.resume):
            error("--resume", f"no such checkpoint file: {args.resume!r}")
    task.validate(args, error)


def check_device(device: str, error: Callable[[str, str], NoReturn]) -> torch.device:
    """``--device``: a torch device, cpu or cuda, and CUDA present for cuda (``error("--device",
    message)`` otherwise). Returns the device."""
    try:
        dev = torch.device(device)
    except RuntimeError:
        error("--device", f"not a torch device: {device!r}")
    if dev.type not in ("cpu", "cuda"):
        error("--device", f"expected cpu or cuda, got {device!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        error("--device", "CUDA is not available on this machine")
    return dev


def check_resume(
    args: argparse.Namespace, parser: argparse.ArgumentParser, error: Callable[[str, str], NoReturn],
) -> None:
    """``--resume``: the checkpoint is read and compared with the run's settings before any work
    starts; a checkpoint that cannot be resumed ends the program with one line naming each
    differing flag, the checkpoint's value and the value given (exit 2). ``--train-images`` not
    given (0) becomes the checkpoint's count, so a run whose count was derived from its
    ``--steps`` (``--tiny``, or the default of a fresh item per sample) can be resumed for more
    steps. A flag the checkpoint does not record (added to the demos after it was written) is
    taken at its default. What may differ: :data:`vispos.app.train.engine.RESUME_FREE`."""
    try:
        state = load_checkpoint(args.resume)
    except ValueError as exc:
        error("--resume", str(exc))
    state["args"] = {**{k: parser.get_default(k) for k in vars(args)}, **state["args"]}
    if not args.train_images:
        args.train_images = state["args"].get("train_images", 0)
    world = int(os.environ.get("WORLD_SIZE", 1)) if launched_by_torchrun() else 1
    conflict = resume_conflict(state, args.pos[0], args, world)
    if conflict:
        error("--resume", conflict)


def _train_items(args: argparse.Namespace, world: int) -> int:
    return args.train_images or args.steps * args.batch_size * world


def write_report(task: DetrTask, args: argparse.Namespace, log: Callable[[str], Any] = print,
                 show_table: bool = True) -> str:
    """Writes OUT/ablation.md and OUT/curves.png (as one group, all or nothing) from every
    ``OUT/<arm>/seed*/metrics.json`` present, whatever ``--pos`` says (arms and seeds trained by
    separate processes are joined); logs the table (unless ``show_table`` is False) and the paths
    written; returns the table."""
    runs = load_runs(args.out)
    table = ablation_table(runs, task.metric_names, task.headline, args.memory_warmup)

    def write_table(tmp: str) -> None:
        with open(tmp, "w") as f:
            f.write(table)

    paths = write_files([
        (os.path.join(args.out, "ablation.md"), write_table),
        (os.path.join(args.out, "curves.png"), lambda tmp: plot_curves(runs, task.headline, tmp)),
    ], make_dirs=True)
    if show_table:
        log(table)
    log(f"wrote {paths[0]} and {paths[1]}")
    return table


def run(task: DetrTask, argv: Sequence[str] | None = None, log: Callable[[str], Any] = print,
        on_step: Callable[[int, Any], Any] | None = None, prog: str | None = None, command: bool = False) -> int:
    """``vispos train`` and the demos' ``main``: parse, then train every ``--pos`` arm (in one
    process, or data-parallel under torchrun) and write the report, or only the report with
    ``--report``. Returns 0. ``prog`` and ``command``: as :func:`parse_args`. A ``--tiny`` run
    logs, instead of the tables (still written), each arm's train loss early against late and one
    line on what so short a run can and cannot show (:func:`vispos.app.train.report.tiny_summary`);
    every run ends with what the task's metric names mean (``task.metric_legend``), if it says.
    An arm and seed whose finished run (``metrics.json``) is under ``--out`` is refused before any
    work unless ``--force`` (:func:`vispos.app.train._args.finished_arms`)."""
    parser, args = parse_args(task, argv, prog, command)
    if not (args.report or args.force):  # before any work: a finished run is never replaced unless asked
        taken = finished_arms(args.out, args.pos, args.seed, args.resume)
        if taken:
            flag_error(parser)("--out", taken)
    if args.report:
        try:
            write_report(task, args, log)
        except FileNotFoundError as exc:
            flag_error(parser)("--report", str(exc))
        return 0
    with torch_threads(args.threads):  # restored after the run
        ctx = init_distributed(args.device)
        try:
            args.train_images = _train_items(args, ctx.world_size)
            trained = {}
            for arm in args.pos:
                out_dir = os.path.join(args.out, arm, f"seed{args.seed}")
                trained[arm] = train_arm(task, arm, args, ctx, out_dir, log=log if ctx.is_main else (lambda *_: None),
                                         on_step=on_step)
            if ctx.is_main:
                if args.tiny:
                    full = full_defaults(task, getattr(args, "backbone", None))
                    for line in tiny_summary(trained, full["steps"], task.doc):
                        log(line)
                write_report(task, args, log, show_table=not args.tiny)
                if task.metric_legend:
                    log(task.metric_legend)
        finally:
            ctx.shutdown()
    return 0
