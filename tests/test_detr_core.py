"""demos/detr (the training demos' shared core): DETR's decoder against a slow reference written
from DETR's transformer.py, the model's wiring (zero targets, query positions, key-only memory
positions), the position arms, the matcher and criterion, COCO metrics on hand-made cases with
known AP, and the report's statistics."""

from __future__ import annotations

import itertools
import math
import os
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torchvision.ops import box_convert, generalized_box_iou

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

pytest.importorskip("scipy")

import vispos  # noqa: E402
from vispos.app.train import (  # noqa: E402
    BOX_OPS_2D, DetrDecoder, DetrDecoderLayer, DetrModel, SetCriterion, coco_map, hungarian_match,
    make_position_embedding, matched_ious,
)
from vispos.app.train.report import ablation_table, paired  # noqa: E402
from vispos.backbones import TimmBackbone  # noqa: E402


# ------------------------------------------------------------------------ slow reference (DETR)
def _mha(attn: nn.MultiheadAttention, q, k, v, key_padding_mask=None):
    """nn.MultiheadAttention written out: per-head scaled dot product, softmax, output projection."""
    e, h = attn.embed_dim, attn.num_heads
    d = e // h
    wq, wk, wv = attn.in_proj_weight.split(e)
    bq, bk, bv = attn.in_proj_bias.split(e)
    qh, kh, vh = (
        (x @ w.T + b).reshape(x.shape[0], x.shape[1], h, d).transpose(1, 2)
        for x, w, b in ((q, wq, bq), (k, wk, bk), (v, wv, bv))
    )
    scores = qh @ kh.transpose(-1, -2) / math.sqrt(d)
    if key_padding_mask is not None:
        scores = scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
    out = (scores.softmax(-1) @ vh).transpose(1, 2).reshape(q.shape[0], q.shape[1], e)
    return attn.out_proj(out)


def _layer_ref(layer: DetrDecoderLayer, tgt, memory, pos, query_pos, mask):
    """DETR's TransformerDecoderLayer.forward_post (models/transformer.py), line by line."""
    q = k = tgt + query_pos
    tgt = layer.norm1(tgt + _mha(layer.self_attn, q, k, tgt))
    tgt2 = _mha(layer.multihead_attn, tgt + query_pos, memory + pos, memory, mask)  # values: no pos
    tgt = layer.norm2(tgt + tgt2)
    tgt2 = layer.linear2(F.relu(layer.linear1(tgt)))
    return layer.norm3(tgt + tgt2)


