"""The N-D sinusoidal core: every sine encoding in vispos is computed here.

Pure functions, no ``nn.Module``. For one axis with ``F`` channels and temperature ``T`` the
``F / 2`` frequencies are ``w_k = 1 / T^(2k / F)`` (``k = 0 .. F/2 - 1``, the "standard" ladder of
Vaswani et al. and DETR) or ``w_j = exp(-ln(T) * j / (F/2 - 1))`` (the tensor2tensor / fairseq2
ladder). A position ``p`` becomes ``sin(p w_k)`` and ``cos(p w_k)``, laid out either

* ``"interleaved"``: ``sin w0, cos w0, sin w1, cos w1, ...`` (DETR, positional-encodings), or
* ``"split"``: ``sin w0 .. sin w_{F/2-1}, cos w0 .. cos w_{F/2-1}`` (tensor2tensor, timm, MAE,
  MONAI, fairseq2).

Several axes are concatenated along the channel dim in the order given (tensor axis order).

Angles are always computed in float32 (or float64 when asked), whatever the output dtype, then
cast once when written: half-precision positions are a known source of wrong embeddings.

Positions are passed per axis as tensors *broadcastable* to the output's non-channel shape. A
grid axis passed as ``arange`` shaped ``(1, .., S_i, .., 1)`` costs ``S_i * F`` sin/cos
evaluations, not ``prod(S) * F``: the table is broadcast into the output as it is written.

References:
    Vaswani et al., Attention Is All You Need, NeurIPS 2017 (section 3.5);
    Carion et al., End-to-End Object Detection with Transformers, ECCV 2020 (2D extension);
    tensor2tensor ``get_timing_signal_1d`` (split layout, log-spaced ladder).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

from ._tracing import tracing

__all__ = ["frequency_divisors", "sincos_embed", "sincos_embed_lines", "check_num_feats"]

Layout = Literal["interleaved", "split"]
Ladder = Literal["standard", "t2t"]

_LAYOUTS = ("interleaved", "split")
_LADDERS = ("standard", "t2t")
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
) -> Tensor:
    """The ``F / 2`` divisors ``d_k = 1 / w_k`` of one axis' frequencies.

    Args:
        num_feats (int): channels of the axis, ``F`` (positive, even).
        temperature (float): ``T``, the longest wavelength's scale.
        ladder (str): ``"standard"``: ``d_k = T^(2k/F)`` (Vaswani et al., DETR; computed exactly
            as DETR does, ``T ** (arange(0, F, 2) / F)`` in float32); ``"t2t"``:
            ``d_j = exp(ln(T) * j / (F/2 - 1))`` (tensor2tensor, fairseq2; ``F >= 4``).
        device: where to build the table.
        dtype (torch.dtype): float32 (default) or float64.
        repeat (int): evaluate the "standard" power on a table holding every exponent
            ``repeat`` times, then keep one of each. The values are the same up to float32
            rounding, and that rounding depends on the table's length (torch's pow kernel takes
            a vectorised path for long tables): DETR and transformers evaluate a table of length
            ``F`` (``repeat=2``), positional-encodings / timm / MONAI one of length ``F / 2``
            (``repeat=1``). Used to reproduce a peer to the last bit.

    Returns:
        Tensor[F // 2]: the divisors, in ``dtype``.

    References:
        Vaswani et al., Attention Is All You Need, NeurIPS 2017 (sec. 3.5) for the standard ladder;
        tensor2tensor ``get_timing_signal_1d`` / fairseq2 ``SinusoidalPositionEncoder`` for "t2t".

    Raises:
        ValueError: bad ``num_feats``, ``temperature``, ``ladder`` or ``dtype``.
    """
    check_num_feats(num_feats, "num_feats")
    check_temperature(temperature)
    if dtype not in _COMPUTE_DTYPES:
        raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
    if ladder == "standard":
        if repeat < 1:
            raise ValueError(f"repeat must be >= 1, got {repeat}")
        k2 = torch.arange(0, num_feats, 2, device=device, dtype=dtype)
        if repeat > 1:
            k2 = k2.repeat_interleave(repeat)
        divisors = temperature ** (k2 / num_feats)
        return divisors[::repeat] if repeat > 1 else divisors
    if ladder == "t2t":
        half = num_feats // 2
        if half < 2:
            raise ValueError(f"the 't2t' ladder needs num_feats >= 4, got {num_feats}")
        steps = torch.arange(half, device=device, dtype=dtype)
        return torch.exp(steps * (math.log(temperature) / (half - 1)))
    raise ValueError(f"ladder must be one of {_LADDERS}, got {ladder!r}")


def _write(dst: Tensor, fn, angles: Tensor) -> None:
    """``dst[...] = fn(angles)``, broadcasting, casting once, without a temporary when possible."""
    if angles.shape == dst.shape and angles.dtype == dst.dtype and not angles.requires_grad and not tracing():
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
) -> None:
    """Writes one axis block: ``sin``/``cos`` of ``pos / div`` (or ``pos * div``) into ``out``.

    ``pos`` has the output's non-channel rank and broadcasts to it; ``div`` holds the ``F / 2``
    divisors. When the angles have the block's full size they are computed in the sine slots
    of ``out`` itself, the cosines are taken from there, then the sines in place: no temporary
    of the output's size.
    """
    half = f // 2
    rank = pos.dim()
    if channel_dim == 1:
        pos = pos.unsqueeze(1)
        div = div.view(half, *([1] * (rank - 1)))
    else:
        pos = pos.unsqueeze(-1)
    sin_dst = _block(out, channel_dim, start, f, layout, "sin")
    angle_shape = torch.broadcast_shapes(pos.shape, div.shape)
    in_place = angle_shape == sin_dst.shape and out.dtype == pos.dtype and not pos.requires_grad
    # compilers refuse ``out=`` on strided views: they fuse the plain form into one kernel anyway
    if in_place and not tracing():
        torch.mul(pos, div, out=sin_dst) if reciprocal else torch.div(pos, div, out=sin_dst)
        torch.cos(sin_dst, out=_block(out, channel_dim, start, f, layout, "cos"))
        sin_dst.sin_()
    else:
        angles = pos * div if reciprocal else pos / div
        # views are taken right before each write so autograd sees fresh views of ``out``
        _write(_block(out, channel_dim, start, f, layout, "sin"), torch.sin, angles)
        _write(_block(out, channel_dim, start, f, layout, "cos"), torch.cos, angles)


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
        ladder (str): ``"standard"`` or ``"t2t"``, see :func:`frequency_divisors`.
        reciprocal (bool): compute angles as ``p * (1 / d_k)`` rather than ``p / d_k``. The two
            round differently in float32; DETR and transformers divide, positional-encodings,
            timm and MONAI multiply by an inverse-frequency table. Set it to reproduce the peer.
        channel_dim (int): ``1`` for channels-first output ``(B, C, *S)``, ``-1`` for
            channel-last ``(..., C)``.
        dtype (torch.dtype): the output dtype (any float dtype).
        compute_dtype (torch.dtype): float32 (default) or float64, the dtype of the angles.
        divisors (sequence of Tensor, optional): precomputed :func:`frequency_divisors`
            (or inverse frequencies when ``reciprocal``), one per axis, in ``compute_dtype`` on
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
            div = frequency_divisors(f, temperature, ladder=ladder, device=device, dtype=compute_dtype)
            if reciprocal:
                div = 1.0 / div
        _embed_axis(out, channel_dim, start, f, layout, pos.to(compute_dtype), div, reciprocal)
        start += f
    return out


def sincos_embed_lines(
    line_positions: Sequence[Tensor],
    line_valid: Sequence[Tensor | None],
    pad_positions: Sequence[Tensor | float],
    num_feats: int | Sequence[int],
    *,
    temperature: float = 10000.0,
    layout: Layout = "interleaved",
    dtype: torch.dtype = torch.float32,
    divisors: Sequence[Tensor] | None = None,
    out: Tensor | None = None,
    host_sizes: Sequence[Sequence[int]] | None = None,
) -> Tensor:
    """Channels-first embedding of a separable padded grid, written to the output once.

    The fast path for rectangular padding: along axis ``i`` every line that crosses an item's
    valid region holds the same positions (``line_positions[i][b]``), and every line outside it
    (a line of padding only) holds one value (``pad_positions[i]``). So sin/cos are evaluated on
    tables of ``B * S_i`` positions, and each output cell is written once by selecting between
    the broadcast table and the padding vector. Same float32 operations, hence the same
    numbers, as :func:`sincos_embed` on the full position tensors.

    Args:
        line_positions (sequence of Tensor[B or 1, S_i]): positions along each axis.
        line_valid (sequence of Tensor or None): for axis ``i``, a bool tensor broadcastable to
            ``(B, 1, *S)`` with size 1 on channels and on axis ``i``: True where the line crosses
            the valid region. ``None``: every line does.
        pad_positions (sequence of float or 0-d Tensor): the position of padding-only lines.
        num_feats (int or sequence of int): channels per axis (positive, even).
        temperature (float), layout (str): as in :func:`sincos_embed`.
        dtype (torch.dtype): output dtype; angles are float32.
        divisors (sequence of Tensor, optional): float32 :func:`frequency_divisors` per axis.
        out (Tensor[B, sum F_i, *S], optional): where to write.
        host_sizes (sequence of tuples, optional): each item's valid size along every axis, known
            on the host, with ``line_valid[i]`` equal to "every other axis below its size". Lets
            the padding lines be written by slicing instead of a three-way select.

    Returns:
        Tensor[B, sum F_i, *S] in ``dtype``, axis blocks in the given order.

    Raises:
        ValueError: inconsistent lengths or shapes.

    References:
        Carion et al., DETR (ECCV 2020): the cumulative-count positions are separable when the
        padding is rectangular.
    """
    n = len(line_positions)
    if not (len(line_valid) == len(pad_positions) == n):
        raise ValueError("line_positions, line_valid and pad_positions need one entry per axis")
    feats = [num_feats] * n if isinstance(num_feats, int) else list(num_feats)
    if len(feats) != n:
        raise ValueError(f"num_feats has {len(feats)} entries for {n} axes")
    for f in feats:
        check_num_feats(f, "num_feats")
    if layout not in _LAYOUTS:
        raise ValueError(f"layout must be one of {_LAYOUTS}, got {layout!r}")
    device = line_positions[0].device
    batch = max(p.shape[0] for p in line_positions)
    spatial = [p.shape[1] for p in line_positions]
    total = sum(feats)
    if out is None:
        out = torch.empty((batch, total, *spatial), dtype=dtype, device=device)
    start = 0
    for axis, (pos, valid, pad, f) in enumerate(zip(line_positions, line_valid, pad_positions, feats)):
        div = divisors[axis] if divisors is not None else frequency_divisors(f, temperature, device=device)
        view = [pos.shape[0]] + [1] * n
        view[1 + axis] = spatial[axis]
        pos = pos.float()
        if valid is None:  # every line crosses the valid region: a broadcast write
            _embed_axis(out, 1, start, f, layout, pos.view(view), div)
            start += f
            continue
        # the table's last column is the padding-only line
        pad_t = torch.as_tensor(pad, dtype=torch.float32, device=device).reshape(1, 1)
        pos = torch.cat([pos, pad_t.expand(pos.shape[0], 1)], dim=1)
        table = torch.empty(pos.shape[0], f, pos.shape[1], dtype=torch.float32, device=device)
        _embed_axis(table, 1, 0, f, layout, pos, div)
        table = table.to(dtype)
        inside = table[:, :, : spatial[axis]].reshape(view[:1] + [f] + view[1:])
        outside = table[:, :, -1].reshape(table.shape[0], f, *([1] * n))  # -1, not S: no guard
        block = out.narrow(1, start, f)
        if tracing():  # compilers take no ``out=`` views; they fuse where + copy into one kernel
            block.copy_(torch.where(valid, inside, outside))
        elif host_sizes is not None:
            # sizes known on the host: a broadcast copy, then the padding-only lines overwritten
            # item by item (2.6x faster than a three-way ``where`` on CPU)
            block.copy_(inside.expand(block.shape))
            for b, size in enumerate(host_sizes):
                src = outside[b if outside.shape[0] > 1 else 0]
                for j, (s_j, full) in enumerate(zip(size, spatial)):
                    if j != axis and s_j < full:
                        dst = block[b].narrow(1 + j, s_j, full - s_j)
                        dst.copy_(src.expand(dst.shape))
        else:
            torch.where(valid, inside, outside, out=block)
        start += f
    return out
