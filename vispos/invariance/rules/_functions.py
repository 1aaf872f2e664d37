"""How the rule book reads a call's arguments: the parameter names of the functions and methods it
has rules for (:mod:`vispos.invariance.rules._types`), the binding of a graph node's arguments by
name (a module call's from the module's attributes and its ``forward``), and torch's window
arguments as a :class:`~vispos.invariance.geometry._geometry.Window`.

References:
    ``torch.nn.functional`` and ``torch.Tensor`` signatures.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import torch.fx as fx
from torch import nn

from ..geometry._geometry import Window

__all__ = ["bind", "call_arguments", "window_of"]


def _tuple(value: Any, n: int) -> tuple[int, ...]:
    if isinstance(value, (tuple, list)):
        if len(value) == 1:
            return tuple(int(value[0]) for _ in range(n))
        return tuple(int(v) for v in value)
    return tuple(int(value) for _ in range(n))


def window_of(
    n: int, kernel: Any, stride: Any, padding: Any, dilation: Any = 1, ceil_mode: bool = False
) -> Window:
    """A :class:`Window` from torch's arguments (``stride=None`` means the kernel, as pooling;
    ``padding`` may be ``"same"`` / ``"valid"``)."""
    kernel = _tuple(kernel, n)
    dilation = _tuple(dilation, n)
    stride = kernel if stride is None or (isinstance(stride, (tuple, list)) and len(stride) == 0) else _tuple(stride, n)
    if padding == "valid":
        lo = hi = (0,) * n
    elif padding == "same":
        total = [d * (k - 1) for k, d in zip(kernel, dilation)]
        lo = tuple(t // 2 for t in total)
        hi = tuple(t - t // 2 for t in total)
    else:
        lo = hi = _tuple(padding, n)
    return Window(kernel, stride, lo, hi, dilation, bool(ceil_mode))


# ------------------------------------------------------------------- parameter names of calls
def _sig_conv(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1): ...
def _sig_conv_transpose(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1): ...
def _sig_interpolate(input, size=None, scale_factor=None, mode="nearest", align_corners=None,
                     recompute_scale_factor=None, antialias=False): ...
def _sig_max_pool(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False): ...
def _sig_avg_pool(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                  divisor_override=None): ...
def _sig_adaptive(input, output_size, return_indices=False): ...
def _sig_batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1,
                    eps=1e-5): ...
def _sig_group_norm(input, num_groups, weight=None, bias=None, eps=1e-5): ...
def _sig_instance_norm(input, running_mean=None, running_var=None, weight=None, bias=None,
                       use_input_stats=True, momentum=0.1, eps=1e-5): ...
def _sig_reduce(input, dim=None, keepdim=False, *, dtype=None): ...
def _sig_norm(input, p="fro", dim=None, keepdim=False, dtype=None, *, out=None): ...
def _sig_vector_norm(input, ord=2, dim=None, keepdim=False, *, dtype=None, out=None): ...
def _sig_cat(tensors, dim=0): ...
def _sig_split(input, split_size_or_sections, dim=0): ...
def _sig_permute(input, *rest, dims=None): ...
def _sig_repeat(input, *sizes, repeats=None): ...
def _sig_var(input, dim=None, unbiased=None, keepdim=False, *, correction=None): ...
def _sig_softmax(input, dim=None, _stacklevel=3, dtype=None): ...
def _sig_argmax(input, dim=None, keepdim=False): ...
def _sig_expand(input, *sizes): ...
def _sig_transpose(input, dim0, dim1): ...
def _sig_view(input, *shape): ...
def _sig_pad(input, pad, mode="constant", value=None): ...
def _sig_layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5): ...
def _sig_linear(input, weight, bias=None): ...


def bind(signature: Callable, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The arguments of a call by name, defaults applied (``TypeError`` when they do not fit)."""
    bound = inspect.signature(signature).bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


def _forward_arguments(module: nn.Module, node: fx.Node) -> dict[str, Any]:
    """A module call's arguments by its ``forward``'s names, its first one as ``input``."""
    try:
        bound = bind(type(module).forward, (module, *node.args), node.kwargs)
    except (TypeError, ValueError):
        return {"input": node.args[0]} if node.args else {}
    names = list(bound)
    bound.pop(names[0])  # self
    if len(names) > 1 and names[1] != "input":
        bound["input"] = bound.pop(names[1])
    return bound


def call_arguments(rule: Any, node: fx.Node, module: nn.Module | None) -> dict[str, Any] | None:
    """A node's arguments by name, for ``rule``: a module call's from its ``forward`` and the
    module's attributes (``rule.module_arguments``), with ``"module"``; a function or method call's
    by ``rule.signature`` (or the function's own). None when they cannot be read by the rule's
    signature; ``{}`` when the rule names none and the function's own cannot be read."""
    if node.op == "call_module":
        return {**_forward_arguments(module, node), **rule.module_arguments(module), "module": module}
    signature = rule.signature
    if getattr(signature, "__self__", None) is rule:  # a plain function set as a class attribute
        signature = signature.__func__
    try:
        if signature is not None:
            return bind(signature, node.args, node.kwargs)
        if node.op == "call_function":  # the function's own names, its first one as ``input``
            bound = bind(node.target, node.args, node.kwargs)
            first = next(iter(bound), None)
            if first is not None and first != "input" and "input" not in bound:
                bound["input"] = bound.pop(first)
            return bound
    except (TypeError, ValueError):
        return None if signature is not None else {}
    return {}
