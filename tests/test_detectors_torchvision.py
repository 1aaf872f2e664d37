"""torchvision's detectors through ``vispos.make_padding_invariant`` (vispos/invariance/models/
torchvision_detection.py, _pyramid.py, _parts.py): each image in a padded batch of images of
other sizes, in any order, gets the detections it gets alone; an image whose size is a multiple of
the transform's size_divisible gets the stock model's detections alone; in training the losses and
gradients do not change with padding. Float64, trained-like norm statistics, eval unless said.
"""

from __future__ import annotations

import types

import pytest
import torch

detection = pytest.importorskip("torchvision.models.detection")

import vispos  # noqa: E402
from trained_norms import trained_like  # noqa: E402
from vispos.invariance.models.torchvision_detection import InvariantDetector  # noqa: E402

#: after the transform (min_size 64, max_size 128) each image keeps its size; the first is a
#: multiple of 32, the others are not, so every batch is padded
SIZES = [(64, 96), (64, 70), (50, 128)]
NAMES = ["fasterrcnn_resnet50_fpn", "retinanet_resnet50_fpn", "fcos_resnet50_fpn", "maskrcnn_resnet50_fpn",
         "keypointrcnn_resnet50_fpn"]
#: the default run's representatives (a two-stage and a dense detector); the rest: -m exhaustive
DEFAULT = [n if n in ("fasterrcnn_resnet50_fpn", "retinanet_resnet50_fpn") else pytest.param(n, marks=pytest.mark.exhaustive)
           for n in NAMES]
_BUILT: dict[str, tuple] = {}


def _model(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    small = {"rpn_pre_nms_top_n_train": 300, "rpn_post_nms_top_n_train": 100, "rpn_pre_nms_top_n_test": 1000,
             "rpn_post_nms_top_n_test": 1000, "box_batch_size_per_image": 64,
             "box_detections_per_img": 20} if "rcnn" in name else {}
    model = getattr(detection, name)(weights=None, weights_backbone=None, num_classes=5, min_size=64, max_size=128,
                                     **small)
    owner = getattr(model, "roi_heads", model)  # untrained scores sit below the default thresholds
    owner.score_thresh = 0.0
    return trained_like(model.double()).eval()


def _built(name: str) -> tuple:
    if name not in _BUILT:
        model = _model(name)
        _BUILT[name] = (model, vispos.make_padding_invariant(model))
    return _BUILT[name]


def _images(seed: int = 0, sizes=SIZES) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(3, h, w, generator=g, dtype=torch.float64) for h, w in sizes]


