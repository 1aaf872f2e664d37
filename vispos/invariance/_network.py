"""One public call that makes a whole network padding invariant: :func:`make_padding_invariant`.

The network (2D or 3D: a classifier, a U-Net, any module that maps a batch to maps or per-item
values) is traced with vispos' FX tracer (:mod:`vispos.invariance.tracing._trace`) in training and in
eval mode, each traced graph is checked against the network's own eager forward on a probe input,
and both graphs are rewritten by the rule book (:mod:`vispos.invariance.rewrite._rewrite`). The returned
:class:`PaddingInvariant` holds the network's own modules under their own names (its
``state_dict`` is the network's) and runs the rewritten graph through the same
:class:`~vispos.invariance.geometry._run.InvariantRunner` as the backbone adapters.

References:
    torch.fx (``Tracer``, ``GraphModule``); torchvision ``models/feature_extraction.py``
    (``create_feature_extractor``, ``DualGraphModule``); Carion et al., DETR, ECCV 2020 (padded
    batches, mask True = padding).
"""

from __future__ import annotations

import contextvars
import copy
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.fx as fx
from torch import Tensor, nn

from .. import _tracing
from .._checks import check_int
from ..nested_tensor import NestedTensor
from ._network_probe import (
    _MAX_PROBE, _check_trace, _EagerFails, _input_channels, _probe_input, _whole_graph_modules, check_items,
    choose_probe, suspects,
)
from .rewrite._flat import flat_forward, forget
from .rules import RuleBook, as_book

__all__ = ["PaddingInvariant", "make_graph_invariant", "make_padding_invariant"]


