"""The rule book of padding invariance: one open table, keyed by what a node of the traced graph
calls (a module class, a function such as ``F.conv2d`` or ``torch.cat``, or a method name such as
``"permute"``), and the public registration that lets a user add their own entries.

Each entry is a small rule object that states its behaviour as data (cell-wise, with the facts
the rewrite uses: aliasing, zeros kept zero, non-negative output; reads neighbours through a
window; per-item statistics; refused with a reason) and rewrites its node through the few
operations of :class:`RewriteStep`. The rewriter binds the call's arguments by parameter name
before it asks the rule (:meth:`InvarianceRule.apply`): a module call from the module's
attributes (``weight``, ``stride``, ``padding``, ...) and its ``forward``'s arguments, a function
or method call by the rule's :attr:`~InvarianceRule.signature` (or the function's own), so
``nn.Conv2d`` and ``F.conv2d`` share one rule object. The rewriter of
:mod:`vispos.invariance.rewrite._rewrite` only walks the graph and asks this table; a call without an
entry is refused by name, never run inexactly. A module rule applies to the registered class and
to subclasses that keep its ``forward``. Every built-in entry is registered in one place,
:mod:`vispos.invariance.rules._builtin`.

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
    torch.ao.quantization ``backend_config`` (``BackendPatternConfig``: one table keyed by module
    classes, functions and method names, patterns registered as small config objects);
    torchvision ``models/feature_extraction.py`` and timm ``register_notrace_module`` (the caller
    names its leaf modules).
"""

from __future__ import annotations

import threading
import types
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Protocol, runtime_checkable

import torch
import torch.fx as fx
from torch import Tensor, nn

from ... import _deprecation
from ...padding import Padding
from ..geometry._geometry import TransposedWindow, Window

__all__ = [
    "InvarianceRule", "RewriteStep", "CellWise", "PaddingAware", "Refuse", "register_invariance_rule",
    "rule_for", "rule_for_call", "classify_module", "registered_functions",
]


@runtime_checkable
class RewriteStep(Protocol):
    """Every operation a rule may ask of the rewriter for its node (the rewriter implements it);
    ``num_axes`` is the number of spatial axes of the graph's feature maps (2 or 3). The node's
    feature map is its first argument (or the keyword ``input``)."""

    num_axes: int

    def cell_wise(self, node: fx.Node, alias: bool = False) -> None:
        """Run the node as it is: each output cell reads the same cell of its inputs. With
        ``alias`` the output may be the input itself (never written in place)."""

    def window(self, node: fx.Node, window: Window | TransposedWindow, fill: str) -> None:
        """Fill the input's padding (``"zero"``; ``"max"``: ``-inf``; ``"edge"``: each item's edge
        values) and run the node as it is, a sliding or transposed window with a new geometry."""

    def avg_pool(self, node: fx.Node, window: Window, count_include_pad: bool, divisor: int | None) -> None:
        """Average pooling through ``window``: window sums over zeros in the padding, each item's own
        divisor (``count_include_pad``, ``divisor``: torch's ``divisor_override``)."""

    def global_pool(self, node: fx.Node, mode: str, keepdim: bool = True) -> None:
        """Per-item statistics over every spatial axis of the input (a map in any axis order):
        ``mode`` is ``"mean"``, ``"sum"``, ``"max"`` or ``"norm"`` (L2), over each item's own cells."""

    def with_padding(self, node: fx.Node, fn: Callable[..., Tensor], *args: Any, keeps_geometry: bool = True) -> None:
        """Replace the node by ``fn(x, padding, *args)``: ``padding`` is the input map's
        :class:`~vispos.Padding` (None without padding); ``args`` may hold the graph's nodes. With
        ``keeps_geometry`` the output is a feature map on the input's cells, else a per-item value."""

    def norm(self, node: fx.Node) -> None:
        """A batch / group / instance norm module with statistics over valid cells."""

    def padding_aware(self, node: fx.Node) -> None:
        """The module's :class:`PaddingAware` function, called with the input map's padding."""

    def module_ref(self, node: fx.Node) -> fx.Node:
        """A node reading the module ``node`` calls (an argument for :meth:`with_padding`)."""

    def kernel_size(self, weight: Any, node: fx.Node) -> tuple[int, ...]:
        """The spatial kernel size of a convolution's ``weight`` (a tensor or a node of the graph)."""

    def permute(self, node: fx.Node, dims: Any) -> None:
        """A new axis order of the same cells (the batch axis first); refused otherwise."""

    def split(self, node: fx.Node) -> None:
        """A split of the input map along its channels: every part keeps the input's cells."""

    def getitem(self, node: fx.Node) -> None:
        """``x[index]``: one part of a channel split, or a channel selection of a map."""

    def refuse(self, node: fx.Node, why: str) -> None:
        """Raise vispos' ``ValueError`` naming the node's layer."""


