"""The command line of the DETR demos: flags shared by 2D and 3D, their validation, ``--tiny``,
one process or torchrun, ``--report``.

Every flag is checked before any work starts; a bad value ends the program with argparse's exit
status 2 and a message naming the flag (``argument --steps: ...``); so does a ``--resume``
checkpoint that this run's settings cannot continue (each differing flag with the checkpoint's
value and the given one). ``--tiny`` only changes defaults: a flag given explicitly keeps its value.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import torch

from vispos.app._io import write_files

from .checkpoint import load_checkpoint
from .distributed import init_distributed, launched_by_torchrun
from .engine import resume_conflict, train_arm
from .model import POS_ARMS
from .report import ablation_table, load_runs, plot_curves
from .task import DetrTask

__all__ = ["int_at_least", "positive_float", "nonnegative_float", "build_parser", "parse_args", "check_resume", "run"]

#: --tiny's defaults for the core's flags (a task adds its own)
TINY_CORE = {"batch_size": 2, "eval_images": 4, "hidden": 32, "ffn": 64, "queries": 5}

#: upper bounds of the size flags: well past DETR's own settings (hidden 256, ffn 2048, 100
#: queries, 6 + 6 layers; DINO: 900 queries), below what ends in an allocator error or in hours
#: of data generation before the first step (``--hidden 100000`` asked for 120 GB);
#: ``--size-divisibility`` is bounded by each task (by its largest input side)
MAX_SIZES = {
    "hidden": 4096, "ffn": 16384, "queries": 1000, "enc_layers": 24, "dec_layers": 24, "heads": 64,
    "batch_size": 1024, "eval_images": 10_000, "train_images": 1_000_000,
}


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse ``type``: an int ``>= minimum`` (the error names the flag, via argparse)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an int >= {minimum}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    parse.__name__ = f"int >= {minimum}"
    return parse


def _float(text: str, positive: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise argparse.ArgumentTypeError(f"must be a finite number {'>' if positive else '>='} 0, got {text}")
    return value


def positive_float(text: str) -> float:
    """An argparse ``type``: a finite float > 0."""
    return _float(text, True)


def nonnegative_float(text: str) -> float:
    """An argparse ``type``: a finite float >= 0."""
    return _float(text, False)


def build_parser(task: DetrTask) -> argparse.ArgumentParser:
    """The shared flags plus the task's own (``task.add_arguments``)."""
    pos1, pos0 = int_at_least(1), int_at_least(0)
    p = argparse.ArgumentParser(description=task.description)
    g = p.add_argument_group("run")
    g.add_argument("--steps", type=pos1, default=3000, help="optimiser steps")
    g.add_argument("--out", default=f"runs/train_detr{'' if task.name == '2d' else task.name}",
                   help="output folder: OUT/<arm>/seed<S>/metrics.json, OUT/ablation.md, OUT/curves.png")
    g.add_argument("--device", default="cpu", help="cpu or cuda (under torchrun: cuda:LOCAL_RANK)")
    g.add_argument("--pos", nargs="+", choices=POS_ARMS, default=list(POS_ARMS), help="position arms, trained in turn")
    g.add_argument("--seed", type=pos0, default=0, help="data, initial weights and data order")
    g.add_argument("--threads", type=pos0, default=0, help="torch threads per process (0: torch's default)")
    g.add_argument("--workers", type=pos0, default=0, help="DataLoader worker processes")
    g.add_argument("--tiny", action="store_true", help="CI defaults: small inputs and model (explicit flags win)")
    g.add_argument("--report", action="store_true",
                   help="train nothing: rebuild OUT/ablation.md and OUT/curves.png from every "
                        "OUT/<arm>/seed*/metrics.json present (all arms and seeds)")
    g.add_argument("--save-every", type=pos0, default=0, help="write OUT/<arm>/seed<S>/checkpoint.pt every K steps (0: never)")
    g.add_argument("--resume", default=None, help="continue from this checkpoint (one arm)")
    g = p.add_argument_group("data and evaluation")
    g.add_argument("--batch-size", type=pos1, default=8, help="items per process and step")
    g.add_argument("--train-images", type=pos0, default=0,
                   help="training items per epoch (0: a fresh item for every sample of the run)")
    g.add_argument("--eval-images", type=pos1, default=48, help="held-out items")
    g.add_argument("--eval-every", type=pos1, default=None, help="evaluate every K steps (default 300; --tiny: steps/2)")
    g.add_argument("--eval-batch-sizes", type=pos1, nargs="+", default=None, metavar="B",
                   help="held-out batch sizes per process, independent of --batch-size; the first (the headline) "
                        "at every evaluation, all of them at the last 3 (default: --batch-size, then 1: the "
                        "demo's padded batches and one item at a time)")
    g.add_argument("--eval-beside-largest", action="store_true",
                   help="also evaluate, at the last 3 evaluations, each held-out item in a batch of two beside "
                        "the held-out item with the most cells")
    g.add_argument("--size-divisibility", type=pos0, default=0, help="pad every batch to a multiple of this")
    g.add_argument("--memory-warmup", type=pos0, default=None,
                   help="step after which memory should be flat (default: the second evaluation, at most steps/2)")
    g = p.add_argument_group("model")
    g.add_argument("--hidden", type=pos1, default=64, help="transformer width")
    g.add_argument("--queries", type=pos1, default=10, help="object queries")
    g.add_argument("--enc-layers", type=pos1, default=2)
    g.add_argument("--dec-layers", type=pos1, default=2)
    g.add_argument("--heads", type=pos1, default=4)
    g.add_argument("--ffn", type=pos1, default=128, help="feed-forward width")
    g.add_argument("--reference-points", action=argparse.BooleanOptionalAction, default=True,
                   help="box centres relative to per-query reference points (Deformable / Conditional "
                        "DETR); --no-reference-points: plain DETR")
    g.add_argument("--pre-norm", action="store_true", help="pre-norm transformer layers (DETR's --pre_norm)")
    g.add_argument("--dropout", type=nonnegative_float, default=0.0, help="transformer dropout, in [0, 1)")
    g.add_argument("--norm", choices=("batch", "frozen", "sync"), default="batch",
                   help="backbone batch norm: trained per process (batch), frozen (DETR), or SyncBatchNorm (CUDA)")
    g.add_argument("--padding-invariant", action=argparse.BooleanOptionalAction, default=False,
                   help="padding-invariant backbone and input projection: every image gets the same features "
                        "(and predictions) alone or in any padded batch (default: off, DETR's numbers)")
    g = p.add_argument_group("optimisation")
    g.add_argument("--lr", type=positive_float, default=1e-3)
    g.add_argument("--weight-decay", type=nonnegative_float, default=1e-4)
    g.add_argument("--warmup", type=pos1, default=100, help="linear warm-up steps (1: none)")
    g.add_argument("--clip", type=nonnegative_float, default=0.1, help="gradient max norm (0: no clipping)")
    g.add_argument("--class-weight", type=nonnegative_float, default=2.0, help="class loss and matching cost weight")
    g.add_argument("--l1-weight", type=nonnegative_float, default=5.0, help="L1 box loss and matching cost weight")
    g.add_argument("--giou-weight", type=nonnegative_float, default=2.0, help="GIoU loss and matching cost weight")
    g.add_argument("--eos-coef", type=nonnegative_float, default=0.1, help="cross-entropy weight of the no-object class")
    task.add_arguments(p.add_argument_group(f"{task.name} task"))
    return p


