"""The shared training loop of the DETR demos (2D and 3D): data, model, optimiser, schedule,
steps, evaluation, checkpoints, one process or data-parallel.

One step: a per-process batch padded by :class:`vispos.PaddedCollate` -> :class:`DetrModel`
(wrapped in ``DistributedDataParallel`` under torchrun) -> :class:`SetCriterion` summed over the
decoder layers -> backward -> gradient clipping (max norm ``--clip``) -> AdamW -> scheduler
(linear warm-up over ``--warmup`` steps, then a tenfold decay for the last 20 % of the steps, as
DETR's ``lr_drop``). Every step records the losses (averaged over processes), the seconds it took
(data loading included, evaluation excluded), rank 0's resident memory and the padded fraction
of the batch; every ``--eval-every`` steps the held-out set is evaluated (each process takes a
share, predictions are gathered, the metric is computed once on the whole set) in the headline
composition (the first of ``--eval-batch-sizes``), and at the last three evaluations in every
composition (:mod:`.heldout`: each batch size, and beside the largest item).

Data order: a :class:`torch.utils.data.DistributedSampler` (shuffled with the run's seed,
``set_epoch`` every epoch) hands each process its share; with ``world_size`` processes of
batch ``b`` a step covers the same items as one process with batch ``world_size * b``.

References:
    Carion et al., DETR ``main.py`` / ``engine.py``; PyTorch ``DistributedDataParallel`` and
    ``DistributedSampler`` documentation.
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import random
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, Sampler

import vispos
from vispos.app._io import write_files
from vispos.backbones import freeze_batch_norm

from .checkpoint import load_checkpoint, rng_state, save_checkpoint, set_rng_state
from .criterion import SetCriterion
from .distributed import DistContext
from .heldout import composition_keys, full_evaluation_steps, held_out_compositions
from .metrics import matched_ious
from .model import DetrModel, make_position_embedding
from .task import DetrTask

__all__ = ["WarmupStepDecay", "ResumableSampler", "build_model", "evaluate", "train_arm", "resident_memory_mb",
           "resume_conflict", "RESUME_FREE", "sampler_state", "resumable_batches"]

#: args that may differ between a run and its resumption (everything else must match): where the
#: run writes and how it runs, when it evaluates, the report's memory warm-up, and how long it goes
#: on (``--steps``: the schedule keeps the checkpoint's warm-up and decay step, the data its
#: ``--train-images``; see :func:`resume_conflict`)
RESUME_FREE = frozenset({
    "resume", "force", "save_every", "threads", "workers", "out", "report", "device", "eval_every", "memory_warmup",
    "steps", "eval_batch_sizes", "eval_beside_largest",
})
#: per-step series in metrics.json
SERIES = ("loss", "loss_last", "loss_ce", "loss_l1", "loss_giou", "lr", "seconds", "rss_mb", "padded_fraction")


class WarmupStepDecay:
    """Learning-rate factor: linear warm-up ``(s + 1) / warmup`` to 1, then ``0.1`` from step
    ``int(decay_at * steps)`` on (DETR's ``StepLR`` ``lr_drop``). A callable object, so
    ``LambdaLR.state_dict`` saves it."""

    def __init__(self, warmup: int, steps: int, decay_at: float = 0.8) -> None:
        self.warmup, self.drop = warmup, int(decay_at * steps)

    def __call__(self, step: int) -> float:
        return min(1.0, (step + 1) / self.warmup) * (0.1 if step >= self.drop else 1.0)


class ResumableSampler(Sampler[int]):
    """A :class:`DistributedSampler` whose epoch can be entered part-way (for ``--resume``)."""

    def __init__(self, sampler: DistributedSampler) -> None:
        self.sampler, self.skip = sampler, 0

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        self.sampler.set_epoch(epoch)
        self.skip = skip

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(iter(self.sampler), self.skip, None)

    def __len__(self) -> int:
        return len(self.sampler) - self.skip


def resident_memory_mb() -> float:
    """Current resident set size of this process in MiB (``/proc/self/statm``; peak RSS elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:  # pragma: no cover - non-Linux
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def build_model(task: DetrTask, arm: str, args: argparse.Namespace) -> DetrModel:
    """The task's backbone in a :class:`DetrModel` with the arm's position embedding, seeded with
    ``args.seed`` (the same initial weights in every arm and every process)."""
    torch.manual_seed(args.seed)
    backbone = task.build_backbone(args)
    model = DetrModel(
        backbone, make_position_embedding(arm, args.hidden, task.box_ops.num_axes), len(task.classes),
        args.hidden, args.queries, args.enc_layers, args.dec_layers, args.heads, args.ffn, args.dropout,
        normalize_before=args.pre_norm, reference_points=args.reference_points,
    )
    if args.norm == "frozen":
        freeze_batch_norm(model.joiner.backbone, task.box_ops.num_axes)
    elif args.norm == "sync":
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return model


@torch.no_grad()
def evaluate(
    model: nn.Module, batches: list[tuple], criterion: SetCriterion, task: DetrTask, ctx: DistContext,
) -> dict[str, float]:
    """Held-out metrics: the task's metric over every process's share, and the mean IoU of the
    Hungarian-matched boxes (over every ground-truth box).

    Args:
        batches (list): ``(NestedTensor, targets)`` or ``(NestedTensor, targets, n_scored)``: only
            the first ``n_scored`` items of a batch are scored (the others are partners that pad
            them; :func:`vispos.app.train.heldout.held_out_compositions`).

    Returns:
        dict: ``mean_iou`` and ``task.metric_names``, the same in every process. The model runs in
        eval mode and is left in the mode it came in.
    """
    net = model.module if hasattr(model, "module") else model
    was_training = net.training
    net.eval()
    ops = task.box_ops
    records = []
    for nested, targets, *scored in batches:
        n_scored = scored[0] if scored else len(targets)
        sizes = torch.tensor(nested.image_sizes, dtype=torch.float32)
        out = net(nested.to(ctx.device))
        logits, boxes = out["pred_logits"][:n_scored].float().cpu(), out["pred_boxes"][:n_scored].float().cpu()
        targets = targets[:n_scored]
        matches = criterion.match(logits, boxes, targets)
        scores, labels = logits.softmax(-1)[..., :-1].max(-1)  # DETR's PostProcess
        for b, (rows, cols) in enumerate(matches):
            scale = ops.size_scale(sizes[b])
            pred = ops.to_corners(boxes[b]) * scale
            gt = ops.to_corners(targets[b]["boxes"].float()) * scale
            records.append((
                {"boxes": pred, "scores": scores[b], "labels": labels[b]},
                {"boxes": gt, "labels": targets[b]["labels"]},
                matched_ious(pred[rows], gt[cols], ops.iou),
            ))
    net.train(was_training)
    gathered = [r for part in ctx.all_gather_object(records) for r in part]
    preds, gts, ious = zip(*gathered) if gathered else ((), (), ())
    result = {"mean_iou": float(torch.cat(ious).mean()) if ious else 0.0}
    result.update(task.metric(list(preds), list(gts)))
    return result


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def resume_conflict(state: dict[str, Any], arm: str, args: argparse.Namespace, world_size: int) -> str | None:
    """Why ``state`` (a checkpoint) cannot be resumed by a run of ``arm`` with ``args`` on
    ``world_size`` processes, in one line; None when it can.

    A resumed run keeps every setting of the checkpoint except those in :data:`RESUME_FREE`. Of
    these, ``--steps`` may grow (or shrink, not below the checkpoint's step): the learning-rate
    schedule keeps the checkpoint's warm-up and decay step (``LambdaLR.load_state_dict``
    restores them, as DETR's absolute ``lr_drop``), and the data keeps the checkpoint's
    ``--train-images`` (the CLI takes it from the checkpoint where the flag is not given, so that a
    count derived from the first run's ``--steps`` stays that run's).
    """
    saved = state["args"]
    if state["arm"] != arm:
        return f"the checkpoint is of arm {state['arm']!r}, this run trains {arm!r}"
    if args.steps < state["step"]:
        return f"the checkpoint is at step {state['step']}; --steps must be >= {state['step']}, got {args.steps}"
    missing = object()
    diff = {k: (saved.get(k, missing), v) for k, v in vars(args).items()
            if k not in RESUME_FREE and k != "pos" and saved.get(k, missing) != v}
    if diff:
        def show(v: Any) -> str:
            return "not recorded" if v is missing else repr(v)

        detail = ", ".join(f"{_flag(k)} (checkpoint {show(a)}, given {show(b)})" for k, (a, b) in sorted(diff.items()))
        free = ", ".join(_flag(k) for k in sorted(RESUME_FREE - {"resume", "report"}))
        return (f"the settings differ from the checkpoint's: {detail}; a resumed run keeps every setting of its "
                f"checkpoint except {free} (give the first run's values, or leave --resume out to start afresh)")
    if state["world_size"] != world_size:
        return (f"the checkpoint was written by {state['world_size']} processes, this run has {world_size} "
                f"(the data order per process would differ)")
    return None


def _new_metrics(task: DetrTask, arm: str, args: argparse.Namespace, ctx: DistContext) -> dict[str, Any]:
    return {
        "task": task.name, "arm": arm, "seed": args.seed,
        "args": {k: v for k, v in vars(args).items() if k != "pos"},
        "world_size": ctx.world_size, "global_batch": args.batch_size * ctx.world_size,
        "torch": str(torch.__version__), "threads": torch.get_num_threads(), "machine": platform.machine(),
        "commit": os.environ.get("VISPOS_COMMIT", ""),
        "steps": [], **{k: [] for k in SERIES}, "eval": [], "resumed_at": [],
        "eval_compositions": composition_keys(args), "eval_by_composition": {k: [] for k in composition_keys(args)},
    }


def write_json(path: str, obj: Any) -> None:
    """``obj`` as JSON at ``path``, all or nothing (missing folders created)."""
    import json

    def writer(tmp: str) -> None:
        with open(tmp, "w") as f:
            json.dump(obj, f)

    write_files([(path, writer)], make_dirs=True)


def train_arm(
    task: DetrTask, arm: str, args: argparse.Namespace, ctx: DistContext, out_dir: str,
    log: Callable[[str], Any] = print, on_step: Callable[[int, nn.Module], Any] | None = None,
) -> dict[str, Any]:
    """Trains one arm; rank 0 writes ``out_dir/metrics.json`` (and ``out_dir/checkpoint.pt`` every
    ``args.save_every`` steps). Returns the metrics dict (in every process).

    ``on_step(step, model)`` runs after each optimiser step (tests use it to look at parameters,
    or to interrupt a run).

    Raises:
        ValueError: ``args.resume`` is not a checkpoint of this arm and these settings.
    """
    device = ctx.device
    # NumPy's and Python's global generators, as DETR's main.py seeds them (seed + rank): the data
    # and the model draw from their own, but a checkpoint's RNG states are then reproducible too
    random.seed(args.seed + ctx.rank)
    np.random.seed(args.seed + ctx.rank)
    train_set, held_set = task.build_datasets(args)
    model = build_model(task, arm, args).to(device)
    ddp = ctx.distributed
    if ddp:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
    criterion = SetCriterion(
        len(task.classes), task.box_ops, args.class_weight, args.l1_weight, args.giou_weight, args.eos_coef,
        all_reduce=ctx.all_reduce_sum, world_size=ctx.world_size,
    )
    optim = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(optim, WarmupStepDecay(args.warmup, args.steps))
    metrics = _new_metrics(task, arm, args, ctx)
    step = 0
    if args.resume:
        state = load_checkpoint(args.resume)
        conflict = resume_conflict(state, arm, args, ctx.world_size)
        if conflict:
            raise ValueError(f"--resume: {conflict}")
        (model.module if ddp else model).load_state_dict(state["model"])
        optim.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        metrics, step = state["metrics"], state["step"]
        metrics["args"] = _new_metrics(task, arm, args, ctx)["args"]  # this run's (its --steps, --resume)
        resumed_sampler = state["sampler"]
        metrics["resumed_at"].append(step)
        if ctx.is_main:
            log(f"[{arm}] resumed from {args.resume} at step {step}")

    sampler = ResumableSampler(DistributedSampler(
        train_set, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True, seed=args.seed, drop_last=True,
    ))
    collate = vispos.PaddedCollate(size_divisibility=args.size_divisibility)
    loader = DataLoader(
        train_set, batch_size=args.batch_size, sampler=sampler, collate_fn=collate, drop_last=True,
        num_workers=args.workers, pin_memory=device.type == "cuda", persistent_workers=args.workers > 0,
        generator=(loader_seed := torch.Generator()),
    )
    per_epoch = len(sampler.sampler) // args.batch_size
    if args.resume and resumed_sampler != sampler_state(step, per_epoch, args):
        raise ValueError(f"--resume: the checkpoint's data position {resumed_sampler} does not follow from its "
                         f"step {step} with this data ({sampler_state(step, per_epoch, args)})")
    compositions = held_out_compositions(held_set, args, ctx)
    headline = next(iter(compositions))
    full_at = full_evaluation_steps(args.steps, args.eval_every)
    metrics["eval_compositions"] = list(compositions)
    by_composition = metrics.setdefault("eval_by_composition", {})
    ckpt_path = os.path.join(out_dir, "checkpoint.pt")
    if args.resume:  # last: building the data above draws nothing from the global generators
        set_rng_state(state["rng"][ctx.rank])
    model.train()
    for step, t_prev, (nested, targets) in resumable_batches(loader, sampler, loader_seed, step, per_epoch, args):
        nested = nested.to(device, non_blocking=True)
        losses = criterion(model(nested), targets)
        optim.zero_grad(set_to_none=True)
        losses["loss"].backward()
        if args.clip > 0:
            nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        optim.step()
        lr = optim.param_groups[0]["lr"]
        sched.step()
        logged = torch.stack([losses[k].detach().float() for k in SERIES[:5]]
                             + [nested.mask.float().mean()]).cpu()
        logged = ctx.all_reduce_mean(logged).tolist()
        now = time.perf_counter()
        metrics["steps"].append(step)
        for k, v in zip((*SERIES[:5], "padded_fraction"), logged):
            metrics[k].append(round(v, 6))
        metrics["lr"].append(lr)
        metrics["seconds"].append(round(now - t_prev, 5))
        metrics["rss_mb"].append(round(resident_memory_mb(), 2))
        if on_step is not None:
            on_step(step, model)
        if step % args.eval_every == 0 or step == args.steps:
            ev = evaluate(model, compositions[headline], criterion, task, ctx)
            metrics["eval"].append({"step": step, **{k: round(v, 5) for k, v in ev.items()}})
            if step in full_at:  # the evaluations the report averages: every composition
                for key, batches in compositions.items():
                    e = ev if key == headline else evaluate(model, batches, criterion, task, ctx)
                    by_composition.setdefault(key, []).append({"step": step, **{k: round(v, 5) for k, v in e.items()}})
            if ctx.is_main:
                k = min(args.eval_every, len(metrics["loss"]))
                shown = " ".join(f"{n} {ev[n]:.3f}" for n in task.metric_names)
                log(
                    f"[{arm}] step {step}/{args.steps} loss {np.mean(metrics['loss_last'][-k:]):.3f} "
                    f"held-out mean IoU {ev['mean_iou']:.3f} {shown} "
                    f"{np.median(metrics['seconds'][-k:]):.3f} s/step rss {metrics['rss_mb'][-1]:.0f} MiB"
                )
                if step in full_at and len(compositions) > 1:
                    h = task.headline
                    log(f"[{arm}] step {step} held-out {h} by composition: " + ", ".join(
                        f"{key} {by_composition[key][-1][h]:.3f}" for key in compositions))
        if args.save_every and (step % args.save_every == 0 or step == args.steps):
            _save(ckpt_path, step, arm, model, optim, sched, metrics, args, ctx, sampler_state(step, per_epoch, args))
    if ctx.is_main:
        write_json(os.path.join(out_dir, "metrics.json"), metrics)
    ctx.barrier()
    return metrics


def sampler_state(step: int, per_epoch: int, args: argparse.Namespace) -> dict[str, int]:
    """Where the data order stands after ``step`` steps: the sampler's epoch (its ``set_epoch``), the
    samples of that epoch already taken by each process, and the shuffle seed."""
    epoch, done = divmod(step, per_epoch)
    return {"epoch": epoch, "skip": done * args.batch_size, "seed": args.seed}


def resumable_batches(loader: DataLoader, sampler: ResumableSampler, loader_seed: torch.Generator, step: int,
                      per_epoch: int, args: argparse.Namespace) -> Iterator[tuple[int, float, Any]]:
    """The training batches after step ``step`` up to ``args.steps``, epoch after epoch, as
    ``(step, t_prev, batch)`` (``step`` counting from 1 after the one given).

    Each epoch enters the data order where ``step`` stands (:func:`sampler_state`: part-way on
    ``--resume``) and seeds the loader's generator (the workers' base seed) from (``args.seed``,
    epoch), not from torch's global RNG, so that entering an epoch part-way draws nothing the
    uninterrupted run did not. ``t_prev`` is when the wait for the batch began: the epoch's start,
    or when the caller asked for the next batch, so ``now - t_prev`` is the step's time with its
    data loading and without the evaluation and saving the caller did after the previous step.

    Args:
        loader (DataLoader): batches of ``args.batch_size`` drawn through ``sampler``, with
            ``loader_seed`` as its ``generator``.
        sampler (ResumableSampler): the loader's sampler.
        loader_seed (torch.Generator): the loader's generator.
        step (int): the steps already taken.
        per_epoch (int): steps per epoch.
        args (argparse.Namespace): ``steps``, ``batch_size`` and ``seed``.
    """
    while step < args.steps:
        at = sampler_state(step, per_epoch, args)
        sampler.set_epoch(at["epoch"], skip=at["skip"])
        loader_seed.manual_seed(args.seed * 1_000_003 + at["epoch"])
        t_prev = time.perf_counter()
        for batch in loader:
            step += 1
            yield step, t_prev, batch
            if step >= args.steps:
                return
            t_prev = time.perf_counter()


def _save(path: str, step: int, arm: str, model: nn.Module, optim: torch.optim.Optimizer,
          sched: Any, metrics: dict[str, Any], args: argparse.Namespace, ctx: DistContext,
          sampler: dict[str, int]) -> None:
    rngs = ctx.all_gather_object(rng_state())
    if ctx.is_main:
        net = model.module if hasattr(model, "module") else model
        save_checkpoint(path, {
            "step": step, "arm": arm, "model": net.state_dict(), "optimizer": optim.state_dict(),
            "scheduler": sched.state_dict(), "rng": rngs, "sampler": sampler, "metrics": metrics,
            "args": {k: v for k, v in vars(args).items() if k != "pos"}, "world_size": ctx.world_size,
        })
    ctx.barrier()