def _inputs(b=2, q=5, n=7, c=16, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    tgt, memory = torch.randn(b, q, c, generator=g, dtype=dtype), torch.randn(b, n, c, generator=g, dtype=dtype)
    pos, query_pos = torch.randn(b, n, c, generator=g, dtype=dtype), torch.randn(b, q, c, generator=g, dtype=dtype)
    mask = torch.zeros(b, n, dtype=torch.bool)
    mask[-1, n - 3:] = True  # the last item is padded
    return tgt, memory, pos, query_pos, mask


def test_decoder_layer_matches_detr_reference():
    torch.manual_seed(0)
    layer = DetrDecoderLayer(16, nhead=4, dim_feedforward=32, dropout=0.0).double().eval()
    tgt, memory, pos, query_pos, mask = _inputs()
    got = layer(tgt, memory, pos=pos, query_pos=query_pos, memory_key_padding_mask=mask)
    torch.testing.assert_close(got, _layer_ref(layer, tgt, memory, pos, query_pos, mask))
    # a (Q, C) query_pos is broadcast over the batch
    torch.testing.assert_close(
        layer(tgt, memory, pos, query_pos[0], mask),
        layer(tgt, memory, pos, query_pos[0].expand(2, -1, -1), mask),
    )


def test_decoder_stack_matches_reference_and_normalizes_every_layer():
    torch.manual_seed(1)
    dec = DetrDecoder(16, nhead=4, num_layers=3, dim_feedforward=32, dropout=0.0).double().eval()
    _, memory, pos, query_pos, mask = _inputs(seed=1)
    tgt = torch.zeros_like(query_pos)  # DETR starts from zero targets
    got = dec(tgt, memory, pos, query_pos, mask)
    assert got.shape == (3, 2, 5, 16)
    out, ref = tgt, []
    for layer in dec.layers:
        out = _layer_ref(layer, out, memory, pos, query_pos, mask)
        ref.append(dec.norm(out))
    torch.testing.assert_close(got, torch.stack(ref))
    last = DetrDecoder(16, nhead=4, num_layers=3, dim_feedforward=32, dropout=0.0, return_intermediate=False)
    last.load_state_dict(dec.state_dict())
    torch.testing.assert_close(last.double().eval()(tgt, memory, pos, query_pos, mask), got[-1])


def test_cross_attention_takes_memory_positions_on_keys_only():
    """With one valid memory cell every query attends to it with weight 1: the output must then
    not depend on that cell's position (positions are not in the values), while padded cells'
    positions never matter and a second valid cell's position does (it moves the keys)."""
    torch.manual_seed(2)
    layer = DetrDecoderLayer(16, nhead=4, dim_feedforward=32, dropout=0.0).double().eval()
    tgt, memory, pos, query_pos, _ = _inputs(b=1, n=4, seed=2)
    one = torch.tensor([[False, True, True, True]])
    base = layer(tgt, memory, pos, query_pos, one)
    torch.testing.assert_close(layer(tgt, memory, pos * 5 + 3, query_pos, one), base)
    two = torch.tensor([[False, False, True, True]])
    base2 = layer(tgt, memory, pos, query_pos, two)
    moved = pos.clone()
    moved[0, 2:] += 10  # padded cells only
    torch.testing.assert_close(layer(tgt, memory, moved, query_pos, two), base2)
    moved = pos.clone()
    moved[0, 1] += 1
    assert not torch.allclose(layer(tgt, memory, moved, query_pos, two), base2)


@pytest.mark.parametrize("kwargs, match", [
    (dict(d_model=30, nhead=4), "nhead=4 must divide d_model=30"),
    (dict(d_model=16, dropout=1.0), r"dropout must be a float in \[0, 1\)"),
    (dict(d_model=16, activation="tanh"), "activation must be one of"),
])
def test_decoder_layer_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DetrDecoderLayer(**kwargs)


def test_decoder_layer_rejects_mismatched_inputs():
    layer = DetrDecoderLayer(16, nhead=4, dim_feedforward=32)
    tgt, memory, pos, query_pos, mask = _inputs(dtype=torch.float32)
    with pytest.raises(ValueError, match="memory must be a Tensor"):
        layer(tgt, memory[:1])
    with pytest.raises(ValueError, match="pos must have memory's shape"):
        layer(tgt, memory, pos[:, :3])
    with pytest.raises(ValueError, match="query_pos must have tgt's shape"):
        layer(tgt, memory, pos, query_pos[:, :2])
    with pytest.raises(TypeError, match="memory_key_padding_mask"):
        layer(tgt, memory, pos, query_pos, mask.float())
    assert "normalize_before=False" in repr(layer)


# ---------------------------------------------------------------------------------- the model
def _model(arm="sine", seed=0, **kw):
    torch.manual_seed(seed)
    backbone = TimmBackbone("test_resnet", out_indices=(2,), pretrained=False)
    return DetrModel(backbone, make_position_embedding(arm, 32), 3, hidden_dim=32, num_queries=5,
                     enc_layers=1, dec_layers=2, nhead=4, dim_feedforward=64, **kw)


def _batch():
    torch.manual_seed(5)
    return vispos.nested_tensor_from_tensor_list([torch.randn(3, 64, 48), torch.randn(3, 40, 64)])


def test_model_outputs_and_decoder_wiring():
    """Zero targets, learned query positions, and the encoder's pos handed to the decoder as the
    keys' positions (the memory itself carries no position)."""
    model = _model().eval()
    seen = {}
    model.decoder.register_forward_pre_hook(lambda m, a, kw: seen.update(kw=kw, args=a), with_kwargs=True)
    model.encoder.register_forward_hook(lambda m, a, out: seen.update(memory=out, flat=a[0]))
    nested = _batch()
    out = model(nested)
    assert out["pred_logits"].shape == (2, 5, 4) and out["pred_boxes"].shape == (2, 5, 4)
    assert ((out["pred_boxes"] > 0) & (out["pred_boxes"] < 1)).all()
    assert len(out["aux_outputs"]) == 1 and out["aux_outputs"][0]["pred_boxes"].shape == (2, 5, 4)
    tgt, memory = seen["args"]
    assert torch.equal(tgt, torch.zeros(2, 5, 32))
    assert torch.equal(memory, seen["memory"])  # no position added to the memory
    torch.testing.assert_close(seen["kw"]["pos"], seen["flat"].pos, rtol=0, atol=0)
    torch.testing.assert_close(seen["kw"]["query_pos"], model.query_embed.weight.expand(2, -1, -1), rtol=0, atol=0)
    assert torch.equal(seen["kw"]["memory_key_padding_mask"], seen["flat"].key_padding_mask)
    # the heads run on every decoder layer's normalised output
    hs = model.decoder(tgt, memory, **{k: v for k, v in seen["kw"].items()})
    torch.testing.assert_close(out["pred_logits"], model.class_embed(hs[-1]))
    torch.testing.assert_close(out["aux_outputs"][0]["pred_boxes"], model.bbox_embed(hs[0]).sigmoid())


def test_reference_points_offset_the_box_centres():
    """With reference points every layer's box centre is sigmoid(logit(ref) + head), the sizes
    sigmoid(head); ref = sigmoid(Linear(query_pos)); the decoder (and its position-free values)
    is the same module as without them."""
    plain, ref = _model().eval(), _model(reference_points=True).eval()
    assert plain.reference_points is None and ref.reference_points.weight.shape == (2, 32)
    assert "reference_points=True" in repr(ref)
    seen = {}
    ref.decoder.register_forward_hook(lambda m, a, out: seen.update(hs=out))
    out = ref(_batch())
    r = torch.sigmoid(ref.reference_points(ref.query_embed.weight))
    torch.testing.assert_close(out["reference_points"], r)
    assert ((r > 0) & (r < 1)).all() and r.std() > 0.05  # spread over the image, not one point
    for layer, boxes in ((1, out["pred_boxes"]), (0, out["aux_outputs"][0]["pred_boxes"])):
        head = ref.bbox_embed(seen["hs"][layer])
        torch.testing.assert_close(boxes[..., :2], torch.sigmoid(torch.logit(r, eps=1e-5) + head[..., :2]))
        torch.testing.assert_close(boxes[..., 2:], torch.sigmoid(head[..., 2:]))
    # the same weights without reference points give DETR's plain boxes
    plain.load_state_dict({k: v for k, v in ref.state_dict().items() if not k.startswith("reference_points")})
    torch.testing.assert_close(plain(_batch())["pred_boxes"], torch.sigmoid(ref.bbox_embed(seen["hs"][1])))


def test_arms_start_from_the_same_weights():
    states = [_model(arm, reference_points=True).state_dict() for arm in ("none", "grid", "sine")]
    for other in states[1:]:
        assert other.keys() == states[0].keys()
        for k in states[0]:
            assert torch.equal(other[k], states[0][k]), k


def test_position_arms():
    nested = vispos.nested_tensor_from_tensor_list([torch.randn(64, 5, 7), torch.randn(64, 3, 4)])
    grid = make_position_embedding("grid", 64)
    torch.testing.assert_close(grid(nested), vispos.PositionalEncodingPermute2D(64)(nested.tensors), rtol=0, atol=0)
    unmasked = vispos.NestedTensor(nested.tensors, None)
    torch.testing.assert_close(grid(nested), grid(unmasked), rtol=0, atol=0)  # blind to the mask
    sine = make_position_embedding("sine", 64)
    torch.testing.assert_close(sine(nested), vispos.PositionEmbeddingSine(32, normalize=True)(nested.mask))
    assert not torch.equal(sine(nested)[1], sine(unmasked)[1])  # follows the mask
    zero = make_position_embedding("none", 64)(nested, dtype=torch.float64)
    torch.testing.assert_close(zero, torch.zeros(2, 64, 5, 7, dtype=torch.float64), rtol=0, atol=0)
    vol = vispos.nested_tensor_from_tensor_list([torch.randn(48, 3, 5, 7), torch.randn(48, 2, 4, 4)])
    grid3 = make_position_embedding("grid", 48, num_axes=3)
    torch.testing.assert_close(grid3(vol), vispos.PositionalEncodingPermute3D(48)(vol.tensors), rtol=0, atol=0)
    assert make_position_embedding("sine", 48, num_axes=3)(vol).shape == (2, 48, 3, 5, 7)
    with pytest.raises(ValueError, match="pos must be one of .* got 'learned'"):
        make_position_embedding("learned", 32)
    with pytest.raises(ValueError, match="hidden_dim=30 must be divisible by 4"):
        make_position_embedding("sine", 30)


# ------------------------------------------------------------------------- matcher, criterion
def _random_targets(g, n):
    xy = torch.rand(n, 2, generator=g) * 0.6
    wh = torch.rand(n, 2, generator=g) * 0.3 + 0.05
    return {"labels": torch.randint(0, 3, (n,), generator=g), "boxes": box_convert(torch.cat([xy, xy + wh], 1), "xyxy", "cxcywh")}


@pytest.mark.parametrize("w_class", [1.0, 2.0])
def test_hungarian_match_is_the_brute_force_optimum(w_class):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 4, generator=g)
    boxes = torch.rand(2, 5, 4, generator=g) * 0.5 + 0.2
    targets = [_random_targets(g, 3), _random_targets(g, 2)]
    for b, (rows, cols) in enumerate(hungarian_match(logits, boxes, targets, BOX_OPS_2D, w_class)):
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