def _error(parser: argparse.ArgumentParser) -> Callable[[str, str], NoReturn]:
    def error(flag: str, message: str) -> NoReturn:
        parser.error(f"argument {flag}: {message}")

    return error


def parse_args(task: DetrTask, argv: Sequence[str] | None = None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """Parses and validates; exits with status 2 on a bad flag (argparse's convention)."""
    parser = build_parser(task)
    parser.set_defaults(**task.defaults)
    first, _ = parser.parse_known_args(argv)
    if first.tiny:
        parser.set_defaults(**{**TINY_CORE, **task.tiny_defaults})  # the task's win
    args = parser.parse_args(argv)
    if args.eval_every is None:
        args.eval_every = max(1, args.steps // 2) if args.tiny else 300
    if args.eval_batch_sizes is None:  # the demo's batches, then one item at a time
        args.eval_batch_sizes = list(dict.fromkeys([args.batch_size, 1]))
    if args.memory_warmup is None:  # after the second evaluation: the first one imports the metric
        args.memory_warmup = min(2 * args.eval_every, args.steps // 2)
    validate(args, task, _error(parser))
    if args.resume is not None and not args.report:
        check_resume(args, parser, _error(parser))
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
    n = task.box_ops.n_axes
    if args.hidden % (2 * n):
        error("--hidden", f"must be divisible by {2 * n} (sine and cosine for each of {n} axes), got {args.hidden}")
    if args.hidden % 8:
        error("--hidden", f"must be divisible by 8 (the input projection's GroupNorm groups), got {args.hidden}")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        error("--out", f"{args.out!r} exists and is not a folder")
    if args.report:
        return
    try:
        dev = torch.device(args.device)
    except RuntimeError:
        error("--device", f"not a torch device: {args.device!r}")
    if dev.type not in ("cpu", "cuda"):
        error("--device", f"expected cpu or cuda, got {args.device!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        error("--device", "CUDA is not available on this machine")
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


def check_resume(
    args: argparse.Namespace, parser: argparse.ArgumentParser, error: Callable[[str, str], NoReturn],
) -> None:
    """``--resume``: the checkpoint is read and compared with the run's settings before any work
    starts; a checkpoint that cannot be resumed ends the program with one line naming each
    differing flag, the checkpoint's value and the value given (exit 2). ``--train-images`` not
    given (0) becomes the checkpoint's count, so a run whose count was derived from its
    ``--steps`` (``--tiny``, or the default of a fresh item per sample) can be resumed for more
    steps. A flag the checkpoint does not record (added to the demos after it was written) is
    taken at its default. What may differ: :data:`demos.detr.engine.RESUME_FREE`."""
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


def write_report(task: DetrTask, args: argparse.Namespace, log: Callable[[str], Any] = print) -> str:
    """Writes OUT/ablation.md and OUT/curves.png (as one group, all or nothing) from every
    ``OUT/<arm>/seed*/metrics.json`` present, whatever ``--pos`` says (arms and seeds trained by
    separate processes are joined); returns the table."""
    runs = load_runs(args.out)
    table = ablation_table(runs, task.metric_names, task.headline, args.memory_warmup)

    def write_table(tmp: str) -> None:
        with open(tmp, "w") as f:
            f.write(table)

    paths = write_files([
        (os.path.join(args.out, "ablation.md"), write_table),
        (os.path.join(args.out, "curves.png"), lambda tmp: plot_curves(runs, task.headline, tmp)),
    ], make_dirs=True)
    log(table)
    log(f"wrote {paths[0]} and {paths[1]}")
    return table


def run(task: DetrTask, argv: Sequence[str] | None = None, log: Callable[[str], Any] = print,
        on_step: Callable[[int, Any], Any] | None = None) -> int:
    """The demos' ``main``: parse, then train every ``--pos`` arm (in one process, or data-parallel
    under torchrun) and write the report, or only the report with ``--report``. Returns 0."""
    parser, args = parse_args(task, argv)
    if args.report:
        try:
            write_report(task, args, log)
        except FileNotFoundError as exc:
            parser.error(f"argument --report: {exc}")
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    ctx = init_distributed(args.device)
    try:
        args.train_images = _train_items(args, ctx.world_size)
        for arm in args.pos:
            out_dir = os.path.join(args.out, arm, f"seed{args.seed}")
            train_arm(task, arm, args, ctx, out_dir, log=log if ctx.is_main else (lambda *_: None), on_step=on_step)
        if ctx.is_main:
            write_report(task, args, log)
    finally:
        ctx.shutdown()
    return 0
