"""What the masked norm ops share at their boundary: the checks of their arguments (shapes, dtypes,
devices and strides, as torch's own norms check them), the scalars their kernels read, and the
small pieces of their autograd glue.

Nothing here imports Triton.

References:
    torch's ``native_batch_norm`` / ``native_group_norm`` argument checks.
"""

from __future__ import annotations

import threading
from typing import Any
from collections import OrderedDict

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from . import _triton
from ._norm_reference import stat_dtype
from ._sizes import out_like

__all__ = ["check_norm", "check_input", "check_mask", "check_vector", "check_running", "scalars", "needs_grad", "triton_path",
           "grads", "param_grads", "triton_backward", "call", "plain", "bump_versions", "norm_backward"]

call = _triton.eager_call  # the ops' calls: see vispos.ops._triton.eager_call
plain = _triton.plain_eager  # whether an op may run as its own implementation: see there


def check_input(x: Tensor, op: str) -> None:
    """Raises ``TypeError`` for an ``x`` that is not a floating tensor, ``ValueError`` for one with
    fewer than 3 axes (``Tensor[B, C, *S]``)."""
    if not isinstance(x, Tensor) or not x.is_floating_point():
        kind = x.dtype if isinstance(x, Tensor) else type(x).__name__
        raise TypeError(f"{op}: x must be a floating tensor Tensor[B, C, *S], got {kind}")
    if x.dim() < 3:
        raise ValueError(f"{op}: x must be Tensor[B, C, *S] with at least one spatial axis, got shape {tuple(x.shape)}")


def check_mask(x: Tensor, mask: Tensor, op: str) -> None:
    """Raises ``TypeError`` for a padding mask that is not a bool tensor (``~mask`` of an integer mask
    is not its complement), ``ValueError`` for one whose shape is not ``(B, 1, *S)`` of ``x`` or that
    lives on another device."""
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        kind = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
        raise TypeError(f"the padding mask must be bool (True = padding), got {kind}: pass mask.bool() "
                        "for a 0/1 mask with 1 = padding, or mask == 0 for one with 1 = valid")
    want = (x.shape[0], 1, *x.shape[2:])
    if tuple(mask.shape) != want:
        raise ValueError(f"{op}: mask must have shape (B, 1, *S) = {want} for x of shape {tuple(x.shape)}, got "
                         f"{tuple(mask.shape)}")
    if mask.device != x.device:
        raise ValueError(f"{op}: mask is on {mask.device}, x on {x.device}: both must be on one device")


def check_vector(t: Tensor | None, name: str, x: Tensor, op: str) -> Tensor | None:
    """``t`` (Tensor[C] on ``x``'s device, or None) contiguous: a strided or expanded weight or bias
    is copied (its C values), as the kernels read ``t[c]`` at ``c``.

    Raises:
        ValueError: ``t``'s shape is not ``(C,)`` or its device not ``x``'s.
    """
    if t is None:
        return None
    if tuple(t.shape) != (x.shape[1],):
        raise ValueError(f"{op}: {name} must have shape (C,) = ({x.shape[1]},) for x of shape {tuple(x.shape)}, "
                         f"got {tuple(t.shape)}")
    if t.device != x.device:
        raise ValueError(f"{op}: {name} is on {t.device}, x on {x.device}: both must be on one device")
    return t if t.is_contiguous() else t.contiguous()


def check_running(t: Tensor | None, name: str, x: Tensor) -> None:
    """Raises ``ValueError`` for a running statistic (written in place, through its stride) whose
    shape is not ``(C,)``, that lives on another device, or whose channels share memory (an
    expanded tensor: stride 0)."""
    if t is None:
        return
    c = x.shape[1]
    if tuple(t.shape) != (c,):
        raise ValueError(f"batch norm: {name} must have shape (C,) = ({c},), got {tuple(t.shape)}")
    if t.device != x.device:
        raise ValueError(f"batch norm: {name} is on {t.device}, x on {x.device}: both must be on one device")
    if c > 1 and t.stride(0) == 0:
        raise ValueError(f"batch norm: {name} is written in place, but its {c} channels share one element "
                         "(an expanded tensor, stride 0): pass a tensor of its own, e.g. "
                         f"{name}.clone()")