class InvarianceRule:
    """What one module type, function or method does to the cells of a padded batch.

    The rewriter binds a call's arguments by parameter name and calls :meth:`apply`. Class
    attributes state the facts the rewrite uses: ``alias`` (the output may be the input itself),
    ``zero_preserving`` (maps 0 to 0 cell-wise, so zeros written into the padding before it
    survive), ``nonnegative`` (output >= 0), ``fresh_output`` (a new map its backward does not
    read, which a fill may write into), ``reads_one_map`` (its feature map is its ``input``, the
    only feature map it takes), ``signature`` (a callable whose parameters name a function or
    method call's arguments; None: the function's own) and ``attributes`` (the module attributes
    bound for a module call). ``kind`` names the rule in messages and tests.

    A subclass overrides :meth:`apply` (or, for a module rule, :meth:`rewrite`, which gets the
    module), and :meth:`on_permuted` where it also runs on a map whose axes were permuted.
    """

    kind = "rule"
    alias: ClassVar[bool] = False
    zero_preserving: ClassVar[bool] = False
    nonnegative: ClassVar[bool] = False
    fresh_output: ClassVar[bool] = False
    reads_one_map: ClassVar[bool] = False
    signature: ClassVar[Callable | None] = None
    attributes: ClassVar[tuple[str, ...]] = ()

    def module_arguments(self, module: nn.Module) -> dict[str, Any]:
        """The arguments of a module call read from the module (``attributes``; None where missing)."""
        return {name: getattr(module, name, None) for name in self.attributes}

    def refusal(self) -> str | None:
        """Why every call is refused, or None when the rule runs calls."""
        return None

    def apply(self, step: RewriteStep, node: fx.Node, args: dict[str, Any]) -> None:
        """Rewrites ``node`` through ``step``; ``args`` holds the call's arguments by name (with
        ``"module"``: the called module, for a module call). Default: :meth:`rewrite`."""
        self.rewrite(step, node, args.get("module"))

    def rewrite(self, step: RewriteStep, node: fx.Node, module: nn.Module | None) -> None:
        """Rewrites a module's node (``module``: the module; None for a function or method)."""
        raise NotImplementedError

    def on_permuted(self, step: RewriteStep, node: fx.Node, args: dict[str, Any], layout: tuple[int, ...]) -> None:
        """Rewrites ``node`` on a map whose axes were permuted (``layout``: the channels-first axis of
        each tensor axis). Default: refused, with the rule's own reason if it has one."""
        step.refuse(node, self.refusal() or "it runs on a feature map whose axes were permuted (channels last), "
                                            "with no rule for it")


@dataclass(frozen=True)
class CellWise(InvarianceRule):
    """The call reads each cell alone (any function of one cell's channels: an activation, a
    per-channel affine map, a 1x1 projection, per-sample dropout, a sum of maps). Nothing to do.

    Args:
        alias (bool): the call may return its input itself (Identity, dropout in eval): never
            written in place.
        zero_preserving (bool): maps 0 to 0 (ReLU, GELU, tanh, dropout): zeros written into the
            padding before it are still zeros after it, so the window after it needs no fill.
        nonnegative (bool): its output is >= 0 (ReLU): a 0 in the padding never wins a max pool.
        fresh_output (bool): its output is a new tensor its backward does not read (a sum), which
            the rewrite may write zeros into.

    Raises:
        TypeError: a flag is not a bool.

    References:
        torch.ao.quantization's ``BackendPatternConfig`` (rules registered per pattern, the
        rewriter asks the table); torchvision ``models/feature_extraction.py`` (leaf modules).
    """

    alias: bool = False
    zero_preserving: bool = False
    nonnegative: bool = False
    fresh_output: bool = False
    kind = "pointwise"

    def __post_init__(self) -> None:
        for name in ("alias", "zero_preserving", "nonnegative", "fresh_output"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"CellWise: {name} must be a bool, got {type(getattr(self, name)).__name__}")

    def apply(self, step: RewriteStep, node: fx.Node, args: dict[str, Any]) -> None:
        step.cell_wise(node, alias=self.alias)

    def rewrite(self, step: RewriteStep, node: fx.Node, module: nn.Module | None) -> None:
        step.cell_wise(node, alias=self.alias)

    def on_permuted(self, step: RewriteStep, node: fx.Node, args: dict[str, Any], layout: tuple[int, ...]) -> None:
        step.cell_wise(node, alias=self.alias)


