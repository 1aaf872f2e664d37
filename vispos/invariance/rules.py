"""The rule book of padding invariance for modules: one small rule object per module type, and
the public registration that lets a user add their own.

A rule says what a module does to the cells of a padded batch, with one method,
:meth:`InvarianceRule.rewrite`, that rewrites the module's node of the traced graph through the
few operations of :class:`RewriteStep` (run it as it is, fill its input's padding before a
window, call a function that gets each map's :class:`~vispos.Padding`). The rewriter of
:mod:`vispos.invariance._rewrite` only walks the graph and asks this table; a module without a
rule is refused by name, never run inexactly. Rules apply to the registered class and to
subclasses that keep its ``forward`` (a subclass with its own ``forward`` needs its own rule).

Example::

    import torch
    from torch import nn
    import vispos
    from vispos.backbones import TorchvisionBackbone

    class Scale(nn.Module):  # reads one cell at a time
        def __init__(self):
            super().__init__()
            self.gain = nn.Parameter(torch.ones(1))

        def forward(self, x):
            return x * self.gain

    vispos.register_invariance_rule(Scale, vispos.CellWise())
    body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), Scale())
    backbone = TorchvisionBackbone(body, return_nodes=["1"], padding_invariant=True)

References:
    torch.ao.quantization ``backend_config`` (``BackendPatternConfig``: patterns registered as
    small config objects); torchvision ``models/feature_extraction.py`` and timm
    ``register_notrace_module`` (the caller names its leaf modules).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Protocol, runtime_checkable

import torch.fx as fx
from torch import Tensor, nn

from .. import _deprecation
from ..padding import Padding
from . import _upsampling as upsampling
from ._functions import window_of
from ._geometry import TransposedWindow, Window

__all__ = [
    "InvarianceRule", "RewriteStep", "CellWise", "PaddingAware", "Refuse", "register_invariance_rule",
    "rule_for", "classify_module",
]


@runtime_checkable
class RewriteStep(Protocol):
    """What a rule may do to its node (the rewriter implements it); ``num_axes`` is the number of
    spatial axes of the graph's feature maps (2 or 3)."""

    num_axes: int

    def cell_wise(self, node: fx.Node, alias: bool = False) -> None:
        """Run the node as it is: each output cell reads the same cell of the input."""

    def window(self, node: fx.Node, window: Window | TransposedWindow, fill: str) -> None:
        """Fill the input's padding (``"zero"``; ``"max"``: ``-inf``; ``"edge"``: each item's edge
        values) and run the node as it is, a sliding or transposed window with a new geometry."""

    def with_padding(self, node: fx.Node, fn: Callable[..., Tensor], *args: Any, keeps_geometry: bool = True) -> None:
        """Replace the node by ``fn(x, padding, *args)``: ``padding`` is the input map's
        :class:`~vispos.Padding` (None without padding). With ``keeps_geometry`` the output is a
        feature map on the input's cells, else a per-item value (a pooled vector)."""

    def refuse(self, node: fx.Node, why: str) -> None:
        """Raise vispos' ``ValueError`` naming the node's layer."""

    def module_ref(self, node: fx.Node) -> fx.Node:
        """A node reading the module ``node`` calls (an argument for :meth:`with_padding`)."""

    def norm(self, node: fx.Node) -> None:
        """A batch / group / instance norm module with statistics over valid cells."""

    def padding_aware(self, node: fx.Node) -> None:
        """The module's :class:`PaddingAware` function, called with the input map's padding."""


class InvarianceRule:
    """What one module type does to the cells of a padded batch.

    Subclasses implement :meth:`rewrite`, which rewrites the module's graph node through the
    :class:`RewriteStep`; ``kind`` names the rule in messages and tests.
    """

    kind = "rule"

    def rewrite(self, step: RewriteStep, node: fx.Node, module: nn.Module) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class CellWise(InvarianceRule):
    """The module reads each cell alone (any function of one cell's channels: an activation, a
    per-channel affine map, a 1x1 projection, per-sample dropout). Nothing to do.

    Args:
        alias (bool): the module may return its input itself (Identity, dropout in eval): never
            written in place.

    Raises:
        TypeError: ``alias`` is not a bool.

    References:
        torch.ao.quantization's ``BackendPatternConfig`` (rules registered per pattern, the
        rewriter asks the table); torchvision ``models/feature_extraction.py`` (leaf modules).
    """

    alias: bool = False
    kind = "pointwise"

    def __post_init__(self) -> None:
        if not isinstance(self.alias, bool):
            raise TypeError(f"CellWise: alias must be a bool, got {type(self.alias).__name__}")

    def rewrite(self, step: RewriteStep, node: fx.Node, module: nn.Module) -> None:
        step.cell_wise(node, alias=self.alias)


