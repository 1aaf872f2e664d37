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
* :mod:`vispos._sincos_lines` builds on it the writers of padded grids (from line tables, and
  from a few distinct positions).

They validate nothing: modules validate their parameters once, at construction, and
:func:`sincos_embed` validates for direct callers. Whether host facts may be used is decided by
the caller, once per call (:mod:`vispos._tracing`), and reaches the core as data: boxes given on
the host or not. The only thing the core asks itself is :func:`vispos._tracing.compiling`
(TorchDynamo refuses ``out=`` into strided views, so those blocks are written with a copy).

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

from . import _tracing
from ._checks import check_bool, check_choice, check_float_dtype, check_int, check_multiple, check_number, describe, is_int

__all__ = [
    "frequency_divisors",
    "sincos_embed",
    "sincos_table",
    "check_num_feats",
    "check_out",
    "sincos_inplace",
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
    try:
        return check_multiple(num_feats, 2, name)
    except TypeError:
        raise TypeError(f"{name} must be a positive even int, got {describe(num_feats)}") from None
    except ValueError:
        raise ValueError(
            f"{name} must be a positive even int (each frequency has a sin and a cos channel), "
            f"got {num_feats}"
        ) from None


def check_temperature(temperature: object, name: str = "temperature") -> float:
    """Validates a temperature: a finite number > 0. Returns it as a Python number (a NumPy or
    0-d tensor scalar is converted exactly, see :mod:`vispos._checks`).

    Raises:
        TypeError: not a real number. ValueError: not finite, or not > 0.
    """
    try:
        temperature = check_number(temperature, name, finite=False)
    except TypeError:
        raise TypeError(f"{name} must be a positive number, got {describe(temperature)}") from None
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
        TypeError: ``num_feats`` / ``repeat`` not ints; ``temperature`` not a number; ``ladder``
            not a str; ``dtype`` not a ``torch.dtype``.
        ValueError: bad ``num_feats``, ``temperature``, ``ladder``, ``dtype`` or ``repeat``.
    """
    num_feats = check_num_feats(num_feats, "num_feats")
    temperature = check_temperature(temperature)
    dtype = check_choice(dtype, _COMPUTE_DTYPES, "dtype")
    ladder = check_choice(ladder, _LADDERS, "ladder")
    repeat = check_int(repeat, "repeat", minimum=1)
    inverse = check_bool(inverse, "inverse")
    if ladder in ("standard", "continued"):
        k2 = torch.arange(0, num_feats, 2, device=device, dtype=dtype)
        if repeat > 1:
            k2 = k2.repeat_interleave(repeat)
        divisors = temperature ** (k2 / num_feats)
        divisors = divisors[::repeat] if repeat > 1 else divisors
        if ladder == "continued":  # the cosines' rungs: T^((F + 2k) / F) = T * T^(2k / F)
            divisors = torch.cat([divisors, divisors * temperature])
        return 1.0 / divisors if inverse else divisors
    half = num_feats // 2
    if half < 2:
        raise ValueError(f"the 't2t' ladder needs num_feats >= 4, got {num_feats}")
    steps = torch.arange(half, device=device, dtype=dtype)
    if inverse:  # fairseq2's own expression (two roundings: the product, then the quotient)
        return torch.exp(steps * -math.log(temperature) / (half - 1))
    return torch.exp(steps * (math.log(temperature) / (half - 1)))


def _write(dst: Tensor, fn, angles: Tensor) -> None:
    """``dst[...] = fn(angles)``, broadcasting, casting once, without a temporary when possible."""
    if angles.shape == dst.shape and angles.dtype == dst.dtype and not angles.requires_grad and not _tracing.compiling():
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
    divisors (``F`` with the "continued" ladder: the cosines' own in ``div[F/2:]``). When the
    angles have the block's full size they are computed in the sine slots of ``out`` itself, the
    cosines are taken from there, then the sines in place: no temporary of the output's size.
    """
    half = f // 2
    rank = pos.dim()
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
    if in_place and not _tracing.compiling():
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
        _write(_block(out, channel_dim, start, f, layout, "sin"), torch.sin, angles)
        _write(_block(out, channel_dim, start, f, layout, "cos"), torch.cos, cos_angles)


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
        ValueError: no positions; bad ``num_feats``, ``layout``, ``channel_dim``,
            ``compute_dtype``; a position tensor not broadcastable to ``shape`` or with another
            rank.
        TypeError: a position is not a real-valued tensor; ``dtype`` is not a floating
            ``torch.dtype``; ``layout`` / ``channel_dim`` / ``compute_dtype`` of another type.

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
    feats = [num_feats] * len(positions) if is_int(num_feats) else list(num_feats)
    if len(feats) != len(positions):
        raise ValueError(f"num_feats has {len(feats)} entries but {len(positions)} position tensors were given")
    feats = [check_num_feats(f, "num_feats") for f in feats]
    layout = check_choice(layout, _LAYOUTS, "layout")
    channel_dim = check_choice(channel_dim, (1, -1), "channel_dim")
    compute_dtype = check_choice(compute_dtype, _COMPUTE_DTYPES, "compute_dtype")
    check_float_dtype(dtype)

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
            div = frequency_divisors(
                f, temperature, ladder=ladder, device=device, dtype=compute_dtype, inverse=reciprocal
            )
        _embed_axis(out, channel_dim, start, f, layout, pos.to(compute_dtype), div, reciprocal)
        start += f
    return out


def sincos_table(
    positions: Tensor,
    divisors: Tensor,
    *,
    layout: Layout = "interleaved",
    reciprocal: bool = False,
) -> Tensor:
    """Sin/cos of a table of positions, channels before positions: ``(..., L) -> (..., F, L)``.

    Four ops whatever the table's size (allocate, the angles into the sine slots, the cosines
    from there, the sines in place), so one call can embed the lines of every axis at once.

    Args:
        positions (Tensor[..., L], float32 or float64): the positions, at least 1-D.
        divisors (Tensor[F // 2]): :func:`frequency_divisors` (or inverse frequencies when
            ``reciprocal``), in ``positions``' dtype and on its device.
        layout (str), reciprocal (bool): as in :func:`sincos_embed`.

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
    _embed_axis(flat, 1, 0, f, layout, positions.reshape(-1, length), divisors, reciprocal)
    return table


def sincos_inplace(angles: Tensor, cos_out: Tensor) -> None:
    """The last step of a sin / cos table, with no temporary: the angles already sit in the
    sine slots (``angles``, any strided view); their cosines are written into ``cos_out``, then
    the angles are replaced by their sines in place (as :func:`sincos_table` does). For angles
    that are not ``position x frequency`` products (RoPE-Mixed's learned mixtures).

    Args:
        angles (Tensor): angles in radians, float32 or float64; overwritten by their sines.
        cos_out (Tensor): same shape, dtype and device; receives the cosines. Must not overlap
            ``angles``.

    Raises:
        Nothing beyond torch's own errors (an internal step; callers allocate both views).

    References:
        Vaswani et al. 2017 (sec. 3.5).
    """
    if _tracing.compiling():  # compilers take no ``out=`` views; they fuse the plain form anyway
        cos_out.copy_(torch.cos(angles))
    else:
        torch.cos(angles, out=cos_out)
    angles.sin_()


def check_out(out: object, shape: tuple, dtype: torch.dtype, device: torch.device) -> Tensor:
    """Validates a preallocated output buffer: a tensor of exactly this shape, dtype and device,
    whose elements are distinct memory locations (so it can be written in place).

    Raises:
        TypeError: ``out`` is not a tensor.
        ValueError: another shape, dtype or device; ``out`` needs grad; ``out`` is an expanded
            (stride-0) view, several of whose elements share one memory location.
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
    if any(stride == 0 and size > 1 for size, stride in zip(out.shape, out.stride())):
        raise ValueError(
            f"out must not overlap itself, got strides {tuple(out.stride())} for shape "
            f"{tuple(out.shape)}: an expanded (stride-0) view has elements that share one memory "
            "location; allocate it with torch.empty(shape) (or .contiguous() it)"
        )
    return out
