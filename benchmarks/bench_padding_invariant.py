"""What ``padding_invariant=True`` costs: backbones and the demos' training step, with and without.

Backbone rows: timm ResNet-50 (``out_indices=(2, 3, 4)``) on a padded batch of four of
scikit-image's photos at their own aspect ratios (longest side ``--max-side``), and torchvision's
``r3d_18`` (``VolumeBackbone``) on two crops of nilearn's MNI152 template of different shapes.
Each in eval mode (forward under ``no_grad``) and in training mode (forward + backward of the
levels' mean, batch norm on batch statistics). The stock and the invariant backbone hold the same
weights and run interleaved round-robin in one process, so load from other processes falls on
both alike; warm (``--warmup`` untimed calls each), default allocator. Reported: median wall and
CPU seconds (``time.process_time``: on one thread, what a quiet machine would show) and their
ratios. Peak memory is measured in its own pass: one fresh subprocess per row and arm
(``--peak``), glibc set to return freed blocks (``benchmarks/_measure.malloc_setup``), the peak
resident growth of one warm call.

Batch-size rows (``--sweep``): timm ``resnet18`` and ``resnet50`` (levels 2-4) at B = 2, 8 and 32,
and ``convnext_tiny`` (levels 1-3) at B = 2 and 8, on a padded batch of random images of mixed
sizes (each side drawn in ``--sweep-sides``, seeded), eval forward and train forward + backward,
stock and invariant interleaved as above; each row is measured ``--passes`` times in a row (the
machine may be shared), the ratio reported per pass and as the median of the passes.
``--batches`` and ``--modes`` keep some rows only (for long runs of many rounds on one row).

Demo rows (``--demo``): seconds per training step of ``demos.train_detr`` and
``demos.train_detr3d`` (sine arm, their defaults) with and without ``--padding-invariant``,
interleaved as ``bench_detr3d_step.py`` does for the arms.

    python benchmarks/bench_padding_invariant.py --threads 1 --out benchmarks/results_padding_invariant.md
    python benchmarks/bench_padding_invariant.py --demo --steps 30 --out benchmarks/results_padding_invariant.md
    python benchmarks/bench_padding_invariant.py --sweep --passes 2 --out benchmarks/results_padding_invariant.md
    python benchmarks/bench_padding_invariant.py --sweep --models resnet50 --batches 2 --modes train --passes 1 --repeats 40
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import vispos  # noqa: E402
from vispos.backbones import TimmBackbone, VolumeBackbone  # noqa: E402

ARMS = ("stock", "invariant")
WORKLOADS = ("resnet50-2d", "r3d18-3d")
MODES = ("eval forward", "train forward+backward")


def _trained_like(model: torch.nn.Module) -> None:
    g = torch.Generator().manual_seed(0)
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            with torch.no_grad():
                m.running_mean.copy_(torch.rand(m.running_mean.shape, generator=g) - 0.5)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)


def build(workload: str, max_side: int):
    """The two backbones (same weights) and the padded batch of ``workload``."""
    torch.manual_seed(0)
    if workload == "resnet50-2d":
        from vispos.app.data import sample_images

        make = lambda pi: TimmBackbone("resnet50", out_indices=(2, 3, 4), padding_invariant=pi)  # noqa: E731
        photos = sample_images(["astronaut", "coffee", "chelsea", "rocket"], max_size=max_side)
        batch = vispos.nested_tensor_from_tensor_list([t for _, t in photos])
    else:
        from vispos.app.data import mni152_template

        make = lambda pi: VolumeBackbone("r3d_18", padding_invariant=pi)  # noqa: E731
        volume = mni152_template(resolution=2)  # (1, 99, 117, 95) at 2 mm
        crops = [volume[:, 25:73, 30:86, 28:68], volume[:, 30:70, 35:83, 20:76]]
        batch = vispos.nested_tensor_from_tensor_list([c.contiguous() for c in crops])
    stock = make(False)
    _trained_like(stock)
    invariant = make(True)
    invariant.load_state_dict(stock.state_dict())
    return {"stock": stock, "invariant": invariant}, batch


def step_fn(model: torch.nn.Module, batch, mode: str):
    if mode == "eval forward":
        model.eval()

        def run():
            with torch.no_grad():
                return model(batch)
    else:
        model.train()

        def run():
            model.zero_grad(set_to_none=True)
            levels = model(batch)
            sum(level.tensors.mean() for level in levels).backward()
    return run


def peak_pass(workload: str, mode: str, arm: str, max_side: int, threads: int) -> int:
    """Peak resident growth (bytes) of one warm call, in a fresh process."""
    cmd = [sys.executable, os.path.abspath(__file__), "--peak", workload, mode, arm, "--max-side", str(max_side),
           "--threads", str(threads)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT).stdout
    return int(json.loads(out.strip().splitlines()[-1])["peak"])


def _peak_child(workload: str, mode: str, arm: str, max_side: int) -> None:
    from _measure import malloc_setup, peak_bytes

    malloc_setup()
    models, batch = build(workload, max_side)
    run = step_fn(models[arm], batch, mode)
    run()
    run()
    print(json.dumps({"peak": peak_bytes(run, torch.device("cpu"))}))


def backbone_rows(args) -> list[str]:
    lines = [
        f"torch {torch.__version__}, {args.threads} thread(s), {args.repeats} interleaved rounds after "
        f"{args.warmup} warm-up calls per arm; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores",
        "",
        "| backbone, batch | mode | stock wall s | invariant wall s | wall ratio | stock CPU s | invariant CPU s | "
        "CPU ratio | peak memory ratio |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for workload in WORKLOADS:
        models, batch = build(workload, args.max_side)
        shapes = "x".join(str(s) for s in batch.tensors.shape)
        for mode in MODES:
            runs = {arm: step_fn(models[arm], batch, mode) for arm in ARMS}
            wall = {arm: [] for arm in ARMS}
            cpu = {arm: [] for arm in ARMS}
            for _ in range(args.warmup):
                for arm in ARMS:
                    runs[arm]()
            for _ in range(args.repeats):
                for arm in ARMS:
                    t0, c0 = time.perf_counter(), time.process_time()
                    runs[arm]()
                    wall[arm].append(time.perf_counter() - t0)
                    cpu[arm].append(time.process_time() - c0)
            w = {arm: statistics.median(wall[arm]) for arm in ARMS}
            c = {arm: statistics.median(cpu[arm]) for arm in ARMS}
            peak = "-"
            if not args.no_peak:
                p = {arm: peak_pass(workload, mode, arm, args.max_side, args.threads) for arm in ARMS}
                peak = f"{p['invariant'] / max(p['stock'], 1):.2f} ({p['stock'] / 2**20:.0f} -> {p['invariant'] / 2**20:.0f} MiB)"
            lines.append(
                f"| {workload} {shapes} | {mode} | {w['stock']:.3f} | {w['invariant']:.3f} | "
                f"{w['invariant'] / w['stock']:.3f} | {c['stock']:.3f} | {c['invariant']:.3f} | "
                f"{c['invariant'] / c['stock']:.3f} | {peak} |"
            )
            print(lines[-1], flush=True)
    return lines


SWEEP = (("resnet18", (2, 3, 4), (2, 8, 32)), ("resnet50", (2, 3, 4), (2, 8, 32)),
         ("convnext_tiny", (1, 2, 3), (2, 8)))


def sweep_batch(batch: int, sides: tuple[int, int], seed: int = 0):
    """A padded batch of ``batch`` random images, each side drawn in ``[sides[0], sides[1]]``."""
    g = torch.Generator().manual_seed(seed)
    items = []
    for _ in range(batch):
        h, w = (int(v) for v in torch.randint(sides[0], sides[1] + 1, (2,), generator=g))
        items.append(torch.randn(3, h, w, generator=g))
    return vispos.nested_tensor_from_tensor_list(items)


def _interleaved(runs: dict, warmup: int, repeats: int) -> tuple[dict, dict]:
    """Median wall and CPU seconds per arm, the arms run round-robin."""
    wall = {arm: [] for arm in ARMS}
    cpu = {arm: [] for arm in ARMS}
    for _ in range(warmup):
        for arm in ARMS:
            runs[arm]()
    for _ in range(repeats):
        for arm in ARMS:
            t0, c0 = time.perf_counter(), time.process_time()
            runs[arm]()
            wall[arm].append(time.perf_counter() - t0)
            cpu[arm].append(time.process_time() - c0)
    return ({arm: statistics.median(wall[arm]) for arm in ARMS}, {arm: statistics.median(cpu[arm]) for arm in ARMS})


def sweep_rows(args) -> list[str]:
    lines = [
        f"torch {torch.__version__}, {args.threads} thread(s), {args.repeats} interleaved rounds after "
        f"{args.warmup} warm-up calls per arm, {args.passes} passes per row; random images of sides "
        f"{args.sweep_sides[0]}-{args.sweep_sides[1]} px; load average {os.getloadavg()[0]:.1f} on "
        f"{os.cpu_count()} cores",
        "",
        "| backbone, levels | B, canvas | mode | stock CPU s | invariant CPU s | CPU ratio (median of passes) | "
        "CPU ratio per pass | wall ratio per pass |",
        "|---|---|---|---:|---:|---:|---|---|",
    ]
    for name, levels, batches in SWEEP:
        if args.models and name not in args.models:
            continue
        torch.manual_seed(0)
        stock = TimmBackbone(name, out_indices=levels, padding_invariant=False)
        _trained_like(stock)
        invariant = TimmBackbone(name, out_indices=levels, padding_invariant=True)
        invariant.load_state_dict(stock.state_dict())
        models = {"stock": stock, "invariant": invariant}
        for batch_size in batches:
            if args.batches and batch_size not in args.batches:
                continue
            batch = sweep_batch(batch_size, tuple(args.sweep_sides))
            canvas = "x".join(str(s) for s in batch.tensors.shape[2:])
            for mode in MODES:
                if args.modes and mode.split()[0] not in args.modes:
                    continue
                runs = {arm: step_fn(models[arm], batch, mode) for arm in ARMS}
                cpu_ratios, wall_ratios, cpus = [], [], []
                for _ in range(args.passes):
                    w, c = _interleaved(runs, args.warmup, args.repeats)
                    cpu_ratios.append(c["invariant"] / c["stock"])
                    wall_ratios.append(w["invariant"] / w["stock"])
                    cpus.append(c)
                median = statistics.median(cpu_ratios)
                lines.append(
                    f"| {name}, {len(levels)} levels | {batch_size}, {canvas} | {mode} | "
                    f"{statistics.median(c['stock'] for c in cpus):.3f} | "
                    f"{statistics.median(c['invariant'] for c in cpus):.3f} | {median:.3f} | "
                    f"{', '.join(f'{r:.3f}' for r in cpu_ratios)} | {', '.join(f'{r:.3f}' for r in wall_ratios)} |"
                )
                print(lines[-1], flush=True)
    return lines


def demo_rows(args) -> list[str]:
    from _demo_step import timed_step
    from demos import train_detr, train_detr3d
    from vispos.app.train import SetCriterion, build_model
    from vispos.app.train.cli import parse_args

    lines = [
        "",
        f"Demo training step (sine arm, the demos' defaults, batch of the demo), {args.steps} timed steps per "
        f"arm after {args.warmup} untimed, interleaved; load average {os.getloadavg()[0]:.1f}",
        "",
        "| demo | stock wall s/step | invariant wall s/step | ratio | stock CPU s/step | invariant CPU s/step | ratio |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for task in (train_detr.TASK, train_detr3d.TASK):
        total = args.steps + args.warmup
        runs = {}
        for arm in ARMS:
            flags = ["--steps", str(total), "--pos", "sine"] + (["--padding-invariant"] if arm == "invariant" else [])
            _, demo = parse_args(task, flags)
            demo.train_images = demo.batch_size * total
            if arm == "stock":
                train, _ = task.build_datasets(demo)
            model = build_model(task, "sine", demo)
            runs[arm] = (model, torch.optim.AdamW(model.parameters(), lr=demo.lr, weight_decay=demo.weight_decay))
        criterion = SetCriterion(len(task.classes), task.box_ops, demo.class_weight, demo.l1_weight,
                                 demo.giou_weight, demo.eos_coef)
        collate = vispos.PaddedCollate(size_divisibility=demo.size_divisibility)
        wall = {arm: [] for arm in ARMS}
        cpu = {arm: [] for arm in ARMS}
        for step in range(total):
            items = [train[step * demo.batch_size + i] for i in range(demo.batch_size)]
            for arm, (model, optim) in runs.items():
                w, c, _ = timed_step(model, optim, criterion, collate, items, demo.clip)
                if step >= args.warmup:
                    wall[arm].append(w)
                    cpu[arm].append(c)
        w = {arm: statistics.median(wall[arm]) for arm in ARMS}
        c = {arm: statistics.median(cpu[arm]) for arm in ARMS}
        lines.append(f"| {task.name} | {w['stock']:.3f} | {w['invariant']:.3f} | {w['invariant'] / w['stock']:.3f} | "
                     f"{c['stock']:.3f} | {c['invariant']:.3f} | {c['invariant'] / c['stock']:.3f} |")
        print(lines[-1], flush=True)
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=7, help="interleaved timed rounds per row")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--max-side", type=int, default=320, help="longest side of the 2D photos")
    p.add_argument("--no-peak", action="store_true", help="skip the peak-memory subprocesses")
    p.add_argument("--demo", action="store_true", help="the demos' training step instead of the backbones")
    p.add_argument("--steps", type=int, default=30, help="timed demo steps per arm (--demo)")
    p.add_argument("--sweep", action="store_true", help="rows per batch size: resnet18 / resnet50 / convnext_tiny")
    p.add_argument("--passes", type=int, default=2, help="passes per row (--sweep)")
    p.add_argument("--sweep-sides", type=int, nargs=2, default=(64, 128), help="image sides drawn in (--sweep)")
    p.add_argument("--models", nargs="*", default=None, help="only these timm models (--sweep)")
    p.add_argument("--batches", type=int, nargs="*", default=None, help="only these batch sizes (--sweep)")
    p.add_argument("--modes", nargs="*", choices=("eval", "train"), default=None, help="only these modes (--sweep)")
    p.add_argument("--out", default=None, help="append the markdown table to this file")
    p.add_argument("--peak", nargs=3, metavar=("WORKLOAD", "MODE", "ARM"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.peak:
        _peak_child(*args.peak, args.max_side)
        return 0
    lines = demo_rows(args) if args.demo else sweep_rows(args) if args.sweep else backbone_rows(args)
    text = "\n".join(lines) + "\n"
    if args.out:
        with open(args.out, "a") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
