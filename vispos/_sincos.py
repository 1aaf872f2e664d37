"""The N-D sinusoidal core: every sine encoding in vispos is computed here.

Pure functions, no ``nn.Module``. For one axis with ``F`` channels and temperature ``T`` the
``F / 2`` frequencies are ``w_k = 1 / T^(2k / F)`` (``k = 0 .. F/2 - 1``, the "standard" ladder of
Vaswani et al. and DETR) or ``w_j = exp(-ln(T) * j / (F/2 - 1))`` (the tensor2tensor / fairseq2
ladder). A position ``p`` becomes ``sin(p w_k)`` and ``cos(p w_k)`` (with the "continued" ladder
of speechain's ``posenc_type="sep"``, ``cos(p w_{F/2+k})``: the cosines take the standard ladder's
next ``F / 2`` rungs), laid out either

* ``"interleaved"``: ``sin w0, cos w0, sin w1, cos w1, ...`` (DETR, positional-encodings), or
* ``"split"``: ``sin w0 .. sin w_{F/2-1}, cos w0 .. cos w_{F/2-1}`` (tensor2tensor, timm, MAE,
  MONAI, fairseq2).

Several axes are concatenated along the channel dim in the order given (tensor axis order).

Angles are always computed in float32 (or float64 when asked), whatever the output dtype, then
cast once when written: half-precision positions are a known source of wrong embeddings.

Positions are passed per axis as tensors *broadcastable* to the output's non-channel shape. A
grid axis passed as ``arange`` shaped ``(1, .., S_i, .., 1)`` costs ``S_i * F`` sin/cos
evaluations, not ``prod(S) * F``: the table is broadcast into the output as it is written.

The fixed cost per call is counted in dispatched ops (each one at least a kernel launch on a
GPU; ``tests/test_op_counts.py`` pins them). The entry points used by the encoders keep it small:

* :func:`sincos_table` embeds any table of positions in four ops (allocate, angles into the
  sine slots, cosines from there, sines in place), so the lines of every axis go in one call;
* :func:`sincos_embed_lines` writes a separable (rectangular-padded) grid from one line table:
  one op per axis block plus, on CPU with sizes known on the host, one slice copy per padded
  item (one select per block on CUDA or when traced);
* :func:`sincos_embed_indexed` writes a block whose cells take few distinct positions by a
  gather from their table (CPU: about half the cost of sin/cos per cell).

They validate nothing: modules validate their parameters once, at construction, and
:func:`sincos_embed` validates for direct callers. Every branch that reads tensor values on the
host asks :func:`host_side`, so the device branch provably reads nothing back.

References:
    Vaswani et al., Attention Is All You Need, NeurIPS 2017 (section 3.5);
    Carion et al., End-to-End Object Detection with Transformers, ECCV 2020 (2D extension);
    tensor2tensor ``get_timing_signal_1d`` (split layout, log-spaced ladder); speechain
    ``PositionalEncoding`` (``posenc_type="sep"``: the continued ladder).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

from ._tracing import tracing

__all__ = [
    "frequency_divisors",
    "sincos_embed",
    "sincos_embed_lines",
    "sincos_embed_indexed",
    "sincos_table",
    "check_num_feats",
    "check_out",
    "host_side",
]

Layout = Literal["interleaved", "split"]
Ladder = Literal["standard", "t2t", "continued"]

_LAYOUTS = ("interleaved", "split")
_LADDERS = ("standard", "t2t", "continued")
_COMPUTE_DTYPES = (torch.float32, torch.float64)


def check_num_feats(num_feats: object, name: str = "num_pos_feats") -> int:
    """Validates a per-axis channel count: a positive even int. Returns it.

    Raises:
        TypeError: not an int. ValueError: not positive, or odd.
    """
    if isinstance(num_feats, bool) or not isinstance(num_feats, int):
        raise TypeError(f"{name} must be a positive even int, got {num_feats!r} ({type(num_feats).__name__})")
    if num_feats <= 0 or num_feats % 2:
        raise ValueError(
            f"{name} must be a positive even int (each frequency has a sin and a cos channel), "
            f"got {num_feats}"
        )
    return num_feats


def check_temperature(temperature: object, name: str = "temperature") -> float:
    """Validates a temperature: a finite number > 0. Returns it unchanged."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise TypeError(f"{name} must be a positive number, got {temperature!r} ({type(temperature).__name__})")
    if not math.isfinite(temperature) or temperature <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {temperature}")
    return temperature


