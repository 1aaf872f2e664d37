"""padding_invariant=True for timm's global-attention vision transformers (VisionTransformer and
Eva: ViT, DINOv3, EVA-02, RoPE ViTs): an item of a padded batch gets, on its own tokens, what the
model gives it alone, in eval and training, outputs and parameter gradients, in float64."""

import copy
import pickle

import pytest
import timm
import torch

from vispos import NestedTensor, Padding, PositionEmbeddingSine, nested_tensor_from_tensor_list
from vispos.backbones import Joiner, TimmBackbone
from vispos.invariance import TokenModelRule, rule_for

from item_alone import assert_copies_give

TINY = {"depth": 2, "embed_dim": 32, "num_heads": 2}

# name -> (timm model name, model_kwargs): every variant of the promise
FAMILIES = {
    "vit": ("vit_small_patch16_224", TINY),
    "vit_registers": ("vit_small_patch16_224", {**TINY, "reg_tokens": 3}),
    "vit_no_embed_class": ("vit_small_patch16_224", {**TINY, "reg_tokens": 2, "no_embed_class": True}),
    "vit_gap_no_class": ("vit_small_patch16_224", {**TINY, "class_token": False, "global_pool": "avg"}),
    "vit_no_pos_embed": ("vit_small_patch16_224", {**TINY, "pos_embed": "none"}),
    "deit3": ("deit3_small_patch16_224", TINY),
    "dinov3": ("vit_small_patch16_dinov3", TINY),
    "eva02": ("eva02_tiny_patch14_224", {"depth": 2}),
    "rope_vit": ("vit_small_patch16_rope_224", TINY),
    "rope_mixed_vit": ("vit_small_patch16_rope_mixed_224", TINY),
}

# item sizes: none a multiple of the patch (16; EVA-02's is 14); the first is the item under test
SIZES = [(37, 53), (61, 29), (50, 50)]


def _images(seed=0, sizes=SIZES, dtype=torch.float64, channels=3):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(channels, *s, generator=g, dtype=dtype) for s in sizes]


def _backbone(family, out_indices=(0, 1), dtype=torch.float64, padding_invariant=True, options=None, **extra):
    name, kwargs = FAMILIES[family]
    torch.manual_seed(0)
    bb = TimmBackbone(name, out_indices=out_indices, padding_invariant=padding_invariant,
                      model_kwargs={**kwargs, **extra}, **(options or {}))
    with torch.no_grad():  # trained-like layer scales (timm starts them at 1e-5: blocks near identity)
        for name, p in bb.named_parameters():
            if name.endswith(("gamma", "gamma_1", "gamma_2")):
                p.fill_(1.0)
    return bb.to(dtype)


def _placed(images, position):
    """The batch with ``images[0]`` at ``position`` and the others around it."""
    return [images[(k - position) % len(images)] for k in range(len(images))]


def _alone(bb, image):
    return bb(NestedTensor(image[None], None))


