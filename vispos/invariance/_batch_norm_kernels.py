"""Triton kernels of the masked batch norm: statistics over every item's valid cells, two kernels
each way.

Forward, ``_bn_stats`` writes each chunk's count, mean and centred sum of squares; ``_bn_apply``
writes the output and, from its first block per channel, the mean, the inverse deviation and the
running statistics. Backward, ``_bn_grad_sums`` writes each chunk's sums; ``_bn_grad_apply`` the
input's gradient and, from its first block per channel, the parameters'.

The reference is :mod:`._norm_torch` (``batch_norm_forward``, ``batch_norm_backward``,
``update_running_stats``); the launch geometry is :mod:`._norm_kernels`'. Values are loaded under
the padding mask (``other=0``), so whatever the padding holds is never read; statistics are float32
(float64 for float64 inputs). Each chunk's statistics are a lane-wise Welford merged with Chan's
formula, and the chunks merged again by the second kernel. ``num_batches_tracked`` is bumped by
the first kernel and read by the second, so no program reads what another of its launch writes.
The kernels use only Triton's builtins and ``tl.reduce`` with Triton's own sum combiner, so Triton's
interpreter runs them whichever way Triton was first imported.

References:
    Ioffe and Szegedy, Batch Normalization, ICML 2015; Welford, 1962; Chan, Golub and LeVeque,
    Algorithms for computing the sample variance, 1983.
"""

import torch
import triton.language as tl

from .. import _triton
from ._norm_kernels import cdiv, flat, mask_rows, p2, split, stat_types, tiles

__all__ = ["batch_norm_forward", "batch_norm_backward"]


@_triton.kernel
def _bn_stats(x_ptr, mask_ptr, part_ptr, nbt_ptr, C, S, NS, CHUNK, SPLIT, sxb, sxc, sxs, smb, sms,
              BUMP: tl.constexpr, STAT: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_N: tl.constexpr):
    pc = tl.program_id(0)
    ps = tl.program_id(1)
    ch = pc * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = ch < C
    cnt = tl.full([BLOCK_C, BLOCK_N], 0.0, STAT)
    avg = tl.full([BLOCK_C, BLOCK_N], 0.0, STAT)
    m2 = tl.full([BLOCK_C, BLOCK_N], 0.0, STAT)
    start = ps * CHUNK
    stop = tl.minimum(start + CHUNK, NS)
    for off in range(start, stop, BLOCK_N):
        idx = off + tl.arange(0, BLOCK_N)
        inb = idx < stop
        item = idx // S
        cell = idx - item * S
        keep = inb & (tl.load(mask_ptr + item * smb + cell * sms, mask=inb, other=1) == 0)
        offs = item.to(tl.int64)[None, :] * sxb + ch.to(tl.int64)[:, None] * sxc + cell.to(tl.int64)[None, :] * sxs
        v = tl.load(x_ptr + offs, mask=cmask[:, None] & keep[None, :], other=0.0).to(STAT)
        w = keep[None, :].to(STAT)
        cnt = cnt + w
        delta = v - avg
        avg = avg + w * delta / tl.maximum(cnt, 1.0)
        m2 = m2 + w * delta * (v - avg)
    total = tl.reduce(cnt, 1, tl.standard._sum_combine)
    mean = tl.reduce(cnt * avg, 1, tl.standard._sum_combine) / tl.maximum(total, 1.0)
    dev = avg - mean[:, None]
    sq = tl.reduce(m2 + cnt * dev * dev, 1, tl.standard._sum_combine)
    at = ch * SPLIT + ps
    tl.store(part_ptr + at, total, mask=cmask)
    tl.store(part_ptr + C * SPLIT + at, mean, mask=cmask)
    tl.store(part_ptr + 2 * C * SPLIT + at, sq, mask=cmask)
    if BUMP:
        if (pc == 0) & (ps == 0):
            tl.store(nbt_ptr, tl.load(nbt_ptr) + 1)