def frequency_divisors(
    num_feats: int,
    temperature: float = 10000.0,
    *,
    ladder: Ladder = "standard",
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
    repeat: int = 1,
    inverse: bool = False,
) -> Tensor:
    """The ``F / 2`` divisors ``d_k = 1 / w_k`` of one axis' frequencies (``F`` for "continued").

    Args:
        num_feats (int): channels of the axis, ``F`` (positive, even).
        temperature (float): ``T``, the longest wavelength's scale.
        ladder (str): ``"standard"``: ``d_k = T^(2k/F)`` (Vaswani et al., DETR; computed exactly
            as DETR does, ``T ** (arange(0, F, 2) / F)`` in float32); ``"t2t"``:
            ``d_j = exp(ln(T) * j / (F/2 - 1))`` (tensor2tensor, fairseq2; ``F >= 4``);
            ``"continued"``: the standard ladder's ``F / 2`` divisors for the sines, then
            ``T * T^(2k/F) = T^((F + 2k)/F)`` for the cosines, ``F`` in all (speechain's
            ``posenc_type="sep"``, its ``div_term_ext``; the sine half is bit-identical to
            ``"standard"``).
        device: where to build the table.
        dtype (torch.dtype): float32 (default) or float64.
        repeat (int): evaluate the "standard" power on a table holding every exponent
            ``repeat`` times, then keep one of each. The values are the same up to float32
            rounding, and that rounding depends on the table's length (torch's pow kernel takes
            a vectorised path for long tables): DETR and transformers evaluate a table of length
            ``F`` (``repeat=2``), positional-encodings / timm / MONAI one of length ``F / 2``
            (``repeat=1``). Used to reproduce a peer to the last bit.
        inverse (bool): return the frequencies ``w_k`` (what peers that multiply use) instead,
            computed with those peers' own expressions: ``1 / T^(2k/F)`` (positional-encodings,
            timm, MONAI) and, for "t2t", fairseq2's ``exp(j * -ln(T) / (F/2 - 1))``, so a
            fairseq2 table is reproduced to the last bit.

    Returns:
        Tensor[F // 2] (Tensor[F] for "continued"): the divisors (or frequencies), in ``dtype``.

    References:
        Vaswani et al., Attention Is All You Need, NeurIPS 2017 (sec. 3.5) for the standard ladder;
        tensor2tensor ``get_timing_signal_1d`` / fairseq2 ``SinusoidalPositionEncoder`` for "t2t";
        speechain ``PositionalEncoding`` (``div_term_ext``) for "continued".

    Raises:
        ValueError: bad ``num_feats``, ``temperature``, ``ladder`` or ``dtype``.
    """
    check_num_feats(num_feats, "num_feats")
    check_temperature(temperature)
    if dtype not in _COMPUTE_DTYPES:
        raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
    if ladder in ("standard", "continued"):
        if repeat < 1:
            raise ValueError(f"repeat must be >= 1, got {repeat}")
        k2 = torch.arange(0, num_feats, 2, device=device, dtype=dtype)
        if repeat > 1:
            k2 = k2.repeat_interleave(repeat)
        divisors = temperature ** (k2 / num_feats)
        divisors = divisors[::repeat] if repeat > 1 else divisors
        if ladder == "continued":  # the cosines' rungs: T^((F + 2k) / F) = T * T^(2k / F)
            divisors = torch.cat([divisors, divisors * temperature])
        return 1.0 / divisors if inverse else divisors
    if ladder == "t2t":
        half = num_feats // 2
        if half < 2:
            raise ValueError(f"the 't2t' ladder needs num_feats >= 4, got {num_feats}")
        steps = torch.arange(half, device=device, dtype=dtype)
        if inverse:  # fairseq2's own expression (two roundings: the product, then the quotient)
            return torch.exp(steps * -math.log(temperature) / (half - 1))
        return torch.exp(steps * (math.log(temperature) / (half - 1)))
    raise ValueError(f"ladder must be one of {_LADDERS}, got {ladder!r}")


