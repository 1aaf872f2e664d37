"""packed=True for timm's VisionTransformer and Eva (vispos/invariance/tokens/_packed.py): every item's
tokens in one sequence, no padding token. Each item gets what the stock model gives it alone
(float64, eval and training, outputs and parameter gradients), the levels equal the padded
invariant mode's (float32 rounding), and every other model or input is refused by name."""


import pytest
import torch

from vispos import NestedTensor, Padding, PositionEmbeddingRandom, PositionEmbeddingSine, nested_tensor_from_tensor_list
from vispos.backbones import Joiner, TimmBackbone
from vispos.invariance.tokens._packed import _drop_path, packed_levels

from item_alone import assert_copies_give

TINY = {"depth": 2, "embed_dim": 32, "num_heads": 2}

#: name -> model_kwargs: a learned table (class token; registers without a table entry, QK norm,
#: layer scale), DINOv3 (RoPE with its training coordinate augmentation, registers), EVA-02 (RoPE
#: and a learned table, SwiGLU) and RoPE-Mixed (a rotary table per block)
MODELS = {
    "vit": ("vit_small_patch16_224", TINY),
    "vit_reg": ("vit_small_patch16_224", {**TINY, "reg_tokens": 2, "no_embed_class": True, "qk_norm": True,
                                           "init_values": 0.1}),
    "dinov3": ("vit_small_patch16_dinov3", {**TINY, "rope_shift_coords": 0.5, "rope_jitter_coords": 1.5,
                                             "rope_rescale_coords": 2.0}),
    "eva02": ("eva02_tiny_patch14_224", {"depth": 2}),
    "mixed": ("vit_small_patch16_rope_mixed_224", TINY),
}

#: item sizes: none a multiple of the patch; one item; very different sizes (a single patch beside
#: a tall strip)
SIZES = {
    "odd": [(37, 53), (61, 29), (50, 50)],
    "one": [(45, 70)],
    "apart": [(16, 16), (190, 40), (33, 97)],
}


def _images(sizes, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(3, *s, generator=g, dtype=dtype) for s in sizes]


def _pair(key, dtype=torch.float64, out_indices=(0, 1), mode="stock"):
    """(packed backbone, the same weights in ``mode``: stock / padding_invariant)."""
    name, kwargs = MODELS[key]
    torch.manual_seed(0)
    packed = TimmBackbone(name, out_indices=out_indices, packed=True, model_kwargs=kwargs).to(dtype)
    other = TimmBackbone(name, out_indices=out_indices, padding_invariant=mode == "invariant", model_kwargs=kwargs)
    other.load_state_dict(packed.state_dict())
    return packed, other.to(dtype)