def _spatial_axes(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The convolutions of ``model`` (``(name, module)``, in ``modules()`` order)."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, nn.modules.conv._ConvNd)]


def _check_args(model: Any, num_axes: Any, return_nodes: Any, probe_size: Any, in_channels: Any,
                ) -> tuple[int, Any, Any]:
    """The arguments checked: ``(num_axes, return_nodes as a dict or None, probe_size as a tuple or
    None)``."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if isinstance(model, torch.jit.ScriptModule):
        raise TypeError("model must be a Python nn.Module, got a TorchScript module (torch.fx cannot trace it)")
    convs = _spatial_axes(model)
    if num_axes is None:
        if not convs:
            raise ValueError(
                f"num_axes=None reads the spatial axes from the first convolution, but {type(model).__name__} has "
                "none; pass num_axes (2 or 3)")
        num_axes = len(convs[0][1].kernel_size)
    else:
        num_axes = check_int(num_axes, "num_axes")
    if num_axes not in (2, 3):
        raise ValueError(f"num_axes must be 2 or 3, got {num_axes}")
    if convs and all(len(m.kernel_size) != num_axes for _, m in convs):
        name, conv = convs[0]
        raise ValueError(
            f"num_axes={num_axes}, but the convolutions of {type(model).__name__} have {len(conv.kernel_size)} spatial "
            f"axes (the first: {name}, {type(conv).__name__}); pass num_axes={len(conv.kernel_size)} or leave it None")
    check_int(in_channels, "in_channels", minimum=1, optional=True)
    nodes = None
    if return_nodes is not None:
        if isinstance(return_nodes, Mapping):
            nodes = dict(return_nodes)
        elif isinstance(return_nodes, Sequence) and not isinstance(return_nodes, str):
            nodes = {n: n for n in return_nodes}
        else:
            raise TypeError(
                "return_nodes must be a list of graph node names or a {node: output name} mapping, got "
                f"{type(return_nodes).__name__}")
        if not nodes or not all(isinstance(k, str) and isinstance(v, str) for k, v in nodes.items()):
            raise TypeError(f"return_nodes must be a non-empty list or mapping of str, got {return_nodes!r}")
    size = None
    if probe_size is not None:
        entries = [probe_size] * num_axes if isinstance(probe_size, int) and not isinstance(probe_size, bool) \
            else probe_size
        if not isinstance(entries, Sequence) or isinstance(entries, str) or not all(
                isinstance(s, int) and not isinstance(s, bool) for s in entries):
            raise TypeError(f"probe_size must be an int or a sequence of {num_axes} ints, got {probe_size!r}")
        if len(entries) != num_axes or any(s < 1 for s in entries):
            raise ValueError(f"probe_size must hold {num_axes} positive sizes (one per spatial axis), got {probe_size!r}")
        size = tuple(entries)
    return num_axes, nodes, size


#: the rule book a whole-model builder was called with: its own make_padding_invariant calls (the
#: backbone, the heads) ask it when they pass no book of their own
_WHOLE_MODEL_BOOK: contextvars.ContextVar[RuleBook | None] = contextvars.ContextVar("whole_model_book", default=None)


def make_padding_invariant(
    model: nn.Module,
    num_axes: int | None = None,
    return_nodes: Sequence[str] | Mapping[str, str] | None = None,
    probe_size: int | Sequence[int] | None = None,
    in_channels: int | None = None,
    rules: RuleBook | None = None,
) -> "PaddingInvariant":
    """``model`` as a module that gives every item of a padded batch what the model gives it alone.

    The model is traced with torch.fx (training and eval mode, each its own graph), each traced
    graph is run against the model's own eager forward on a random probe input (same weights, eval
    then training mode, dropout drawn alike on both sides, running statistics put back after), and
    every layer that mixes cells is rewritten by vispos' rule book: convolutions
    and pools see zeros / ``-inf`` outside each item, norms and global pools take statistics over
    each item's valid cells, up-samplings stay on the item's own cells.

    Args:
        model (nn.Module): a 2D or 3D network taking ``Tensor[B, C, *S]`` (MONAI's SegResNet,
            UNet, DynUNet, BasicUNet; a torchvision / timm classifier or segmenter; any module torch.fx
            traces). A whole detector the rule book holds a whole-model rule for (torchvision's Faster /
            Mask / Keypoint R-CNN, RetinaNet, FCOS; transformers' DETR and Conditional DETR) is
            wrapped as a whole (:mod:`vispos.invariance.models`): the returned module takes and
            returns what the model does (``return_nodes`` not given).
            Not copied: the returned module shares its submodules, parameters and buffers.
        num_axes (int, optional): spatial axes, 2 or 3. Default: those of the first convolution.
        return_nodes (list[str] | dict[str, str], optional): cut the graph at these torch.fx node
            names (torchvision's ``get_graph_node_names``; a module's name is its last node) and
            return ``{output name: value}``. Default: the model's own outputs.
        probe_size (int | sequence of int, optional): the spatial size of the probe input (two
            items, the model's dtype and device). Default: the smallest size that is a multiple of
            every total stride of the graph and leaves every feature map at least 2 cells per axis.
        in_channels (int, optional): the channels of the input. Default: those of the first
            convolution the traced forward runs.
        rules (RuleBook, optional): the rule book the tracer, the rewrite and the checks ask (for
            this call only: ``vispos.invariance.default_rules().copy()`` with entries of your own).
            Default: the global book (:func:`~vispos.invariance.default_rules`).

    Returns:
        PaddingInvariant: takes a :class:`~vispos.NestedTensor` (or ``tensors`` and a ``mask``,
        True = padding) and returns the model's output structure (a tensor, tuple, list or dict)
        with each feature map as a NestedTensor (its padding by convolution arithmetic; decoder
        maps up-sampled to the input's stride included) and each per-item value (a pooled
        classifier head, ``Tensor[B, ...]``) as a tensor computed from the item's own cells.

    Raises:
        TypeError: ``model`` is not an ``nn.Module`` (or is TorchScript); ``num_axes``,
            ``return_nodes``, ``probe_size``, ``in_channels`` or ``rules`` of the wrong type.
        ValueError: ``num_axes`` not 2 or 3, or None for a model without a convolution, or other
            than the spatial axes of every convolution of the model (both counts named); the
            input channels neither given nor read from a convolution of the graph; a
            ``probe_size`` of the wrong length or with a size below 1; a layer torch.fx cannot trace
            (named); a traced graph that differs from the eager forward in eval or training mode (the trace drops or changes
            code, such as a branch on ``torch.jit.isinstance``, ``if x.shape[...]`` or a value read
            outside the traced arguments), named with how; a layer that cannot be made exact
            (named, with what to do: ``return_nodes`` to cut before it, a registered rule); an
            output that is neither a feature map nor a per-item value; a value that the two probe
            items, padded in one batch, do not each get as without padding, in eval or in training
            mode (named with the likely causes: a hook, a norm without running statistics, an
            operation across the batch axis after a global pool); a return node not in the model;
            a model that cannot run at the probe size (pass ``probe_size`` or ``in_channels``).
            At a call of the returned module, see :class:`PaddingInvariant`.

    Note:
        The returned module follows the model it shares modules with: ``train()`` / ``eval()`` on
        either is seen by both, and a hook registered or removed on any module (or torch's global
        module hooks), a submodule replaced at any depth, or a module whose traced code branches on
        its mode put in another mode than the model is refused at the next call, naming it
        (call ``make_padding_invariant`` again on the model as it is then). While it traces, the
        rule book's tracing patches are on (``torch.jit.isinstance`` answers True for a traced
        value and ``Tensor``, process-wide as torch.fx's own patch of ``nn.Module.__call__``;
        MONAI's patches only on the MONAI modules that need them); all are restored before it
        returns or raises. Calls from several threads take turns (one lock); a thread that runs
        other modules meanwhile is not covered by it (torch.fx's own limitation).

    Example:
        >>> import torch, vispos
        >>> net = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU())
        >>> inv = vispos.make_padding_invariant(net)
        >>> out = inv(vispos.nested_tensor_from_tensor_list([torch.randn(1, 5, 7), torch.randn(1, 8, 4)]))
        >>> out.tensors.shape, out.mask.shape
        (torch.Size([2, 4, 8, 7]), torch.Size([2, 8, 7]))

    References:
        torch.fx; torchvision ``create_feature_extractor``; Carion et al., DETR, ECCV 2020.
    """
    from .tracing._policy import TRACE_LOCK

    book = as_book(rules if rules is not None else _WHOLE_MODEL_BOOK.get())
    from .models._rule import whole_model_rule

    whole = whole_model_rule(model, book) if return_nodes is None else None
    if whole is not None:  # a whole detector (vispos.invariance.models): the model's own call and outputs
        for arg, value in (("num_axes", num_axes), ("in_channels", in_channels)):
            if value is not None:
                raise ValueError(
                    f"make_padding_invariant wraps {type(model).__name__} as a whole model, which reads {arg} from "
                    f"its own parts; got {arg}={value!r}, expected None (or pass return_nodes to rewrite its graph)")
        token = _WHOLE_MODEL_BOOK.set(book)  # the parts the builder makes invariant ask the same book
        try:
            return whole.build(model, probe_size=probe_size)
        finally:
            _WHOLE_MODEL_BOOK.reset(token)
    with TRACE_LOCK:  # torch.fx patches nn.Module.__call__ process-wide while it traces
        return _build(model, num_axes, return_nodes, probe_size, in_channels, book)


def _refused(name: str, why: tuple[str, str], probe: tuple[int, ...], model: nn.Module) -> ValueError:
    mode, what = why
    return ValueError(
        f"make_padding_invariant cannot make {name} exact: the two probe items of size {probe} in a padded "
        f"batch ({mode} mode) do not get what they get without padding: {what}. Likely: {suspects(model)}")


def _build(model: nn.Module, num_axes: Any, return_nodes: Any, probe_size: Any, in_channels: Any,
           book: RuleBook) -> "PaddingInvariant":
    from .rewrite._rewrite_base import NETWORK_ADVICE, refusal_voice
    from .tokens._swin import refuse_swin
    from .tracing._follow import mode_dependent
    from .tracing._trace import UntraceableLayer, trace_features

    num_axes, nodes, probe = _check_args(model, num_axes, return_nodes, probe_size, in_channels)
    name = type(model).__name__
    with refusal_voice("make_padding_invariant", NETWORK_ADVICE):
        refuse_swin(model)
    attributes = set(vars(model))
    try:
        body = trace_features(model, num_axes, return_nodes=nodes, class_name=name, rules=book)
        whole = _whole_graph_modules(model, num_axes, book) if nodes is not None else None
    except UntraceableLayer as exc:
        raise ValueError(f"make_padding_invariant traces {name} with torch.fx, which fails: {exc}") from exc
    finally:  # torch.fx stores a tensor made in forward on the traced module (_tensor_constant*):
        for key in set(vars(model)) - attributes:  # the graph modules hold their own reference
            delattr(model, key)
    if whole is None:
        whole = {True: fx.GraphModule(body, copy.deepcopy(body.train_graph), name),
                 False: fx.GraphModule(body, copy.deepcopy(body.eval_graph), name)}
    if in_channels is None:
        in_channels = _input_channels(whole[False], whole[False].graph, num_axes)
        if in_channels is None:
            raise ValueError(f"{name} runs no {num_axes}D convolution on its input to read its channels from; pass "
                             "in_channels")
    modal = mode_dependent(whole[True].graph, whole[False].graph)
    refusal, runner = None, None
    try:
        with refusal_voice("make_padding_invariant", NETWORK_ADVICE):
            runner = make_graph_invariant(body, num_axes, per_item=True, rules=book)
    except ValueError as exc:
        refusal = exc
    if probe is None:
        probe = choose_probe(runner.geometry) if runner is not None else (32,) * num_axes
        if probe is None:
            raise ValueError(f"no probe size up to {_MAX_PROBE} fits every layer of {name}; pass probe_size")
    try:
        why = _check_trace(model, whole, _probe_input(model, in_channels, probe))
    except _EagerFails as fails:
        if refusal is not None:
            raise refusal
        exc = fails.error
        raise ValueError(
            f"{name} cannot run on a probe input of size {probe} with {in_channels} channels in {fails.mode} mode "
            f"({type(exc).__name__}: {exc}); pass a probe_size (or in_channels) it takes") from exc
    if why is not None:
        raise ValueError(
            f"make_padding_invariant cannot use the torch.fx trace of {name}: on a probe input of size {probe} "
            f"({why[0]} mode) {why[1]}. The trace drops or changes code of the forward (a branch on "
            "torch.jit.isinstance or on a tensor's value, a Python-side computation baked in as a constant); "
            "a graph that differs from the model is never run")
    if refusal is not None:
        raise refusal
    invariant = PaddingInvariant(model, body, runner, num_axes, in_channels, probe, modal)
    try:
        why = _check_items_precisely(model, invariant, _probe_input(model, in_channels, probe))
    except (RuntimeError, MemoryError) as exc:  # the probe's canvas (twice the probe size, in float64)
        if not isinstance(exc, MemoryError) and not any(
                s in str(exc) for s in ("can't allocate memory", "out of memory", "Out of memory")):
            raise
        raise ValueError(
            f"make_padding_invariant checks {name} on two probe items of size {probe} padded to twice that size, "
            f"in float64, and that does not fit in memory ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); "
            "pass a smaller probe_size") from exc
    if why is not None:
        raise _refused(name, why, probe, model)
    invariant.follow()  # the model as it was checked: any change after this is refused at a call
    return invariant


def _check_items_precisely(model: nn.Module, invariant: "PaddingInvariant", x: Tensor) -> tuple[str, str] | None:
    """:func:`check_items` in float64: a model in a lower precision is checked on a float64 copy of
    the wrapper, so that batch statistics in training mode, which amplify float32 rounding through a
    deep network (a ResNet-50 body: about 2e-4 relative), are not taken for a leak, while a leak
    (a hook, a layer not zero at zero: 1e-2 and more) still is. The copy is dropped after."""
    if x.dtype == torch.float64 or not x.is_floating_point():
        return check_items(model, invariant, x)
    try:
        wide = copy.deepcopy(invariant).double()
    except Exception:  # a module that cannot be copied or widened: checked in its own precision
        return check_items(model, invariant, x)
    return check_items(wide.__dict__["_model"], wide, x.double())


def make_graph_invariant(graph: fx.GraphModule, num_axes: int, inputs: Sequence[Any] | None = None,
                         per_item: bool = False, rules: RuleBook | None = None) -> Any:
    """Rewrites a traced network in place so that it runs exactly on padded batches, and returns the
    runner that feeds it each batch's paddings: the step :func:`make_padding_invariant` is built on,
    and the one the backbone adapters, the :class:`~vispos.backbones.Joiner`'s projections and
    :mod:`vispos.monai`'s UNETR decoder take after tracing (:func:`trace_features`).

    Every node of both graphs (a :class:`ModeGraphModule`'s training and eval graph, or a plain
    ``GraphModule``'s one) is looked up in the rule book (:func:`rule_for`): convolutions and pools
    read zeros / ``-inf`` outside each item, norms and global pools take statistics over each
    item's valid cells, up-samplings stay on the item's own cells, and each map's padding follows
    from convolution arithmetic on the items' boxes.

    Args:
        graph (fx.GraphModule): a traced network (:func:`trace_features`, :func:`trace_dual`) whose
            first input is the batch ``Tensor[B, C, *S]``; rewritten in place (the graph's code, not
            its modules: parameters, buffers and ``state_dict`` keys stay as they are).
        num_axes (int): the number of spatial axes, 2 or 3.
        inputs (sequence, optional): what each input of the graph is, in order: None (not a map),
            ``()`` (the batch whose padding the runner is given) or a tuple of
            :class:`Window` (a map on the cells those windows make of the batch: a ViT's token map
            is one patch-sized window). Default: the first input is the batch, the others are not
            maps.
        per_item (bool): also accept outputs without spatial axes that are each item's own (a
            pooled classifier head, ``Tensor[B, ...]``) or that do not depend on the input.
            Default False: every output must be a feature map.
        rules (RuleBook, optional): the rule book to ask. Default: the global one.

    Returns:
        InvariantRunner: ``runner(graph, x)`` runs the graph of ``graph.training``'s mode on a
        :class:`~vispos.NestedTensor` ``x`` and returns each output map as a NestedTensor with
        its padding (True = padding); ``runner.paddings(padding)`` gives every map's padding.

    Raises:
        ValueError: a layer that cannot be made exact, or an argument the rules cannot read (named,
            with its graph node); an output that is neither a feature map nor (with ``per_item``) a
            per-item value.

    References:
        torch.fx (``GraphModule``); Dumoulin and Visin, A guide to convolution arithmetic for deep
        learning, 2016; Carion et al., DETR, ECCV 2020 (padded batches, mask True = padding).
    """
    from .tracing._trace import make_invariant

    return make_invariant(graph, num_axes, inputs=inputs, per_item=per_item, rules=as_book(rules))


class PaddingInvariant(nn.Module):
    """A network made padding invariant by :func:`make_padding_invariant` (build it with that).

    Holds the network's own children, parameters and buffers under their own names (shared, not
    copied: its ``state_dict`` is the network's, keys and tensors), and runs the network's
    rewritten torch.fx graph of the current mode. Its mode is the network's: ``training`` reads
    the network's own flag, ``train()`` / ``eval()`` on either one switch both (and the graph).
    At each call it checks that the network is as it was wrapped (see
    :func:`make_padding_invariant`'s note), in a few microseconds.

    Attributes:
        num_axes (int): spatial axes. in_channels (int): the input channels.
        probe_size (tuple[int, ...]): the size the trace was checked at.
        training (bool): the network's own training flag (read and set through).

    Shape:
        - input: NestedTensor ``(B, in_channels, *S)`` (each item at the origin of its box, or at
          an offset that is a multiple of every stride), or ``tensors`` and ``mask`` ``(B, *S)``
          bool, True = padding.
        - output: the network's output structure; a feature map ``(B, C, *S_l)`` as a NestedTensor,
          a per-item value ``(B, ...)`` as a tensor.

    Raises:
        TypeError: (forward) ``x`` neither a NestedTensor nor a tensor; a mask with a NestedTensor.
        ValueError: (forward) ``x`` of another rank or channel count; an arbitrary (non-box) mask;
            an item whose offset is not a multiple of the strides, or too small for the network; a
            hooked module the graph does not call.
        RuntimeError: (forward) the network changed since it was wrapped: a hook registered or
            removed on one of its modules (or a global module hook), a submodule replaced or
            removed, a module whose traced code branches on its mode in another mode than the
            network; the message names the module and what changed.
    """

    def __init__(self, model: nn.Module, body: nn.Module, runner: Any, num_axes: int, in_channels: int,
                 probe_size: tuple[int, ...], mode_paths: Sequence[str] = ()) -> None:
        super().__init__()
        for child_name, child in model.named_children():
            self.add_module(child_name, child)
        for param_name, param in model.named_parameters(recurse=False):
            self.register_parameter(param_name, param)
        for buffer_name, buffer in model.named_buffers(recurse=False):
            self.register_buffer(buffer_name, buffer, persistent=buffer_name not in model._non_persistent_buffers_set)
        for graph in (body.train_graph, body.eval_graph):  # tensors the forward makes (torch.fx's constants)
            for node in graph.nodes:
                if node.op == "get_attr" and "." not in node.target and not hasattr(self, node.target):
                    value = getattr(body, node.target)
                    if isinstance(value, Tensor):  # moved by to() / float(), kept out of the state_dict
                        self.register_buffer(node.target, value, persistent=False)
                    else:
                        self.__dict__[node.target] = value
        self.__dict__["_body"] = body  # the graphs' code only: it runs with ``self`` as its module
        self._runner = runner
        self.network = type(model).__name__
        self.num_axes, self.in_channels, self.probe_size = num_axes, in_channels, tuple(probe_size)
        self.__dict__["_mode_paths"] = tuple(mode_paths)
        self.__dict__["_state"] = None  # set by follow(), once the wrapped network was checked
        self.__dict__["_model"] = model  # the network whose flag is this module's (not a child)

    @property
    def training(self) -> bool:  # type: ignore[override]
        model = self.__dict__.get("_model")
        return model.training if model is not None else self.__dict__.get("_training", True)

    @training.setter
    def training(self, mode: bool) -> None:
        model = self.__dict__.get("_model")
        if model is not None:
            model.training = mode
        else:  # nn.Module.__init__ sets it before the network is known
            self.__dict__["_training"] = mode

    def follow(self) -> "PaddingInvariant":
        """Records the network as it is now (module tree, hooks, modes of the modules whose traced
        code branches on the mode): each later call refuses any change to it. Returns ``self``."""
        from .tracing._follow import ModelState

        state = ModelState(self.__dict__["_model"], self.__dict__["_mode_paths"])
        state.also_follow(self)
        self.__dict__["_state"] = state
        forget(self)  # the modules as they are now: looked up again
        return self

    def extra_repr(self) -> str:
        return f"network={self.network}, num_axes={self.num_axes}, probe_size={self.probe_size}"

    def _graph_forward(self, tensors: Tensor, paddings: Any = None) -> Any:
        body = self.__dict__["_body"]
        if self.__dict__["_state"] is not None and not _tracing.tracing():  # each call refuses a replaced module
            forward, modules = flat_forward(self, body.graph)
            return forward(modules, tensors, paddings)
        return type(body).forward(self, tensors, paddings)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(super().__getstate__())
        state.pop("_flat_graphs", None)  # compiled code of this object's modules: a copy builds its own
        return state

    def forward(self, x: NestedTensor | Tensor, mask: Tensor | None = None) -> Any:
        from .tracing._mode_graphs import check_graph_hooks

        if isinstance(x, NestedTensor):
            if mask is not None:
                raise TypeError("mask is given by the NestedTensor itself; pass mask only with a plain tensor")
        elif isinstance(x, Tensor):
            x = NestedTensor(x, mask)
        else:
            raise TypeError(f"x must be a NestedTensor or a Tensor (B, C, *S), got {type(x).__name__}")
        tensors = x.tensors
        if tensors.dim() != 2 + self.num_axes or tensors.shape[1] != self.in_channels:
            axes = ", ".join("DHW"[-self.num_axes:])
            raise ValueError(f"x must have shape (B, {self.in_channels}, {axes}), got {tuple(tensors.shape)}")
        body, training = self._body, self.training
        if body.training != training:  # the graph of this mode (the submodules keep theirs)
            body.graph = body.train_graph if training else body.eval_graph
            body.training = training
        state = self.__dict__["_state"]
        if state is None:
            check_graph_hooks(body, "make_padding_invariant")
        elif not _tracing.tracing():
            changed = state.changed(training)
            if changed is not None:
                raise RuntimeError(
                    f"make_padding_invariant wrapped {self.network}, and since then {changed}. The rewritten graph "
                    "and its checks are those of the network as it was wrapped: call "
                    "vispos.make_padding_invariant(model) again on the network as it is now (its probe checks the "
                    "change), or undo the change")
        return self._runner.run(self._graph_forward, x, training, structured=True)
