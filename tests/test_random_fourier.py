"""Random Fourier position features (issue 33): ``PositionEmbeddingRandom``, its transformers twin
``SamPositionalEmbedding`` and the ``monai_fourier`` preset, against segment_anything 1.0,
transformers' SAM / SAM 2 and MONAI on whole tensors; padded batches in 2D and 3D."""

from __future__ import annotations

import copy
import math
import pickle

import numpy as np
import pytest
import torch
from monai.networks.blocks.pos_embed_utils import build_fourier_position_embedding
from segment_anything.modeling.prompt_encoder import PositionEmbeddingRandom as SamRandom
from segment_anything.modeling.prompt_encoder import PromptEncoder
from torch.testing import assert_close
from transformers.models.sam.configuration_sam import SamVisionConfig
from transformers.models.sam.modeling_sam import SamPositionalEmbedding as HFSam
from transformers.models.sam2.configuration_sam2 import Sam2PromptEncoderConfig
from transformers.models.sam2.modeling_sam2 import Sam2PositionalEmbedding as HFSam2

import vispos
from vispos import NestedTensor, Padding, PositionEmbeddingRandom, SamPositionalEmbedding, monai_fourier
from vispos.backbones import SpatialPositionEmbedding

EXACT = dict(rtol=0, atol=0)


def _pair(num_pos_feats=64, seed=0, **kwargs):
    """segment_anything's module and vispos', drawn under the same seed."""
    torch.manual_seed(seed)
    sam = SamRandom(num_pos_feats)
    torch.manual_seed(seed)
    ours = PositionEmbeddingRandom(num_pos_feats, **kwargs)
    return sam, ours


def _reference(matrix, spatial, starts, sizes, *, coord_order="xy", align_corners=False, coord_range=(-1.0, 1.0),
               extent=None, spacing=None):
    """The documented rule in float64, cell by cell: ``Tensor[B, 2K, *S]``. Item ``b``'s cell ``i``
    along axis ``a`` is at ``c = (i - start + 0.5) / L`` (``(i - start) / (L - 1)`` with corners,
    ``(i - start + 0.5) * s / E`` with an extent), ``u = lo + c (hi - lo)``, then
    ``[sin(2 pi u G), cos(2 pi u G)]``."""
    g = matrix.double()
    n = len(spatial)
    lo, hi = coord_range
    out = []
    for b in range(len(starts)):
        axes = []
        for a, size in enumerate(spatial):
            p = torch.arange(size, dtype=torch.float64) - starts[b][a]
            length = float(sizes[b][a])
            if not align_corners:
                p = p + 0.5
            if extent is not None:
                c = p * (1.0 if spacing is None else float(spacing[b][a])) / extent
            else:
                c = p / max(length - 1.0 if align_corners else length, 1.0)
            axes.append(lo + c * (hi - lo))
        grid = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1)  # (*S, n), tensor order
        if coord_order == "xy":
            grid = grid.flip(-1)
        angles = 2 * math.pi * grid @ g
        out.append(torch.cat([angles.sin(), angles.cos()], -1).permute(n, *range(n)))
    return torch.stack(out).float()


def _angle_tol(matrix, reach=1.0):
    """float32 rounding of angles up to ``2 pi * reach * sum |G|`` (``reach``: the largest
    ``|u|``): a few ulps of the largest angle."""
    largest = 2 * math.pi * matrix.abs().sum(0).max().item() * 2 * reach
    return dict(rtol=0, atol=8 * largest * 2.0**-23 + 1e-6)


# ---------------------------------------------------------------------------- segment_anything
def test_same_seed_draws_sams_matrix_and_buffer_name():
    sam, ours = _pair(128, seed=7)
    assert_close(ours.positional_encoding_gaussian_matrix, sam.positional_encoding_gaussian_matrix, **EXACT)
    assert list(ours.state_dict()) == ["positional_encoding_gaussian_matrix"]
    torch.manual_seed(1)
    scaled = SamRandom(16, scale=2.5)
    torch.manual_seed(1)
    assert_close(PositionEmbeddingRandom(16, 2.5).positional_encoding_gaussian_matrix,
                 scaled.positional_encoding_gaussian_matrix, **EXACT)


