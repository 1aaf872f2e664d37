"""Every built-in entry of the one rule table (:mod:`vispos.invariance.rules`), registered here and
nowhere else, when the package is imported: modules, functions and tensor methods of torch, torchvision and timm, and the
whole-model rules of the token models (ViT, Eva, SAM's ViT, Swin) and the Swin refusals; MONAI's
rows (:mod:`._monai`), the tracer's policy (:mod:`vispos.invariance.tracing._policy`: what it keeps
whole, traces through, traces as another function and patches) and the rewrite of a sum divided by
a map's own size (:mod:`._sized`), all registered by :func:`register_builtins`.

A row says what a call does to the cells of a padded batch, as data: cell-wise (with the facts
the rewrite uses: may alias its input, keeps zeros zero, non-negative output, a fresh output),
reads neighbours (a window), per-item statistics, moves cells without mixing them, or refused
with the reason. A user adds or replaces rows with :func:`~vispos.register_invariance_rule`.

References:
    torch.ao.quantization ``backend_config`` (one table of patterns); ``torch.nn``,
    ``torch.nn.functional`` and ``torch.Tensor``; torchvision ``ops/stochastic_depth.py``.
"""

from __future__ import annotations

import operator

import torch
import torch.nn.functional as F
from torch import nn

from ..tokens import _swin, _swin_timm, _vit, _windowed
from .. import models as _models
from ..models import torchvision_segmentation as _segmentation
from ._types import (AvgPool, Cat, ChannelView, Conv, ConvTranspose, Expand, GetItem, Interpolate, MaxPool,
                     OverChannels, Pad, Permute, Repeat, Split, Transpose)
from ._reductions import (AlongChannels, BatchNormFunction, GlobalPool, GroupNormFunction, InstanceNormFunction, Norm,
                          Reduction)
from . import _monai
from ..tracing import _policy
from ._book import CellWise, Refuse, RuleBook, default_rules
from ._sized import SumOverCanvas

__all__ = ["register_builtins"]

_SAME_PADDING = (
    "TensorFlow-style 'same' padding computed from the input's size, so from the padded canvas rather "
    "than the item (timm's tf_* ports); use the model without the tf_ prefix"
)