@pytest.mark.parametrize("w_class, eos_coef", [(1.0, 0.1), (2.0, 0.25)])
def test_criterion_against_reference(w_class, eos_coef):
    g = torch.Generator().manual_seed(1)
    targets = [_random_targets(g, 2), _random_targets(g, 1)]
    logits = torch.randn(2, 4, 4, generator=g)
    boxes = torch.rand(2, 4, 4, generator=g) * 0.4 + 0.3
    boxes[0, 1], boxes[0, 3], boxes[1, 2] = targets[0]["boxes"][0], targets[0]["boxes"][1], targets[1]["boxes"][0]
    for b, q in ((0, 1), (0, 3), (1, 2)):  # make those queries confident of the right class
        logits[b, q] = -5.0
    logits[0, 1, targets[0]["labels"][0]] = logits[0, 3, targets[0]["labels"][1]] = logits[1, 2, targets[1]["labels"][0]] = 5.0
    crit = SetCriterion(3, BOX_OPS_2D, class_weight=w_class, eos_coef=eos_coef)
    noisy = boxes.clone()
    noisy[0, 1] += 0.01
    aux = {"pred_logits": logits, "pred_boxes": noisy}
    losses = crit({"pred_logits": logits, "pred_boxes": boxes, "aux_outputs": [aux]}, targets)
    torch.testing.assert_close(losses["loss_l1"], torch.tensor(0.0))
    torch.testing.assert_close(losses["loss_giou"], torch.tensor(0.0), atol=1e-6, rtol=0)
    target_classes = torch.full((2, 4), 3)
    target_classes[0, 1], target_classes[0, 3] = targets[0]["labels"]
    target_classes[1, 2] = targets[1]["labels"][0]
    weight = torch.tensor([1.0, 1.0, 1.0, eos_coef])
    nll = -logits.log_softmax(-1).gather(-1, target_classes[..., None])[..., 0] * weight[target_classes]
    ce = nll.sum() / weight[target_classes].sum()
    torch.testing.assert_close(losses["loss_ce"], ce)
    torch.testing.assert_close(losses["loss_last"], ce * w_class, atol=1e-6, rtol=0)
    # the auxiliary layer: the same matching, L1 = 4 * 0.01 over 3 boxes, plus its GIoU
    giou = generalized_box_iou(box_convert(noisy[0, 1:2], "cxcywh", "xyxy"), box_convert(boxes[0, 1:2], "cxcywh", "xyxy"))
    aux_total = w_class * ce + 5 * 0.04 / 3 + 2 * (1 - giou[0, 0]) / 3
    torch.testing.assert_close(losses["loss"], ce * w_class + aux_total, atol=1e-5, rtol=0)


