"""The field's detectors and segmenters, stock vs ``vispos.make_padding_invariant``: batch dependence
and cost.

For each model (torchvision's Faster R-CNN, Mask R-CNN, RetinaNet, FCOS, FCN, DeepLabV3, LR-ASPP;
transformers' DETR, Conditional DETR, Deformable DETR; built locally, no weights downloaded):

* **batch dependence** (float64, trained-like norm statistics: random running mean / variance,
  weight and bias in every (frozen) batch norm, eval): the largest change of an image's scores and
  boxes (segmenters: its output map on its own pixels) between the image alone and the image in a
  padded batch with partners of other sizes, for the stock model and for vispos' wrapper; a
  detector whose number of detections changes shows both counts, and the scores / boxes are
  compared over the detections both have (highest score first);
* **cost** (float32, CPU, one thread): one eval step and one training step (forward, loss, backward)
  of the same padded batch, stock and invariant interleaved, median of ``--repeats`` rounds.

The detectors keep at most 50 detections per image; the R-CNNs train on 500 proposals and 128
sampled RoIs per image (the same settings in both arms).

``--quick`` runs the two cheapest models with one round; ``--models`` picks models by name.
:func:`gpu_rows` gives :mod:`gpu_check`'s rows (the same table on a GPU).

Run: ``python benchmarks/bench_detectors.py --out benchmarks/results_detectors.md``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import vispos  # noqa: E402
from _measure import time_sample  # noqa: E402

#: the issue's three images (resized to 128 x 192, 128 x 128, 128 x 171): one canvas of 128 x 192
SIZES = [(128, 192), (128, 128), (128, 171)]
QUICK_SIZES = [(64, 96), (64, 64), (50, 80)]


def trained_like(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Random running statistics and affine weights in every norm, as a trained checkpoint has them
    (the same recipe as the tests' ``trained_norms``)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(getattr(m, "running_mean", None), torch.Tensor) and isinstance(m.running_var, torch.Tensor):
                m.running_mean.copy_(torch.rand(m.running_mean.shape, generator=g, dtype=m.running_mean.dtype) - 0.5)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g, dtype=m.running_var.dtype) + 0.5)
            is_norm = isinstance(m, (torch.nn.modules.batchnorm._NormBase, torch.nn.GroupNorm)) or "Norm" in type(m).__name__
            for attr, low in (("weight", 0.5), ("bias", -0.5)):
                p = getattr(m, attr, None)
                if is_norm and isinstance(p, torch.Tensor) and p.dim() == 1:
                    p.copy_(torch.rand(p.shape, generator=g, dtype=p.dtype) + low)
    return model


@dataclass(frozen=True)
class Case:
    """One model: ``build()`` the stock model; ``kind`` how it is called ("detector", "segmenter",
    "detr")."""
    name: str
    kind: str
    build: Callable[[], torch.nn.Module]


def _detector(name: str) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        from torchvision.models import detection

        small = {"rpn_post_nms_top_n_train": 500, "box_batch_size_per_image": 128,
                 "box_detections_per_img": 50} if "rcnn" in name else {"detections_per_img": 50}
        model = getattr(detection, name)(weights=None, weights_backbone=None, num_classes=5, min_size=128,
                                         max_size=192, **small)
        getattr(model, "roi_heads", model).score_thresh = 0.0  # untrained scores sit below 0.05
        return model
    return build


def _segmenter(name: str) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        from torchvision.models import segmentation

        return getattr(segmentation, name)(weights=None, weights_backbone=None, num_classes=3)
    return build


def _detr(config: str, cls: str, **extra) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        import transformers

        cfg = getattr(transformers, config)(
            use_timm_backbone=True, backbone="resnet18", use_pretrained_backbone=False, d_model=64, encoder_layers=2,
            decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
            decoder_ffn_dim=128, num_queries=20, num_labels=5, dropout=0.0, **extra)
        return getattr(transformers, cls)(cfg)
    return build


CASES = [
    Case("fasterrcnn_resnet50_fpn", "detector", _detector("fasterrcnn_resnet50_fpn")),
    Case("maskrcnn_resnet50_fpn", "detector", _detector("maskrcnn_resnet50_fpn")),
    Case("retinanet_resnet50_fpn", "detector", _detector("retinanet_resnet50_fpn")),
    Case("fcos_resnet50_fpn", "detector", _detector("fcos_resnet50_fpn")),
    Case("fcn_resnet50", "segmenter", _segmenter("fcn_resnet50")),
    Case("deeplabv3_mobilenet_v3_large", "segmenter", _segmenter("deeplabv3_mobilenet_v3_large")),
    Case("lraspp_mobilenet_v3_large", "segmenter", _segmenter("lraspp_mobilenet_v3_large")),
    Case("DetrForObjectDetection", "detr", _detr("DetrConfig", "DetrForObjectDetection")),
    Case("ConditionalDetrForObjectDetection", "detr", _detr("ConditionalDetrConfig",
                                                             "ConditionalDetrForObjectDetection")),
    Case("DeformableDetrForObjectDetection", "detr", _detr("DeformableDetrConfig", "DeformableDetrForObjectDetection",
                                                            encoder_n_points=2, decoder_n_points=2)),
]
QUICK = ["lraspp_mobilenet_v3_large", "DetrForObjectDetection"]


def images(sizes, dtype, seed: int = 0, device="cpu") -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(3, h, w, generator=g, dtype=dtype).to(device) for h, w in sizes]


def _padded(imgs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(values[B, 3, H, W], pixel_mask[B, H, W] long, 1 = valid)``, each image at the origin."""
    h, w = max(i.shape[1] for i in imgs), max(i.shape[2] for i in imgs)
    values = imgs[0].new_zeros(len(imgs), 3, h, w)
    mask = torch.zeros(len(imgs), h, w, dtype=torch.long, device=imgs[0].device)
    for k, image in enumerate(imgs):
        values[k, :, :image.shape[1], :image.shape[2]] = image
        mask[k, :image.shape[1], :image.shape[2]] = 1
    return values, mask


