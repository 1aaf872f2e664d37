"""The kernels one step would launch on a GPU, stock against ``padding_invariant=True``, counted on
the CPU: the figure that decides invariance's GPU cost (each launch costs 5-10 us there whatever
its size), tracked without a GPU.

One step runs under a ``TorchDispatchMode`` with vispos' host-side shortcuts switched off (the
CUDA code paths, ``_measure.count_device_ops``); views, metadata and allocation-only ops are not
counted, and each of vispos' custom ops counts as the Triton kernels it declares
(:func:`vispos.ops._triton.launches`). Batches: random images with sides drawn in 64-128 px (2D), or
random volumes with sides in 24-40 voxels (3D), each item its own size, so every batch is padded.

Steps: ``train`` (forward + backward, trainable batch norm), ``frozen`` (forward + backward, DETR's
frozen batch norm), ``eval`` (forward without gradients). ``packed`` rows run the ViT's packed mode
against the stock ViT.

    python benchmarks/count_launches.py                       # the default table
    python benchmarks/count_launches.py --models resnet50 --batches 2 8 32 --out benchmarks/results_launches.md
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import vispos  # noqa: E402
from _measure import count_device_ops  # noqa: E402
from vispos.backbones import TimmBackbone, VolumeBackbone  # noqa: E402

#: model -> (how to build it with padding_invariant / packed, number of spatial axes, steps)
MODELS = {
    "resnet50": (lambda **kw: TimmBackbone("resnet50", out_indices=(2, 3, 4), **kw), 2, ("train", "frozen", "eval")),
    "convnext_tiny": (lambda **kw: TimmBackbone("convnext_tiny", out_indices=(1, 2, 3), **kw), 2, ("train", "eval")),
    "vit_small": (lambda **kw: TimmBackbone("vit_small_patch16_224", out_indices=(11,),
                                            model_kwargs={"dynamic_img_size": True}, **kw), 2,
                  ("train", "eval", "packed")),
    "r3d_18": (lambda **kw: VolumeBackbone("r3d_18", **kw), 3, ("train", "eval")),
}


def random_batch(batch: int, num_axes: int, seed: int = 0, sides: tuple[int, int] | None = None) -> vispos.NestedTensor:
    """``batch`` random items (3 channels in 2D, 1 in 3D), each side drawn in ``sides`` (default 64-128 in 2D, 24-40 in 3D),
    padded into one batch (sides rounded up to 16 in 2D so every ViT item holds whole patches)."""
    g = torch.Generator().manual_seed(seed)
    lo, hi = sides or ((64, 128) if num_axes == 2 else (24, 40))
    items = []
    for _ in range(batch):
        sides = [int(v) for v in torch.randint(lo, hi + 1, (num_axes,), generator=g)]
        if num_axes == 2:
            sides = [-(-s // 16) * 16 for s in sides]
        items.append(torch.randn(3 if num_axes == 2 else 1, *sides, generator=g))
    return vispos.nested_tensor_from_tensor_list(items)


def _model(name: str, step: str, invariant: bool) -> torch.nn.Module:
    build = MODELS[name][0]
    kwargs = {}
    if invariant:
        kwargs["packed" if step == "packed" else "padding_invariant"] = True
    if step == "frozen":
        kwargs["frozen_batch_norm"] = True
    torch.manual_seed(0)
    return build(**kwargs)


def step_fn(model: torch.nn.Module, batch: vispos.NestedTensor, step: str):
    """One call of ``step`` on ``model``: eval without gradients, or forward + backward."""
    if step == "eval":
        model.eval()

        def run():
            with torch.no_grad():
                return model(batch)
        return run
    model.train()

    def run():
        model.zero_grad(set_to_none=True)
        levels = model(batch)
        sum(level.tensors.float().mean() for level in levels).backward()
    return run


def launches(model: torch.nn.Module, batch: vispos.NestedTensor, step: str) -> int:
    """Kernels one warm step would launch on a GPU (the first two calls warm caches and graphs)."""
    run = step_fn(model, batch, step)
    run()
    run()
    return count_device_ops(run, launches=True)[0]


def count(name: str, step: str, batch_size: int, sides: tuple[int, int] | None = None) -> tuple[int, int]:
    """``(stock, invariant)`` launches of one ``step`` of model ``name`` at batch ``batch_size``
    (item sides drawn in ``sides``; the counts do not depend on them)."""
    batch = random_batch(batch_size, MODELS[name][1], sides=sides)
    return launches(_model(name, step, False), batch, step), launches(_model(name, step, True), batch, step)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--batches", nargs="+", type=int, default=[2, 8, 32])
    parser.add_argument("--out", help="append the table to this markdown file")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    lines = ["| model | step | B | stock | invariant | ratio |", "|---|---|---:|---:|---:|---:|"]
    print("\n".join(lines), flush=True)
    for name in args.models:
        for step in MODELS[name][2]:
            for b in args.batches:
                stock, inv = count(name, step, b)
                lines.append(f"| {name} | {step} | {b} | {stock} | {inv} | {inv / stock:.2f}x |")
                print(lines[-1], flush=True)
    if args.out:
        with open(args.out, "a") as fh:
            fh.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
