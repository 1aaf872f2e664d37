"""demos/train_detr.py: the CLI runs on tiny settings, and its pieces (data with exact boxes,
Hungarian matching, DETR loss, AP50, the three position arms) against slow references."""

import itertools
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.ops import box_convert, box_iou, generalized_box_iou

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

pytest.importorskip("skimage")
pytest.importorskip("scipy")

import vispos  # noqa: E402
from demos import train_detr as T  # noqa: E402


@pytest.mark.slow
def test_cli_runs_tiny(tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "demos.train_detr", "--steps", "20", "--tiny", "--threads", "1", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "wrote" in proc.stdout
    for arm in T.POS_ARMS:
        m = json.loads((out / arm / "metrics.json").read_text())
        assert m["arm"] == arm and m["steps"] == list(range(1, 21))
        for key in ("loss", "loss_ce", "loss_l1", "loss_giou", "seconds", "rss_mb", "padded_fraction"):
            assert len(m[key]) == 20 and all(np.isfinite(m[key])), key
        assert all(s > 0 for s in m["seconds"]) and all(r > 0 for r in m["rss_mb"])
        assert any(p > 0 for p in m["padded_fraction"])  # the batches are padded
        assert [e["step"] for e in m["eval"]] == [10, 20]
        assert all(0 <= e["mean_iou"] <= 1 and 0 <= e["ap50"] <= 1 for e in m["eval"])
    table = (out / "ablation.md").read_text().splitlines()
    assert [row.split("|")[1].strip() for row in table[2:]] == list(T.POS_ARMS)
    with Image.open(out / "curves.png") as im:
        assert im.format == "PNG" and im.size[0] > 600
    # --report rebuilds the same table from the metrics files alone (arms run as separate processes)
    (out / "ablation.md").unlink()
    (out / "curves.png").unlink()
    assert T.main(["--report", "--tiny", "--steps", "20", "--out", str(out)]) == 0
    assert (out / "ablation.md").read_text().splitlines() == table
    assert (out / "curves.png").stat().st_size > 0


def test_draw_objects_boxes_are_exact():
    photo = torch.rand(3, 60, 80)
    for seed in range(5):
        image, boxes, labels = T.draw_objects(photo, np.random.default_rng(seed), 3, 8, 24)
        assert image.shape == photo.shape and len(boxes) == len(labels) >= 1
        assert labels.dtype == torch.int64 and set(labels.tolist()) <= set(range(len(T.CLASSES)))
        changed = (image != photo).any(0)
        covered = torch.zeros_like(changed)
        for x0, y0, x1, y1 in boxes.long().tolist():
            region = changed[y0:y1, x0:x1]
            # tight: every border row and column of the box holds drawn pixels
            assert region[0].any() and region[-1].any() and region[:, 0].any() and region[:, -1].any()
            covered[y0:y1, x0:x1] = True
        assert not (changed & ~covered).any()  # nothing drawn outside the boxes
        ious = box_iou(boxes, boxes) - torch.eye(len(boxes))
        assert (ious == 0).all()  # objects do not overlap


def test_dataset_items_are_deterministic_and_boxes_follow_the_transforms():
    photos = [torch.rand(3, 48, 64), torch.rand(3, 64, 40)]
    ds = T.ShapesOnPhotos(photos, 6, seed=3, scales=(40, 56), train=True, min_size=8, max_size=20)
    sizes = set()
    for i in range(len(ds)):
        (a, ta), (b, tb) = ds[i], ds[i]
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        torch.testing.assert_close(ta["boxes"], tb["boxes"], rtol=0, atol=0)
        assert type(a) is torch.Tensor and max(a.shape[1:]) in (40, 56)
        sizes.add(tuple(a.shape[1:]))
        assert ((ta["boxes"] >= 0) & (ta["boxes"] <= 1)).all()
    assert len(sizes) > 1  # multi-scale: batches will be padded


def test_held_out_items_follow_a_reference_pipeline():
    """Held-out items (no flip) against resize written with torchvision's functional API."""
    from torchvision.transforms.v2 import functional as TF

    photo = torch.rand(3, 50, 70)
    ds = T.ShapesOnPhotos([photo], 4, seed=5, scales=(35, 42), train=False, min_size=8, max_size=20)
    for i in range(4):
        image, target = ds[i]
        rng = np.random.default_rng([5, i])
        rng.integers(1)  # the photo choice
        drawn, boxes, labels = T.draw_objects(photo, rng, 3, 8, 20)
        longer = (35, 42)[i % 2]
        h, w = round(50 * longer / 70), longer
        ref = TF.resize(drawn, [h, w], antialias=True)
        ref = TF.normalize(ref, vispos.app.data.IMAGENET_MEAN, vispos.app.data.IMAGENET_STD)
        torch.testing.assert_close(image, ref, rtol=1e-5, atol=1e-5)
        scale = torch.tensor([w / 70, h / 50, w / 70, h / 50])
        ref_boxes = box_convert(boxes * scale, "xyxy", "cxcywh") / torch.tensor([w, h, w, h])
        torch.testing.assert_close(target["boxes"], ref_boxes)
        torch.testing.assert_close(target["labels"], labels, rtol=0, atol=0)


def _random_targets(g, n):
    xy = torch.rand(n, 2, generator=g) * 0.6
    wh = torch.rand(n, 2, generator=g) * 0.3 + 0.05
    return {"labels": torch.randint(0, 3, (n,), generator=g), "boxes": box_convert(torch.cat([xy, xy + wh], 1), "xyxy", "cxcywh")}


@pytest.mark.parametrize("w_class", [T.W_CLASS, 2.0])
def test_hungarian_match_is_the_brute_force_optimum(w_class):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 4, generator=g)
    boxes = torch.rand(2, 5, 4, generator=g) * 0.5 + 0.2
    targets = [_random_targets(g, 3), _random_targets(g, 2)]
    for b, (rows, cols) in enumerate(T.hungarian_match(logits, boxes, targets, w_class)):
        prob = logits[b].softmax(-1)
        pred_xyxy = box_convert(boxes[b], "cxcywh", "xyxy")
        tgt_xyxy = box_convert(targets[b]["boxes"], "cxcywh", "xyxy")

        def cost(q, t):
            return (
                -w_class * prob[q, targets[b]["labels"][t]]
                + 5 * (boxes[b][q] - targets[b]["boxes"][t]).abs().sum()
                - 2 * generalized_box_iou(pred_xyxy[q : q + 1], tgt_xyxy[t : t + 1])[0, 0]
            )

        n = len(targets[b]["labels"])
        best = min(sum(float(cost(q, t)) for t, q in enumerate(perm)) for perm in itertools.permutations(range(5), n))
        got = sum(float(cost(int(q), int(t))) for q, t in zip(rows, cols))
        assert sorted(cols.tolist()) == list(range(n))
        torch.testing.assert_close(torch.tensor(got), torch.tensor(best))