@dataclass(frozen=True)
class PaddingAware(InvarianceRule):
    """The module becomes ``fn(module, x, padding)``, a function that gets the input map's padding
    and returns, on each item's cells, what the module gives the item alone (statistics over
    valid cells, say). ``padding`` is a :class:`~vispos.Padding` of shape ``(B, *S)`` (True =
    padding), or None when the batch has no padding (then ``fn`` must run the module as it is).
    A module rule only (the function is looked up by the module's type when the graph runs).

    Args:
        fn (callable): ``fn(module, x: Tensor[B, C, *S], padding: Padding | None) -> Tensor[B, C', *S]``.

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

    def apply(self, step: RewriteStep, node: fx.Node, args: dict[str, Any]) -> None:
        step.padding_aware(node)

    def rewrite(self, step: RewriteStep, node: fx.Node, module: nn.Module | None) -> None:
        step.padding_aware(node)


@dataclass(frozen=True)
class Refuse(InvarianceRule):
    """The call cannot be made exact: the network is refused when it is rewritten, with ``why``.

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

    def refusal(self) -> str | None:
        return self.why

    def apply(self, step: RewriteStep, node: fx.Node, args: dict[str, Any]) -> None:
        step.refuse(node, self.why)

    def rewrite(self, step: RewriteStep, node: fx.Node, module: nn.Module | None) -> None:
        step.refuse(node, self.why)


# ---------------------------------------------------------------------------------- the table
#: the one table: a module class or ``"module.QualName"``, a function, or a method name -> its rule
_RULES: dict[Any, InvarianceRule] = {}
_LOCK = threading.Lock()
_KEY_ERROR = ("key must be an nn.Module subclass, a function, a tensor method's name (a str such as 'permute', "
              "or torch.Tensor.permute) or a dotted 'module.QualName' of a class or function")


def _dotted(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}"


def table_key(key: Any) -> Any:
    """The table's key for what a user names: a class or function as it is, a tensor method (by
    name or as ``torch.Tensor.name``) by its name, a dotted name as it is.

    Raises:
        TypeError: ``key`` is none of these.
    """
    if isinstance(key, str):
        if "." in key or key.isidentifier():
            return key
        raise TypeError(f"{_KEY_ERROR}, got {key!r}")
    if isinstance(key, type):
        if issubclass(key, nn.Module):
            return key
        raise TypeError(f"{_KEY_ERROR}, got {key!r}")
    if callable(key):
        name = getattr(key, "__name__", None)
        if isinstance(name, str) and getattr(torch.Tensor, name, None) is key:
            return name  # torch.Tensor.permute: the method "permute"
        return key
    raise TypeError(f"{_KEY_ERROR}, got {type(key).__name__}")