def _loss(levels, weights, index=None):
    """A weighted sum over each item's own cells (``index``: one item, its levels ``(1, C, h, w)``)."""
    total = 0.0
    for level, w in zip(levels, weights):
        for b in range(level.tensors.shape[0]):
            wb = w[b if index is None else index]
            h, w_ = wb.shape[1:]
            total = total + (level.tensors[b, :, :h, :w_] * wb).sum()
    return total


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("sizes", list(SIZES), ids=list(SIZES))
@pytest.mark.parametrize("key", list(MODELS))
def test_packed_equals_each_item_alone(key, sizes, train):
    packed, stock = _pair(key)
    packed.train(train), stock.train(train)
    images = _images(SIZES[sizes])
    torch.manual_seed(1)  # training: DINOv3's coordinate augmentation draws once per item, in batch order
    levels = packed(nested_tensor_from_tensor_list(images))
    torch.manual_seed(1)
    alone = [stock(NestedTensor(image[None], None)) for image in images]
    g = torch.Generator().manual_seed(2)
    weights = [[torch.randn(a[l].tensors.shape[1:], generator=g, dtype=torch.float64) for a in alone]
               for l in range(len(levels))]
    for b, item_levels in enumerate(alone):
        for level, ref in zip(levels, item_levels):
            h, w = ref.tensors.shape[2:]
            assert level.padding.sizes[b] == (h, w)
            torch.testing.assert_close(level.tensors[b, :, :h, :w], ref.tensors[0], rtol=1e-10, atol=1e-10)
            assert not level.tensors[b][:, level.mask[b]].any()  # zeros on the padding
    _loss(levels, weights).backward()
    for b, item_levels in enumerate(alone):
        _loss(item_levels, weights, index=b).backward()
    grads = dict(stock.named_parameters())
    checked = 0
    for name, p in packed.named_parameters():
        ref = grads[name].grad
        if p.grad is None:
            assert ref is None or not ref.any(), name
            continue
        torch.testing.assert_close(p.grad, ref, rtol=1e-9, atol=1e-11, msg=name)
        checked += 1
    assert checked > 10


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("key", ["vit", "dinov3", "eva02", "mixed"])
def test_packed_equals_padded_invariant_float32(key, train):
    packed, invariant = _pair(key, dtype=torch.float32, mode="invariant")
    packed.train(train), invariant.train(train)
    batch = nested_tensor_from_tensor_list(_images(SIZES["apart"] + SIZES["odd"], dtype=torch.float32))
    torch.manual_seed(3)
    got = packed(batch)
    torch.manual_seed(3)
    want = invariant(batch)
    assert len(got) == len(want) == 2
    for a, b in zip(got, want):
        assert a.tensors.shape == b.tensors.shape
        assert torch.equal(a.mask, b.mask)
        torch.testing.assert_close(a.tensors, b.tensors)  # float32 rounding


