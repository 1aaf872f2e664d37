"""The operations a padding-invariant graph calls (:mod:`vispos.invariance.rewrite._rewrite` inserts them).

Each takes the feature map's :class:`~vispos.Padding` (or None: no padding, the stock layer runs)
and calls the maths of :mod:`vispos.invariance.cells._norms` and :mod:`vispos.invariance.cells._pools`.
Module-level functions, so the rewritten graph pickles and compiles.

References:
    See :mod:`vispos.invariance.cells._norms` and :mod:`vispos.invariance.cells._pools`.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.instancenorm import _InstanceNorm

from ..cells import _norms, _pools, _upsampling
from ...padding import Padding

__all__ = [
    "padding_at", "fill", "fill_in_place", "norm_module", "call_with_padding", "batch_norm_fn", "group_norm",
    "instance_norm_fn", "fill_edges", "resize", "avg_pool", "adaptive_pool", "global_pool", "global_pool_permuted",
    "per_item_mean",
]


def _graph_op(fn: Callable) -> Callable:
    """Keeps ``fn`` one call in a graph when FX traces code that calls it (a GraphModule re-traces
    its own code when it is unpickled), as ``torch.fx.wrap`` does for names in one module."""

    @functools.wraps(fn)
    def op(*args: Any) -> Any:
        for a in args:
            if isinstance(a, fx.Proxy):
                return a.tracer.create_proxy("call_function", op, args, {})
        return fn(*args)

    return op


@_graph_op
def padding_at(paddings: tuple[Padding | None, ...] | None, geometry_id: int) -> Padding | None:
    """The padding of geometry ``geometry_id`` (None when the batch has no padding)."""
    return None if paddings is None else paddings[geometry_id]


@_graph_op
def fill(x: Tensor, padding: Padding | None, value: float, may_write: bool) -> Tensor:
    """``x`` with ``value`` in its padding: in place (only the padded strips are written) when
    ``may_write`` and autograd does not track ``x``, else a masked copy."""
    if padding is None:
        return x
    if may_write and not (torch.is_grad_enabled() and x.requires_grad):
        return _pools.fill(x, padding, value)
    return _pools.filled(x, padding, value)


@_graph_op
def fill_in_place(x: Tensor, padding: Padding | None, value: float) -> Tensor:
    """Zeros written into a fresh feature map's padding right after the layer that made it (a
    convolution, a norm or a sum, none of which keeps its output for the backward pass), so that the
    activations after it and the next convolution see zeros without a copy."""
    if padding is None:
        return x
    return _pools.fill(x, padding, value)


@_graph_op
def fill_edges(x: Tensor, padding: Padding | None) -> Tensor:
    """A copy of ``x`` with each item's edge values in its padding (before a linear up-sampling)."""
    return _upsampling.fill_edges(x, padding)


@_graph_op
def resize(x: Tensor, padding: Padding | None, target: Padding | None, size: Any, scale_factor: Any, mode: str,
           align_corners: bool, recompute_scale_factor: Any, scales: Any) -> Tensor:
    """``F.interpolate`` of each item from its own size to its own output size (``target``: the
    output map's padding; ``padding`` None: every item fills ``x``; ``scales``: the factors torch's
    coordinates use, None for each item's sizes); the stock call without padding."""
    if target is None or target.kind == "none" and (padding is None or padding.kind == "none"):
        linear = mode in ("linear", "bilinear", "bicubic", "trilinear")
        return F.interpolate(x, size, scale_factor, mode, align_corners if linear else None, recompute_scale_factor)
    return _upsampling.resize(x, padding, target, mode, align_corners, scales)


@_graph_op
def batch_norm_fn(x, padding, running_mean, running_var, weight, bias, training, momentum, eps):
    if padding is None:
        return F.batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps)
    return _norms.batch_norm(x, padding, running_mean, running_var, weight, bias, training, momentum, eps)


@_graph_op
def group_norm(x: Tensor, padding: Padding | None, num_groups: int, weight, bias, eps: float) -> Tensor:
    return _norms.group_norm(x, padding, num_groups, weight, bias, eps)


@_graph_op
def instance_norm_fn(x: Tensor, padding: Padding | None, weight, bias, eps: float, running_mean=None,
                     running_var=None, momentum: float = 0.1, use_input_stats: bool = True) -> Tensor:
    """``F.instance_norm`` with each item's statistics over its own cells; the running statistics,
    when given, updated as torch does (:func:`_track_instance_statistics`); with
    ``use_input_stats=False`` the running statistics (each cell alone)."""
    if padding is None or not use_input_stats:
        return F.instance_norm(x, running_mean, running_var, weight, bias, use_input_stats, momentum, eps)
    if running_mean is not None:
        _track_instance_statistics(x, padding, running_mean, running_var, momentum)
    return _norms.group_norm(x, padding, x.shape[1], weight, bias, eps)