@_triton.kernel
def _bn_apply(x_ptr, y_ptr, mask_ptr, part_ptr, w_ptr, b_ptr, mean_ptr, invstd_ptr, rm_ptr, rv_ptr, nbt_ptr,
              C, S, NS, SPLIT, sxb, sxc, sxs, syb, syc, sysp, smb, sms, eps, momentum,
              HAS_W: tl.constexpr, HAS_B: tl.constexpr, ZERO_PAD: tl.constexpr, UPDATE: tl.constexpr,
              CUMULATIVE: tl.constexpr, STAT: tl.constexpr, SPLIT_BLOCK: tl.constexpr, BLOCK_C: tl.constexpr,
              BLOCK_N: tl.constexpr):
    pn = tl.program_id(0)
    pc = tl.program_id(1)
    ch = pc * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = ch < C
    sp = tl.arange(0, SPLIT_BLOCK)
    pmask = cmask[:, None] & (sp < SPLIT)[None, :]
    at = ch[:, None] * SPLIT + sp[None, :]
    pcnt = tl.load(part_ptr + at, mask=pmask, other=0.0)
    pmean = tl.load(part_ptr + C * SPLIT + at, mask=pmask, other=0.0)
    psq = tl.load(part_ptr + 2 * C * SPLIT + at, mask=pmask, other=0.0)
    total = tl.maximum(tl.reduce(pcnt, 1, tl.standard._sum_combine), 1.0)
    mean = tl.reduce(pcnt * pmean, 1, tl.standard._sum_combine) / total
    dev = pmean - mean[:, None]
    var = tl.reduce(psq + pcnt * dev * dev, 1, tl.standard._sum_combine) / total
    if STAT == tl.float64:  # sqrt_rn (IEEE rounding) takes float32 only; float64 sqrt is IEEE
        invstd = 1.0 / tl.sqrt(var + eps)
    else:
        invstd = 1.0 / tl.sqrt_rn(var + eps)
    a = invstd
    if HAS_W:
        a = a * tl.load(w_ptr + ch, mask=cmask, other=0.0).to(STAT)
    shift = tl.full([BLOCK_C], 0.0, STAT)
    if HAS_B:
        shift = tl.load(b_ptr + ch, mask=cmask, other=0.0).to(STAT)
    idx = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    inb = idx < NS
    item = idx // S
    cell = idx - item * S
    keep = inb & (tl.load(mask_ptr + item * smb + cell * sms, mask=inb, other=1) == 0)
    item64 = item.to(tl.int64)[None, :]
    cell64 = cell.to(tl.int64)[None, :]
    ch64 = ch.to(tl.int64)[:, None]
    valid2 = cmask[:, None] & keep[None, :]
    v = tl.load(x_ptr + item64 * sxb + ch64 * sxc + cell64 * sxs, mask=valid2, other=0.0).to(STAT)
    y = (v - mean[:, None]) * a[:, None] + shift[:, None]
    if ZERO_PAD:
        y = tl.where(valid2, y, 0.0)
    else:
        y = tl.where(valid2, y, shift[:, None])
    tl.store(y_ptr + item64 * syb + ch64 * syc + cell64 * sysp, y.to(y_ptr.dtype.element_ty),
             mask=cmask[:, None] & inb[None, :])
    if pn == 0:
        tl.store(mean_ptr + ch, mean, mask=cmask)
        tl.store(invstd_ptr + ch, invstd, mask=cmask)
        if UPDATE:
            if CUMULATIVE:  # bumped by the statistics kernel: 1 / num_batches_tracked
                factor = 1.0 / tl.load(nbt_ptr).to(STAT)
            else:
                factor = momentum
            unbiased = var * total / tl.maximum(total - 1.0, 1.0)
            rm = tl.load(rm_ptr + ch, mask=cmask, other=0.0).to(STAT)
            rv = tl.load(rv_ptr + ch, mask=cmask, other=0.0).to(STAT)
            tl.store(rm_ptr + ch, (rm * (1.0 - factor) + mean * factor).to(rm_ptr.dtype.element_ty), mask=cmask)
            tl.store(rv_ptr + ch, (rv * (1.0 - factor) + unbiased * factor).to(rv_ptr.dtype.element_ty), mask=cmask)


