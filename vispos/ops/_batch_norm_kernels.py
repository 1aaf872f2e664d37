"""Triton kernels of the masked batch norm and their launchers: statistics over every item's valid
cells, two kernels each way.

Forward, ``_bn_stats`` writes each chunk's shifted statistics (:mod:`._jit`); ``_bn_apply`` merges a
channel's chunks, writes the output and, from its first block per channel, the mean, the inverse
deviation and the running statistics. Backward, ``_bn_grad_sums`` writes each chunk's sums;
``_bn_grad_apply`` the input's gradient and, from its first block per channel, the parameters'.

The reference is :mod:`._norm_reference` (``batch_norm_forward``, ``batch_norm_backward``,
``update_running_stats``); the launch sizes are :mod:`._sizes`'. Values are loaded under the
padding mask (``other=0``), so whatever the padding holds is never read; statistics are float32
(float64 for float64 inputs), and ``eps`` and ``momentum`` are read from a tensor in that dtype.
``num_batches_tracked`` is bumped by the first kernel and read by the second, so no program reads
what another of its launch writes. Sizes and strides are not specialized (one compiled variant per
memory format, dtype and option set).

References:
    Ioffe and Szegedy, Batch Normalization, ICML 2015; Chan, Golub and LeVeque, Algorithms for
    computing the sample variance, 1983.
"""

import torch
import triton.language as tl

from . import _triton
from ._jit import kept, lane_update, lanes_stats, merge, merge_parts, normalizer, offsets, stat_type, total
from ._sizes import SPLIT_BLOCK, cdiv, flat, flat_or_copy, out_format, out_like, plan, split, tiles, warps

__all__ = ["batch_norm_forward", "batch_norm_backward"]

_SIZES = ("C", "S", "NS", "CHUNK", "SPLIT", "stride_xb", "stride_xc", "stride_xs", "stride_yb", "stride_yc",
          "stride_ys", "stride_db", "stride_dc", "stride_ds", "stride_gb", "stride_gc", "stride_gs", "stride_mb",
          "stride_ms", "stride_rm", "stride_rv")


def _sizes_of(fn):
    """The size and stride parameters of ``fn``: never specialized."""
    names = fn.__code__.co_varnames[:fn.__code__.co_argcount]
    return _triton.kernel(do_not_specialize=tuple(n for n in names if n in _SIZES))(fn)


@_sizes_of
def _bn_stats(x_ptr, mask_ptr, part_ptr, nbt_ptr, C, NS, S, CHUNK, SPLIT, stride_xb, stride_xc, stride_xs,
              stride_mb, stride_ms, BUMP: tl.constexpr, STAT: tl.constexpr, BLOCK_C: tl.constexpr,
              BLOCK_N: tl.constexpr):
    pc = tl.program_id(0)
    ps = tl.program_id(1)
    ch = pc * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = ch < C
    cnt = tl.zeros([BLOCK_C, BLOCK_N], STAT)
    shift = tl.zeros([BLOCK_C, BLOCK_N], STAT)
    s1 = tl.zeros([BLOCK_C, BLOCK_N], STAT)
    s2 = tl.zeros([BLOCK_C, BLOCK_N], STAT)
    start = ps * CHUNK
    stop = tl.minimum(start + CHUNK, NS)
    for off in range(start, stop, BLOCK_N):
        idx = off + tl.arange(0, BLOCK_N)
        item = idx // S
        cell = idx - item * S
        keep = cmask[:, None] & kept(mask_ptr, item, cell, idx < stop, stride_mb, stride_ms)[None, :]
        at = offsets(item[None, :], ch[:, None], cell[None, :], stride_xb, stride_xc, stride_xs)
        v = tl.load(x_ptr + at, mask=keep, other=0.0).to(STAT)
        cnt, shift, s1, s2 = lane_update(cnt, shift, s1, s2, v, keep)
    rel, m2 = lanes_stats(cnt, s1, s2)
    n, ref, mean, sq = merge(cnt, shift, rel, m2, 1)
    at = ch * SPLIT + ps
    tl.store(part_ptr + at, n, mask=cmask)
    tl.store(part_ptr + C * SPLIT + at, ref, mask=cmask)
    tl.store(part_ptr + 2 * C * SPLIT + at, mean, mask=cmask)
    tl.store(part_ptr + 3 * C * SPLIT + at, sq, mask=cmask)
    if BUMP:
        if (pc == 0) & (ps == 0):
            tl.store(nbt_ptr, tl.load(nbt_ptr) + 1)


