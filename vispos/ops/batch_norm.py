"""The masked batch norm as torch custom ops: ``vispos::valid_batch_norm`` and its backward
``vispos::valid_batch_norm_backward``, their Triton path (:mod:`._batch_norm_kernels`, two launches
each way), their torch path (:mod:`._norm_reference`: the CPU implementation and the kernels'
reference), their fakes and their autograd.

Each op is one node for ``torch.compile``, ``torch.export`` and CUDA graphs: a fake implementation
gives its outputs' shapes, dtypes and strides (the Triton path's outputs are laid out by
:func:`._sizes.out_like`; the torch path's fake runs the torch code on fake tensors). The forward
updates the running statistics in place inside its second kernel, so it is not a functional op,
and ``torch.library.register_autograd`` (which takes functional ops only) cannot give it its
backward: an ``autograd.Function`` calls the backward op (skipped when no gradient is recorded).
The ops are ``torch.library.Library`` definitions, which dispatch straight to their implementation.
A second derivative is refused (``RuntimeError``): the backward is closed form.

The forward's fourth output is what its torch backward reads (the centred input, zeros in the
padding): on the Triton path it is empty and the backward re-reads the input, as torch's batch norm
does. Arguments are checked at :func:`batch_norm` as torch's batch norm checks them
(:mod:`._norm_boundary`). Nothing here imports Triton: the kernels are imported on the first call
that runs them.

References:
    Ioffe and Szegedy, Batch Normalization, ICML 2015; PyTorch ``torch.library`` (``Library.define``,
    ``register_fake``); torch's ``native_batch_norm`` (outputs ``y, mean, invstd``).
"""

import torch
from torch import Tensor

from . import _norm_reference as ref
from . import _triton
from ._norm_boundary import (bump_versions, call, check_norm, grads, needs_grad, norm_backward, param_grads, plain,
                             stat_scalars, triton_backward, triton_path)
from ._sizes import out_like

__all__ = ["batch_norm"]

_LIB = torch.library.Library("vispos", "FRAGMENT")
_LIB.define(
    "valid_batch_norm(Tensor x, Tensor? weight, Tensor? bias, Tensor mask, int n, float eps, bool zero_padding, "
    "float? momentum, Tensor(a!)? running_mean, Tensor(b!)? running_var, Tensor(c!)? num_batches_tracked) "
    "-> (Tensor, Tensor, Tensor, Tensor)")
_LIB.define(
    "valid_batch_norm_backward(Tensor dy, Tensor? x, Tensor xc, Tensor mask, Tensor? weight, Tensor mean, "
    "Tensor invstd, int n, bool zero_padding, bool need_x, bool need_weight, bool need_bias) "
    "-> (Tensor, Tensor, Tensor)")
for _name in ("valid_batch_norm", "valid_batch_norm_backward"):
    _triton.register_launches(f"vispos::{_name}", 2)
_BN, _BN_BACKWARD = torch.ops.vispos.valid_batch_norm.default, torch.ops.vispos.valid_batch_norm_backward.default


def _count(valid: Tensor, n: int, dtype: torch.dtype) -> Tensor | int:
    """The number of valid cells: ``n`` when given (> 0), else counted on the device (at least 1)."""
    return n if n > 0 else valid.sum().clamp_(min=1).to(dtype)


_KERNELS = None


def _kernels():
    """The kernels' module, imported on the first call that launches them (it imports Triton)."""
    global _KERNELS
    if _KERNELS is None:
        from . import _batch_norm_kernels

        _KERNELS = _batch_norm_kernels
    return _KERNELS


def _triton_forward(x, weight, bias, mask, eps, momentum, running_mean, running_var, num_batches_tracked,
                    zero_padding):
    """The forward's kernels: ``(y, mean, invstd)``; the running statistics, updated by the kernel,
    get their new autograd version as an in-place torch op would give them."""
    y, mean, invstd = _kernels().batch_norm_forward(
        x, weight, bias, mask, stat_scalars(x, eps, momentum), momentum, running_mean, running_var,
        num_batches_tracked, zero_padding)
    if running_mean is not None and running_var is not None:
        bump_versions(running_mean, running_var, num_batches_tracked)
    return y, mean, invstd


def _bn(x, weight, bias, mask, n, eps, zero_padding, momentum, running_mean, running_var, num_batches_tracked):
    """``vispos::valid_batch_norm``: ``(y, mean, invstd, xc)``; see :func:`batch_norm`."""
    if triton_path(x):
        y, mean, invstd = _triton_forward(x, weight, bias, mask, eps, momentum, running_mean, running_var,
                                          num_batches_tracked, zero_padding)
        return y, mean, invstd, mean.new_empty(0)
    valid = ~mask
    count = _count(valid, n, ref.stat_dtype(x.dtype))
    y, mean, var, invstd, xc = ref.batch_norm_forward(x, weight, bias, valid, count, eps, zero_padding)
    ref.update_running_stats(running_mean, running_var, num_batches_tracked, momentum, mean, var, count)
    return y, mean, invstd, xc


