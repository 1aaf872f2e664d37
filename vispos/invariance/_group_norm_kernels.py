"""Triton kernels of the masked group norm (instance norm: one channel per group): each item's
statistics over its own valid cells, two kernels each way (``_gn_stats``, ``_gn_apply``;
``_gn_grad_sums``, ``_gn_grad_apply``).

The reference is :mod:`._norm_torch` (``group_norm_forward``, ``group_norm_backward``); the launch
geometry is :mod:`._norm_kernels`'. ``_gn_stats`` runs one program per item, group and chunk of
cells (a lane-wise Welford over the group's channels, merged with Chan's formula); ``_gn_apply``
merges the chunks of its rows and writes its tile of the output, zeros in the padding, and the
per-item, per-group mean and inverse deviation. Backward, ``_gn_grad_sums`` writes per chunk the
sums each item and group needs (``dy * w`` and ``dy * w * (x - mean)``) and, per item and channel,
those the parameters' gradients need; ``_gn_grad_apply`` writes ``grad_x`` and, from its first
tile per channel block, the parameters' gradients (a loop over the items' partial sums on the
device). Values are loaded under the padding mask (``other=0``); statistics are float32 (float64 for
float64 inputs). Only Triton's builtins and ``tl.reduce`` with its own sum combiner are used.

References:
    Wu and He, Group Normalization, ECCV 2018; Welford, 1962; Chan, Golub and LeVeque, 1983.
"""

import torch
import triton.language as tl

from .. import _triton
from ._norm_kernels import cdiv, flat, mask_rows, p2, split, stat_types, tiles

__all__ = ["group_norm_forward", "group_norm_backward"]