@_sizes_of
def _bn_apply(x_ptr, y_ptr, mask_ptr, part_ptr, w_ptr, b_ptr, mean_ptr, invstd_ptr, scalars_ptr, rm_ptr, rv_ptr,
              nbt_ptr, C, NS, S, SPLIT, stride_xb, stride_xc, stride_xs, stride_yb, stride_yc, stride_ys,
              stride_mb, stride_ms, stride_rm, stride_rv, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
              ZERO_PAD: tl.constexpr, UPDATE: tl.constexpr, CUMULATIVE: tl.constexpr, STAT: tl.constexpr,
              SPLIT_BLOCK: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_N: tl.constexpr):
    pn = tl.program_id(0)
    pc = tl.program_id(1)
    ch = pc * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = ch < C
    sp = tl.arange(0, SPLIT_BLOCK)
    pmask = cmask[:, None] & (sp < SPLIT)[None, :]
    at = ch[:, None] * SPLIT + sp[None, :]
    total_n, ref, rel, sq = merge_parts(part_ptr, at, C * SPLIT, pmask)
    mean = ref + rel
    count = tl.maximum(total_n, 1.0)
    var = sq / count
    invstd, a, shift = normalizer(var, tl.load(scalars_ptr), w_ptr, b_ptr, ch, cmask, HAS_W, HAS_B, STAT)
    idx = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    inb = idx < NS
    item = idx // S
    cell = idx - item * S
    keep = cmask[:, None] & kept(mask_ptr, item, cell, inb, stride_mb, stride_ms)[None, :]
    v = tl.load(x_ptr + offsets(item[None, :], ch[:, None], cell[None, :], stride_xb, stride_xc, stride_xs),
                mask=keep, other=0.0).to(STAT)
    y = tl.where(keep, (v - mean[:, None]) * a[:, None] + shift[:, None], 0.0 if ZERO_PAD else shift[:, None])
    tl.store(y_ptr + offsets(item[None, :], ch[:, None], cell[None, :], stride_yb, stride_yc, stride_ys),
             y.to(y_ptr.dtype.element_ty), mask=cmask[:, None] & inb[None, :])
    if pn == 0:
        tl.store(mean_ptr + ch, mean, mask=cmask)
        tl.store(invstd_ptr + ch, invstd, mask=cmask)
        if UPDATE:
            if CUMULATIVE:  # bumped by the statistics kernel: 1 / num_batches_tracked
                factor = 1.0 / tl.load(nbt_ptr).to(STAT)
            else:
                factor = tl.load(scalars_ptr + 1)
            unbiased = sq / tl.maximum(total_n - 1.0, 1.0)
            rm = tl.load(rm_ptr + ch * stride_rm, mask=cmask, other=0.0).to(STAT)
            rv = tl.load(rv_ptr + ch * stride_rv, mask=cmask, other=0.0).to(STAT)
            tl.store(rm_ptr + ch * stride_rm, (rm * (1.0 - factor) + mean * factor).to(rm_ptr.dtype.element_ty),
                     mask=cmask)
            tl.store(rv_ptr + ch * stride_rv, (rv * (1.0 - factor) + unbiased * factor).to(rv_ptr.dtype.element_ty),
                     mask=cmask)