def run_eval(kind: str, model: torch.nn.Module, imgs: list[torch.Tensor], invariant: bool) -> list:
    """Each image's outputs of one eval call on the batch ``imgs``: a dict (detectors: ``scores``,
    ``boxes``; segmenters: ``out`` on the image's pixels; DETR: ``logits``, ``boxes``)."""
    if kind == "detector":
        return [{"scores": d["scores"], "boxes": d["boxes"]} for d in model(imgs)]
    if kind == "segmenter":
        if invariant:
            out = model(vispos.nested_tensor_from_tensor_list(imgs))["out"].tensors
        else:
            out = model(vispos.nested_tensor_from_tensor_list(imgs).tensors)["out"]
        return [{"out": out[k, :, :i.shape[1], :i.shape[2]]} for k, i in enumerate(imgs)]
    out = model(*_padded(imgs))
    return [{"logits": out.logits[k], "boxes": out.pred_boxes[k]} for k in range(len(imgs))]


def largest_change(alone: dict, batch: dict) -> tuple[dict[str, float], str]:
    """The largest absolute change of each output (``{key: change}``) between an image's outputs
    alone and in the batch, and a note when a detector's number of detections changes (then its
    detections are compared in score order over the ones both have)."""
    note, worst = "", {}
    for key in alone:
        a, b = alone[key], batch[key]
        if a.shape != b.shape:
            note = f"{a.shape[0]} -> {b.shape[0]} detections"
            n = min(a.shape[0], b.shape[0])
            a, b = a[:n], b[:n]
        worst[key] = (a - b).abs().max().item() if a.numel() else 0.0
    return worst, note


def batch_dependence(case: Case, model: torch.nn.Module, sizes) -> tuple[dict[str, float], str]:
    """The largest change of each output over the batch's images (float64), with the notes."""
    imgs = images(sizes, torch.float64)
    with torch.no_grad():
        batch = run_eval(case.kind, model, imgs, _is_invariant(model))
        worst: dict[str, float] = {}
        notes = []
        for k, image in enumerate(imgs):
            alone = run_eval(case.kind, model, [image], _is_invariant(model))[0]
            change, note = largest_change(alone, batch[k])
            worst = {key: max(worst.get(key, 0.0), v) for key, v in change.items()}
            if note:
                notes.append(f"image {k}: {note}")
    return worst, "; ".join(notes)


def _is_invariant(model: torch.nn.Module) -> bool:
    return type(model).__module__.startswith("vispos")


