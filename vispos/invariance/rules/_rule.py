"""The rule types of padding invariance: what one module type, function or method does to the
cells of a padded batch (:class:`InvarianceRule` and the three a user registers most:
:class:`CellWise`, :class:`PaddingAware`, :class:`Refuse`), and :class:`RewriteStep`, every
operation a rule may ask of the rewriter.

A rule states its behaviour as data (cell-wise, with the facts the rewrite uses: aliasing, zeros
kept zero, non-negative output; reads neighbours through a window; per-item statistics; refused
with a reason) and rewrites its node through :meth:`InvarianceRule.apply`, the one entry point.

References:
    torch.ao.quantization ``backend_config`` (``BackendPatternConfig``: patterns registered as
    small config objects, the rewriter asks the table).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Protocol, runtime_checkable

import torch.fx as fx
from torch import Tensor, nn

from ...padding import Padding
from ..geometry._geometry import TransposedWindow, Window

__all__ = ["CellWise", "InvarianceRule", "PaddingAware", "Refuse", "RewriteStep"]


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

    def size_source(self, value: Any) -> int | None:
        """The geometry id of the feature map whose spatial sizes ``value`` (an argument of the
        node) lists in axis order (``skip.shape[-2:]``), or None: the rule may resize each item to
        its own size on that map."""

    def channel_view(self, node: fx.Node, batch: Any, channels: tuple, spatial: tuple) -> None:
        """``x.view(batch, *channels, *spatial)``: the channels split or merged, the map's own
        spatial sizes kept (read from it); refused otherwise."""

    def broadcast(self, node: fx.Node, geometry_id: int) -> None:
        """Run the node as it is: each item's own value spread over the cells of map
        ``geometry_id`` (``y.expand(b, c, h, w)`` with ``h, w`` read from that map)."""

    def resize(self, node: fx.Node, target: Any, fn: Callable[..., Tensor], *args: Any) -> None:
        """Replace the node by ``fn(x, padding, target_padding, *args)``, a map on the cells of
        ``target``: a geometry id (from :meth:`size_source`) or a window on the input's geometry."""

    def refuse(self, node: fx.Node, why: str) -> None:
        """Raise vispos' ``ValueError`` naming the node's layer."""


class InvarianceRule:
    """What one module type, function or method does to the cells of a padded batch.

    The rewriter binds a call's arguments by parameter name and calls :meth:`apply`. Class
    attributes state the facts the rewrite uses: ``alias`` (the output may be the input itself),
    ``zero_preserving`` (maps 0 to 0 cell-wise, so zeros written into the padding before it
    survive), ``nonnegative`` (output >= 0), ``fresh_output`` (a new map its backward does not
    read, which a fill may write into), ``reads_one_map`` (its feature map is its ``input``, the
    only feature map it takes), ``reads_sizes`` (it may take a size read from a feature map, which
    it resolves with :meth:`RewriteStep.size_source`: ``F.interpolate(x, size=skip.shape[-2:])``),
    ``signature`` (a callable whose parameters name a function or
    method call's arguments; None: the function's own) and ``attributes`` (the module attributes
    bound for a module call). ``kind`` names the rule in messages and tests.

    A subclass overrides :meth:`apply`, the one entry point (a module call finds the called module
    in ``args["module"]``), and :meth:`on_permuted` where it also runs on a map whose axes were
    permuted. ``zero_preserving`` is a claim about the class; the rewriter checks it on each
    call's own arguments (a module's attributes, a function's constants) by running the call on
    a zero cell, so ``nn.Hardtanh(0.5, 2)`` is not taken as zero preserving.
    """

    kind = "rule"
    alias: ClassVar[bool] = False
    zero_preserving: ClassVar[bool] = False
    nonnegative: ClassVar[bool] = False
    fresh_output: ClassVar[bool] = False
    reads_one_map: ClassVar[bool] = False
    reads_sizes: ClassVar[bool] = False
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
        ``"module"``: the called module, for a module call)."""
        raise NotImplementedError(f"{type(self).__name__} must define apply(step, node, args)")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "rewrite" in vars(cls) and "apply" not in vars(cls):  # the entry point of earlier releases
            warnings.warn(
                f"{cls.__qualname__}.rewrite(step, node, module) is deprecated; define apply(step, node, args) "
                "instead (the module is args['module'])", DeprecationWarning, stacklevel=2)

            def apply(self: InvarianceRule, step: RewriteStep, node: fx.Node, args: dict[str, Any]) -> None:
                self.rewrite(step, node, args.get("module"))

            cls.apply = apply

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
