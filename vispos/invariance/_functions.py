"""The rule book of padding invariance for functions and methods on feature maps: one row per op
(:mod:`vispos.invariance.rules` holds the modules' rules).

Every call on a feature map falls in one class:

* **pointwise** (activations, dropout, stochastic depth, sums and products, channel concatenation):
  each output cell reads the same cell of its inputs; nothing to do;
* **window** (convolutions, max / average pooling): reads neighbours; its input's padding is
  filled (0, or ``-inf`` for max pooling) and its output gets a new geometry by convolution
  arithmetic;
* **statistics** (batch / group / instance norm, means, sums, maxima and L2 norms over every
  spatial axis): computed over valid cells (:mod:`vispos.invariance._ops`);
* anything else (reshapes, attention, interpolation, ``F.pad``, reductions over some spatial
  axes) is **refused** when the backbone is built, by name.

References:
    ``torch.nn.functional`` and ``torch.Tensor`` signatures; torchvision ``ops/stochastic_depth.py``.
"""

from __future__ import annotations

import inspect
import operator
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from ._geometry import Window

__all__ = [
    "ALIAS_METHODS", "FUNCTION_SIGNATURES", "FRESH_FUNCTIONS", "METHOD_SIGNATURES", "POINTWISE_FUNCTIONS",
    "POINTWISE_METHODS", "NAMED_POINTWISE", "bind", "channels_last_kind", "plain_reduction", "pointwise_function",
    "reduction_signature", "window_of", "zero_preserving",
]


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


def _own_forward(m: nn.Module, bases: tuple[type, ...]) -> type | None:
    """The base in ``bases`` whose ``forward`` ``m`` runs unchanged (its class or a subclass
    that does not override ``forward``), else None."""
    for base in bases:
        if isinstance(m, base) and type(m).forward is base.forward:
            return base
    return None


# ---------------------------------------------------------------------------------- functions
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
def _sig_cat(tensors, dim=0): ...
def _sig_split(input, split_size_or_sections, dim=0): ...
def _sig_flatten(input, start_dim=0, end_dim=-1): ...
def _sig_norm(input, p="fro", dim=None, keepdim=False, dtype=None): ...


#: function -> (kind, signature used to read its arguments)
FUNCTION_SIGNATURES: dict[Callable, tuple[str, Callable]] = {
    F.conv1d: ("conv", _sig_conv), F.conv2d: ("conv", _sig_conv), F.conv3d: ("conv", _sig_conv),
    F.conv_transpose1d: ("conv_transpose", _sig_conv_transpose),
    F.conv_transpose2d: ("conv_transpose", _sig_conv_transpose),
    F.conv_transpose3d: ("conv_transpose", _sig_conv_transpose),
    F.interpolate: ("interpolate", _sig_interpolate), F.upsample: ("interpolate", _sig_interpolate),
    F.max_pool1d: ("max_pool", _sig_max_pool), F.max_pool2d: ("max_pool", _sig_max_pool),
    F.max_pool3d: ("max_pool", _sig_max_pool),
    F.avg_pool1d: ("avg_pool", _sig_avg_pool), F.avg_pool2d: ("avg_pool", _sig_avg_pool),
    F.avg_pool3d: ("avg_pool", _sig_avg_pool),
    F.adaptive_avg_pool1d: ("adaptive_mean", _sig_adaptive), F.adaptive_avg_pool2d: ("adaptive_mean", _sig_adaptive),
    F.adaptive_avg_pool3d: ("adaptive_mean", _sig_adaptive),
    F.adaptive_max_pool1d: ("adaptive_max", _sig_adaptive), F.adaptive_max_pool2d: ("adaptive_max", _sig_adaptive),
    F.adaptive_max_pool3d: ("adaptive_max", _sig_adaptive),
    F.batch_norm: ("batch_norm", _sig_batch_norm), F.group_norm: ("group_norm", _sig_group_norm),
    F.instance_norm: ("instance_norm", _sig_instance_norm),
    torch.mean: ("mean", _sig_reduce), torch.sum: ("sum", _sig_reduce), torch.amax: ("max", _sig_reduce),
    torch.cat: ("cat", _sig_cat), torch.concat: ("cat", _sig_cat), torch.concatenate: ("cat", _sig_cat),
    torch.chunk: ("split", _sig_split), torch.split: ("split", _sig_split),
    torch.flatten: ("flatten", _sig_flatten), torch.norm: ("norm", _sig_norm),
}