@_triton.kernel
def _bn_grad_sums(dy_ptr, x_ptr, mask_ptr, mean_ptr, part_ptr, C, S, NS, CHUNK, SPLIT, sdb, sdc, sds,
                  sxb, sxc, sxs, smb, sms, ALL_DY: tl.constexpr, STAT: tl.constexpr, BLOCK_C: tl.constexpr,
                  BLOCK_N: tl.constexpr):
    pc = tl.program_id(0)
    ps = tl.program_id(1)
    ch = pc * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = ch < C
    ch64 = ch.to(tl.int64)[:, None]
    mean = tl.load(mean_ptr + ch, mask=cmask, other=0.0)[:, None]
    cnt = tl.full([BLOCK_C, BLOCK_N], 0.0, STAT)
    sdz = tl.full([BLOCK_C, BLOCK_N], 0.0, STAT)
    sdzx = tl.full([BLOCK_C, BLOCK_N], 0.0, STAT)
    sdy = tl.full([BLOCK_C, BLOCK_N], 0.0, STAT)
    start = ps * CHUNK
    stop = tl.minimum(start + CHUNK, NS)
    for off in range(start, stop, BLOCK_N):
        idx = off + tl.arange(0, BLOCK_N)
        inb = idx < stop
        item = idx // S
        cell = idx - item * S
        keep = inb & (tl.load(mask_ptr + item * smb + cell * sms, mask=inb, other=1) == 0)
        item64 = item.to(tl.int64)[None, :]
        cell64 = cell.to(tl.int64)[None, :]
        valid2 = cmask[:, None] & keep[None, :]
        dz = tl.load(dy_ptr + item64 * sdb + ch64 * sdc + cell64 * sds, mask=valid2, other=0.0).to(STAT)
        v = tl.load(x_ptr + item64 * sxb + ch64 * sxc + cell64 * sxs, mask=valid2, other=0.0).to(STAT)
        cnt = cnt + keep[None, :].to(STAT)
        sdz = sdz + dz
        sdzx = sdzx + tl.where(valid2, dz * (v - mean), 0.0)
        if ALL_DY:  # the bias's gradient without zero_padding: the padding holds the bias
            inb2 = cmask[:, None] & inb[None, :]
            sdy = sdy + tl.load(dy_ptr + item64 * sdb + ch64 * sdc + cell64 * sds, mask=inb2, other=0.0).to(STAT)
    at = ch * SPLIT + ps
    tl.store(part_ptr + at, tl.reduce(cnt, 1, tl.standard._sum_combine), mask=cmask)
    tl.store(part_ptr + C * SPLIT + at, tl.reduce(sdz, 1, tl.standard._sum_combine), mask=cmask)
    tl.store(part_ptr + 2 * C * SPLIT + at, tl.reduce(sdzx, 1, tl.standard._sum_combine), mask=cmask)
    tl.store(part_ptr + 3 * C * SPLIT + at, tl.reduce(sdy, 1, tl.standard._sum_combine), mask=cmask)