def _assert_same(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for key in want:
        torch.testing.assert_close(got[key], want[key], msg=lambda m: f"{key}: {m}")


@pytest.mark.parametrize("name", DEFAULT)
def test_image_alone_equals_image_in_padded_batch(name):
    model, inv = _built(name)
    assert isinstance(inv, InvariantDetector)
    images = _images()
    found = 0
    with torch.no_grad():
        batch, reordered = inv(images), inv(images[::-1])
        for i, image in enumerate(images):
            alone = inv([image])[0]
            found += len(alone["scores"])
            _assert_same(batch[i], alone)
            _assert_same(reordered[len(images) - 1 - i], alone)
        # the first image (64 x 96, a multiple of 32) has no padding alone: the stock model's own
        _assert_same(inv([images[0]])[0], model([images[0]])[0])
    assert found > 0


def test_stock_detector_depends_on_its_batch():
    """The leak the wrapper removes: the stock model gives an image other detections in this batch."""
    model, _ = _built("fasterrcnn_resnet50_fpn")
    images = _images()
    with torch.no_grad():
        batch, alone = model(images)[1], model([images[1]])[0]
    assert batch["scores"].shape != alone["scores"].shape or (batch["scores"] - alone["scores"]).abs().max() > 1e-6


def test_wrapper_shares_the_model():
    model, inv = _built("fasterrcnn_resnet50_fpn")
    assert inv.state_dict().keys() == model.state_dict().keys()
    assert all(a is b for a, b in zip(inv.state_dict(keep_vars=True).values(),
                                      model.state_dict(keep_vars=True).values()))
    assert inv.backbone is model.backbone and inv.roi_heads is model.roi_heads
    assert "network=FasterRCNN" in repr(inv)


def _targets(sizes, masks: bool, keypoints: bool = False) -> list[dict]:
    boxes = [[[10.0, 10.0, 40.0, 50.0], [50.0, 20.0, 90.0, 60.0]], [[5.0, 5.0, 60.0, 30.0]],
             [[20.0, 4.0, 120.0, 40.0]]]
    targets = []
    for (h, w), b in zip(sizes, boxes):
        t = {"boxes": torch.tensor(b, dtype=torch.float64), "labels": torch.arange(1, len(b) + 1)}
        if keypoints:  # 17 keypoints at each box's centre, visible
            centre = torch.tensor([[(x0 + x1) / 2, (y0 + y1) / 2, 1.0] for x0, y0, x1, y1 in b])  # float32: torchvision's check
            t["keypoints"] = centre[:, None, :].repeat(1, 17, 1)
        if masks:
            t["masks"] = torch.zeros(len(b), h, w, dtype=torch.uint8)
            for j, (x0, y0, x1, y1) in enumerate(torch.tensor(b).long().tolist()):
                t["masks"][j, y0:y1, x0:x1] = 1
        targets.append(t)
    return targets


def _losses_and_grads(model, inv, images, targets, extra: int):
    """One training step's losses and gradients, the batch canvas grown by ``extra`` cells on
    each axis (padding only: each image's own size and canvas stay as they are)."""
    stock = type(model.transform).batch_images

    def batch_images(self, imgs, size_divisible=32):
        return torch.nn.functional.pad(stock(self, imgs, size_divisible), (0, extra, 0, extra))

    model.transform.batch_images = types.MethodType(batch_images, model.transform)
    try:
        torch.manual_seed(1)  # the samplers draw alike
        losses = inv(images, targets)
        params = [p for p in model.parameters() if p.requires_grad]
        grads = torch.autograd.grad(sum(losses.values()), params, allow_unused=True)
    finally:
        del model.transform.batch_images
    return losses, grads


@pytest.mark.parametrize("name", DEFAULT)
def test_training_losses_and_gradients_unchanged_by_padding(name):
    model, inv = _built(name)
    sizes = SIZES[:2]
    images = _images(1, sizes)
    targets = _targets(sizes, masks=name.startswith("mask"), keypoints=name.startswith("keypoint"))
    inv.train()
    try:
        losses, grads = _losses_and_grads(model, inv, images, targets, 0)
        more, more_grads = _losses_and_grads(model, inv, images, targets, 64)
    finally:
        inv.eval()
    assert losses.keys() == more.keys()
    for key in losses:
        torch.testing.assert_close(more[key], losses[key])
    for g, h in zip(grads, more_grads):
        if g is not None or h is not None:
            torch.testing.assert_close(h, g)


@pytest.mark.exhaustive
@pytest.mark.parametrize("name", NAMES)
def test_image_alone_equals_image_in_larger_batches(name):
    model, inv = _built(name)
    images = _images(2, [(64, 128), (40, 60), (96, 75), (33, 100)])
    with torch.no_grad():
        batch = inv(images)
        for i, image in enumerate(images):
            _assert_same(batch[i], inv([image])[0])
        _assert_same(inv([images[0]])[0], model([images[0]])[0])


def test_hooked_part_refused():
    model, inv = _built("fasterrcnn_resnet50_fpn")
    handle = model.rpn.register_forward_hook(lambda *a: None)
    try:
        with pytest.raises(ValueError, match=r"rpn \(RegionProposalNetwork\) has a forward hook"):
            inv(_images())
    finally:
        handle.remove()


def test_canvas_not_a_multiple_of_the_deepest_stride_refused():
    model, inv = _built("fasterrcnn_resnet50_fpn")
    model.transform.size_divisible = 1
    try:
        with torch.no_grad(), pytest.raises(ValueError, match="multiple of the body's deepest stride"):
            inv(_images(sizes=[(64, 70), (64, 100)]))
    finally:
        model.transform.size_divisible = 32


def test_backbone_without_pyramid_refused():
    from torchvision.models.detection.anchor_utils import AnchorGenerator
    from torchvision.ops import MultiScaleRoIAlign

    body = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2, padding=1), torch.nn.ReLU())
    body.out_channels = 8
    model = detection.FasterRCNN(body, num_classes=3, rpn_anchor_generator=AnchorGenerator(((16,),), ((1.0,),)),
                                 box_roi_pool=MultiScaleRoIAlign(["0"], 7, 2))
    with pytest.raises(ValueError, match=r"feature pyramid \(BackboneWithFPN: body and fpn\), got Sequential"):
        vispos.make_padding_invariant(model)


