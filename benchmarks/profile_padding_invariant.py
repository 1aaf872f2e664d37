"""Where an invariant backbone's training step spends the time it adds: ``torch.profiler`` self CPU
time by kind of op, stock against invariant, for timm backbones on padded batches of random
images (the batches of ``bench_padding_invariant.py --sweep``), one thread, warm.

The buckets: convolution (forward and backward), batch norm (torch's kernels; vispos' masked
statistics: the select, the products, the norms), fills (the padding's zeros, in place), the
activations, max pooling, and everything else (sums, element-wise products, copies, the
autograd engine). Each row is the mean over ``--steps`` profiled steps; the last column is the
invariant step's extra time in that bucket as a percentage of the stock step. Profiles carry
their own overhead, and this machine's noise: read the buckets, not the totals' third digit.

    OMP_NUM_THREADS=1 python benchmarks/profile_padding_invariant.py --models resnet50 --batches 2 8 32
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_padding_invariant import SWEEP, _trained_like, sweep_batch  # noqa: E402
from vispos.backbones import TimmBackbone  # noqa: E402

BUCKETS = ("convolution", "batch norm", "fills", "activation", "max pool", "other")


def bucket(key: str) -> str:
    """The bucket of one profiler key (an ATen op or an autograd node)."""
    k = key.lower()
    if "conv" in k or "mkldnn" in k:
        return "convolution"
    if any(t in k for t in ("validbatchnorm", "native_batch_norm", "addcmul", "vector_norm", "bmm")) \
            or k.startswith("aten::where"):
        return "batch norm"
    if "fillpadding" in k or k in ("aten::fill_", "aten::masked_fill_", "aten::slice", "aten::select"):
        return "fills"
    if "threshold" in k or "relu" in k or "clamp" in k:
        return "activation"
    if "max_pool" in k:
        return "max pool"
    return "other"


def profile_rows(name: str, levels: tuple[int, ...], batch_size: int, steps: int, sides) -> list[str]:
    torch.manual_seed(0)
    stock = TimmBackbone(name, out_indices=levels).train()
    _trained_like(stock)
    invariant = TimmBackbone(name, out_indices=levels, padding_invariant=True).train()
    invariant.load_state_dict(stock.state_dict())
    batch = sweep_batch(batch_size, sides)

    def step(model):
        out = model(batch)
        sum(level.tensors.float().sum() for level in out).backward()

    ms = {}
    for label, model in (("stock", stock), ("invariant", invariant)):
        step(model)
        step(model)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                step(model)
        totals = dict.fromkeys(BUCKETS, 0.0)
        for event in prof.key_averages():
            totals[bucket(event.key)] += event.self_cpu_time_total / 1e3 / steps
        ms[label] = totals
    base = sum(ms["stock"].values())
    canvas = "x".join(str(s) for s in batch.tensors.shape[2:])
    lines = [f"**{name}, B = {batch_size}, canvas {canvas}**", "",
             "| bucket | stock ms / step | invariant ms / step | extra, % of the stock step |", "|---|---:|---:|---:|"]
    for b in (*BUCKETS, "total"):
        a = base if b == "total" else ms["stock"][b]
        v = sum(ms["invariant"].values()) if b == "total" else ms["invariant"][b]
        lines.append(f"| {b} | {a:.0f} | {v:.0f} | {100 * (v - a) / base:+.1f} |")
    return lines + [""]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="*", default=["resnet50"])
    p.add_argument("--batches", type=int, nargs="*", default=[2, 8, 32])
    p.add_argument("--steps", type=int, default=2, help="profiled steps per arm")
    p.add_argument("--sweep-sides", type=int, nargs=2, default=(64, 128))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None, help="append the markdown to this file")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    lines = [f"torch {torch.__version__}, {args.threads} thread(s), {args.steps} profiled steps per arm, "
             f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", ""]
    for name, levels, _ in SWEEP:
        if name in args.models:
            for batch_size in args.batches:
                rows = profile_rows(name, levels, batch_size, args.steps, tuple(args.sweep_sides))
                print("\n".join(rows), flush=True)
                lines += rows
    if args.out:
        with open(args.out, "a") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