def _bn_fake(x, weight, bias, mask, n, eps, zero_padding, momentum, running_mean, running_var,
             num_batches_tracked):
    dtype = ref.stat_dtype(x.dtype)
    if triton_path(x):
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
    if triton_path(dy) and x is not None:
        kernels = _kernels().batch_norm_backward
        return triton_backward(kernels, dy, x, mask, weight, need_x, need_weight, need_bias, mean, invstd,
                                zero_padding)
    return grads(dy, *_bn_backward_torch(dy, x, xc, mask, weight, mean, invstd, n, zero_padding, need_x,
                                          need_weight, need_bias))


def _bn_bwd_fake(dy, x, xc, mask, weight, mean, invstd, n, zero_padding, need_x, need_weight, need_bias):
    if triton_path(dy) and x is not None:
        return grads(dy, out_like(x) if need_x else None, *param_grads(dy, weight, need_weight, need_bias))
    return grads(dy, *_bn_backward_torch(dy, x, xc, mask, weight, mean, invstd, n, zero_padding, need_x,
                                          need_weight, need_bias))


class _ValidBatchNorm(torch.autograd.Function):
    """Autograd of ``vispos::valid_batch_norm``: its backward is ``vispos::valid_batch_norm_backward``
    (``torch.compile`` and ``torch.export`` trace each as one node). In plain eager mode on the
    Triton path both directions call their launchers directly (:func:`._norm_boundary.plain`): the
    same kernels, without the op's schema outputs (an empty fourth tensor) or its dispatch."""

    @staticmethod
    def forward(ctx, x, weight, bias, mask, n, eps, zero_padding, momentum, running_mean, running_var,
                num_batches_tracked):
        ctx.set_materialize_grads(False)
        ctx.n, ctx.zero_padding = n, zero_padding
        ctx.has_weight, ctx.has_bias = weight is not None, bias is not None
        if plain(x) and triton_path(x):
            y, mean, invstd = _triton_forward(x, weight, bias, mask, eps, momentum, running_mean, running_var,
                                              num_batches_tracked, zero_padding)
            ctx.save_for_backward(x, None, mask, weight, mean, invstd)
            return y
        y, mean, invstd, xc = _BN(x, weight, bias, mask, n, eps, zero_padding, momentum, running_mean, running_var,
                                  num_batches_tracked)
        # the input only when the backward re-reads it (the Triton path): the torch path keeps xc
        ctx.save_for_backward(x if xc.numel() == 0 else None, xc, mask, weight, mean, invstd)
        return y  # the statistics are saved, not outputs: fewer outputs for autograd to wrap

    @staticmethod
    def backward(ctx, dy):
        return norm_backward(ctx, dy, _launch_backward, ctx.zero_padding, _BN_BACKWARD, _bn_bwd,
                             (ctx.n, ctx.zero_padding), 11)


def _launch_backward(*args):
    """The backward's kernels (imported on first use)."""
    return _kernels().batch_norm_backward(*args)


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
        weight, bias (Tensor[C], optional): the affine map (any strides: copied when not contiguous).
        mask (Tensor[B, 1, *S], bool): True = padding (read as it is: no valid map is built on
            the Triton path).
        n (int): the number of valid cells when known on the host (a box per item), else 0: counted
            on the device (the Triton path always counts, in its statistics kernel).
        eps (float): added to the variance.
        zero_padding (bool): zeros in the output's padding (else the bias), and then no bias
            gradient from the padding.
        momentum (float, optional): running-average factor; None: cumulative average.
        running_mean, running_var (Tensor[C], optional), num_batches_tracked (Tensor[], optional):
            updated in place, through their strides (none of them unless both running statistics
            are given); ``eps`` and ``momentum`` are applied in the statistics' dtype.

    Returns:
        Tensor[B, C, *S] in ``x``'s dtype: ``a (x - mean) + bias`` on valid cells, ``bias`` (or 0)
        on padded ones; the input's gradient has zeros in the padding.

    Raises:
        TypeError: ``x`` is not floating; ``mask`` is not bool.
        ValueError: a shape that does not match ``x`` (``mask``: ``(B, 1, *S)``; ``weight``, ``bias``
            and the running statistics: ``(C,)``), a tensor on another device, running statistics
            whose channels share memory (stride 0); ``n`` is 1 (one valid value per channel: torch's
            batch norm refuses it too).
        RuntimeError: a second derivative (``create_graph=True`` through it).

    References:
        Ioffe and Szegedy, Batch Normalization, ICML 2015.
    """
    if running_mean is None or running_var is None:
        running_mean = running_var = num_batches_tracked = None
    weight, bias = check_norm("batch norm", x, mask, weight, bias, running_mean, running_var)
    if int(n) == 1:  # torch refuses a batch statistic of one value per channel
        raise ValueError(f"Expected more than 1 value per channel when training, got {int(n)} valid value per "
                         f"channel in an input of size {tuple(x.shape)} (its padding aside)")
    momentum = None if momentum is None else float(momentum)
    args = (x, weight, bias, mask, int(n), float(eps), bool(zero_padding), momentum, running_mean, running_var,
            num_batches_tracked)
    return _ValidBatchNorm.apply(*args) if needs_grad(x, weight, bias) else call(_BN, _bn, x, *args)[0]


for _name, _impl, _fake in (("valid_batch_norm", _bn, _bn_fake), ("valid_batch_norm_backward", _bn_bwd, _bn_bwd_fake)):
    _LIB.impl(_name, _impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"vispos::{_name}", _fake, lib=_LIB)