#: call_method names read with the same signatures (``x.mean(...)``, ``x.chunk(...)``)
METHOD_SIGNATURES: dict[str, tuple[str, Callable]] = {
    "mean": ("mean", _sig_reduce), "sum": ("sum", _sig_reduce), "amax": ("max", _sig_reduce),
    "chunk": ("split", _sig_split), "split": ("split", _sig_split), "flatten": ("flatten", _sig_flatten),
    "norm": ("norm", _sig_norm),
}

POINTWISE_FUNCTIONS: frozenset = frozenset({
    operator.add, operator.sub, operator.mul, operator.truediv, operator.neg, operator.pos,
    operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.pow, operator.abs,
    torch.add, torch.sub, torch.subtract, torch.mul, torch.multiply, torch.div, torch.divide,
    torch.neg, torch.abs, torch.exp, torch.sigmoid, torch.tanh, torch.relu, torch.relu_, torch.clamp,
    torch.clip, torch.clamp_min, torch.maximum, torch.minimum, torch.sqrt, torch.rsqrt, torch.square,
    torch.pow, torch.erf, torch.where, torch.addcmul, torch.sign,
    F.relu, F.relu_, F.relu6, F.leaky_relu, F.leaky_relu_, F.prelu, F.rrelu, F.elu, F.elu_, F.selu,
    F.celu, F.gelu, F.silu, F.mish, F.hardswish, F.hardsigmoid, F.hardtanh, F.hardtanh_, F.sigmoid,
    F.tanh, F.softplus, F.softsign, F.threshold, F.dropout, F.dropout1d, F.dropout2d, F.dropout3d,
    F.alpha_dropout, F.feature_alpha_dropout, F.local_response_norm,
})

#: pointwise functions of other packages, by dotted name (so importing vispos imports none of them):
#: torchvision's stochastic depth multiplies each sample by its own draw
NAMED_POINTWISE: frozenset = frozenset({"torchvision.ops.stochastic_depth.stochastic_depth"})


def _dotted(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}"


def pointwise_function(target: Any) -> bool:
    """Whether a ``call_function`` target reads each cell alone."""
    return target in POINTWISE_FUNCTIONS or _dotted(target) in NAMED_POINTWISE

#: methods whose output may be the input itself (never filled in place, see ``alias``)
ALIAS_METHODS: frozenset = frozenset({
    "contiguous", "to", "type", "type_as", "float", "double", "half", "bfloat16", "clone", "detach",
    "requires_grad_", "cpu", "cuda",
})

POINTWISE_METHODS: frozenset = ALIAS_METHODS | frozenset({
    "relu", "relu_", "sigmoid", "sigmoid_", "tanh", "tanh_", "exp", "exp_", "add", "add_", "sub",
    "sub_", "mul", "mul_", "div", "div_", "neg", "neg_", "abs", "clamp", "clamp_", "clamp_min",
    "clamp_min_", "clamp_max", "clamp_max_", "clip", "clip_", "pow", "pow_", "sqrt", "rsqrt", "square",
    "erf", "addcmul", "addcmul_", "masked_fill", "hardswish", "sign",
})


def plain_reduction(kind: str, arguments: dict[str, Any]) -> bool:
    """A reduction vispos computes per item: no ``dtype``; a norm only with ``p=2``."""
    if arguments.get("dtype") is not None:
        return False
    return kind != "norm" or arguments["p"] in (2, 2.0, "fro")


def reduction_signature(node: Any) -> Callable:
    """The signature a reduction node (``x.mean(...)``, ``torch.sum(...)``) is read with."""
    table = METHOD_SIGNATURES if node.op == "call_method" else FUNCTION_SIGNATURES
    return table[node.target][1]