#: one row per rule object: every key it serves, modules, functions and methods together (so
#: ``nn.Conv2d`` and ``F.conv2d`` share one rule object)
_ROWS = (
    (CellWise(), (
        nn.PReLU, nn.RReLU, nn.Hardsigmoid, nn.Sigmoid, nn.Softplus, nn.Tanhshrink, nn.Threshold, nn.LocalResponseNorm,
        "torchvision.ops.misc.FrozenBatchNorm2d", "timm.layers.norm_act.FrozenBatchNormAct2d",
        "vispos.backbones._batch_norm.FrozenBatchNorm3d", "vispos.backbones.pyramid.ChannelLayerNorm",
        operator.mul, operator.truediv, operator.neg, operator.pos, operator.iadd, operator.isub, operator.imul,
        operator.itruediv, operator.pow, operator.abs, torch.subtract, torch.mul, torch.multiply, torch.div,
        torch.divide, torch.neg, torch.abs, torch.exp, torch.sigmoid, torch.clamp, torch.clip, torch.clamp_min,
        torch.maximum, torch.minimum, torch.sqrt, torch.rsqrt, torch.square, torch.pow, torch.erf, torch.where,
        torch.addcmul, torch.sign, F.prelu, F.rrelu, F.elu_, F.hardsigmoid, F.hardtanh_, F.sigmoid, F.softplus,
        F.softsign, F.threshold, F.alpha_dropout, F.feature_alpha_dropout, F.local_response_norm,
        "sigmoid", "sigmoid_", "exp", "exp_", "add", "add_", "sub", "sub_", "mul", "mul_", "div", "div_", "neg",
        "neg_", "abs", "clamp", "clamp_", "clamp_min", "clamp_min_", "clamp_max", "clamp_max_", "clip", "clip_",
        "pow", "pow_", "sqrt", "rsqrt", "square", "erf", "addcmul", "addcmul_", "masked_fill", "hardswish", "sign")),
    (CellWise(fresh_output=True), (operator.add, operator.sub, torch.add, torch.sub)),
    (CellWise(zero_preserving=True), (
        nn.LeakyReLU, nn.ELU, nn.SELU, nn.CELU, nn.GELU, nn.SiLU, nn.Mish, nn.Hardswish, nn.Hardtanh, nn.Tanh,
        nn.Softsign, "torchvision.ops.stochastic_depth.StochasticDepth",
        F.leaky_relu, F.leaky_relu_, F.elu, F.selu, F.celu, F.gelu, F.silu, F.mish, F.hardswish, F.hardtanh,
        torch.tanh, F.tanh, F.dropout, F.dropout1d, F.dropout2d, F.dropout3d,
        "torchvision.ops.stochastic_depth.stochastic_depth", "tanh", "tanh_")),
    (CellWise(zero_preserving=True, nonnegative=True), (
        nn.ReLU, nn.ReLU6, F.relu, F.relu_, torch.relu, torch.relu_, F.relu6, "relu", "relu_")),
    (CellWise(alias=True, zero_preserving=True), (nn.Identity, nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d)),
    (CellWise(alias=True), (
        nn.AlphaDropout, nn.FeatureAlphaDropout, "contiguous", "to", "type", "type_as", "float", "double", "half",
        "bfloat16", "clone", "detach", "requires_grad_", "cpu", "cuda")),
    (Conv(), (nn.Conv1d, nn.Conv2d, nn.Conv3d, F.conv1d, F.conv2d, F.conv3d)),
    (ConvTranspose(), (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d, F.conv_transpose1d,
                       F.conv_transpose2d, F.conv_transpose3d)),
    (MaxPool(), (nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, F.max_pool1d, F.max_pool2d, F.max_pool3d)),
    (AvgPool(), (nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d, F.avg_pool1d, F.avg_pool2d, F.avg_pool3d)),
    (GlobalPool("mean"), (nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d, F.adaptive_avg_pool1d,
                          F.adaptive_avg_pool2d, F.adaptive_avg_pool3d)),
    (GlobalPool("max"), (nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d, F.adaptive_max_pool1d,
                         F.adaptive_max_pool2d, F.adaptive_max_pool3d)),
    (Interpolate(), (nn.Upsample, F.interpolate, F.upsample)),
    (Pad(), (F.pad,)),
    # channel-axis, element-wise and per-item statistics rows (each cell alone, or each item's cells)
    (CellWise(), (
        operator.gt, operator.lt, operator.ge, operator.le, operator.eq, operator.ne, operator.and_, operator.or_,
        operator.invert, torch.gt, torch.lt, torch.ge, torch.le, torch.eq, torch.ne, torch.greater, torch.less,
        torch.greater_equal, torch.less_equal, torch.not_equal, torch.logical_and, torch.logical_or,
        torch.logical_not, torch.masked_fill, torch.clamp_max, "gt", "lt", "ge", "le", "eq", "ne", "logical_and",
        "logical_or", "logical_not", "where", "masked_fill_", "expand_as")),
    (CellWise(fresh_output=True), (torch.zeros_like, torch.ones_like, torch.full_like)),
    (CellWise(alias=True), ("bool", "long", "int")),
    (AlongChannels(), (F.softmax, torch.softmax, "softmax", F.log_softmax, torch.log_softmax, "log_softmax")),
    (AlongChannels(reduces=True), (torch.argmax, "argmax", torch.argmin, "argmin")),
    (AlongChannels(reduces=True, pair=True), (torch.max, "max", torch.min, "min")),
    (Reduction("min"), (torch.amin, "amin")),
    (Reduction("var"), (torch.var, "var")),
    (Reduction("std"), (torch.std, "std")),
    (Reduction("vector_norm"), (torch.linalg.vector_norm,)),
    (Expand(), ("expand",)),
    (Transpose(), (torch.transpose, "transpose")),
    (ChannelView(), ("view", "reshape", torch.reshape)),
    (Norm(), (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm, nn.GroupNorm, nn.InstanceNorm1d,
              nn.InstanceNorm2d, nn.InstanceNorm3d)),
    (Norm(activation=True), ("timm.layers.norm_act.BatchNormAct2d", "timm.layers.norm_act.GroupNormAct",
                             "timm.layers.norm_act.GroupNorm1Act")),
    (BatchNormFunction(), (F.batch_norm,)),
    (GroupNormFunction(), (F.group_norm,)),
    (InstanceNormFunction(), (F.instance_norm,)),
    (Reduction("mean"), (torch.mean, "mean")),
    (Reduction("sum"), (torch.sum, "sum")),
    (Reduction("max"), (torch.amax, "amax")),
    (Reduction("norm"), (torch.norm, "norm")),
    (Permute(), ("torchvision.ops.misc.Permute", torch.permute, "permute")),
    (Cat(), (torch.cat, torch.concat, torch.concatenate)),
    (Repeat(), ("repeat",)),
    (Split(), (torch.chunk, torch.split, "chunk", "split")),
    (GetItem(), (operator.getitem,)),
    (OverChannels("layer norm over the trailing axes, which are spatial in a channels-first map", normalized=True,
                  strict=True), (nn.LayerNorm,)),
    (OverChannels("a layer norm over the trailing axes, which are spatial in a channels-first map",
                  normalized=True), (F.layer_norm,)),
    (OverChannels("a linear layer over the last axis, which is spatial in a channels-first map"), (nn.Linear, F.linear)),
    (Refuse(_SAME_PADDING), ("timm.layers.conv2d_same.Conv2dSame", "timm.layers.pool2d_same.MaxPool2dSame",
                             "timm.layers.pool2d_same.AvgPool2dSame")),
    (Refuse("it mixes or moves cells without a padding mask"), (nn.MultiheadAttention, nn.Flatten, nn.Unflatten)),
    (Refuse("it flattens the spatial axes of a feature map"), (torch.flatten, "flatten")),
)


def register_builtins(book: RuleBook) -> None:
    """Registers every built-in entry in ``book`` (the global book, once, when
    :mod:`vispos.invariance.rules` is imported): the rows above, the token models' whole-model
    rules and the Swin refusals, MONAI's rows (by dotted names), the tracer's policy and the
    rewrite of a sum divided by a map's own size."""
    for rule, keys in _ROWS:
        for key in keys:
            book.register(key, rule)
    for name, why in _swin.SWIN_REFUSALS.items():
        book.register(name, Refuse(why))
    for name, rule in (*_vit.TOKEN_RULES, *_swin_timm.TOKEN_RULES, *_windowed.TOKEN_RULES):
        book.register(name, rule)
    for name, rule in (*_models.WHOLE_MODEL_RULES, *_segmentation.SEGMENTATION_RULES):  # detectors, segmenters
        book.register(name, rule)
    _monai.register(book)
    _policy.register(book)
    sized = SumOverCanvas()
    for key in (operator.truediv, torch.div, torch.true_divide, "div", "true_divide"):
        book.register_sized(key, sized)


register_builtins(default_rules())
