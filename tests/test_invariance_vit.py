"""padding_invariant=True for timm's global-attention vision transformers (VisionTransformer and
Eva: ViT, DINOv3, EVA-02, RoPE ViTs): an item of a padded batch gets, on its own tokens, what the
model gives it alone, in eval and training, outputs and parameter gradients, in float64."""

import pytest
import torch

from vispos import NestedTensor, nested_tensor_from_tensor_list
from vispos.backbones import TimmBackbone

TINY = {"depth": 2, "embed_dim": 32, "num_heads": 2}

# item sizes: none a multiple of the patch (16; EVA-02's is 14)
SIZES = [(37, 53), (61, 29), (50, 50)]


def _images(seed=0, sizes=SIZES, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(3, *s, generator=g, dtype=dtype) for s in sizes]


def _backbone(name, out_indices=(0, 1), dtype=torch.float64, **kwargs):
    torch.manual_seed(0)
    model_kwargs = {**TINY, **kwargs} if "eva02" not in name else {"depth": 2, **kwargs}
    return TimmBackbone(name, out_indices=out_indices, padding_invariant=True, model_kwargs=model_kwargs).to(dtype)


def _alone(backbone, image):
    return backbone(NestedTensor(image[None], None))


@pytest.mark.parametrize("position", [0, 1, 2])
def test_vit_item_alone_equal_at_every_position(position):
    bb = _backbone("vit_small_patch16_224").eval()
    images = _images()
    order = [images[(k - position) % 3] for k in range(3)]  # item 0 of `images` at `position`
    with torch.no_grad():
        levels = bb(nested_tensor_from_tensor_list(order))
        alone = _alone(bb, images[0])
        stock = TimmBackbone("vit_small_patch16_224", out_indices=(0, 1), model_kwargs=TINY)
        stock.load_state_dict(bb.state_dict())
        stock_alone = stock.double().eval()(NestedTensor(images[0][None], None))
    assert len(levels) == 2
    for level, ref, ref_stock in zip(levels, alone, stock_alone):
        h, w = ref.tensors.shape[2:]
        assert (h, w) == (3, 4)  # ceil(37 / 16), ceil(53 / 16): dynamic_img_pad
        assert level.padding.sizes[position] == (h, w)
        torch.testing.assert_close(ref.tensors, ref_stock.tensors, rtol=0, atol=0)  # alone: timm's own forward
        torch.testing.assert_close(level.tensors[position, :, :h, :w], ref.tensors[0], rtol=1e-12, atol=1e-12)
        assert not level.tensors[position][:, level.padding.mask[position]].any()  # zeros on padding
