"""Windowed vision transformers on padded batches: timm's SAM / ViTDet ViT gives every item, on
its own tokens, what the invariant model gives it alone (windows aligned at the item's origin,
keys outside the item masked); Swin is refused by name where it is not exact; the simple feature
pyramid is exact through the rule book."""

import pytest
import torch

timm = pytest.importorskip("timm")

from vispos.invariance import _windowed as windowed  # noqa: E402

SAM_TINY = dict(img_size=64, patch_size=8, embed_dim=32, depth=4, num_heads=2, global_attn_indexes=(1, 3),
                window_size=3, neck_chans=16)


def _randomise(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every parameter drawn at random (timm initialises the position tables and biases to zero,
    which would hide a wrong table or a leaking zero token)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.5)
    return model


def _sam(**kwargs):
    torch.manual_seed(0)
    cfg = dict(SAM_TINY, **kwargs)
    model = timm.create_model("samvit_base_patch16", features_only=True, out_indices=(1, 3), **cfg)
    return _randomise(model.double())


def _batch(items, pad_value=3.0):
    """Items (C, h, w) at the origin of one canvas; padding filled with ``pad_value``."""
    height = max(t.shape[1] for t in items)
    width = max(t.shape[2] for t in items)
    canvas = torch.full((len(items), items[0].shape[0], height, width), pad_value, dtype=items[0].dtype)
    for b, t in enumerate(items):
        canvas[b, :, :t.shape[1], :t.shape[2]] = t
    return canvas, [tuple(t.shape[1:]) for t in items]


def _items(seed=1, sizes=((40, 56), (64, 61), (27, 33))):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(3, h, w, generator=g, dtype=torch.float64) for h, w in sizes]


def _run(model, x, sizes):
    return windowed.sam_forward_intermediates(model.model, x, sizes, model.out_indices)


@pytest.mark.parametrize("position", [0, 1, 2])
def test_sam_item_in_batch_equals_item_alone_eval(position):
    model = _sam().eval()
    items = _items()
    item = items.pop(0)
    items.insert(position, item)  # 5 x 7 tokens: windows of 3 straddle its edge on both axes
    x, sizes = _batch(items)
    with torch.no_grad():
        batch, tokens = _run(model, x, sizes)
        alone, alone_tokens = _run(model, item[None], None)
    assert tokens[position] == alone_tokens[0] == (5, 7)
    for level, ref in zip(batch, alone):
        torch.testing.assert_close(level[position, :, :5, :7], ref[0], rtol=1e-10, atol=1e-10)


def test_sam_item_in_batch_equals_item_alone_training_outputs_and_gradients():
    model = _sam().train()
    items = _items()
    x, sizes = _batch(items)
    g = torch.Generator().manual_seed(2)
    weights = [torch.randn(2, 32, 8, 8, generator=g, dtype=torch.float64)]
    for index in range(len(items)):
        model.zero_grad()
        batch, tokens = _run(model, x, sizes)
        h, w = tokens[index]
        loss = sum((level[index, :, :h, :w] * weights[0][0, :, :h, :w]).sum() for level in batch)
        loss.backward()
        grads_batch = {n: p.grad.clone() for n, p in model.named_parameters()}
        model.zero_grad()
        alone, _ = _run(model, items[index][None], None)
        for level, ref in zip(batch, alone):
            torch.testing.assert_close(level[index, :, :h, :w], ref[0], rtol=1e-10, atol=1e-10)
        loss = sum((level[0] * weights[0][0, :, :h, :w]).sum() for level in alone)
        loss.backward()
        for n, p in model.named_parameters():
            torch.testing.assert_close(grads_batch[n], p.grad, rtol=1e-9, atol=1e-9, msg=n)


def test_sam_whole_windows_equal_the_stock_model():
    """On a grid that is a whole number of windows nothing is masked alone: the stock model."""
    model = _sam().eval()
    item = _items(sizes=((48, 72),))[0][None]  # 6 x 9 tokens, windows of 3
    with torch.no_grad():
        ours, _ = _run(model, item, None)
        stock = model(item)
    for a, b in zip(ours, stock):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_sam_global_blocks_equal_the_stock_model_at_any_size():
    """Global blocks (relative tables resampled to the item's grid) are the stock model's."""
    model = _sam(global_attn_indexes=(0, 1, 2, 3)).eval()
    item = _items(sizes=((40, 56),))[0][None]
    with torch.no_grad():
        ours, _ = _run(model, item, None)
        stock = model(item)
    for a, b in zip(ours, stock):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_sam_edge_windows_differ_from_the_stock_model_alone():
    """The documented difference: stock attends to the zero tokens that pad windows."""
    model = _sam().eval()
    item = _items(sizes=((40, 56),))[0][None]
    with torch.no_grad():
        ours, _ = _run(model, item, None)
        stock = model(item)
    assert (ours[0] - stock[0]).abs().max() > 1e-3


def test_sam_neck_is_exact():
    torch.manual_seed(0)
    model = _randomise(timm.create_model("samvit_base_patch16", **SAM_TINY).double()).eval()
    items = _items()
    x, sizes = _batch(items)
    whole = _items(sizes=((48, 72),))[0][None]
    with torch.no_grad():
        stock = model.forward_intermediates(whole, indices=[3], norm=True, intermediates_only=True)
        ours, _ = windowed.sam_forward_intermediates(model, whole, None, [3], norm=True)
        torch.testing.assert_close(ours[0], stock[0], rtol=1e-10, atol=1e-10)
        batch, tokens = windowed.sam_forward_intermediates(model, x, sizes, [3], norm=True)
        for index, item in enumerate(items):
            alone, _ = windowed.sam_forward_intermediates(model, item[None], None, [3], norm=True)
            h, w = tokens[index]
            assert batch[0].shape[1] == 16
            torch.testing.assert_close(batch[0][index, :, :h, :w], alone[0][0], rtol=1e-10, atol=1e-10)


def test_sam_padding_values_do_not_matter():
    model = _sam().eval()
    items = _items()
    with torch.no_grad():
        a, tokens = _run(model, *_batch(items, pad_value=0.0))
        b, _ = _run(model, *_batch(items, pad_value=float("nan")))
    for la, lb in zip(a, b):
        for index, (h, w) in enumerate(tokens):
            torch.testing.assert_close(la[index, :, :h, :w], lb[index, :, :h, :w], rtol=0, atol=0)


def test_sam_refuses_rope_and_token_dropout_by_name():
    model = timm.create_model("samvit_base_patch16", use_rope=True, use_rel_pos=False, **SAM_TINY)
    with pytest.raises(ValueError, match=r"VisionTransformerSAM\.rope_global"):
        windowed.check_sam(model)
    model = timm.create_model("samvit_base_patch16", patch_drop_rate=0.5, **SAM_TINY)
    with pytest.raises(ValueError, match=r"VisionTransformerSAM\.patch_drop"):
        windowed.check_sam(model)


def test_sam_item_smaller_than_a_patch_is_refused():
    model = _sam().eval()
    x, sizes = _batch(_items(sizes=((40, 56), (5, 30))))
    with pytest.raises(ValueError, match=r"item 1 of size \(5, 30\) is smaller than one patch"):
        _run(model, x, sizes)
