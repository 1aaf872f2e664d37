"""vispos.monai.networks: MONAI's ViT and UNETR on padded batches of volumes of any size."""

import copy

import pytest
import torch
from torch import nn
from torch.testing import assert_close

monai = pytest.importorskip("monai")

from monai.data import MetaTensor  # noqa: E402
from monai.networks.nets import UNETR, ViT  # noqa: E402
from monai.transforms import DivisiblePadd  # noqa: E402

from vispos import NestedTensor, nested_tensor_from_tensor_list, resample_abs_pos_embed  # noqa: E402
from vispos.monai import AnySizeUNETR, AnySizeViT, NestedPadCollate  # noqa: E402

VIT = dict(in_channels=1, img_size=(16, 16, 16), patch_size=4, hidden_size=24, mlp_dim=16, num_layers=2, num_heads=2)
UNETR_KW = dict(in_channels=1, out_channels=2, img_size=(32, 32, 32), feature_size=2, hidden_size=12, mlp_dim=8, num_heads=2)
VIT_SIZES = [(16, 16, 16), (8, 12, 20), (12, 4, 8)]  # three volume sizes in one batch
UNETR_SIZES = [(32, 32, 16), (16, 48, 32), (48, 16, 16)]


def _volumes(sizes, channels=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn((channels, *s), generator=g) for s in sizes]


