"""Triton kernels of the masked group norm (instance norm: one channel per group) and their launchers:
each item's statistics over its own valid cells, two kernels each way (``_gn_stats``, ``_gn_apply``;
``_gn_grad_sums``, ``_gn_grad_apply``).

The reference is :mod:`._norm_reference` (``group_norm_forward``, ``group_norm_backward``); the launch
sizes are :mod:`._sizes`'. ``_gn_stats`` runs one program per item, group and chunk of cells (shifted
statistics over the group's channels, merged with Chan's formula: :mod:`._jit`); ``_gn_apply``
merges the chunks of its rows and writes its tile of the output, zeros in the padding, and the
per-item, per-group mean and inverse deviation. Backward, ``_gn_grad_sums`` writes per chunk the
sums each item and group needs (``dy * w`` and ``dy * w * (x - mean)``) and, per item and channel,
those the parameters' gradients need; ``_gn_grad_apply`` writes ``grad_x`` and, from its first
tile per channel block, the parameters' gradients (a loop over the items' partial sums on the
device). Values are loaded under the padding mask (``other=0``); statistics are float32 (float64
for float64 inputs), ``eps`` read from a tensor in that dtype. Sizes and strides are not
specialized.

References:
    Wu and He, Group Normalization, ECCV 2018; Chan, Golub and LeVeque, 1983.
"""

import torch
import triton.language as tl

from . import _triton
from ._jit import kept, lane_update, lanes_stats, merge, merge_parts, normalizer, offsets, stat_type, total
from ._sizes import SPLIT_BLOCK, cdiv, flat, flat_or_copy, plan, split, tiles, warps

__all__ = ["group_norm_forward", "group_norm_backward"]

_SIZES = ("R", "B", "C", "G", "CPG", "S", "CHUNK", "SPLIT", "stride_xb", "stride_xc", "stride_xs", "stride_yb",
          "stride_yc", "stride_ys", "stride_db", "stride_dc", "stride_ds", "stride_gb", "stride_gc", "stride_gs",
          "stride_mb", "stride_ms")


def _sizes_of(fn):
    """The size and stride parameters of ``fn``: never specialized."""
    names = fn.__code__.co_varnames[:fn.__code__.co_argcount]
    return _triton.kernel(do_not_specialize=tuple(n for n in names if n in _SIZES))(fn)


