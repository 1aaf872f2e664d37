"""torchvision's segmenters (FCN, DeepLabV3, LR-ASPP) through ``vispos.make_padding_invariant``
(the graph rewrite, with DeepLabV3's ASPPPooling row of vispos/invariance/models/
torchvision_segmentation.py): a NestedTensor in, the model's dict with each map as a NestedTensor,
each image up-sampled to its own size, equal to the image alone through the stock model; training
losses and gradients unchanged by padding. Float64, trained-like norm statistics.
"""

from __future__ import annotations

import pytest
import torch

segmentation = pytest.importorskip("torchvision.models.segmentation")

import vispos  # noqa: E402
from trained_norms import trained_like  # noqa: E402
from vispos.invariance.models.torchvision_segmentation import aspp_pooling  # noqa: E402

SIZES = [(64, 96), (50, 70), (37, 45)]
NAMES = [pytest.param("fcn_resnet50", marks=pytest.mark.exhaustive), "deeplabv3_mobilenet_v3_large",
         "lraspp_mobilenet_v3_large"]
_BUILT: dict[str, tuple] = {}


def _built(name: str) -> tuple:
    if name not in _BUILT:
        torch.manual_seed(0)
        kwargs = {"aux_loss": True} if name.startswith("fcn") else {}
        model = getattr(segmentation, name)(weights=None, weights_backbone=None, num_classes=3, **kwargs)
        model = trained_like(model.double()).eval()
        _BUILT[name] = (model, vispos.make_padding_invariant(model))
    return _BUILT[name]


def _images(seed: int = 0, sizes=SIZES) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(3, h, w, generator=g, dtype=torch.float64) for h, w in sizes]


@pytest.mark.parametrize("name", NAMES)
def test_image_alone_equals_image_in_padded_batch_and_stock_alone(name):
    model, inv = _built(name)
    images = _images()
    with torch.no_grad():
        batch = inv(vispos.nested_tensor_from_tensor_list(images))
        reordered = inv(vispos.nested_tensor_from_tensor_list(images[::-1]))
        assert batch.keys() == model(images[0][None]).keys()
        for i, image in enumerate(images):
            h, w = image.shape[1:]
            stock = model(image[None])
            for key, out in batch.items():
                assert isinstance(out, vispos.NestedTensor) and out.padding.sizes[i] == (h, w)
                torch.testing.assert_close(out.tensors[i:i + 1, :, :h, :w], stock[key])
                j = len(images) - 1 - i
                torch.testing.assert_close(reordered[key].tensors[j:j + 1, :, :h, :w], stock[key])


def test_stock_segmenter_depends_on_its_batch():
    model, _ = _built("deeplabv3_mobilenet_v3_large")
    images = _images()
    with torch.no_grad():
        batch = model(vispos.nested_tensor_from_tensor_list(images).tensors)["out"]
        alone = model(images[1][None])["out"]
    assert (batch[1:2, :, :50, :70] - alone).abs().max() > 1e-3


def test_aspp_pooling_averages_each_item_over_its_own_cells():
    from torchvision.models.segmentation.deeplabv3 import ASPPPooling

    torch.manual_seed(0)
    module = trained_like(ASPPPooling(4, 6).double()).eval()
    x = torch.randn(2, 4, 9, 11, dtype=torch.float64)
    padding = vispos.Padding.from_sizes([(9, 11), (5, 7)], (9, 11))
    with torch.no_grad():
        out = aspp_pooling(module, x, padding)
        torch.testing.assert_close(out[1:, :, :5, :7], module(x[1:, :, :5, :7]))
        torch.testing.assert_close(out[:1], module(x[:1]))
        torch.testing.assert_close(aspp_pooling(module, x, None), module(x))


@pytest.mark.parametrize("name", ["lraspp_mobilenet_v3_large",
                                  pytest.param("deeplabv3_mobilenet_v3_large", marks=pytest.mark.exhaustive)])
def test_training_losses_and_gradients_unchanged_by_padding(name):
    model, inv = _built(name)
    images = _images(1, SIZES[:2])
    g = torch.Generator().manual_seed(2)
    labels = [torch.randint(0, 3, image.shape[1:], generator=g) for image in images]

    def step(canvas):
        batch = vispos.nested_tensor_from_tensor_list(images)
        tensors = torch.nn.functional.pad(batch.tensors, (0, canvas[1] - batch.tensors.shape[-1],
                                                          0, canvas[0] - batch.tensors.shape[-2]))
        mask = torch.ones(tensors.shape[0], *canvas, dtype=torch.bool)
        for i, image in enumerate(images):
            mask[i, :image.shape[1], :image.shape[2]] = False
        torch.manual_seed(1)
        out = inv(tensors, mask)["out"].tensors
        loss = sum(torch.nn.functional.cross_entropy(out[i:i + 1, :, :lab.shape[0], :lab.shape[1]], lab[None])
                   for i, lab in enumerate(labels))
        params = [p for p in model.parameters() if p.requires_grad]
        return loss, torch.autograd.grad(loss, params)

    dropouts = [m for m in model.modules() if isinstance(m, torch.nn.Dropout)]
    for m in dropouts:  # DeepLabV3's ASPP: its draws follow the canvas's shape, padding or not
        m.p = 0.0
    model.train()
    try:
        loss, grads = step((64, 96))
        more, more_grads = step((96, 128))
    finally:
        model.eval()
        for m in dropouts:
            m.p = 0.5
    torch.testing.assert_close(more, loss)
    for a, b in zip(more_grads, grads):
        torch.testing.assert_close(a, b)
