"""The masked norms as torch custom ops (``vispos::valid_batch_norm``, ``vispos::valid_group_norm`` and
their backward ops): Triton kernels where :func:`vispos._triton.use_triton` says so, the torch code
of :mod:`._norm_torch` elsewhere.

Each op is one node for ``torch.compile``, ``torch.export`` and CUDA graphs: a fake implementation
gives its outputs' shapes, dtypes and strides (the Triton path's outputs are laid out by
:func:`out_like`; the torch path's fake runs the torch code on fake tensors), and its backward is
another op, called by an ``autograd.Function`` (so a graph holds two nodes, not the thirty torch
ops of the reference). On CUDA each op launches two Triton kernels (declared with
:func:`vispos._triton.register_launches`); the batch norm's running statistics are updated inside
its second kernel. A second derivative is refused (``RuntimeError``): the backward is closed form.

The ops are defined with ``torch.library.Library`` rather than ``torch.library.custom_op``:
``custom_op`` takes no autograd formula for an op that mutates its inputs (the running statistics),
and its Python dispatch layers cost tens of microseconds a call on the CPU (about a third of a
small norm's time); a ``Library`` op dispatches straight to its implementation (~10 us). So
autograd is an ``autograd.Function`` around each op (skipped when no gradient is recorded):
:func:`batch_norm` and :func:`group_norm` are the entry points.

An op's fourth output is what its torch backward reads (the centred input, zeros in the padding):
on the Triton path it is empty and the backward re-reads the input, as torch's batch norm does.
Nothing here imports Triton: the kernels' modules are imported on the first call that runs them.

References:
    PyTorch ``torch.library`` (``Library.define``, ``register_fake``) and its custom-op guide;
    torch's ``native_batch_norm`` / ``native_group_norm`` (outputs ``y, mean, invstd``).
"""

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .. import _triton
from . import _norm_torch as ref

__all__ = ["batch_norm", "group_norm", "out_like"]

_LIB = torch.library.Library("vispos", "FRAGMENT")
_SCHEMAS = {
    "valid_batch_norm": (
        "valid_batch_norm(Tensor x, Tensor? weight, Tensor? bias, Tensor mask, int n, float eps, bool zero_padding, "
        "float? momentum, Tensor(a!)? running_mean, Tensor(b!)? running_var, Tensor(c!)? num_batches_tracked) "
        "-> (Tensor, Tensor, Tensor, Tensor)"),
    "valid_batch_norm_backward": (
        "valid_batch_norm_backward(Tensor dy, Tensor? x, Tensor xc, Tensor mask, Tensor? weight, Tensor mean, "
        "Tensor invstd, int n, bool zero_padding, bool need_x, bool need_weight, bool need_bias) "
        "-> (Tensor, Tensor, Tensor)"),
    "valid_group_norm": (
        "valid_group_norm(Tensor x, Tensor? weight, Tensor? bias, Tensor mask, int num_groups, float eps) "
        "-> (Tensor, Tensor, Tensor, Tensor)"),
    "valid_group_norm_backward": (
        "valid_group_norm_backward(Tensor dy, Tensor? x, Tensor centred, Tensor mask, Tensor? weight, "
        "Tensor mean, Tensor rstd, int num_groups, bool need_x, bool need_weight, bool need_bias) "
        "-> (Tensor, Tensor, Tensor)"),
}
for _name, _schema in _SCHEMAS.items():
    _LIB.define(_schema)
    _triton.register_launches(f"vispos::{_name}", 2)

_CHANNELS_LAST = {4: torch.channels_last, 5: torch.channels_last_3d}
_BN, _BN_BACKWARD = torch.ops.vispos.valid_batch_norm.default, torch.ops.vispos.valid_batch_norm_backward.default
_GN, _GN_BACKWARD = torch.ops.vispos.valid_group_norm.default, torch.ops.vispos.valid_group_norm_backward.default


