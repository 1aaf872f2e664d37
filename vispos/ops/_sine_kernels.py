"""The Triton kernel of DETR's sine embedding: one launch writes a level's whole ``(B, C, *S)``.

The kernel body only; :mod:`vispos.ops.sine` wraps it as the custom ops
``vispos::sine_boxes`` and ``vispos::sine_counts``, launches it through :mod:`vispos.ops._triton`
(compiled on CUDA, interpreted on the CPU in tests) and keeps the torch reference beside it.
This module is imported on the first launch only, so ``import vispos`` never imports Triton.

The output ``(B, n * F, *S)`` is seen as ``(B, n * F, R, W)``: ``W`` the last spatial axis,
``R`` the product of the others (a 1D level has ``R = 1``). Spatial axes are placed in a frame
of three, ``(S0, S1, W)``, the missing leading ones of size 1. A program writes one tile of
``BLOCK_R x BLOCK_W`` cells of item ``b``, for every axis block and a chunk of ``KC``
frequencies of each. Positions are DETR's counts, in one of three modes:

* ``MODE == 0`` (no padding): the count along axis ``i`` is ``c_i + 1``;
* ``MODE == 1`` (a box per item, ``boxes[b] = (starts, stops)``): along axis ``i`` a line that
  crosses the box (its cell lies in the box along every other axis) counts
  ``clamp(c_i - start_i + 1, 0, size_i)`` over a length ``size_i``; any other line counts 0 over
  a length 0 (DETR's cumulative sum gives exactly these). The angles of a line depend only on
  ``c_i``: sin and cos are evaluated on a vector of the tile's ``c_i`` (and once for the
  padding-only lines) and selected into the tile, so the tile costs its writes;
* ``MODE == 2`` (any mask): ``counts{i}`` holds the cumulative count of *padding* cells along
  axis ``i`` (``torch.cumsum`` of the mask, int32 ``(B, *S)``); the count is ``c_i + 1 - counts``
  and the line's length ``S_i - counts`` at its last cell. Sin and cos are evaluated per cell.

A count ``p`` and length ``L`` become positions by :class:`~vispos._positions.PositionRule`'s
float32 steps in its order: ``p + offset``, ``* spacing``, then ``/ extent * scale`` or
``/ (L * spacing + eps) * scale``; the angle is ``position / divisor`` (correctly rounded
divisions, ``div_rn``; float64 when the divisors are), and its sin and cos are written,
interleaved, in the output's dtype (one rounding). Launched with ``enable_fp_fusion=False`` so
no product and sum are fused where torch rounds twice.

References:
    Carion et al., End-to-End Object Detection with Transformers, ECCV 2020
    (``PositionEmbeddingSine``); Tillet et al., Triton, MAPL 2019.
"""

import types

try:
    import triton.language as tl
except ImportError:  # pragma: no cover - launched only where Triton is installed
    tl = types.SimpleNamespace(constexpr=None)  # the annotations below still evaluate

__all__ = ["sine_embed_kernel"]


