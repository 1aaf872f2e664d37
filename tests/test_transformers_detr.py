"""transformers' DETR, Conditional DETR and Deformable DETR through ``vispos.make_padding_invariant``
(vispos/invariance/models/transformers_detr.py): ``pixel_values`` and ``pixel_mask`` in, the model's
own output class out; each image in a padded batch gets the logits and boxes it gets alone (and
the stock model's, which pads nothing alone); training losses and gradients unchanged by padding.
Small configs built locally (timm resnet18 backbone, no pretrained weights), float64, trained-like
frozen batch-norm statistics, eval unless said.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("timm")

import vispos  # noqa: E402
from trained_norms import trained_like  # noqa: E402
from vispos.invariance.models.transformers_detr import InvariantDetr  # noqa: E402

SIZES = [(64, 96), (50, 70), (37, 45)]
_SMALL = dict(use_timm_backbone=True, backbone="resnet18", use_pretrained_backbone=False, d_model=64, encoder_layers=1,
              decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
              decoder_ffn_dim=64, num_queries=10, num_labels=5, dropout=0.0)
FAMILIES = {
    "detr": ("DetrConfig", "DetrForObjectDetection", {}),
    "conditional": ("ConditionalDetrConfig", "ConditionalDetrForObjectDetection", {}),
    "deformable": ("DeformableDetrConfig", "DeformableDetrForObjectDetection",
                   {"encoder_n_points": 2, "decoder_n_points": 2}),
}
_BUILT: dict[str, tuple] = {}


def _built(family: str, dtype: torch.dtype = torch.float64) -> tuple:
    if (family, dtype) not in _BUILT:
        config, cls, extra = FAMILIES[family]
        torch.manual_seed(0)
        model = getattr(transformers, cls)(getattr(transformers, config)(**_SMALL, **extra))
        model = trained_like(model.to(dtype)).eval()
        _BUILT[family, dtype] = (model, vispos.make_padding_invariant(model))
    return _BUILT[family, dtype]


def _batch(images, canvas=None):
    canvas = canvas or (max(i.shape[1] for i in images), max(i.shape[2] for i in images))
    values = torch.zeros(len(images), 3, *canvas, dtype=images[0].dtype)
    mask = torch.zeros(len(images), *canvas, dtype=torch.long)
    for i, image in enumerate(images):
        values[i, :, :image.shape[1], :image.shape[2]] = image
        mask[i, :image.shape[1], :image.shape[2]] = 1
    return values, mask


def _images(seed: int = 0, sizes=SIZES) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(3, h, w, generator=g, dtype=torch.float64) for h, w in sizes]


@pytest.mark.parametrize("family", ["detr", pytest.param("conditional", marks=pytest.mark.exhaustive), "deformable"])
def test_image_alone_equals_image_in_padded_batch_and_stock_alone(family):
    model, inv = _built(family)
    assert isinstance(inv, InvariantDetr)
    images = _images()
    with torch.no_grad():
        out = inv(*_batch(images))
        assert type(out) is type(model(images[0][None]))
        reordered = inv(*_batch(images[::-1]))
        stock_batch = model(*_batch(images))
        for i, image in enumerate(images):
            stock = model(image[None])
            for got in (out, ):
                torch.testing.assert_close(got.logits[i:i + 1], stock.logits)
                torch.testing.assert_close(got.pred_boxes[i:i + 1], stock.pred_boxes)
            j = len(images) - 1 - i
            torch.testing.assert_close(reordered.logits[j:j + 1], stock.logits)
        # the leak removed: the stock model gives the second image other logits in this batch
        assert (stock_batch.logits[1:2] - model(images[1][None]).logits).abs().max() > 1e-3


def test_training_losses_and_gradients_unchanged_by_padding():
    """float32: transformers' DETR loss builds its class weights in float32. No dropout: its draws follow
    the sequence length, which is the canvas's."""
    model, inv = _built("detr", torch.float32)
    images = [image.float() for image in _images(1, SIZES[:2])]
    labels = [{"class_labels": torch.tensor([1, 3]), "boxes": torch.tensor([[0.5, 0.5, 0.4, 0.3], [0.3, 0.6, 0.2, 0.2]])},
              {"class_labels": torch.tensor([2]), "boxes": torch.tensor([[0.4, 0.4, 0.5, 0.5]])}]

    def step(canvas):
        out = inv(*_batch(images, canvas), labels=labels)
        params = [p for p in model.parameters() if p.requires_grad]
        return out.loss, torch.autograd.grad(out.loss, params, allow_unused=True)

    inv.train()
    try:
        loss, grads = step((64, 96))
        more, more_grads = step((96, 160))
    finally:
        inv.eval()
    assert model.training is False
    torch.testing.assert_close(more, loss)
    for a, b in zip(more_grads, grads):
        if a is not None or b is not None:
            torch.testing.assert_close(a, b)


def test_deformable_extra_level_mask_that_differs_from_the_images_refused():
    _, inv = _built("deformable")
    images = _images(3, [(64, 110), (40, 60)])
    with torch.no_grad(), pytest.raises(ValueError, match="pad the batch to a multiple of the level's stride"):
        inv(*_batch(images, (64, 160)))


def test_wrapper_shares_the_model():
    model, inv = _built("detr")
    assert inv.state_dict().keys() == model.state_dict().keys()
    assert inv.model is model.model and "network=DetrForObjectDetection" in repr(inv)


@pytest.mark.exhaustive
def test_bare_detr_model_wrapped_too():
    torch.manual_seed(0)
    model = trained_like(transformers.DetrModel(transformers.DetrConfig(**_SMALL)).double()).eval()
    inv = vispos.make_padding_invariant(model)
    assert isinstance(inv, InvariantDetr)
    images = _images(4, SIZES[:2])
    with torch.no_grad():
        out = inv(*_batch(images))
        for i, image in enumerate(images):
            torch.testing.assert_close(out.last_hidden_state[i:i + 1], model(image[None]).last_hidden_state)
