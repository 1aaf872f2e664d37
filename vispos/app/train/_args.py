"""The flags of DETR training (``vispos train``, ``python -m demos.train_detr``): the parser and
its defaults, torch-free.

So ``vispos train --help`` and a usage error are answered before torch is imported. Each task's
own flags come with its :class:`TaskFlags` (:mod:`vispos.app.train._task_args`); the checks that
need torch or the data (devices, backbones, volumes, ``--resume``) are :mod:`vispos.app.train.cli`'s.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from .._errors import OneLineParser
from .._flags import add_threads_argument, int_at_least, nonnegative_float, positive_float

__all__ = ["POS_ARMS", "TINY_CORE", "MAX_SIZES", "CORE_DEFAULTS", "TaskFlags", "full_defaults", "build_parser",
           "parse_flags", "flag_error", "finished_run", "finished_arms"]

#: the position-embedding arms: zeros, a mask-blind grid over the padded canvas, DETR's sine
POS_ARMS = ("none", "grid", "sine")

#: the core's defaults that depend on the task or the backbone, and that the help, the closing hint
#: of ``--tiny`` and the docs state (:func:`full_defaults` gives a task's)
CORE_DEFAULTS = {"steps": 3000, "eval_every": 300, "lr": 1e-3, "batch_size": 8, "eval_images": 48, "warmup": 100}

#: --tiny's defaults for the core's flags (a task adds its own): one arm (sine), 20 steps whose
#: warm-up ends early enough for the loss to fall within them (a 100-step warm-up never would)
TINY_CORE = {"steps": 20, "batch_size": 2, "eval_images": 4, "hidden": 32, "ffn": 64, "queries": 5, "pos": ["sine"],
             "warmup": 5, "eval_every": None}

#: upper bounds of the size flags: well past DETR's own settings (hidden 256, ffn 2048, 100
#: queries, 6 + 6 layers; DINO: 900 queries), below what ends in an allocator error or in hours
#: of data generation before the first step (``--hidden 100000`` asked for 120 GB);
#: ``--size-divisibility`` is bounded by each task (by its largest input side)
MAX_SIZES = {
    "hidden": 4096, "ffn": 16384, "queries": 1000, "enc_layers": 24, "dec_layers": 24, "heads": 64,
    "batch_size": 1024, "eval_images": 10_000, "train_images": 1_000_000,
}


@dataclass(frozen=True)
class TaskFlags:
    """What the command line knows of one task, before anything is imported.

    Attributes:
        name (str): short name, e.g. ``"2d"``; written into ``metrics.json``.
        description (str): the first line of ``--help``.
        add_arguments (callable): ``(group)``: adds the task's own flags (data, backbone).
        defaults (mapping): the task's own defaults for shared flags (e.g. ``{"hidden": 48}`` in
            3D, where the width must be divisible by 6 and 8), applied before ``--tiny``'s.
        tiny_defaults (mapping): ``--tiny``'s defaults (flags given explicitly still win).
        backbone_defaults (mapping): ``{--backbone value: defaults}``, applied after ``defaults``
            and before ``--tiny``'s (e.g. the small ViT's learning rate and steps).
        doc (str): the page that documents the task's training, named in ``--help`` and in the
            closing hint of ``--tiny``.
    """

    name: str
    description: str
    add_arguments: Callable[[argparse._ArgumentGroup], None]
    defaults: Mapping[str, Any] = field(default_factory=dict)
    tiny_defaults: Mapping[str, Any] = field(default_factory=dict)
    backbone_defaults: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    doc: str = "docs/training.md"


def full_defaults(task: TaskFlags, backbone: str | None = None) -> dict[str, Any]:
    """The defaults of a full run (not ``--tiny``) of ``task``, with ``--backbone backbone``'s:
    :data:`CORE_DEFAULTS`, then ``task.defaults``, then ``task.backbone_defaults[backbone]``. The
    one source of every default that the help, the closing hint and the docs state."""
    return {**CORE_DEFAULTS, **task.defaults, **task.backbone_defaults.get(backbone, {})}


def _with_backbones(task: TaskFlags, name: str, show: Callable[[Any], str]) -> str:
    """``"; 6000 with --backbone vit"`` for each backbone whose defaults change flag ``name``
    (nothing for a task without ``--backbone``)."""
    return "".join(f"; {show(d[name])} with --backbone {b}" for b, d in task.backbone_defaults.items() if name in d)


def build_parser(task: TaskFlags, prog: str | None = None, command: bool = False) -> argparse.ArgumentParser:
    """The shared flags plus the task's own (``task.add_arguments``).

    Args:
        task (TaskFlags): the task (a :class:`~vispos.app.train.task.DetrTask` has the same fields).
        prog (str, optional): the program's name in messages (default: argparse's).
        command (bool): the ``vispos train`` parser: with ``--volume`` (the 3D task), and no
            abbreviated flags (``--volume`` picks the task before the flags are parsed).
    """
    pos1, pos0 = int_at_least(1), int_at_least(0)
    full = full_defaults(task)
    p = OneLineParser(prog=prog, description=f"{task.description} See {task.doc}.", allow_abbrev=not command)
    g = p.add_argument_group("run")
    if command:
        g.add_argument("--volume", action="store_true",
                       help="train the 3D detector on MRI volumes (docs/training3d.md) instead of the 2D one on "
                            "photographs; `vispos train --volume --help` lists its flags")
        g.add_argument("--task", choices=("detect", "segment"), default="detect",
                       help="with --volume: detect (the 3D DETR) or segment (3D segmentation, docs/segmentation3d.md; "
                            "`vispos train --volume --task segment --help` lists its flags)")
    g.add_argument("--steps", type=pos1, default=CORE_DEFAULTS["steps"],
                   help=f"optimiser steps (default {full['steps']}{_with_backbones(task, 'steps', str)})")
    g.add_argument("--out", default=f"runs/train_detr{'' if task.name == '2d' else task.name}",
                   help="output folder: OUT/<arm>/seed<S>/metrics.json, OUT/ablation.md, OUT/curves.png")
    g.add_argument("--device", default="cpu", help="cpu or cuda (under torchrun: cuda:LOCAL_RANK)")
    g.add_argument("--pos", nargs="+", choices=POS_ARMS, default=list(POS_ARMS), help="position arms, trained in turn")
    g.add_argument("--seed", type=pos0, default=0, help="data, initial weights and data order")
    add_threads_argument(g, machine_default=False)
    g.add_argument("--workers", type=pos0, default=0, help="DataLoader worker processes")
    g.add_argument("--tiny", action="store_true",
                   help=f"a quick run: one arm ({TINY_CORE['pos'][0]}), {TINY_CORE['steps']} steps, small inputs and "
                        "model; shows that training runs end to end and the loss falls, not accuracy (explicit flags "
                        "win)")
    g.add_argument("--force", action="store_true",
                   help="replace a finished run of the same arm and seed under OUT (without it, such a run is "
                        "never overwritten: give another --out, or --resume an unfinished run)")
    g.add_argument("--report", action="store_true",
                   help="train nothing: rebuild OUT/ablation.md and OUT/curves.png from every "
                        "OUT/<arm>/seed*/metrics.json present (all arms and seeds)")
    g.add_argument("--save-every", type=pos0, default=0, help="write OUT/<arm>/seed<S>/checkpoint.pt every K steps (0: never)")
    g.add_argument("--resume", default=None, help="continue from this checkpoint (one arm)")
    g = p.add_argument_group("data and evaluation")
    g.add_argument("--batch-size", type=pos1, default=CORE_DEFAULTS["batch_size"],
                   help=f"items per process and step (default {full['batch_size']})")
    g.add_argument("--train-images", type=pos0, default=0,
                   help="training items per epoch (0: a fresh item for every sample of the run)")
    g.add_argument("--eval-images", type=pos1, default=CORE_DEFAULTS["eval_images"],
                   help=f"held-out items (default {full['eval_images']})")
    g.add_argument("--eval-every", type=pos1, default=None,
                   help=f"evaluate every K steps (default {full['eval_every']}"
                        f"{_with_backbones(task, 'eval_every', str)}; --tiny: steps/2)")
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
    g.add_argument("--lr", type=positive_float, default=CORE_DEFAULTS["lr"],
                   help=f"AdamW learning rate (default {full['lr']:g}{_with_backbones(task, 'lr', '{:g}'.format)})")
    g.add_argument("--weight-decay", type=nonnegative_float, default=1e-4)
    g.add_argument("--warmup", type=pos1, default=CORE_DEFAULTS["warmup"],
                   help=f"linear warm-up steps (default {full['warmup']}; 1: none)")
    g.add_argument("--clip", type=nonnegative_float, default=0.1, help="gradient max norm (0: no clipping)")
    g.add_argument("--class-weight", type=nonnegative_float, default=2.0, help="class loss and matching cost weight")
    g.add_argument("--l1-weight", type=nonnegative_float, default=5.0, help="L1 box loss and matching cost weight")
    g.add_argument("--giou-weight", type=nonnegative_float, default=2.0, help="GIoU loss and matching cost weight")
    g.add_argument("--eos-coef", type=nonnegative_float, default=0.1, help="cross-entropy weight of the no-object class")
    task.add_arguments(p.add_argument_group(f"{task.name} task"))
    return p


def flag_error(parser: argparse.ArgumentParser) -> Callable[[str, str], NoReturn]:
    """``error(flag, message)``: ends the program with one line ``PROG: error: argument FLAG:
    MESSAGE`` on stderr and argparse's exit status 2 (no usage: the flag is named)."""

    def error(flag: str, message: str) -> NoReturn:
        parser.exit(2, f"{parser.prog}: error: argument {flag}: {message}\n")

    return error