def _needs_grad(*tensors: Tensor | None) -> bool:
    """Whether autograd records a call on ``tensors`` (else the op runs without its Function)."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _check_mask(mask: Tensor) -> None:
    """Raises ``TypeError`` for a padding mask that is not bool (``~mask`` of an integer mask is
    not its complement)."""
    if mask.dtype != torch.bool:
        raise TypeError(f"the padding mask must be bool (True = padding), got {mask.dtype}: pass mask.bool() "
                        "for a 0/1 mask with 1 = padding, or mask == 0 for one with 1 = valid")


def _triton_path(t: Tensor) -> bool:
    """Whether an op on ``t`` runs its kernels (a non-empty map where Triton runs)."""
    return _triton.use_triton(t) and t.numel() > 0


def out_like(x: Tensor) -> Tensor:
    """An uninitialised map like ``x`` (Tensor[B, C, *S]) whose spatial axes flatten to one stride:
    ``x``'s own strides with one spatial axis, channels last where ``x`` is, else contiguous. The
    layout of the Triton path's outputs (and of their fakes)."""
    if x.dim() <= 3:
        return torch.empty_like(x)
    fmt = _CHANNELS_LAST.get(x.dim())
    if fmt is not None and not x.is_contiguous() and x.is_contiguous(memory_format=fmt):
        return torch.empty_like(x, memory_format=fmt)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _count(valid: Tensor, n: int, dtype: torch.dtype) -> Tensor | int:
    """The number of valid cells: ``n`` when given (> 0), else counted on the device (at least 1)."""
    return n if n > 0 else valid.sum().clamp_(min=1).to(dtype)


