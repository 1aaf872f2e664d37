"""The inputs of ``gpu_check.py``: one call per encoder family, and the invariant backbones.

Every case is ``setup(device) -> forward``: ``setup`` builds the module on the CPU under a fixed
seed (so every device gets the same weights and random matrices), moves it and its inputs to
``device`` and returns a closure that runs only the forward. Setup may copy to the device; the
forward is what the no-host-sync and CUDA-graph checks watch.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch

import vispos
from _fresh import arbitrary
from bench_padding_invariant import _trained_like
from bench_position_embedding import _level_masks
from vispos import NestedTensor, nested_tensor_from_tensor_list

__all__ = ["BACKBONES", "FAMILIES", "c5_level", "flat", "item_alone", "on", "padded_items"]

Setup = Callable[[torch.device], Callable[[], object]]

# DETR's C5 of three photos of their own sizes, and Deformable's levels of two
IMAGES = [(800, 1066), (736, 1333), (800, 1201)]
VOLUMES = [(24, 28, 20), (20, 32, 24)]


def flat(out) -> list[torch.Tensor]:
    """Every tensor of an output, in order (a tensor, a NestedTensor, or lists of them)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, NestedTensor):
        return [out.tensors, out.mask]
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in flat(o)]
    raise TypeError(f"cannot compare an output of type {type(out).__name__}")


def c5_level(device) -> NestedTensor:
    """DETR's C5 (stride 32) of the three photos, a rectangular NestedTensor on ``device``."""
    return _level_masks(IMAGES, [32], device)[0]


