"""3D segmentation on whole volumes of different sizes: three pipelines, one MONAI network.

Data (:mod:`vispos.app.train.segment3d_data`): lesions with voxel masks in real volumes at their
own sizes and anisotropic spacings; the held-out volumes (other scans) are fixed per seed.

Pipelines (``--pipeline``; same data, initial weights, loss and steps):

* ``crop``: MONAI's standard. ``RandCropByPosNegLabeld`` patches of ``--patch`` voxels for
  training; ``sliding_window_inference`` (MONAI's defaults: overlap 0.25, constant blending,
  one window at a time) on each whole held-out volume, a batch of one.
* ``whole``: padded batches of whole volumes (:class:`vispos.PaddedCollate`, zeros at the end of
  each axis) through the stock network, in training and inference.
* ``invariant``: as ``whole``, the network made exact on padded batches by
  :func:`vispos.make_padding_invariant` (each volume gets what it gets alone).

Networks (``--network``): MONAI ``SegResNet`` (``init_filters`` ``--features``, blocks down
1-2-2-4, up 1-1-1, stride 8), ``DynUNet`` (4 levels, filters ``F, 2F, 4F, 8F``, instance norm),
or ``UNETR`` as :class:`vispos.monai.AnySizeUNETR` (patch 16, 12 layers of width
``--unetr-hidden``, 4 heads; its learned position table resampled per item, or MONAI's sin-cos:
``--unetr-pos``), which is exact on padded batches by itself (``--pipeline invariant`` only).

Loss: MONAI ``DiceCELoss`` (softmax, one-hot target) on each volume's own voxels: the logits of
item ``b`` are cropped to its valid box before the loss, so padding voxels never enter it; the
batch's loss is the mean over its volumes. Optimiser: AdamW, linear warm-up, tenfold decay for
the last 20 % of the steps (:class:`vispos.app.train.engine.WarmupStepDecay`), gradient clipping.

    vispos train --volume --task segment --pipeline invariant --seed 0 --threads 1
    vispos train --volume --task segment --report      # OUT/segment3d.md over every run
    vispos train --volume --task segment --figure      # OUT/segment3d_seed0.png
    torchrun --nproc_per_node 2 -m vispos.app.train.segment3d --volume --pipeline whole

Writes ``OUT/<pipeline>/<network>/seed<S>/metrics.json`` and ``prediction.pt`` (the first held-out
volume, its label and the prediction alone), ``checkpoint.pt`` with ``--save-every``. See
docs/segmentation3d.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, DistributedSampler

import vispos
from vispos.app._flags import torch_threads
from vispos.app._io import write_files

from ._args import finished_run, flag_error
from .checkpoint import load_checkpoint, rng_state, save_checkpoint, set_rng_state
from .cli import check_device
from .distributed import DistContext, init_distributed, launched_by_torchrun
from .engine import (RESUME_FREE, ResumableSampler, WarmupStepDecay, resident_memory_mb, resumable_batches,
                     resume_conflict, sampler_state)
from .heldout import BESIDE_LARGEST
from .segment3d_args import SEGMENT_DOC, build_segment_parser, parse_segment_flags, run_folder
from .segment3d_data import LesionMasks, PatchesOf
from .report import tiny_summary
from .segment3d_eval import composition_batches, evaluate_all, infer, report_table, volume_metrics
from .volumes3d import available_volumes

__all__ = ["build_network", "build_datasets", "Segmenter", "train_step", "train_run", "run", "main"]

#: what may differ between a run and its resumption, beyond the detection core's
#: (:data:`vispos.app.train.engine.RESUME_FREE`)
SEGMENT_FREE = RESUME_FREE | {"figure"}


def build_network(args: argparse.Namespace) -> nn.Module:
    """The stock MONAI network of ``--network`` (2 output channels: background, lesion), seeded
    with ``--seed`` (the same initial weights in every pipeline)."""
    from monai.networks import nets

    torch.manual_seed(args.seed)
    f = args.features
    if args.network == "segresnet":
        return nets.SegResNet(3, init_filters=f, in_channels=1, out_channels=2, blocks_down=(1, 2, 2, 4),
                              blocks_up=(1, 1, 1), norm=("group", {"num_groups": min(8, f)}))
    if args.network == "dynunet":
        return nets.DynUNet(3, 1, 2, kernel_size=[3, 3, 3, 3], strides=[1, 2, 2, 2], upsample_kernel_size=[2, 2, 2],
                            filters=[f, 2 * f, 4 * f, 8 * f])
    from vispos.monai import AnySizeUNETR

    side = -(-args.sizes[1] // 16) * 16
    return AnySizeUNETR(1, 2, img_size=(side,) * 3, feature_size=f, hidden_size=args.unetr_hidden,
                        mlp_dim=2 * args.unetr_hidden, num_heads=4, norm_name="instance",
                        pos_embed="resample" if args.unetr_pos == "learned" else "sincos")


class Segmenter(nn.Module):
    """The network of one pipeline: a padded batch (:class:`vispos.NestedTensor`) in,
    ``Tensor[B, 2, *S_max]`` logits out (meaningless on padding).

    ``crop`` and ``whole`` run the stock network on the padded tensor (``crop`` infers with
    ``sliding_window_inference`` in eval mode); ``invariant`` runs
    ``vispos.make_padding_invariant(network)`` on the batch and its mask; UNETR runs as
    :class:`vispos.monai.AnySizeUNETR` on the batch and its mask. The ``state_dict`` is the
    network's under ``net.`` in every pipeline.
    """

    def __init__(self, network: nn.Module, pipeline: str, patch: int, name: str) -> None:
        super().__init__()
        self.pipeline, self.patch, self.name = pipeline, patch, name
        if pipeline == "invariant" and name != "unetr":
            network = vispos.make_padding_invariant(network)
        self.net = network

    def forward(self, batch: vispos.NestedTensor) -> Tensor:
        if self.pipeline == "crop" and not self.training:
            from monai.inferers import sliding_window_inference

            return sliding_window_inference(batch.tensors, (self.patch,) * 3, 1, self.net)
        if self.pipeline == "invariant":
            out = self.net(batch)
            return out.tensors if isinstance(out, vispos.NestedTensor) else out
        return self.net(batch.tensors)



def build_datasets(args: argparse.Namespace) -> tuple[Any, LesionMasks]:
    """``(train, held-out)``: training volumes (``crop``: MONAI patches of them) and the held-out
    volumes, fixed per seed (data seed ``10_000 + seed``)."""
    common = dict(sizes=tuple(args.sizes), spacings=tuple(args.spacings), max_objects=args.max_objects,
                  min_size=args.min_object, max_size=args.max_object, contrast=tuple(args.contrast))
    train = LesionMasks(available_volumes(args.volumes), args.train_images, args.seed, **common)
    held = LesionMasks(available_volumes(args.heldout_volumes), args.eval_images, 10_000 + args.seed, **common)
    if args.pipeline == "crop":
        train = PatchesOf(train, args.patch, args.seed)
    return train, held


def _loss(logits: Tensor, labels: Sequence[Tensor], loss_fn: nn.Module) -> Tensor:
    """DiceCE over each volume's own voxels (its valid box), averaged over the batch."""
    total = logits.new_zeros(())
    for b, label in enumerate(labels):
        d, h, w = label.shape
        total = total + loss_fn(logits[b:b + 1, :, :d, :h, :w], label[None, None].to(logits.device))
    return total / len(labels)