def test_criterion_normalises_over_processes():
    """With the box count and the class weights summed over 2 processes (simulated), each
    process's loss is its share of the global mean: the two halves average to the whole."""
    g = torch.Generator().manual_seed(3)
    targets = [_random_targets(g, 2), _random_targets(g, 1), _random_targets(g, 3), _random_targets(g, 1)]
    out = {"pred_logits": torch.randn(4, 5, 4, generator=g), "pred_boxes": torch.rand(4, 5, 4, generator=g) * 0.5 + 0.2}
    whole = SetCriterion(3, BOX_OPS_2D)(out, targets)
    halves = []
    crit = SetCriterion(3, BOX_OPS_2D)
    for part in (slice(0, 2), slice(2, 4)):
        sub = {k: v[part] for k, v in out.items()}
        other = slice(2, 4) if part.start == 0 else slice(0, 2)
        other_out = {k: v[other] for k, v in out.items()}
        # the other process's contribution to the sums, as all_reduce would add it
        n_other = float(sum(len(t["labels"]) for t in targets[other]))
        matches = crit.match(other_out["pred_logits"], other_out["pred_boxes"], targets[other])
        w_other = sum(0.1 * (5 - len(r)) + len(r) for r, _ in matches)
        count = {"n": 0}

        def all_reduce(t, n_other=n_other, w_other=w_other, count=count):
            count["n"] += 1
            return t + (n_other if count["n"] == 1 else w_other)

        halves.append(SetCriterion(3, BOX_OPS_2D, all_reduce=all_reduce, world_size=2)(sub, targets[part]))
    for k in ("loss", "loss_ce", "loss_l1", "loss_giou"):
        torch.testing.assert_close((halves[0][k] + halves[1][k]) / 2, whole[k])