@_sizes_of
def _bn_grad_sums(dy_ptr, x_ptr, mask_ptr, mean_ptr, part_ptr, C, NS, S, CHUNK, SPLIT, stride_db, stride_dc,
                  stride_ds, stride_xb, stride_xc, stride_xs, stride_mb, stride_ms, ALL_DY: tl.constexpr,
                  STAT: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_N: tl.constexpr):
    pc = tl.program_id(0)
    ps = tl.program_id(1)
    ch = pc * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = ch < C
    mean = tl.load(mean_ptr + ch, mask=cmask, other=0.0)[:, None]
    cnt = tl.zeros([BLOCK_C, BLOCK_N], STAT)
    sdz = tl.zeros([BLOCK_C, BLOCK_N], STAT)
    sdzx = tl.zeros([BLOCK_C, BLOCK_N], STAT)
    sdy = tl.zeros([BLOCK_C, BLOCK_N], STAT)
    start = ps * CHUNK
    stop = tl.minimum(start + CHUNK, NS)
    for off in range(start, stop, BLOCK_N):
        idx = off + tl.arange(0, BLOCK_N)
        inb = idx < stop
        item = idx // S
        cell = idx - item * S
        keep = cmask[:, None] & kept(mask_ptr, item, cell, inb, stride_mb, stride_ms)[None, :]
        at_d = offsets(item[None, :], ch[:, None], cell[None, :], stride_db, stride_dc, stride_ds)
        dz = tl.load(dy_ptr + at_d, mask=keep, other=0.0).to(STAT)
        v = tl.load(x_ptr + offsets(item[None, :], ch[:, None], cell[None, :], stride_xb, stride_xc, stride_xs),
                    mask=keep, other=0.0).to(STAT)
        cnt = cnt + keep.to(STAT)
        sdz = sdz + dz
        sdzx = sdzx + tl.where(keep, dz * (v - mean), 0.0)
        if ALL_DY:  # the bias's gradient without zero_padding: the padding holds the bias
            sdy = sdy + tl.load(dy_ptr + at_d, mask=cmask[:, None] & inb[None, :], other=0.0).to(STAT)
    at = ch * SPLIT + ps
    tl.store(part_ptr + at, total(cnt, 1), mask=cmask)
    tl.store(part_ptr + C * SPLIT + at, total(sdz, 1), mask=cmask)
    tl.store(part_ptr + 2 * C * SPLIT + at, total(sdzx, 1), mask=cmask)
    tl.store(part_ptr + 3 * C * SPLIT + at, total(sdy, 1), mask=cmask)


@_sizes_of
def _bn_grad_apply(dy_ptr, x_ptr, mask_ptr, mean_ptr, invstd_ptr, w_ptr, part_ptr, gx_ptr, gw_ptr, gb_ptr,
                   C, NS, S, SPLIT, stride_db, stride_dc, stride_ds, stride_xb, stride_xc, stride_xs, stride_gb,
                   stride_gc, stride_gs, stride_mb, stride_ms, HAS_W: tl.constexpr, NEED_X: tl.constexpr,
                   NEED_W: tl.constexpr, NEED_B: tl.constexpr, ALL_DY: tl.constexpr, STAT: tl.constexpr,
                   SPLIT_BLOCK: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_N: tl.constexpr):
    pn = tl.program_id(0)
    pc = tl.program_id(1)
    ch = pc * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = ch < C
    sp = tl.arange(0, SPLIT_BLOCK)
    pmask = cmask[:, None] & (sp < SPLIT)[None, :]
    at = ch[:, None] * SPLIT + sp[None, :]
    count = tl.maximum(total(tl.load(part_ptr + at, mask=pmask, other=0.0), 1), 1.0)
    sdz = total(tl.load(part_ptr + C * SPLIT + at, mask=pmask, other=0.0), 1)
    sdzx = total(tl.load(part_ptr + 2 * C * SPLIT + at, mask=pmask, other=0.0), 1)
    invstd = tl.load(invstd_ptr + ch, mask=cmask, other=0.0)
    if pn == 0:
        if NEED_W:
            tl.store(gw_ptr + ch, (sdzx * invstd).to(gw_ptr.dtype.element_ty), mask=cmask)
        if NEED_B:
            if ALL_DY:
                sdy = total(tl.load(part_ptr + 3 * C * SPLIT + at, mask=pmask, other=0.0), 1)
                tl.store(gb_ptr + ch, sdy.to(gb_ptr.dtype.element_ty), mask=cmask)
            else:
                tl.store(gb_ptr + ch, sdz.to(gb_ptr.dtype.element_ty), mask=cmask)
    if NEED_X:
        a = invstd
        if HAS_W:
            a = a * tl.load(w_ptr + ch, mask=cmask, other=0.0).to(STAT)
        mean = tl.load(mean_ptr + ch, mask=cmask, other=0.0)
        k_mean = sdz / count
        k_proj = invstd * invstd * sdzx / count
        idx = pn * BLOCK_N + tl.arange(0, BLOCK_N)
        inb = idx < NS
        item = idx // S
        cell = idx - item * S
        keep = cmask[:, None] & kept(mask_ptr, item, cell, inb, stride_mb, stride_ms)[None, :]
        dz = tl.load(dy_ptr + offsets(item[None, :], ch[:, None], cell[None, :], stride_db, stride_dc, stride_ds),
                     mask=keep, other=0.0).to(STAT)
        v = tl.load(x_ptr + offsets(item[None, :], ch[:, None], cell[None, :], stride_xb, stride_xc, stride_xs),
                    mask=keep, other=0.0).to(STAT)
        g = tl.where(keep, a[:, None] * (dz - k_mean[:, None] - (v - mean[:, None]) * k_proj[:, None]), 0.0)
        tl.store(gx_ptr + offsets(item[None, :], ch[:, None], cell[None, :], stride_gb, stride_gc, stride_gs),
                 g.to(gx_ptr.dtype.element_ty), mask=cmask[:, None] & inb[None, :])