def train_step(model: nn.Module, nested: vispos.NestedTensor, targets: Sequence[dict], loss_fn: nn.Module,
               optim: torch.optim.Optimizer, sched: Any, clip: float) -> Tensor:
    """One optimiser step of the segmentation loop (the one :func:`train_run` takes).

    Args:
        model (nn.Module): a :class:`Segmenter`; ``model(nested)`` gives logits
            ``(B, 2, D, H, W)`` float on the batch's canvas.
        nested (vispos.NestedTensor): the padded batch ``(B, 1, D, H, W)`` float32 and its mask.
        targets (sequence of dict): per volume ``"label"``: ``(D_b, H_b, W_b)`` int64 (0 / 1).
        loss_fn (nn.Module): MONAI's ``DiceCELoss(to_onehot_y=True, softmax=True)``, applied to
            each volume's own voxels (its valid box), averaged over the batch.
        optim, sched: the optimiser and its learning-rate scheduler, each stepped once.
        clip (float): gradient-norm clipping (``nn.utils.clip_grad_norm_``); 0: none.

    Returns:
        Tensor: the loss, a detached 0-d float tensor.

    Raises:
        Whatever the model, MONAI's loss or the optimiser raise (nothing of its own).
    """
    loss = _loss(model(nested), [t["label"] for t in targets], loss_fn)
    optim.zero_grad(set_to_none=True)
    loss.backward()
    if clip > 0:
        nn.utils.clip_grad_norm_(model.parameters(), clip)
    optim.step()
    sched.step()
    return loss.detach()