def test_list_input_and_no_padding():
    packed, invariant = _pair("dinov3", mode="invariant")
    packed.eval(), invariant.eval()
    images = _images(SIZES["odd"])
    batch = nested_tensor_from_tensor_list(images)
    with torch.no_grad():
        from_list, from_batch = packed(images), packed(batch)
        filled = packed(nested_tensor_from_tensor_list(images, pad_value=5.0))  # never reaches an edge patch
        assert from_list[0].padding.sizes == from_batch[0].padding.sizes
        for a, b, c in zip(from_list, from_batch, filled):
            torch.testing.assert_close(a.tensors, b.tensors, rtol=0, atol=0)
            torch.testing.assert_close(c.tensors, b.tensors, rtol=0, atol=0)
        same = NestedTensor(torch.stack(_images([(48, 64)] * 2)), None)  # no padding: no mask, as padded
        got, want = packed(same), invariant(same)
    for a, b in zip(got, want):
        assert a.mask is None and b.mask is None
        torch.testing.assert_close(a.tensors, b.tensors, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("embedding", [PositionEmbeddingSine(16, normalize=True), PositionEmbeddingRandom(16)],
                         ids=["sine", "random_fourier"])
def test_caller_position_embedding_per_item(embedding):
    """A vispos embedding computed on each item's own token grid and added to its patch tokens:
    the stock model alone with the same embedding added by a hook on its patch embedding."""
    name, kwargs = MODELS["vit"]
    torch.manual_seed(0)
    stock = TimmBackbone(name, out_indices=(0, 1), model_kwargs={**kwargs, "pos_embed": "none"}).double().eval()
    model = stock.body.model
    images = _images(SIZES["apart"])
    padding = Padding.from_sizes([tuple(i.shape[1:]) for i in images], (190, 97))
    with torch.no_grad():
        levels = packed_levels(model, images, padding, (0, 1), position_embedding=embedding)

        def add(module, args, out):  # the embedding of the item's grid, channels last
            return out + embedding(torch.zeros(out.shape[:3], dtype=torch.bool)).permute(0, 2, 3, 1).double()

        handle = model.patch_embed.register_forward_hook(add)
        alone = [stock(NestedTensor(image[None], None)) for image in images]
        handle.remove()
        plain = packed_levels(model, images, padding, (0, 1))
    for b, item_levels in enumerate(alone):
        for level, ref, bare in zip(levels, item_levels, plain):
            h, w = ref.tensors.shape[2:]
            torch.testing.assert_close(level.tensors[b, :, :h, :w], ref.tensors[0], rtol=1e-10, atol=1e-10)
            assert not torch.allclose(bare.tensors[b, :, :h, :w], ref.tensors[0])  # the embedding counts


def test_caller_position_embedding_of_another_shape_is_refused():
    """A caller's embedding must give ``Tensor[1, C, h, w]`` for an item's ``h x w`` grid: one that
    gives the grid transposed (the same number of cells) or another grid is refused by name, never
    placed on the canvas cell by cell in the wrong order."""
    name, kwargs = MODELS["vit"]
    torch.manual_seed(0)
    model = TimmBackbone(name, out_indices=(0,), model_kwargs={**kwargs, "pos_embed": "none"}).double().body.model
    images = _images([(32, 48), (48, 16)])
    padding = Padding.from_sizes([tuple(i.shape[1:]) for i in images], (48, 48))
    sine = PositionEmbeddingSine(16, normalize=True)
    wrong = {
        "transposed": lambda mask: sine(mask).transpose(2, 3),
        "one row more": lambda mask: sine(torch.zeros((1, mask.shape[1] + 1, mask.shape[2]), dtype=torch.bool)),
        "channels last": lambda mask: sine(mask).permute(0, 2, 3, 1),
    }
    for what, embed in wrong.items():
        with pytest.raises(ValueError, match=r"position_embedding must return Tensor\[1, C, h, w\]"):
            packed_levels(model, images, padding, (0,), position_embedding=embed)


def test_on_canvas_refuses_a_table_of_another_grid():
    from vispos.invariance.tokens._tokens import on_canvas

    with pytest.raises(ValueError, match=r"6 rows for a 2 x 2 grid"):
        on_canvas([torch.zeros(6, 1), torch.zeros(4, 1)], [(2, 2), (2, 2)], (2, 3))


def test_joiner_follows_packed_backbone():
    """The Joiner's GroupNorm projections take each item's own cells behind a packed backbone too."""
    packed, invariant = _pair("vit", dtype=torch.float32, mode="invariant")
    joiners = []
    for backbone in (packed, invariant):
        torch.manual_seed(4)
        joiners.append(Joiner(backbone.eval(), PositionEmbeddingSine(16, normalize=True), hidden_dim=32, num_groups=8,
                              num_feature_levels=3).eval())
    assert joiners[0].padding_invariant
    batch = nested_tensor_from_tensor_list(_images([(70, 90), (100, 40), (50, 120)], dtype=torch.float32))
    with torch.no_grad():
        (got, got_pos), (want, want_pos) = joiners[0](batch), joiners[1](batch)
    assert len(got) == 3
    for a, b, pa, pb in zip(got, want, got_pos, want_pos):
        assert torch.equal(a.mask, b.mask)
        torch.testing.assert_close(a.tensors, b.tensors)
        torch.testing.assert_close(pa, pb)


def test_gradient_checkpointing_same_result():
    packed, _ = _pair("dinov3")
    packed.body.model.set_grad_checkpointing(True)
    images = _images(SIZES["odd"])
    torch.manual_seed(5)  # training: the same coordinate draws in both runs
    levels = packed(images)
    _loss(levels, [[torch.ones(l.tensors.shape[1], *s) for s in l.padding.sizes] for l in levels]).backward()
    grads = {n: p.grad.clone() for n, p in packed.named_parameters() if p.grad is not None}
    packed.body.model.set_grad_checkpointing(False)
    packed.zero_grad(set_to_none=True)
    torch.manual_seed(5)
    plain = packed(images)
    _loss(plain, [[torch.ones(l.tensors.shape[1], *s) for s in l.padding.sizes] for l in plain]).backward()
    for a, b in zip(levels, plain):
        torch.testing.assert_close(a.tensors, b.tensors, rtol=0, atol=0)
    for n, p in packed.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(grads[n], p.grad, rtol=1e-12, atol=1e-14, msg=n)


def test_drop_path_draws_once_per_item():
    from timm.layers import DropPath

    torch.manual_seed(0)
    module = DropPath(0.5).train()
    lengths = [3, 5, 2, 7, 4, 6]
    y = torch.ones(1, sum(lengths), 4)
    out = _drop_path(module, y, lengths)
    parts = torch.split(out[0], lengths)
    values = {float(p[0, 0]) for p in parts}
    assert values == {0.0, 2.0}  # some items dropped, some kept (scaled by 1 / keep), this seed
    for part in parts:
        assert torch.equal(part, part[:1].expand_as(part))  # one draw for all of an item's tokens
    assert _drop_path(module.eval(), y, lengths) is y


def test_state_round_trips_and_repr():
    packed, _ = _pair("vit")
    assert "padding_invariant=True, packed=True" in repr(packed) and packed.padding_invariant
    images = _images(SIZES["odd"])
    packed.eval()
    with torch.no_grad():
        want = packed(images)
        assert_copies_give(packed, images, want)


@pytest.mark.parametrize("name, match", [
    ("resnet18", r"'resnet18' \(a CNN or hooked features\) has no packed run"),
    ("swin_tiny_patch4_window7_224", r"SwinTransformer\) has no packed run"),
])
def test_refuses_other_families_by_name(name, match):
    with pytest.raises(ValueError, match=match):
        TimmBackbone(name, packed=True)


def test_refuses_configurations_by_name():
    name, kwargs = MODELS["vit"]
    with pytest.raises(ValueError, match="not both"):
        TimmBackbone(name, packed=True, padding_invariant=True, model_kwargs=kwargs)
    with pytest.raises(ValueError, match="packed=True: 'vit_small_patch16_224' is refused by its rule: .*patch"):
        TimmBackbone(name, packed=True, model_kwargs={**kwargs, "patch_drop_rate": 0.5})
    with pytest.raises(ValueError, match="packed=True: 'deit_tiny_distilled_patch16_224' is refused .*_pos_embed"):
        TimmBackbone("deit_tiny_distilled_patch16_224", packed=True, model_kwargs=kwargs)
    with pytest.raises(ValueError, match="dynamic_img_size"):
        TimmBackbone(name, packed=True, model_kwargs={**kwargs, "dynamic_img_size": False})
    from timm.models.vision_transformer import ResPostBlock

    with pytest.raises(ValueError, match="blocks.0 of this VisionTransformer is a ResPostBlock"):
        TimmBackbone(name, packed=True, model_kwargs={**kwargs, "block_fn": ResPostBlock})
    with pytest.raises(TypeError, match="packed"):
        TimmBackbone(name, packed="yes", model_kwargs=kwargs)


def test_refuses_bad_inputs():
    packed, _ = _pair("vit", dtype=torch.float32)
    images = _images(SIZES["odd"], dtype=torch.float32)
    batch = nested_tensor_from_tensor_list(images)
    with pytest.raises(ValueError, match="arbitrary mask"):
        mask = batch.mask.clone()
        mask[0, 0, 0] = True
        packed(NestedTensor(batch.tensors, mask))
    with pytest.raises(ValueError, match="origin"):
        packed(NestedTensor(batch.tensors, Padding.from_sizes([(37, 53)] * 3, (61, 53), starts="symmetric")))
    with pytest.raises(ValueError, match="at least one"):
        packed([])
    with pytest.raises(TypeError, match=r"x\[1\] must be a Tensor"):
        packed([images[0], "image"])
    with pytest.raises(ValueError, match=r"x\[1\] must be a Tensor \(C, H, W\)"):
        packed([images[0], images[1][:1]])
    with pytest.raises(ValueError, match="3 channels"):
        packed([torch.zeros(4, 32, 32)])
    with pytest.raises(TypeError, match="dtype"):
        packed([images[0].double()])
    with pytest.raises(TypeError, match="NestedTensor"):
        packed(batch.tensors)
    name, kwargs = MODELS["vit"]
    strict = TimmBackbone(name, packed=True, model_kwargs={**kwargs, "dynamic_img_pad": False})
    with pytest.raises(ValueError, match="not a multiple of the patch"):
        strict([torch.zeros(3, 8, 40)])


@pytest.mark.slow
@pytest.mark.parametrize("key", ["vit", "dinov3"])
def test_packed_under_torch_compile(key):
    """``torch.compile`` of a packed backbone (the eager backend: what Dynamo captures, without
    the minutes of code generation): the same levels, masks and parameter gradients as eager."""
    packed, _ = _pair(key, dtype=torch.float32)
    batch = nested_tensor_from_tensor_list(_images(SIZES["odd"], dtype=torch.float32))
    compiled = torch.compile(packed, backend="eager")
    try:
        for train in (False, True):
            packed.train(train)
            if train:  # DINOv3's coordinate augmentation draws: the same draws in both runs
                torch.manual_seed(1)
            want = packed(batch)
            want_grads = torch.autograd.grad(sum(o.tensors.sum() for o in want), list(packed.parameters()),
                                             allow_unused=True)
            if train:
                torch.manual_seed(1)
            got = compiled(batch)
            got_grads = torch.autograd.grad(sum(o.tensors.sum() for o in got), list(packed.parameters()),
                                            allow_unused=True)
            for a, b in zip(got, want):
                torch.testing.assert_close(a.tensors, b.tensors)
                assert torch.equal(a.mask, b.mask)
            for a, b in zip(got_grads, want_grads):
                assert (a is None) == (b is None)
                if a is not None:
                    torch.testing.assert_close(a, b)
    finally:
        torch._dynamo.reset()


def _reference_varlen(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, scale=None, **_):
    """FlashAttention's variable-length contract, from its docstring: ``(T, H, D)`` tensors, each
    span of ``cu_seq_q`` attending within itself (a slow reference for the CPU)."""
    assert cu_seq_q.dtype == torch.int32 and torch.equal(cu_seq_q, cu_seq_k)
    bounds = cu_seq_q.tolist()
    assert max_q == max_k == max(b - a for a, b in zip(bounds, bounds[1:]))
    out = []
    for a, b in zip(bounds, bounds[1:]):
        q, k, v = (t[a:b].transpose(0, 1) for t in (query, key, value))
        out.append(torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale).transpose(0, 1))
    return torch.cat(out)


