"""DinoV3RotaryEmbedding: timm's and transformers' numbers, N-D, padded batches, augmentation."""

import copy
import itertools
import math
import pickle

import pytest
import torch
from torch.testing import assert_close

import vispos
from vispos import DinoV3RotaryEmbedding
from vispos.encodings import _rope_grid

timm_pe = pytest.importorskip("timm.layers.pos_embed_sincos")
TimmDino = timm_pe.RotaryEmbeddingDinoV3

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
PERIODS = [dict(temperature=100.0), dict(temperature=10000.0), dict(min_period=0.5, max_period=40.0)]


def _box_mask(spatial, boxes):
    """Tensor[B, *S] bool, item ``b`` valid on ``boxes[b] = (start, size)`` (True = padding)."""
    mask = torch.ones(len(boxes), *spatial, dtype=torch.bool)
    for b, (start, size) in enumerate(boxes):
        mask[(b,) + tuple(slice(a, a + s) for a, s in zip(start, size))] = False
    return mask


def _crop(table, spatial, start, size):
    """Rows of a flat [prod(S), C] table inside the box, row-major: [prod(size), C]."""
    grid = table.view(*spatial, table.shape[-1])
    return grid[tuple(slice(a, a + s) for a, s in zip(start, size))].reshape(-1, table.shape[-1])


@pytest.mark.parametrize("normalize", ["separate", "min", "max"])
@pytest.mark.parametrize("periods", range(len(PERIODS)))
@pytest.mark.parametrize("offset", [0.0, 0.5])
@pytest.mark.parametrize("indexing", ["ij", "xy"])
@pytest.mark.parametrize("half", [True, False])
def test_eval_equals_timm_bitwise(normalize, periods, offset, indexing, half):
    kw = dict(normalize_coords=normalize, grid_offset=offset, grid_indexing=indexing, rotate_half=half, **PERIODS[periods])
    ours, theirs = DinoV3RotaryEmbedding(64, **kw), TimmDino(64, **kw)
    for shape in ([5, 7], [14, 14], [1, 9]):
        assert torch.equal(ours.get_embed(shape), theirs.get_embed(shape)), shape
    assert torch.equal(ours.periods, theirs.periods)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_dtypes_as_timm(dtype):
    ours, theirs = DinoV3RotaryEmbedding(32), TimmDino(32)
    assert torch.equal(ours.get_embed([6, 5], dtype=dtype), theirs.get_embed([6, 5], dtype=dtype))
    # .half() / .double() on the module: periods stay at float32 or wider, as timm keeps them
    ours, theirs = DinoV3RotaryEmbedding(32, feat_shape=[4, 4]).to(dtype), TimmDino(32, feat_shape=[4, 4]).to(dtype)
    assert ours.periods.dtype == theirs.periods.dtype
    for a, b in ((ours.get_embed(), theirs.get_embed()), (ours.get_embed([3, 7]), theirs.get_embed([3, 7]))):
        assert a.dtype == b.dtype and torch.equal(a, b)


def test_cached_grid_state_dict_and_buffers_as_timm():
    ours, theirs = DinoV3RotaryEmbedding(32, feat_shape=[6, 8]), TimmDino(32, feat_shape=[6, 8])
    assert dict(ours.named_buffers()).keys() == dict(theirs.named_buffers()).keys() == {"periods", "pos_embed_cached"}
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    ours.load_state_dict(theirs.state_dict(), strict=True)
    assert torch.equal(ours.get_embed(), theirs.get_embed())
    ours.update_feat_shape([3, 4])
    theirs.update_feat_shape([3, 4])
    assert ours.feat_shape == theirs.feat_shape == [3, 4]
    assert torch.equal(ours.get_embed(), theirs.get_embed())
    plain = DinoV3RotaryEmbedding(32)
    assert dict(plain.named_buffers()).keys() == dict(TimmDino(32).named_buffers()).keys() == {"periods"}
    plain.load_state_dict(TimmDino(32).state_dict(), strict=True)


def test_results_belong_to_the_caller():
    rope = DinoV3RotaryEmbedding(16, feat_shape=[4, 4])
    first = rope.get_embed()
    expected = first.clone()
    first.fill_(7.0)
    assert torch.equal(rope.get_embed(), expected)
    assert not torch.equal(rope.pos_embed_cached, first)