# -------------------------------------------------------------------------------- metrics
def _record(boxes, labels, scores=None):
    out = {"boxes": torch.tensor(boxes, dtype=torch.float32), "labels": torch.tensor(labels)}
    if scores is not None:
        out["scores"] = torch.tensor(scores)
    return out


def test_coco_map_hand_made_ranking():
    """Two ground-truth boxes; detections ranked hit (0.9), miss (0.8), hit (0.7). Precision
    envelope: 1 up to recall 0.5, 2/3 up to recall 1; COCO samples 101 recall points, so
    AP = (51 * 1 + 50 * 2/3) / 101 at every IoU threshold (the hits are exact)."""
    gts = [_record([[0, 0, 10, 10]], [0]), _record([[20, 20, 40, 40]], [0])]
    preds = [_record([[0, 0, 10, 10], [50, 50, 60, 60]], [0, 0], [0.9, 0.8]),
             _record([[20, 20, 40, 40]], [0], [0.7])]
    want = (51 + 50 * 2 / 3) / 101
    got = coco_map(preds, gts)
    for k in ("map", "ap50", "ap75"):
        assert got[k] == pytest.approx(want, abs=1e-6), k


def test_coco_map_hand_made_iou_thresholds():
    """One box found with IoU 0.62 (a 10x6.2 box inside a 10x10 one): a hit at IoU thresholds
    0.50, 0.55, 0.60 and a miss at 0.65 ... 0.95, so AP50 = 1, AP75 = 0, mAP = 3/10. A second
    class with a wrong label counts as a miss for both classes."""
    gts = [_record([[0, 0, 10, 10]], [1])]
    got = coco_map([_record([[0, 0, 10, 6.2]], [1], [0.8])], gts)
    assert got == pytest.approx({"map": 0.3, "ap50": 1.0, "ap75": 0.0}, abs=1e-6)
    assert coco_map([_record([[0, 0, 10, 10]], [2], [0.8])], gts) == {"map": 0.0, "ap50": 0.0, "ap75": 0.0}


def _pycocotools_stats(preds, gts):
    """mAP, AP50 and AP75 straight from pycocotools' COCOeval (boxes xyxy -> COCO's xywh)."""
    import contextlib
    import io

    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    def xywh(b):
        x0, y0, x1, y1 = (float(v) for v in b)
        return [x0, y0, x1 - x0, y1 - y0]

    labels = sorted({int(v) for r in (*preds, *gts) for v in r["labels"]})
    anns, dets = [], []
    for i, g in enumerate(gts):
        for b, c in zip(g["boxes"], g["labels"]):
            box = xywh(b)
            anns.append({"id": len(anns) + 1, "image_id": i, "category_id": int(c), "bbox": box,
                         "area": box[2] * box[3], "iscrowd": 0})
    for i, p in enumerate(preds):
        for b, c, sc in zip(p["boxes"], p["labels"], p["scores"]):
            dets.append({"image_id": i, "category_id": int(c), "bbox": xywh(b), "score": float(sc)})
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO()
        gt.dataset = {"images": [{"id": i} for i in range(len(gts))], "annotations": anns,
                      "categories": [{"id": c} for c in labels]}
        gt.createIndex()
        ev = COCOeval(gt, gt.loadRes(dets), "bbox")
        ev.evaluate(), ev.accumulate(), ev.summarize()
    return {"map": ev.stats[0], "ap50": ev.stats[1], "ap75": ev.stats[2]}


