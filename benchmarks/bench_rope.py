"""Vision RoPE side by side: vispos against timm, at ViT-B/16 sizes, steady state.

Run:  python benchmarks/bench_rope.py [--device cpu|cuda] [--repeats N] [--quick] [--threads T]

The harness of ``bench_position_embedding.py`` (``_driver.py``, same three passes: interleaved steady-state
medians, compute ops per call, peak memory of one call in a fresh process), on these workloads:
ViT-B/16 attention, 12 heads of 64 channels, batch 8, a 32 x 32 (1,024 tokens) or 64 x 64
(4,096 tokens) patch grid, one item of the batch padded (its valid box 3/4 x 5/8 of the grid).

Rows:

* ``get_embed`` alone (the table; "x output" is peak memory over the table's size):
  timm's ``RotaryEmbeddingDinoV3.get_embed(grid)`` (one table, mask-blind); timm's NaFlex
  path ``get_batch_embeds(shapes, seq_len=N)`` (each item normalized by its own size, tokens
  packed top-left: not the canvas); vispos ``get_embed(grid)``; vispos ``get_embed(mask=...)``
  (the canvas, each item its own table); the same for RoPE-Mixed (depth 12, every block's
  table; the masked table only at 1,024 tokens: at 4,096 it is 2.4 GB).
* ``get_embed`` plus rotating ``q`` and ``k`` (``(8, 12, N, 64)`` each; "x output" is peak memory
  over the two rotated tensors): each embedding applied with timm's ``apply_rot_embed_cat``
  (what an Eva block runs) and with vispos' (``vispos.apply_rot_embed_cat``, three passes);
  RoPE-Mixed rotates with block 0's table (an Eva forward rotates with each block's in turn).

The floor is writing the outputs once (``empty().fill_()``). Timings are not tests.
"""

from __future__ import annotations

import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from _driver import main  # noqa: E402
from bench_position_embedding import FLOOR, Workload  # noqa: E402

import vispos  # noqa: E402

HEADS, HEAD_DIM, DEPTH, BATCH = 12, 64, 12, 8


def _padded_mask(side: int, device: torch.device) -> torch.Tensor:
    mask = torch.zeros(BATCH, side, side, dtype=torch.bool, device=device)
    mask[3, side * 3 // 4 :, :] = True
    mask[3, :, side * 5 // 8 :] = True
    return mask


def _fill(shapes, device):
    def run():
        return [torch.empty(s, device=device).fill_(1.0) for s in shapes]

    return run


def build_workloads(device: torch.device, quick: bool) -> list[Workload]:
    wls = []
    for side in (16, 32) if quick else (32, 64):
        wls += _side_workloads(side, device)
    return wls


def _side_workloads(side: int, device: torch.device) -> list[Workload]:
    """The four workloads of one grid (a function of its own: every lambda binds this side's
    modules and tensors, not the last loop iteration's)."""
    from timm.layers.pos_embed_sincos import RotaryEmbeddingDinoV3, RotaryEmbeddingMixed
    from timm.layers.pos_embed_sincos import apply_rot_embed_cat as timm_apply

    v_apply = vispos.apply_rot_embed_cat
    wls = []
    n = side * side
    mask = _padded_mask(side, device)
    shapes = [(side, side)] * BATCH
    shapes[3] = (side * 3 // 4, side * 5 // 8)
    t_dino, v_dino = RotaryEmbeddingDinoV3(HEAD_DIM).to(device), vispos.DinoV3RotaryEmbedding(HEAD_DIM).to(device)
    torch.manual_seed(0)
    t_mixed = RotaryEmbeddingMixed(HEADS * HEAD_DIM, DEPTH, HEADS).to(device)
    v_mixed = vispos.MixedRotaryEmbedding.from_timm(t_mixed)
    grid = [side, side]
    masked_mixed = n <= 1024

    # -- the tables ------------------------------------------------------------------------
    table = (BATCH, n, 2 * HEAD_DIM)
    wl = Workload(f"DINOv3 RoPE table: batch {BATCH}, {side}x{side} grid, one item padded", math.prod(table) * 4)
    wl.impls[FLOOR] = _fill([table], device)
    wl.impls["timm get_embed(grid) (mask-blind, 1 table)"] = lambda: t_dino.get_embed(grid)
    wl.impls["timm get_batch_embeds(shapes, seq_len) (packed)"] = lambda: t_dino.get_batch_embeds(shapes, seq_len=n)
    wl.impls["vispos get_embed(grid) (mask-blind, 1 table)"] = lambda: v_dino.get_embed(grid)
    wl.impls["vispos get_embed(mask=...)"] = lambda: v_dino.get_embed(mask=mask)
    wls.append(wl)

    mixed_out = (DEPTH, BATCH if masked_mixed else 1, HEADS, n, 2 * HEAD_DIM)
    wl = Workload(f"RoPE-Mixed table: depth {DEPTH}, {HEADS} heads, {side}x{side} grid"
                  + (f", batch {BATCH} one padded" if masked_mixed else ""), math.prod(mixed_out) * 4)
    wl.impls[FLOOR] = _fill([mixed_out], device)
    wl.impls["timm get_embed(grid)"] = lambda: t_mixed.get_embed(grid)
    wl.impls["vispos get_embed(grid)"] = lambda: v_mixed.get_embed(grid)
    if masked_mixed:
        wl.impls["vispos get_embed(mask=...)"] = lambda: v_mixed.get_embed(mask=mask)
    wls.append(wl)

    # -- tables applied to q and k -----------------------------------------------------------
    gen = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(BATCH, HEADS, n, HEAD_DIM, generator=gen, device=device)
    k = torch.randn(BATCH, HEADS, n, HEAD_DIM, generator=gen, device=device)

    def both(apply, emb, half):
        return apply(q, emb, half), apply(k, emb, half)

    wl = Workload(f"DINOv3 RoPE table + rotate q, k (8x12x{n}x64 each)", 2 * q.numel() * 4)
    wl.impls[FLOOR] = _fill([q.shape, k.shape], device)
    wl.impls["timm get_embed(grid) + timm apply"] = lambda: both(timm_apply, t_dino.get_embed(grid), True)
    wl.impls["timm get_batch_embeds + timm apply"] = lambda: both(
        timm_apply, t_dino.get_batch_embeds(shapes, seq_len=n).unsqueeze(1), True)
    wl.impls["vispos get_embed(mask=...) + timm apply"] = lambda: both(
        timm_apply, v_dino.get_embed(mask=mask).unsqueeze(1), True)
    wl.impls["vispos get_embed(mask=...) + vispos apply"] = lambda: both(
        v_apply, v_dino.get_embed(mask=mask).unsqueeze(1), True)
    wls.append(wl)

    wl = Workload(f"RoPE-Mixed table + rotate q, k with block 0 (8x12x{n}x64 each)", 2 * q.numel() * 4)
    wl.impls[FLOOR] = _fill([q.shape, k.shape], device)
    wl.impls["timm get_embed(grid) + timm apply"] = lambda: both(timm_apply, t_mixed.get_embed(grid)[0], False)
    wl.impls["vispos get_embed(grid) + vispos apply"] = lambda: both(v_apply, v_mixed.get_embed(grid)[0], False)
    if masked_mixed:
        wl.impls["vispos get_embed(mask=...) + vispos apply"] = lambda: both(
            v_apply, v_mixed.get_embed(mask=mask)[0], False)
    wls.append(wl)
    return wls


if __name__ == "__main__":
    sys.exit(main(__doc__, __file__, build_workloads, repeats=7, quick_help="16x16 and 32x32 grids (a smoke run)"))