def test_get_batch_embeds_as_timm():
    ours, theirs = DinoV3RotaryEmbedding(32), TimmDino(32)
    shapes = [(3, 4), (5, 2), (6, 6)]
    for a, b in zip(ours.get_batch_embeds(shapes), theirs.get_batch_embeds(shapes)):
        assert torch.equal(a, b)
    assert torch.equal(ours.get_batch_embeds(shapes, seq_len=40), theirs.get_batch_embeds(shapes, seq_len=40))
    assert ours.get_batch_embeds([]) == []


@pytest.mark.parametrize("half", [True, False])
def test_forward_as_timm(half):
    ours, theirs = DinoV3RotaryEmbedding(16, rotate_half=half), TimmDino(16, rotate_half=half)
    x = torch.randn(2, 16, 5, 6)
    assert_close(ours(x), theirs(x))
    assert_close(ours(x.bfloat16()), theirs(x.bfloat16()))


def _transformers_rope(hidden, heads, theta=100.0, **augs):
    cfg_mod = pytest.importorskip("transformers.models.dinov3_vit.configuration_dinov3_vit")
    model_mod = pytest.importorskip("transformers.models.dinov3_vit.modeling_dinov3_vit")
    config = cfg_mod.DINOv3ViTConfig(hidden_size=hidden, num_attention_heads=heads, patch_size=16, rope_theta=theta, **augs)
    return model_mod.DINOv3ViTRopePositionEmbedding(config)


@pytest.mark.parametrize("shape", [(14, 14), (5, 9), (1, 3)])
@pytest.mark.parametrize("theta", [100.0, 10000.0])
def test_eval_equals_transformers(shape, theta):
    peer = _transformers_rope(384, 6, theta).eval()
    cos, sin = peer(torch.zeros(1, 3, 16 * shape[0], 16 * shape[1]))
    ours = DinoV3RotaryEmbedding(64, temperature=theta).get_embed(list(shape))
    # transformers multiplies by 1 / base^e where timm and vispos divide by base^e: float32 rounding
    assert_close(ours[:, :64], sin, rtol=0, atol=2e-6)
    assert_close(ours[:, 64:], cos, rtol=0, atol=2e-6)


def test_training_equals_transformers_under_one_seed():
    augs = dict(pos_embed_shift=0.2, pos_embed_jitter=1.3, pos_embed_rescale=2.0)
    peer = _transformers_rope(128, 2, **augs).train()
    ours = DinoV3RotaryEmbedding(64, shift_coords=0.2, jitter_coords=1.3, rescale_coords=2.0).train()
    for seed in range(5):
        torch.manual_seed(seed)
        cos, sin = peer(torch.zeros(1, 3, 16 * 6, 16 * 7))
        torch.manual_seed(seed)
        table = ours.get_embed([6, 7])
        assert_close(table[:, :64], sin, rtol=0, atol=5e-6)
        assert_close(table[:, 64:], cos, rtol=0, atol=5e-6)


AUGS = [dict(shift_coords=0.5), dict(jitter_coords=1.5), dict(rescale_coords=2.0),
        dict(shift_coords=0.1, jitter_coords=1.2, rescale_coords=1.7)]


@pytest.mark.parametrize("augs", AUGS)
def test_training_draws_equal_timm(augs):
    ours, theirs = DinoV3RotaryEmbedding(32, **augs).train(), TimmDino(32, **augs).train()
    for seed in range(4):
        torch.manual_seed(seed)
        a = theirs.get_embed([5, 6])
        torch.manual_seed(seed)
        assert torch.equal(ours.get_embed([5, 6]), a)
    # the cached grid is not augmented, but get_embed() of a cached module is (timm's rule)
    ours, theirs = DinoV3RotaryEmbedding(32, feat_shape=[3, 3], **augs).train(), TimmDino(32, feat_shape=[3, 3], **augs).train()
    torch.manual_seed(9)
    a = theirs.get_embed()
    torch.manual_seed(9)
    assert torch.equal(ours.get_embed(), a)
    assert torch.equal(ours.pos_embed_cached, theirs.pos_embed_cached)