def _resume_args(args: argparse.Namespace) -> argparse.Namespace:
    return argparse.Namespace(**{k: v for k, v in vars(args).items() if k not in SEGMENT_FREE - RESUME_FREE})


def _keys(args: argparse.Namespace) -> list[str]:
    return ["batch1"] if args.pipeline == "crop" else ["batch1", "batch4", BESIDE_LARGEST]


def train_run(args: argparse.Namespace, ctx: DistContext, log: Callable[[str], Any] = print,
              on_step: Callable[[int, nn.Module], Any] | None = None) -> dict[str, Any]:
    """Trains one pipeline and seed; rank 0 evaluates and writes ``metrics.json`` and
    ``prediction.pt`` (and ``checkpoint.pt`` every ``--save-every`` steps). Returns the metrics.

    Raises:
        ValueError: ``--resume`` names a checkpoint of other settings.
    """
    from monai.losses import DiceCELoss

    device, out_dir = ctx.device, run_folder(args)
    random.seed(args.seed + ctx.rank)
    np.random.seed(args.seed + ctx.rank)
    train_set, held_set = build_datasets(args)
    model = Segmenter(build_network(args), args.pipeline, args.patch, args.network).to(device)
    net = model
    if ctx.distributed:
        # UNETR with --unetr-pos sincos leaves its learned table unused
        model = nn.parallel.DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None,
                                                    find_unused_parameters=args.network == "unetr")
    loss_fn = DiceCELoss(to_onehot_y=True, softmax=True)
    optim = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(optim, WarmupStepDecay(args.warmup, args.steps))
    saved = {k: v for k, v in vars(args).items()}
    metrics: dict[str, Any] = {
        "task": "segment3d", "arm": args.network, "pipeline": args.pipeline, "seed": args.seed, "args": saved,
        "world_size": ctx.world_size, "global_batch": args.batch_size * ctx.world_size,
        "torch": str(torch.__version__), "threads": torch.get_num_threads(), "machine": platform.machine(),
        "steps": [], "loss": [], "loss_last": [], "lr": [], "seconds": [], "rss_mb": [], "padded_fraction": [],
        "eval": [], "resumed_at": [], "eval_compositions": _keys(args), "eval_by_composition": {},
    }
    step = 0
    if args.resume:
        state = load_checkpoint(args.resume)
        conflict = resume_conflict(state, args.network, _resume_args(args), ctx.world_size)
        if conflict:
            raise ValueError(f"--resume: {conflict}")
        net.load_state_dict(state["model"])
        optim.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        metrics, step = state["metrics"], state["step"]
        metrics["args"] = saved
        metrics["resumed_at"].append(step)
        log(f"[{args.pipeline}] resumed from {args.resume} at step {step}")
    sampler = ResumableSampler(DistributedSampler(train_set, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True,
                                                  seed=args.seed, drop_last=True))
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler, collate_fn=vispos.PaddedCollate(),
                        drop_last=True, num_workers=args.workers, persistent_workers=args.workers > 0,
                        generator=(loader_seed := torch.Generator()))
    per_epoch = len(sampler.sampler) // args.batch_size
    held = [held_set[i] for i in range(len(held_set))] if ctx.is_main else []
    if args.resume:
        set_rng_state(state["rng"][ctx.rank])
    model.train()
    for step, t_prev, (nested, targets) in resumable_batches(loader, sampler, loader_seed, step, per_epoch, args):
        nested = nested.to(device)
        loss = train_step(model, nested, targets, loss_fn, optim, sched, args.clip)
        now = time.perf_counter()
        value = float(ctx.all_reduce_mean(loss.detach().reshape(1))[0])
        mask = nested.mask
        metrics["steps"].append(step)
        metrics["loss"].append(round(value, 6))
        metrics["loss_last"].append(round(value, 6))
        metrics["lr"].append(sched.get_last_lr()[0])
        metrics["seconds"].append(round(now - t_prev, 5))
        metrics["rss_mb"].append(round(resident_memory_mb(), 2))
        metrics["padded_fraction"].append(round(float(mask.float().mean()) if mask is not None else 0.0, 4))
        if on_step is not None:
            on_step(step, model)
        if ctx.is_main and (step % args.eval_every == 0 or step == args.steps) and step != args.steps:
            net.eval()
            key = "batch1" if args.pipeline == "crop" else "batch4"
            batches = composition_batches([img.shape[1:] for img, _ in held], [key])[key]
            logits, _ = infer(net, [img for img, _ in held], batches, device)
            dice = float(np.mean([volume_metrics(logits[i], t["label"], t["spacing"].tolist())[0]
                                  for i, (_, t) in enumerate(held)]))
            metrics["eval"].append({"step": step, "dice": round(dice, 5)})
            net.train()
            log(f"[{args.pipeline}] step {step}/{args.steps} loss {np.mean(metrics['loss'][-args.eval_every:]):.3f} "
                f"held-out Dice ({key}) {dice:.3f} {np.median(metrics['seconds'][-args.eval_every:]):.3f} s/step")
        if args.save_every and (step % args.save_every == 0 or step == args.steps):
            _save(os.path.join(out_dir, "checkpoint.pt"), step, net, optim, sched, metrics, args, ctx,
                  sampler_state(step, per_epoch, args))
    if ctx.is_main:
        net.eval()
        ev = evaluate_all(net, held, _keys(args), device, step)
        net.train()
        for key, row in ev["by_composition"].items():
            metrics["eval_by_composition"].setdefault(key, []).append(row)
        metrics["eval"].append({"step": step, "dice": ev["by_composition"][_keys(args)[0]]["dice"]})
        metrics["dice_per_volume"] = ev["dice_per_volume"]
        metrics["max_logit_diff_per_volume"] = ev["max_logit_diff_per_volume"]
        metrics["max_logit_diff"] = ev["max_logit_diff"]
        metrics["heldout_sizes"] = [list(img.shape[1:]) for img, _ in held]
        metrics["heldout_spacings"] = [t["spacing"].tolist() for _, t in held]
        img, t = held[0]
        prediction = {  # for --figure: tensors only
            "step": step, "pipeline": args.pipeline, "network": args.network, "seed": args.seed,
            "image": img[0], "label": t["label"].to(torch.uint8), "spacing": t["spacing"],
            "prediction": ev["logits"][0].argmax(0).to(torch.uint8)}

        def write_metrics(tmp: str) -> None:
            with open(tmp, "w") as f:
                json.dump(metrics, f)

        write_files([(os.path.join(out_dir, "prediction.pt"), lambda tmp: torch.save(prediction, tmp)),
                     (os.path.join(out_dir, "metrics.json"), write_metrics)], make_dirs=True)  # both or neither
        rows = ", ".join(f"{k} Dice {r['dice']:.3f} HD95 {r['hd95']} mm" for k, r in ev["by_composition"].items())
        diff = "" if ev["max_logit_diff"] is None else f"; max logit diff across compositions {ev['max_logit_diff']:.2e}"
        log(f"[{args.pipeline}] step {step} held-out {rows}{diff}; "
            f"{np.median(metrics['seconds'][1:] or metrics['seconds']):.3f} s/step; wrote {out_dir}")
    ctx.barrier()
    return metrics