def channels_last_kind(op: str, target: Any, module: nn.Module | None, args: tuple, kwargs: dict,
                       module_kind: str | None = None) -> str | None:
    """How a node reads a map whose axes were permuted: ``"pointwise"`` (elementwise),
    ``"channels"`` (a layer norm or linear layer over the last axis, cell-wise when that axis holds
    the channels), a reduction kind (``"mean"``, ``"sum"``, ``"max"``, ``"norm"``), or None.
    ``module_kind`` is the kind of a module's rule (:mod:`vispos.invariance.rules`)."""
    if op == "call_module":
        if module_kind == "pointwise":
            return "pointwise"
        if _own_forward(module, (nn.LayerNorm,)) and len(module.normalized_shape) == 1:
            return "channels"
        if _own_forward(module, (nn.Linear,)):
            return "channels"
        return None
    if op == "call_function":
        if pointwise_function(target):
            return "pointwise"
        if target is F.layer_norm:
            shape = args[1] if len(args) > 1 else kwargs.get("normalized_shape")
            return "channels" if isinstance(shape, (tuple, list)) and len(shape) == 1 else None
        if target is F.linear:
            return "channels"
        entry = FUNCTION_SIGNATURES.get(target)
    elif op == "call_method":
        if target in POINTWISE_METHODS:
            return "pointwise"
        entry = METHOD_SIGNATURES.get(target)
    else:
        return None
    return entry[0] if entry is not None and entry[0] in ("mean", "sum", "max", "norm") else None


def bind(signature: Callable, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The arguments of a call by name, defaults applied."""
    bound = inspect.signature(signature).bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


# ------------------------------------------------------------- zeros that survive activations
_ZERO_MODULES = (nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.ELU, nn.SELU, nn.CELU, nn.GELU, nn.SiLU, nn.Mish,
                 nn.Hardswish, nn.Hardtanh, nn.Tanh, nn.Softsign, nn.Identity, nn.Dropout, nn.Dropout1d,
                 nn.Dropout2d, nn.Dropout3d)
_NONNEG_MODULES = (nn.ReLU, nn.ReLU6)
_ZERO_FUNCTIONS = frozenset({F.relu, F.relu_, torch.relu, torch.relu_, F.relu6, F.leaky_relu, F.leaky_relu_,
                             F.elu, F.selu, F.celu, F.gelu, F.silu, F.mish, F.hardswish, F.hardtanh,
                             torch.tanh, F.tanh, F.dropout, F.dropout1d, F.dropout2d, F.dropout3d})
_NONNEG_FUNCTIONS = frozenset({F.relu, F.relu_, torch.relu, torch.relu_, F.relu6})
_ZERO_METHODS = frozenset({"relu", "relu_", "tanh", "tanh_"})
_NONNEG_METHODS = frozenset({"relu", "relu_"})

#: functions whose output is a new map their backward does not read (a fill may write into it)
FRESH_FUNCTIONS: frozenset = frozenset({
    F.conv1d, F.conv2d, F.conv3d, F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d, F.batch_norm,
    F.group_norm, operator.add, operator.sub, torch.add, torch.sub,
})


def zero_preserving(op: str, target: Any, module: nn.Module | None) -> tuple[bool, bool]:
    """``(maps 0 to 0, output >= 0)`` of an elementwise activation (ReLU, GELU, SiLU, dropout, ...):
    zeros written into the padding before it are still zeros after it."""
    if op == "call_module":
        zero = _own_forward(module, _ZERO_MODULES) is not None or \
            _dotted(type(module)) == "torchvision.ops.stochastic_depth.StochasticDepth"
        return zero, zero and _own_forward(module, _NONNEG_MODULES) is not None
    if op == "call_function":
        return target in _ZERO_FUNCTIONS or _dotted(target) in NAMED_POINTWISE, target in _NONNEG_FUNCTIONS
    if op == "call_method":
        return target in _ZERO_METHODS, target in _NONNEG_METHODS
    return False, False