@pytest.mark.parametrize("w_class, eos_coef", [(T.W_CLASS, T.EOS_COEF), (2.0, 0.25)])
def test_detr_loss_against_reference(w_class, eos_coef):
    g = torch.Generator().manual_seed(1)
    targets = [_random_targets(g, 2), _random_targets(g, 1)]
    logits = torch.randn(2, 4, 4, generator=g)
    boxes = torch.rand(2, 4, 4, generator=g) * 0.4 + 0.3
    boxes[0, 1], boxes[0, 3], boxes[1, 2] = targets[0]["boxes"][0], targets[0]["boxes"][1], targets[1]["boxes"][0]
    for b, q in ((0, 1), (0, 3), (1, 2)):  # make those queries confident of the right class
        logits[b, q] = -5.0
    logits[0, 1, targets[0]["labels"][0]] = logits[0, 3, targets[0]["labels"][1]] = logits[1, 2, targets[1]["labels"][0]] = 5.0
    losses = T.detr_loss(logits, boxes, targets, w_class, eos_coef)
    torch.testing.assert_close(losses["loss_l1"], torch.tensor(0.0))
    torch.testing.assert_close(losses["loss_giou"], torch.tensor(0.0), atol=1e-6, rtol=0)
    target_classes = torch.full((2, 4), 3)
    target_classes[0, 1], target_classes[0, 3] = targets[0]["labels"]
    target_classes[1, 2] = targets[1]["labels"][0]
    weight = torch.tensor([1.0, 1.0, 1.0, eos_coef])
    logp = logits.log_softmax(-1)
    nll = -logp.gather(-1, target_classes[..., None])[..., 0] * weight[target_classes]
    torch.testing.assert_close(losses["loss_ce"], nll.sum() / weight[target_classes].sum())
    torch.testing.assert_close(losses["loss"], losses["loss_ce"] * w_class, atol=1e-6, rtol=0)


