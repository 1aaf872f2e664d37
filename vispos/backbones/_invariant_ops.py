"""The operations a padding-invariant graph calls (:mod:`vispos.backbones._invariant` inserts them).

Each takes the feature map's :class:`~vispos.Padding` (or None: no padding, the stock layer runs)
and calls the box-wise statistics of :mod:`vispos._box_layers` or the masked layers of
:mod:`vispos._masked_layers`. Module-level functions, so the rewritten graph pickles and compiles.

References:
    See :mod:`vispos._box_layers` and :mod:`vispos._masked_layers`.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import Tensor, nn

from .. import _box_layers as bl
from ..padding import Padding

__all__ = [
    "padding_at", "fill", "fill_in_place", "batch_norm_module", "batch_norm_fn", "group_norm", "instance_norm_module",
    "instance_norm_fn", "norm_act", "avg_pool", "global_pool", "global_pool_permuted", "per_item_mean",
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
def padding_at(paddings: tuple[Padding | None, ...] | None, gid: int) -> Padding | None:
    """The padding of geometry ``gid`` (None when the batch has no padding)."""
    return None if paddings is None else paddings[gid]


def _mask(padding: Padding) -> Tensor:
    return padding.mask.unsqueeze(1)


@_graph_op
def fill(x: Tensor, padding: Padding | None, value: float, may_write: bool) -> Tensor:
    """``x`` with ``value`` in its padding: in place (only the padded strips are written) when
    ``may_write`` and autograd does not track ``x``, else a masked copy."""
    if padding is None:
        return x
    if may_write and not (torch.is_grad_enabled() and x.requires_grad):
        return bl.box_fill(x, padding, value)
    return x.masked_fill(_mask(padding), value)


@_graph_op
def fill_in_place(x: Tensor, padding: Padding | None, value: float) -> Tensor:
    """Zeros written into a fresh feature map's padding right after the layer that made it (a
    convolution, a norm or a sum, none of which keeps its output for the backward pass), so that the
    activations after it and the next convolution see zeros without a copy."""
    if padding is None:
        return x
    return bl.box_fill(x, padding, value)


@_graph_op
def batch_norm_module(x: Tensor, padding: Padding | None, bn: nn.Module) -> Tensor:
    return bl.box_batch_norm_module(x, padding, bn)


@_graph_op
def batch_norm_fn(x, padding, running_mean, running_var, weight, bias, training, momentum, eps):
    if padding is None:
        return F.batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps)
    return bl.box_batch_norm(x, padding, running_mean, running_var, weight, bias, training, momentum, eps)


@_graph_op
def group_norm(x: Tensor, padding: Padding | None, num_groups: int, weight, bias, eps: float) -> Tensor:
    return bl.box_group_norm(x, padding, num_groups, weight, bias, eps)


@_graph_op
def instance_norm_module(x: Tensor, padding: Padding | None, module: nn.Module) -> Tensor:
    if padding is None:
        return module(x)
    return bl.box_group_norm(x, padding, x.shape[1], module.weight, module.bias, module.eps)


@_graph_op
def instance_norm_fn(x: Tensor, padding: Padding | None, weight, bias, eps: float) -> Tensor:
    if padding is None:
        return F.instance_norm(x, None, None, weight, bias, True, 0.0, eps)
    return bl.box_group_norm(x, padding, x.shape[1], weight, bias, eps)


@_graph_op
def norm_act(x: Tensor, padding: Padding | None, module: nn.Module, kind: str) -> Tensor:
    """timm's ``BatchNormAct2d`` / ``GroupNormAct``: the norm over valid cells, then ``drop``, ``act``."""
    if padding is None:
        return module(x)
    if kind == "bn":
        y = bl.box_batch_norm_module(x, padding, module)
    else:
        y = bl.box_group_norm(x, padding, module.num_groups, module.weight, module.bias, module.eps)
    if hasattr(module, "drop"):  # as timm's own forward: either may be absent
        y = module.drop(y)
    if hasattr(module, "act"):
        y = module.act(y)
    return y


@_graph_op
def avg_pool(x: Tensor, padding: Padding | None, *args: Any) -> Tensor:
    return bl.box_avg_pool(x, padding, *args)


@_graph_op
def global_pool(x: Tensor, padding: Padding | None, mode: str, dims: tuple[int, ...], keepdim: bool) -> Tensor:
    return bl.box_global_pool(x, padding, mode, dims, keepdim)


@_graph_op
def global_pool_permuted(x: Tensor, padding: Padding | None, mode: str, layout: tuple[int, ...],
                         keepdim: bool) -> Tensor:
    """:func:`global_pool` of a map whose axes are permuted (``layout``: the channels-first axis of
    each tensor axis, batch first), e.g. ConvNeXt V2's global response norm on channels last."""
    inverse = tuple(sorted(range(len(layout)), key=lambda i: layout[i]))
    out = bl.box_global_pool(x.permute(inverse), padding, mode, tuple(range(2, x.dim())), True)
    return out.permute(layout) if keepdim else out.flatten(1)


@_graph_op
def per_item_mean(total: Tensor, padding: Padding | None, canvas_count: Any, keepdim: bool) -> Tensor:
    """A sum over every spatial axis divided by each item's own number of cells (the graph divided
    by the canvas's ``H * W``, ``canvas_count``, which is what runs without padding)."""
    if padding is None:
        return total / canvas_count
    dims = tuple(range(2, 2 + padding.n_spatial))
    return total / bl.box_cell_count(total, padding, dims, keepdim)
