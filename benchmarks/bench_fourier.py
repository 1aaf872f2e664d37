"""Random Fourier features and the RT-DETR table side by side: vispos against segment_anything,
transformers and MONAI, steady state.

Run:  python benchmarks/bench_fourier.py [--device cpu|cuda] [--repeats N] [--threads T] [--no-peak] [--quick]

The harness of ``bench_position_embedding.py`` (``_driver.py``: interleaved steady-state
medians of ``k`` back-to-back calls, compute ops per call, peak memory of one call in a fresh
process with glibc returning every large block), on these workloads (``--quick``: a quarter
of every size):

* SAM's dense grid, 64 x 64, 256 channels (``get_dense_pe``): segment_anything's
  ``PositionEmbeddingRandom((64, 64))``, transformers' ``SamModel.get_image_wide_positional_embeddings``
  (its grid through ``SamPositionalEmbedding``) and vispos' ``PositionEmbeddingRandom((64, 64))``;
* a padded batch of 8 on the 64 x 64 canvas (SAM's resize-longest-side sizes): SAM's canvas
  repeated over the batch (what transformers' ``SamModel`` does) against vispos'
  ``frame="canvas"``; SAM run per item at the item's size and pasted into a zero canvas
  against vispos' ``frame="item"``;
* a 3D grid, 32^3 tokens, 768 channels: MONAI's ``build_fourier_position_embedding`` (it draws
  its matrix: 384 x 3 normal numbers) against ``vispos.monai_fourier`` (the same) and the module
  with MONAI's arguments (matrix drawn once);
* the RT-DETR table, 20 x 20 and 40 x 40 at 256 channels: transformers'
  ``build_2d_sinusoidal_position_embedding`` (uncached) against ``vispos.rtdetr_sincos_2d``.

The floor is writing the output once (``empty().fill_()``). Timings are not tests.
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from _driver import main  # noqa: E402
from bench_position_embedding import FLOOR, Workload  # noqa: E402

import vispos  # noqa: E402

#: SAM's items on its 64 x 64 embedding grid (longest side resized to 1024 px, stride 16)
SAM_ITEMS = [(64, 64), (43, 64), (64, 48), (48, 64), (64, 43), (56, 64), (64, 64), (36, 64)]


def sam_items(side: int) -> list[tuple[int, int]]:
    """:data:`SAM_ITEMS` on a ``side x side`` grid."""
    return [(max(1, h * side // 64), max(1, w * side // 64)) for h, w in SAM_ITEMS]


def _fill(shapes, device):
    def run():
        return [torch.empty(s, device=device).fill_(1.0) for s in shapes]

    return run


def _sam_workloads(device: torch.device, side: int = 64) -> list[Workload]:
    from segment_anything.modeling.prompt_encoder import PositionEmbeddingRandom as SamRandom
    from transformers.models.sam.configuration_sam import SamVisionConfig
    from transformers.models.sam.modeling_sam import SamPositionalEmbedding as HFSam

    torch.manual_seed(0)
    sam = SamRandom(128).to(device)
    ours = vispos.PositionEmbeddingRandom.from_module(sam).to(device)
    item = vispos.PositionEmbeddingRandom.from_module(sam, frame="item").to(device)
    hf = HFSam(SamVisionConfig(num_pos_feats=128)).to(device)
    hf.positional_embedding.data.copy_(sam.positional_encoding_gaussian_matrix)

    def hf_dense(size=side):  # SamModel.get_image_wide_positional_embeddings, verbatim
        grid = torch.ones((size, size), device=device, dtype=torch.float32)
        y_embed = (grid.cumsum(dim=0) - 0.5) / size
        x_embed = (grid.cumsum(dim=1) - 0.5) / size
        return hf(torch.stack([x_embed, y_embed], dim=-1)).permute(2, 0, 1).unsqueeze(0)

    wls = []
    wl = Workload(f"SAM dense grid: {side}x{side}, 256 ch", 256 * side * side * 4)
    wl.impls[FLOOR] = _fill([(256, side, side)], device)
    wl.impls["segment_anything PositionEmbeddingRandom"] = lambda: sam((side, side))
    wl.impls["transformers SamModel grid"] = hf_dense
    wl.impls["vispos PositionEmbeddingRandom"] = lambda: ours((side, side))
    wls.append(wl)

    items = sam_items(side)
    batch = len(items)
    nested = vispos.nested_tensor_from_tensor_list([torch.zeros(1, *s) for s in items]).to(device)

    def sam_per_item():
        canvas = torch.zeros(batch, 256, side, side, device=device)
        for b, (h, w) in enumerate(items):
            canvas[b, :, :h, :w] = sam((h, w))
        return canvas

    wl = Workload(f"SAM padded batch: {batch} items on a {side}x{side} canvas, 256 ch", batch * 256 * side * side * 4)
    wl.impls[FLOOR] = _fill([(batch, 256, side, side)], device)
    wl.impls["segment_anything canvas, repeated (as SamModel)"] = (
        lambda: sam((side, side)).unsqueeze(0).repeat(batch, 1, 1, 1)
    )
    wl.impls["vispos frame='canvas'"] = lambda: ours(nested)
    wl.impls["segment_anything per item, pasted"] = sam_per_item
    wl.impls["vispos frame='item'"] = lambda: item(nested)
    wls.append(wl)
    return wls


def _monai_workload(device: torch.device, side: int = 32) -> Workload:
    from monai.networks.blocks.pos_embed_utils import build_fourier_position_embedding

    dim = 768
    module = vispos.PositionEmbeddingRandom(
        dim // 2, num_axes=3, coord_order="ij", align_corners=True, coord_range=(0.0, 1.0)
    ).to(device)
    wl = Workload(f"3D grid: {side}^3 tokens, {dim} ch (MONAI Fourier)", side**3 * dim * 4)
    wl.impls[FLOOR] = _fill([(1, side**3, dim)], device)
    if device.type == "cpu":  # MONAI builds on the CPU
        wl.impls["MONAI build_fourier_position_embedding"] = lambda: build_fourier_position_embedding(side, dim, 3)
    wl.impls["vispos monai_fourier"] = lambda: vispos.monai_fourier(side, dim, 3, device=device)
    wl.impls["vispos PositionEmbeddingRandom (MONAI's arguments)"] = lambda: module((side,) * 3)
    return wl


def _rtdetr_workloads(device: torch.device, sides=(20, 40)) -> list[Workload]:
    from transformers.models.rt_detr.modeling_rt_detr import build_2d_sinusoidal_position_embedding

    wls = []
    for side in sides:
        wl = Workload(f"RT-DETR table: {side}x{side}, 256 ch", side * side * 256 * 4)
        wl.impls[FLOOR] = _fill([(side * side, 256)], device)
        wl.impls["transformers build_2d_sinusoidal_position_embedding"] = (
            lambda side=side: build_2d_sinusoidal_position_embedding(side, side, 256, 10000.0, device=device)
        )
        wl.impls["vispos rtdetr_sincos_2d"] = lambda side=side: vispos.rtdetr_sincos_2d(side, side, 256, device=device)
        wls.append(wl)
    return wls


def build_workloads(device: torch.device, quick: bool = False) -> list[Workload]:
    """Every workload; ``quick``: a quarter of the sizes (a smoke run, and the rows' test)."""
    div = 4 if quick else 1
    return _sam_workloads(device, 64 // div) + [_monai_workload(device, 32 // div)] + _rtdetr_workloads(
        device, [20 // div, 40 // div]
    )


if __name__ == "__main__":
    sys.exit(main(__doc__, __file__, build_workloads, repeats=11))