def test_coco_map_matches_pycocotools():
    """Three images, three classes (one only predicted, never present), boxes placed by hand at
    IoUs from 0.3 to 1 with tied and untied scores, a duplicate and an image without objects:
    the numbers are pycocotools' own."""
    gts = [
        _record([[10, 10, 50, 50], [60, 60, 100, 90]], [0, 1]),
        _record([[0, 0, 30, 40], [35, 5, 70, 45], [5, 50, 25, 70]], [0, 0, 1]),
        {"boxes": torch.zeros(0, 4), "labels": torch.zeros(0, dtype=torch.int64)},
    ]
    preds = [
        _record([[12, 10, 50, 52], [10, 10, 50, 50], [60, 62, 95, 90], [0, 0, 20, 20]], [0, 0, 1, 2],
                [0.9, 0.6, 0.8, 0.7]),
        _record([[0, 0, 30, 30], [40, 5, 70, 45], [5, 50, 25, 60], [36, 6, 69, 44]], [0, 0, 1, 1],
                [0.85, 0.6, 0.6, 0.5]),
        _record([[5, 5, 40, 40]], [0], [0.95]),
    ]
    want = _pycocotools_stats(preds, gts)
    assert 0 < want["map"] < want["ap75"] < want["ap50"] < 1  # a case that tells the thresholds apart
    assert coco_map(preds, gts) == pytest.approx(want, abs=1e-6)


def test_matched_ious():
    pred = torch.tensor([[0.0, 0, 10, 10], [0, 0, 10, 6.2]])
    gt = torch.tensor([[0.0, 0, 10, 10], [0, 0, 10, 10]])
    torch.testing.assert_close(matched_ious(pred, gt, BOX_OPS_2D.iou), torch.tensor([1.0, 0.62]))
    assert matched_ious(pred[:0], gt[:0], BOX_OPS_2D.iou).shape == (0,)


# -------------------------------------------------------------------------------- report
def test_paired_comparison():
    r = paired([0.5, 0.4, 0.6, 0.3, 0.7], [0.1, 0.2, 0.1, 0.2, 0.1])
    torch.testing.assert_close(torch.tensor(r["diffs"]), torch.tensor([0.4, 0.2, 0.5, 0.1, 0.6]), rtol=0, atol=1e-12)
    assert (r["wins"], r["losses"], r["ties"]) == (5, 0, 0)
    assert r["p_sign"] == pytest.approx(2 * 0.5**5)  # the smallest two-sided p with 5 pairs
    assert 0.1 <= r["ci95"][0] <= r["mean"] <= r["ci95"][1] <= 0.6
    assert r["std"] == pytest.approx(float(np.std([0.4, 0.2, 0.5, 0.1, 0.6], ddof=1)))
    from scipy.stats import ttest_rel

    assert r["p_t"] == pytest.approx(ttest_rel([0.5, 0.4, 0.6, 0.3, 0.7], [0.1, 0.2, 0.1, 0.2, 0.1]).pvalue)
    assert r["p_t"] < 0.05 and r["reading"] == "a ahead"
    assert paired([0.1, 0.2, 0.1, 0.2], [0.5, 0.4, 0.6, 0.5])["reading"] == "b ahead"
    level = paired([0.3, 0.2, 0.4, 0.2], [0.2, 0.3, 0.4, 0.1])
    assert (level["wins"], level["losses"], level["ties"]) == (2, 1, 1) and level["p_sign"] == pytest.approx(1.0)
    assert level["reading"] == "level"
    assert paired([0.5], [0.1])["reading"] == "too few seeds" and paired([0.5], [0.1])["std"] == 0.0


def _fake_run(arm, seed, ap50):
    n = 30
    return {
        "arm": arm, "seed": seed, "steps": list(range(1, n + 1)), "world_size": 1, "global_batch": 2,
        "args": {"eval_every": 10, "lr": 1e-3, "seed": seed}, "loss_last": [1.0] * n, "seconds": [0.1] * n,
        "rss_mb": [100.0] * n,
        "eval": [{"step": s, "mean_iou": 0.5, "map": ap50 / 2, "ap50": ap50 * s / 30, "ap75": 0.0} for s in (10, 20, 30)],
    }