def valid_cells(pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``pos`` with zeros on padding. With ``offset=-0.5`` (Deformable-DETR) a padding-only line
    has the angle ``-0.5 / (0 + eps) * scale``, about -3e6 rad: one ulp of it moves a sine by 1e-2,
    so two devices (or a compiler) agree there only on a finite value in [-1, 1]."""
    return pos.masked_fill(mask.unsqueeze(1), 0.0)


def _module(make: Callable[[], torch.nn.Module], device) -> torch.nn.Module:
    torch.manual_seed(0)
    return make().eval().to(device)


def _sine(feats: int, offset: float, what: str) -> Setup:
    def setup(device):
        pe = _module(lambda: vispos.PositionEmbeddingSine(feats, normalize=True, offset=offset), device)
        if what == "levels":
            levels = _level_masks(IMAGES[:2], [8, 16, 32, 64], device)
            return lambda: [valid_cells(pe(lv), lv.mask) for lv in levels]
        if what == "volumes":
            nt = nested_tensor_from_tensor_list([torch.zeros(1, *v) for v in VOLUMES]).to(device)
            return lambda: pe(nt)
        nt = c5_level(device)
        x = {"nested": nt, "mask": nt.mask, "arbitrary": arbitrary(nt.mask)}[what]
        return lambda: pe(x)

    return setup


def _call(make: Callable[[], torch.nn.Module], make_input: Callable[[], tuple], run=None) -> Setup:
    """A module built by ``make`` called on the CPU inputs ``make_input()`` moved to the device."""

    def setup(device):
        m = _module(make, device)
        torch.manual_seed(1)
        args = [a.to(device) for a in make_input()]
        return (lambda: run(m, *args)) if run else (lambda: m(*args))

    return setup


def _table(fn: Callable[[torch.device], torch.Tensor]) -> Setup:
    return lambda device: (lambda: fn(device))


def _rope_mask() -> tuple:
    mask = torch.ones(3, 14, 18, dtype=torch.bool)  # True = padding
    mask[0] = False
    mask[1, :10, :15] = False
    mask[2, 2:12, 3:16] = False  # centred, as MONAI's symmetric padding
    return (mask,)


def _arbitrary_c5() -> tuple:
    return (arbitrary(c5_level("cpu").mask),)


FAMILIES: dict[str, Setup] = {
    "PositionEmbeddingSine, DETR C5 (NestedTensor)": _sine(128, 0.0, "nested"),
    "PositionEmbeddingSine, DETR C5 (bool mask)": _sine(128, 0.0, "mask"),
    "PositionEmbeddingSine, DETR C5 (arbitrary mask)": _sine(128, 0.0, "arbitrary"),
    "PositionEmbeddingSine, Deformable offset -0.5 (4 levels, valid cells)": _sine(128, -0.5, "levels"),
    "PositionEmbeddingSine, 3D volumes (NestedTensor)": _sine(32, 0.0, "volumes"),
    "PositionalEncoding2D (channel-last)": _call(
        lambda: vispos.PositionalEncoding2D(64), lambda: (torch.randn(2, 12, 16, 64),)),
    "PositionalEncodingPermute3D (channels-first)": _call(
        lambda: vispos.PositionalEncodingPermute3D(48), lambda: (torch.randn(2, 48, 6, 8, 10),)),
    "preset timm_sincos_2d": _table(lambda d: vispos.timm_sincos_2d((14, 18), 256, device=d)),
    "preset mae_sincos_2d (cls token)": _table(lambda d: vispos.mae_sincos_2d(256, (14, 18), True, device=d)),
    "preset monai_sincos 3D": _table(lambda d: vispos.monai_sincos((6, 8, 10), 96, 3, device=d)),
    "PositionEmbeddingRandom / SAM (64x64 grid)": _call(
        lambda: vispos.PositionEmbeddingRandom(64), lambda: (), lambda m: m((64, 64))),
    "PositionEmbeddingRandom (arbitrary mask, frame='item')": _call(
        lambda: vispos.PositionEmbeddingRandom(64, frame="item"), _arbitrary_c5),
    "SamPositionalEmbedding (points in pixels)": _call(
        lambda: vispos.SamPositionalEmbedding(64), lambda: (torch.rand(2, 5, 2) * 1024,),
        lambda m, pts: m(pts, (1024, 1024))),
    "RT-DETR rtdetr_sincos_2d": _table(lambda d: vispos.rtdetr_sincos_2d(20, 25, 256, device=d)),
    "RT-DETR rtdetr_sincos_2d (padded batch)": _call(
        torch.nn.Identity, lambda: (c5_level("cpu").mask,),
        lambda m, mask: vispos.rtdetr_sincos_2d(*mask.shape[1:], 256, padding=mask)),
    "PositionEmbeddingLearned": _call(
        lambda: vispos.PositionEmbeddingLearned(64, num_embeddings=50), lambda: (torch.randn(2, 3, 20, 25),)),
    "SinusoidalPositionalEncoding (1D, key_padding_mask)": _call(
        lambda: vispos.SinusoidalPositionalEncoding(64),
        lambda: (torch.randn(3, 40, 64), torch.arange(40).expand(3, 40) >= torch.tensor([[40], [31], [17]])),
        lambda m, x, kpm: m(x, key_padding_mask=kpm)),
    "RotaryEmbedding (1D)": _call(lambda: vispos.RotaryEmbedding(32), lambda: (torch.randn(2, 4, 40, 32),)),
    "AxialRotaryEmbedding (2D)": _call(
        lambda: vispos.AxialRotaryEmbedding(32), lambda: (torch.randn(2, 48, 32),),
        lambda m, x: m(x, spatial=(6, 8))),
    "DinoV3RotaryEmbedding (padded batch)": _call(
        lambda: vispos.DinoV3RotaryEmbedding(64, normalize_coords="max"), _rope_mask,
        lambda m, mask: m.get_embed(mask=mask)),
    "MixedRotaryEmbedding / RoPE-Mixed (padded batch)": _call(
        lambda: vispos.MixedRotaryEmbedding(96, 2, 2), _rope_mask, lambda m, mask: m.get_embed(mask=mask)),
}


# ------------------------------------------------------------------------------- backbones
def _backbone_2d():
    from vispos.backbones import TimmBackbone

    model = TimmBackbone("resnet18", out_indices=(2, 3, 4), padding_invariant=True)
    _trained_like(model)
    return model


def _backbone_3d():
    from vispos.backbones import VolumeBackbone

    model = VolumeBackbone("r3d_18", padding_invariant=True)
    _trained_like(model)
    return model


def _items_2d(small: bool) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    sizes = [(70, 52), (64, 96), (45, 80)] if small else [(150, 112), (128, 192), (96, 160)]
    return [torch.randn(3, *s, generator=g) for s in sizes]


def _items_3d(small: bool) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    sizes = [(16, 24, 20), (20, 16, 24)] if small else [(24, 40, 32), (32, 32, 40)]
    return [torch.randn(1, *s, generator=g) for s in sizes]


#: name -> (build() -> the invariant backbone, CPU, trained-like statistics; items(small) -> its inputs)
BACKBONES = {
    "timm resnet18, padding_invariant (2D)": (_backbone_2d, _items_2d),
    "r3d_18 VolumeBackbone, padding_invariant (3D)": (_backbone_3d, _items_3d),
}


def padded_items(levels, batch_index: int) -> list[torch.Tensor]:
    """Item ``batch_index``'s own cells of every level (its box, from the level's padding)."""
    out = []
    for level in levels:
        shape = level.padding.sizes[batch_index]
        out.append(level.tensors[(batch_index, slice(None), *(slice(0, s) for s in shape))])
    return out


def item_alone(model: torch.nn.Module, item: torch.Tensor, device) -> list[torch.Tensor]:
    """The levels of ``item`` run alone (a batch of one, no padding)."""
    with torch.no_grad():
        levels = model(nested_tensor_from_tensor_list([item.to(device)]))
    return [level.tensors[0] for level in levels]


def on(model: torch.nn.Module, device) -> torch.nn.Module:
    """A copy of ``model`` on ``device`` (the CPU original stays), in ``model``'s train / eval mode
    on every submodule (a deep copy of the invariant backbone's graph module leaves its
    submodules in training mode)."""
    return copy.deepcopy(model).to(device).train(model.training)