@_sizes_of
def _gn_stats(x_ptr, mask_ptr, part_ptr, R, G, CPG, S, CHUNK, SPLIT, stride_xb, stride_xc, stride_xs, stride_mb,
              stride_ms, STAT: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    ps = tl.program_id(1)
    item = row // G
    grp = row - item * G
    cnt = tl.zeros([BLOCK_C, BLOCK_N], STAT)
    shift = tl.zeros([BLOCK_C, BLOCK_N], STAT)
    s1 = tl.zeros([BLOCK_C, BLOCK_N], STAT)
    s2 = tl.zeros([BLOCK_C, BLOCK_N], STAT)
    start = ps * CHUNK
    stop = tl.minimum(start + CHUNK, S)
    for c0 in range(0, CPG, BLOCK_C):
        cc = c0 + tl.arange(0, BLOCK_C)
        for off in range(start, stop, BLOCK_N):
            cell = off + tl.arange(0, BLOCK_N)
            keep = (cc < CPG)[:, None] & kept(mask_ptr, item, cell, cell < stop, stride_mb, stride_ms)[None, :]
            at = offsets(item, (grp * CPG + cc)[:, None], cell[None, :], stride_xb, stride_xc, stride_xs)
            v = tl.load(x_ptr + at, mask=keep, other=0.0).to(STAT)
            cnt, shift, s1, s2 = lane_update(cnt, shift, s1, s2, v, keep)
    rel, m2 = lanes_stats(cnt, s1, s2)
    n, ref, mean, sq = merge(cnt, shift, rel, m2, 1)  # each lane row (channel), then the rows
    n, ref, mean, sq = merge(n, ref, mean, sq, 0)
    at = row * SPLIT + ps
    tl.store(part_ptr + at, n)
    tl.store(part_ptr + R * SPLIT + at, ref)
    tl.store(part_ptr + 2 * R * SPLIT + at, mean)
    tl.store(part_ptr + 3 * R * SPLIT + at, sq)


@_sizes_of
def _gn_apply(x_ptr, y_ptr, mask_ptr, part_ptr, w_ptr, b_ptr, mean_ptr, rstd_ptr, scalars_ptr, R, C, G, CPG, S,
              SPLIT, stride_xb, stride_xc, stride_xs, stride_yb, stride_yc, stride_ys, stride_mb, stride_ms,
              HAS_W: tl.constexpr, HAS_B: tl.constexpr, STAT: tl.constexpr, SPLIT_BLOCK: tl.constexpr,
              BLOCK_C: tl.constexpr, BLOCK_N: tl.constexpr):
    pn = tl.program_id(0)
    pc = tl.program_id(1)
    item = tl.program_id(2)
    ch = pc * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = ch < C
    grp = ch // CPG
    row = item * G + grp
    sp = tl.arange(0, SPLIT_BLOCK)
    pmask = cmask[:, None] & (sp < SPLIT)[None, :]
    at = row[:, None] * SPLIT + sp[None, :]
    n, ref, rel, sq = merge_parts(part_ptr, at, R * SPLIT, pmask)
    mean = ref + rel
    var = sq / tl.maximum(n, 1.0)
    rstd, a, shift = normalizer(var, tl.load(scalars_ptr), w_ptr, b_ptr, ch, cmask, HAS_W, HAS_B, STAT)
    cell = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    inb = cell < S
    keep = cmask[:, None] & kept(mask_ptr, item, cell, inb, stride_mb, stride_ms)[None, :]
    v = tl.load(x_ptr + offsets(item, ch[:, None], cell[None, :], stride_xb, stride_xc, stride_xs), mask=keep,
                other=0.0).to(STAT)
    y = tl.where(keep, (v - mean[:, None]) * a[:, None] + shift[:, None], 0.0)
    tl.store(y_ptr + offsets(item, ch[:, None], cell[None, :], stride_yb, stride_yc, stride_ys),
             y.to(y_ptr.dtype.element_ty), mask=cmask[:, None] & inb[None, :])
    if pn == 0:
        first = cmask & (ch - grp * CPG == 0)  # one channel per group writes the group's statistics
        tl.store(mean_ptr + row, mean, mask=first)
        tl.store(rstd_ptr + row, rstd, mask=first)


@_sizes_of
def _gn_grad_sums(dy_ptr, x_ptr, mask_ptr, w_ptr, mean_ptr, partg_ptr, partc_ptr, R, B, C, G, CPG, S, CHUNK,
                  SPLIT, stride_db, stride_dc, stride_ds, stride_xb, stride_xc, stride_xs, stride_mb, stride_ms,
                  HAS_W: tl.constexpr, STAT: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    ps = tl.program_id(1)
    item = row // G
    grp = row - item * G
    mean = tl.load(mean_ptr + row)
    start = ps * CHUNK
    stop = tl.minimum(start + CHUNK, S)
    acc_n = tl.zeros([BLOCK_C], STAT)
    acc_1 = tl.zeros([BLOCK_C], STAT)
    acc_2 = tl.zeros([BLOCK_C], STAT)
    for c0 in range(0, CPG, BLOCK_C):
        cc = c0 + tl.arange(0, BLOCK_C)
        cmask = cc < CPG
        ch = grp * CPG + cc
        cnt = tl.zeros([BLOCK_C, BLOCK_N], STAT)
        s1 = tl.zeros([BLOCK_C, BLOCK_N], STAT)
        s2 = tl.zeros([BLOCK_C, BLOCK_N], STAT)
        for off in range(start, stop, BLOCK_N):
            cell = off + tl.arange(0, BLOCK_N)
            keep = cmask[:, None] & kept(mask_ptr, item, cell, cell < stop, stride_mb, stride_ms)[None, :]
            dz = tl.load(dy_ptr + offsets(item, ch[:, None], cell[None, :], stride_db, stride_dc, stride_ds),
                         mask=keep, other=0.0).to(STAT)
            v = tl.load(x_ptr + offsets(item, ch[:, None], cell[None, :], stride_xb, stride_xc, stride_xs),
                        mask=keep, other=0.0).to(STAT)
            cnt = cnt + keep.to(STAT)
            s1 = s1 + dz
            s2 = s2 + tl.where(keep, dz * (v - mean), 0.0)
        r1 = total(s1, 1)
        r2 = total(s2, 1)
        at = (item * C + ch) * SPLIT + ps  # per item and channel: the parameters' gradients
        tl.store(partc_ptr + at, r1, mask=cmask)
        tl.store(partc_ptr + B * C * SPLIT + at, r2, mask=cmask)
        if HAS_W:
            wv = tl.load(w_ptr + ch, mask=cmask, other=0.0).to(STAT)
            r1 = r1 * wv
            r2 = r2 * wv
        acc_n = acc_n + total(cnt, 1)
        acc_1 = acc_1 + r1
        acc_2 = acc_2 + r2
    at = row * SPLIT + ps
    tl.store(partg_ptr + at, total(acc_n, 0))
    tl.store(partg_ptr + R * SPLIT + at, total(acc_1, 0))
    tl.store(partg_ptr + 2 * R * SPLIT + at, total(acc_2, 0))


@_sizes_of
def _gn_grad_apply(dy_ptr, x_ptr, mask_ptr, w_ptr, mean_ptr, rstd_ptr, partg_ptr, partc_ptr, gx_ptr, gw_ptr, gb_ptr,
                   R, B, C, G, CPG, S, SPLIT, stride_db, stride_dc, stride_ds, stride_xb, stride_xc, stride_xs,
                   stride_gb, stride_gc, stride_gs, stride_mb, stride_ms, HAS_W: tl.constexpr, NEED_X: tl.constexpr,
                   NEED_W: tl.constexpr, NEED_B: tl.constexpr, STAT: tl.constexpr, SPLIT_BLOCK: tl.constexpr,
                   BLOCK_C: tl.constexpr, BLOCK_N: tl.constexpr):
    pn = tl.program_id(0)
    pc = tl.program_id(1)
    item = tl.program_id(2)
    ch = pc * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = ch < C
    grp = ch // CPG
    sp = tl.arange(0, SPLIT_BLOCK)
    pmask = cmask[:, None] & (sp < SPLIT)[None, :]
    if NEED_X:
        row = item * G + grp
        at = row[:, None] * SPLIT + sp[None, :]
        count = tl.maximum(total(tl.load(partg_ptr + at, mask=pmask, other=0.0), 1), 1.0)
        k1 = total(tl.load(partg_ptr + R * SPLIT + at, mask=pmask, other=0.0), 1)
        k2 = total(tl.load(partg_ptr + 2 * R * SPLIT + at, mask=pmask, other=0.0), 1)
        mean = tl.load(mean_ptr + row, mask=cmask, other=0.0)
        rstd = tl.load(rstd_ptr + row, mask=cmask, other=0.0)
        wv = tl.full([BLOCK_C], 1.0, STAT)
        if HAS_W:
            wv = tl.load(w_ptr + ch, mask=cmask, other=0.0).to(STAT)
        k1 = k1 / count
        k2 = rstd * rstd * k2 / count
        cell = pn * BLOCK_N + tl.arange(0, BLOCK_N)
        inb = cell < S
        keep = cmask[:, None] & kept(mask_ptr, item, cell, inb, stride_mb, stride_ms)[None, :]
        dz = tl.load(dy_ptr + offsets(item, ch[:, None], cell[None, :], stride_db, stride_dc, stride_ds), mask=keep,
                     other=0.0).to(STAT)
        v = tl.load(x_ptr + offsets(item, ch[:, None], cell[None, :], stride_xb, stride_xc, stride_xs), mask=keep,
                    other=0.0).to(STAT)
        g = tl.where(keep, rstd[:, None] * (dz * wv[:, None] - k1[:, None] - (v - mean[:, None]) * k2[:, None]), 0.0)
        tl.store(gx_ptr + offsets(item, ch[:, None], cell[None, :], stride_gb, stride_gc, stride_gs),
                 g.to(gx_ptr.dtype.element_ty), mask=cmask[:, None] & inb[None, :])
    if NEED_W or NEED_B:
        if (pn == 0) & (item == 0):  # the parameters' gradients: sum over the items' partial sums
            gw = tl.zeros([BLOCK_C], STAT)
            gb = tl.zeros([BLOCK_C], STAT)
            for bb in range(0, B):
                at = (bb * C + ch)[:, None] * SPLIT + sp[None, :]
                gb = gb + total(tl.load(partc_ptr + at, mask=pmask, other=0.0), 1)
                q2 = total(tl.load(partc_ptr + B * C * SPLIT + at, mask=pmask, other=0.0), 1)
                gw = gw + q2 * tl.load(rstd_ptr + bb * G + grp, mask=cmask, other=0.0)
            if NEED_W:
                tl.store(gw_ptr + ch, gw.to(gw_ptr.dtype.element_ty), mask=cmask)
            if NEED_B:
                tl.store(gb_ptr + ch, gb.to(gb_ptr.dtype.element_ty), mask=cmask)


def _sizes(x, m, out, num_groups):
    """A launch's sizes for ``x`` (Tensor[B, C, *S]), its mask ``m`` (Tensor[B, 1, *S]), the map
    ``out`` it writes (None: none) and ``num_groups``: cells per item, the three maps' strides, the
    group size and rows (items x groups), the statistics kernels' tile and chunks, the apply
    kernels' tile."""
    batch, c = x.shape[:2]
    _, cells, x_strides = flat(x)
    out_strides = (0, 0, 0) if out is None else flat(out)[2]
    size = c // num_groups
    rows = batch * num_groups
    group_c, block_n = tiles(x, size)
    nsplit, chunk = split(rows, cells, block_n)
    block_c, block_n2 = tiles(x, c)
    return (cells, x_strides, out_strides, flat(m)[2], size, rows, group_c, block_n, nsplit, chunk, block_c,
            block_n2)


def group_norm_forward(y, x, weight, bias, mask, num_groups, scalars):
    """The Triton group norm over each item's valid cells (reference:
    :func:`._norm_reference.group_norm_forward`): two launches, ``_gn_stats`` then ``_gn_apply``.

    Args:
        y (Tensor[B, C, *S]): the output, written (spatial axes that flatten to one stride); zeros
            in the padding. x (Tensor[B, C, *S]): features, non-empty. weight, bias (Tensor[C],
            contiguous, optional). mask (Tensor[B, 1, *S], bool): True = padding. num_groups (int):
            divides ``C``. scalars (Tensor[2]): ``eps`` (then unused) in the statistics' dtype.

    Returns:
        ``(mean, rstd)`` (Tensor[B, G]) in the statistics' dtype.
    """
    x, m = flat_or_copy(x), flat_or_copy(mask)
    batch, c = x.shape[:2]
    cells, (sxb, sxc, sxs), (syb, syc, sys_), (smb, _, sms), size, rows, group_c, block_n, nsplit, chunk, \
        block_c, block_n2 = plan(("gn", x.shape, x.stride(), y.stride(), m.stride(), num_groups),
                                 lambda: _sizes(x, m, y, num_groups))
    stat, dtype = stat_type(x.dtype), scalars.dtype
    xf = x
    part = torch.empty(4 * rows * nsplit, dtype=dtype, device=x.device)
    mean = torch.empty(batch, num_groups, dtype=dtype, device=x.device)
    rstd = torch.empty(batch, num_groups, dtype=dtype, device=x.device)
    _gn_stats[(rows, nsplit)](xf, m, part, rows, num_groups, size, cells, chunk, nsplit, sxb, sxc, sxs, smb, sms,
                              STAT=stat, BLOCK_C=group_c, BLOCK_N=block_n, num_warps=warps(group_c, block_n))
    block_n = block_n2
    _gn_apply[(cdiv(cells, block_n), cdiv(c, block_c), batch)](
        xf, y, m, part, part if weight is None else weight, part if bias is None else bias, mean, rstd, scalars,
        rows, c, num_groups, size, cells, nsplit, sxb, sxc, sxs, syb, syc, sys_, smb, sms,
        HAS_W=weight is not None, HAS_B=bias is not None, STAT=stat, SPLIT_BLOCK=SPLIT_BLOCK, BLOCK_C=block_c,
        BLOCK_N=block_n, num_warps=warps(block_c, block_n))
    return mean, rstd


def group_norm_backward(gx, dy, x, mask, weight, mean, rstd, num_groups, need_weight, need_bias, param_dtype):
    """The Triton backward of :func:`group_norm_forward` (reference:
    :func:`._norm_reference.group_norm_backward`): two launches, ``_gn_grad_sums`` then
    ``_gn_grad_apply``. ``gx`` (Tensor[B, C, *S] or None: not needed) is written, zeros in its
    padding.

    Returns:
        ``(grad_weight, grad_bias)`` (Tensor[C] in ``param_dtype``), None where not needed.
    """
    x, dy, m = flat_or_copy(x), flat_or_copy(dy), flat_or_copy(mask)
    batch, c = x.shape[:2]
    key = ("gn_backward", x.shape, x.stride(), None if gx is None else gx.stride(), m.stride(), num_groups)
    cells, (sxb, sxc, sxs), (sgb, sgc, sgs), (smb, _, sms), size, rows, group_c, block_n, nsplit, chunk, \
        block_c, block_n2 = plan(key, lambda: _sizes(x, m, gx, num_groups))
    _, (sdb, sdc, sds) = plan(("strides", dy.shape, dy.stride()), lambda: flat(dy)[1:])
    stat, dtype = stat_type(x.dtype), mean.dtype
    xf, df = x, dy
    partg = torch.empty(3 * rows * nsplit, dtype=dtype, device=x.device)
    partc = torch.empty(2 * batch * c * nsplit, dtype=dtype, device=x.device)
    need_x = gx is not None
    gf = gx if need_x else partg
    gw = torch.empty(c, dtype=param_dtype, device=x.device) if need_weight else None
    gb = torch.empty(c, dtype=param_dtype, device=x.device) if need_bias else None
    w = partg if weight is None else weight
    _gn_grad_sums[(rows, nsplit)](df, xf, m, w, mean, partg, partc, rows, batch, c, num_groups, size, cells, chunk,
                                  nsplit, sdb, sdc, sds, sxb, sxc, sxs, smb, sms, HAS_W=weight is not None,
                                  STAT=stat, BLOCK_C=group_c, BLOCK_N=block_n, num_warps=warps(group_c, block_n))
    block_n = block_n2
    grid = (cdiv(cells, block_n), cdiv(c, block_c), batch) if need_x else (1, cdiv(c, block_c), 1)
    _gn_grad_apply[grid](
        df, xf, m, w, mean, rstd, partg, partc, gf, partg if gw is None else gw, partg if gb is None else gb,
        rows, batch, c, num_groups, size, cells, nsplit, sdb, sdc, sds, sxb, sxc, sxs, sgb, sgc, sgs, smb, sms,
        HAS_W=weight is not None, NEED_X=need_x, NEED_W=bool(need_weight), NEED_B=bool(need_bias), STAT=stat,
        SPLIT_BLOCK=SPLIT_BLOCK, BLOCK_C=block_c, BLOCK_N=block_n, num_warps=warps(block_c, block_n))
    return gw, gb
