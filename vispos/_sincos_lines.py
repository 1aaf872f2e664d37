"""The sine core's writers for padded grids: from line tables (boxes) and from few distinct positions.

Both write a channels-first output ``Tensor[B, n * F, *S]`` with the same float ops as
:func:`vispos._sincos.sincos_embed` on the full position tensors (hence the same numbers), at a
fraction of the sin/cos evaluations:

* :func:`sincos_embed_lines` writes a separable (rectangular-padded) grid from one line table:
  one op per axis block plus, on CPU with boxes known on the host, one slice copy per padded
  item and side (one select per block elsewhere);
* :func:`sincos_embed_indexed` writes a block whose cells take few distinct positions by a
  gather from their table (CPU: about half the cost of sin/cos per cell).

Like the rest of the core they validate nothing but ``out``; whether host facts may be used
reaches them as data (``host_spans`` given or not), decided once per call by the caller.

References:
    Vaswani et al., Attention Is All You Need, NeurIPS 2017 (section 3.5);
    Carion et al., End-to-End Object Detection with Transformers, ECCV 2020.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from . import _tracing
from ._sincos import Layout, _embed_axis, check_out, sincos_table

__all__ = ["sincos_embed_lines", "sincos_embed_indexed"]


def _axis_view(t: Tensor, axis: int, n: int) -> Tensor:
    """``Tensor[B, *C, S_i]`` viewed as ``[B, *C, 1, .., S_i, .., 1]`` (``S_i`` at spatial ``axis``
    of ``n``; ``C`` one or two channel dims)."""
    shape = list(t.shape[:-1]) + [1] * n
    shape[t.dim() - 1 + axis] = t.shape[-1]
    return t.view(shape)


def sincos_embed_lines(
    line_positions: Tensor,
    spatial: Sequence[int],
    divisors: Tensor,
    *,
    valid: Tensor | None = None,
    host_spans: tuple[Sequence[Sequence[int]], Sequence[Sequence[int]]] | None = None,
    window: tuple[int, int] | None = None,
    rows: Tensor | None = None,
    layout: Layout = "interleaved",
    dtype: torch.dtype = torch.float32,
    out: Tensor | None = None,
) -> Tensor:
    """Channels-first embedding of a separable padded grid: every axis from one line table.

    The fast path for rectangular padding (item ``b`` valid on a box ``[start_b, stop_b)``
    along every axis). Along axis ``i`` every line that crosses item ``b``'s box holds the same
    positions, and every line of padding only holds one value. ``line_positions[b, i]`` holds
    both: column 0 the padding-only line, column ``1 + c`` cell ``c``. One :func:`sincos_table`
    call embeds the lines of every axis (``B * n * (max S + 1)`` positions, not ``B * prod(S)``);
    then each axis block of the output is written once: a broadcast copy, plus either one select
    (``valid``) or, on CPU with boxes known on the host, the padding-only lines overwritten by
    slicing (faster there; one op per padded item, axis and side). Same float ops, hence the
    same numbers, as :func:`sincos_embed` on the full position tensors.

    Args:
        line_positions (Tensor[B or 1, n, M], float32): the line table, ``M > max S``.
        spatial (sequence of int): ``S``, the output's spatial shape (``n`` axes).
        divisors (Tensor[F // 2], float32): :func:`frequency_divisors`, shared by every axis.
        valid (Tensor[B, n, M'] bool, optional): ``valid[b, j, c]``: cell ``c`` of axis ``j``
            lies within item ``b``'s box (``M' >= max S``). Needed when an axis has padding,
            unless ``host_spans`` are given and the output is in host memory.
        host_spans (tuple, optional): ``(starts, stops)``, each item's box along every axis,
            known on the host and consistent with ``valid``. Axes without padding skip their
            select; on CPU the padding-only lines are written by slicing.
        window (tuple of int, optional), rows (Tensor[B - W], int64, optional): 1-D only.
            ``line_positions`` holds the ``W = stop - start`` items ``start .. stop - 1``,
            embedded straight into their rows of the output; every other item, in order, is a
            copy of window row ``rows[k]`` (items of one box share a row: it is embedded once
            and copied, with no table besides the output). Without a window every row is
            embedded straight into the output.
        layout (str): as in :func:`sincos_embed`.
        dtype (torch.dtype): output dtype; angles are float32, cast once.
        out (Tensor[B, n * F, *S], optional): where to write (e.g. a buffer a CUDA graph
            captured); must have ``dtype`` and ``line_positions``' device.

    Returns:
        Tensor[B, n * F, *S] in ``dtype`` (``out`` when given), axis blocks in axis order.

    Raises:
        ValueError: ``out`` of the wrong shape, dtype or device, or overlapping itself; padding
            with neither ``valid`` nor ``host_spans`` on the host.

    References:
        Carion et al., DETR (ECCV 2020): the cumulative-count positions are separable when the
        padding is rectangular.
    """
    n = len(spatial)
    f = 2 * divisors.shape[0]
    if rows is not None:
        batch = line_positions.shape[0] + rows.shape[0]
    else:
        batch = max(line_positions.shape[0], 1 if valid is None else valid.shape[0])
    device = line_positions.device
    shape = (batch, n * f, *spatial)
    if out is None:
        out = torch.empty(shape, dtype=dtype, device=device)
    else:
        check_out(out, shape, dtype, device)
    compiled = _tracing.compiling()
    if n == 1:  # every line is a whole row: no padding-only lines, no copy
        cells = line_positions[:, 0, 1 : 1 + spatial[0]]
        if window is None or rows is None:
            _embed_axis(out, 1, 0, f, layout, cells, divisors)
            return out
        start, stop = window
        inner = out.narrow(0, start, stop - start)
        _embed_axis(inner, 1, 0, f, layout, cells, divisors)
        for first, count, index in ((0, start, rows[:start]), (stop, batch - stop, rows[start:])):
            if count:  # the window's rows are read, rows outside it written: no overlap
                dst = out.narrow(0, first, count)
                if compiled:
                    dst.copy_(inner.index_select(0, index))
                else:
                    torch.index_select(inner, 0, index, out=dst)
        return out
    # sines then cosines ("split"): each computed over contiguous memory, half the time of the
    # strided halves of an interleaved table; the copies below read them in the output's order
    table = sincos_table(line_positions, divisors, layout="split")  # [B, n, F, M]
    on_host = host_spans is not None and _tracing.host_side(device)
    if table.dtype != dtype and not on_host:
        table = table.to(dtype)  # the select needs one dtype; copies cast as they write
    starts, stops = host_spans if host_spans is not None else (None, None)
    padded = [
        starts is None or any(a[j] > 0 or b[j] < spatial[j] for a, b in zip(starts, stops)) for j in range(n)
    ]
    half, units = f // 2, (1,) * n
    for i in range(n):
        # channels as (frequency, sin/cos) for "interleaved", (sin/cos, frequency) for "split"
        lines = table.select(1, i).unflatten(1, (2, half))
        block = out.narrow(1, i * f, f)
        if layout == "interleaved":
            lines, block = lines.transpose(1, 2), block.unflatten(1, (half, 2))
        else:
            block = block.unflatten(1, (2, half))
        inside = _axis_view(lines.narrow(-1, 1, spatial[i]), i, n)
        others = [j for j in range(n) if j != i and padded[j]]
        if not others:  # every line along axis i crosses the valid region
            block.copy_(inside.expand(block.shape))
            continue
        outside = lines.select(-1, 0).view(*lines.shape[:3], *units)  # [B, c, c', 1, .., 1]
        if on_host:
            # a broadcast copy, then the padding-only lines overwritten item by item (2.6x
            # faster than a three-way select on CPU)
            block.copy_(inside.expand(block.shape))
            _fill_padding_lines(block, outside, starts, stops, spatial, others)
            continue
        if valid is None:
            raise ValueError("an axis has padding: pass valid (or host_spans on the host)")
        cond = None
        for j in others:
            v = _axis_view(valid[:, j : j + 1, : spatial[j]], j, n).unsqueeze(1)
            cond = v if cond is None else cond & v
        inside = inside.expand(block.shape)  # cond may leave an unpadded axis at size 1
        if compiled:  # compilers take no ``out=`` views; they fuse where + copy into one kernel
            block.copy_(torch.where(cond, inside, outside))
        else:
            torch.where(cond, inside, outside, out=block)
    return out


def _fill_padding_lines(
    block: Tensor, outside: Tensor, starts: Sequence[Sequence[int]], stops: Sequence[Sequence[int]],
    spatial: Sequence[int], others: Sequence[int],
) -> None:
    """Overwrites, item by item, the lines of a host block ``[B, c, c', *S]`` outside each box
    along the axes ``others`` with the padding-only values ``outside`` ``[B or 1, c, c', 1, ..]``.
    Pure copies: through NumPy views of the same memory when both have one dtype that NumPy
    knows (a slice assignment there costs a few microseconds where a torch copy costs tens on
    such short lines), else with torch."""
    fills = [
        (b, j, lo, hi)
        for b, (begin, end) in enumerate(zip(starts, stops))
        for j in others
        for lo, hi in ((0, begin[j]), (end[j], spatial[j]))
        if hi > lo
    ]
    if not fills:
        return
    shared = outside.shape[0] == 1
    if block.dtype == outside.dtype and block.dtype in (torch.float32, torch.float64, torch.float16):
        dst, src = block.numpy(), outside.numpy()
        for b, j, lo, hi in fills:
            index = [slice(None)] * (dst.ndim - 1)
            index[2 + j] = slice(lo, hi)
            dst[b][tuple(index)] = src[0 if shared else b]
        return
    for b, j, lo, hi in fills:
        part = block[b].narrow(2 + j, lo, hi - lo)
        part.copy_(outside[0 if shared else b].expand(part.shape))


def sincos_embed_indexed(
    values: Tensor,
    index: Tensor,
    divisors: Tensor,
    out: Tensor,
    start: int,
    *,
    layout: Layout = "interleaved",
) -> None:
    """Writes one channels-first axis block from a table of distinct positions and an index.

    When the cells of a block take few distinct positions (DETR's counts take at most
    ``S_i + 1`` values per valid length), sin/cos are evaluated once per distinct value
    (``K * F``) and every cell gathers its ``F`` channels: a gather costs about half as much
    as evaluating sin and cos per cell on CPU. Same float ops, hence the same numbers.

    Args:
        values (Tensor[K], float32): the distinct positions.
        index (Tensor[B, *S], int64): for every cell, the index of its position in ``values``.
        divisors (Tensor[F // 2], float32): :func:`frequency_divisors`.
        out (Tensor[B, C, *S]): the output; channels ``start .. start + F`` are written.
        start (int): the block's first channel.
        layout (str): as in :func:`sincos_embed`.

    Raises:
        ValueError: ``index`` does not match ``out``'s batch and spatial shape.

    References:
        Vaswani et al. 2017 (sec. 3.5).
    """
    f = 2 * divisors.shape[0]
    if index.shape[0] != out.shape[0] or index.shape[1:] != out.shape[2:]:
        raise ValueError(f"index of shape {tuple(index.shape)} does not match out {tuple(out.shape)}")
    table = sincos_table(values.reshape(1, -1), divisors, layout=layout)
    table = table.to(out.dtype)  # [1, F, K]
    batch = out.shape[0]
    block = out.narrow(1, start, f).flatten(2)  # [B, F, N]: the spatial axes are contiguous
    src = table.expand(batch, f, table.shape[-1])
    idx = index.reshape(batch, 1, -1).expand(block.shape)
    if _tracing.compiling():
        block.copy_(torch.gather(src, 2, idx))
    else:
        torch.gather(src, 2, idx, out=block)