@dataclass(frozen=True)
class PaddingAware(InvarianceRule):
    """The module becomes ``fn(module, x, padding)``, a function that gets the input map's padding
    and returns, on each item's cells, what the module gives the item alone (statistics over
    valid cells, say). ``padding`` is a :class:`~vispos.Padding` of shape ``(B, *S)`` (True =
    padding), or None when the batch has no padding (then ``fn`` must run the module as it is).

    Args:
        fn (callable): ``fn(module, x: Tensor[B, C, *S], padding: Padding | None) -> Tensor[B, C', *S]``,
            looked up by the module's type when the graph runs.

    Raises:
        TypeError: ``fn`` is not callable.

    References:
        torch.ao.quantization's ``BackendPatternConfig`` (rules registered per pattern, the
        rewriter asks the table); torchvision ``models/feature_extraction.py`` (leaf modules).
    """

    fn: Callable[[nn.Module, Tensor, Padding | None], Tensor]
    kind = "padding_aware"

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise TypeError(f"PaddingAware: fn must be callable, got {type(self.fn).__name__}")

    def rewrite(self, step: RewriteStep, node: fx.Node, module: nn.Module) -> None:
        step.padding_aware(node)


@dataclass(frozen=True)
class Refuse(InvarianceRule):
    """The module cannot be made exact: the backbone is refused when it is built, with ``why``.

    Args:
        why (str): the reason, said in the ``ValueError`` that names the layer.

    Raises:
        TypeError: ``why`` is not a string.

    References:
        torch.ao.quantization's ``BackendPatternConfig`` (rules registered per pattern, the
        rewriter asks the table); torchvision ``models/feature_extraction.py`` (leaf modules).
    """

    why: str
    kind = "refuse"

    def __post_init__(self) -> None:
        if not isinstance(self.why, str):
            raise TypeError(f"Refuse: why must be a str, got {type(self.why).__name__}")

    def rewrite(self, step: RewriteStep, node: fx.Node, module: nn.Module) -> None:
        step.refuse(node, self.why)


# ---------------------------------------------------------------------------------- registry
_RULES: dict[Any, InvarianceRule] = {}
_LOCK = threading.Lock()


def register_invariance_rule(module_type: type | str, rule: InvarianceRule) -> None:
    """Registers how ``padding_invariant=True`` runs a module type: :class:`CellWise`,
    :class:`PaddingAware`, :class:`Refuse` or any :class:`InvarianceRule`.

    A registered type is also kept whole (a leaf) when vispos traces a backbone. The rule applies
    to the type and its subclasses that do not override ``forward``; registering a type again
    replaces its rule.

    Args:
        module_type (type or str): an ``nn.Module`` subclass, or its ``"module.QualName"`` (a
            third-party class named without importing its package).
        rule (InvarianceRule): the rule.

    Raises:
        TypeError: ``module_type`` is not an ``nn.Module`` subclass or a dotted name, or ``rule``
            is not an :class:`InvarianceRule`.

    References:
        torch.ao.quantization's ``BackendPatternConfig`` (rules registered per pattern, the
        rewriter asks the table); torchvision ``models/feature_extraction.py`` (leaf modules).

    Example:
        >>> import vispos
        >>> from torch import nn
        >>> class Gate(nn.Module):
        ...     def forward(self, x):
        ...         return x * x.sigmoid()
        >>> vispos.register_invariance_rule(Gate, vispos.CellWise())
    """
    if isinstance(module_type, str):
        if "." not in module_type:
            raise TypeError(f"module_type must be an nn.Module subclass or 'module.QualName', got {module_type!r}")
    elif not (isinstance(module_type, type) and issubclass(module_type, nn.Module)):
        raise TypeError(f"module_type must be an nn.Module subclass or 'module.QualName', got {module_type!r}")
    if not isinstance(rule, InvarianceRule):
        raise TypeError(f"rule must be an InvarianceRule (CellWise, PaddingAware, Refuse, ...), got "
                        f"{type(rule).__name__}")
    with _LOCK:
        _RULES[module_type] = rule