def check_norm(op: str, x: Tensor, mask: Tensor, weight: Tensor | None, bias: Tensor | None,
               running_mean: Tensor | None = None, running_var: Tensor | None = None
               ) -> tuple[Tensor | None, Tensor | None]:
    """Every argument check of a masked norm at once: :func:`check_input`, :func:`check_mask`,
    :func:`check_vector` of ``weight`` and ``bias`` and :func:`check_running` of the running
    statistics, with their messages. One pass over the sizes and devices when every argument is
    as expected (the common case: the detailed checks run only to word a refusal).

    Returns:
        ``(weight, bias)``: each contiguous (a strided one copied), or None.

    Raises:
        TypeError, ValueError: as the detailed checks.
    """
    if isinstance(x, Tensor) and x.is_floating_point() and x.dim() >= 3 and isinstance(mask, Tensor):
        shape, device = x.shape, x.device
        mshape = mask.shape
        ok = (mask.dtype == torch.bool and len(mshape) == len(shape) and mshape[1] == 1 and mshape[0] == shape[0]
              and mshape[2:] == shape[2:] and mask.device == device)
        vec = shape[1:2]
        for t in (weight, bias, running_mean, running_var):
            if ok and t is not None:
                ok = t.shape == vec and t.device == device
        for t in (running_mean, running_var):
            if ok and t is not None and vec[0] > 1:
                ok = t.stride(0) != 0
        if ok:
            return (weight if weight is None or weight.is_contiguous() else weight.contiguous(),
                    bias if bias is None or bias.is_contiguous() else bias.contiguous())
    check_input(x, op)
    check_mask(x, mask, op)
    weight, bias = check_vector(weight, "weight", x, op), check_vector(bias, "bias", x, op)
    check_running(running_mean, "running_mean", x)
    check_running(running_var, "running_var", x)
    return weight, bias


_SCALARS: OrderedDict = OrderedDict()
_SCALARS_MAX = 64
_SCALARS_LOCK = threading.Lock()


def scalars(eps: float, momentum: float | None, dtype: torch.dtype, device: torch.device) -> Tensor:
    """``Tensor[2]``: ``eps`` and ``momentum`` (0 for None) in the statistics' ``dtype`` on ``device``,
    which the kernels read (a Python float reaches a Triton kernel as float32). Built once per value,
    dtype and device (a bounded, thread-safe cache; the kernels only read it), so a training step
    copies nothing to the device after its first."""
    key = (eps, momentum, dtype, device)
    t = _SCALARS.get(key)  # a dict read is atomic: the lock guards the writes
    if t is not None:
        return t
    t = torch.tensor([eps, 0.0 if momentum is None else momentum], dtype=dtype, device=device)
    with _SCALARS_LOCK:
        _SCALARS[key] = t
        while len(_SCALARS) > _SCALARS_MAX:
            _SCALARS.popitem(last=False)
    return t


def needs_grad(*tensors: Tensor | None) -> bool:
    """Whether autograd records a call on ``tensors`` (else an op runs without its Function)."""
    if not torch.is_grad_enabled():
        return False
    for t in tensors:
        if t is not None and t.requires_grad:
            return True
    return False


def triton_path(t: Tensor) -> bool:
    """Whether an op on ``t`` runs its kernels (a non-empty map where Triton runs)."""
    return _triton.use_triton(t) and t.numel() > 0