def sine_embed_kernel(
    out_ptr, boxes_ptr, counts0_ptr, counts1_ptr, counts2_ptr, div_ptr, div_stride, spacing_ptr,
    spacing_stride_b, spacing_stride_i, num_rows, width, size0, size1, half, offset, eps, scale, extent,
    N_AXES: tl.constexpr, MODE: tl.constexpr, NORMALIZE: tl.constexpr, HAS_OFFSET: tl.constexpr,
    HAS_SPACING: tl.constexpr, HAS_EXTENT: tl.constexpr, ANGLES_64: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_W: tl.constexpr, KC: tl.constexpr,
):
    """Writes ``out[b, :, tile]``; see the module docstring. Grid:
    ``(cdiv(R, BLOCK_R) * cdiv(W, BLOCK_W), B, cdiv(half, KC))``."""
    tiles_w = (width + BLOCK_W - 1) // BLOCK_W  # not tl.cdiv: a jit function, not callable when
    # Triton was imported outside interpreter mode
    tile = tl.program_id(0)
    b = tl.program_id(1)
    k0 = tl.program_id(2) * KC
    k1 = tl.minimum(k0 + KC, half)
    rows = (tile // tiles_w) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = (tile % tiles_w) * BLOCK_W + tl.arange(0, BLOCK_W)
    in_grid = (rows < num_rows)[:, None] & (cols < width)[None, :]
    cells = rows[:, None] * width + cols[None, :]  # [BLOCK_R, BLOCK_W]
    cells_total = tl.cast(num_rows, tl.int64) * width  # int64: offsets of whole planes
    channels = N_AXES * 2 * half
    # each spatial axis' coordinates in the frame (S0, S1, W), as broadcastable 2D vectors
    coord_w = cols[None, :]
    coord_1 = (rows % size1)[:, None]
    coord_0 = (rows // size1)[:, None]
    for i in tl.static_range(N_AXES):
        # the axis' place in the frame: W (the last axis), S1 (the one before) or S0
        coord = coord_w if i == N_AXES - 1 else (coord_1 if i == N_AXES - 2 else coord_0)
        size = width if i == N_AXES - 1 else (size1 if i == N_AXES - 2 else size0)
        stride = 1 if i == N_AXES - 1 else (width if i == N_AXES - 2 else size1 * width)
        # ---- the count and the line's length: vectors (modes 0, 1) or per cell (mode 2)
        if MODE == 2:
            counts = counts0_ptr if i == 0 else (counts1_ptr if i == 1 else counts2_ptr)
            line = counts + b * cells_total
            padded = tl.load(line + cells, mask=in_grid, other=0)
            count = coord + 1 - padded
            if NORMALIZE and not HAS_EXTENT:
                last_padded = tl.load(line + cells + (size - 1 - coord) * stride, mask=in_grid, other=0)
                length = size - last_padded
            else:
                length = count
        elif MODE == 1:
            start = tl.load(boxes_ptr + b * 2 * N_AXES + i)
            length = tl.load(boxes_ptr + b * 2 * N_AXES + N_AXES + i) - start
            count = tl.minimum(tl.maximum(coord - start + 1, 0), length)
            crosses = in_grid  # the tile's cells whose line along axis i crosses the box
            for j in tl.static_range(N_AXES):
                if j != i:
                    other = coord_w if j == N_AXES - 1 else (coord_1 if j == N_AXES - 2 else coord_0)
                    lo = tl.load(boxes_ptr + b * 2 * N_AXES + j)
                    hi = tl.load(boxes_ptr + b * 2 * N_AXES + N_AXES + j)
                    crosses = crosses & (other >= lo) & (other < hi)
        else:
            count = coord + 1
            length = size
        if HAS_SPACING:
            cell_size = tl.load(spacing_ptr + b * spacing_stride_b + i * spacing_stride_i)
        # ---- DETR's rule (PositionRule), on the lines' counts and, in mode 1, on count 0 over
        # length 0 (the padding-only lines)
        for part in tl.static_range(2 if MODE == 1 else 1):
            if part == 1:
                count = count * 0
                length = length * 0
            p = tl.cast(count, tl.float32)
            if HAS_OFFSET:
                p = p + offset
            if HAS_SPACING:
                p = p * cell_size
            if NORMALIZE:
                if HAS_EXTENT:
                    p = tl.math.div_rn(p, extent) * scale
                else:
                    den = tl.cast(length, tl.float32)
                    if HAS_SPACING:
                        den = den * cell_size
                    p = tl.math.div_rn(p, den + eps) * scale
            if part == 0:
                position = p
            else:
                outside = p
        # ---- sin and cos of every frequency of the chunk, interleaved
        base = (b * channels + i * 2 * half) * cells_total
        for k in range(k0, k1):
            divisor = tl.load(div_ptr + k * div_stride)
            if ANGLES_64:  # float64 division is correctly rounded on every target
                angle = position.to(tl.float64) / divisor
            else:
                angle = tl.math.div_rn(position, divisor)
            sin = tl.sin(angle)
            cos = tl.cos(angle)
            if MODE == 1:
                angle_out = outside.to(tl.float64) / divisor if ANGLES_64 else tl.math.div_rn(outside, divisor)
                sin = tl.where(crosses, sin, tl.sin(angle_out))
                cos = tl.where(crosses, cos, tl.cos(angle_out))
            else:
                sin = tl.broadcast_to(sin, [BLOCK_R, BLOCK_W])  # mode 0: vectors, broadcast
                cos = tl.broadcast_to(cos, [BLOCK_R, BLOCK_W])
            dst = out_ptr + base + (2 * k) * cells_total + cells
            tl.store(dst, sin.to(out_ptr.dtype.element_ty), mask=in_grid)
            tl.store(dst + cells_total, cos.to(out_ptr.dtype.element_ty), mask=in_grid)