def test_import_vispos_imports_no_detection_package():
    import subprocess
    import sys

    code = ("import sys, vispos, vispos.invariance; "
            "print(any(m.startswith(('torchvision.models.detection', 'transformers')) for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_backbone_with_fpn_alone_equals_in_batch_and_stock():
    from torchvision.models.detection.backbone_utils import resnet_fpn_backbone

    from vispos.invariance.models._pyramid import InvariantBackboneWithFPN

    torch.manual_seed(0)
    backbone = trained_like(resnet_fpn_backbone(backbone_name="resnet18", weights=None).double()).eval()
    inv = vispos.make_padding_invariant(backbone)
    assert isinstance(inv, InvariantBackboneWithFPN) and inv.state_dict().keys() == backbone.state_dict().keys()
    images = _images(sizes=[(64, 96), (50, 70), (37, 45)])
    with torch.no_grad():
        batch = inv(vispos.nested_tensor_from_tensor_list(images))
        for i, image in enumerate(images):
            alone = inv(vispos.nested_tensor_from_tensor_list([image]))
            assert list(alone) == ["0", "1", "2", "3", "pool"]
            for name, level in alone.items():
                h, w = level.padding.sizes[0]
                assert batch[name].padding.sizes[i] == (h, w)
                torch.testing.assert_close(batch[name].tensors[i, :, :h, :w], level.tensors[0, :, :h, :w])
        stock = backbone(images[0][None])
        alone = inv(vispos.nested_tensor_from_tensor_list(images[:1]))
        for name in stock:
            torch.testing.assert_close(alone[name].tensors, stock[name])
    with pytest.raises(ValueError, match="boxes at the origin"):
        mask = torch.ones(1, 64, 96, dtype=torch.bool)
        mask[:, 10:40, 10:40] = False
        inv(torch.rand(1, 3, 64, 96, dtype=torch.float64), mask)


def test_a_rule_book_given_for_the_call_reaches_the_parts():
    """make_padding_invariant(model, rules=book) on a whole model: the parts the wrapper makes
    invariant (the FPN backbone's body here) ask that book, not the global one."""
    from torchvision.models.detection.backbone_utils import resnet_fpn_backbone

    backbone = resnet_fpn_backbone(backbone_name="resnet18", weights=None, trainable_layers=5).double().eval()
    book = vispos.invariance.default_rules().copy()
    book.register(torch.nn.ReLU, vispos.Refuse("refused by this call's book"))
    with pytest.raises(ValueError, match="refused by this call's book"):
        vispos.make_padding_invariant(backbone, rules=book)
    vispos.make_padding_invariant(backbone)  # the global book is untouched


def test_num_axes_for_a_whole_model_refused():
    model, _ = _built("fasterrcnn_resnet50_fpn")
    with pytest.raises(ValueError, match=r"as a whole model, which reads num_axes .* got num_axes=3"):
        vispos.make_padding_invariant(model, num_axes=3)
