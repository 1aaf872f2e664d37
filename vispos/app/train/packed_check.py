"""The packed ViT against the padded invariant ViT, from a training checkpoint: the same weights
run both ways on the run's held-out compositions, their metric side by side and the largest
difference of their outputs.

A ``--padding-invariant`` ViT masks every padding token out of attention; a ``--packed`` one puts
each image's tokens in one sequence with no padding token at all (varlen attention). The two are
the same function of an image, so a checkpoint of either, rebuilt both ways, must give the same
class logits and boxes for every held-out item in every composition (to float rounding) and so
the same metric. This command measures that on a user's own checkpoint.

    python -m vispos.app.train.packed_check runs/vit2d-inv/sine/seed0/checkpoint.pt --out packed.md

Exit status: 0 when every difference is within ``--atol``, 1 when one is not (the table says
where), 2 for a bad checkpoint or flag (one line).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from .._flags import positive_float
from ._args import MAX_SIZES
from .diagnose import checkpoint_parser, files_and_device_problem, load_detector

__all__ = ["PackedCheck", "check_checkpoint", "packed_table", "main"]

#: the largest difference of logits or boxes (float32) that counts as equal; the tests' bound
ATOL = 1e-4


@dataclass
class PackedCheck:
    """One checkpoint run padded-invariant and packed.

    Attributes:
        path (str): the checkpoint. arm (str): its ``--pos`` arm. step (int): its step.
        mode (str): how it was trained, ``invariant`` or ``packed``. metric (str): the metric
            compared (a key of the task's metrics, e.g. ``ap50``). items (int): held-out items.
        rows (list of dict): one per composition (``batch<B>``, ``beside_largest``), keys
            ``composition``, ``invariant``, ``packed`` (the metric), ``logits`` and ``boxes``
            (the largest absolute difference, packed against invariant, over the scored items;
            ``inf`` where either output is NaN or both are the same infinity; then a model whose
            outputs the matcher cannot score has metric NaN).
    """

    path: str
    arm: str
    step: int
    mode: str
    metric: str
    items: int
    rows: list[dict]

    def max_difference(self) -> float:
        """The largest logit or box difference over every composition."""
        return max(max(r["logits"], r["boxes"]) for r in self.rows)


def _packed_twin(args: argparse.Namespace, arm: str, weights: dict, device: str):
    """The ``--packed`` detector with ``weights`` (those of the invariant one), in eval mode."""
    import torch

    from .engine import build_model
    from .task2d import TASK

    twin_args = argparse.Namespace(**{**vars(args), "packed": True, "padding_invariant": False})
    with torch.random.fork_rng(devices=[]):  # build_model seeds torch's generator
        twin = build_model(TASK, arm, twin_args)
    twin.load_state_dict(weights)
    return twin.to(device).eval()


def check_checkpoint(path: str | os.PathLike, metric: str = "ap50", eval_images: int | None = None,
                     device: str = "cpu") -> PackedCheck:
    """Rebuilds a ``--padding-invariant`` or ``--packed`` ViT checkpoint as both detectors (the
    same weights) and evaluates each on the held-out set in the run's compositions
    (``--eval-batch-sizes``, ``--eval-beside-largest``), as the run's evaluation builds them.

    Args:
        path (str | PathLike): a checkpoint of ``vispos train --backbone vit --save-every K``
            with ``--padding-invariant`` or ``--packed``.
        metric (str): one of the 2D task's metrics (``map``, ``ap50``, ``ap75``).
        eval_images (int, optional): held-out items (default: the run's).
        device (str): where to run.

    Returns:
        PackedCheck: the metric of each and the largest output differences (float32 outputs,
        compared in float64), per composition.

    Raises:
        FileNotFoundError / ValueError / RuntimeError: from
            :func:`vispos.app.train.diagnose.load_detector`; a stock checkpoint (its padded
            predictions depend on the padding, so no packed twin can equal them); ``metric``
            not one of the task's; ``eval_images`` below 1.
        TypeError: ``metric`` not a str, ``eval_images`` not an int (nor None).
    """
    import torch

    from ..._checks import check_choice, check_int
    from .criterion import SetCriterion
    from .distributed import DistContext
    from .engine import evaluate
    from .heldout import held_out_compositions
    from .task2d import TASK

    metric = check_choice(metric, TASK.metric_names, "metric")
    eval_images = check_int(eval_images, "eval_images", minimum=1, optional=True)
    model, args, state, mode = load_detector(path, device)
    if mode == "stock":
        raise ValueError(f"checkpoint {os.fspath(path)!r} is of a stock ViT, whose padded predictions depend on the "
                         "padding; the check reads a --padding-invariant or --packed run")
    twin = _packed_twin(args, state["arm"], state["model"], device)
    args.eval_images = eval_images or args.eval_images
    _, held = TASK.build_datasets(args)
    ctx = DistContext(device=torch.device(device))
    criterion = SetCriterion(len(TASK.classes), TASK.box_ops, args.class_weight, args.l1_weight,
                             args.giou_weight, args.eos_coef)
    outputs: dict[str, list] = {"invariant": [], "packed": []}  # each evaluation's outputs, batch by batch
    hooks = [net.register_forward_hook(lambda _m, _i, out, seen=outputs[name]: seen.append(out))
             for name, net in (("invariant", model), ("packed", twin))]
    rows = []
    try:
        for key, batches in held_out_compositions(held, args, ctx).items():
            row = {"composition": key, "logits": 0.0, "boxes": 0.0}
            for name, net in (("invariant", model), ("packed", twin)):
                outputs[name].clear()
                try:
                    row[name] = evaluate(net, batches, criterion, TASK, ctx)[metric]
                except ValueError:  # the matcher refuses NaN / inf outputs: a finding, not a bad input
                    if all(out[k].isfinite().all() for out in outputs[name] for k in ("pred_logits", "pred_boxes")):
                        raise
                    row.update({name: math.nan, "logits": math.inf, "boxes": math.inf})
            if math.isnan(row["invariant"]) or math.isnan(row["packed"]):
                rows.append(row)
                continue
            for (_, _, n_scored), a, b in zip(batches, outputs["invariant"], outputs["packed"], strict=True):
                for name, out_key in (("logits", "pred_logits"), ("boxes", "pred_boxes")):
                    gap = (a[out_key][:n_scored].double() - b[out_key][:n_scored].double()).abs()
                    row[name] = max(row[name], float(gap.nan_to_num(nan=math.inf).max()))  # NaN: never equal
            rows.append(row)
    finally:
        for hook in hooks:
            hook.remove()
    return PackedCheck(os.fspath(path), state["arm"], int(state["step"]), mode, metric, len(held), rows)


def packed_table(checks: Sequence[PackedCheck], atol: float = ATOL) -> str:
    """A markdown table, one row per (checkpoint, composition), and a closing line saying
    whether every difference is within ``atol``.

    Raises:
        ValueError: no check.
    """
    if not checks:
        raise ValueError("checks must hold at least one check, got none")
    metric = checks[0].metric
    lines = [f"| checkpoint | step | trained | composition | {metric} invariant | {metric} packed "
             "| max abs logit diff | max abs box diff |", "|---|---:|---|---|---:|---:|---:|---:|"]
    for c in checks:
        for r in c.rows:
            lines.append(f"| {c.path} | {c.step} | {c.mode} | {r['composition']} | {r['invariant']:.4f} "
                         f"| {r['packed']:.4f} | {r['logits']:.2e} | {r['boxes']:.2e} |")
    worst = max(c.max_difference() for c in checks)
    verdict = "equal" if worst <= atol else "NOT equal"
    lines += ["", f"Packed and invariant: {verdict} (largest difference {worst:.2e}, tolerance {atol:g}; "
              f"{sum(len(c.rows) for c in checks)} compositions, {sum(c.items for c in checks)} held-out items)."]
    return "\n".join(lines) + "\n"


def _parser() -> argparse.ArgumentParser:
    p = checkpoint_parser("python -m vispos.app.train.packed_check", (
        "The packed ViT against the padded invariant ViT from training checkpoints: the same weights run both ways "
        "on the run's held-out compositions, the metric of each and the largest output difference."),
        "checkpoints of vispos train --backbone vit --save-every K with --padding-invariant or --packed")
    p.add_argument("--metric", default="ap50", choices=("map", "ap50", "ap75"), help="the metric compared (default ap50)")
    p.add_argument("--atol", type=positive_float, default=ATOL, metavar="A",
                   help=f"the largest logit or box difference counted as equal (default {ATOL:g})")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m vispos.app.train.packed_check``: the table on stdout (and in ``--out``); exit
    status 0 when packed equals invariant within ``--atol``, 1 when not, 2 for a bad checkpoint
    or flag (one line)."""
    parser = _parser()
    args = parser.parse_args(argv)

    def error(flag: str, message: str) -> int:
        parser.exit(2, f"{parser.prog}: error: argument {flag}: {message}\n")

    if args.eval_images is not None and args.eval_images > MAX_SIZES["eval_images"]:
        return error("--eval-images", f"must be <= {MAX_SIZES['eval_images']} (as vispos train's), got {args.eval_images}")
    problem = files_and_device_problem({"--out": args.out}, args.device)
    if problem:
        return error(*problem)
    from .._flags import torch_threads
    checks = []
    with torch_threads(args.threads):
        for path in args.checkpoints:
            try:
                checks.append(check_checkpoint(path, args.metric, args.eval_images, args.device))
            except (FileNotFoundError, ValueError, RuntimeError) as exc:
                return error("CHECKPOINT", " ".join(str(exc).split()))
    table = packed_table(checks, args.atol)
    if args.out:
        from .._io import write_files

        def write_table(tmp: str) -> None:
            with open(tmp, "w") as f:
                f.write(table)

        write_files([(args.out, write_table)])
    print(table, end="")
    if args.out:
        print(f"wrote {args.out}")
    return 0 if max(c.max_difference() for c in checks) <= args.atol else 1


if __name__ == "__main__":
    sys.exit(main())
