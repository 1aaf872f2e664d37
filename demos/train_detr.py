"""A small DETR trained on padded batches of real photographs, and the position-embedding ablation.

Data: solid shapes drawn by ``skimage.draw.random_shapes`` (three classes: rectangle, circle,
triangle; boxes exact, read from the drawn pixels) pasted onto real photographs shipped with
scikit-image and matplotlib, each photograph at its natural aspect ratio. Training images go
through torchvision ``transforms.v2`` with ``tv_tensors.BoundingBoxes`` (horizontal flip, a
multi-scale resize of the longer side), so every batch holds images of different sizes and is
padded by :class:`vispos.PaddedCollate`. Held-out images use other photographs.

Model: a timm backbone (``pretrained=False``) -> :class:`vispos.backbones.Joiner` (1x1 input
projection, position embedding) -> :class:`vispos.backbones.DetrEncoder` -> ``nn.TransformerDecoder``
with learned object queries -> class and box heads. Training: Hungarian matching
(``scipy.optimize.linear_sum_assignment``) and DETR's losses (cross-entropy with a no-object
weight, L1 and generalized IoU from ``torchvision.ops``).

Position embeddings (``--pos``, one run per arm, same seed, data and steps):

* ``none``: no position embedding (zeros);
* ``grid``: ``vispos.PositionalEncodingPermute2D`` on the padded feature map, blind to the mask
  (positional-encodings' behaviour: integer cell positions over the padded canvas);
* ``sine``: ``vispos.PositionEmbeddingSine(normalize=True)`` on the mask (DETR: positions
  normalised by each image's own valid extent).

Writes ``OUT/<arm>/metrics.json`` (per-step losses, seconds and resident memory; held-out mean
IoU of matched boxes and AP50 every ``--eval-every`` steps), ``OUT/curves.png`` and
``OUT/ablation.md``.

    python -m demos.train_detr --steps 3000 --out runs/detr --pos sine grid none --threads 1
    # or one process per arm (same flags), then the table and curves from their metrics.json:
    python -m demos.train_detr --out runs/detr --pos sine grid none --report
    python -m demos.train_detr --steps 20 --out /tmp/detr-tiny --tiny    # seconds, for CI

Defaults (chosen on the sine arm with short runs, see docs/training.md): timm ``test_resnet`` at
stride 8 (``--out-index 2``), photographs with longer side 96-128 px, shapes of 20-56 px,
10 object queries for at most 2 objects, AdamW at 1e-3 with 100 warm-up steps and a tenfold
decay for the last 20 % of the steps, class weight 2 in the loss and the matching cost.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision import tv_tensors
from torchvision.ops import box_convert, box_iou, generalized_box_iou
from torchvision.transforms import v2

import vispos
from vispos.backbones import DetrEncoder, Joiner, TimmBackbone
from vispos.data import IMAGENET_MEAN, IMAGENET_STD, load_image, sample_images

CLASSES = ("rectangle", "circle", "triangle")
#: scikit-image sample photographs used as training backgrounds (all shipped, no download)
TRAIN_PHOTOS = (
    "astronaut", "coffee", "chelsea", "rocket", "camera", "moon", "page", "immunohistochemistry",
    "hubble_deep_field", "retina", "grass", "gravel", "brick", "colorwheel",
)
#: held-out backgrounds: other scikit-image photographs and matplotlib's grace_hopper.jpg
HELDOUT_PHOTOS = ("text", "clock", "coins", "grace_hopper")
POS_ARMS = ("none", "grid", "sine")


# ----------------------------------------------------------------------------------------- data
def load_photos(names: Sequence[str], max_size: int) -> list[Tensor]:
    """Real photographs as ``Tensor[3, H, W]`` float32 in [0, 1], longer side ``max_size``
    (read once per process; callers get their own copies)."""
    return [t.clone() for t in _load_photos(tuple(names), max_size)]


@functools.lru_cache(maxsize=4)
def _load_photos(names: tuple[str, ...], max_size: int) -> tuple[Tensor, ...]:
    out = []
    for name in names:
        if name == "grace_hopper":
            import matplotlib

            path = os.path.join(matplotlib.get_data_path(), "sample_data", "grace_hopper.jpg")
            out.append(load_image(path, max_size=max_size))
        else:
            out.append(sample_images([name], max_size=max_size)[0][1])
    return tuple(out)


def draw_objects(
    photo: Tensor, rng: np.random.Generator, max_objects: int, min_size: int, max_size: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Pastes 1..max_objects non-overlapping shapes on a copy of ``photo``.

    Returns ``(image Tensor[3, H, W], boxes Tensor[N, 4] XYXY pixels (end exclusive), labels
    Tensor[N] int64)``. Each box is the exact extent of the shape's drawn pixels (equal to
    ``random_shapes``' own label clipped to the canvas).
    """
    from skimage.draw import random_shapes

    h, w = photo.shape[1:]
    image = photo.permute(1, 2, 0).numpy().copy()
    occupied = np.zeros((h, w), dtype=bool)
    boxes, labels = [], []
    for _ in range(int(rng.integers(1, max_objects + 1))):
        for _trial in range(20):
            cls = int(rng.integers(len(CLASSES)))
            drawn, _ = random_shapes(
                (h, w), max_shapes=1, shape=CLASSES[cls], min_size=min_size, max_size=max_size,
                intensity_range=((0, 254),), rng=int(rng.integers(2**31)),
            )
            pixels = (drawn != 255).any(-1)
            rows, cols = np.nonzero(pixels.any(1))[0], np.nonzero(pixels.any(0))[0]
            if rows.size < min_size // 2 or cols.size < min_size // 2 or (pixels & occupied).any():
                continue
            y0, y1, x0, x1 = rows[0], rows[-1] + 1, cols[0], cols[-1] + 1
            occupied[max(0, y0 - 2):y1 + 2, max(0, x0 - 2):x1 + 2] = True  # keep objects apart
            image[pixels] = drawn[pixels] / 255.0
            boxes.append([x0, y0, x1, y1])
            labels.append(cls)
            break
    image_t = torch.from_numpy(image).permute(2, 0, 1).contiguous()
    return image_t, torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4), torch.tensor(labels, dtype=torch.int64)