def _save(path: str, step: int, net: nn.Module, optim: Any, sched: Any, metrics: dict[str, Any],
          args: argparse.Namespace, ctx: DistContext, sampler: dict[str, int]) -> None:
    rngs = ctx.all_gather_object(rng_state())
    if ctx.is_main:
        save_checkpoint(path, {
            "step": step, "arm": args.network, "model": net.state_dict(), "optimizer": optim.state_dict(),
            "scheduler": sched.state_dict(), "rng": rngs, "sampler": sampler, "metrics": metrics,
            "args": dict(vars(_resume_args(args))), "world_size": ctx.world_size,
        })
    ctx.barrier()


def _validate(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """The checks that need torch, the data or the checkpoint (argparse's exit status 2)."""
    error = flag_error(parser)
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        error("--out", f"{args.out!r} exists and is not a folder")
    if args.report or args.figure:
        return
    check_device(args.device, error)
    for flag, names in (("--volumes", args.volumes), ("--heldout-volumes", args.heldout_volumes)):
        if not available_volumes(names):
            error(flag, f"none of {names} is available (packages or files missing)")
    world = int(os.environ.get("WORLD_SIZE", 1)) if launched_by_torchrun() else 1
    if args.train_images and args.train_images < args.batch_size * world:
        error("--train-images", f"must hold at least one global batch ({args.batch_size} x {world}), "
                                f"got {args.train_images}")
    if args.resume is not None:
        if not os.path.isfile(args.resume):
            error("--resume", f"no such checkpoint file: {args.resume!r}")
        try:
            state = load_checkpoint(args.resume)
        except ValueError as exc:
            error("--resume", str(exc))
        if not args.train_images:
            args.train_images = state["args"].get("train_images", 0)
        conflict = resume_conflict(state, args.network, _resume_args(args), world)
        if conflict:
            error("--resume", conflict)


def run(argv: Sequence[str] | None = None, log: Callable[[str], Any] = print,
        on_step: Callable[[int, nn.Module], Any] | None = None, prog: str | None = None) -> int:
    """``vispos train --volume --task segment``: train one pipeline and seed, or ``--report``
    (OUT/segment3d.md) or ``--figure`` (OUT/segment3d_seed<S>.png). Returns 0; a bad flag ends
    the program with argparse's exit status 2 and one line naming it, as does a finished run of
    this pipeline, network and seed under ``--out`` unless ``--force``
    (:func:`vispos.app.train._args.finished_run`)."""
    parser, args = parse_segment_flags(argv, prog)
    _validate(args, parser)
    if not (args.report or args.figure or args.force):  # before any work: a finished run is never replaced
        taken = finished_run([run_folder(args)], args.resume)
        if taken:
            flag_error(parser)("--out", taken)
    if args.report or args.figure:
        try:
            if args.report:
                table = report_table(args.out)
                path = os.path.join(args.out, "segment3d.md")
                with open(path, "w") as f:
                    f.write(table)
                log(table)
            else:
                from vispos.app.figures.segment3d import draw_segmentations

                path = draw_segmentations(args.out, args.seed, args.network)
        except FileNotFoundError as exc:
            flag_error(parser)("--figure" if args.figure else "--report", str(exc))
        log(f"wrote {path}")
        return 0
    with torch_threads(args.threads):
        ctx = init_distributed(args.device)
        try:
            if not args.train_images:
                args.train_images = args.steps * args.batch_size * ctx.world_size
            metrics = train_run(args, ctx, log=log if ctx.is_main else (lambda *_: None), on_step=on_step)
            if args.tiny and ctx.is_main:
                full_steps = build_segment_parser().get_default("steps")
                for line in tiny_summary({args.pipeline: metrics}, full_steps, SEGMENT_DOC, "Dice", "pipeline"):
                    log(line)
        finally:
            ctx.shutdown()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m vispos.app.train.segment3d`` (torchrun too): see the module docstring."""
    return run(argv)


if __name__ == "__main__":
    raise SystemExit(main())