def test_ablation_table_over_seeds():
    runs = {"grid": {s: _fake_run("grid", s, 0.2) for s in range(3)},
            "sine": {s: _fake_run("sine", s, 0.2 + 0.1 * (s + 1)) for s in range(3)}}
    table = ablation_table(runs, ("map", "ap50", "ap75"), "ap50", 5)
    # last 3 of ap50 * (1/3, 2/3, 1): 2/3 of the final value
    assert "| (b) grid, mask-blind | 3 | 0.500 ± 0.000 | 0.100 ± 0.000 | 0.133 ± 0.000 |" in table
    assert "| sine - grid | ap50 | +0.067, +0.133, +0.200 | +0.133 ± 0.067 | 3 / 0 / 0 | 0.250 | 0.074 |" in table
    # 3 seeds, all for sine, but the t-test does not exclude no difference (p 0.074): level
    assert "| [+0.067, +0.200] | level |" in table
    assert ("- sine vs grid, ap50 (last 3) over seeds [0, 1, 2]: sine - grid = +0.133 ± 0.067; sine better on 3 "
            "seed(s), grid on 0, 0 tie(s); **the arms are level** (t-test p = 0.074") in table
    assert "Warning" not in table
    runs["sine"][0]["args"] = {"eval_every": 10, "lr": 5e-4, "seed": 0}
    assert "differ in settings other than the seed:** {'lr': [0.0005, 0.001]}" in ablation_table(runs, ("ap50",), "ap50", 5)


