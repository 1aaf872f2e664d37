"""The masked group norm (instance norm: ``num_groups = C``) as torch custom ops:
``vispos::valid_group_norm`` and its backward ``vispos::valid_group_norm_backward``, their Triton
path (:mod:`._group_norm_kernels`, two launches each way), their torch path
(:mod:`._norm_reference`: the CPU implementation and the kernels' reference), their fakes and their
autograd.

Each op is one node for ``torch.compile``, ``torch.export`` and CUDA graphs (see
:mod:`.batch_norm`, whose structure this module shares: a ``torch.library.Library`` definition, a
fake, an ``autograd.Function`` calling the backward op, a second derivative refused). The
forward's fourth output is the centred input the torch backward reads (empty on the Triton path:
the backward re-reads the input). Arguments are checked at :func:`group_norm`
(:mod:`._norm_boundary`). Nothing here imports Triton.

References:
    Wu and He, Group Normalization, ECCV 2018; torch's ``native_group_norm`` (outputs ``y, mean,
    rstd``).
"""

import torch
from torch import Tensor

from .._checks import check_int
from . import _norm_reference as ref
from . import _triton
from ._norm_boundary import (call, check_input, check_mask, check_norm, grads, needs_grad, norm_backward, param_grads,
                             plain, stat_scalars, triton_backward, triton_path)
from ._sizes import out_like

__all__ = ["group_norm"]

_LIB = torch.library.Library("vispos", "FRAGMENT")
_LIB.define(
    "valid_group_norm(Tensor x, Tensor? weight, Tensor? bias, Tensor mask, int num_groups, float eps) "
    "-> (Tensor, Tensor, Tensor, Tensor)")
_LIB.define(
    "valid_group_norm_backward(Tensor dy, Tensor? x, Tensor centred, Tensor mask, Tensor? weight, "
    "Tensor mean, Tensor rstd, int num_groups, bool need_x, bool need_weight, bool need_bias) "
    "-> (Tensor, Tensor, Tensor)")
for _name in ("valid_group_norm", "valid_group_norm_backward"):
    _triton.register_launches(f"vispos::{_name}", 2)
_GN, _GN_BACKWARD = torch.ops.vispos.valid_group_norm.default, torch.ops.vispos.valid_group_norm_backward.default


_KERNELS = None


def _kernels():
    """The kernels' module, imported on the first call that launches them (it imports Triton)."""
    global _KERNELS
    if _KERNELS is None:
        from . import _group_norm_kernels

        _KERNELS = _group_norm_kernels
    return _KERNELS


def _gn(x, weight, bias, mask, num_groups, eps):
    """``vispos::valid_group_norm``: ``(y, mean, rstd, centred)``; see :func:`group_norm`."""
    if triton_path(x):
        kernels = _kernels()
        y = out_like(x)
        mean, rstd = kernels.group_norm_forward(y, x, weight, bias, mask, num_groups, stat_scalars(x, eps))
        return y, mean, rstd, x.new_empty(0, dtype=mean.dtype)
    return ref.group_norm_forward(x, weight, bias, ~mask, num_groups, eps)


def _gn_fake(x, weight, bias, mask, num_groups, eps):
    if triton_path(x):
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
    if triton_path(dy) and x is not None:
        kernels = _kernels().group_norm_backward
        return triton_backward(kernels, dy, x, mask, weight, need_x, need_weight, need_bias, mean, rstd,
                                num_groups)
    return grads(dy, *_gn_backward_torch(dy, x, centred, mask, weight, mean, rstd, num_groups, need_x,
                                          need_weight, need_bias))


def _gn_bwd_fake(dy, x, centred, mask, weight, mean, rstd, num_groups, need_x, need_weight, need_bias):
    if triton_path(dy) and x is not None:
        return grads(dy, out_like(x) if need_x else None, *param_grads(dy, weight, need_weight, need_bias))
    return grads(dy, *_gn_backward_torch(dy, x, centred, mask, weight, mean, rstd, num_groups, need_x,
                                          need_weight, need_bias))


class _ValidGroupNorm(torch.autograd.Function):
    """Autograd of ``vispos::valid_group_norm``: its backward is ``vispos::valid_group_norm_backward``;
    in plain eager mode on the Triton path both directions call their launchers directly (see
    :class:`.batch_norm._ValidBatchNorm`)."""

    @staticmethod
    def forward(ctx, x, weight, bias, mask, num_groups, eps):
        ctx.set_materialize_grads(False)
        ctx.num_groups = num_groups
        ctx.has_weight, ctx.has_bias = weight is not None, bias is not None
        if plain(x) and triton_path(x):
            y = out_like(x)
            mean, rstd = _kernels().group_norm_forward(y, x, weight, bias, mask, num_groups, stat_scalars(x, eps))
            ctx.save_for_backward(x, None, mask, weight, mean, rstd)
            return y
        y, mean, rstd, centred = _GN(x, weight, bias, mask, num_groups, eps)
        ctx.save_for_backward(x if centred.numel() == 0 else None, centred, mask, weight, mean, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        return norm_backward(ctx, dy, _launch_backward, ctx.num_groups, _GN_BACKWARD, _gn_bwd, (ctx.num_groups,), 6)


def _launch_backward(*args):
    """The backward's kernels (imported on first use)."""
    return _kernels().group_norm_backward(*args)


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
        TypeError: ``x`` is not floating; ``mask`` is not bool; ``num_groups`` is not an int.
        ValueError: ``num_groups`` is below 1 or does not divide ``C``; a shape that does not match
            ``x`` (``mask``: ``(B, 1, *S)``; ``weight``, ``bias``: ``(C,)``), a tensor on another device.
        RuntimeError: a second derivative (``create_graph=True`` through it).

    References:
        Wu and He, Group Normalization, ECCV 2018.
    """
    check_input(x, "group norm")
    check_mask(x, mask, "group norm")
    num_groups, channels = check_int(num_groups, "num_groups", minimum=1), x.shape[1]
    if channels % num_groups:
        raise ValueError(f"group norm: num_groups={num_groups} must divide the {channels} channels of x "
                         f"(shape {tuple(x.shape)})")
    weight, bias = check_norm("group norm", x, mask, weight, bias)
    args = (x, weight, bias, mask, num_groups, float(eps))
    return _ValidGroupNorm.apply(*args) if needs_grad(x, weight, bias) else call(_GN, _gn, x, *args)[0]


for _name, _impl, _fake in (("valid_group_norm", _gn, _gn_fake), ("valid_group_norm_backward", _gn_bwd, _gn_bwd_fake)):
    _LIB.impl(_name, _impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"vispos::{_name}", _fake, lib=_LIB)
