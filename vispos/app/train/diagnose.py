"""Attention diagnostics of the ViT detector from its training checkpoints: per block, the
attention mass on padding tokens and on the class / register tokens, the attention entropy and
the high-norm tokens (:mod:`vispos.app.train.attention` defines each), on the held-out set.

Each checkpoint (written by ``vispos train --backbone vit --save-every K``) is rebuilt as it was
trained, stock or padding-invariant (a ``--packed`` one is run as its padded invariant twin, which
gives the same tokens and has the same weights), and run on the held-out set its run evaluated,
in padded batches of the run's headline size (``--batch-size`` here to change it). One table row
per block, one column per checkpoint for each quantity; ``--figure`` draws the same.

    python -m vispos.app.train.diagnose runs/stock/sine/seed0/checkpoint.pt \\
        runs/inv/sine/seed0/checkpoint.pt --figure attention.png --out attention.md
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING

from .._errors import OneLineParser
from .._flags import add_threads_argument, int_at_least, positive_float
from ._args import MAX_SIZES

if TYPE_CHECKING:
    from .attention import VitDiagnostics

__all__ = ["Diagnosis", "load_detector", "diagnose_checkpoint", "diagnostics_table", "files_and_device_problem", "main"]

#: table columns: (key of a block row, header, format)
COLUMNS = (
    ("padding_mass", "mass on padding", "{:.4f}"),
    ("class_mass", "mass on class", "{:.4f}"),
    ("register_mass", "mass on registers", "{:.4f}"),
    ("entropy", "entropy (nats)", "{:.3f}"),
    ("outlier_fraction", "high-norm share", "{:.4f}"),
)


@dataclass
class Diagnosis:
    """One checkpoint's diagnostics.

    Attributes:
        label (str): the run's name in tables and figures. path (str): the checkpoint.
        arm (str): its ``--pos`` arm. step (int): its step. mode (str): ``stock``,
            ``invariant`` or ``packed`` (run as its padded invariant twin).
        vit_pos (str): its ``--vit-pos``. registers (int): its ``--vit-registers``.
        batch_size (int): the held-out batch size used.
        stats (VitDiagnostics): the per-block rows (:func:`vispos.app.train.attention.vit_block_diagnostics`).
    """

    label: str
    path: str
    arm: str
    step: int
    mode: str
    vit_pos: str
    registers: int
    batch_size: int
    stats: VitDiagnostics


def load_detector(path: str | os.PathLike, device: str = "cpu"):
    """The detector of a 2D ``--backbone vit`` checkpoint, rebuilt from its recorded flags (a
    flag it does not record takes its default) with its weights, in eval mode.

    Returns:
        tuple: ``(model, args, state, mode)``: the :class:`~vispos.app.train.model.DetrModel`,
        the flags (``argparse.Namespace``; a ``--packed`` run's say ``padding_invariant``), the
        checkpoint, and ``"stock"`` / ``"invariant"`` / ``"packed"``.

    Raises:
        FileNotFoundError: no such file.
        ValueError: not a readable training checkpoint (:func:`~vispos.app.train.checkpoint.load_checkpoint`),
            its flags, arm or weights missing or of the wrong kind, weights whose keys do not fit
            the rebuilt detector, or not one of the 2D task's ViT.
        RuntimeError: weights of another shape than the rebuilt detector's (torch names them).
    """
    import torch

    from ..._checks import count
    from ._args import build_parser
    from ._task_args import FLAGS_2D
    from .checkpoint import load_checkpoint
    from .engine import build_model
    from .task2d import TASK, VIT_NAME

    state = load_checkpoint(path)  # a file that is no checkpoint: ValueError naming it
    where = f"checkpoint {os.fspath(path)!r}"
    saved, arm, weights = state["args"], state.get("arm"), state["model"]
    if not isinstance(saved, dict) or not isinstance(arm, str) or not isinstance(weights, dict):
        raise ValueError(f"{where} does not record its flags, arm and weights as a training run writes them "
                         f"(args {type(saved).__name__}, arm {type(arm).__name__}, model {type(weights).__name__})")
    task = state["metrics"].get("task", "2d") if isinstance(state["metrics"], dict) else "2d"
    if task != "2d" or saved.get("backbone") != VIT_NAME:
        raise ValueError(f"{where} is of task {task} with --backbone "
                         f"{saved.get('backbone')}; the diagnostics read the 2D task's --backbone {VIT_NAME}")
    args = argparse.Namespace(**{**vars(build_parser(FLAGS_2D).parse_args([])), **saved})
    mode = "packed" if args.packed else "invariant" if args.padding_invariant else "stock"
    if args.packed:  # the same weights and tokens, with the padding tokens the probe reads
        args.packed, args.padding_invariant = False, True
    try:
        with torch.random.fork_rng(devices=[]):  # build_model seeds torch's generator
            model = build_model(TASK, arm, args)
    except (TypeError, KeyError, AttributeError) as exc:  # a recorded flag of the wrong kind
        raise ValueError(f"{where}: its recorded flags do not rebuild a detector "
                         f"({type(exc).__name__}: {exc})") from exc
    missing = sorted(model.state_dict().keys() - weights.keys())
    unexpected = sorted(weights.keys() - model.state_dict().keys())
    if missing or unexpected:  # torch's message lists every key: one line names the first
        raise ValueError(f"{where}: its weights do not fit the detector its flags rebuild: "
                         f"{count(len(missing), 'missing key')} {missing[:2]}, "
                         f"{count(len(unexpected), 'unexpected key')} {unexpected[:2]}")
    model.load_state_dict(weights)  # a shape that differs: RuntimeError naming the tensor
    return model.to(device).eval(), args, state, mode


def diagnose_checkpoint(path: str | os.PathLike, label: str | None = None, eval_images: int | None = None,
                        batch_size: int | None = None, outlier_ratio: float = 2.0, device: str = "cpu") -> Diagnosis:
    """Rebuilds a checkpoint's detector (:func:`load_detector`) and measures its ViT's blocks on
    the held-out set (the run's ``--eval-images`` and seed, as its evaluation builds it), in
    padded batches of ``batch_size`` (default: the run's headline ``--eval-batch-sizes``).

    Args:
        path (str | PathLike): a checkpoint of ``vispos train --backbone vit --save-every K``.
        label (str, optional): default: the mode (``stock`` / ``invariant`` / ``packed``).
        eval_images (int, optional): held-out items (default: the run's).
        batch_size (int, optional): items per padded batch.
        outlier_ratio (float): the high-norm cutoff (:func:`vispos.app.train.attention.norm_outlier_counts`).
        device (str): where to run.

    Returns:
        Diagnosis.

    Raises:
        FileNotFoundError / ValueError: from :func:`load_detector`; ``eval_images`` or
            ``batch_size`` below 1.
        TypeError: ``eval_images`` or ``batch_size`` not an int (nor None).
    """
    from ..._checks import check_int
    from .attention import vit_block_diagnostics
    from .heldout import held_out_compositions
    from .task2d import TASK

    eval_images = check_int(eval_images, "eval_images", minimum=1, optional=True)
    batch_size = check_int(batch_size, "batch_size", minimum=1, optional=True)
    model, args, state, mode = load_detector(path, device)
    args.eval_images = eval_images or args.eval_images
    size = batch_size or args.eval_batch_sizes[0]
    args.eval_batch_sizes, args.eval_beside_largest = [size], False
    _, held = TASK.build_datasets(args)
    batches = held_out_compositions(held, args, SimpleNamespace(rank=0, world_size=1))[f"batch{size}"]
    stats = vit_block_diagnostics(model.joiner.backbone, (nested.to(device) for nested, *_ in batches),
                                  outlier_ratio)
    return Diagnosis(label or mode, os.fspath(path), state["arm"], int(state["step"]), mode, args.vit_pos,
                     int(getattr(args, "vit_registers", 0) or 0), size, stats)


def diagnostics_table(runs: Sequence[Diagnosis]) -> str:
    """A markdown table, one row per block, for each quantity one column per run (in order),
    after one line per run (checkpoint, arm, step, mode, ViT settings, items, padding share).

    Raises:
        ValueError: no run, or two runs with one label.
    """
    if not runs:
        raise ValueError("runs must hold at least one diagnosis, got none")
    labels = [r.label for r in runs]
    if len(set(labels)) != len(labels):
        raise ValueError(f"runs must have different labels, got {labels}")
    lines = []
    for r in runs:
        s = r.stats
        lines.append(f"- {r.label}: {r.path} (arm {r.arm}, step {r.step}, {r.mode}, --vit-pos {r.vit_pos}, "
                     f"--vit-registers {r.registers}); {s.items} held-out items in padded batches of {r.batch_size}; "
                     f"padding tokens are {s.padding_share:.3f} of the sequence (uniform attention's mass on them)")
    ratio = runs[0].stats.outlier_ratio
    lines += ["", "Means over the heads and the queries that are valid patch tokens; high-norm: a valid patch token "
              f"of the block's output with norm > {ratio:g} x its image's median.", ""]
    blocks = sorted({int(row["block"]) for r in runs for row in r.stats.blocks})
    by_run = [{int(row["block"]): row for row in r.stats.blocks} for r in runs]
    many = len(runs) > 1
    head = ["block"] + [f"{name} ({label})" if many else name for _, name, _ in COLUMNS for label in labels]
    lines += ["| " + " | ".join(head) + " |", "|---:|" + "---:|" * (len(head) - 1)]
    for b in blocks:
        cells = [str(b)]
        for key, _, fmt in COLUMNS:
            cells += [fmt.format(rows[b][key]) if b in rows else "-" for rows in by_run]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def files_and_device_problem(files: dict[str, str | None], device: str) -> tuple[str, str] | None:
    """``(flag, message)`` for the first output file flag naming a folder or a file in a missing
    folder, or a ``--device`` that is not cpu (or cuda on a machine with CUDA); None when all
    are usable. The checkpoint commands check these before any work."""
    for flag, path in files.items():
        if path is not None and os.path.isdir(path):
            return flag, f"{path!r} is a folder: give the file to write"
        if path is not None and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            return flag, f"no such folder: {os.path.dirname(os.path.abspath(path))!r}"
    import torch

    try:
        kind = torch.device(device).type
    except RuntimeError:
        return "--device", f"not a torch device: {device!r}"
    if kind not in ("cpu", "cuda") or (kind == "cuda" and not torch.cuda.is_available()):
        return "--device", f"expected cpu, or cuda on a machine with CUDA, got {device!r}"
    return None


def checkpoint_parser(prog: str, description: str, checkpoints_help: str) -> OneLineParser:
    """The flags every checkpoint command of the training app takes: ``CHECKPOINT...``, ``--out``,
    ``--eval-images``, ``--device`` and ``--threads``; a command adds its own after them.

    Returns:
        OneLineParser: usage errors end the command with one line on stderr (exit status 2)."""
    p = OneLineParser(prog=prog, description=description)
    p.add_argument("checkpoints", nargs="+", metavar="CHECKPOINT", help=checkpoints_help)
    p.add_argument("--out", default=None, metavar="PATH", help="also write the table (markdown) here")
    p.add_argument("--eval-images", type=int_at_least(1), default=None, metavar="N", help="held-out items (default: the run's)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    add_threads_argument(p)
    return p


def _parser() -> argparse.ArgumentParser:
    p = checkpoint_parser("python -m vispos.app.train.diagnose", (
        "Attention diagnostics of the ViT detector from its training checkpoints: per block, the attention mass on "
        "padding, class and register tokens, the attention entropy and the high-norm tokens, on the held-out set."),
        "checkpoints of vispos train --backbone vit --save-every K (e.g. a stock and an invariant run)")
    p.add_argument("--labels", nargs="+", default=None, metavar="LABEL", help="one name per checkpoint (default: its mode)")
    p.add_argument("--figure", default=None, metavar="PATH", help="write the figure (PNG) here")
    p.add_argument("--batch-size", type=int_at_least(1), default=None, metavar="B",
                   help="items per padded held-out batch (default: the run's headline --eval-batch-sizes)")
    p.add_argument("--outlier-ratio", type=positive_float, default=2.0, metavar="R",
                   help="a high-norm token's norm exceeds this multiple of its image's median (default 2)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m vispos.app.train.diagnose``: the table on stdout (and in ``--out``), the figure
    in ``--figure``. A bad checkpoint or flag ends it with one line (exit status 2)."""
    parser = _parser()
    args = parser.parse_args(argv)

    def error(flag: str, message: str) -> int:
        parser.exit(2, f"{parser.prog}: error: argument {flag}: {message}\n")

    if args.labels is not None and len(args.labels) != len(args.checkpoints):
        return error("--labels", f"one per checkpoint ({len(args.checkpoints)}), got {len(args.labels)}")
    for flag, value in (("--eval-images", args.eval_images), ("--batch-size", args.batch_size)):
        bound = MAX_SIZES[flag[2:].replace("-", "_")]  # vispos train's bounds of the same flags
        if value is not None and value > bound:
            return error(flag, f"must be <= {bound} (as vispos train's), got {value}")
    problem = files_and_device_problem({"--figure": args.figure, "--out": args.out}, args.device)
    if problem:
        return error(*problem)
    import torch

    from .._flags import torch_threads

    runs = []
    with torch_threads(args.threads):
        for i, path in enumerate(args.checkpoints):
            try:
                runs.append(diagnose_checkpoint(path, args.labels[i] if args.labels else None, args.eval_images,
                                                args.batch_size, args.outlier_ratio, args.device))
            except (FileNotFoundError, ValueError, RuntimeError) as exc:
                return error("CHECKPOINT", " ".join(str(exc).split()))
    if args.labels is None:  # modes can repeat (two stock runs): number them
        seen = [r.label for r in runs]
        for i, r in enumerate(runs):
            if seen.count(r.label) > 1:
                r.label = f"{r.label} {i + 1}"
    table = diagnostics_table(runs)
    written = []
    if args.out:
        from .._io import write_files

        def write_table(tmp: str) -> None:
            with open(tmp, "w") as f:
                f.write(table)

        written += write_files([(args.out, write_table)])
    if args.figure:
        from ..figures.attention import plot_block_attention
        from ..png import save_figure

        fig = plot_block_attention({r.label: r.stats.blocks for r in runs},
                                   title=f"ViT attention per block ({', '.join(r.label for r in runs)})")
        written.append(save_figure(fig, args.figure))
    print(table, end="")
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
