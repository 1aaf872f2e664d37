"""Held-out evaluation of 3D segmentation: Dice and HD95 per batch composition, per-volume
equality across compositions, inference time and peak memory; and the report over seeds.

Compositions (keys as :mod:`vispos.app.train.heldout`'s): ``batch1`` (each volume alone),
``batch4`` (consecutive groups of 4 held-out volumes, padded), ``beside_largest`` (each volume in
a padded batch of two beside the held-out volume with the most voxels; the largest beside the
second largest). The crop pipeline infers one volume at a time by MONAI's
``sliding_window_inference``, so only ``batch1`` exists for it.

Every metric is computed on each volume's own voxels only: the logits are cropped to the
volume's valid box before the argmax (MONAI's ``DiceMetric`` and ``HausdorffDistanceMetric``
(95th percentile, in mm with the volume's own spacing), foreground only).

Peak inference memory: on CUDA ``torch.cuda.max_memory_allocated`` above the memory allocated
before the pass; on the CPU the resident set size (``/proc/self/statm``) sampled every 2 ms by a
thread during the pass, above the RSS just before it (after ``malloc_trim``), in MiB. RSS counts
what the allocator keeps, so it is a peak of the process's footprint, not of live tensors.

References:
    MONAI ``DiceMetric``, ``HausdorffDistanceMetric``, ``sliding_window_inference``.
"""

from __future__ import annotations

import ctypes
import glob
import json
import math
import os
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

import vispos

from .engine import resident_memory_mb
from .heldout import BESIDE_LARGEST

__all__ = ["composition_batches", "infer", "volume_metrics", "evaluate_all", "PeakMemory", "report_table"]

ALONE = "batch1"


def composition_batches(sizes: Sequence[Sequence[int]], keys: Sequence[str]) -> dict[str, list[tuple[list[int], int]]]:
    """``{key: [(volume indices, number scored)]}``: the first ``number scored`` of each batch
    are scored, the others only pad them."""
    n = len(sizes)
    voxels = [math.prod(s) for s in sizes]
    order = sorted(range(n), key=lambda i: -voxels[i])
    out: dict[str, list[tuple[list[int], int]]] = {}
    for key in keys:
        if key == BESIDE_LARGEST:
            out[key] = [([i, order[0] if i != order[0] else order[min(1, n - 1)]], 1) for i in range(n)]
        else:
            b = int(key.removeprefix("batch"))
            out[key] = [(list(range(s, min(s + b, n))), min(b, n - s)) for s in range(0, n, b)]
    return out


def infer(
    forward: Callable[[vispos.NestedTensor], Tensor], images: Sequence[Tensor], batches: Sequence[tuple[list[int], int]],
    device: torch.device,
) -> tuple[dict[int, Tensor], float]:
    """Each scored volume's logits on its own voxels, and the seconds per scored volume.

    Args:
        forward: padded batch -> ``Tensor[B, K, *S_max]`` logits.
        images (sequence of Tensor[1, *S_i]): the held-out volumes.
        batches: from :func:`composition_batches`.

    Returns:
        ``({volume index: Tensor[K, *S_i] float32 on the CPU}, seconds per scored volume)``.
    """
    collate = vispos.PaddedCollate()
    logits: dict[int, Tensor] = {}
    seconds = 0.0
    with torch.no_grad():
        for idx, scored in batches:
            nested, _ = collate([(images[i], None) for i in idx])
            nested = nested.to(device)
            t0 = time.perf_counter()
            out = forward(nested)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seconds += time.perf_counter() - t0
            for b, i in enumerate(idx[:scored]):
                size = images[i].shape[1:]
                logits[i] = out[b, :, :size[0], :size[1], :size[2]].float().cpu()
    return logits, seconds / max(1, len(logits))


def volume_metrics(logits: Tensor, label: Tensor, spacing: Sequence[float]) -> tuple[float, float]:
    """``(Dice, HD95 in mm)`` of the argmax of ``logits`` (Tensor[K, *S]) against ``label``
    (Tensor[*S] int64), foreground only; HD95 is NaN where prediction or truth is empty."""
    from monai.metrics import DiceMetric, HausdorffDistanceMetric
    from monai.networks.utils import one_hot

    k = logits.shape[0]
    pred = one_hot(logits.argmax(0)[None, None], k)
    gt = one_hot(label[None, None], k)
    dice = DiceMetric(include_background=False, reduction="mean", ignore_empty=False)(pred, gt)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # MONAI warns on an empty prediction or truth (NaN)
        hd = HausdorffDistanceMetric(include_background=False, percentile=95, reduction="mean")(
            pred, gt, spacing=[float(s) for s in spacing])
    return float(dice.mean()), float(hd.mean())