def host_side(device: torch.device) -> bool:
    """True where tensors live in host memory (CPU): reading them (sizes, a mask check) costs no
    synchronisation, and per-item slicing beats one select there. Every branch that reads
    tensor values on the host asks this one function (a test forces the device branch on CPU
    and checks that it reads nothing)."""
    return device.type == "cpu"


def _write(dst: Tensor, fn, angles: Tensor, traced: bool) -> None:
    """``dst[...] = fn(angles)``, broadcasting, casting once, without a temporary when possible."""
    if angles.shape == dst.shape and angles.dtype == dst.dtype and not angles.requires_grad and not traced:
        fn(angles, out=dst)
    else:
        dst.copy_(fn(angles))


def _block(out: Tensor, channel_dim: int, start: int, f: int, layout: str, part: str) -> Tensor:
    """The channels of ``out`` that receive the sines (or cosines) of one axis block."""
    half = f // 2
    if layout == "interleaved":
        first = start if part == "sin" else start + 1
        index = slice(first, start + f, 2)
        return out[:, index] if channel_dim == 1 else out[..., index]
    first = start if part == "sin" else start + half
    return out.narrow(channel_dim, first, half)


def _embed_axis(
    out: Tensor,
    channel_dim: int,
    start: int,
    f: int,
    layout: str,
    pos: Tensor,
    div: Tensor,
    reciprocal: bool = False,
    traced: bool | None = None,
) -> None:
    """Writes one axis block: ``sin``/``cos`` of ``pos / div`` (or ``pos * div``) into ``out``.

    ``pos`` has the output's non-channel rank and broadcasts to it; ``div`` holds the ``F / 2``
    divisors (``F`` with the "continued" ladder: the cosines' own in ``div[F/2:]``). When the
    angles have the block's full size they are computed in the sine slots of ``out`` itself, the
    cosines are taken from there, then the sines in place: no temporary of the output's size.
    """
    half = f // 2
    rank = pos.dim()
    if traced is None:
        traced = tracing()
    cos_div = div[half:] if div.shape[0] == f else None  # None: the cosines share the sines' angles
    div = div[:half]
    if channel_dim == 1:
        pos = pos.unsqueeze(1)
        div = div.view(half, *([1] * (rank - 1)))
        cos_div = None if cos_div is None else cos_div.view(div.shape)
        angle_shape = (*pos.shape[:1], half, *pos.shape[2:])
    else:
        pos = pos.unsqueeze(-1)
        angle_shape = (*pos.shape[:-1], half)
    sin_dst = _block(out, channel_dim, start, f, layout, "sin")
    in_place = angle_shape == tuple(sin_dst.shape) and out.dtype == pos.dtype and not pos.requires_grad
    # compilers refuse ``out=`` on strided views: they fuse the plain form into one kernel anyway
    if in_place and not traced:
        torch.mul(pos, div, out=sin_dst) if reciprocal else torch.div(pos, div, out=sin_dst)
        cos_dst = _block(out, channel_dim, start, f, layout, "cos")
        if cos_div is None:
            torch.cos(sin_dst, out=cos_dst)
        else:
            torch.mul(pos, cos_div, out=cos_dst) if reciprocal else torch.div(pos, cos_div, out=cos_dst)
            cos_dst.cos_()
        sin_dst.sin_()
    else:
        angles = pos * div if reciprocal else pos / div
        cos_angles = angles if cos_div is None else (pos * cos_div if reciprocal else pos / cos_div)
        # views are taken right before each write so autograd sees fresh views of ``out``
        _write(_block(out, channel_dim, start, f, layout, "sin"), torch.sin, angles, traced)
        _write(_block(out, channel_dim, start, f, layout, "cos"), torch.cos, cos_angles, traced)