@pytest.mark.parametrize("key", ["vit", "vit_reg"])
def test_block_diagonal_attention_through_the_variable_length_kernel(key, monkeypatch):
    """The path CUDA takes in float16 / bfloat16 (one variable-length attention call per block for
    every item), its kernel replaced by a slow reference of its contract: the same levels and
    gradients as one attention call per item."""
    import torch.nn.attention.varlen as varlen

    from vispos.invariance.tokens import _packed

    packed, _ = _pair(key, dtype=torch.float64)
    images = _images(SIZES["apart"] + SIZES["odd"])
    want = packed(images)
    want_grads = torch.autograd.grad(sum(level.tensors.sum() for level in want), list(packed.parameters()))
    calls = []

    def kernel(*args, **kwargs):
        calls.append(args[0].shape)
        return _reference_varlen(*args, **kwargs)

    monkeypatch.setattr(varlen, "varlen_attn", kernel)
    monkeypatch.setattr(_packed, "_varlen_ok", lambda q, dropout_p: dropout_p == 0.0)
    got = packed(images)
    got_grads = torch.autograd.grad(sum(level.tensors.sum() for level in got), list(packed.parameters()))
    assert len(calls) == 2  # one call per block (depth 2) for all six items
    for a, b in zip(got, want):
        torch.testing.assert_close(a.tensors, b.tensors, rtol=1e-10, atol=1e-10)
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_packed_bfloat16_on_cuda_equals_padded_invariant():
    """FlashAttention's variable-length kernel on the GPU: the packed levels in bfloat16 autocast
    equal the padded invariant mode's (bfloat16 rounding)."""
    packed, invariant = _pair("vit", dtype=torch.float32, mode="invariant")
    packed, invariant = packed.cuda().eval(), invariant.cuda().eval()
    batch = nested_tensor_from_tensor_list([i.cuda() for i in _images(SIZES["apart"] + SIZES["odd"],
                                                                       dtype=torch.float32)])
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        got, want = packed(batch), invariant(batch)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.tensors.float(), b.tensors.float(), rtol=2e-2, atol=2e-2)