class ShapesOnPhotos(torch.utils.data.Dataset):
    """Shapes with exact boxes on real photographs; item ``i`` is the same in every process.

    Args:
        photos (list of Tensor[3, H, W]): backgrounds, float in [0, 1].
        length (int): number of items.
        seed (int): data seed; item ``i`` depends only on ``(seed, i)``.
        scales (sequence of int): longer sides for the multi-scale resize.
        train (bool): random flip and random scale (else: scale ``scales[i % len]``, no flip).
        max_objects, min_size, max_size (int): objects per image and their size in pixels at
            the photo's base size.

    Returns (per item):
        ``(Tensor[3, H, W] normalised, {"labels": Tensor[N] int64, "boxes": Tensor[N, 4] cxcywh
        normalised by the image's own (W, H, W, H)})``.
    """

    def __init__(
        self, photos: Sequence[Tensor], length: int, seed: int, scales: Sequence[int], train: bool,
        max_objects: int = 3, min_size: int = 12, max_size: int = 48,
    ) -> None:
        self.photos, self.length, self.seed = list(photos), length, seed
        self.scales, self.train = tuple(scales), train
        self.max_objects, self.min_size, self.max_size = max_objects, min_size, max_size
        self.normalize = v2.Compose([v2.ToDtype(torch.float32), v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
        resizes = [v2.Resize(size=None, max_size=s, antialias=True) for s in self.scales]
        self.augment = v2.Compose([v2.RandomHorizontalFlip(0.5), v2.RandomChoice(resizes)])
        self.fixed = resizes

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[Tensor, dict[str, Tensor]]:
        rng = np.random.default_rng([self.seed, index])
        photo = self.photos[int(rng.integers(len(self.photos)))]
        image, boxes, labels = draw_objects(photo, rng, self.max_objects, self.min_size, self.max_size)
        image = tv_tensors.Image(image)
        boxes = tv_tensors.BoundingBoxes(boxes, format="XYXY", canvas_size=tuple(image.shape[1:]))
        if self.train:
            with torch.random.fork_rng(devices=[]):  # transforms.v2 draws from torch's global RNG
                torch.manual_seed(int(rng.integers(2**31)))
                image, boxes = self.augment(image, boxes)
        else:
            image, boxes = self.fixed[index % len(self.fixed)](image, boxes)
        h, w = image.shape[1:]
        cxcywh = box_convert(boxes.as_subclass(Tensor), "xyxy", "cxcywh") / torch.tensor([w, h, w, h])
        return self.normalize(image).as_subclass(Tensor), {"labels": labels, "boxes": cxcywh.float()}


# ---------------------------------------------------------------------------------------- model
class ZeroPosition(nn.Module):
    """Arm (a): no position embedding (zeros of the level's shape)."""

    def __init__(self, num_pos_feats: int) -> None:
        super().__init__()
        self.num_pos_feats = num_pos_feats

    def forward(self, x: vispos.NestedTensor, dtype: torch.dtype | None = None) -> Tensor:
        t = x.tensors
        return t.new_zeros((t.shape[0], 2 * self.num_pos_feats, *t.shape[2:]), dtype=dtype or t.dtype)


class MaskBlindGrid(nn.Module):
    """Arm (b): positional-encodings' 2D grid on the padded feature map, the mask ignored."""

    def __init__(self, num_pos_feats: int) -> None:
        super().__init__()
        self.num_pos_feats = num_pos_feats
        self.grid = vispos.PositionalEncodingPermute2D(2 * num_pos_feats)

    def forward(self, x: vispos.NestedTensor, dtype: torch.dtype | None = None) -> Tensor:
        pos = self.grid(x.tensors)
        return pos if dtype is None else pos.to(dtype)


def make_position_embedding(arm: str, num_pos_feats: int) -> nn.Module:
    if arm == "none":
        return ZeroPosition(num_pos_feats)
    if arm == "grid":
        return MaskBlindGrid(num_pos_feats)
    if arm == "sine":
        return vispos.PositionEmbeddingSine(num_pos_feats, normalize=True)
    raise ValueError(f"pos must be one of {POS_ARMS}, got {arm!r}")


class SmallDetr(nn.Module):
    """timm backbone -> Joiner -> DetrEncoder -> nn.TransformerDecoder -> class / box heads.

    ``forward(NestedTensor)`` returns ``logits Tensor[B, Q, K + 1]`` (last class = no object) and
    ``boxes Tensor[B, Q, 4]`` (cxcywh in [0, 1], relative to each image's own size).
    """

    def __init__(
        self, pos: str, num_classes: int, backbone: str, out_index: int, hidden: int,
        num_queries: int, enc_layers: int, dec_layers: int, nhead: int, ffn: int,
    ) -> None:
        super().__init__()
        body = TimmBackbone(backbone, out_indices=(out_index,), pretrained=False)
        self.joiner = Joiner(
            body, make_position_embedding(pos, hidden // 2), hidden_dim=hidden, level_embed=False,
            num_groups=8,
        )
        self.encoder = DetrEncoder(hidden, nhead, enc_layers, ffn, dropout=0.0)
        layer = nn.TransformerDecoderLayer(hidden, nhead, ffn, dropout=0.0, batch_first=True)
        self.decoder = nn.TransformerDecoder(layer, dec_layers, norm=nn.LayerNorm(hidden))
        self.query = nn.Embedding(num_queries, hidden)
        self.class_head = nn.Linear(hidden, num_classes + 1)
        self.box_head = nn.Sequential(
            nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 4)
        )

    def forward(self, x: vispos.NestedTensor, aux: bool = False) -> Any:
        """``(logits, boxes)`` of the last decoder layer; with ``aux=True`` a list of them, one
        per decoder layer (DETR's auxiliary decoding losses), last layer last."""
        features, pos = self.joiner(x)
        flat = self.joiner.flatten(features, pos)
        memory = self.encoder(flat)
        # nn.TransformerDecoder has no separate key position: the embedding joins the memory
        memory = memory + flat.pos
        out = self.query.weight[None].expand(memory.shape[0], -1, -1)
        outputs = []
        for layer in self.decoder.layers:  # the stack of nn.TransformerDecoder, intermediates kept
            out = layer(out, memory, memory_key_padding_mask=flat.key_padding_mask)
            hs = self.decoder.norm(out)
            outputs.append((self.class_head(hs), self.box_head(hs).sigmoid()))
        return outputs if aux else outputs[-1]


# ------------------------------------------------------------------------------ matching, loss
W_CLASS, W_L1, W_GIOU, EOS_COEF = 1.0, 5.0, 2.0, 0.1


@torch.no_grad()
def hungarian_match(
    logits: Tensor, boxes: Tensor, targets: Sequence[dict[str, Tensor]], w_class: float = W_CLASS,
) -> list[tuple[Tensor, Tensor]]:
    """DETR's matcher: per image, (query indices, target indices) minimising class + L1 + GIoU cost."""
    from scipy.optimize import linear_sum_assignment

    prob = logits.softmax(-1)
    out = []
    for b, tgt in enumerate(targets):
        if tgt["labels"].numel() == 0:
            empty = torch.empty(0, dtype=torch.int64)
            out.append((empty, empty))
            continue
        cost = (
            -w_class * prob[b][:, tgt["labels"]]
            + W_L1 * torch.cdist(boxes[b], tgt["boxes"], p=1)
            - W_GIOU * generalized_box_iou(box_convert(boxes[b], "cxcywh", "xyxy"), box_convert(tgt["boxes"], "cxcywh", "xyxy"))
        )
        rows, cols = linear_sum_assignment(cost.cpu().numpy())
        out.append((torch.as_tensor(rows, dtype=torch.int64), torch.as_tensor(cols, dtype=torch.int64)))
    return out


def detr_loss(
    logits: Tensor, boxes: Tensor, targets: Sequence[dict[str, Tensor]], w_class: float = W_CLASS,
    eos_coef: float = EOS_COEF,
) -> dict[str, Tensor]:
    """DETR's set loss: CE (weight ``w_class``, no-object weight ``eos_coef``) + L1 + GIoU over matched pairs."""
    num_classes = logits.shape[-1] - 1
    matches = hungarian_match(logits, boxes, targets, w_class)
    target_classes = torch.full(logits.shape[:2], num_classes, dtype=torch.int64, device=logits.device)
    src_boxes, tgt_boxes = [], []
    for b, (rows, cols) in enumerate(matches):
        target_classes[b, rows] = targets[b]["labels"][cols].to(logits.device)
        src_boxes.append(boxes[b, rows])
        tgt_boxes.append(targets[b]["boxes"][cols].to(boxes.device))
    weight = torch.ones(num_classes + 1, device=logits.device)
    weight[-1] = eos_coef
    loss_ce = F.cross_entropy(logits.transpose(1, 2), target_classes, weight)
    src, tgt = torch.cat(src_boxes), torch.cat(tgt_boxes)
    n = max(float(tgt.shape[0]), 1.0)
    loss_l1 = F.l1_loss(src, tgt, reduction="sum") / n
    giou = torch.diag(generalized_box_iou(box_convert(src, "cxcywh", "xyxy"), box_convert(tgt, "cxcywh", "xyxy")))
    loss_giou = (1 - giou).sum() / n
    total = w_class * loss_ce + W_L1 * loss_l1 + W_GIOU * loss_giou
    return {"loss": total, "loss_ce": loss_ce, "loss_l1": loss_l1, "loss_giou": loss_giou}


# ---------------------------------------------------------------------------------- evaluation
def average_precision(
    preds: Sequence[tuple[Tensor, Tensor, Tensor]], gts: Sequence[dict[str, Tensor]], num_classes: int,
    iou_threshold: float = 0.5,
) -> float:
    """Mean over classes of VOC all-point AP at ``iou_threshold`` (boxes xyxy, any common unit)."""
    aps = []
    for c in range(num_classes):
        n_gt = sum(int((g["labels"] == c).sum()) for g in gts)
        if n_gt == 0:
            continue
        records = []
        for i, (scores, labels, boxes) in enumerate(preds):
            keep = labels == c
            records += [(float(s), i, bx) for s, bx in zip(scores[keep], boxes[keep])]
        records.sort(key=lambda r: -r[0])
        used = [torch.zeros(int((g["labels"] == c).sum()), dtype=torch.bool) for g in gts]
        tp = np.zeros(len(records))
        for k, (_, i, bx) in enumerate(records):
            gt = gts[i]["boxes"][gts[i]["labels"] == c]
            if gt.numel() == 0:
                continue
            ious = box_iou(bx[None], gt)[0]
            j = int(ious.argmax())
            if float(ious[j]) >= iou_threshold and not used[i][j]:
                used[i][j] = True
                tp[k] = 1
        if not records:
            aps.append(0.0)
            continue
        ctp = np.cumsum(tp)
        recall = ctp / n_gt
        precision = ctp / np.arange(1, len(records) + 1)
        mrec = np.concatenate(([0.0], recall, [1.0]))
        mpre = np.concatenate(([0.0], precision, [0.0]))
        mpre = np.maximum.accumulate(mpre[::-1])[::-1]
        idx = np.nonzero(mrec[1:] != mrec[:-1])[0]
        aps.append(float(((mrec[idx + 1] - mrec[idx]) * mpre[idx + 1]).sum()))
    return float(np.mean(aps)) if aps else 0.0


@torch.no_grad()
def evaluate(model: SmallDetr, batches: Sequence[tuple[vispos.NestedTensor, tuple]], device: torch.device) -> dict[str, float]:
    """Held-out mean IoU of Hungarian-matched boxes (over every ground-truth box) and AP50."""
    model.eval()
    ious, preds, gts = [], [], []
    for nested, targets in batches:
        logits, boxes = model(nested.to(device))
        logits, boxes = logits.cpu(), boxes.cpu()
        for b, (rows, cols) in enumerate(hungarian_match(logits, boxes, targets)):
            tgt = box_convert(targets[b]["boxes"], "cxcywh", "xyxy")
            src = box_convert(boxes[b], "cxcywh", "xyxy")
            ious += torch.diag(box_iou(src[rows], tgt[cols])).tolist()
            scores, labels = logits[b].softmax(-1)[:, :-1].max(-1)
            preds.append((scores, labels, src))
            gts.append({"labels": targets[b]["labels"], "boxes": tgt})
    model.train()
    return {
        "mean_iou": float(np.mean(ious)) if ious else 0.0,
        "ap50": average_precision(preds, gts, model.class_head.out_features - 1),
    }


def resident_memory_mb() -> float:
    """Current resident set size of this process in MiB (``/proc/self/statm``; peak RSS elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:  # pragma: no cover - non-Linux
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ------------------------------------------------------------------------------------- training
def train_arm(arm: str, args: argparse.Namespace, out_dir: str, log: Any = print) -> dict[str, Any]:
    """Trains one arm and writes ``out_dir/metrics.json``; returns the metrics dict."""
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    train_photos = load_photos(TRAIN_PHOTOS[: args.photos], args.photo_size)
    held_photos = load_photos(HELDOUT_PHOTOS, args.photo_size)
    obj = dict(max_objects=args.max_objects, min_size=args.min_object, max_size=args.max_object)
    train_set = ShapesOnPhotos(train_photos, args.steps * args.batch_size, args.seed, args.scales, True, **obj)
    held_set = ShapesOnPhotos(held_photos, args.eval_images, args.seed + 1, args.scales, False, **obj)
    collate = vispos.PaddedCollate(size_divisibility=args.size_divisibility)
    loader = torch.utils.data.DataLoader(
        train_set, batch_size=args.batch_size, shuffle=False, collate_fn=collate,
        num_workers=args.workers, pin_memory=device.type == "cuda",
        persistent_workers=args.workers > 0,
    )
    held = list(torch.utils.data.DataLoader(held_set, batch_size=args.batch_size, collate_fn=collate))

    torch.manual_seed(args.seed)  # same initial weights in every arm (the embedding has none)
    model = SmallDetr(
        arm, len(CLASSES), args.backbone, args.out_index, args.hidden, args.queries,
        args.enc_layers, args.dec_layers, args.heads, args.ffn,
    ).to(device)
    optim = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(
        optim, lambda s: min(1.0, (s + 1) / args.warmup) * (0.1 if s >= int(0.8 * args.steps) else 1.0)
    )
    metrics: dict[str, Any] = {
        "arm": arm, "args": {k: v for k, v in vars(args).items() if k != "pos"},
        "torch": torch.__version__, "threads": torch.get_num_threads(), "machine": platform.machine(),
        "steps": [], "loss": [], "loss_ce": [], "loss_l1": [], "loss_giou": [], "seconds": [],
        "rss_mb": [], "padded_fraction": [], "eval": [],
    }
    t_prev = time.perf_counter()
    for step, (nested, targets) in enumerate(loader, start=1):
        nested = nested.to(device, non_blocking=True)
        per_layer = [
            detr_loss(lg, bx, targets, args.class_weight, args.eos_coef) for lg, bx in model(nested, aux=True)
        ]
        losses = dict(per_layer[-1])  # logged: the last layer's; optimised: the sum over layers
        losses["loss_total"] = sum(pl["loss"] for pl in per_layer)
        optim.zero_grad(set_to_none=True)
        losses["loss_total"].backward()
        nn.utils.clip_grad_norm_(model.parameters(), 0.1)
        optim.step()
        sched.step()
        now = time.perf_counter()
        metrics["steps"].append(step)
        for k in ("loss", "loss_ce", "loss_l1", "loss_giou"):
            metrics[k].append(round(float(losses[k].detach()), 5))
        metrics["seconds"].append(round(now - t_prev, 4))
        metrics["rss_mb"].append(round(resident_memory_mb(), 2))
        metrics["padded_fraction"].append(round(float(nested.mask.float().mean()), 4))
        if step % args.eval_every == 0 or step == args.steps:
            ev = evaluate(model, held, device)
            metrics["eval"].append({"step": step, **{k: round(v, 4) for k, v in ev.items()}})
            log(
                f"[{arm}] step {step}/{args.steps} loss {np.mean(metrics['loss'][-args.eval_every:]):.3f} "
                f"held-out mIoU {ev['mean_iou']:.3f} AP50 {ev['ap50']:.3f} "
                f"{np.mean(metrics['seconds'][-args.eval_every:]):.3f} s/step rss {metrics['rss_mb'][-1]:.0f} MiB"
            )
        t_prev = time.perf_counter()  # evaluation time is not part of the step time
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "metrics.json"), "w") as f:
        json.dump(metrics, f)
    return metrics


def summarize(metrics: dict[str, Any], warmup: int) -> dict[str, float]:
    """Final held-out numbers, mean seconds per step and resident memory after warm-up / at the end."""
    last = metrics["eval"][-1]
    rss = metrics["rss_mb"]
    w = min(warmup, len(rss) - 1)
    return {
        "mean_iou": last["mean_iou"], "ap50": last["ap50"],
        "best_ap50": max(e["ap50"] for e in metrics["eval"]),
        "final_loss": float(np.mean(metrics["loss"][-max(1, len(rss) // 10):])),
        "s_per_step": float(np.median(metrics["seconds"][1:] or metrics["seconds"])),
        "rss_warm_mb": rss[w], "rss_end_mb": rss[-1], "rss_growth_pct": 100 * (rss[-1] / rss[w] - 1),
    }


def plot_curves(all_metrics: dict[str, dict[str, Any]], path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(14, 3.2), dpi=80)
    for arm, m in all_metrics.items():
        loss = np.asarray(m["loss"])
        k = max(1, len(loss) // 50)
        smooth = np.convolve(loss, np.ones(k) / k, mode="valid")
        axes[0].plot(np.arange(len(smooth)) + k, smooth, label=arm)
        steps = [e["step"] for e in m["eval"]]
        axes[1].plot(steps, [e["mean_iou"] for e in m["eval"]], marker=".", label=arm)
        axes[2].plot(steps, [e["ap50"] for e in m["eval"]], marker=".", label=arm)
        axes[3].plot(m["steps"], m["rss_mb"], label=arm)
    titles = ("train loss (moving mean)", "held-out mean IoU (matched)", "held-out AP50", "resident memory (MiB)")
    for ax, title in zip(axes, titles):
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    axes[0].set_yscale("log")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--out", default="runs/train_detr")
    p.add_argument("--device", default="cpu")
    p.add_argument("--pos", nargs="+", choices=POS_ARMS, default=list(POS_ARMS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    p.add_argument("--photo-size", type=int, default=128, help="longer side of the photographs")
    p.add_argument("--scales", type=int, nargs="+", default=[96, 112, 128],
                   help="multi-scale resize: longer sides")
    p.add_argument("--photos", type=int, default=len(TRAIN_PHOTOS), help="training photographs used")
    p.add_argument("--max-objects", type=int, default=2)
    p.add_argument("--min-object", type=int, default=20)
    p.add_argument("--max-object", type=int, default=56)
    p.add_argument("--size-divisibility", type=int, default=0)
    p.add_argument("--backbone", default="test_resnet", help="timm model (pretrained=False)")
    p.add_argument("--out-index", type=int, default=2, help="timm feature index (2: stride 8, 3: stride 16)")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--queries", type=int, default=10)
    p.add_argument("--enc-layers", type=int, default=2)
    p.add_argument("--dec-layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ffn", type=int, default=128)
    p.add_argument("--class-weight", type=float, default=2.0, help="class loss and matching cost weight")
    p.add_argument("--eos-coef", type=float, default=EOS_COEF, help="cross-entropy weight of the no-object class")
    p.add_argument("--eval-every", type=int, default=300)
    p.add_argument("--eval-images", type=int, default=48)
    p.add_argument("--memory-warmup", type=int, default=50, help="step after which memory should be flat")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--report", action="store_true",
                   help="train nothing: read OUT/<arm>/metrics.json of earlier runs (e.g. arms run as "
                        "separate processes) and write OUT/ablation.md and OUT/curves.png")
    p.add_argument("--tiny", action="store_true", help="CI settings: small images, few eval images")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.tiny:
        args.photo_size, args.scales, args.batch_size = 64, [48, 64], 2
        args.min_object, args.max_object, args.eval_images = 8, 24, 4
        args.eval_every = min(args.eval_every, max(1, args.steps // 2))
        args.memory_warmup = min(args.memory_warmup, max(0, args.steps // 2))
        args.photos = min(args.photos, 3)
    if args.threads:
        torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)
    all_metrics = {}
    for arm in args.pos:
        if args.report:
            with open(os.path.join(args.out, arm, "metrics.json")) as f:
                all_metrics[arm] = json.load(f)
        else:
            all_metrics[arm] = train_arm(arm, args, os.path.join(args.out, arm))
    rows = [
        "| arm | held-out mean IoU | held-out AP50 | best AP50 | final train loss | s/step | RSS after warm-up -> end (MiB) |",
        "|---|---|---|---|---|---|---|",
    ]
    for arm, m in all_metrics.items():
        s = summarize(m, args.memory_warmup)
        rows.append(
            f"| {arm} | {s['mean_iou']:.3f} | {s['ap50']:.3f} | {s['best_ap50']:.3f} | {s['final_loss']:.3f} | "
            f"{s['s_per_step']:.3f} | {s['rss_warm_mb']:.0f} -> {s['rss_end_mb']:.0f} ({s['rss_growth_pct']:+.1f}%) |"
        )
    table = "\n".join(rows)
    with open(os.path.join(args.out, "ablation.md"), "w") as f:
        f.write(table + "\n")
    print(table)
    print(f"wrote {plot_curves(all_metrics, os.path.join(args.out, 'curves.png'))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