def sincos_embed(
    positions: Sequence[Tensor],
    num_feats: int | Sequence[int],
    *,
    shape: Sequence[int] | None = None,
    temperature: float = 10000.0,
    layout: Layout = "interleaved",
    ladder: Ladder = "standard",
    reciprocal: bool = False,
    channel_dim: int = 1,
    dtype: torch.dtype = torch.float32,
    compute_dtype: torch.dtype = torch.float32,
    divisors: Sequence[Tensor] | None = None,
) -> Tensor:
    """Sinusoidal embedding of positions along several axes, concatenated along channels.

    Args:
        positions (sequence of Tensor): one tensor per axis, each broadcastable to ``shape``;
            values are positions in any unit (DETR: 1-based cell counts or normalised
            ``[0, 2*pi]``; others: 0-based indices). Any real dtype; converted to
            ``compute_dtype`` before use.
        num_feats (int or sequence of int): channels per axis ``F_i`` (positive, even), one int for
            every axis or one per axis.
        shape (sequence of int, optional): the output's non-channel shape, e.g. ``(B, *S)``.
            Default: the broadcast shape of ``positions``.
        temperature (float): ``T`` of the frequency ladder.
        layout (str): ``"interleaved"`` (DETR) or ``"split"`` (sines first), see the module doc.
        ladder (str): ``"standard"``, ``"t2t"`` or ``"continued"``, see :func:`frequency_divisors`.
        reciprocal (bool): compute angles as ``p * w_k`` rather than ``p / d_k``. The two
            round differently in float32; DETR, transformers and speechain divide,
            positional-encodings, timm, MONAI and fairseq2 multiply by a frequency table
            (:func:`frequency_divisors` with ``inverse=True``). Set it to reproduce the peer.
        channel_dim (int): ``1`` for channels-first output ``(B, C, *S)``, ``-1`` for
            channel-last ``(..., C)``.
        dtype (torch.dtype): the output dtype (any float dtype).
        compute_dtype (torch.dtype): float32 (default) or float64, the dtype of the angles.
        divisors (sequence of Tensor, optional): precomputed :func:`frequency_divisors`
            (``inverse=True`` when ``reciprocal``), one per axis, in ``compute_dtype`` on
            the positions' device; skips rebuilding them.

    Returns:
        Tensor: ``shape`` with ``sum(F_i)`` channels inserted at ``channel_dim``, in ``dtype``,
        on the positions' device. Axis blocks are in the order of ``positions``.

    Raises:
        ValueError: no positions; bad ``num_feats``, ``layout``, ``channel_dim``, dtypes; a
            position tensor not broadcastable to ``shape`` or with another rank.
        TypeError: a position is not a real-valued tensor.

    References:
        Vaswani et al. 2017 (sec. 3.5); Carion et al. 2020 (DETR, ``PositionEmbeddingSine``).
    """
    if len(positions) == 0:
        raise ValueError("positions must hold at least one tensor (one per axis)")
    for i, p in enumerate(positions):
        if not isinstance(p, Tensor):
            raise TypeError(f"positions[{i}] must be a Tensor, got {type(p).__name__}")
        if p.is_complex() or p.dtype == torch.bool:
            raise TypeError(f"positions[{i}] must be real-valued, got {p.dtype}")
    feats = [num_feats] * len(positions) if isinstance(num_feats, int) else list(num_feats)
    if len(feats) != len(positions):
        raise ValueError(f"num_feats has {len(feats)} entries but {len(positions)} position tensors were given")
    for f in feats:
        check_num_feats(f, "num_feats")
    if layout not in _LAYOUTS:
        raise ValueError(f"layout must be one of {_LAYOUTS}, got {layout!r}")
    if channel_dim not in (1, -1):
        raise ValueError(f"channel_dim must be 1 (channels-first) or -1 (channel-last), got {channel_dim}")
    if compute_dtype not in _COMPUTE_DTYPES:
        raise ValueError(f"compute_dtype must be torch.float32 or torch.float64, got {compute_dtype}")
    if not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating dtype, got {dtype}")

    rank = positions[0].dim()
    if any(p.dim() != rank for p in positions):
        raise ValueError(
            "positions must all have the same rank, got shapes "
            f"{[tuple(p.shape) for p in positions]}"
        )
    if shape is None:
        shape = torch.broadcast_shapes(*(p.shape for p in positions))
    # symbolic sizes (torch.compile / torch.export) stay symbolic: int() would specialise them
    shape = tuple(s if isinstance(s, torch.SymInt) else int(s) for s in shape)
    if len(shape) != rank:
        raise ValueError(f"shape {shape} must have the positions' rank {rank}")
    if channel_dim == 1 and rank < 1:
        raise ValueError("channels-first output needs positions with a leading batch dim")
    for i, p in enumerate(positions):
        if any(ps != 1 and ps != s for ps, s in zip(p.shape, shape)):
            raise ValueError(f"positions[{i}] of shape {tuple(p.shape)} does not broadcast to shape {shape}")

    device = positions[0].device
    traced = tracing()
    total = sum(feats)
    if channel_dim == 1:
        out = torch.empty((shape[0], total, *shape[1:]), dtype=dtype, device=device)
    else:
        out = torch.empty((*shape, total), dtype=dtype, device=device)

    start = 0
    for axis, (pos, f) in enumerate(zip(positions, feats)):
        if divisors is not None:
            div = divisors[axis]
        else:
            div = frequency_divisors(
                f, temperature, ladder=ladder, device=device, dtype=compute_dtype, inverse=reciprocal
            )
        _embed_axis(out, channel_dim, start, f, layout, pos.to(compute_dtype), div, reciprocal, traced)
        start += f
    return out