class PeakMemory:
    """Context manager: ``.mb`` is the peak memory of the body above the memory before it (see
    the module docstring for what is measured on CPU and CUDA)."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.mb = device, 0.0

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
            return self
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except OSError:  # pragma: no cover - not glibc
            pass
        self.base, self.peak, self.stop = resident_memory_mb(), 0.0, threading.Event()

        def sample() -> None:
            while not self.stop.is_set():
                self.peak = max(self.peak, resident_memory_mb())
                self.stop.wait(0.002)

        self.thread = threading.Thread(target=sample, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.mb = (torch.cuda.max_memory_allocated(self.device) - self.base) / 2**20
            return
        self.stop.set()
        self.thread.join()
        self.peak = max(self.peak, resident_memory_mb())
        self.mb = max(0.0, self.peak - self.base)


def evaluate_all(
    forward: Callable[[vispos.NestedTensor], Tensor], held: Sequence[tuple[Tensor, Mapping[str, Any]]],
    keys: Sequence[str], device: torch.device, step: int,
) -> dict[str, Any]:
    """Every composition of ``keys``: Dice and HD95 (means over the held-out volumes; HD95 over
    those where it is finite, with their count), seconds per volume, peak memory, and each
    volume's max abs logit difference from ``batch1`` over the other compositions.

    Returns:
        dict: ``{"by_composition": {key: {"step", "dice", "hd95", "hd95_volumes", "seconds_per_volume",
        "peak_mb"}}, "dice_per_volume": {key: [float]}, "max_logit_diff_per_volume": [float] (empty with
        one composition), "max_logit_diff": float or None, "logits": {volume index: Tensor} (batch1)}``.
    """
    images = [img for img, _ in held]
    batches = composition_batches([img.shape[1:] for img in images], keys)
    result: dict[str, Any] = {"by_composition": {}, "dice_per_volume": {}}
    per_key: dict[str, dict[int, Tensor]] = {}
    for key in keys:
        with PeakMemory(device) as mem:
            logits, sec = infer(forward, images, batches[key], device)
        per_key[key] = logits
        scores = [volume_metrics(logits[i], t["label"], t["spacing"].tolist()) for i, (_, t) in enumerate(held)]
        hds = [h for _, h in scores if math.isfinite(h)]
        result["by_composition"][key] = {
            "step": step, "dice": round(float(np.mean([d for d, _ in scores])), 5),
            "hd95": round(float(np.mean(hds)), 4) if hds else None, "hd95_volumes": len(hds),
            "seconds_per_volume": round(sec, 5), "peak_mb": round(mem.mb, 2),
        }
        result["dice_per_volume"][key] = [round(d, 5) for d, _ in scores]
    base = per_key[keys[0]]
    diffs = [max((float((per_key[k][i] - base[i]).abs().max()) for k in keys[1:]), default=0.0)
             for i in range(len(images))]
    result["max_logit_diff_per_volume"] = diffs if len(keys) > 1 else []
    result["max_logit_diff"] = max(diffs) if len(keys) > 1 else None
    result["logits"] = base
    return result


# ------------------------------------------------------------------------------------ report
def _runs(out: str) -> dict[tuple[str, str], dict[int, dict[str, Any]]]:
    found = sorted(glob.glob(os.path.join(glob.escape(out), "*", "*", "seed*", "metrics.json")))
    runs: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
    for path in found:
        with open(path) as f:
            m = json.load(f)
        if m.get("task") != "segment3d":
            continue
        folder = os.path.basename(os.path.dirname(os.path.dirname(os.path.dirname(path))))
        runs.setdefault((folder, m["arm"]), {})[int(m["seed"])] = m
    if not runs:
        raise FileNotFoundError(f"no segmentation run under {out!r} (expected {out}/<pipeline>/<network>/seed<S>/"
                                "metrics.json)")
    return runs


def _ms(values: Sequence[float], fmt: str = ".3f") -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    if len(values) == 1:
        return format(values[0], fmt)
    return f"{format(float(np.mean(values)), fmt)} ± {format(float(np.std(values, ddof=1)), fmt)}"


def report_table(out: str) -> str:
    """The markdown tables over every run under ``out`` (``<pipeline>/<network>/seed<S>``): per
    pipeline and network, mean ± std over seeds of the final held-out Dice and HD95 (mm) in each
    composition, the largest per-volume logit difference across compositions, the median seconds
    per training step, inference seconds per volume and peak inference memory (alone and in
    batches of 4).

    Raises:
        FileNotFoundError: no run under ``out``.
    """
    runs = _runs(out)
    keys = [ALONE, "batch4", BESIDE_LARGEST]
    lines = ["| pipeline | network | seeds | " + " | ".join(f"Dice {k}" for k in keys) + " | "
             + " | ".join(f"HD95 mm {k}" for k in keys) + " | max logit diff | s/step | s/volume alone | "
             "s/volume batch4 | peak MiB alone | peak MiB batch4 |",
             "|---|---|---|" + "---:|" * (2 * len(keys) + 6)]
    for (folder, arm), by_seed in sorted(runs.items()):
        ms = list(by_seed.values())

        def final(key: str, name: str) -> list[float]:
            return [m["eval_by_composition"][key][-1][name] for m in ms if m["eval_by_composition"].get(key)]

        diff = [m["max_logit_diff"] for m in ms if m.get("max_logit_diff") is not None]
        cells = [_ms(final(k, "dice")) for k in keys] + [_ms(final(k, "hd95"), ".2f") for k in keys]
        cells += [f"{max(diff):.2e}" if diff else "-",
                  _ms([float(np.median(m["seconds"][1:] or m["seconds"])) for m in ms]),
                  _ms(final(ALONE, "seconds_per_volume")), _ms(final("batch4", "seconds_per_volume")),
                  _ms(final(ALONE, "peak_mb"), ".0f"), _ms(final("batch4", "peak_mb"), ".0f")]
        lines.append(f"| {folder} | {arm} | {','.join(str(s) for s in sorted(by_seed))} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