def _slow_ap50(preds, gts, num_classes):
    """VOC all-point AP from its definition: the area under the precision envelope."""
    aps = []
    for c in range(num_classes):
        gt = [[bx for bx, lb in zip(g["boxes"], g["labels"]) if int(lb) == c] for g in gts]
        n_gt = sum(len(x) for x in gt)
        if n_gt == 0:
            continue
        dets = sorted(
            ((float(s), i, bx) for i, p in enumerate(preds) for s, lb, bx in zip(*p) if int(lb) == c),
            key=lambda d: -d[0],
        )
        used = [[False] * len(x) for x in gt]
        points = []  # (recall, precision) after each detection
        tp = 0
        for k, (_, i, bx) in enumerate(dets, start=1):
            best, best_j = 0.0, -1
            for j, g in enumerate(gt[i]):
                iou = float(box_iou(bx[None], g[None])[0, 0])
                if iou > best:
                    best, best_j = iou, j
            if best >= 0.5 and not used[i][best_j]:
                used[i][best_j] = True
                tp += 1
            points.append((tp / n_gt, tp / k))
        ap, prev_r = 0.0, 0.0
        for r, _ in points:
            if r > prev_r:
                ap += (r - prev_r) * max(p for rr, p in points if rr >= r)
                prev_r = r
        aps.append(ap)
    return sum(aps) / len(aps)


@pytest.mark.parametrize("seed", range(4))
def test_average_precision_against_reference(seed):
    g = torch.Generator().manual_seed(seed)
    gts = [{"labels": t["labels"], "boxes": box_convert(t["boxes"], "cxcywh", "xyxy")} for t in (_random_targets(g, 3) for _ in range(4))]
    preds = []
    for gt in gts:  # jittered copies of the truth (some hits, some misses) and random boxes
        noisy = gt["boxes"] + torch.randn(3, 4, generator=g) * 0.04
        extra = _random_targets(g, 2)
        boxes = torch.cat([noisy, box_convert(extra["boxes"], "cxcywh", "xyxy")])
        labels = torch.cat([gt["labels"], extra["labels"]])
        preds.append((torch.rand(5, generator=g), labels, boxes))
    got = T.average_precision(preds, gts, 3)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(_slow_ap50(preds, gts, 3)), rtol=1e-12, atol=1e-12)
    perfect = [(torch.ones(3), gt["labels"], gt["boxes"]) for gt in gts]
    assert T.average_precision(perfect, gts, 3) == 1.0


def test_position_arms():
    nested = vispos.nested_tensor_from_tensor_list([torch.randn(64, 5, 7), torch.randn(64, 3, 4)])
    grid = T.make_position_embedding("grid", 32)
    torch.testing.assert_close(grid(nested), vispos.PositionalEncodingPermute2D(64)(nested.tensors), rtol=0, atol=0)
    unmasked = vispos.NestedTensor(nested.tensors, None)
    torch.testing.assert_close(grid(nested), grid(unmasked), rtol=0, atol=0)  # blind to the mask
    sine = T.make_position_embedding("sine", 32)
    torch.testing.assert_close(sine(nested), vispos.PositionEmbeddingSine(32, normalize=True)(nested.mask))
    assert not torch.equal(sine(nested)[1], sine(unmasked)[1])  # follows the mask
    zero = T.make_position_embedding("none", 32)(nested, dtype=torch.float64)
    torch.testing.assert_close(zero, torch.zeros(2, 64, 5, 7, dtype=torch.float64), rtol=0, atol=0)
    with pytest.raises(ValueError, match="pos must be one of .* got 'learned'"):
        T.make_position_embedding("learned", 32)


def test_small_detr_output_shapes():
    torch.manual_seed(0)
    model = T.SmallDetr("sine", 3, "test_resnet", 3, 32, 5, 1, 1, 4, 64).eval()
    nested = vispos.nested_tensor_from_tensor_list([torch.randn(3, 64, 48), torch.randn(3, 40, 64)])
    logits, boxes = model(nested)
    assert logits.shape == (2, 5, 4) and boxes.shape == (2, 5, 4)
    assert ((boxes > 0) & (boxes < 1)).all()
    per_layer = model(nested, aux=True)  # one (logits, boxes) per decoder layer, last = forward()
    assert len(per_layer) == 1
    torch.testing.assert_close(per_layer[-1][0], logits)
    torch.testing.assert_close(per_layer[-1][1], boxes)