def test_eval_never_augments_nor_draws():
    rope = DinoV3RotaryEmbedding(32, shift_coords=1.0, jitter_coords=2.0, rescale_coords=2.0).eval()
    plain = DinoV3RotaryEmbedding(32)
    state = torch.get_rng_state()
    for args in ([5, 5], [3, 8]):
        assert torch.equal(rope.get_embed(args), plain.get_embed(args))
    assert torch.equal(rope.get_embed(mask=torch.zeros(2, 4, 4, dtype=torch.bool)), plain.get_embed([4, 4]).expand(2, -1, -1))
    assert torch.equal(torch.get_rng_state(), state)
    rope.train()
    assert not torch.equal(rope.get_embed([5, 5]), plain.get_embed([5, 5]))
    assert not torch.equal(torch.get_rng_state(), state)


def test_augmentation_distributions():
    """Draws from torch's generator: shift ~ U(-s, s) per axis, log jitter ~ U(-ln J, ln J) per
    axis, log rescale ~ U(-ln R, ln R); one Kolmogorov-Smirnov test each, fixed seed."""
    stats = pytest.importorskip("scipy.stats")
    torch.manual_seed(0)
    draws = [_rope_grid.draw_coord_augs(3, 0.4, 1.5, 3.0, torch.device("cpu")) for _ in range(2000)]
    shift = torch.stack([d[0] for d in draws])
    jitter = torch.stack([d[1] for d in draws]).log()
    rescale = torch.stack([d[2] for d in draws]).log()
    for values, high in ((shift, 0.4), (jitter, math.log(1.5)), (rescale, math.log(3.0))):
        assert values.abs().max() <= high + 1e-6
        for column in values.T:
            assert stats.kstest(column.double().numpy(), stats.uniform(-high, 2 * high).cdf).pvalue > 0.01
    # axes drawn independently
    assert abs(torch.corrcoef(shift.T)[0, 1]) < 0.1


def test_augmentation_is_one_affine_map_of_the_coordinates():
    """Recover the coordinates from a table whose first period is 4 (angle = pi p / 2, |p| <= 2
    keeps it invertible from sin and cos): ``p' = ((p + s) * j) * r``, one draw per call."""
    rope = DinoV3RotaryEmbedding(8, min_period=16.0, max_period=32.0, shift_coords=0.3, jitter_coords=1.2,
                                 rescale_coords=1.2).train()
    plain = DinoV3RotaryEmbedding(8, min_period=16.0, max_period=32.0)
    torch.manual_seed(4)
    table = rope.get_embed([4, 6])
    torch.manual_seed(4)
    s, j, r = _rope_grid.draw_coord_augs(2, 0.3, 1.2, 1.2, torch.device("cpu"))

    def coords(t):  # channel 0 / 2 (first period of each axis block, rotate_half layout)
        return torch.stack([torch.atan2(t[:, k], t[:, 8 + k]) * 16 / (2 * math.pi) for k in (0, 2)], -1)

    expected = ((coords(plain.get_embed([4, 6])) + s) * j) * r
    assert_close(coords(table), expected, rtol=0, atol=1e-5)


def _reference_3d(rope, spatial):
    """A slow reference from timm's own N-D grid builder and DINOv3's formula."""
    perm = rope.grid_indexing
    coords = timm_pe._build_grid(list(spatial), grid_type="centered", grid_offset=rope.grid_offset,
                                 grid_indexing=perm, normalize_coords=rope.normalize_coords).reshape(-1, 3)
    angles = (2 * math.pi * coords[:, :, None] / rope.periods[None, None, :]).flatten(1)
    layout = (lambda a: torch.cat([a, a], -1)) if rope.rotate_half else (lambda a: a.repeat_interleave(2, -1))
    return torch.cat([layout(angles.sin()), layout(angles.cos())], -1)