def _crop(level, index, ref):
    h, w = ref.shape[-2:]
    return level.tensors[index, :, :h, :w]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_item_alone_equal_in_eval_at_every_position(family):
    bb = _backbone(family).eval()
    images = _images()
    stock = _backbone(family, padding_invariant=False).eval()
    stock.load_state_dict(bb.state_dict())
    with torch.no_grad():
        alone = _alone(bb, images[0])
        stock_alone = _alone(stock, images[0])
        stock_batch = stock(nested_tensor_from_tensor_list(images))
        for position in range(3):
            levels = bb(nested_tensor_from_tensor_list(_placed(images, position)))
            assert len(levels) == 2
            for level, ref in zip(levels, alone):
                assert level.padding.sizes[position] == tuple(ref.tensors.shape[2:])
                torch.testing.assert_close(_crop(level, position, ref.tensors), ref.tensors[0], rtol=1e-12, atol=1e-12)
                assert not level.tensors[position][:, level.padding.mask[position]].any()  # zeros on padding
    patch = 14 if family == "eva02" else 16
    for ref, ref_stock, leaky in zip(alone, stock_alone, stock_batch):
        # alone, the invariant backbone is timm's own forward; stock, the padded batch leaks
        assert tuple(ref.tensors.shape[2:]) == (-(-37 // patch), -(-53 // patch))  # dynamic_img_pad: ceil
        torch.testing.assert_close(ref.tensors, ref_stock.tensors, rtol=1e-13, atol=1e-13)
        assert (_crop(leaky, 0, ref.tensors) - ref.tensors[0]).abs().max() > 1e-3


def _grads(bb):
    return {n: p.grad.clone() for n, p in bb.named_parameters() if p.grad is not None}


def _loss(levels, index, refs, weights):
    return sum((_crop(level, index, ref) * w).sum() for level, ref, w in zip(levels, refs, weights))


@pytest.mark.parametrize("family", ["vit", "vit_registers", "dinov3", "eva02", "rope_vit", "rope_mixed_vit"])
def test_item_alone_equal_in_training_outputs_and_gradients(family):
    bb = _backbone(family).train()
    images = _images(1)
    alone = _alone(bb, images[0])
    weights = [torch.randn(a.tensors.shape[1:], dtype=torch.float64) for a in alone]
    bb.zero_grad()
    _loss(alone, 0, [a.tensors for a in alone], weights).backward()
    ref_grads = _grads(bb)
    assert ref_grads
    _assert_alone_at_every_position(bb, images, alone, weights, ref_grads)


def _assert_alone_at_every_position(bb, images, alone, weights, ref_grads):
    """``images[0]`` at every batch position: its levels (on its own grid) and the parameter
    gradients of the weighted loss equal ``alone`` / ``ref_grads``."""
    for position in range(len(images)):
        bb.zero_grad()
        levels = bb(nested_tensor_from_tensor_list(_placed(images, position)))
        for level, ref in zip(levels, alone):
            assert level.padding.sizes[position] == tuple(ref.tensors.shape[2:])
            torch.testing.assert_close(_crop(level, position, ref.tensors), ref.tensors[0].detach(),
                                       rtol=1e-12, atol=1e-12)
        _loss(levels, position, [a.tensors for a in alone], weights).backward()
        grads = _grads(bb)
        assert grads.keys() == ref_grads.keys()
        for name in grads:
            torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-10, atol=1e-12, msg=name)


def test_dinov3_coordinate_augmentation_draws_per_item():
    """In training, DINOv3's RoPE shift / jitter / rescale is drawn once per item, in batch order:
    item ``b`` gets what it gets alone after ``b`` items ran alone before it."""
    aug = {"rope_shift_coords": 0.5, "rope_jitter_coords": 1.5, "rope_rescale_coords": 2.0}
    bb = _backbone("dinov3", **aug).train()
    model = bb.body.model
    assert model.rope.aug_active
    images = _images(2)
    twins = [images[0], images[0].clone(), images[1]]
    for position in range(3):
        order = _placed(images, position)
        torch.manual_seed(7)
        with torch.no_grad():
            levels = bb(nested_tensor_from_tensor_list(order))
        torch.manual_seed(7)
        with torch.no_grad():
            for k in range(position):  # the items before it, each alone
                _alone(bb, order[k])
            alone = _alone(bb, images[0])
        for level, ref in zip(levels, alone):
            torch.testing.assert_close(_crop(level, position, ref.tensors), ref.tensors[0], rtol=1e-12, atol=1e-12)
    # alone, one draw per forward, as timm's own model draws it
    torch.manual_seed(3)
    with torch.no_grad():
        ours = _alone(bb, images[0])[-1].tensors
        torch.manual_seed(3)
        theirs = model.forward_intermediates(images[0][None], indices=[1], intermediates_only=True)[0]
    torch.testing.assert_close(ours, theirs, rtol=1e-13, atol=1e-13)
    # two copies of one image in one batch get two draws (so the draws are per item)
    torch.manual_seed(5)
    with torch.no_grad():
        level = bb(nested_tensor_from_tensor_list(twins))[-1]
    assert (level.tensors[0] - level.tensors[1]).abs().max() > 1e-6


def test_without_dynamic_img_pad_multiples_of_the_patch_are_exact_and_others_refused():
    bb = _backbone("vit", dynamic_img_pad=False).eval()
    images = _images(sizes=[(48, 32), (32, 64)])
    with torch.no_grad():
        levels = bb(nested_tensor_from_tensor_list(images))
        alone = _alone(bb, images[0])
    for level, ref in zip(levels, alone):
        assert tuple(ref.tensors.shape[2:]) == (3, 2)
        torch.testing.assert_close(_crop(level, 0, ref.tensors), ref.tensors[0], rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match=r"item 1 of size \(30, 64\) is not a multiple of the patch"):
        bb(nested_tensor_from_tensor_list(_images(sizes=[(48, 32), (30, 64)])))


def test_an_item_smaller_than_a_patch_is_exact_and_an_empty_item_refused():
    bb = _backbone("vit").eval()
    images = _images(sizes=[(40, 40), (10, 7)])  # one token alone: the patch padded with zeros
    with torch.no_grad():
        levels = bb(nested_tensor_from_tensor_list(images))
        alone = _alone(bb, images[1])
    for level, ref in zip(levels, alone):
        assert tuple(ref.tensors.shape[2:]) == (1, 1)
        torch.testing.assert_close(_crop(level, 1, ref.tensors), ref.tensors[0], rtol=1e-12, atol=1e-12)
    empty = Padding.from_sizes([(40, 40), (0, 40)], (40, 40))
    with pytest.raises(ValueError, match=r"item 1 of size \(0, \d+\) is smaller than one patch"):
        bb(NestedTensor(torch.randn(2, 3, 40, 40, dtype=torch.float64), empty))


def test_items_off_the_origin_and_arbitrary_masks_are_refused():
    bb = _backbone("vit").eval()
    x = torch.randn(2, 3, 48, 48, dtype=torch.float64)
    centred = Padding.from_sizes([(32, 32), (48, 48)], (48, 48), starts="symmetric")
    with pytest.raises(ValueError, match="at the origin"):
        bb(NestedTensor(x, centred))
    holes = torch.zeros(2, 48, 48, dtype=torch.bool)
    holes[0, 10, 10] = True
    with pytest.raises(ValueError, match="arbitrary"):
        bb(NestedTensor(x, holes))


@pytest.mark.parametrize("name, kwargs, match", [
    ("beit_base_patch16_224", {"depth": 2}, r"no padding-invariance rule covers Beit \('beit_base"),  # no rule
    ("cait_xxs24_224", {"depth": 2}, r"no padding-invariance rule covers Cait \('cait_xxs24_224'"),
    ("deit_tiny_distilled_patch16_224", {"depth": 2}, "VisionTransformerDistilled.*overrides VisionTransformer._pos_embed"),
    ("vit_base_r50_s16_224", {"depth": 2}, "patch_embed is HybridEmbed"),
    ("vit_small_patch16_224", {**TINY, "patch_drop_rate": 0.1}, "patch_drop_rate"),
    ("vit_small_patch16_224", {**TINY, "dynamic_img_size": False}, "dynamic_img_size=False"),
])
def test_unknown_families_and_configurations_are_refused_by_name(name, kwargs, match):
    with pytest.raises(ValueError, match=match):
        TimmBackbone(name, padding_invariant=True, model_kwargs=kwargs)


def test_the_rules_are_token_model_rules_of_the_timm_classes():
    for family in ("vit", "dinov3"):
        model = timm.create_model(FAMILIES[family][0], pretrained=False, **FAMILIES[family][1])
        assert isinstance(rule_for(model), TokenModelRule)
    with pytest.raises(TypeError, match="levels must be callable"):
        TokenModelRule(None)


@pytest.mark.parametrize("name, kwargs, index, stride, channels", [
    ("resnet18", {}, 4, 32, 512),
    ("convnext_atto", {}, 3, 32, 320),
    ("vit_small_patch16_224", {"depth": 3}, 2, 16, 384),
    ("vit_small_patch16_dinov3", {"depth": 3}, 2, 16, 384),
    ("eva02_tiny_patch14_224", {"depth": 3}, 2, 14, 192),
    ("vit_small_patch16_rope_224", {"depth": 3}, 2, 16, 384),
    ("samvit_base_patch16", {"depth": 3}, 2, 16, 768),
    ("swin_tiny_patch4_window7_224", {"depths": (1, 1, 1, 1)}, 3, 32, 768),
    ("swinv2_tiny_window8_256", {"depths": (1, 1, 1, 1)}, 3, 32, 768),
])
def test_default_levels_of_every_family(name, kwargs, index, stride, channels):
    bb = TimmBackbone(name, model_kwargs=kwargs).eval()
    assert bb.out_indices == (index,) and bb.strides == [stride] and bb.num_channels == [channels]
    images = [torch.randn(3, 224, 256), torch.randn(3, 160, 192)]
    with torch.no_grad():
        (level,) = bb(nested_tensor_from_tensor_list(images))
    assert level.tensors.shape[:2] == (2, channels)  # channels-first, as every level
    assert level.mask.shape == (2, *level.tensors.shape[2:]) and level.mask.dtype == torch.bool
    assert tuple(level.tensors.shape[2:]) == (-(-224 // stride), -(-256 // stride))  # EVA-02: 256 / 14 padded


def test_copies_pickles_channels_and_the_joiner():
    bb = _backbone("dinov3", options={"in_chans": 1}).eval()
    images = _images(channels=1)
    batch = nested_tensor_from_tensor_list(images)
    with torch.no_grad():
        ref = bb(batch)
        for clone in (copy.deepcopy(bb), pickle.loads(pickle.dumps(bb))):
            assert clone.padding_invariant and not clone.training
            for a, b in zip(clone(batch), ref):
                torch.testing.assert_close(a.tensors, b.tensors, rtol=0, atol=0)
                assert a.padding == b.padding
    assert bb.in_chans == 1
    joiner = Joiner(bb, PositionEmbeddingSine(16, normalize=True), hidden_dim=32, num_feature_levels=3).double().eval()
    assert joiner.padding_invariant
    with torch.no_grad():
        feats, pos = joiner(batch)
        alone_feats, alone_pos = joiner(NestedTensor(images[0][None], None))
    for f, a in zip(feats, alone_feats):
        torch.testing.assert_close(_crop(f, 0, a.tensors), a.tensors[0], rtol=1e-12, atol=1e-12)


def test_gradient_checkpointing_and_frozen_stages():
    bb = _backbone("vit", out_indices=(1,), options={"frozen_stages": 0}).train()
    frozen = {n for n, p in bb.named_parameters() if not p.requires_grad}
    assert "body.model.blocks.0.attn.qkv.weight" in frozen and "body.model.pos_embed" in frozen
    assert "body.model.blocks.1.attn.qkv.weight" not in frozen
    images = _images(4)
    plain = bb(nested_tensor_from_tensor_list(images))[0].tensors
    bb.body.model.set_grad_checkpointing(True)
    checked = bb(nested_tensor_from_tensor_list(images))[0].tensors
    torch.testing.assert_close(checked, plain, rtol=0, atol=0)


@pytest.mark.parametrize("family", ["vit", "dinov3"])
def test_training_draws_never_carry_a_partner(family):
    """With every dropout and stochastic depth on, an item's tokens depend on the draws, never on
    its partners: the same draws (same seed, same canvas) with another partner give the same
    tokens (exactness for a given draw, as docs/padding-invariance.md says)."""
    drops = {"pos_drop_rate": 0.2, "proj_drop_rate": 0.2, "attn_drop_rate": 0.2, "drop_path_rate": 0.3}
    bb = _backbone(family, **drops).train()
    item, partner = _images(5, sizes=[(37, 53), (61, 64)])
    other = torch.randn_like(partner) * 3
    runs = []
    for p in (partner, other):
        torch.manual_seed(11)
        with torch.no_grad():
            runs.append(bb(nested_tensor_from_tensor_list([item, p])))
    for a, b in zip(*runs):
        h, w = a.padding.sizes[0]
        torch.testing.assert_close(a.tensors[0, :, :h, :w], b.tensors[0, :, :h, :w], rtol=0, atol=0)
        assert (a.tensors[1] - b.tensors[1]).abs().max() > 1e-3  # the partners' own tokens differ
    torch.manual_seed(12)
    with torch.no_grad():
        again = bb(nested_tensor_from_tensor_list([item, partner]))[-1].tensors[0, :, :h, :w]
    assert (again - runs[0][-1].tensors[0, :, :h, :w]).abs().max() > 1e-6  # the draws are live


def test_the_padding_value_never_reaches_an_edge_patch():
    """An item's last patch row is part padding (37 = 2 * 16 + 5): alone timm pads it with zeros
    (``dynamic_img_pad``); in a batch padded with another value the patch must still see zeros."""
    bb = _backbone("eva02").eval()
    images = _images(6)
    with torch.no_grad():
        levels = bb(nested_tensor_from_tensor_list(images, pad_value=5.0))
        alone = _alone(bb, images[0])
    for level, ref in zip(levels, alone):
        torch.testing.assert_close(_crop(level, 0, ref.tensors), ref.tensors[0], rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------ a convolutional patch stem
def _conv_stem(dim, norm="ln", kernel=3, padding=1):
    """Three stride-2 convolutions + a 1x1 on the patch-8 grid (Xiao et al. 2021)."""
    from timm.layers import LayerNorm2d

    widths, layers = [3, dim // 4, dim // 2, dim], []
    for c_in, c_out in zip(widths[:-1], widths[1:]):
        norm_layer = LayerNorm2d(c_out) if norm == "ln" else torch.nn.BatchNorm2d(c_out)
        layers += [torch.nn.Conv2d(c_in, c_out, kernel, 2, padding), norm_layer, torch.nn.GELU()]
    return torch.nn.Sequential(*layers, torch.nn.Conv2d(dim, dim, 1))


STEM_FAMILIES = {"vit": "vit_small_patch16_224", "rope_vit": "vit_small_patch16_rope_224",
                 "dinov3": "vit_small_patch16_dinov3"}


def _stem_backbone(family, norm="ln", padding_invariant=True, packed=False, stem=None):
    torch.manual_seed(0)
    bb = TimmBackbone(STEM_FAMILIES[family], out_indices=(0, 1), padding_invariant=padding_invariant, packed=packed,
                      model_kwargs={**TINY, "patch_size": 8, "img_size": 64})
    model = bb.body.model
    model.patch_embed.proj = stem if stem is not None else _conv_stem(model.embed_dim, norm)
    if padding_invariant:
        rule_for(model).check(model)
    with torch.no_grad():
        for name, p in bb.named_parameters():
            if name.endswith(("gamma", "gamma_1", "gamma_2")):
                p.fill_(1.0)
    return bb.double()


@pytest.mark.parametrize("family", sorted(STEM_FAMILIES))
def test_a_convolutional_stem_is_exact_alone_in_eval_and_training(family):
    bb = _stem_backbone(family)
    stock = _stem_backbone(family, padding_invariant=False)
    stock.load_state_dict(bb.state_dict())
    images = _images(2)
    for train in (False, True):
        bb.train(train), stock.train(train)
        alone = _alone(bb, images[0])
        if not train:
            with torch.no_grad():  # alone, vispos runs timm's own forward; the stock batch leaks through the stem
                stock_alone, leaky = _alone(stock, images[0]), stock(nested_tensor_from_tensor_list(images))
            torch.testing.assert_close(alone[0].tensors, stock_alone[0].tensors, rtol=1e-13, atol=1e-13)
            assert (_crop(leaky[0], 0, alone[0].tensors) - alone[0].tensors[0]).abs().max() > 1e-3
        weights = [torch.randn(a.tensors.shape[1:], dtype=torch.float64) for a in alone]
        bb.zero_grad()
        _loss(alone, 0, [a.tensors for a in alone], weights).backward()
        ref_grads = _grads(bb)
        assert any(k.startswith("model.patch_embed.proj.0") or ".patch_embed.proj.0" in k for k in ref_grads)
        _assert_alone_at_every_position(bb, images, alone, weights, ref_grads)  # grids: ceil(size / 8)


def test_a_batch_norm_stem_takes_the_valid_cells_statistics():
    """Eval: exact alone. Training: the statistics are every item's valid cells (the CNN rule), so
    an item's output does not depend on its position or on its partners' padding."""
    bb = _stem_backbone("vit", norm="bn")
    images = _images(3)
    with torch.no_grad():
        bb.eval()
        alone = _alone(bb, images[0])
        level = bb(nested_tensor_from_tensor_list(images))[0]
        torch.testing.assert_close(_crop(level, 0, alone[0].tensors), alone[0].tensors[0], rtol=1e-12, atol=1e-12)
        bb.train()
        first = bb(nested_tensor_from_tensor_list(images))[0]
        bigger = bb(nested_tensor_from_tensor_list(images, size_divisibility=64))[0]  # more padding, same items
        moved = bb(nested_tensor_from_tensor_list(_placed(images, 2)))[0]
    ref = _crop(first, 0, alone[0].tensors)
    torch.testing.assert_close(_crop(bigger, 0, alone[0].tensors), ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(_crop(moved, 2, alone[0].tensors), ref, rtol=1e-12, atol=1e-12)


def test_stems_that_cannot_be_exact_are_refused_by_name():
    # no padding: 3x3 stride-2 convolutions shrink the grid below one token per patch
    with pytest.raises(ValueError, match=r"patch_embed.proj .*not one token per patch"):
        _stem_backbone("vit", stem=_conv_stem(32, padding=0))

    class Shift(torch.nn.Module):  # reads a neighbour through a roll: no rule makes it exact
        def forward(self, x):
            return torch.roll(x, 1, dims=-1)

    with pytest.raises(ValueError, match=r"patch_embed.proj.*(roll|Shift)"):
        _stem_backbone("vit", stem=torch.nn.Sequential(_conv_stem(32), Shift()))


@pytest.mark.parametrize("norm", ["ln", "bn"])
def test_a_convolutional_stem_packed_equals_padded_invariant(norm):
    """LayerNorm2d: each item embedded alone. Batch norm: the stem runs on the padded batch with
    the valid cells' statistics (training), so the packed run equals the padded one there too."""
    invariant = _stem_backbone("rope_vit", norm=norm)
    packed = _stem_backbone("rope_vit", norm=norm, padding_invariant=False, packed=True)
    packed.load_state_dict(invariant.state_dict())
    images = _images(4)
    batch = nested_tensor_from_tensor_list(images)
    for train in (False, True):
        invariant.train(train), packed.train(train)
        packed.load_state_dict(invariant.state_dict())  # the running statistics too
        invariant.zero_grad(), packed.zero_grad()
        want = invariant(batch)
        with torch.no_grad():
            from_list = packed(images)
        got = packed(batch)
        for levels in (got, from_list):
            for a, b in zip(levels, want):
                torch.testing.assert_close(a.tensors, b.tensors, rtol=1e-12, atol=1e-12)
                assert a.padding == b.padding
        weights = [torch.randn(w.tensors.shape, dtype=torch.float64) for w in want]
        sum((w.tensors * k).sum() for w, k in zip(want, weights)).backward()
        sum((g.tensors * k).sum() for g, k in zip(got, weights)).backward()
        grads = dict(packed.named_parameters())
        assert any(p.grad is not None for n, p in grads.items() if "patch_embed.proj" in n)
        for name, p in invariant.named_parameters():
            if p.grad is not None:
                torch.testing.assert_close(grads[name].grad, p.grad, rtol=1e-10, atol=1e-12, msg=name)


def test_a_convolutional_stem_survives_copies_and_follows_its_layers():
    invariant = _stem_backbone("rope_vit")
    batch = nested_tensor_from_tensor_list(_images(4))
    invariant.eval()
    with torch.no_grad():
        ref = invariant(batch)
        assert_copies_give(invariant, batch, ref)
        weight = invariant.body.model.patch_embed.proj[0].weight  # the stem's graph calls the live layers
        weight.add_(torch.randn(weight.shape, generator=torch.Generator().manual_seed(0), dtype=weight.dtype))
        moved = invariant(batch)
    assert (moved[0].tensors - ref[0].tensors).abs().max() > 1e-3


class _DropPathBlock(torch.nn.Module):
    """A residual convolution with timm's DropPath: code that branches on ``self.training``."""

    def __init__(self, channels):
        super().__init__()
        from timm.layers import DropPath

        self.conv, self.drop = torch.nn.Conv2d(channels, channels, 3, 1, 1), DropPath(0.5)

    def forward(self, x):
        return x + self.drop(self.conv(x))


class _FunctionalBatchNorm(torch.nn.Module):
    """Batch statistics from ``F.batch_norm`` in a layer of no known class."""

    def __init__(self, channels):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(channels))
        self.bias = torch.nn.Parameter(torch.zeros(channels))

    def forward(self, x):
        return torch.nn.functional.batch_norm(x, None, None, self.weight, self.bias, True, 0.1, 1e-5)


def _custom_stem(middle):
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, 2, 1), torch.nn.ReLU(), middle,
                               torch.nn.Conv2d(8, 16, 3, 2, 1), torch.nn.Conv2d(16, 32, 3, 2, 1))


def test_a_stem_layer_that_branches_on_training_runs_the_branch_of_its_mode():
    """The stem is traced in both modes: built (and checked) in training, it does not drop in eval;
    in training it drops, with the draws timm's own forward makes alone."""
    torch.manual_seed(1)
    stem = _custom_stem(_DropPathBlock(8))
    bb = _stem_backbone("vit", stem=stem)  # traced and checked in training mode
    stock = _stem_backbone("vit", padding_invariant=False, stem=copy.deepcopy(stem))
    stock.load_state_dict(bb.state_dict())
    image = _images(5)[0]
    for train in (False, True):
        bb.train(train), stock.train(train)
        with torch.no_grad():
            torch.manual_seed(7)
            got = _alone(bb, image)[0].tensors
            torch.manual_seed(7)
            want = _alone(stock, image)[0].tensors
            torch.manual_seed(8)
            other = _alone(stock, image)[0].tensors
        torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-13)
        assert ((other - want).abs().max() > 1e-3) == train  # eval is deterministic, training draws


def test_replaced_parameters_of_a_traced_through_layer_are_traced_again():
    """timm's LayerNorm2d has no rule: the graph holds its parameters; replacing them (a new
    Parameter, ``load_state_dict(assign=True)``) retraces, so outputs and gradients follow."""
    bb = _stem_backbone("vit").eval()
    stock = _stem_backbone("vit", padding_invariant=False).eval()
    image = _images(6)[0]
    _alone(bb, image)  # traced
    state = {k: v + 0.5 * torch.randn_like(v) if "proj.1" in k else v for k, v in bb.state_dict().items()}
    bb.load_state_dict(state, assign=True)
    stock.load_state_dict(state)
    with torch.no_grad():
        torch.testing.assert_close(_alone(bb, image)[0].tensors, _alone(stock, image)[0].tensors, rtol=1e-13, atol=1e-13)
    norm = bb.body.model.patch_embed.proj[1]
    norm.weight = torch.nn.Parameter(norm.weight.detach().clone())
    _alone(bb, image)[0].tensors.sum().backward()
    assert norm.weight.grad is not None and norm.weight.grad.abs().max() > 0


def test_hooks_the_stem_graph_would_skip_are_refused_and_a_layers_hooks_run():
    bb = _stem_backbone("vit").eval()
    batch = nested_tensor_from_tensor_list(_images())
    seen = []
    handle = bb.body.model.patch_embed.proj[0].register_forward_hook(lambda m, i, o: seen.append(o.shape))
    with torch.no_grad():
        bb(batch)
    assert seen  # a convolution is called as a module: its hook runs
    handle.remove()
    for module in (bb.body.model.patch_embed, bb.body.model.patch_embed.proj):
        handle = module.register_forward_hook(lambda m, i, o: None)
        with pytest.raises(ValueError, match="hooks would not run"):
            bb(batch)
        with pytest.raises(ValueError, match="hooks would not run"):
            rule_for(bb.body.model).check(bb.body.model)
        handle.remove()


def test_packed_runs_any_convolutional_stem_as_the_padded_mode_does():
    """Batch statistics from a layer that is not a BatchNorm module: packed equals padded."""
    torch.manual_seed(1)
    stem = _custom_stem(_FunctionalBatchNorm(8))
    invariant = _stem_backbone("vit", stem=stem).eval()
    packed = _stem_backbone("vit", padding_invariant=False, packed=True, stem=copy.deepcopy(stem)).eval()
    packed.load_state_dict(invariant.state_dict())
    images = _images(7)
    with torch.no_grad():
        for a, b in zip(packed(images), invariant(nested_tensor_from_tensor_list(images))):
            torch.testing.assert_close(a.tensors, b.tensors, rtol=1e-12, atol=1e-12)