def sincos_table(
    positions: Tensor,
    divisors: Tensor,
    *,
    layout: Layout = "interleaved",
    reciprocal: bool = False,
    traced: bool | None = None,
) -> Tensor:
    """Sin/cos of a table of positions, channels before positions: ``(..., L) -> (..., F, L)``.

    Four ops whatever the table's size (allocate, the angles into the sine slots, the cosines
    from there, the sines in place), so one call can embed the lines of every axis at once.

    Args:
        positions (Tensor[..., L], float32 or float64): the positions, at least 1-D.
        divisors (Tensor[F // 2]): :func:`frequency_divisors` (or inverse frequencies when
            ``reciprocal``), in ``positions``' dtype and on its device.
        layout (str), reciprocal (bool): as in :func:`sincos_embed`.
        traced (bool, optional): the caller's :func:`vispos._cache.tracing` (asked when None).

    Returns:
        Tensor[..., F, L] in ``positions``' dtype.

    Raises:
        ValueError: ``positions`` is 0-d.

    References:
        Vaswani et al. 2017 (sec. 3.5).
    """
    if positions.dim() == 0:
        raise ValueError("positions must have at least one dim (the positions of a line)")
    f = 2 * divisors.shape[0]
    lead, length = tuple(positions.shape[:-1]), positions.shape[-1]
    table = torch.empty((*lead, f, length), dtype=positions.dtype, device=positions.device)
    flat = table.view(-1, f, length)
    _embed_axis(flat, 1, 0, f, layout, positions.reshape(-1, length), divisors, reciprocal, traced)
    return table


def _axis_view(t: Tensor, axis: int, n: int) -> Tensor:
    """``Tensor[B, F, S_i]`` viewed as ``[B, F, 1, .., S_i, .., 1]`` (``S_i`` at spatial ``axis``)."""
    shape = [t.shape[0], t.shape[1]] + [1] * n
    shape[2 + axis] = t.shape[2]
    return t.view(shape)