def _sizes(x, m, out):
    """A launch's sizes for ``x`` (Tensor[B, C, *S]), its mask ``m`` (Tensor[B, 1, *S]) and the map
    ``out`` it writes (None: none): cells per item, the three maps' (batch, channel, cell) strides,
    the tile, the channel blocks, the cells of the batch, the chunks and the warps."""
    c = x.shape[1]
    _, cells, x_strides = flat(x)
    out_strides = (0, 0, 0) if out is None else flat(out)[2]
    block_c, block_n = tiles(x, c)
    cblocks = cdiv(c, block_c)
    ns = x.shape[0] * cells
    nsplit, chunk = split(cblocks, ns, block_n)
    return (cells, x_strides, out_strides, flat(m)[2], block_c, block_n, cblocks, ns, nsplit, chunk,
            warps(block_c, block_n))


def _forward_sizes(x, mask):
    """:func:`_sizes` of a forward on ``x`` and ``mask`` as given, with the output's memory format, or
    None when either must be copied first (its spatial axes do not flatten to one stride)."""
    if flat(x)[0] is not x or flat(mask)[0] is not mask:
        return None
    fmt = out_format(x)
    return fmt, _sizes(x, mask, torch.empty_like(x, device="meta", memory_format=fmt))


def batch_norm_forward(x, weight, bias, mask, scalars, momentum, running_mean, running_var, num_batches_tracked,
                       zero_padding):
    """The Triton batch norm over valid cells (reference: :func:`._norm_reference.batch_norm_forward`
    and :func:`._norm_reference.update_running_stats`): two launches, ``_bn_stats`` then
    ``_bn_apply``; the running statistics (when both are given) updated by the second. The sizes of
    a launch are computed once per shape and strides (:func:`._sizes.plan`).

    Args:
        x (Tensor[B, C, *S]): features, non-empty. weight, bias (Tensor[C], contiguous, optional).
        mask (Tensor[B, 1, *S], bool): True = padding.
        scalars (Tensor[2]): ``eps`` and ``momentum`` in the statistics' dtype.
        momentum (float, optional): None: the cumulative average.
        running_mean, running_var (Tensor[C], one stride, optional), num_batches_tracked (Tensor[],
        optional): updated in place.
        zero_padding (bool): zeros in the output's padding.

    Returns:
        ``(y, mean, invstd)``: the output (Tensor[B, C, *S] laid out by :func:`._sizes.out_like`),
        the mean and the inverse deviation (Tensor[C]) in the statistics' dtype.
    """
    found = plan(("bn", x.shape, x.stride(), mask.stride()), lambda: _forward_sizes(x, mask))
    if found is None:  # a layout whose spatial axes do not flatten: through contiguous copies
        y = out_like(x)
        x, m = flat_or_copy(x), flat_or_copy(mask)
        sizes = _sizes(x, m, y)
    else:
        fmt, sizes = found
        y, m = torch.empty_like(x, memory_format=fmt), mask
    cells, (sxb, sxc, sxs), (syb, syc, sys_), (smb, _, sms), block_c, block_n, cblocks, ns, nsplit, chunk, \
        num_warps = sizes
    c = x.shape[1]
    stat = stat_type(x.dtype)
    part = torch.empty(4 * c * nsplit, dtype=scalars.dtype, device=x.device)
    mean = torch.empty(c, dtype=scalars.dtype, device=x.device)
    invstd = torch.empty(c, dtype=scalars.dtype, device=x.device)
    update = running_mean is not None and running_var is not None
    bump = update and num_batches_tracked is not None
    _bn_stats[(cblocks, nsplit)](
        x, m, part, num_batches_tracked if bump else part, c, ns, cells, chunk, nsplit, sxb, sxc, sxs, smb, sms,
        BUMP=bump, STAT=stat, BLOCK_C=block_c, BLOCK_N=block_n, num_warps=num_warps)
    _bn_apply[(cdiv(ns, block_n), cblocks)](
        x, y, m, part, part if weight is None else weight, part if bias is None else bias, mean, invstd, scalars,
        running_mean if update else part, running_var if update else part, num_batches_tracked if bump else part,
        c, ns, cells, nsplit, sxb, sxc, sxs, syb, syc, sys_, smb, sms, running_mean.stride(0) if update else 0,
        running_var.stride(0) if update else 0,
        HAS_W=weight is not None, HAS_B=bias is not None, ZERO_PAD=bool(zero_padding), UPDATE=update,
        CUMULATIVE=bump and momentum is None, STAT=stat, SPLIT_BLOCK=SPLIT_BLOCK, BLOCK_C=block_c, BLOCK_N=block_n,
        num_warps=num_warps)
    return y, mean, invstd