@pytest.mark.parametrize("normalize", ["separate", "min", "max"])
@pytest.mark.parametrize("indexing", ["ij", "xy"])
@pytest.mark.parametrize("half", [True, False])
def test_3d_equals_reference(normalize, indexing, half):
    rope = DinoV3RotaryEmbedding(48, normalize_coords=normalize, grid_indexing=indexing, rotate_half=half,
                                 grid_offset=0.25, num_axes=3)
    for spatial in ((3, 4, 5), (6, 2, 2)):
        assert torch.equal(rope.get_embed(list(spatial)), _reference_3d(rope, spatial))
    # each axis gets the 2D ladder: base^(k / q), q = dim / 6
    assert_close(rope.periods, 100.0 ** (torch.arange(8) / 8))


PADDED = {
    2: ((9, 11), [((0, 0), (9, 11)), ((0, 0), (5, 7)), ((2, 1), (5, 9)), ((4, 3), (5, 8)), ((3, 3), (3, 5))]),
    3: ((5, 6, 7), [((0, 0, 0), (5, 6, 7)), ((0, 0, 0), (2, 3, 4)), ((1, 1, 1), (3, 4, 5)), ((2, 0, 3), (3, 6, 2))]),
}


@pytest.mark.parametrize("num_axes", [2, 3])
@pytest.mark.parametrize("normalize", ["separate", "min", "max"])
@pytest.mark.parametrize("indexing", ["ij", "xy"])
@pytest.mark.parametrize("half", [True, False])
@pytest.mark.parametrize("device", DEVICES)
def test_padded_items_get_their_alone_rotation(num_axes, normalize, indexing, half, device):
    spatial, boxes = PADDED[num_axes]
    rope = DinoV3RotaryEmbedding(12 * num_axes, normalize_coords=normalize, grid_indexing=indexing,
                                 rotate_half=half, grid_offset=0.5, num_axes=num_axes).to(device)
    mask = _box_mask(spatial, boxes).to(device)
    table = rope.get_embed(mask=mask)
    assert table.shape == (len(boxes), math.prod(spatial), 4 * rope.dim // 2)
    for b, (start, size) in enumerate(boxes):
        assert torch.equal(_crop(table[b], spatial, start, size), rope.get_embed(list(size)))
        pad = mask[b].flatten()
        assert (table[b][pad, : rope.dim] == 0).all() and (table[b][pad, rope.dim :] == 1).all()


def test_symmetric_padding_as_monai_pads():
    """MONAI's SpatialPad centres each volume: the mask from its pad widths, and each item's
    embedding equals the embedding of the unpadded volume."""
    pad_mod = pytest.importorskip("monai.transforms")
    volumes = [torch.randn(1, 4, 6, 3), torch.randn(1, 7, 5, 5), torch.randn(1, 2, 2, 6)]
    canvas = (7, 6, 6)
    pad = pad_mod.SpatialPad(canvas, method="symmetric")
    # MONAI pads a volume of ones with zeros: the zeros are the padding
    mask = torch.stack([torch.as_tensor(pad(torch.ones(1, *v.shape[1:])))[0] == 0 for v in volumes])
    assert [int((~m).sum()) for m in mask] == [v[0].numel() for v in volumes]
    assert mask[2, 0].all() and not mask[2, 2:4, 2:4].all()  # padded on both sides
    rope = DinoV3RotaryEmbedding(24, num_axes=3)
    table = rope.get_embed(mask=mask)
    for b, v in enumerate(volumes):
        assert torch.equal(table[b][~mask[b].flatten()], rope.get_embed(list(v.shape[1:])))


def test_mask_with_holes_uses_the_bounding_box_and_identity_in_holes():
    mask = _box_mask((6, 8), [((1, 2), (4, 5))])
    mask[0, 2, 3] = mask[0, 4, 6] = True  # holes inside the box
    rope = DinoV3RotaryEmbedding(16)
    table = rope.get_embed(mask=mask)[0]
    alone = rope.get_embed([4, 5]).view(4, 5, -1).clone()
    alone[1, 1] = alone[3, 4] = torch.cat([torch.zeros(16), torch.ones(16)])
    assert torch.equal(_crop(table, (6, 8), (1, 2), (4, 5)), alone.view(20, -1))


def test_fully_padded_item_and_empty_batch():
    rope = DinoV3RotaryEmbedding(8)
    mask = torch.ones(2, 3, 4, dtype=torch.bool)
    mask[0, :2, :2] = False
    table = rope.get_embed(mask=mask)
    assert (table[1, :, :8] == 0).all() and (table[1, :, 8:] == 1).all()
    assert rope.get_embed(mask=torch.ones(0, 3, 4, dtype=torch.bool)).shape == (0, 12, 16)


def test_mask_property_random_boxes():
    """Random boxes anywhere in random canvases, 2D and 3D: valid tokens equal the item alone."""
    gen = torch.Generator().manual_seed(0)
    for trial in range(12):
        n = 2 + trial % 2
        spatial = tuple(int(v) for v in torch.randint(1, 8, (n,), generator=gen))
        boxes = []
        for _ in range(3):
            size = tuple(int(torch.randint(1, s + 1, (1,), generator=gen)) for s in spatial)
            start = tuple(int(torch.randint(0, s - z + 1, (1,), generator=gen)) for s, z in zip(spatial, size))
            boxes.append((start, size))
        rope = DinoV3RotaryEmbedding(4 * n, normalize_coords=("separate", "min", "max")[trial % 3], num_axes=n)
        table = rope.get_embed(mask=_box_mask(spatial, boxes))
        for b, (start, size) in enumerate(boxes):
            assert torch.equal(_crop(table[b], spatial, start, size), rope.get_embed(list(size)))


def test_every_padding_route_gives_the_same_tables(monkeypatch):
    """Boxes known on the host (a Padding from sizes, a CPU mask classified once), a mask that is
    not boxes, and the device branch (no host read: boxes computed on the device, one select)."""
    spatial, boxes = PADDED[2]
    mask = _box_mask(spatial, boxes)
    rope = DinoV3RotaryEmbedding(16)
    host = rope.get_embed(mask=mask)
    starts = [start for start, _ in boxes]
    sizes = [size for _, size in boxes]
    padding = vispos.Padding.from_sizes(sizes, spatial, starts=starts)
    assert padding.kind == "rectangular"
    assert torch.equal(rope.get_embed(mask=padding), host)
    assert torch.equal(rope.get_embed(mask=vispos.Padding.from_mask(mask, classify=False)), host)
    monkeypatch.setattr(vispos._tracing, "host_side", lambda device: False)
    monkeypatch.setattr(_rope_grid, "host_side", lambda device: False)
    assert vispos.Padding.from_mask(mask).kind == "arbitrary"
    assert torch.equal(rope.get_embed(mask=mask), host)


def test_symmetric_padding_object_equals_each_item_alone():
    """MONAI-style centred boxes as padcore's Padding describes them."""
    sizes = [(3, 4, 5), (1, 2, 2), (4, 4, 4)]
    padding = vispos.Padding.from_sizes(sizes, (4, 5, 6), starts="symmetric")
    rope = DinoV3RotaryEmbedding(24, num_axes=3)
    table = rope.get_embed(mask=padding)
    for b, size in enumerate(sizes):
        region = padding.region(b)
        assert torch.equal(_crop(table[b], (4, 5, 6), [r.start for r in region], size), rope.get_embed(list(size)))
        pad = padding.mask[b].flatten()
        assert (table[b][pad, :24] == 0).all() and (table[b][pad, 24:] == 1).all()


def test_training_batch_shares_one_draw_with_the_item_alone():
    spatial, boxes = PADDED[2]
    rope = DinoV3RotaryEmbedding(16, shift_coords=0.5, jitter_coords=1.5, rescale_coords=1.5).train()
    torch.manual_seed(2)
    table = rope.get_embed(mask=_box_mask(spatial, boxes))
    for b, (start, size) in enumerate(boxes):
        torch.manual_seed(2)
        assert torch.equal(_crop(table[b], spatial, start, size), rope.get_embed(list(size)))


def test_nested_tensor_and_forward_with_mask():
    spatial, boxes = PADDED[2]
    mask = _box_mask(spatial, boxes)
    rope = DinoV3RotaryEmbedding(16)
    nt = vispos.NestedTensor(torch.randn(len(boxes), 16, *spatial), mask)
    assert torch.equal(rope.get_embed(mask=nt), rope.get_embed(mask=mask))
    out = rope(nt.tensors, mask=mask)
    for b, (start, size) in enumerate(boxes):
        sl = (slice(None),) + tuple(slice(a, a + s) for a, s in zip(start, size))
        assert_close(out[b][sl], rope(nt.tensors[b : b + 1][(slice(None),) + sl])[0])
        assert torch.equal(out[b][:, mask[b]], nt.tensors[b][:, mask[b]])  # padding untouched
    unpadded = vispos.NestedTensor(torch.randn(2, 16, 3, 4), None)
    assert torch.equal(rope.get_embed(mask=unpadded), rope.get_embed([3, 4]).expand(2, -1, -1))


def test_padded_scope_serves_the_batch_and_nests():
    rope = DinoV3RotaryEmbedding(8)
    a = _box_mask((3, 4), [((0, 0), (2, 2)), ((0, 0), (3, 4))])
    b = _box_mask((3, 4), [((1, 1), (2, 3))])
    with rope.padded(a):
        assert torch.equal(rope.get_embed([3, 4]), rope.get_embed(mask=a).unsqueeze(1))
        with rope.padded(b):
            assert torch.equal(rope.get_embed(), rope.get_embed(mask=b).unsqueeze(1))
        assert rope.get_embed().shape == (2, 1, 12, 16)
        with pytest.raises(ValueError, match="disagrees"):
            rope.get_embed([4, 4])
        assert torch.equal(rope.get_batch_embeds([(3, 4)])[0], DinoV3RotaryEmbedding(8).get_embed([3, 4]))
        assert DinoV3RotaryEmbedding(8).get_embed([3, 4]).shape == (12, 16)  # other modules: no scope
    assert rope.get_embed([3, 4]).shape == (12, 16)


def test_from_timm_state_pickle_and_repr():
    theirs = TimmDino(32, min_period=1.0, max_period=50.0, feat_shape=[4, 5], normalize_coords="max",
                      grid_offset=0.5, grid_indexing="xy", rotate_half=False, shift_coords=0.1).train()
    ours = DinoV3RotaryEmbedding.from_timm(theirs)
    assert ours.training and torch.equal(ours.eval().get_embed(), theirs.eval().get_embed())
    assert repr(ours) == (
        "DinoV3RotaryEmbedding(dim=32, min_period=1.0, max_period=50.0, feat_shape=[4, 5], "
        "normalize_coords='max', grid_offset=0.5, grid_indexing='xy', rotate_half=False, shift_coords=0.1, num_axes=2)"
    )
    assert repr(DinoV3RotaryEmbedding(24, num_axes=3)) == (
        "DinoV3RotaryEmbedding(dim=24, temperature=100.0, feat_shape=None, normalize_coords='separate', "
        "grid_offset=0.0, grid_indexing='ij', rotate_half=True, num_axes=3)"
    )
    for clone in (copy.deepcopy(ours), pickle.loads(pickle.dumps(ours))):
        assert torch.equal(clone.get_embed(), ours.get_embed())
    with pytest.raises(TypeError, match="RotaryEmbeddingDinoV3"):
        DinoV3RotaryEmbedding.from_timm(torch.nn.Linear(2, 2))


def test_no_parameters_and_meta_init():
    rope = DinoV3RotaryEmbedding(16, feat_shape=[3, 3])
    assert list(rope.parameters()) == []
    with torch.device("meta"):
        meta = DinoV3RotaryEmbedding(16, feat_shape=[3, 3])
    meta = meta.to_empty(device="cpu")
    meta.init_non_persistent_buffers()
    assert torch.equal(meta.get_embed(), rope.get_embed())


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(dim=30), ValueError, "dim must be a positive multiple of 4"),
        (dict(dim=32, num_axes=3), ValueError, "multiple of 6"),
        (dict(dim=2.0), TypeError, "dim"),
        (dict(dim=32, num_axes=4), ValueError, "num_axes"),
        (dict(dim=32, temperature=0.0), ValueError, "temperature"),
        (dict(dim=32, temperature=None), ValueError, "give a temperature"),
        (dict(dim=32, min_period=1.0), ValueError, "both min_period and max_period"),
        (dict(dim=32, min_period=-1.0, max_period=2.0), ValueError, "min_period must be > 0"),
        (dict(dim=32, min_period="1", max_period=2.0), TypeError, "min_period"),
        (dict(dim=32, normalize_coords="mean"), ValueError, "normalize_coords"),
        (dict(dim=32, grid_indexing="yx"), ValueError, "grid_indexing"),
        (dict(dim=32, rotate_half=1), TypeError, "rotate_half"),
        (dict(dim=32, grid_offset="0"), TypeError, "grid_offset"),
        (dict(dim=32, shift_coords=-0.1), ValueError, "shift_coords must be >= 0"),
        (dict(dim=32, jitter_coords=0.5), ValueError, "jitter_coords must be >= 1"),
        (dict(dim=32, rescale_coords=float("inf")), ValueError, "rescale_coords must be a finite number"),
        (dict(dim=32, shift_coords=True), TypeError, "shift_coords"),
        (dict(dim=32, feat_shape=[4, 4, 4]), ValueError, "feat_shape must hold 2 ints"),
        (dict(dim=32, feat_shape=[4, 0]), ValueError, "feat_shape must hold positive ints"),
        (dict(dim=32, dtype=torch.int32), TypeError, "dtype"),
    ],
)
def test_constructor_errors(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        DinoV3RotaryEmbedding(**kwargs)


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda r: r.get_embed(), ValueError, "needs a shape"),
        (lambda r: r.get_embed([4]), ValueError, "shape must hold 2 ints"),
        (lambda r: r.get_embed([4, 4.0]), TypeError, "shape must hold ints"),
        (lambda r: r.get_embed([4, 4], dtype=torch.int64), TypeError, "dtype"),
        (lambda r: r.get_embed(mask=torch.zeros(2, 4, 4)), TypeError, "bool"),
        (lambda r: r.get_embed(mask=torch.zeros(2, 4, 4, 4, dtype=torch.bool)), ValueError, "num_axes=2"),
        (lambda r: r.get_embed([4, 5], mask=torch.zeros(2, 4, 4, dtype=torch.bool)), ValueError, "disagrees"),
        (lambda r: r.get_embed(mask="padding"), TypeError, "mask"),
        (lambda r: r.get_batch_embeds([(2, 2)], seq_len=3), ValueError, "seq_len must be at least"),
        (lambda r: r(torch.zeros(1, 8, 3, 3)), ValueError, r"dim=16"),
        (lambda r: r(torch.zeros(1, 16, 3, 3, dtype=torch.long)), TypeError, "floating"),
        (lambda r: r(torch.zeros(2, 16, 3, 3), mask=torch.zeros(3, 3, 3, dtype=torch.bool)), ValueError, "3 items"),
        (lambda r: r.padded(torch.zeros(2, 4, 4)), TypeError, "bool"),
    ],
)
def test_call_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call(DinoV3RotaryEmbedding(16))