# ------------------------------------------------------------------- held-out compositions
def _boxes_item(h, w, seed):
    """A one-channel image of zeros with one solid box of ones; its target (cxcywh normalised)."""
    g = np.random.default_rng(seed)
    bh, bw = int(g.integers(3, h // 2)), int(g.integers(3, w // 2))
    y0, x0 = int(g.integers(0, h - bh)), int(g.integers(0, w - bw))
    image = torch.zeros(1, h, w)
    image[0, y0:y0 + bh, x0:x0 + bw] = 1.0
    box = torch.tensor([[(x0 + bw / 2) / w, (y0 + bh / 2) / h, bw / w, bh / h]])
    return image, {"labels": torch.tensor([seed % 3]), "boxes": box}


class _ItemwiseDetector(nn.Module):
    """A detector whose predictions for an item depend on that item's own cells only (what a
    padding-invariant detector gives): query 0 finds the box of ones inside the item's valid region,
    blurred by an item-dependent offset; query 1 predicts a fixed box with a low score."""

    def forward(self, nested):
        logits, boxes = [], []
        for b, (h, w) in enumerate(nested.image_sizes):
            ones = nested.tensors[b, 0, :h, :w] > 0.5
            rows, cols = ones.any(1).nonzero()[:, 0], ones.any(0).nonzero()[:, 0]
            y0, y1, x0, x1 = rows[0], rows[-1] + 1, cols[0], cols[-1] + 1
            shift = ((h * 7 + w * 3) % 5) / 10 * (x1 - x0)  # 0 .. 0.4 of the width: IoUs from 1 down
            box = torch.stack([(x0 + x1 + 2 * shift) / 2 / w, (y0 + y1) / 2 / h, (x1 - x0) / w, (y1 - y0) / h])
            boxes.append(torch.stack([box, torch.tensor([0.5, 0.5, 0.2, 0.2])]))
            cls = torch.full((2, 4), -4.0)
            cls[0, (h + w) % 3] = 4.0 - ((h * w) % 7) / 7
            cls[1, 3] = 1.0
            logits.append(cls)
        return {"pred_logits": torch.stack(logits), "pred_boxes": torch.stack(boxes).float()}


def _held_set(n=7):
    sizes = [(20, 30), (36, 24), (28, 28), (40, 44), (24, 40), (32, 20), (44, 36)][:n]
    return [_boxes_item(h, w, i) for i, (h, w) in enumerate(sizes)]


def test_held_out_compositions():
    from types import SimpleNamespace

    from vispos.app.train.distributed import DistContext
    from vispos.app.train.heldout import composition_keys, full_evaluation_steps, held_out_compositions

    held = _held_set()
    args = SimpleNamespace(eval_batch_sizes=[3, 1], eval_beside_largest=True, size_divisibility=0)
    assert composition_keys(args) == ["batch3", "batch1", "beside_largest"]
    comps = held_out_compositions(held, args, DistContext())
    assert list(comps) == ["batch3", "batch1", "beside_largest"]
    assert [len(t) for _, t, _ in comps["batch3"]] == [3, 3, 1] and [n for *_, n in comps["batch3"]] == [3, 3, 1]
    assert len(comps["batch1"]) == 7
    for (nested, targets, n_scored), (image, target) in zip(comps["batch1"], held):
        assert n_scored == 1 and nested.tensors.shape == (1, *image.shape) and not nested.mask.any()  # alone
        torch.testing.assert_close(nested.tensors[0], image, rtol=0, atol=0)
        torch.testing.assert_close(targets[0]["boxes"], target["boxes"], rtol=0, atol=0)
    # beside the largest: item 3 (40 x 44 = 1760 cells) is every item's partner, item 6 (44 x 36 = 1584
    # cells, the next most) item 3's own; the scored item comes first, at the batch's origin
    partners = []
    for i, (nested, targets, n_scored) in enumerate(comps["beside_largest"]):
        (h, w), (ph, pw) = nested.image_sizes
        assert n_scored == 1 and nested.tensors.shape[0] == 2 and (h, w) == held[i][0].shape[1:]
        torch.testing.assert_close(nested.tensors[0, :, :h, :w], held[i][0], rtol=0, atol=0)
        partner = 6 if i == 3 else 3
        torch.testing.assert_close(nested.tensors[1, :, :ph, :pw], held[partner][0], rtol=0, atol=0)
        torch.testing.assert_close(targets[0]["boxes"], held[i][1]["boxes"], rtol=0, atol=0)
        partners.append((ph, pw))
    assert partners == [(40, 44)] * 3 + [(44, 36)] + [(40, 44)] * 3
    # two processes: each takes items rank::2, none repeated, the partner still the whole set's largest
    shares = [held_out_compositions(held, args, DistContext(rank=r, world_size=2)) for r in (0, 1)]
    assert [sum(len(t) for _, t, _ in s["batch3"]) for s in shares] == [4, 3]
    firsts = sorted(tuple(nested.image_sizes[0]) for s in shares for nested, _, _ in s["beside_largest"])
    assert firsts == sorted(tuple(img.shape[1:]) for img, _ in held)
    assert {tuple(nested.image_sizes[1]) for s in shares for nested, _, _ in s["beside_largest"]} == {(40, 44), (44, 36)}
    assert full_evaluation_steps(3000, 300) == {2400, 2700, 3000}
    assert full_evaluation_steps(1000, 300) == {600, 900, 1000}
    assert full_evaluation_steps(20, 10) == {10, 20} and full_evaluation_steps(5, 10) == {5}


def test_evaluate_scores_only_the_scored_items_of_every_composition():
    """With a detector that depends on each item's own cells only, every composition gives the
    same metrics; scoring the partners too (n_scored ignored) would not."""
    from types import SimpleNamespace

    from vispos.app.train import evaluate
    from vispos.app.train.distributed import DistContext
    from vispos.app.train.heldout import held_out_compositions

    held = _held_set()
    args = SimpleNamespace(eval_batch_sizes=[4, 1, 3], eval_beside_largest=True, size_divisibility=0)
    comps = held_out_compositions(held, args, DistContext())
    task = SimpleNamespace(box_ops=BOX_OPS_2D, metric=coco_map)
    criterion = SetCriterion(3, BOX_OPS_2D, 2.0, 5.0, 2.0, 0.1)
    results = {k: evaluate(_ItemwiseDetector(), b, criterion, task, DistContext()) for k, b in comps.items()}
    alone = results["batch1"]
    assert 0.1 < alone["ap50"] < 1 and 0.1 < alone["map"] < alone["ap50"] and 0.4 < alone["mean_iou"] < 1
    for key, r in results.items():
        assert r == alone, key
    # the same batches with every item scored: the partners' predictions now count too
    everyone = [(nested, targets) for nested, targets, _ in comps["beside_largest"]]
    assert evaluate(_ItemwiseDetector(), everyone, criterion, task, DistContext()) != alone
    # the model is left in the mode it came in (a model in eval mode stays there, its batch norm's
    # running statistics untouched by the next forward)
    for training in (False, True):
        model = _ItemwiseDetector().train(training)
        evaluate(model, comps["batch1"], criterion, task, DistContext())
        assert model.training is training