@pytest.mark.parametrize("size", [(64, 64), (7, 5), (1, 1), (3, 40), (50, 13)])
@pytest.mark.parametrize("num_pos_feats", [128, 8])
def test_dense_grid_equals_segment_anything(size, num_pos_feats):
    sam, ours = _pair(num_pos_feats)
    expected, got = sam(size), ours(size)
    assert_close(got, expected, **EXACT)
    assert got.stride() == expected.stride()  # SAM's own layout: channels-first view, channel-last memory


@pytest.mark.parametrize("image_size", [(1024, 1024), (600, 1024), (37, 91)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_coords_equal_segment_anything(image_size, dtype):
    sam, ours = _pair(64)
    coords = (torch.rand(3, 7, 2) * torch.tensor(image_size[::-1])).to(dtype)
    before = coords.clone()
    assert_close(ours.forward_with_coords(coords, image_size), sam.forward_with_coords(coords, image_size), **EXACT)
    assert_close(coords, before, **EXACT)  # the caller's points are not written


def test_loads_sams_state_dict_and_swaps_into_its_prompt_encoder():
    torch.manual_seed(0)
    encoder = PromptEncoder(embed_dim=32, image_embedding_size=(8, 8), input_image_size=(64, 64), mask_in_chans=4)
    ours = PositionEmbeddingRandom(16)
    ours.load_state_dict(encoder.pe_layer.state_dict())
    swapped = copy.deepcopy(encoder)
    swapped.pe_layer = ours
    points = (torch.rand(2, 3, 2) * 64, torch.tensor([[1, 0, 1], [0, 1, 1]]))
    boxes = torch.tensor([[3.0, 4.0, 40.0, 50.0], [10.0, 1.0, 63.0, 30.0]])
    with torch.no_grad():
        assert_close(swapped.get_dense_pe(), encoder.get_dense_pe(), **EXACT)
        for got, expected in zip(swapped(points, boxes, None), encoder(points, boxes, None)):
            assert_close(got, expected, **EXACT)


# -------------------------------------------------------------------------------- transformers
def _hf_models():
    torch.manual_seed(0)
    sam = HFSam(SamVisionConfig(num_pos_feats=32, hidden_size=64))
    sam2 = HFSam2(Sam2PromptEncoderConfig(hidden_size=48, scale=1))
    return {"sam": sam, "sam2": sam2}


@pytest.mark.parametrize("name", ["sam", "sam2"])
def test_transformers_positional_embedding(name):
    peer = _hf_models()[name]
    twin = SamPositionalEmbedding.from_module(peer)
    assert set(twin.state_dict()) == {"positional_embedding"}
    assert_close(twin.positional_embedding, peer.positional_embedding.detach(), **EXACT)
    points = torch.rand(2, 3, 5, 2) * 1024
    grid = torch.rand(16, 16, 2)
    with torch.no_grad():
        assert_close(twin(points, (1024, 1024)), peer(points, (1024, 1024)), **EXACT)
        assert_close(twin(points, (700, 1024)), peer(points, (700, 1024)), **EXACT)
        assert_close(twin(grid), peer(grid), **EXACT)
    # state dicts load both ways
    fresh = SamPositionalEmbedding(twin.num_pos_feats)
    fresh.load_state_dict(peer.state_dict())
    assert_close(fresh(grid), twin(grid), **EXACT)


def test_sam_model_outputs_unchanged_with_vispos_swapped_in():
    from transformers import SamConfig, SamModel
    from transformers.models.sam.configuration_sam import SamMaskDecoderConfig, SamPromptEncoderConfig

    torch.manual_seed(0)
    vision = SamVisionConfig(
        hidden_size=32, output_channels=16, num_hidden_layers=1, num_attention_heads=2, image_size=64,
        patch_size=8, mlp_dim=32, num_pos_feats=8, global_attn_indexes=[0], window_size=0,
    )
    prompt = SamPromptEncoderConfig(hidden_size=16, image_size=64, patch_size=8, mask_input_channels=4)
    decoder = SamMaskDecoderConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, mlp_dim=32,
                                   iou_head_hidden_dim=16)
    model = SamModel(SamConfig(vision_config=vision, prompt_encoder_config=prompt, mask_decoder_config=decoder)).eval()
    swapped = copy.deepcopy(model)
    twin = SamPositionalEmbedding.from_module(model.shared_image_embedding)
    swapped.shared_image_embedding = swapped.prompt_encoder.shared_embedding = twin
    assert set(swapped.state_dict()) == set(model.state_dict())
    pixels = torch.rand(2, 3, 64, 64)
    prompts = [
        dict(input_points=torch.rand(2, 1, 3, 2) * 64, input_labels=torch.tensor([[[1, 0, 1]], [[1, 1, 0]]])),
        dict(input_boxes=torch.tensor([[[4.0, 5.0, 40.0, 50.0]], [[10.0, 2.0, 60.0, 30.0]]])),
    ]
    with torch.no_grad():
        for prompt_kwargs in prompts:
            expected, got = model(pixel_values=pixels, **prompt_kwargs), swapped(pixel_values=pixels, **prompt_kwargs)
            assert_close(got.pred_masks, expected.pred_masks, **EXACT)
            assert_close(got.iou_scores, expected.iou_scores, **EXACT)


# ------------------------------------------------------------------------------------- MONAI
@pytest.mark.parametrize(
    "grid_size, embed_dim, spatial_dims, scales",
    [((8, 8, 8), 96, 3, 1.0), ((5, 7, 6), 48, 3, [1.0, 2.0, 0.5]), (16, 64, 3, 3.0), ((14, 14), 64, 2, 2.0),
     ((1, 4), 8, 2, (1.0, 0.25))],
)
def test_monai_fourier_is_monais_table_under_the_same_seed(grid_size, embed_dim, spatial_dims, scales):
    torch.manual_seed(3)
    expected = build_fourier_position_embedding(grid_size, embed_dim, spatial_dims, scales)
    torch.manual_seed(3)
    got = monai_fourier(grid_size, embed_dim, spatial_dims, scales)
    assert not isinstance(got, torch.nn.Parameter)
    assert_close(got, expected.data, **EXACT)
    generator = torch.Generator().manual_seed(3)
    assert_close(monai_fourier(grid_size, embed_dim, spatial_dims, scales, generator=generator), got, **EXACT)


@pytest.mark.parametrize("grid_size, scales", [((6, 9, 5), (1.0, 2.0, 0.5)), ((12, 7), (3.0, 1.0))])
def test_module_reproduces_monai_with_the_documented_arguments(grid_size, scales):
    n = len(grid_size)
    torch.manual_seed(5)
    expected = build_fourier_position_embedding(list(grid_size), 32, n, list(scales)).data
    torch.manual_seed(5)
    gaussians = torch.randn(16, n) * torch.tensor(scales)
    m = PositionEmbeddingRandom(16, num_axes=n, coord_order="ij", align_corners=True, coord_range=(0.0, 1.0))
    m.positional_encoding_gaussian_matrix = gaussians.T.contiguous()
    got = m(grid_size).flatten(1).T[None]
    assert_close(got, expected, **_angle_tol(gaussians.T))


def test_per_axis_scale_scales_the_rows():
    torch.manual_seed(2)
    plain = PositionEmbeddingRandom(8, num_axes=3).positional_encoding_gaussian_matrix
    torch.manual_seed(2)
    scaled = PositionEmbeddingRandom(8, (1.0, 2.0, 0.5), num_axes=3).positional_encoding_gaussian_matrix
    assert_close(scaled, plain * torch.tensor([[1.0], [2.0], [0.5]]), **EXACT)


# ------------------------------------------------------------------------------ the formula
@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize(
    "options",
    [{}, {"coord_order": "ij"}, {"align_corners": True, "coord_range": (0.0, 1.0)}, {"extent": 20.0},
     {"align_corners": True, "coord_range": (-2.0, 3.0), "coord_order": "ij"}],
)
def test_grid_equals_the_formula(n, options):
    spatial = (9, 6, 5)[:n]
    m = PositionEmbeddingRandom(12, 1.5, num_axes=n, **options)
    expected = _reference(m.positional_encoding_gaussian_matrix, spatial, [(0,) * n], [spatial], **options)[0]
    assert_close(m(spatial), expected, **_angle_tol(m.positional_encoding_gaussian_matrix))


@pytest.mark.parametrize("align_corners", [False, True])
def test_a_cell_is_the_point_at_its_position(align_corners):
    m = PositionEmbeddingRandom(16, align_corners=align_corners)
    grid = m((6, 10))  # (C, H, W)
    ys, xs = torch.meshgrid(torch.arange(6.0), torch.arange(10.0), indexing="ij")
    offset = 0.0 if align_corners else 0.5
    points = torch.stack([xs + offset, ys + offset], -1)  # SAM's (x, y) pixel centres
    assert_close(m.forward_with_coords(points, (6, 10)).permute(2, 0, 1), grid, rtol=0, atol=1e-5)


# ----------------------------------------------------------------------------- padded batches
def _paddings(n):
    """Rectangular at the origin (DETR), centred (MONAI symmetric), and a mask with holes."""
    spatial = (12, 16, 10)[:n] if n > 1 else (15,)
    sizes = [spatial, tuple(s - 3 for s in spatial), tuple(max(1, s // 2) for s in spatial), (1,) * n]
    origin = Padding.from_sizes(sizes, spatial)
    centred = Padding.from_sizes(sizes, spatial, starts="symmetric")
    holes = centred.mask.clone()
    holes[(1, *(s // 2 for s in spatial))] = True  # a hole inside item 1's box: its bounding box holds
    holes[(2, *(0 for _ in spatial))] = False  # item 2's bounding box grows to the origin
    return spatial, {"origin": origin, "symmetric": centred, "holes": holes}


def _boxes(padding):
    p = padding if isinstance(padding, Padding) else Padding.from_mask(padding)
    return list(p.starts), list(p.sizes)


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("kind", ["origin", "symmetric", "holes"])
@pytest.mark.parametrize("form", ["padding", "mask", "nested"])
def test_item_normalisation_gives_each_item_what_it_gets_alone(n, kind, form):
    spatial, paddings = _paddings(n)
    padding = paddings[kind]
    mask = padding.mask if isinstance(padding, Padding) else padding
    x = {"padding": padding, "mask": mask, "nested": NestedTensor(torch.zeros(mask.shape[0], 2, *spatial), mask)}[form]
    if form == "padding" and not isinstance(padding, Padding):
        x = Padding.from_mask(padding)
    m = PositionEmbeddingRandom(8, num_axes=n, frame="item")
    out = m(x)
    starts, sizes = _boxes(padding)
    assert out.shape == (mask.shape[0], 16, *spatial)
    for b, (start, size) in enumerate(zip(starts, sizes)):
        alone = m(Padding.none(1, size))[0]
        region = out[(b, slice(None), *(slice(s, s + L) for s, L in zip(start, size)))]
        assert_close(region, alone, **EXACT)
    # the whole batch, padded cells included (continued past each box), follows the rule
    expected = _reference(m.positional_encoding_gaussian_matrix, spatial, starts, sizes)
    reach = 2 * max(spatial) + 1  # |u| of a padded cell of a one-cell item
    assert_close(out, expected, **_angle_tol(m.positional_encoding_gaussian_matrix, reach))


@pytest.mark.parametrize("n", [2, 3])
def test_canvas_normalisation_is_sams_grid_for_every_item(n):
    spatial, paddings = _paddings(n)
    m = PositionEmbeddingRandom(8, num_axes=n)
    for padding in paddings.values():
        out = m(padding if isinstance(padding, Padding) else NestedTensor(torch.zeros(4, 1, *spatial), padding))
        assert_close(out, m(spatial).expand(out.shape), **EXACT)
    features = torch.zeros(3, 5, *spatial)
    assert_close(m(features), m(spatial).expand(3, -1, *spatial), **EXACT)


@pytest.mark.parametrize("frame", ["item", "canvas"])
def test_device_path_equals_host_path(monkeypatch, frame):
    """Without host facts (tracing, CUDA graphs) or off the host (an accelerator's mask), the
    boxes are found on the mask's device: the same numbers."""
    spatial, paddings = _paddings(2)
    m = PositionEmbeddingRandom(8, frame=frame)
    expected = {k: m(p) for k, p in paddings.items()}
    monkeypatch.setattr(vispos._tracing, "host_side", lambda device: False)
    for k, p in paddings.items():
        mask = p.mask if isinstance(p, Padding) else p
        assert_close(m(mask), expected[k], **EXACT)
    monkeypatch.setattr(vispos._tracing, "host_facts", lambda device: False)
    for k, p in paddings.items():
        assert_close(m(p if isinstance(p, Padding) else Padding.from_mask(p)), expected[k], **EXACT)


def test_spacing_with_an_extent_places_cells_in_millimetres():
    spatial = (6, 12, 12)
    padding = Padding.from_sizes([(6, 12, 12), (4, 10, 7)], spatial, starts="symmetric")
    spacing = torch.tensor([[3.0, 0.7, 0.7], [2.5, 1.0, 0.9]])
    m = PositionEmbeddingRandom(8, num_axes=3, frame="item", coord_order="ij", extent=40.0)
    expected = _reference(m.positional_encoding_gaussian_matrix, spatial, list(padding.starts), list(padding.sizes),
                          coord_order="ij", extent=40.0, spacing=spacing.tolist())
    assert_close(m(padding, spacing=spacing), expected, **_angle_tol(m.positional_encoding_gaussian_matrix))
    # one physical point, one embedding, whatever the voxel size: 3 mm in depth is cell 1 at
    # 3 mm spacing and cell 3 at 1 mm (corner-aligned positions are i * s)
    corner = PositionEmbeddingRandom(8, num_axes=3, frame="item", align_corners=True, extent=40.0)
    coarse = corner(Padding.none(1, (2, 3, 3)), spacing=torch.tensor([[3.0, 1.0, 2.0]]))
    fine = corner(Padding.none(1, (4, 3, 5)), spacing=torch.tensor([[1.0, 1.0, 1.0]]))
    assert_close(coarse[0, :, 1, 2, 1], fine[0, :, 3, 2, 2], **EXACT)


@pytest.mark.parametrize("extent", [None, 30.0])
@pytest.mark.parametrize("frame", ["item", "canvas"])
def test_unit_spacing_is_the_cell_embedding_bit_for_bit(extent, frame):
    spatial, paddings = _paddings(3)
    m = PositionEmbeddingRandom(8, num_axes=3, frame=frame, extent=extent)
    for padding in paddings.values():
        batch = padding.batch if isinstance(padding, Padding) else padding.shape[0]
        assert_close(m(padding, spacing=torch.ones(batch, 3)), m(padding), **EXACT)


def test_spacing_without_an_extent_cancels():
    spatial, paddings = _paddings(2)
    m = PositionEmbeddingRandom(8, frame="item")
    spacing = torch.rand(4, 2) + 0.5
    assert_close(m(paddings["symmetric"], spacing=spacing), m(paddings["symmetric"]), **EXACT)


def test_canvas_with_spacing_and_extent_is_per_item():
    m = PositionEmbeddingRandom(8, extent=16.0)
    padding = Padding.none(2, (5, 6))
    out = m(padding, spacing=torch.tensor([[1.0, 1.0], [2.0, 0.5]]))
    expected = _reference(m.positional_encoding_gaussian_matrix, (5, 6), [(0, 0)] * 2, [(5, 6)] * 2, extent=16.0,
                          spacing=[[1.0, 1.0], [2.0, 0.5]])
    assert_close(out, expected, **_angle_tol(m.positional_encoding_gaussian_matrix))


def test_an_item_without_valid_cells_is_finite():
    mask = torch.ones(2, 4, 5, dtype=torch.bool)
    mask[0, :2, :3] = False
    for frame in ("item", "canvas"):
        out = PositionEmbeddingRandom(4, frame=frame)(mask)
        assert torch.isfinite(out).all()


def test_empty_inputs_give_empty_tensors():
    m = PositionEmbeddingRandom(4)
    assert m(torch.zeros(0, 3, 4, dtype=torch.bool)).shape == (0, 8, 3, 4)
    assert m(torch.zeros(2, 0, 4, dtype=torch.bool)).shape == (2, 8, 0, 4)


# ------------------------------------------------------------------------------ dtype, device
def test_dtype_device_and_precision(device):
    m = PositionEmbeddingRandom(16).to(device)
    full = m((9, 7))
    assert full.device.type == device.type and full.dtype == torch.float32
    assert_close(m((9, 7), dtype=torch.bfloat16), full.to(torch.bfloat16), **EXACT)
    half = copy.deepcopy(m).half()  # the matrix is cast; the angles stay float32
    expected = PositionEmbeddingRandom(16).to(device)
    expected.positional_encoding_gaussian_matrix = half.positional_encoding_gaussian_matrix.float()
    assert_close(half((9, 7)), expected((9, 7)), **EXACT)
    points = torch.rand(2, 4, 2, device=device) * 9
    assert half.forward_with_coords(points, (9, 9)).dtype == torch.float32


def test_coords_are_differentiable():
    m = PositionEmbeddingRandom(8)
    points = (torch.rand(3, 2) * 10).requires_grad_()
    m.forward_with_coords(points, (10, 10)).square().sum().backward()
    reference = points.detach().clone().requires_grad_()
    u = 2 * (reference / 10.0) - 1
    angles = 2 * math.pi * u @ m.positional_encoding_gaussian_matrix
    torch.cat([angles.sin(), angles.cos()], -1).square().sum().backward()
    assert_close(points.grad, reference.grad)


def test_results_belong_to_the_caller():
    m = PositionEmbeddingRandom(4)
    first = m(Padding.none(3, (4, 5)))
    first[0].fill_(7.0)
    assert_close(first[1], m((4, 5)), **EXACT)  # the batch's items do not share storage
    assert_close(m(Padding.none(3, (4, 5)))[0], m((4, 5)), **EXACT)


def test_joiner_contract():
    m = PositionEmbeddingRandom(32, num_axes=3)
    assert isinstance(m, SpatialPositionEmbedding)
    assert m.out_channels(3) == 64
    with pytest.raises(ValueError, match="num_axes=3, asked for 2 axes"):
        m.out_channels(2)


def test_compiles_without_graph_breaks():
    torch._dynamo.reset()
    try:
        m = PositionEmbeddingRandom(8, frame="item")
        compiled = torch.compile(m, fullgraph=True, backend="eager")
        mask = torch.zeros(3, 6, 7, dtype=torch.bool)
        mask[1, 4:] = True
        mask[2, :, 5:] = True
        for x in (mask, torch.randn(2, 3, 6, 7)):
            assert_close(compiled(x), m(x), rtol=0, atol=1e-5)
    finally:
        torch._dynamo.reset()


def test_similarity_figure(tmp_path):
    """``vispos plot similarity --encoder PositionEmbeddingRandom`` (the docs' figure)."""
    from vispos.app.cli import main
    from vispos.app.figures import encode_grid

    m = PositionEmbeddingRandom(16, extent=12.0)
    assert_close(encode_grid(m, (5, 6)), m((5, 6)), **EXACT)
    assert_close(encode_grid(m, (5, 6), spacing=(2.0, 1.0)), m(Padding.none(1, (5, 6)), spacing=torch.tensor([[2.0, 1.0]]))[0],
                 **EXACT)
    out = tmp_path / "rff.png"
    argv = ["plot", "similarity", "--encoder", "PositionEmbeddingRandom", "--kw", "num_pos_feats=32", "extent=16.0",
            "--shape", "8", "12", "--out", str(out)]
    assert main(argv) == 0 and out.stat().st_size > 0


# ----------------------------------------------------------------------------- state, repr
def test_repr_state_dict_and_pickle():
    m = PositionEmbeddingRandom(8, (1.0, 2.0), frame="item", coord_order="ij", align_corners=True,
                                coord_range=(0.0, 1.0), extent=12.0)
    assert repr(m) == (
        "PositionEmbeddingRandom(num_pos_feats=8, scale=(1.0, 2.0), num_axes=2, frame='item', "
        "coord_order='ij', align_corners=True, coord_range=(0.0, 1.0), extent=12.0)"
    )
    assert repr(PositionEmbeddingRandom()) == (
        "PositionEmbeddingRandom(num_pos_feats=64, scale=1.0, num_axes=2, frame='canvas', "
        "coord_order='xy', align_corners=False, coord_range=(-1.0, 1.0))"
    )
    clone = pickle.loads(pickle.dumps(m))
    assert_close(clone((5, 6)), m((5, 6)), **EXACT)
    other = PositionEmbeddingRandom(8, frame="item", coord_order="ij", align_corners=True,
                                    coord_range=(0.0, 1.0), extent=12.0)
    other.load_state_dict(m.state_dict())
    assert_close(other((5, 6)), m((5, 6)), **EXACT)
    twin = SamPositionalEmbedding.from_module(m)
    assert repr(twin).startswith("SamPositionalEmbedding(num_pos_feats=8, scale=")
    assert_close(pickle.loads(pickle.dumps(twin)).positional_embedding, m.positional_encoding_gaussian_matrix, **EXACT)
    assert twin.positional_encoding_gaussian_matrix is twin.positional_embedding


# ---------------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda: PositionEmbeddingRandom(8.0), TypeError, "num_pos_feats must be a positive int"),
        (lambda: PositionEmbeddingRandom(0), ValueError, "num_pos_feats must be a positive int, got 0"),
        (lambda: PositionEmbeddingRandom(8, num_axes=4), ValueError, "num_axes must be 1 to 3, got 4"),
        (lambda: PositionEmbeddingRandom(8, num_axes="2"), TypeError, "num_axes must be a positive int"),
        (lambda: PositionEmbeddingRandom(8, 0.0), ValueError, r"scale must be a finite number > 0, got 0.0 \(SAM"),
        (lambda: PositionEmbeddingRandom(8, "1"), TypeError, "scale must be a finite number"),
        (lambda: PositionEmbeddingRandom(8, (1.0, 2.0, 3.0)), ValueError, "scale must be a number or 2 numbers"),
        (lambda: PositionEmbeddingRandom(8, frame=True), TypeError, "frame must be one of"),
        (lambda: PositionEmbeddingRandom(8, frame="batch"), ValueError, r"frame must be one of \('canvas', 'item'\)"),
        (lambda: PositionEmbeddingRandom(8, coord_order="yx"), ValueError, r"coord_order must be one of \('xy', 'ij'\)"),
        (lambda: PositionEmbeddingRandom(8, align_corners=1), TypeError, "align_corners must be a bool"),
        (lambda: PositionEmbeddingRandom(8, coord_range=(1.0, 0.0)), ValueError, r"coord_range must have lo < hi"),
        (lambda: PositionEmbeddingRandom(8, coord_range=(0.0,)), ValueError, r"coord_range must be a pair"),
        (lambda: PositionEmbeddingRandom(8, coord_range=1.0), TypeError, r"coord_range must be a pair"),
        (lambda: PositionEmbeddingRandom(8, coord_range=(0.0, "1")), TypeError, r"coord_range must be a finite number"),
        (lambda: PositionEmbeddingRandom(8, extent=0), ValueError, "extent must be > 0, got 0"),
        (lambda: PositionEmbeddingRandom(8)((4, 5, 6)), ValueError, r"size must be an int or a sequence of 2 ints"),
        (lambda: PositionEmbeddingRandom(8)((4, 0)), ValueError, "size must hold positive ints"),
        (lambda: PositionEmbeddingRandom(8)((4, 5), spacing=torch.ones(1, 2)), ValueError, "spacing is per item"),
        (lambda: PositionEmbeddingRandom(8)("ab"), TypeError, "x must be a NestedTensor"),
        (lambda: PositionEmbeddingRandom(8)(torch.zeros(1, 4, 4, 4, dtype=torch.bool)), ValueError, "num_axes=2"),
        (lambda: PositionEmbeddingRandom(8)(torch.zeros(1, 4, 4, dtype=torch.uint8)), TypeError, "dtype torch.bool"),
        (lambda: PositionEmbeddingRandom(8)((4, 4), dtype=torch.int32), TypeError, "floating torch.dtype"),
        (lambda: PositionEmbeddingRandom(8)(Padding.none(1, (4, 4)), spacing=torch.ones(1, 3)), ValueError,
         r"spacing must have shape \(B, num_axes\)"),
        (lambda: PositionEmbeddingRandom(8)(Padding.none(1, (4, 4)), spacing=torch.ones(1, 2, dtype=torch.int64)),
         TypeError, "spacing must be a floating tensor"),
        (lambda: PositionEmbeddingRandom(8)(Padding.none(1, (4, 4)), spacing=torch.zeros(1, 2)), ValueError,
         "spacing must be finite and > 0"),
        (lambda: PositionEmbeddingRandom(8).forward_with_coords(torch.zeros(3, 3), (4, 4)), ValueError,
         r"coords_input must have shape \(\.\.\., 2\)"),
        (lambda: PositionEmbeddingRandom(8).forward_with_coords([[1.0, 2.0]], (4, 4)), TypeError,
         "coords_input must be a real tensor"),
        (lambda: PositionEmbeddingRandom(8).forward_with_coords(torch.zeros(3, 2), (4,)), ValueError,
         "image_size must hold 2 sizes"),
        (lambda: PositionEmbeddingRandom(8).forward_with_coords(torch.zeros(3, 2), 4), TypeError,
         "image_size must be a sequence of 2 numbers"),
        (lambda: PositionEmbeddingRandom(8).forward_with_coords(torch.zeros(3, 2), (4, 0)), ValueError,
         "image_size must be > 0"),
        (lambda: SamPositionalEmbedding(8)(torch.zeros(3, 3)), ValueError, r"input_coords must have shape \(\.\.\., 2\)"),
        (lambda: SamPositionalEmbedding(8)(torch.zeros(3, 2, dtype=torch.bool)), TypeError, "input_coords must be a real"),
        (lambda: SamPositionalEmbedding.from_module(torch.nn.Linear(2, 2)), TypeError, "must hold a Gaussian matrix"),
        (lambda: monai_fourier(8, 32, 4), ValueError, r"spatial_dims must be one of \(2, 3\)"),
        (lambda: monai_fourier(8, 31), ValueError, "embed_dim must be a positive multiple of 2"),
        (lambda: monai_fourier((8, 8), 32), ValueError, "grid_size must be an int or a sequence of 3 ints"),
        (lambda: monai_fourier(8, 32, scales=[1.0, 2.0]), ValueError, "scales must hold 3 numbers"),
        (lambda: monai_fourier(8, 32, scales="1"), TypeError, "scales must be a number or a sequence"),
        (lambda: monai_fourier(8, 32, scales=-1.0), ValueError, "scales must be > 0"),
        # a scale float32 cannot hold, or whose matrix / angles overflow it: NaN outputs otherwise
        (lambda: PositionEmbeddingRandom(8, 1e39), ValueError, r"scale must be at most 3\.40282e\+38 \(the largest float32"),
        (lambda: PositionEmbeddingRandom(8, (1.0, 1e39)), ValueError, r"scale must be at most 3\.40282e\+38"),
        (lambda: PositionEmbeddingRandom(8, 1e38), ValueError, r"scale=1e\+38 overflows float32"),
        (lambda: monai_fourier(8, 32, scales=1e39), ValueError, r"scales must be at most 3\.40282e\+38"),
        (lambda: monai_fourier(8, 32, scales=(1.0, 1.0, 1e38)), ValueError, r"scales=\(1\.0, 1\.0, 1e\+38\) overflows float32"),
        # a NumPy longdouble a Python float cannot hold: the message says so (not "<= 0")
        (lambda: PositionEmbeddingRandom(8, np.longdouble("0.1")), ValueError,
         r"scale = np\.longdouble\('0\.1'\) \(longdouble\) cannot be held by a Python float without rounding"),
        (lambda: monai_fourier(8, 32, scales=np.longdouble("0.1")), ValueError, "cannot be held by a Python float"),
        (lambda: PositionEmbeddingRandom(8, trainable="yes"), TypeError, "trainable must be a bool or None"),
        (lambda: PositionEmbeddingRandom(8)(torch.tensor(4.0)), ValueError, "a feature map must have shape"),
        (lambda: PositionEmbeddingRandom(8)(np.int64(0)), ValueError, "size must hold positive ints, got \\(0, 0\\)"),
    ],
)
def test_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


@pytest.mark.parametrize("size", [4, np.int64(4), np.array(4), torch.tensor(4), (np.int64(4), torch.tensor(4))],
                         ids=["int", "np.int64", "np.array-0d", "tensor-0d", "pair"])
def test_integer_scalars_are_sizes(size):
    """A NumPy integer or a 0-d integer tensor is one size for every axis, as an int is."""
    pe = PositionEmbeddingRandom(8)
    assert_close(pe(size), pe((4, 4)), **EXACT)


def test_exact_longdouble_and_large_finite_scales_are_taken():
    assert PositionEmbeddingRandom(8, np.longdouble("0.5")).scale == 0.5
    torch.manual_seed(0)
    pe = PositionEmbeddingRandom(8, 1e30)
    assert torch.isfinite(pe((3, 3))).all() and pe.scale == 1e30


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu_to_float32_rounding():
    spatial, paddings = _paddings(3)
    m = PositionEmbeddingRandom(16, num_axes=3, frame="item")
    gpu = copy.deepcopy(m).cuda()
    tol = _angle_tol(m.positional_encoding_gaussian_matrix)
    for padding in paddings.values():
        mask = (padding.mask if isinstance(padding, Padding) else padding)
        assert_close(gpu(mask.cuda()).cpu(), m(mask), **tol)
    sam, ours = _pair(128)
    assert_close(ours.cuda()((64, 64)).cpu(), sam((64, 64)), **_angle_tol(sam.positional_encoding_gaussian_matrix))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_points_in_pixels_do_not_synchronise_on_cuda():
    """The image size reaches the device by scalar fills, not a blocking host copy."""
    torch.manual_seed(0)
    m = SamPositionalEmbedding(32)
    points = torch.rand(2, 5, 2) * 1024
    ref = m(points, (1024, 1024))
    gpu, cuda_points = copy.deepcopy(m).cuda(), points.cuda()
    gpu(cuda_points, (1024, 1024))  # first call: lazy CUDA initialisation may synchronise
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = gpu(cuda_points, (1024, 1024))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert_close(got.cpu(), ref, **_angle_tol(m.positional_embedding))