def test_inputs_are_not_modified():
    mask = _box_mask((4, 5), [((1, 1), (2, 3))])
    before = mask.clone()
    x = torch.randn(1, 16, 4, 5)
    x0 = x.clone()
    DinoV3RotaryEmbedding(16)(x, mask=mask)
    assert torch.equal(mask, before) and torch.equal(x, x0)


@pytest.mark.parametrize("shape", list(itertools.product([1, 3], [2, 5])))
def test_apply_rot_embed_cat_equals_timm(shape):
    x = torch.randn(2, 3, math.prod(shape), 16)
    emb = DinoV3RotaryEmbedding(16).get_embed(list(shape))
    for half in (True, False):
        assert_close(vispos.apply_rot_embed_cat(x, emb, half), timm_pe.apply_rot_embed_cat(x, emb, half))


@pytest.mark.slow
def test_compiles_fullgraph_with_a_mask():
    """No host read on the traced path: one graph, numbers within float32 rounding."""
    rope = DinoV3RotaryEmbedding(16)
    spatial, boxes = PADDED[2]
    mask = _box_mask(spatial, boxes)
    compiled = torch.compile(lambda m: rope.get_embed(mask=m), fullgraph=True, dynamic=False)
    assert_close(compiled(mask), rope.get_embed(mask=mask), rtol=0, atol=1e-6)
