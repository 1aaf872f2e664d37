"""AnySizeViT on padded batches whose items start at offsets that are not
multiples of the patch size (MONAI's symmetric padding): each item is moved to the origin, cut
into the patches it gets alone, and its outputs moved back; float64, eval and train, outputs and
gradients equal the item's alone. A mask without boxes at such offsets is refused by name. AnySizeUNETR's
logits and gradients at such offsets: the "off_grid" layout of tests/test_monai_decoder.py."""

import copy

import pytest
import torch
from torch.testing import assert_close

pytest.importorskip("monai")

from item_alone import assert_same_gradients, region  # noqa: E402
from vispos import NestedTensor, Padding  # noqa: E402
from vispos.monai import AnySizeViT  # noqa: E402

F64 = torch.float64
VIT_KW = dict(in_channels=1, img_size=(16, 16, 16), patch_size=(4, 4, 4), hidden_size=24, mlp_dim=16, num_layers=2,
              num_heads=2)
#: items at (6, 3, 0) and (0, 7, 5), sizes not multiples of the patch, beside a larger item at the origin
SIZES = [(13, 9, 7), (10, 22, 11), (30, 29, 17)]
STARTS = [(6, 3, 0), (0, 7, 5), (0, 0, 0)]
CANVAS = (30, 32, 17)


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    items = [torch.randn((1, *s), generator=g, dtype=F64) for s in SIZES]
    images = torch.full((len(SIZES), 1, *CANVAS), 5.0, dtype=F64)
    for b, (item, start) in enumerate(zip(items, STARTS)):
        images[(b, slice(None), *region(start, item.shape[1:]))] = item
    return items, images, Padding.from_sizes(SIZES, CANVAS, starts=STARTS)


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("pos_embed_type", ["learnable", "sincos"])
def test_vit_items_off_the_patch_grid_get_their_features_alone(train, pos_embed_type):
    """Item ``b``'s tokens lie on the patch cells from ``start // 4``, ``ceil(size / 4)`` of them,
    as :meth:`token_mask` marks; there they equal the item's alone (every block's output too)."""
    torch.manual_seed(0)
    net = AnySizeViT(**VIT_KW, pos_embed_type=pos_embed_type).to(F64).train(train)
    twin = copy.deepcopy(net)
    items, images, padding = _batch(1)
    x = NestedTensor(images, padding)
    out, hidden = net(x)
    grid = tuple(-(-s // 4) for s in CANVAS)
    cells = net.token_mask(x)
    assert cells.shape == (len(SIZES), *grid)
    for b, (item, start) in enumerate(zip(items, STARTS)):
        alone, alone_hidden = twin(item[None])
        size = tuple(-(-s // 4) for s in item.shape[1:])
        box = region(tuple(a // 4 for a in start), size)
        want = torch.ones(grid, dtype=torch.bool)
        want[box] = False
        assert torch.equal(cells[b], want)
        for got_t, alone_t in zip([out, *hidden], [alone, *alone_hidden]):
            got = got_t[b].reshape(*grid, -1)[box].reshape(-1, got_t.shape[-1])
            assert_close(got, alone_t[0], rtol=1e-10, atol=1e-10)
        if train and b == 1:
            weights = torch.randn(alone.shape, generator=torch.Generator().manual_seed(b), dtype=F64)
            (alone * weights).sum().backward()
            got = out[b].reshape(*grid, -1)[box].reshape(1, -1, out.shape[-1])
            (got * weights).sum().backward(retain_graph=True)
            assert_same_gradients(net, twin)


def test_vit_class_token_off_the_patch_grid():
    torch.manual_seed(0)
    net = AnySizeViT(**VIT_KW, classification=True, num_classes=3).to(F64).eval()
    items, images, padding = _batch(2)
    with torch.no_grad():
        out, _ = net(NestedTensor(images, padding))
        for b, item in enumerate(items):
            assert_close(out[b], net(item[None])[0][0], rtol=1e-10, atol=1e-10)


def test_a_mask_without_boxes_off_the_patch_grid_is_refused():
    torch.manual_seed(0)
    net = AnySizeViT(**VIT_KW).to(F64).eval()
    _, images, padding = _batch()
    arbitrary = Padding.from_mask(padding.mask, classify=False)
    with pytest.raises(ValueError, match=r"AnySizeViT: .*not a multiple of the patch size .*classify=True"):
        net(NestedTensor(images, arbitrary))
    # the same mask read for its boxes runs, and gives the numbers of the rectangular padding
    classified = Padding.from_mask(padding.mask, classify=True)
    assert classified.kind == "rectangular"
    with torch.no_grad():
        assert_close(net(NestedTensor(images, classified))[0], net(NestedTensor(images, padding))[0], rtol=0, atol=0)