def _track_instance_statistics(x: Tensor, padding: Padding, running_mean: Tensor, running_var: Tensor,
                               momentum: float | None) -> None:
    """Instance norm's running statistics as ``F.instance_norm`` updates them in training: each
    running value moves by ``momentum`` towards the batch's mean of the items' means and unbiased
    variances (here over each item's own cells)."""
    if not momentum:
        return
    with torch.no_grad():
        dims = tuple(range(2, x.dim()))
        mean = _pools.global_pool(x.detach(), padding, "mean", dims, False).mean(0)
        var = _pools.global_pool(x.detach(), padding, "var:1", dims, False).mean(0)
        running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
        running_var.mul_(1 - momentum).add_(var.to(running_var.dtype), alpha=momentum)


@_graph_op
def norm_module(x: Tensor, padding: Padding | None, module: nn.Module, zero_padding: bool = False) -> Tensor:
    """A batch / group / instance norm module (timm's ``BatchNormAct2d`` / ``GroupNormAct`` with
    their ``drop`` and ``act`` after) with statistics over valid cells (a batch norm without running
    statistics takes the batch's in eval too; an instance norm with them updates them in training,
    and is cell-wise in eval); the module itself without padding, or when it was swapped for a
    frozen batch norm after the graph was built. With
    ``zero_padding`` the output's padding holds zeros (the rewrite asks for it where a layer
    that reads neighbours follows, instead of a fill of its own)."""
    if padding is None:
        return module(x)
    if not isinstance(module, (_BatchNorm, nn.GroupNorm, _InstanceNorm)):
        y = module(x)
        return _pools.fill(y, padding, 0.0) if zero_padding else y
    if isinstance(module, _InstanceNorm) and module.running_mean is not None and not module.training:
        y = module(x)  # the running statistics: each cell alone
        return _pools.fill(y, padding, 0.0) if zero_padding else y
    # timm's norm + act: submodules (read from the dict: a missing attribute costs an exception)
    children = module._modules
    drop, act = children.get("drop"), children.get("act")
    extras = isinstance(drop, nn.Module) or isinstance(act, nn.Module)
    if isinstance(module, _BatchNorm):  # without running statistics: the batch's, in eval too
        y = _norms.batch_norm_module(x, padding, module, zero_padding and not extras)
    else:  # zeros in the padding already
        if isinstance(module, _InstanceNorm) and module.running_mean is not None:
            _track_instance_statistics(x, padding, module.running_mean, module.running_var, module.momentum)
        groups = module.num_groups if isinstance(module, nn.GroupNorm) else x.shape[1]
        y = _norms.group_norm(x, padding, groups, module.weight, module.bias, module.eps)
    if isinstance(drop, nn.Module):
        y = drop(y)
    if isinstance(act, nn.Module):
        y = act(y)
    return _pools.fill(y, padding, 0.0) if zero_padding and extras else y


@_graph_op
def call_with_padding(x: Tensor, padding: Padding | None, module: nn.Module, fn: Any = None) -> Tensor:
    """A module with a :class:`~vispos.invariance.rules.PaddingAware` rule: its ``fn(module, x,
    padding)``; ``fn`` given by a rule book of the caller's own, else looked up in the global book
    when the graph runs (so the graph pickles without the function)."""
    from ..rules import rule_for

    return (fn if fn is not None else rule_for(module).fn)(module, x, padding)


@_graph_op
def avg_pool(x: Tensor, padding: Padding | None, *args: Any) -> Tensor:
    return _pools.avg_pool(x, padding, *args)


@_graph_op
def global_pool(x: Tensor, padding: Padding | None, mode: str, dims: tuple[int, ...], keepdim: bool) -> Tensor:
    return _pools.global_pool(x, padding, mode, dims, keepdim)


@_graph_op
def adaptive_pool(x: Tensor, padding: Padding | None, mode: str, output_size: tuple[int, ...]) -> Tensor:
    """A fixed-size adaptive pool of each item over its own bins (:func:`._pools.adaptive_pool`)."""
    return _pools.adaptive_pool(x, padding, mode, output_size)


@_graph_op
def global_pool_permuted(x: Tensor, padding: Padding | None, mode: str, layout: tuple[int, ...],
                         keepdim: bool) -> Tensor:
    """:func:`global_pool` of a map whose axes are permuted (``layout``: the channels-first axis of
    each tensor axis, batch first), e.g. ConvNeXt V2's global response norm on channels last."""
    inverse = tuple(sorted(range(len(layout)), key=lambda i: layout[i]))
    out = _pools.global_pool(x.permute(inverse), padding, mode, tuple(range(2, x.dim())), True)
    return out.permute(layout) if keepdim else out.flatten(1)


@_graph_op
def per_item_mean(total: Tensor, padding: Padding | None, canvas_count: Any, keepdim: bool) -> Tensor:
    """A sum over every spatial axis divided by each item's own number of cells (the graph divided
    by the canvas's ``H * W``, ``canvas_count``, which is what runs without padding)."""
    if padding is None:
        return total / canvas_count
    dims = tuple(range(2, 2 + padding.num_axes))
    return total / _pools.cell_count(total, padding, dims, keepdim)
