"""The random Fourier projection: ``[sin(2 pi u G), cos(2 pi u G)]`` in float32, whatever the caller.

One pure function, :func:`fourier_features`, shared by :class:`~vispos.PositionEmbeddingRandom`,
:class:`~vispos.SamPositionalEmbedding` and :func:`~vispos.monai_fourier`, and the checks of the
Gaussian matrix's standard deviation (``scale`` / ``scales``).

The angles are a matrix product, and ``torch.autocast`` runs matrix products in bfloat16 /
float16: angles of ``|u G| ~ 10`` rounded to bfloat16 are off by ``~0.05`` rad, so a sine by as
much. The projection therefore runs with autocast disabled on the inputs' device, on every
path (eager, autograd, ``torch.compile``, ``torch.export``): autocast output equals the float32
result.

References:
    Tancik et al., Fourier Features Let Networks Learn High Frequency Functions in Low
    Dimensional Domains, NeurIPS 2020; Kirillov et al., Segment Anything, ICCV 2023
    (``PositionEmbeddingRandom._pe_encoding``); MONAI ``build_fourier_position_embedding``;
    PyTorch AMP docs (ops that autocast to lower precision: ``mm``, ``matmul``).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence

import torch
from torch import Tensor

from .. import _tracing
from .._checks import as_real, describe
from .._sincos import sincos_inplace

__all__ = ["check_scale", "check_finite_matrix", "fourier_features", "float32_angles"]

TWO_PI = 2 * math.pi  # SAM's ``2 * np.pi`` and MONAI's ``2.0 * torch.pi``: the same double
_FLOAT32_MAX = torch.finfo(torch.float32).max


def float32_angles(device: torch.device) -> contextlib.AbstractContextManager:
    """A context in which ``device``'s autocast is off (a no-op when it is off already).

    Args:
        device (torch.device): where the angles are computed.

    Returns:
        A context manager: ``torch.autocast(device.type, enabled=False)``, or a null context when
        autocast is not enabled for that device type (or the type has no autocast).

    Raises:
        Nothing.
    """
    try:
        enabled = torch.is_autocast_enabled(device.type)
    except (RuntimeError, TypeError):  # a device type without autocast (meta, ...)
        return contextlib.nullcontext()
    return torch.autocast(device.type, enabled=False) if enabled else contextlib.nullcontext()


def fourier_features(coords: Tensor, matrix: Tensor, *, scale_first: bool = False, out: Tensor | None = None) -> Tensor:
    """``[sin(2 pi coords @ matrix), cos(2 pi coords @ matrix)]``, sines first, in float32.

    Args:
        coords (Tensor[M, n], float32): the (mapped) coordinates, one row per point.
        matrix (Tensor[n, K], float32): the Gaussian projection, on ``coords``' device.
        scale_first (bool): multiply the coordinates by ``2 pi`` before the projection (MONAI's
            order) instead of the angles after it (SAM's); the two round differently.
        out (Tensor[M, 2K], float32, optional): where to write; its rows may be strided (a view
            of a wider buffer). The angles go into its sine half by ``torch.mm(..., out=)``.

    Returns:
        Tensor[M, 2K], float32: ``out`` when given. Differentiable with respect to ``coords``
        and ``matrix`` when either requires grad (then computed out of place). Under
        ``torch.autocast`` the same values as without it (the product runs in float32).

    Raises:
        Nothing beyond torch's own errors (an internal step; callers validate).

    References:
        Tancik et al., NeurIPS 2020; SAM ``PositionEmbeddingRandom._pe_encoding``; MONAI
        ``build_fourier_position_embedding``.
    """
    k = matrix.shape[1]
    grad = torch.is_grad_enabled() and (coords.requires_grad or matrix.requires_grad)
    with float32_angles(coords.device):
        if grad or _tracing.compiling():  # no ``out=`` under autograd; compilers fuse the plain form
            angles = (coords * TWO_PI) @ matrix if scale_first else (coords @ matrix) * TWO_PI
            table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)
            return table if out is None else out.copy_(table)
        if out is None:
            out = torch.empty((coords.shape[0], 2 * k), dtype=torch.float32, device=coords.device)
        angles = out.narrow(1, 0, k)
        if scale_first:
            torch.mm(coords * TWO_PI, matrix, out=angles)
        else:
            torch.mm(coords, matrix, out=angles)
            angles.mul_(TWO_PI)
        sincos_inplace(angles, out.narrow(1, k, k))
        return out


def _check_std(value: object, name: str) -> float:
    """One standard deviation: a finite number > 0 that float32 holds (as a Python float)."""
    converted = as_real(value, name)  # a NumPy longdouble that would round raises here, as it says
    if converted is None:
        raise TypeError(f"{name} must be a finite number > 0, got {describe(value)}")
    if not (math.isfinite(converted) and converted > 0):
        if name != "scale" and math.isfinite(converted):
            raise ValueError(f"{name} must be > 0, got {converted}")
        hint = " (SAM replaces a scale <= 0 by 1.0 silently; pass None for that)" if name == "scale" else ""
        raise ValueError(f"{name} must be a finite number > 0, got {converted}{hint}")
    if converted > _FLOAT32_MAX:
        raise ValueError(
            f"{name} must be at most {_FLOAT32_MAX:.6g} (the largest float32; the Gaussian matrix is "
            f"float32), got {converted:g}"
        )
    return float(converted)


def check_scale(scale: object, num_axes: int, name: str = "scale") -> float | tuple[float, ...]:
    """A standard deviation of the Gaussian matrix: one number, or one per axis.

    Args:
        scale (number or sequence of num_axes numbers, optional): None means 1.0 (SAM).
        num_axes (int): the number of axes (rows of the matrix).
        name (str): the parameter's name, for messages.

    Returns:
        float or tuple of float: Python floats, exactly the values given.

    Raises:
        TypeError: not a number or a sequence of numbers.
        ValueError: a sequence of another length; a value not finite, not > 0, beyond float32's
            range, or a NumPy ``longdouble`` that a Python float cannot hold (the message says so).
    """
    if scale is None:
        return 1.0
    if isinstance(scale, Sequence) and not isinstance(scale, (str, bytes)):
        values = list(scale)
        if len(values) != num_axes:
            raise ValueError(f"{name} must be a number or {num_axes} numbers (one per axis), got {describe(scale)}")
        return tuple(_check_std(v, name) for v in values)
    return _check_std(scale, name)


def check_finite_matrix(matrix: Tensor, scale: object, name: str = "scale") -> Tensor:
    """The drawn Gaussian matrix ``(n, K)``, refused when a large ``scale`` makes it, or the
    angles ``2 pi u G`` of points ``|u_i| <= 1``, overflow float32.

    Args:
        matrix (Tensor[n, K], float32): the draw, already scaled.
        scale: the value given, for the message. name (str): its parameter's name.

    Returns:
        Tensor[n, K]: ``matrix`` itself.

    Raises:
        ValueError: an entry or such an angle is not finite (the output would be NaN); not
            checked while compiling or exporting (no host read there).
    """
    if _tracing.tracing():  # a host read: not while compiling or exporting (the scale was checked)
        return matrix
    largest = matrix.abs().sum(0) * TWO_PI  # the largest angle of a point in [-1, 1]^n
    if not bool(torch.isfinite(largest).all()):
        raise ValueError(
            f"{name}={scale} overflows float32: the Gaussian matrix or its angles 2 pi u G would "
            "hold inf, and the output NaN; use a smaller scale"
        )
    return matrix