@_triton.kernel
def _bn_grad_apply(dy_ptr, x_ptr, mask_ptr, mean_ptr, invstd_ptr, w_ptr, part_ptr, gx_ptr, gw_ptr, gb_ptr,
                   C, S, NS, SPLIT, sdb, sdc, sds, sxb, sxc, sxs, sgb, sgc, sgs, smb, sms,
                   HAS_W: tl.constexpr, NEED_X: tl.constexpr, NEED_W: tl.constexpr, NEED_B: tl.constexpr,
                   ALL_DY: tl.constexpr, STAT: tl.constexpr, SPLIT_BLOCK: tl.constexpr, BLOCK_C: tl.constexpr,
                   BLOCK_N: tl.constexpr):
    pn = tl.program_id(0)
    pc = tl.program_id(1)
    ch = pc * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = ch < C
    sp = tl.arange(0, SPLIT_BLOCK)
    pmask = cmask[:, None] & (sp < SPLIT)[None, :]
    at = ch[:, None] * SPLIT + sp[None, :]
    total = tl.maximum(tl.reduce(tl.load(part_ptr + at, mask=pmask, other=0.0), 1, tl.standard._sum_combine), 1.0)
    sdz = tl.reduce(tl.load(part_ptr + C * SPLIT + at, mask=pmask, other=0.0), 1, tl.standard._sum_combine)
    sdzx = tl.reduce(tl.load(part_ptr + 2 * C * SPLIT + at, mask=pmask, other=0.0), 1, tl.standard._sum_combine)
    invstd = tl.load(invstd_ptr + ch, mask=cmask, other=0.0)
    if pn == 0:
        if NEED_W:
            tl.store(gw_ptr + ch, (sdzx * invstd).to(gw_ptr.dtype.element_ty), mask=cmask)
        if NEED_B:
            if ALL_DY:
                sdy = tl.reduce(tl.load(part_ptr + 3 * C * SPLIT + at, mask=pmask, other=0.0), 1,
                                tl.standard._sum_combine)
                tl.store(gb_ptr + ch, sdy.to(gb_ptr.dtype.element_ty), mask=cmask)
            else:
                tl.store(gb_ptr + ch, sdz.to(gb_ptr.dtype.element_ty), mask=cmask)
    if NEED_X:
        a = invstd
        if HAS_W:
            a = a * tl.load(w_ptr + ch, mask=cmask, other=0.0).to(STAT)
        mean = tl.load(mean_ptr + ch, mask=cmask, other=0.0)
        k_mean = sdz / total
        k_proj = invstd * invstd * sdzx / total
        idx = pn * BLOCK_N + tl.arange(0, BLOCK_N)
        inb = idx < NS
        item = idx // S
        cell = idx - item * S
        keep = inb & (tl.load(mask_ptr + item * smb + cell * sms, mask=inb, other=1) == 0)
        item64 = item.to(tl.int64)[None, :]
        cell64 = cell.to(tl.int64)[None, :]
        ch64 = ch.to(tl.int64)[:, None]
        valid2 = cmask[:, None] & keep[None, :]
        dz = tl.load(dy_ptr + item64 * sdb + ch64 * sdc + cell64 * sds, mask=valid2, other=0.0).to(STAT)
        v = tl.load(x_ptr + item64 * sxb + ch64 * sxc + cell64 * sxs, mask=valid2, other=0.0).to(STAT)
        g = a[:, None] * (dz - k_mean[:, None] - (v - mean[:, None]) * k_proj[:, None])
        g = tl.where(valid2, g, 0.0)
        tl.store(gx_ptr + item64 * sgb + ch64 * sgc + cell64 * sgs, g.to(gx_ptr.dtype.element_ty),
                 mask=cmask[:, None] & inb[None, :])