def _valid(out_b, grid, size, patch):
    """An item's tokens inside the padded grid, in its own row-major order."""
    g = [s // p for s, p in zip(size, patch)]
    return out_b.reshape(*grid, -1)[tuple(slice(0, k) for k in g)].reshape(-1, out_b.shape[-1])


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.mark.parametrize("pos_embed_type", ["learnable", "sincos"])
@pytest.mark.parametrize("classification", [False, True])
def test_vit_is_monai_vit_at_its_own_size(pos_embed_type, classification):
    ref = ViT(**VIT, pos_embed_type=pos_embed_type, classification=classification).eval()
    net = AnySizeViT(**VIT, pos_embed_type=pos_embed_type, classification=classification).eval()
    assert list(net.state_dict()) == list(ref.state_dict())
    net.load_state_dict(ref.state_dict())  # a MONAI checkpoint loads as it is
    x = torch.randn(2, 1, 16, 16, 16)
    with torch.no_grad():
        got, got_hidden = net(x)
        want, want_hidden = ref(x)
    assert torch.equal(got, want)
    assert all(torch.equal(a, b) for a, b in zip(got_hidden, want_hidden))


@pytest.mark.parametrize("pos_embed_type", ["learnable", "sincos"])
@pytest.mark.parametrize("classification", [False, True])
@pytest.mark.parametrize("flash", [False, True])
def test_vit_padding_invariance(pos_embed_type, classification, flash):
    net = AnySizeViT(**VIT, pos_embed_type=pos_embed_type, classification=classification).eval()
    for blk in net.blocks:
        blk.attn.use_flash_attention = flash
    items = _volumes(VIT_SIZES)
    batch = nested_tensor_from_tensor_list(items)
    grid = [s // 4 for s in batch.tensors.shape[2:]]
    with torch.no_grad():
        out, hidden = net(batch)
        for b, item in enumerate(items):
            alone, alone_hidden = net(item[None])
            if classification:
                assert_close(out[b], alone[0])
            else:
                assert_close(_valid(out[b], grid, item.shape[1:], (4, 4, 4)), alone[0])
            assert_close(_valid(hidden[-1][b, int(classification):], grid, item.shape[1:], (4, 4, 4)), alone_hidden[-1][0, int(classification):])
        # the control: the same batch without its mask (padding taken as content) is not invariant
        unmasked, _ = net(batch.tensors)
    assert (unmasked - out).abs().max() > 1e-2


def test_vit_partial_patches_and_metatensor_input():
    net = AnySizeViT(**VIT).eval()
    items = _volumes([(10, 16, 7), (16, 5, 16)])  # not multiples of the patch size
    batch = nested_tensor_from_tensor_list(items)
    meta = type(batch)(MetaTensor(batch.tensors), batch.mask)
    with torch.no_grad():
        out, _ = net(meta)
        grid = [-(-s // 4) for s in batch.tensors.shape[2:]]
        assert out.shape == (2, grid[0] * grid[1] * grid[2], 24) and type(out) is torch.Tensor
        for b, item in enumerate(items):
            size = [-(-s // 4) * 4 for s in item.shape[1:]]
            assert_close(_valid(out[b], grid, size, (4, 4, 4)), net(item[None])[0][0])
    mask = net.token_mask(batch)
    assert mask.shape == (2, *grid) and not mask[0, :3, :4, :2].any() and mask[0, 3:].all()


@pytest.mark.parametrize("pos_embed_type", ["learnable", "sincos"])
def test_vit_other_size_equals_monai_vit_built_there(pos_embed_type):
    # what users do by hand (MONAI issue 6264): build the model at the new size and load the
    # table interpolated for it (learned) or rebuilt (sin-cos)
    net = AnySizeViT(**VIT, pos_embed_type=pos_embed_type).eval()
    size = (8, 12, 24)
    there = ViT(**{**VIT, "img_size": size}, pos_embed_type=pos_embed_type).eval()
    state = net.state_dict()
    if pos_embed_type == "learnable":
        state["patch_embedding.position_embeddings"] = resample_abs_pos_embed(
            state["patch_embedding.position_embeddings"], (2, 3, 6), (4, 4, 4), num_prefix_tokens=0, interpolation="trilinear"
        )
    else:
        state["patch_embedding.position_embeddings"] = there.state_dict()["patch_embedding.position_embeddings"]
    there.load_state_dict(state)
    x = torch.randn(2, 1, *size)
    with torch.no_grad():
        assert_close(net(x)[0], there(x)[0], rtol=0, atol=0)


@pytest.mark.parametrize("pos_embed_type", ["learnable", "sincos"])
def test_vit_symmetric_padding_from_monai_transforms(pos_embed_type):
    net = AnySizeViT(**VIT, pos_embed_type=pos_embed_type).eval()
    pad = DivisiblePadd("image", k=4)  # symmetric: the volume does not start at a patch corner
    volumes = _volumes([(13, 6, 9), (7, 16, 11), (16, 3, 4)])
    batch = NestedPadCollate(size_divisibility=4)([pad({"image": MetaTensor(v)}) for v in volumes])
    padding = batch["image"].padding
    assert batch["image"].rectangular and any(a % 4 for start in padding.starts for a in start)
    grid = [s // 4 for s in batch["image"].tensors.shape[2:]]
    with torch.no_grad():
        out, _ = net(batch["image"])
        for b, volume in enumerate(volumes):  # alone: the volume itself (the mask's box, unpadded)
            assert tuple(padding.sizes[b]) == tuple(volume.shape[1:])
            cells = tuple(slice(a // 4, a // 4 - (-s // 4)) for a, s in zip(padding.starts[b], volume.shape[1:]))
            assert_close(out[b].reshape(*grid, -1)[cells].reshape(-1, out.shape[-1]), net(volume[None])[0][0])


def test_unetr_is_monai_unetr_and_converts_in_place():
    ref = UNETR(**UNETR_KW).eval()
    net = AnySizeUNETR.from_monai(ref)
    assert list(net.state_dict()) == list(ref.state_dict())
    assert all(a.data_ptr() == b.data_ptr() for a, b in zip(net.parameters(), ref.parameters()))
    built = AnySizeUNETR(**UNETR_KW)
    built.load_state_dict(ref.state_dict())
    ref.load_state_dict(built.state_dict())
    x = torch.randn(1, 1, 32, 32, 32)
    with torch.no_grad():
        assert torch.equal(net(x), ref(x))
        assert torch.equal(built.eval()(x), ref(x))


def test_unetr_padding_invariance():
    net = AnySizeUNETR(**UNETR_KW).eval()
    items = _volumes(UNETR_SIZES)
    batch = nested_tensor_from_tensor_list(items)
    with torch.no_grad():
        out = net(batch)
        assert out.shape == (3, 2, *batch.tensors.shape[2:])
        for b, item in enumerate(items):
            alone = net(item[None])[0]
            assert_close(out[(b, slice(None), *(slice(0, s) for s in item.shape[1:]))], alone, rtol=1e-4, atol=1e-5)
        # the control: MONAI's own UNETR at one item's size runs, and the mask matters
        ref = UNETR(**{**UNETR_KW, "img_size": UNETR_SIZES[0]}).eval()
        state = net.state_dict()
        state["vit.patch_embedding.position_embeddings"] = resample_abs_pos_embed(
            state["vit.patch_embedding.position_embeddings"], (2, 2, 1), (2, 2, 2), num_prefix_tokens=0, interpolation="trilinear"
        )
        ref.load_state_dict(state)
        assert_close(out[(0, slice(None), *(slice(0, s) for s in UNETR_SIZES[0]))], ref(items[0][None])[0], rtol=1e-4, atol=1e-5)
        unmasked = net(batch.tensors)
    assert (unmasked[0] - out[0]).abs().max() > 1e-2


def test_training_step_on_a_padded_batch():
    # gradients reach every trained parameter (the learned table through its resampling) and
    # stay finite; the padded voxels take no part in the loss
    net = AnySizeUNETR(**UNETR_KW).train()
    batch = nested_tensor_from_tensor_list(_volumes(UNETR_SIZES))
    logits = net(batch)
    loss = logits.logsumexp(1)[~batch.mask].mean()
    loss.backward()
    table = net.vit.patch_embedding.position_embeddings
    assert table.grad is not None and table.grad.abs().sum() > 0
    ref = UNETR(**UNETR_KW).train()  # which parameters MONAI's own forward trains
    ref(torch.randn(1, 1, 32, 32, 32)).sum().backward()
    trained = {name for name, p in ref.named_parameters() if p.grad is not None}
    assert trained and trained == {name for name, p in net.named_parameters() if p.grad is not None}
    assert all(torch.isfinite(p.grad).all() for p in net.parameters() if p.grad is not None)


def test_unetr_metatensor_batch_inverts_like_monai():
    # a MetaTensor in, a MetaTensor out: predictions decollate and invert as the images do
    from monai.transforms import Compose, Invertd, SpatialPadd

    from vispos.monai import decollate_nested_batch

    pipeline = Compose([SpatialPadd("image", (16, 16, 16)), DivisiblePadd("image", k=16)])
    affine = torch.diag(torch.tensor([1.0, 1.0, 3.0, 1.0], dtype=torch.float64))
    originals = [{"image": MetaTensor(v, affine=affine)} for v in _volumes([(14, 20, 9), (16, 16, 16)])]
    batch = NestedPadCollate()([pipeline(dict(d)) for d in originals])
    net = AnySizeUNETR(**{**UNETR_KW, "img_size": 16}).eval()
    with torch.no_grad():
        batch["pred"] = net(batch["image"])
    assert isinstance(batch["pred"], MetaTensor) and batch["pred"].shape[2:] == batch["image"].tensors.shape[2:]
    for item, orig in zip(decollate_nested_batch(batch), originals):
        assert item["pred"].shape[1:] == item["image"].shape[1:]
        back = Invertd("pred", transform=pipeline, orig_keys="image")(item)
        assert back["pred"].shape[1:] == orig["image"].shape[1:]
        assert_close(back["pred"].affine, orig["image"].affine)


@pytest.mark.parametrize("norm_name", ["batch", ("group", {"num_groups": 1}), ("instance", {"affine": True})])
def test_decoder_norms_use_valid_cells_only(norm_name):
    """UNETR built with batch, group or instance norm, in training: one item on a larger canvas
    (garbage in the padding) gives what it gives alone, and a batch norm's running statistics are
    updated from the item's own voxels only."""
    alone = AnySizeUNETR(**UNETR_KW, norm_name=norm_name).double().train()
    padded = copy.deepcopy(alone)
    item = _volumes([(16, 20, 12)])[0].double()
    canvas = torch.full((1, 1, 32, 32, 32), 5.0, dtype=torch.float64)
    canvas[0, :, :16, :20, :12] = item
    mask = torch.ones(1, 32, 32, 32, dtype=torch.bool)
    mask[0, :16, :20, :12] = False
    want = alone(item[None])
    got = padded(NestedTensor(canvas, mask))[..., :16, :20, :12]
    assert_close(got, want, rtol=1e-9, atol=1e-9)
    for (key, a), b in zip(alone.state_dict().items(), padded.state_dict().values()):
        assert_close(b, a, rtol=1e-9, atol=1e-9, msg=key)
    if norm_name == "batch":
        assert int(padded.encoder1.layer.norm1.num_batches_tracked) == 1


def _with(unetr: nn.Module, path: str, layer: nn.Module) -> nn.Module:
    parent, _, name = path.rpartition(".")
    setattr(unetr.get_submodule(parent), name, layer)
    return unetr


@pytest.mark.parametrize(
    "build, error, match",
    [
        (lambda: AnySizeViT(**VIT, pos_embed="table"), ValueError, r"pos_embed must be one of \('auto', 'sincos', 'resample'\)"),
        (lambda: AnySizeViT(**VIT, antialias=1), TypeError, "antialias"),
        (lambda: AnySizeViT(**VIT, temperature=0), ValueError, "temperature"),
        (lambda: AnySizeViT(**{**VIT, "hidden_size": 20, "num_heads": 2}, pos_embed="sincos"), ValueError, "hidden_size divisible by 6"),
        (lambda: AnySizeViT.from_monai(nn.Linear(2, 2)), TypeError, "vit must be a monai.networks.nets.ViT"),
        (lambda: AnySizeUNETR.from_monai(ViT(**VIT)), TypeError, "unetr must be a monai.networks.nets.UNETR"),
        (lambda: AnySizeViT.from_monai(ViT(**{**VIT, "img_size": (16, 8, 16)})), ValueError, "not a cube; pass img_size"),
        (lambda: AnySizeViT.from_monai(ViT(**VIT), img_size=(16, 8, 16)), ValueError, r"a patch grid of \(4, 2, 4\) holds 32 patches"),
        (lambda: AnySizeViT.from_monai(ViT(**VIT), scale=2), TypeError, r"unexpected options \['scale'\]"),
        (lambda: AnySizeViT.from_monai(ViT(**VIT, pos_embed_type="sincos"), temperature=100.0), ValueError, "not MONAI's build_sincos_position_embedding at temperature=100.0"),
        (lambda: AnySizeViT(**VIT)([1]), TypeError, "takes a NestedTensor or a Tensor"),
        (lambda: AnySizeViT(**VIT)(torch.ones(1, 1, 8, 8)), ValueError, r"takes \(B, C, \*S\) with 3 spatial axes"),
        (lambda: AnySizeViT(**VIT)(_FakeNested(torch.ones(1, 1, 8, 8, 8), torch.zeros(1, 8, 8, 8))), TypeError, "dtype torch.bool"),
        (lambda: AnySizeViT(**VIT)(_FakeNested(torch.ones(1, 1, 8, 8, 8), torch.zeros(1, 8, 8, 4, dtype=torch.bool))), ValueError, "mask must have shape"),
        (lambda: AnySizeUNETR.from_monai(_with(UNETR(**UNETR_KW), "out", nn.Sequential(nn.Flatten(), nn.Unflatten(1, (2, 32, 32, 32))))),
         ValueError, r"out.0 \(Flatten\)"),
    ],
)
def test_errors(build, error, match):
    with pytest.raises(error, match=match):
        build()


def test_causal_blocks_refused():
    vit = ViT(**VIT)
    vit.blocks[1].attn.causal = True
    with pytest.raises(ValueError, match=r"blocks\[1\] uses causal attention"):
        AnySizeViT.from_monai(vit)


class _FakeNested:
    """DETR's NestedTensor interface (tensors, mask, decompose)."""

    def __init__(self, tensors, mask):
        self.tensors, self.mask = tensors, mask

    def decompose(self):
        return self.tensors, self.mask


# --------------------------------------------------------------------- export and TorchScript
class _OnTensors(nn.Module):
    """The padded form for exporters (they take tensors, not NestedTensors): ``(tensors, mask)``
    in, the NestedTensor built inside."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, tensors, mask):
        from vispos import NestedTensor

        return self.net(NestedTensor(tensors, mask))


def _flat(out):
    return [out] if isinstance(out, torch.Tensor) else [t for o in out for t in _flat(o)]


def _export_nets():
    vit2d = dict(VIT, img_size=(16, 24), spatial_dims=2)
    return {
        "vit_learnable": lambda: AnySizeViT(**VIT),
        "vit_sincos": lambda: AnySizeViT(**VIT, pos_embed_type="sincos"),
        "vit_2d_classification": lambda: AnySizeViT(**vit2d, classification=True, num_classes=3),
        "unetr": lambda: AnySizeUNETR(**UNETR_KW),
    }


@pytest.mark.parametrize("name", list(_export_nets()))
def test_torch_export_plain_and_padded_equals_eager(name):
    """Issue 32 item 9: ``torch.export.export`` failed on both classes even with a plain tensor
    at the built size (``as_subclass(Tensor)`` on the traced input), and a padded batch with a
    learned table needed host reads of each item's box. Both now export; the exported program's
    outputs equal eager's, whole tensors, on the example and on other data of the same shapes."""
    net = _export_nets()[name]().eval()
    n = len(net.patch_size)
    built = (32,) * 3 if name == "unetr" else tuple(VIT["img_size"][:n]) if n == 3 else (16, 24)
    plain = torch.randn(2, 1, *built)
    ep = torch.export.export(net, (plain,))
    for x in (plain, torch.randn(2, 1, *built)):
        for got, want in zip(_flat(ep.module()(x)), _flat(net(x)), strict=True):
            assert_close(got, want, rtol=1e-5, atol=1e-5)
    sizes = [built, tuple(s - 3 - i for i, s in enumerate(built))]  # padded at the end, partial patches
    nested = nested_tensor_from_tensor_list(_volumes(sizes))
    tensors, mask = nested.decompose()
    ep = torch.export.export(_OnTensors(net), (tensors, mask))
    # other items on the same padded canvas (the program is exported for these shapes)
    other_sizes = [(built[0], *(s // 2 + 1 for s in built[1:])), (built[0] // 2 + 1, *built[1:])]
    other = nested_tensor_from_tensor_list(_volumes(other_sizes, seed=1))
    for batch in (nested, other):
        for got, want in zip(_flat(ep.module()(*batch.decompose())), _flat(net(batch)), strict=True):
            assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_torch_export_sincos_vit_with_dynamic_batch_and_sizes():
    """A sin-cos ViT exports once for any batch and any size (whole patches, at least 2 per axis),
    plain or padded; a learned table is resampled per size, so it exports at the example's sizes."""
    from torch.export import Dim

    from vispos import NestedTensor

    net = AnySizeViT(**VIT, pos_embed_type="sincos").eval()
    batch, grid = Dim("B", min=1, max=8), [Dim(f"g{i}", min=2, max=16) for i in range(3)]
    spatial = {2 + i: 4 * g for i, g in enumerate(grid)}
    ep = torch.export.export(net, (torch.randn(2, 1, 16, 24, 8),), dynamic_shapes=({0: batch, **spatial},))
    x = torch.randn(3, 1, 8, 12, 32)
    assert_close(ep.module()(x)[0], net(x)[0], rtol=1e-5, atol=1e-5)
    nested = nested_tensor_from_tensor_list(_volumes([(16, 24, 8), (9, 13, 8)]))
    ep = torch.export.export(_OnTensors(net), nested.decompose(), dynamic_shapes={
        "tensors": {0: batch, **spatial}, "mask": {0: batch, **{k - 1: v for k, v in spatial.items()}}})
    other = nested_tensor_from_tensor_list(_volumes([(20, 8, 12), (5, 16, 3), (8, 7, 8)], seed=2))  # canvas (20, 16, 12)
    assert_close(ep.module()(*other.decompose())[0], net(NestedTensor(*other.decompose()))[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode, antialias", [
    ("bicubic", True), ("bicubic", False), ("bilinear", True), ("area", False), ("nearest", False),
    ("trilinear", False), ("area", True),
])
def test_traced_resampling_equals_the_host_path(mode, antialias):
    """What export and compile run for a learned table on a padded batch (per-axis weights read
    off ``F.interpolate``, no host read) against the eager path (each item's box read on the host,
    ``resample_abs_pos_embed``), on items padded before, after, everywhere and not at all."""
    n = 3 if mode == "trilinear" or (mode == "area" and antialias) else 2
    kw = dict(VIT, img_size=(20, 28, 12)[:n], spatial_dims=n)
    net = AnySizeViT(**kw, resample_mode=mode, antialias=antialias).eval()
    with torch.no_grad():
        net.patch_embedding.position_embeddings.normal_()
    grid = (9, 3, 4)[:n]
    g = torch.Generator().manual_seed(3)
    token_valid = torch.rand(5, *grid, generator=g) > 0.5
    token_valid[0] = True
    token_valid[1] = False
    token_valid[2] = False
    token_valid[(2, *(slice(1, k) for k in grid))] = True  # padding before the item
    token_valid[3] = False
    token_valid[(3, *(slice(0, max(k - 2, 1)) for k in grid))] = True  # after
    host = net._positions(token_valid, grid, 5, None)
    assert_close(net._resampled_items(token_valid, grid), host, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("build", [lambda: AnySizeViT(**VIT), lambda: AnySizeUNETR(**UNETR_KW)])
def test_torchscript_is_refused_with_a_clear_error(build):
    """MONAI's ViT and UNETR script; these do not (the forward takes NestedTensors and builds each
    item's positions in Python): script and trace say so and name torch.export, and MONAI's own
    class with the same state_dict scripts and gives the same output at the built size."""
    net = build().eval()
    name = type(net).__name__
    monai_cls = ViT if name == "AnySizeViT" else UNETR
    size = VIT["img_size"] if name == "AnySizeViT" else UNETR_KW["img_size"]
    x = torch.randn(1, 1, *size)
    with pytest.raises(TypeError, match=rf"{name} does not support TorchScript \(torch.jit.script\): .* Use torch.export.export"):
        torch.jit.script(net)
    with pytest.raises(TypeError, match=rf"{name} does not support TorchScript \(torch.jit.trace\)"):
        torch.jit.trace(net, (x,))
    twin = monai_cls(**(VIT if name == "AnySizeViT" else UNETR_KW)).eval()
    twin.load_state_dict(net.state_dict())
    scripted = torch.jit.script(twin)
    with torch.no_grad():
        for got, want in zip(_flat(scripted(x)), _flat(net(x)), strict=True):
            assert_close(got, want, rtol=1e-5, atol=1e-6)