@_triton.kernel
def _gn_stats(x_ptr, mask_ptr, part_ptr, R, G, CPG, S, CHUNK, SPLIT, sxb, sxc, sxs, smb, sms,
              STAT: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    ps = tl.program_id(1)
    item = row // G
    grp = row - item * G
    cnt = tl.full([BLOCK_C, BLOCK_N], 0.0, STAT)
    avg = tl.full([BLOCK_C, BLOCK_N], 0.0, STAT)
    m2 = tl.full([BLOCK_C, BLOCK_N], 0.0, STAT)
    start = ps * CHUNK
    stop = tl.minimum(start + CHUNK, S)
    base = item.to(tl.int64) * sxb
    for c0 in range(0, CPG, BLOCK_C):
        cc = c0 + tl.arange(0, BLOCK_C)
        cmask = cc < CPG
        ch64 = (grp * CPG + cc).to(tl.int64)[:, None]
        for off in range(start, stop, BLOCK_N):
            cell = off + tl.arange(0, BLOCK_N)
            inb = cell < stop
            keep = inb & (tl.load(mask_ptr + item * smb + cell * sms, mask=inb, other=1) == 0)
            both = cmask[:, None] & keep[None, :]
            v = tl.load(x_ptr + base + ch64 * sxc + cell.to(tl.int64)[None, :] * sxs, mask=both, other=0.0).to(STAT)
            w = both.to(STAT)
            cnt = cnt + w
            delta = v - avg
            avg = avg + w * delta / tl.maximum(cnt, 1.0)
            m2 = m2 + w * delta * (v - avg)
    total = tl.reduce(tl.reduce(cnt, 1, tl.standard._sum_combine), 0, tl.standard._sum_combine)
    mean = tl.reduce(tl.reduce(cnt * avg, 1, tl.standard._sum_combine), 0, tl.standard._sum_combine)
    mean = mean / tl.maximum(total, 1.0)
    dev = avg - mean
    sq = tl.reduce(tl.reduce(m2 + cnt * dev * dev, 1, tl.standard._sum_combine), 0, tl.standard._sum_combine)
    at = row * SPLIT + ps
    tl.store(part_ptr + at, total)
    tl.store(part_ptr + R * SPLIT + at, mean)
    tl.store(part_ptr + 2 * R * SPLIT + at, sq)


@_triton.kernel
def _gn_apply(x_ptr, y_ptr, mask_ptr, part_ptr, w_ptr, b_ptr, mean_ptr, rstd_ptr, R, C, G, CPG, S, SPLIT,
              sxb, sxc, sxs, syb, syc, sysp, smb, sms, eps, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
              STAT: tl.constexpr, SPLIT_BLOCK: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_N: tl.constexpr):
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
    pcnt = tl.load(part_ptr + at, mask=pmask, other=0.0)
    pmean = tl.load(part_ptr + R * SPLIT + at, mask=pmask, other=0.0)
    psq = tl.load(part_ptr + 2 * R * SPLIT + at, mask=pmask, other=0.0)
    total = tl.maximum(tl.reduce(pcnt, 1, tl.standard._sum_combine), 1.0)
    mean = tl.reduce(pcnt * pmean, 1, tl.standard._sum_combine) / total
    dev = pmean - mean[:, None]
    var = tl.reduce(psq + pcnt * dev * dev, 1, tl.standard._sum_combine) / total
    if STAT == tl.float64:  # sqrt_rn (IEEE rounding) takes float32 only; float64 sqrt is IEEE
        rstd = 1.0 / tl.sqrt(var + eps)
    else:
        rstd = 1.0 / tl.sqrt_rn(var + eps)
    a = rstd
    if HAS_W:
        a = a * tl.load(w_ptr + ch, mask=cmask, other=0.0).to(STAT)
    shift = tl.full([BLOCK_C], 0.0, STAT)
    if HAS_B:
        shift = tl.load(b_ptr + ch, mask=cmask, other=0.0).to(STAT)
    cell = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    inb = cell < S
    keep = inb & (tl.load(mask_ptr + item * smb + cell * sms, mask=inb, other=1) == 0)
    both = cmask[:, None] & keep[None, :]
    ch64 = ch.to(tl.int64)[:, None]
    cell64 = cell.to(tl.int64)[None, :]
    item64 = item.to(tl.int64)
    v = tl.load(x_ptr + item64 * sxb + ch64 * sxc + cell64 * sxs, mask=both, other=0.0).to(STAT)
    y = tl.where(both, (v - mean[:, None]) * a[:, None] + shift[:, None], 0.0)
    tl.store(y_ptr + item64 * syb + ch64 * syc + cell64 * sysp, y.to(y_ptr.dtype.element_ty),
             mask=cmask[:, None] & inb[None, :])
    if pn == 0:
        first = cmask & (ch - grp * CPG == 0)  # one channel per group writes the group's statistics
        tl.store(mean_ptr + row, mean, mask=first)
        tl.store(rstd_ptr + row, rstd, mask=first)


@_triton.kernel
def _gn_grad_sums(dy_ptr, x_ptr, mask_ptr, w_ptr, mean_ptr, partg_ptr, partc_ptr, R, B, C, G, CPG, S, CHUNK,
                  SPLIT, sdb, sdc, sds, sxb, sxc, sxs, smb, sms, HAS_W: tl.constexpr, STAT: tl.constexpr,
                  BLOCK_C: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    ps = tl.program_id(1)
    item = row // G
    grp = row - item * G
    mean = tl.load(mean_ptr + row)
    start = ps * CHUNK
    stop = tl.minimum(start + CHUNK, S)
    item64 = item.to(tl.int64)
    acc_n = tl.full([BLOCK_C], 0.0, STAT)
    acc_1 = tl.full([BLOCK_C], 0.0, STAT)
    acc_2 = tl.full([BLOCK_C], 0.0, STAT)
    for c0 in range(0, CPG, BLOCK_C):
        cc = c0 + tl.arange(0, BLOCK_C)
        cmask = cc < CPG
        ch = grp * CPG + cc
        ch64 = ch.to(tl.int64)[:, None]
        cnt = tl.full([BLOCK_C, BLOCK_N], 0.0, STAT)
        s1 = tl.full([BLOCK_C, BLOCK_N], 0.0, STAT)
        s2 = tl.full([BLOCK_C, BLOCK_N], 0.0, STAT)
        for off in range(start, stop, BLOCK_N):
            cell = off + tl.arange(0, BLOCK_N)
            inb = cell < stop
            keep = inb & (tl.load(mask_ptr + item * smb + cell * sms, mask=inb, other=1) == 0)
            both = cmask[:, None] & keep[None, :]
            cell64 = cell.to(tl.int64)[None, :]
            dz = tl.load(dy_ptr + item64 * sdb + ch64 * sdc + cell64 * sds, mask=both, other=0.0).to(STAT)
            v = tl.load(x_ptr + item64 * sxb + ch64 * sxc + cell64 * sxs, mask=both, other=0.0).to(STAT)
            cnt = cnt + both.to(STAT)
            s1 = s1 + dz
            s2 = s2 + tl.where(both, dz * (v - mean), 0.0)
        r1 = tl.reduce(s1, 1, tl.standard._sum_combine)
        r2 = tl.reduce(s2, 1, tl.standard._sum_combine)
        at = (item * C + ch) * SPLIT + ps  # per item and channel: the parameters' gradients
        tl.store(partc_ptr + at, r1, mask=cmask)
        tl.store(partc_ptr + B * C * SPLIT + at, r2, mask=cmask)
        if HAS_W:
            wv = tl.load(w_ptr + ch, mask=cmask, other=0.0).to(STAT)
            r1 = r1 * wv
            r2 = r2 * wv
        acc_n = acc_n + tl.reduce(cnt, 1, tl.standard._sum_combine)
        acc_1 = acc_1 + r1
        acc_2 = acc_2 + r2
    at = row * SPLIT + ps
    tl.store(partg_ptr + at, tl.reduce(acc_n, 0, tl.standard._sum_combine))
    tl.store(partg_ptr + R * SPLIT + at, tl.reduce(acc_1, 0, tl.standard._sum_combine))
    tl.store(partg_ptr + 2 * R * SPLIT + at, tl.reduce(acc_2, 0, tl.standard._sum_combine))


@_triton.kernel
def _gn_grad_apply(dy_ptr, x_ptr, mask_ptr, w_ptr, mean_ptr, rstd_ptr, partg_ptr, partc_ptr, gx_ptr, gw_ptr, gb_ptr,
                   R, B, C, G, CPG, S, SPLIT, sdb, sdc, sds, sxb, sxc, sxs, sgb, sgc, sgs, smb, sms,
                   HAS_W: tl.constexpr, NEED_X: tl.constexpr, NEED_W: tl.constexpr, NEED_B: tl.constexpr,
                   STAT: tl.constexpr, SPLIT_BLOCK: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_N: tl.constexpr):
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
        total = tl.maximum(tl.reduce(tl.load(partg_ptr + at, mask=pmask, other=0.0), 1, tl.standard._sum_combine), 1.0)
        k1 = tl.reduce(tl.load(partg_ptr + R * SPLIT + at, mask=pmask, other=0.0), 1, tl.standard._sum_combine)
        k2 = tl.reduce(tl.load(partg_ptr + 2 * R * SPLIT + at, mask=pmask, other=0.0), 1, tl.standard._sum_combine)
        mean = tl.load(mean_ptr + row, mask=cmask, other=0.0)
        rstd = tl.load(rstd_ptr + row, mask=cmask, other=0.0)
        wv = tl.full([BLOCK_C], 1.0, STAT)
        if HAS_W:
            wv = tl.load(w_ptr + ch, mask=cmask, other=0.0).to(STAT)
        k1 = k1 / total
        k2 = rstd * rstd * k2 / total
        cell = pn * BLOCK_N + tl.arange(0, BLOCK_N)
        inb = cell < S
        keep = inb & (tl.load(mask_ptr + item * smb + cell * sms, mask=inb, other=1) == 0)
        both = cmask[:, None] & keep[None, :]
        ch64 = ch.to(tl.int64)[:, None]
        cell64 = cell.to(tl.int64)[None, :]
        item64 = item.to(tl.int64)
        dz = tl.load(dy_ptr + item64 * sdb + ch64 * sdc + cell64 * sds, mask=both, other=0.0).to(STAT)
        v = tl.load(x_ptr + item64 * sxb + ch64 * sxc + cell64 * sxs, mask=both, other=0.0).to(STAT)
        g = rstd[:, None] * (dz * wv[:, None] - k1[:, None] - (v - mean[:, None]) * k2[:, None])
        g = tl.where(both, g, 0.0)
        tl.store(gx_ptr + item64 * sgb + ch64 * sgc + cell64 * sgs, g.to(gx_ptr.dtype.element_ty),
                 mask=cmask[:, None] & inb[None, :])
    if NEED_W or NEED_B:
        if (pn == 0) & (item == 0):  # the parameters' gradients: sum over the items' partial sums
            gw = tl.full([BLOCK_C], 0.0, STAT)
            gb = tl.full([BLOCK_C], 0.0, STAT)
            for bb in range(0, B):
                at = (bb * C + ch)[:, None] * SPLIT + sp[None, :]
                gb = gb + tl.reduce(tl.load(partc_ptr + at, mask=pmask, other=0.0), 1, tl.standard._sum_combine)
                q2 = tl.reduce(tl.load(partc_ptr + B * C * SPLIT + at, mask=pmask, other=0.0), 1,
                               tl.standard._sum_combine)
                gw = gw + q2 * tl.load(rstd_ptr + bb * G + grp, mask=cmask, other=0.0)
            if NEED_W:
                tl.store(gw_ptr + ch, gw.to(gw_ptr.dtype.element_ty), mask=cmask)
            if NEED_B:
                tl.store(gb_ptr + ch, gb.to(gb_ptr.dtype.element_ty), mask=cmask)


def group_norm_forward(y, x, weight, bias, mask, num_groups, eps):
    """The Triton group norm over each item's valid cells (reference:
    :func:`._norm_torch.group_norm_forward`): two launches, ``_gn_stats`` then ``_gn_apply``.

    Args:
        y (Tensor[B, C, *S]): the output, written (spatial axes that flatten to one stride); zeros
            in the padding. x (Tensor[B, C, *S]): features, non-empty. weight, bias (Tensor[C],
            optional). mask (Tensor[B, 1, *S], bool): True = padding. num_groups (int): divides
            ``C``. eps (float).

    Returns:
        ``(mean, rstd)`` (Tensor[B, G]) in the statistics' dtype.
    """
    batch, c = x.shape[:2]
    xf, cells, (sxb, sxc, sxs) = flat(x)
    yf, _, (syb, syc, sysp) = flat(y)
    assert yf is y, "the output's spatial axes flatten"
    m, smb, sms = mask_rows(mask, batch, cells)
    dtype, stat = stat_types(x.dtype)
    size = c // num_groups
    rows = batch * num_groups
    group_c, block_n = tiles(xf, size)
    nsplit, chunk = split(rows, cells, block_n)
    part = torch.empty(3 * rows * nsplit, dtype=dtype, device=x.device)
    mean = torch.empty(batch, num_groups, dtype=dtype, device=x.device)
    rstd = torch.empty(batch, num_groups, dtype=dtype, device=x.device)
    _gn_stats[(rows, nsplit)](xf, m, part, rows, num_groups, size, cells, chunk, nsplit, sxb, sxc, sxs, smb, sms,
                              STAT=stat, BLOCK_C=group_c, BLOCK_N=block_n)
    block_c, block_n = tiles(xf, c)
    _gn_apply[(cdiv(cells, block_n), cdiv(c, block_c), batch)](
        xf, y, m, part, weight if weight is not None else part, bias if bias is not None else part, mean, rstd,
        rows, c, num_groups, size, cells, nsplit, sxb, sxc, sxs, syb, syc, sysp, smb, sms, float(eps),
        HAS_W=weight is not None, HAS_B=bias is not None, STAT=stat, SPLIT_BLOCK=p2(nsplit), BLOCK_C=block_c,
        BLOCK_N=block_n)
    return mean, rstd


def group_norm_backward(gx, dy, x, mask, weight, mean, rstd, num_groups, need_weight, need_bias, param_dtype):
    """The Triton backward of :func:`group_norm_forward` (reference:
    :func:`._norm_torch.group_norm_backward`): two launches, ``_gn_grad_sums`` then
    ``_gn_grad_apply``. ``gx`` (Tensor[B, C, *S] or None: not needed) is written, zeros in its
    padding.

    Returns:
        ``(grad_weight, grad_bias)`` (Tensor[C] in ``param_dtype``), None where not needed.
    """
    batch, c = x.shape[:2]
    xf, cells, (sxb, sxc, sxs) = flat(x)
    df, _, (sdb, sdc, sds) = flat(dy)
    m, smb, sms = mask_rows(mask, batch, cells)
    dtype, stat = stat_types(x.dtype)
    size = c // num_groups
    rows = batch * num_groups
    group_c, block_n = tiles(xf, size)
    nsplit, chunk = split(rows, cells, block_n)
    partg = torch.empty(3 * rows * nsplit, dtype=dtype, device=x.device)
    partc = torch.empty(2 * batch * c * nsplit, dtype=dtype, device=x.device)
    need_x = gx is not None
    if need_x:
        gf, _, (sgb, sgc, sgs) = flat(gx)
        assert gf is gx, "the gradient's spatial axes flatten"
    else:
        gf, (sgb, sgc, sgs) = partg, (0, 0, 0)
    gw = torch.empty(c, dtype=param_dtype, device=x.device) if need_weight else None
    gb = torch.empty(c, dtype=param_dtype, device=x.device) if need_bias else None
    w = weight if weight is not None else partg
    _gn_grad_sums[(rows, nsplit)](df, xf, m, w, mean, partg, partc, rows, batch, c, num_groups, size, cells, chunk,
                                  nsplit, sdb, sdc, sds, sxb, sxc, sxs, smb, sms, HAS_W=weight is not None,
                                  STAT=stat, BLOCK_C=group_c, BLOCK_N=block_n)
    block_c, block_n = tiles(xf, c)
    grid = (cdiv(cells, block_n), cdiv(c, block_c), batch) if need_x else (1, cdiv(c, block_c), 1)
    _gn_grad_apply[grid](
        df, xf, m, w, mean, rstd, partg, partc, gf, gw if gw is not None else partg, gb if gb is not None else partg,
        rows, batch, c, num_groups, size, cells, nsplit, sdb, sdc, sds, sxb, sxc, sxs, sgb, sgc, sgs, smb, sms,
        HAS_W=weight is not None, NEED_X=need_x, NEED_W=bool(need_weight), NEED_B=bool(need_bias), STAT=stat,
        SPLIT_BLOCK=p2(nsplit), BLOCK_C=block_c, BLOCK_N=block_n)
    return gw, gb