def _grads(dy: Tensor, gx: Tensor | None, gw: Tensor | None, gb: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """The backward ops' outputs: an empty placeholder for each gradient not asked for."""
    return tuple(dy.new_empty(0) if g is None else g for g in (gx, gw, gb))


def _param_grads(dy: Tensor, weight: Tensor | None, need_weight: bool, need_bias: bool):
    """Fake parameter gradients: ``Tensor[C]`` in the parameters' dtype, or None."""
    dtype, c = (weight if weight is not None else dy).dtype, dy.shape[1]
    return (dy.new_empty(c, dtype=dtype) if need_weight else None, dy.new_empty(c, dtype=dtype) if need_bias else None)


def _triton_backward(kernels, dy: Tensor, x: Tensor, mask: Tensor, weight: Tensor | None, need_x: bool,
                     need_weight: bool, need_bias: bool, *stats) -> tuple[Tensor, Tensor, Tensor]:
    """A backward op's Triton path: ``grad_x`` laid out by :func:`out_like` (when asked for), then
    ``kernels(gx, dy, x, mask, weight, *stats, need_weight, need_bias, param_dtype)`` (a norm's
    two backward launches) writes it and returns the parameters' gradients."""
    gx = out_like(x) if need_x else None
    param_dtype = (weight if weight is not None else dy).dtype
    gw, gb = kernels(gx, dy, x, mask, weight, *stats, need_weight, need_bias, param_dtype)
    return _grads(dy, gx, gw, gb)


# ------------------------------------------------------------------------------------------ batch norm


def _bn(x, weight, bias, mask, n, eps, zero_padding, momentum, running_mean, running_var, num_batches_tracked):
    """``vispos::valid_batch_norm``: ``(y, mean, invstd, xc)``; see :func:`batch_norm`."""
    if _triton_path(x):
        from . import _batch_norm_kernels as kernels

        y = out_like(x)
        mean, invstd = kernels.batch_norm_forward(
            y, x, weight, bias, mask, eps, zero_padding, momentum, running_mean, running_var, num_batches_tracked)
        if running_mean is not None and running_var is not None:  # written by the kernel, not by torch
            torch.autograd.graph.increment_version(
                [t for t in (running_mean, running_var, num_batches_tracked) if t is not None])
        return y, mean, invstd, x.new_empty(0, dtype=mean.dtype)
    valid = ~mask
    count = _count(valid, n, ref.stat_dtype(x.dtype))
    y, mean, var, invstd, xc = ref.batch_norm_forward(x, weight, bias, valid, count, eps, zero_padding)
    ref.update_running_stats(running_mean, running_var, num_batches_tracked, momentum, mean, var, count)
    return y, mean, invstd, xc


def _bn_fake(x, weight, bias, mask, n, eps, zero_padding, momentum, running_mean, running_var,
             num_batches_tracked):
    dtype = ref.stat_dtype(x.dtype)
    if _triton_path(x):
        c = x.shape[1]
        return out_like(x), x.new_empty(c, dtype=dtype), x.new_empty(c, dtype=dtype), x.new_empty(0, dtype=dtype)
    valid = ~mask
    y, mean, _, invstd, xc = ref.batch_norm_forward(x, weight, bias, valid, _count(valid, n, dtype), eps,
                                                    zero_padding)
    return y, mean, invstd, xc


def _bn_backward_torch(dy, x, xc, mask, weight, mean, invstd, n, zero_padding, need_x, need_weight, need_bias):
    """The torch backward (the centred input recomputed when the forward ran on Triton)."""
    valid = ~mask
    if xc.numel() == 0 and x is not None and x.numel() > 0:
        xc = ref.batch_norm_centred(x, valid, mean)
    param_dtype = (weight if weight is not None else dy).dtype
    return ref.batch_norm_backward(dy, xc, valid, weight, invstd, _count(valid, n, xc.dtype), zero_padding, need_x,
                                   need_weight, need_bias, dy.dtype, param_dtype)


def _bn_bwd(dy, x, xc, mask, weight, mean, invstd, n, zero_padding, need_x, need_weight, need_bias):
    """``vispos::valid_batch_norm_backward``: ``(grad_x, grad_weight, grad_bias)``, an empty tensor
    for each one not asked for; ``x`` is given when the forward ran on Triton (``xc`` is empty)."""
    if _triton_path(dy) and x is not None:
        from ._batch_norm_kernels import batch_norm_backward as kernels

        return _triton_backward(kernels, dy, x, mask, weight, need_x, need_weight, need_bias, mean, invstd,
                                zero_padding)
    return _grads(dy, *_bn_backward_torch(dy, x, xc, mask, weight, mean, invstd, n, zero_padding, need_x,
                                          need_weight, need_bias))


def _bn_bwd_fake(dy, x, xc, mask, weight, mean, invstd, n, zero_padding, need_x, need_weight, need_bias):
    if _triton_path(dy) and x is not None:
        return _grads(dy, out_like(x) if need_x else None, *_param_grads(dy, weight, need_weight, need_bias))
    return _grads(dy, *_bn_backward_torch(dy, x, xc, mask, weight, mean, invstd, n, zero_padding, need_x,
                                          need_weight, need_bias))


class _ValidBatchNorm(torch.autograd.Function):
    """Autograd of ``vispos::valid_batch_norm``: its backward is ``vispos::valid_batch_norm_backward``
    (``torch.compile`` and ``torch.export`` trace each as one node)."""

    @staticmethod
    def forward(ctx, x, weight, bias, mask, n, eps, zero_padding, momentum, running_mean, running_var,
                num_batches_tracked):
        y, mean, invstd, xc = _BN(
            x, weight, bias, mask, n, eps, zero_padding, momentum, running_mean, running_var, num_batches_tracked)
        ctx.set_materialize_grads(False)
        # the input only when the backward re-reads it (the Triton path): the torch path keeps xc
        ctx.save_for_backward(x if xc.numel() == 0 else None, xc, mask, weight, mean, invstd)
        ctx.n, ctx.zero_padding = n, zero_padding
        ctx.has_weight, ctx.has_bias = weight is not None, bias is not None
        return y  # the statistics are saved, not outputs: fewer outputs for autograd to wrap

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        need_x = ctx.needs_input_grad[0]
        need_w = ctx.has_weight and ctx.needs_input_grad[1]
        need_b = ctx.has_bias and ctx.needs_input_grad[2]
        grads = [None] * 11
        if dy is None or not (need_x or need_w or need_b):  # y took no part in the loss
            return tuple(grads)
        x, xc, mask, weight, mean, invstd = ctx.saved_tensors
        gx, gw, gb = _BN_BACKWARD(
            dy, x, xc, mask, weight, mean, invstd, ctx.n, ctx.zero_padding, need_x, need_w, need_b)
        grads[:3] = gx if need_x else None, gw if need_w else None, gb if need_b else None
        return tuple(grads)


def batch_norm(
    x: Tensor, weight: Tensor | None, bias: Tensor | None, mask: Tensor, n: int, eps: float, zero_padding: bool,
    momentum: float | None, running_mean: Tensor | None, running_var: Tensor | None,
    num_batches_tracked: Tensor | None,
) -> Tensor:
    """Batch norm with statistics over every item's valid cells (``vispos::valid_batch_norm``), the
    running statistics updated from them as ``torch.nn.BatchNorm2d`` updates them (momentum, or the
    cumulative average when ``momentum`` is None and ``num_batches_tracked`` is given; the unbiased
    variance ``var * n / (n - 1)``); differentiable once in ``x``, ``weight`` and ``bias``.

    Args:
        x (Tensor[B, C, *S]): features, any floating dtype (statistics in float32 for 16-bit,
            float64 for float64), any memory format.
        weight, bias (Tensor[C], optional): the affine map.
        mask (Tensor[B, 1, *S], bool): True = padding (read as it is: no valid map is built on
            the Triton path).
        n (int): the number of valid cells when known on the host (a box per item), else 0: counted
            on the device (the Triton path always counts, in its statistics kernel).
        eps (float): added to the variance.
        zero_padding (bool): zeros in the output's padding (else the bias), and then no bias
            gradient from the padding.
        momentum (float, optional): running-average factor; None: cumulative average.
        running_mean, running_var (Tensor[C], optional), num_batches_tracked (Tensor[], optional):
            updated in place (none of them unless both running statistics are given).

    Returns:
        Tensor[B, C, *S] in ``x``'s dtype: ``a (x - mean) + bias`` on valid cells, ``bias`` (or 0)
        on padded ones; the input's gradient has zeros in the padding.

    Raises:
        TypeError: ``mask`` is not bool.
        ValueError: ``n`` is 1 (one valid value per channel: torch's batch norm refuses it too).
        RuntimeError: a second derivative (``create_graph=True`` through it).

    References:
        Ioffe and Szegedy, Batch Normalization, ICML 2015.
    """
    _check_mask(mask)
    if int(n) == 1:  # torch refuses a batch statistic of one value per channel
        raise ValueError(f"Expected more than 1 value per channel when training, got {int(n)} valid value per "
                         f"channel in an input of size {tuple(x.shape)} (its padding aside)")
    momentum = None if momentum is None else float(momentum)
    args = (x, weight, bias, mask, int(n), float(eps), bool(zero_padding), momentum, running_mean, running_var,
            num_batches_tracked)
    return _ValidBatchNorm.apply(*args) if _needs_grad(x, weight, bias) else _BN(*args)[0]


# ------------------------------------------------------------------------------------------ group norm


def _gn(x, weight, bias, mask, num_groups, eps):
    """``vispos::valid_group_norm``: ``(y, mean, rstd, centred)``; see :func:`group_norm`."""
    if _triton_path(x):
        from . import _group_norm_kernels as kernels

        y = out_like(x)
        mean, rstd = kernels.group_norm_forward(y, x, weight, bias, mask, num_groups, eps)
        return y, mean, rstd, x.new_empty(0, dtype=mean.dtype)
    return ref.group_norm_forward(x, weight, bias, ~mask, num_groups, eps)


def _gn_fake(x, weight, bias, mask, num_groups, eps):
    if _triton_path(x):
        dtype = ref.stat_dtype(x.dtype)
        mean, rstd = (x.new_empty((x.shape[0], num_groups), dtype=dtype) for _ in range(2))
        return out_like(x), mean, rstd, x.new_empty(0, dtype=dtype)
    return ref.group_norm_forward(x, weight, bias, ~mask, num_groups, eps)


def _gn_backward_torch(dy, x, centred, mask, weight, mean, rstd, num_groups, need_x, need_weight, need_bias):
    """The torch backward (the centred input recomputed when the forward ran on Triton)."""
    valid = ~mask
    if centred.numel() == 0 and x is not None and x.numel() > 0:
        centred = ref.group_norm_centred(x, valid, mean)
    param_dtype = (weight if weight is not None else dy).dtype
    return ref.group_norm_backward(dy, centred, valid, weight, rstd, num_groups, need_x, need_weight, need_bias,
                                   dy.dtype, param_dtype)


def _gn_bwd(dy, x, centred, mask, weight, mean, rstd, num_groups, need_x, need_weight, need_bias):
    """``vispos::valid_group_norm_backward``: ``(grad_x, grad_weight, grad_bias)``, an empty tensor
    for each one not asked for; ``x`` is given when the forward ran on Triton (``centred`` empty)."""
    if _triton_path(dy) and x is not None:
        from ._group_norm_kernels import group_norm_backward as kernels

        return _triton_backward(kernels, dy, x, mask, weight, need_x, need_weight, need_bias, mean, rstd,
                                num_groups)
    return _grads(dy, *_gn_backward_torch(dy, x, centred, mask, weight, mean, rstd, num_groups, need_x,
                                          need_weight, need_bias))


def _gn_bwd_fake(dy, x, centred, mask, weight, mean, rstd, num_groups, need_x, need_weight, need_bias):
    if _triton_path(dy) and x is not None:
        return _grads(dy, out_like(x) if need_x else None, *_param_grads(dy, weight, need_weight, need_bias))
    return _grads(dy, *_gn_backward_torch(dy, x, centred, mask, weight, mean, rstd, num_groups, need_x,
                                          need_weight, need_bias))


class _ValidGroupNorm(torch.autograd.Function):
    """Autograd of ``vispos::valid_group_norm``: its backward is ``vispos::valid_group_norm_backward``."""

    @staticmethod
    def forward(ctx, x, weight, bias, mask, num_groups, eps):
        y, mean, rstd, centred = _GN(x, weight, bias, mask, num_groups, eps)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x if centred.numel() == 0 else None, centred, mask, weight, mean, rstd)
        ctx.num_groups = num_groups
        ctx.has_weight, ctx.has_bias = weight is not None, bias is not None
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        need_x = ctx.needs_input_grad[0]
        need_w = ctx.has_weight and ctx.needs_input_grad[1]
        need_b = ctx.has_bias and ctx.needs_input_grad[2]
        if dy is None or not (need_x or need_w or need_b):  # y took no part in the loss
            return None, None, None, None, None, None
        x, centred, mask, weight, mean, rstd = ctx.saved_tensors
        gx, gw, gb = _GN_BACKWARD(
            dy, x, centred, mask, weight, mean, rstd, ctx.num_groups, need_x, need_w, need_b)
        return gx if need_x else None, gw if need_w else None, gb if need_b else None, None, None, None


