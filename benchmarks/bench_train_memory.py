"""Resident memory over a long training loop: flat after warm-up?

Runs ``demos.train_detr``'s training loop (the shared core ``vispos.app.train``: DataLoader +
PaddedCollate with multi-scale padded batches, timm backbone -> Joiner -> PositionEmbeddingSine ->
DetrEncoder -> DETR decoder, Hungarian matching, backward, AdamW) for ``--steps`` steps on small images, reads the process's resident
set size after every step and compares the value after ``--warmup`` steps with the end. Every
batch has its own padded size, so a cache keyed on shapes that grew without bound would show.

    python benchmarks/bench_train_memory.py --steps 400 --warmup 100 --out benchmarks/results_train_memory.md

Exits with status 1 when the growth exceeds ``--max-growth-pct`` (default 3 %).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from demos import train_detr  # noqa: E402
from vispos.app.train import DistContext, train_arm  # noqa: E402
from vispos.app.train.cli import parse_args  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--pos", default="sine", choices=train_detr.POS_ARMS)
    p.add_argument("--max-growth-pct", type=float, default=3.0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None, help="append a markdown table to this file")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        _, train_args = parse_args(train_detr.TASK, [
            "--steps", str(args.steps), "--out", tmp, "--pos", args.pos,
            "--photo-size", "80", "--scales", "48", "56", "64", "72", "80",
            "--min-object", "8", "--max-object", "28", "--batch-size", "4",
            "--eval-every", str(args.steps), "--eval-images", "8",
        ])
        train_args.train_images = args.steps * train_args.batch_size
        metrics = train_arm(train_detr.TASK, args.pos, train_args, DistContext(), os.path.join(tmp, args.pos),
                            log=lambda *_: None)
    rss = np.asarray(metrics["rss_mb"])
    warm, end = rss[args.warmup - 1], rss[-1]
    growth = 100 * (end / warm - 1)
    shapes = len({round(f, 4) for f in metrics["padded_fraction"]})
    lines = [
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, arm {args.pos}, "
        f"{args.steps} steps of batch 4, {shapes} distinct padded fractions",
        "",
        "| RSS at step 1 | after warm-up (step %d) | end (step %d) | max | growth after warm-up | s/step (median) |"
        % (args.warmup, args.steps),
        "|---:|---:|---:|---:|---:|---:|",
        f"| {rss[0]:.1f} MiB | {warm:.1f} MiB | {end:.1f} MiB | {rss.max():.1f} MiB | {growth:+.2f} % | "
        f"{np.median(metrics['seconds'][1:]):.3f} |",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0 if growth <= args.max_growth_pct else 1


if __name__ == "__main__":
    raise SystemExit(main())