def rule_for(module: nn.Module) -> InvarianceRule | None:
    """The rule of ``module``'s class, or of the nearest base whose ``forward`` it runs unchanged;
    None when no rule applies."""
    own = type(module).forward
    for cls in type(module).__mro__:
        if cls is nn.Module:
            break
        rule = _RULES.get(cls) or _RULES.get(f"{cls.__module__}.{cls.__qualname__}")
        if rule is not None and (cls is type(module) or cls.forward is own):
            return rule
    return None


@_deprecation.renamed_kwargs(n_spatial="num_axes")
def classify_module(m: nn.Module, num_axes: int = 2) -> tuple[str, Any]:
    """``(kind, rule)`` of a module, what the tracer reads to keep a module whole: ``"refuse"`` when
    no rule applies (the tracer opens the module and the rewrite judges what it calls), else the
    rule's kind (``"refused"`` for a :class:`Refuse` rule: kept whole, so its refusal names it)."""
    rule = rule_for(m)
    if rule is None:
        return "refuse", Refuse("a module vispos does not know how to run on a padded batch (no rule for it; "
                                "see vispos.register_invariance_rule)")
    return ("refused" if rule.kind == "refuse" else rule.kind), rule


# ---------------------------------------------------------------------------- built-in rules
@dataclass(frozen=True)
class ConvRule(InvarianceRule):
    """``nn.Conv1d/2d/3d``: zeros in the input's padding (what its own zero padding gives alone)."""

    kind = "conv"

    def rewrite(self, step, node, module):
        if module.padding_mode != "zeros":
            step.refuse(node, f"padding_mode={module.padding_mode!r} (only zero padding is what an item alone sees)")
        step.window(node, window_of(step.num_axes, module.kernel_size, module.stride, module.padding,
                                    module.dilation), "zero")


@dataclass(frozen=True)
class MaxPoolRule(InvarianceRule):
    """``nn.MaxPool1d/2d/3d``: ``-inf`` in the input's padding."""

    kind = "max_pool"

    def rewrite(self, step, node, module):
        if module.return_indices:
            step.refuse(node, "return_indices=True (indices into the padded canvas differ from the item's)")
        step.window(node, window_of(step.num_axes, module.kernel_size, module.stride, module.padding,
                                    module.dilation, module.ceil_mode), "max")


@dataclass(frozen=True)
class AvgPoolRule(InvarianceRule):
    """``nn.AvgPool1d/2d/3d``: window sums over zeros in the padding, each item's own divisor."""

    kind = "avg_pool"

    def rewrite(self, step, node, module):
        window = window_of(step.num_axes, module.kernel_size, module.stride, module.padding, 1, module.ceil_mode)
        step.avg_pool(node, window, module.count_include_pad, getattr(module, "divisor_override", None))


@dataclass(frozen=True)
class GlobalPoolRule(InvarianceRule):
    """``nn.AdaptiveAvgPool*`` / ``nn.AdaptiveMaxPool*`` with output size 1: each item's own cells."""

    mode: str
    kind = "global"

    def rewrite(self, step, node, module):
        size = module.output_size
        if any(s != 1 for s in (size if isinstance(size, (tuple, list)) else (size,))):
            step.refuse(node, f"output_size={size!r} (only a global pool, output size 1, has the item's bins)")
        step.global_pool(node, self.mode)


@dataclass(frozen=True)
class NormRule(InvarianceRule):
    """Batch, group and instance norms, and timm's norm + activation modules: statistics over
    valid cells (:meth:`RewriteStep.norm`).

    Args:
        activation (bool): the module applies an activation after the norm (timm's
            ``BatchNormAct2d``), whose backward may read the output: never filled in place.
    """

    activation: bool = False
    kind = "norm"

    def rewrite(self, step, node, module):
        if getattr(module, "track_running_stats", False) and isinstance(module, nn.modules.instancenorm._InstanceNorm):
            step.refuse(node, "track_running_stats=True (running statistics of instance norm)")
        step.norm(node)