def group_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None, mask: Tensor, num_groups: int,
               eps: float) -> Tensor:
    """Group norm (instance norm: ``num_groups = C``) with each item's statistics over its valid
    cells (``vispos::valid_group_norm``), differentiable once in ``x``, ``weight`` and ``bias``.

    Args:
        x (Tensor[B, C, *S]): features, any floating dtype (statistics in float32 for 16-bit,
            float64 for float64), any memory format.
        weight, bias (Tensor[C], optional): the affine map.
        mask (Tensor[B, 1, *S], bool): True = padding.
        num_groups (int): divides ``C``. eps (float): added to the variance.

    Returns:
        Tensor[B, C, *S] in ``x``'s dtype, zeros in the padding; the input's gradient too.

    Raises:
        TypeError: ``mask`` is not bool.
        ValueError: ``num_groups`` does not divide ``C``.
        RuntimeError: a second derivative (``create_graph=True`` through it).

    References:
        Wu and He, Group Normalization, ECCV 2018.
    """
    _check_mask(mask)
    num_groups, channels = int(num_groups), x.shape[1]
    if num_groups < 1 or channels % num_groups:
        raise ValueError(f"group norm: num_groups={num_groups} must divide the {channels} channels of x "
                         f"(shape {tuple(x.shape)})")
    args = (x, weight, bias, mask, num_groups, float(eps))
    return _ValidGroupNorm.apply(*args) if _needs_grad(x, weight, bias) else _GN(*args)[0]


for _name, _impl, _fake in (("valid_batch_norm", _bn, _bn_fake), ("valid_batch_norm_backward", _bn_bwd, _bn_bwd_fake),
                            ("valid_group_norm", _gn, _gn_fake), ("valid_group_norm_backward", _gn_bwd, _gn_bwd_fake)):
    _LIB.impl(_name, _impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"vispos::{_name}", _fake, lib=_LIB)