def parse_flags(
    task: TaskFlags, argv: Sequence[str] | None = None, prog: str | None = None, command: bool = False,
) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """Parses the flags (the task's defaults, then ``--tiny``'s, then those given) and fills the
    defaults derived from others (``--eval-every``, ``--eval-batch-sizes``, ``--memory-warmup``).
    Exits with status 2 on a usage error, and answers ``--help`` (argparse's conventions).
    Nothing is checked against the machine or the data here (:func:`vispos.app.train.cli.parse_args`)."""
    parser = build_parser(task, prog, command)
    parser.set_defaults(**task.defaults)
    first, _ = parser.parse_known_args(argv)
    by_backbone = task.backbone_defaults.get(getattr(first, "backbone", None))
    if by_backbone:
        parser.set_defaults(**by_backbone)
    if first.tiny:
        parser.set_defaults(**{**TINY_CORE, **task.tiny_defaults})  # the task's win
    args = parser.parse_args(argv)
    if args.eval_every is None:
        args.eval_every = max(1, args.steps // 2) if args.tiny else CORE_DEFAULTS["eval_every"]
    if args.eval_batch_sizes is None:  # the demo's batches, then one item at a time
        args.eval_batch_sizes = list(dict.fromkeys([args.batch_size, 1]))
    if args.memory_warmup is None:  # after the second evaluation: the first one imports the metric
        args.memory_warmup = min(2 * args.eval_every, args.steps // 2)
    return parser, args


def finished_run(run_dirs: Sequence[str], resume: str | None = None) -> str | None:
    """Why training into ``run_dirs`` would replace a finished run, or None.

    A run folder (``OUT/<arm>/seed<S>``) holds a finished run once its ``metrics.json`` is
    there: it is written last, whole or not at all, when the run ends. ``--resume`` of a
    checkpoint inside that same folder continues that run (its metrics are carried on), so it
    is not a replacement. torch-free: ``vispos train`` and the demos refuse before any work.

    Args:
        run_dirs (sequence of str): the run folders this training would write.
        resume (str, optional): the ``--resume`` checkpoint.

    Returns:
        str or None: a message naming what is there and the ways out, for ``--out``'s error.
    """
    taken = []
    for run_dir in run_dirs:
        metrics = os.path.join(run_dir, "metrics.json")
        if not os.path.isfile(metrics):
            continue
        if resume is not None and os.path.abspath(os.path.dirname(resume)) == os.path.abspath(run_dir):
            continue
        others = sorted(n for n in os.listdir(run_dir) if n != "metrics.json")
        taken.append(f"{run_dir}/ (metrics.json{''.join(', ' + n for n in others)})")
    if not taken:
        return None
    return (f"{' and '.join(taken)} {'holds a finished run' if len(taken) == 1 else 'hold finished runs'}, "
            "never replaced unless asked: give another --out, or --force to replace "
            f"{'it' if len(taken) == 1 else 'them'}")


def finished_arms(out: str, arms: Sequence[str], seed: int, resume: str | None = None) -> str | None:
    """:func:`finished_run` for the arms of one seed under ``out`` (``OUT/<arm>/seed<S>``), and,
    when only some of them have finished (a run of several arms stopped part way), the ``--pos``
    that trains the others."""
    folders = [os.path.join(out, arm, f"seed{seed}") for arm in arms]
    taken = finished_run(folders, resume)
    if taken is None:
        return None
    left = [arm for arm, folder in zip(arms, folders) if finished_run([folder]) is None]
    return taken + (f"; or train the others: --pos {' '.join(left)}" if left else "")