@dataclass(frozen=True)
class PermuteRule(InvarianceRule):
    """torchvision's ``Permute`` (ConvNeXt): a new axis order of the same cells."""

    kind = "permute"

    def rewrite(self, step, node, module):
        step.permute(node, tuple(module.dims))


@dataclass(frozen=True)
class ConvTransposeRule(InvarianceRule):
    """``nn.ConvTranspose1d/2d/3d``: zeros in the input's padding, each item's output box by the
    transposed-convolution size formula on its own box (:mod:`vispos.invariance._upsampling`)."""

    kind = "conv_transpose"

    def rewrite(self, step, node, module):
        if len(node.args) > 1 or node.kwargs.get("output_size") is not None:
            step.refuse(node, "it is called with output_size= (the canvas's size, from which torch picks the "
                              "output padding; the item alone would get its own)")
        step.window(node, upsampling.transposed_window(step.num_axes, module.kernel_size, module.stride,
                                                       module.padding, module.output_padding, module.dilation), "zero")


@dataclass(frozen=True)
class UpsampleRule(InvarianceRule):
    """``nn.Upsample``: an integer ``scale_factor``; nearest as it is, linear modes on each item's
    edge values, ``align_corners=True`` and ``size=`` refused (:mod:`vispos.invariance._upsampling`)."""

    kind = "upsample"

    def rewrite(self, step, node, module):
        upsampling.interpolate(step, node, module.size, module.scale_factor, module.mode, module.align_corners)


_POINTWISE = (
    nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.PReLU, nn.RReLU, nn.ELU, nn.SELU, nn.CELU, nn.GELU, nn.SiLU,
    nn.Mish, nn.Hardswish, nn.Hardsigmoid, nn.Hardtanh, nn.Sigmoid, nn.Tanh, nn.Softplus,
    nn.Softsign, nn.Tanhshrink, nn.Threshold, nn.LocalResponseNorm,
    "torchvision.ops.misc.FrozenBatchNorm2d", "torchvision.ops.stochastic_depth.StochasticDepth",
)
_ALIASING = (nn.Identity, nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout,
             nn.FeatureAlphaDropout)
_SAME_PADDING = (
    "TensorFlow-style 'same' padding computed from the input's size, so from the padded canvas rather "
    "than the item (timm's tf_* ports); use the model without the tf_ prefix"
)


def _register_builtins() -> None:
    for cls in _POINTWISE:
        register_invariance_rule(cls, CellWise())
    for cls in _ALIASING:
        register_invariance_rule(cls, CellWise(alias=True))
    for cls in (nn.Conv1d, nn.Conv2d, nn.Conv3d):
        register_invariance_rule(cls, ConvRule())
    for cls in (nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d):
        register_invariance_rule(cls, MaxPoolRule())
    for cls in (nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d):
        register_invariance_rule(cls, AvgPoolRule())
    for cls in (nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d):
        register_invariance_rule(cls, GlobalPoolRule("mean"))
    for cls in (nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d):
        register_invariance_rule(cls, GlobalPoolRule("max"))
    for cls in (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm, nn.GroupNorm,
                nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d):
        register_invariance_rule(cls, NormRule())
    register_invariance_rule("torchvision.ops.misc.Permute", PermuteRule())
    for name in ("timm.layers.norm_act.BatchNormAct2d", "timm.layers.norm_act.GroupNormAct",
                 "timm.layers.norm_act.GroupNorm1Act"):
        register_invariance_rule(name, NormRule(activation=True))
    register_invariance_rule("timm.layers.norm_act.FrozenBatchNormAct2d", CellWise())
    for name in ("timm.layers.conv2d_same.Conv2dSame", "timm.layers.pool2d_same.MaxPool2dSame",
                 "timm.layers.pool2d_same.AvgPool2dSame"):
        register_invariance_rule(name, Refuse(_SAME_PADDING))
    register_invariance_rule(nn.LayerNorm, Refuse(
        "layer norm over the trailing axes, which are spatial in a channels-first map"))
    for cls in (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d):
        register_invariance_rule(cls, ConvTransposeRule())
    register_invariance_rule(nn.Upsample, UpsampleRule())
    for cls in (nn.MultiheadAttention, nn.Flatten, nn.Unflatten):
        register_invariance_rule(cls, Refuse("it mixes or moves cells without a padding mask"))


_register_builtins()