def _backward_sizes(x, dy, mask, gx):
    """:func:`_sizes` of a backward and ``dy``'s strides, or None when ``x``, ``dy`` or ``mask`` must
    be copied first (spatial axes that do not flatten to one stride)."""
    if any(flat(t)[0] is not t for t in (x, dy, mask)):
        return None
    return _sizes(x, mask, gx), flat(dy)[2]


def batch_norm_backward(gx, dy, x, mask, weight, mean, invstd, zero_padding, need_weight, need_bias, param_dtype):
    """The Triton backward of :func:`batch_norm_forward` (reference:
    :func:`._norm_reference.batch_norm_backward`): two launches, ``_bn_grad_sums`` then
    ``_bn_grad_apply``. ``gx`` (Tensor[B, C, *S] or None: not needed) is written, zeros in its
    padding; ``mean`` and ``invstd`` (Tensor[C]) are the forward's.

    Returns:
        ``(grad_weight, grad_bias)`` (Tensor[C] in ``param_dtype``), None where not needed.
    """
    key = ("bn_backward", x.shape, x.stride(), dy.stride(), mask.stride(), None if gx is None else gx.stride())
    found = plan(key, lambda: _backward_sizes(x, dy, mask, gx))
    if found is None:  # a layout whose spatial axes do not flatten: through contiguous copies
        x, dy, m = flat_or_copy(x), flat_or_copy(dy), flat_or_copy(mask)
        sizes, dy_strides = _sizes(x, m, gx), flat(dy)[2]
    else:
        (sizes, dy_strides), m = found, mask
    cells, (sxb, sxc, sxs), (sgb, sgc, sgs), (smb, _, sms), block_c, block_n, cblocks, ns, nsplit, chunk, \
        num_warps = sizes
    sdb, sdc, sds = dy_strides
    c, xf, df = x.shape[1], x, dy
    all_dy = need_bias and not zero_padding
    part = torch.empty(4 * c * nsplit, dtype=mean.dtype, device=x.device)
    need_x = gx is not None
    gf = gx if need_x else part
    gw = torch.empty(c, dtype=param_dtype, device=x.device) if need_weight else None
    gb = torch.empty(c, dtype=param_dtype, device=x.device) if need_bias else None
    stat = stat_type(x.dtype)
    _bn_grad_sums[(cblocks, nsplit)](
        df, xf, m, mean, part, c, ns, cells, chunk, nsplit, sdb, sdc, sds, sxb, sxc, sxs, smb, sms,
        ALL_DY=all_dy, STAT=stat, BLOCK_C=block_c, BLOCK_N=block_n, num_warps=num_warps)
    _bn_grad_apply[(cdiv(ns, block_n) if need_x else 1, cblocks)](
        df, xf, m, mean, invstd, part if weight is None else weight, part, gf, part if gw is None else gw,
        part if gb is None else gb, c, ns, cells, nsplit, sdb, sdc, sds, sxb, sxc, sxs, sgb, sgc, sgs, smb, sms,
        HAS_W=weight is not None, NEED_X=need_x, NEED_W=bool(need_weight), NEED_B=bool(need_bias), ALL_DY=all_dy,
        STAT=stat, SPLIT_BLOCK=SPLIT_BLOCK, BLOCK_C=block_c, BLOCK_N=block_n, num_warps=num_warps)
    return gw, gb
