"""Seconds per training step of the 3D DETR demo, per position arm, at batch 4 on one thread.

Builds ``demos.train_detr3d``'s model, data and criterion exactly as a run does (the defaults of
``python -m demos.train_detr3d``, or the flags given after ``--``), then times full training steps
(collate of 4 padded crops, forward, set criterion over the decoder layers, backward, gradient
clipping, AdamW) with the three arms interleaved round-robin in one process, so that load from
other processes falls on every arm alike. It reports wall time (what a loop sees) and this
process's CPU time (``time.process_time``: on one thread, the wall time a quiet machine would
show), median and 90th percentile, after ``--warmup`` untimed steps per arm.

    python benchmarks/bench_detr3d_step.py --steps 40 --out benchmarks/results_detr3d_step.md
    python benchmarks/bench_detr3d_step.py -- --spacing 2 --crop 20 48     # another data setting
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import vispos  # noqa: E402
from _demo_step import timed_step  # noqa: E402
from demos import train_detr3d as T  # noqa: E402
from vispos.app.train import POS_ARMS, SetCriterion, build_model  # noqa: E402
from vispos.app.train.cli import parse_args  # noqa: E402


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    demo_argv = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40, help="timed steps per arm")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps per arm first")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None, help="append a markdown table to this file")
    args = p.parse_args(own)
    torch.set_num_threads(args.threads)
    _, demo = parse_args(T.TASK, ["--steps", str(args.steps + args.warmup), *demo_argv])
    demo.train_images = demo.batch_size * (args.steps + args.warmup)
    train, _ = T.build_datasets(demo)
    collate = vispos.PaddedCollate(size_divisibility=demo.size_divisibility)
    runs = {}
    for arm in POS_ARMS:
        model = build_model(T.TASK, arm, demo)
        runs[arm] = (model, torch.optim.AdamW(model.parameters(), lr=demo.lr, weight_decay=demo.weight_decay))
    criterion = SetCriterion(len(T.CLASSES), T.BOX_OPS_3D, demo.class_weight, demo.l1_weight,
                             demo.giou_weight, demo.eos_coef)
    wall = {arm: [] for arm in POS_ARMS}
    cpu = {arm: [] for arm in POS_ARMS}
    padded = []
    for step in range(args.warmup + args.steps):
        items = [train[step * demo.batch_size + i] for i in range(demo.batch_size)]
        for arm, (model, optim) in runs.items():
            w, c, nested = timed_step(model, optim, criterion, collate, items, demo.clip)
            if step >= args.warmup:
                wall[arm].append(w)
                cpu[arm].append(c)
        padded.append(float(nested.mask.float().mean()))
    lines = [
        f"torch {torch.__version__}, {args.threads} thread(s), batch {demo.batch_size}, {args.steps} timed steps "
        f"per arm after {args.warmup} untimed, arms interleaved; spacing {demo.spacing} mm, crops "
        f"{demo.crop[0]}-{demo.crop[1]} voxels, {100 * np.mean(padded):.0f} % of the voxels padded; "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores",
        "",
        "| arm | wall s/step (median) | wall p90 | CPU s/step (median) | CPU p90 |",
        "|---|---:|---:|---:|---:|",
    ]
    for arm in POS_ARMS:
        w, c = np.asarray(wall[arm]), np.asarray(cpu[arm])
        lines.append(f"| {arm} | {np.median(w):.3f} | {np.percentile(w, 90):.3f} | {np.median(c):.3f} | "
                     f"{np.percentile(c, 90):.3f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "a") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