def _targets(kind: str, sizes, dtype, device) -> list[dict]:
    out = []
    for h, w in sizes:
        boxes = torch.tensor([[0.1 * w, 0.1 * h, 0.5 * w, 0.6 * h], [0.4 * w, 0.3 * h, 0.9 * w, 0.8 * h]], dtype=dtype,
                             device=device)
        if kind == "detr":
            cxcywh = torch.stack([(boxes[:, 0] + boxes[:, 2]) / 2 / w, (boxes[:, 1] + boxes[:, 3]) / 2 / h,
                                  (boxes[:, 2] - boxes[:, 0]) / w, (boxes[:, 3] - boxes[:, 1]) / h], 1)
            out.append({"class_labels": torch.tensor([1, 2], device=device), "boxes": cxcywh})
            continue
        t = {"boxes": boxes, "labels": torch.tensor([1, 2], device=device)}
        t["masks"] = torch.zeros(2, h, w, dtype=torch.uint8, device=device)
        for j, (x0, y0, x1, y1) in enumerate(boxes.long().tolist()):
            t["masks"][j, y0:y1, x0:x1] = 1
        out.append(t)
    return out


def step_fns(case: Case, model: torch.nn.Module, sizes, device) -> dict[str, Callable[[], object]]:
    """``{"eval": fn, "train": fn}``: one eval call, one training step (forward, loss, backward)."""
    imgs = images(sizes, torch.float32, device=device)
    invariant = _is_invariant(model)
    targets = _targets(case.kind, sizes, torch.float32, device) if case.kind != "segmenter" else None
    labels = [torch.randint(0, 3, i.shape[1:], generator=torch.Generator().manual_seed(1)).to(device) for i in imgs]

    def eval_step():
        model.eval()
        with torch.no_grad():
            return run_eval(case.kind, model, imgs, invariant)

    def train_step():
        model.train()
        model.zero_grad(set_to_none=True)
        if case.kind == "detector":
            loss = sum(model(imgs, targets).values())
        elif case.kind == "detr":
            loss = model(*_padded(imgs), labels=targets).loss
        else:
            out = run_eval("segmenter", model, imgs, invariant)
            loss = sum(torch.nn.functional.cross_entropy(o["out"][None], lab[None]) for o, lab in zip(out, labels))
        loss.backward()
        model.eval()
        return loss.detach()
    return {"eval": eval_step, "train": train_step}


def interleaved(fns: dict[str, Callable[[], object]], device, repeats: int) -> dict[str, float]:
    """Median ms of each arm, the arms run in turn each round (one warm-up round)."""
    for fn in fns.values():
        time_sample(fn, device)
    times: dict[str, list[float]] = {arm: [] for arm in fns}
    for _ in range(repeats):
        for arm, fn in fns.items():
            times[arm].append(time_sample(fn, device))
    return {arm: statistics.median(t) for arm, t in times.items()}


def pair(case: Case, dtype: torch.dtype, device="cpu") -> tuple[torch.nn.Module, torch.nn.Module]:
    """``(stock, invariant)`` sharing one model, trained-like norms, eval. Timings convert the
    pair to float32 after building it in float64 (``invariant.float()``)."""
    torch.manual_seed(0)
    stock = trained_like(case.build().to(dtype)).to(device).eval()
    return stock, vispos.make_padding_invariant(stock)


def measure(case: Case, sizes, repeats: int, device="cpu") -> dict:
    """One row of the table: dependence (float64) and cost (float32) of ``case``."""
    stock, inv = pair(case, torch.float64)
    dep = {"stock": batch_dependence(case, stock, sizes), "vispos": batch_dependence(case, inv, sizes)}
    inv.float()  # the shared model's modules and the wrapper's own traced constants
    cost = {}
    for step in ("eval", "train"):
        fns = {"stock": step_fns(case, stock, sizes, device)[step], "vispos": step_fns(case, inv, sizes, device)[step]}
        cost[step] = interleaved(fns, torch.device(device), repeats)
    return {"dependence": dep, "cost": cost}


def _fmt(x: float) -> str:
    return "0" if x == 0 else f"{x:.2g}"


def _changes(worst: dict[str, float]) -> str:
    return ", ".join(f"{key} {_fmt(v)}" for key, v in worst.items())