def batch_norm_forward(y, x, weight, bias, mask, eps, zero_padding, momentum, running_mean, running_var,
                       num_batches_tracked):
    """The Triton batch norm over valid cells (see :func:`._norm_torch.batch_norm_forward` and
    :func:`._norm_torch.update_running_stats`, its reference): two launches, ``_bn_stats`` then
    ``_bn_apply``; the running statistics (when both are given) updated by the second.

    Args:
        y (Tensor[B, C, *S]): the output, written (spatial axes that flatten to one stride).
        x (Tensor[B, C, *S]): features, non-empty. weight, bias (Tensor[C], optional).
        mask (Tensor[B, 1, *S], bool): True = padding. eps (float). zero_padding (bool).
        momentum (float, optional): None: the cumulative average. running_mean, running_var (Tensor[C], optional),
        num_batches_tracked (Tensor[], optional): updated in place.

    Returns:
        ``(mean, invstd)`` (Tensor[C]) in the statistics' dtype.
    """
    batch, c = x.shape[:2]
    xf, cells, (sxb, sxc, sxs) = flat(x)
    yf, _, (syb, syc, sysp) = flat(y)
    assert yf is y, "the output's spatial axes flatten"
    m, smb, sms = mask_rows(mask, batch, cells)
    dtype, stat = stat_types(x.dtype)
    block_c, block_n = tiles(xf, c)
    cblocks = cdiv(c, block_c)
    ns = batch * cells
    nsplit, chunk = split(cblocks, ns, block_n)
    part = torch.empty(3 * c * nsplit, dtype=dtype, device=x.device)
    mean = torch.empty(c, dtype=dtype, device=x.device)
    invstd = torch.empty(c, dtype=dtype, device=x.device)
    update = running_mean is not None and running_var is not None
    bump = update and num_batches_tracked is not None
    _bn_stats[(cblocks, nsplit)](
        xf, m, part, num_batches_tracked if bump else part, c, cells, ns, chunk, nsplit, sxb, sxc, sxs, smb, sms,
        BUMP=bump, STAT=stat, BLOCK_C=block_c, BLOCK_N=block_n)
    _bn_apply[(cdiv(ns, block_n), cblocks)](
        xf, y, m, part, weight if weight is not None else part, bias if bias is not None else part, mean, invstd,
        running_mean if update else part, running_var if update else part, num_batches_tracked if bump else part,
        c, cells, ns, nsplit, sxb, sxc, sxs, syb, syc, sysp, smb, sms, float(eps),
        0.0 if momentum is None else float(momentum),
        HAS_W=weight is not None, HAS_B=bias is not None, ZERO_PAD=bool(zero_padding), UPDATE=update,
        CUMULATIVE=bump and momentum is None, STAT=stat, SPLIT_BLOCK=p2(nsplit), BLOCK_C=block_c, BLOCK_N=block_n)
    return mean, invstd


def batch_norm_backward(gx, dy, x, mask, weight, mean, invstd, zero_padding, need_weight, need_bias,
                        param_dtype):
    """The Triton backward of :func:`batch_norm_forward` (reference:
    :func:`._norm_torch.batch_norm_backward`): two launches, ``_bn_grad_sums`` then
    ``_bn_grad_apply``. ``gx`` (Tensor[B, C, *S] or None: not needed) is written, zeros in its
    padding.

    Returns:
        ``(grad_weight, grad_bias)`` (Tensor[C] in ``param_dtype``), None where not needed.
    """
    batch, c = x.shape[:2]
    xf, cells, (sxb, sxc, sxs) = flat(x)
    df, _, (sdb, sdc, sds) = flat(dy)
    m, smb, sms = mask_rows(mask, batch, cells)
    dtype, stat = stat_types(x.dtype)
    block_c, block_n = tiles(xf, c)
    cblocks = cdiv(c, block_c)
    ns = batch * cells
    nsplit, chunk = split(cblocks, ns, block_n)
    all_dy = need_bias and not zero_padding
    part = torch.empty(4 * c * nsplit, dtype=dtype, device=x.device)
    need_x = gx is not None
    if need_x:
        gf, _, (sgb, sgc, sgs) = flat(gx)
        assert gf is gx, "the gradient's spatial axes flatten"
    else:
        gf, (sgb, sgc, sgs) = part, (0, 0, 0)
    gw = torch.empty(c, dtype=param_dtype, device=x.device) if need_weight else None
    gb = torch.empty(c, dtype=param_dtype, device=x.device) if need_bias else None
    _bn_grad_sums[(cblocks, nsplit)](
        df, xf, m, mean, part, c, cells, ns, chunk, nsplit, sdb, sdc, sds, sxb, sxc, sxs, smb, sms,
        ALL_DY=all_dy, STAT=stat, BLOCK_C=block_c, BLOCK_N=block_n)
    _bn_grad_apply[(cdiv(ns, block_n) if need_x else 1, cblocks)](
        df, xf, m, mean, invstd, weight if weight is not None else part, part, gf,
        gw if gw is not None else part, gb if gb is not None else part,
        c, cells, ns, nsplit, sdb, sdc, sds, sxb, sxc, sxs, sgb, sgc, sgs, smb, sms,
        HAS_W=weight is not None, NEED_X=bool(need_x), NEED_W=bool(need_weight), NEED_B=bool(need_bias),
        ALL_DY=all_dy, STAT=stat, SPLIT_BLOCK=p2(nsplit), BLOCK_C=block_c, BLOCK_N=block_n)
    return gw, gb