def sincos_embed_lines(
    line_positions: Tensor,
    spatial: Sequence[int],
    divisors: Tensor,
    *,
    valid: Tensor | None = None,
    host_sizes: Sequence[Sequence[int]] | None = None,
    window: tuple[int, int] | None = None,
    rows: Tensor | None = None,
    layout: Layout = "interleaved",
    dtype: torch.dtype = torch.float32,
    out: Tensor | None = None,
    traced: bool | None = None,
) -> Tensor:
    """Channels-first embedding of a separable padded grid: every axis from one line table.

    The fast path for rectangular padding (item ``b`` valid on ``[0, size_b)`` along every
    axis). Along axis ``i`` every line that crosses item ``b``'s valid region holds the same
    positions, and every line of padding only holds one value. ``line_positions[b, i]`` holds
    both: column 0 the padding-only line, column ``1 + c`` cell ``c``. One :func:`sincos_table`
    call embeds the lines of every axis (``B * n * (max S + 1)`` positions, not ``B * prod(S)``);
    then each axis block of the output is written once: a broadcast copy, plus either one select
    (``valid``) or, with sizes known on the host, the padding-only lines overwritten by slicing
    (faster on CPU, one op per padded item and axis). Same float ops, hence the same numbers, as
    :func:`sincos_embed` on the full position tensors.

    Args:
        line_positions (Tensor[B or 1, n, M], float32): the line table, ``M > max S``.
        spatial (sequence of int): ``S``, the output's spatial shape (``n`` axes).
        divisors (Tensor[F // 2], float32): :func:`frequency_divisors`, shared by every axis.
        valid (Tensor[B, n, M'] bool, optional): ``valid[b, j, c]``: cell ``c`` of axis ``j``
            lies within item ``b`` (``M' >= max S``). Needed when an axis has padding and
            ``host_sizes`` is not given (or on CUDA, where one select per axis is fewer
            launches than one copy per padded item).
        host_sizes (sequence of tuples, optional): each item's valid size along every axis,
            known on the host, consistent with ``valid``.
        window (tuple of int, optional), rows (Tensor[B - W], int64, optional): 1-D only.
            ``line_positions`` holds the ``W = stop - start`` items ``start .. stop - 1``,
            embedded straight into their rows of the output; every other item, in order, is a
            copy of window row ``rows[k]`` (items of one length share a row: it is embedded
            once and copied, with no table besides the output). Without a window every row is
            embedded straight into the output.
            Without it a 1-D line table is embedded straight into the output.
        layout (str): as in :func:`sincos_embed`.
        dtype (torch.dtype): output dtype; angles are float32, cast once.
        out (Tensor[B, n * F, *S], optional): where to write (e.g. a buffer a CUDA graph
            captured); must have ``dtype`` and ``line_positions``' device.
        traced (bool, optional): the caller's :func:`vispos._cache.tracing` (asked when None).

    Returns:
        Tensor[B, n * F, *S] in ``dtype`` (``out`` when given), axis blocks in axis order.

    Raises:
        ValueError: ``out`` of the wrong shape, dtype or device; padding with neither ``valid``
            nor ``host_sizes``.

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
    if traced is None:
        traced = tracing()
    if n == 1:  # every line is a whole row: no padding-only lines, no copy
        cells = line_positions[:, 0, 1 : 1 + spatial[0]]
        if window is None or rows is None:
            _embed_axis(out, 1, 0, f, layout, cells, divisors, traced=traced)
            return out
        start, stop = window
        inner = out.narrow(0, start, stop - start)
        _embed_axis(inner, 1, 0, f, layout, cells, divisors, traced=traced)
        for first, count, index in ((0, start, rows[:start]), (stop, batch - stop, rows[start:])):
            if count:  # the window's rows are read, rows outside it written: no overlap
                dst = out.narrow(0, first, count)
                if traced:
                    dst.copy_(inner.index_select(0, index))
                else:
                    torch.index_select(inner, 0, index, out=dst)
        return out
    table = sincos_table(line_positions, divisors, layout=layout, traced=traced)  # [B, n, F, M]
    on_host = host_sizes is not None and not traced and host_side(device)
    if table.dtype != dtype and not on_host:
        table = table.to(dtype)  # the select needs one dtype; copies cast as they write
    padded = [
        host_sizes is None or any(size[j] < spatial[j] for size in host_sizes) for j in range(n)
    ]
    for i in range(n):
        lines = table[:, i]
        inside = _axis_view(lines[:, :, 1 : 1 + spatial[i]], i, n)
        block = out.narrow(1, i * f, f)
        others = [j for j in range(n) if j != i and padded[j]]
        if not others:  # every line along axis i crosses the valid region
            block.copy_(inside.expand(block.shape))
            continue
        outside = lines[:, :, 0].reshape(lines.shape[0], f, *([1] * n))
        if on_host:
            # a broadcast copy, then the padding-only lines overwritten item by item (2.6x
            # faster than a three-way select on CPU)
            block.copy_(inside.expand(block.shape))
            for b, size in enumerate(host_sizes):
                src = outside[b if outside.shape[0] > 1 else 0]
                for j in others:
                    if size[j] < spatial[j]:
                        dst = block[b].narrow(1 + j, size[j], spatial[j] - size[j])
                        dst.copy_(src.expand(dst.shape))
            continue
        if valid is None:
            raise ValueError("an axis has padding: pass valid or host_sizes")
        cond = None
        for j in others:
            v = _axis_view(valid[:, j : j + 1, : spatial[j]], j, n)
            cond = v if cond is None else cond & v
        inside = inside.expand(block.shape)  # cond may leave an unpadded axis at size 1
        if traced:  # compilers take no ``out=`` views; they fuse where + copy into one kernel
            block.copy_(torch.where(cond, inside, outside))
        else:
            torch.where(cond, inside, outside, out=block)
    return out


def sincos_embed_indexed(
    values: Tensor,
    index: Tensor,
    divisors: Tensor,
    out: Tensor,
    start: int,
    *,
    layout: Layout = "interleaved",
    traced: bool | None = None,
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
        traced (bool, optional): the caller's :func:`vispos._cache.tracing` (asked when None).

    Raises:
        ValueError: ``index`` does not match ``out``'s batch and spatial shape.

    References:
        Vaswani et al. 2017 (sec. 3.5).
    """
    f = 2 * divisors.shape[0]
    if index.shape[0] != out.shape[0] or index.shape[1:] != out.shape[2:]:
        raise ValueError(f"index of shape {tuple(index.shape)} does not match out {tuple(out.shape)}")
    table = sincos_table(values.reshape(1, -1), divisors, layout=layout, traced=traced)
    table = table.to(out.dtype)  # [1, F, K]
    batch = out.shape[0]
    block = out.narrow(1, start, f).flatten(2)  # [B, F, N]: the spatial axes are contiguous
    src = table.expand(batch, f, table.shape[-1])
    idx = index.reshape(batch, 1, -1).expand(block.shape)
    if traced if traced is not None else tracing():
        block.copy_(torch.gather(src, 2, idx))
    else:
        torch.gather(src, 2, idx, out=block)


def check_out(out: object, shape: tuple, dtype: torch.dtype, device: torch.device) -> Tensor:
    """Validates a preallocated output buffer: a tensor of exactly this shape, dtype and device.

    Raises:
        TypeError: ``out`` is not a tensor.
        ValueError: another shape, dtype or device; or ``out`` needs grad.
    """
    if not isinstance(out, Tensor):
        raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
    if tuple(out.shape) != tuple(shape) or out.dtype != dtype or out.device != device:
        raise ValueError(
            f"out must have shape {tuple(shape)}, dtype {dtype} and device {device}, got shape "
            f"{tuple(out.shape)}, dtype {out.dtype}, device {out.device}"
        )
    if out.requires_grad:
        raise ValueError("out must not require grad (it is written in place)")
    return out