def grads(dy: Tensor, gx: Tensor | None, gw: Tensor | None, gb: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """A backward op's outputs: an empty placeholder for each gradient not asked for."""
    return tuple(dy.new_empty(0) if g is None else g for g in (gx, gw, gb))


def param_grads(dy: Tensor, weight: Tensor | None, need_weight: bool, need_bias: bool):
    """Fake parameter gradients: ``Tensor[C]`` in the parameters' dtype, or None."""
    dtype, c = (weight if weight is not None else dy).dtype, dy.shape[1]
    return (dy.new_empty(c, dtype=dtype) if need_weight else None, dy.new_empty(c, dtype=dtype) if need_bias else None)


def triton_backward(kernels, dy: Tensor, x: Tensor, mask: Tensor, weight: Tensor | None, need_x: bool,
                    need_weight: bool, need_bias: bool, *stats) -> tuple[Tensor, Tensor, Tensor]:
    """A backward op's Triton path: ``grad_x`` laid out by :func:`out_like` (when asked for), then
    ``kernels(gx, dy, x, mask, weight, *stats, need_weight, need_bias, param_dtype)`` (a norm's
    two backward launches) writes it and returns the parameters' gradients."""
    gx = out_like(x) if need_x else None
    param_dtype = (weight if weight is not None else dy).dtype
    gw, gb = kernels(gx, dy, x, mask, weight, *stats, need_weight, need_bias, param_dtype)
    return grads(dy, gx, gw, gb)


def bump_versions(*tensors: Tensor | None) -> None:
    """Gives each tensor (None: skipped) the next autograd version, as an in-place torch op does:
    for the running statistics a kernel writes behind autograd's back (a graph that saved them
    then refuses its backward, as it would after ``running_mean.add_``)."""
    torch._C._increment_version([t for t in tensors if t is not None])


def stat_scalars(x: Tensor, eps: float, momentum: float | None = None) -> Tensor:
    """:func:`scalars` in the statistics' dtype of ``x``."""
    return scalars(eps, momentum, stat_dtype(x.dtype), x.device)



def _norm_backward(ctx, dy: Tensor | None, launch: Any, kernel_arg: Any, op: Any, impl: Any, op_args: tuple,
                   count: int) -> tuple:
    """A masked norm's ``autograd.Function`` backward (grad mode off). ``ctx`` saved ``(x, kept,
    mask, weight, stat1, stat2)`` with ``kept`` None when the forward ran its kernels (then so does
    the backward: ``launch(gx, dy, x, mask, weight, stat1, stat2, kernel_arg, need_w, need_b,
    param_dtype)``), else the op's torch-path tensor (``op(dy, x, kept, mask, weight, stat1, stat2,
    *op_args, need_x, need_w, need_b)``); ``ctx.has_weight`` / ``ctx.has_bias``. Returns the
    gradients of the Function's ``count`` inputs (x, weight and bias first)."""
    needs = ctx.needs_input_grad
    need_x, need_w, need_b = needs[0], ctx.has_weight and needs[1], ctx.has_bias and needs[2]
    rest = (None,) * (count - 3)
    if dy is None or not (need_x or need_w or need_b):  # y took no part in the loss
        return (None, None, None) + rest
    x, kept, mask, weight, stat1, stat2 = ctx.saved_tensors
    if kept is None and plain(dy) and triton_path(dy):  # the forward ran its kernels: so does the backward
        gx = out_like(x) if need_x else None
        gw, gb = launch(gx, dy, x, mask, weight, stat1, stat2, kernel_arg, need_w, need_b,
                        (dy if weight is None else weight).dtype)
        return (gx, gw, gb) + rest
    gx, gw, gb = call(op, impl, dy, dy, x, stat1.new_empty(0) if kept is None else kept, mask, weight, stat1, stat2,
                      *op_args, need_x, need_w, need_b)
    return (gx if need_x else None, gw if need_w else None, gb if need_b else None) + rest


_norm_backward_once = once_differentiable(_norm_backward)


def norm_backward(ctx, dy: Tensor | None, *spec: Any) -> tuple:
    """:func:`_norm_backward` (``spec``: its arguments after ``dy``); with ``create_graph=True``
    through ``once_differentiable``, so that a second derivative through the norm is refused."""
    if torch.is_grad_enabled():
        return _norm_backward_once(ctx, dy, *spec)
    return _norm_backward(ctx, dy, *spec)