@_deprecation.renamed_kwargs(module_type="key")
def register_invariance_rule(key: type | Callable | str, rule: InvarianceRule) -> None:
    """Registers how ``padding_invariant=True`` runs what a graph node calls: a module type, a
    function, or a tensor method. The rule is :class:`CellWise`, :class:`PaddingAware` (modules),
    :class:`Refuse` or any :class:`InvarianceRule`.

    One table holds every entry, the built-in ones included (convolutions, pools, norms,
    activations, ``torch.cat``, ``x.mean``, ...). A registered module type is also kept whole (a
    leaf) when vispos traces a network; its rule applies to the type and its subclasses that do
    not override ``forward``. A function is matched by identity (or by its dotted name), a method
    by its name. A registered Python function of your own (not one of torch's) is kept whole too:
    one node of the traced graph wherever a module's ``forward`` calls it by its name, with no
    ``torch.fx.wrap`` (torch.fx's ``autowrap_functions``). Registering a key again replaces its
    rule. Safe to call from several threads.

    Args:
        key (type, callable or str): an ``nn.Module`` subclass; a function called in a forward
            (``my_act``, ``F.conv2d``); a tensor method's name (``"permute"``, or
            ``torch.Tensor.permute``); or the dotted ``"module.QualName"`` of a class or function
            of a package not imported. ``module_type=`` is the deprecated keyword.
        rule (InvarianceRule): the rule.

    Raises:
        TypeError: ``key`` is none of these (say a non-module class or a str that is neither a
            name nor dotted), or ``rule`` is not an :class:`InvarianceRule`, or a
            :class:`PaddingAware` rule for a key that is not a module class.

    References:
        torch.ao.quantization's ``BackendPatternConfig`` (rules registered per pattern: module,
        function or method; the rewriter asks the table); torchvision
        ``models/feature_extraction.py`` (leaf modules).

    Example:
        >>> import torch
        >>> import vispos
        >>> from torch import nn
        >>> class Gate(nn.Module):
        ...     def forward(self, x):
        ...         return x * x.sigmoid()
        >>> vispos.register_invariance_rule(Gate, vispos.CellWise())
        >>> def gate(x):
        ...     return x * torch.sigmoid(x)
        >>> vispos.register_invariance_rule(gate, vispos.CellWise())
    """
    table = table_key(key)
    if not isinstance(rule, InvarianceRule):
        raise TypeError(f"rule must be an InvarianceRule (CellWise, PaddingAware, Refuse, ...), got "
                        f"{type(rule).__name__}")
    if isinstance(rule, PaddingAware) and not (isinstance(table, type) or (isinstance(table, str) and "." in table)):
        raise TypeError(f"rule: PaddingAware(fn) calls fn(module, x, padding), so its key must be an nn.Module "
                        f"subclass, got {key!r}")
    with _LOCK:
        _RULES[table] = rule


def registered_functions() -> tuple[Callable, ...]:
    """The registered keys that are plain Python functions outside torch (a user's ``my_act``),
    which vispos' tracer hands to torch.fx's ``Tracer(autowrap_functions=...)`` so that each stays
    one call in the traced graph (as ``torch.fx.wrap`` would make it).

    Returns:
        tuple of functions: a snapshot of the table, taken under its lock (empty until a user
        registers a function of their own: every built-in function key is torch's or a builtin).
    """
    with _LOCK:
        keys = list(_RULES)
    return tuple(k for k in keys if isinstance(k, types.FunctionType)
                 and not str(getattr(k, "__module__", "") or "").startswith("torch"))


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


def rule_for_call(op: str, target: Any, module: nn.Module | None = None) -> InvarianceRule | None:
    """The table's rule for a graph node: ``op`` is the node's ``"call_module"`` (``module`` the
    module called), ``"call_function"`` (``target`` the function) or ``"call_method"`` (``target``
    the method's name). None when no entry applies."""
    if op == "call_module":
        return rule_for(module)
    if op == "call_function":
        if isinstance(target, type) and issubclass(target, nn.Module):
            return None
        try:
            rule = _RULES.get(target)
        except TypeError:  # an unhashable target
            rule = None
        return rule if rule is not None else _RULES.get(_dotted(target))
    if op == "call_method" and isinstance(target, str) and "." not in target:
        return _RULES.get(target)
    return None


@_deprecation.renamed_kwargs(n_spatial="num_axes")
def classify_module(m: nn.Module, num_axes: int = 2) -> tuple[str, Any]:
    """``(kind, rule)`` of a module, what the tracer reads to keep a module whole: ``"refuse"`` when
    no rule applies (the tracer opens the module and the rewrite judges what it calls), else the
    rule's kind (``"refused"`` for a rule that refuses every call: kept whole, so its refusal
    names it)."""
    rule = rule_for(m)
    if rule is None:
        return "refuse", Refuse("a module vispos does not know how to run on a padded batch (no rule for it; "
                                "see vispos.register_invariance_rule)")
    return ("refused" if rule.refusal() is not None else rule.kind), rule