def render(rows: dict[str, dict], args, seconds: float) -> str:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    except OSError:
        commit = "?"
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    sizes = QUICK_SIZES if args.quick else SIZES
    lines = [
        "# Detectors and segmenters: batch dependence and cost, stock vs vispos", "",
        f"torch {torch.__version__}; vispos {vispos.__version__}; commit {commit}; {now}; CPU, "
        f"{torch.get_num_threads()} thread; load average {load:.1f}; "
        f"`python benchmarks/bench_detectors.py{' --quick' if args.quick else ''}"
        f"{' --out ' + args.out if args.out else ''}`", "",
        f"Images {', '.join(f'{h}x{w}' for h, w in sizes)} in one padded batch. Batch dependence: the largest "
        "change of an image's scores and boxes (segmenters: its output map on its own pixels; DETR: logits and "
        "boxes) between the image alone and the image in the batch, float64, trained-like norm statistics, eval. "
        f"Cost: float32, median of {args.repeats} interleaved rounds, ms per call of the whole batch. Detectors: at "
        "most 50 detections per image; the R-CNNs train on 500 proposals and 128 sampled RoIs per image (both "
        "arms).", "",
        "| model | stock: largest change | vispos: largest change | stock: detections alone -> in batch | "
        "eval ms stock / vispos (ratio) | training step ms stock / vispos (ratio) |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        (s, s_note), (v, _) = row["dependence"]["stock"], row["dependence"]["vispos"]
        cells = []
        for step in ("eval", "train"):
            c = row["cost"][step]
            cells.append(f"{c['stock']:.0f} / {c['vispos']:.0f} ({c['vispos'] / c['stock']:.2f}x)")
        lines.append(f"| {name} | {_changes(s)} | {_changes(v)} | {s_note or '-'} | {cells[0]} | {cells[1]} |")
    lines += ["", f"Total {seconds:.0f} s."]
    return "\n".join(lines) + "\n"


def gpu_rows(table, dev: torch.device, small: bool, repeats: int) -> None:
    """:mod:`gpu_check`'s rows: per model, the batch dependence of the stock model and of vispos'
    wrapper (float64 on ``dev``) and the eval / training step cost ratio (float32, interleaved;
    the same pair, converted)."""
    sizes = QUICK_SIZES if small else SIZES
    for case in CASES if not small else [c for c in CASES if c.name in QUICK]:
        built: dict = {}

        def dependence(case=case, built=built):
            stock, inv = built["pair"] = pair(case, torch.float64, dev)
            s, _ = batch_dependence(case, stock, sizes)
            v, _ = batch_dependence(case, inv, sizes)
            return max(v.values()) < 1e-6, f"stock {_changes(s)}; vispos {_changes(v)}"

        def cost(case=case, built=built):
            stock, inv = built.pop("pair", None) or pair(case, torch.float64, dev)
            inv.float()  # built in float64: the build's training-mode probe check is float64-exact
            parts = []
            for step in ("eval", "train"):
                fns = {"stock": step_fns(case, stock, sizes, dev)[step], "vispos": step_fns(case, inv, sizes, dev)[step]}
                med = interleaved(fns, dev, repeats)
                parts.append(f"{step} {med['vispos'] / med['stock']:.2f}x ({med['stock']:.1f} / {med['vispos']:.1f} ms)")
            return None, "; ".join(parts)

        table.check("detectors", f"{case.name} batch dependence", "vispos < 1e-6 (float64)", dependence)
        table.check("detectors", f"{case.name} step cost", f"median of {repeats} interleaved", cost)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="write the markdown table here")
    parser.add_argument("--quick", action="store_true", help="two models, small images, one round")
    parser.add_argument("--repeats", type=int, default=None, help="interleaved rounds (default 3, quick 1)")
    parser.add_argument("--models", nargs="*", default=None, help="model names (default: all; quick: two)")
    args = parser.parse_args(argv)
    args.repeats = args.repeats or (1 if args.quick else 3)
    names = args.models or (QUICK if args.quick else [c.name for c in CASES])
    unknown = sorted(set(names) - {c.name for c in CASES})
    if unknown:
        parser.error(f"unknown models {unknown}; choose from {[c.name for c in CASES]}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    start = time.monotonic()
    try:
        rows = {}
        for case in CASES:
            if case.name in names:
                rows[case.name] = measure(case, QUICK_SIZES if args.quick else SIZES, args.repeats)
                print(f"{case.name}: {rows[case.name]}", flush=True)
        text = render(rows, args, time.monotonic() - start)
    finally:
        torch.set_num_threads(threads)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
