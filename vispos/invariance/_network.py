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

import contextlib
import copy
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.fx as fx
from torch import Tensor, nn
from torch.utils import _pytree as pytree

from ..nested_tensor import NestedTensor
from ._network_probe import (
    _MAX_PROBE, _check_trace, _differs, _EagerFails, _modes, _probe_input, _restore, _whole_graph_modules, choose_probe,
)

__all__ = ["PaddingInvariant", "make_graph_invariant", "make_padding_invariant"]


def _first_conv(model: nn.Module) -> nn.Module | None:
    return next((m for m in model.modules() if isinstance(m, nn.modules.conv._ConvNd)), None)


def _check_args(model: Any, num_axes: Any, return_nodes: Any, probe_size: Any) -> tuple[int, int, Any, Any]:
    """The arguments checked: ``(num_axes, in_channels, return_nodes as a dict or None,
    probe_size as a tuple or None)``."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if isinstance(model, torch.jit.ScriptModule):
        raise TypeError("model must be a Python nn.Module, got a TorchScript module (torch.fx cannot trace it)")
    conv = _first_conv(model)
    if num_axes is None:
        if conv is None:
            raise ValueError(
                f"num_axes=None reads the spatial axes from the first convolution, but {type(model).__name__} has "
                "none; pass num_axes (2 or 3)")
        num_axes = len(conv.kernel_size)
    elif isinstance(num_axes, bool) or not isinstance(num_axes, int):
        raise TypeError(f"num_axes must be an int (2 or 3) or None, got {type(num_axes).__name__}")
    if num_axes not in (2, 3):
        raise ValueError(f"num_axes must be 2 or 3, got {num_axes}")
    if conv is None:
        raise ValueError(f"{type(model).__name__} has no convolution to read its input channels from")
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
    return num_axes, conv.in_channels, nodes, size


#: MONAI's U-Net decoder block: its skip concatenation is guarded by ``torch.jit.isinstance``
_UPCAT = "monai.networks.nets.basic_unet.UpCat"


#: held by each call of make_padding_invariant: calls from several threads trace and check one at a
#: time, so each restores the torch.jit.isinstance it replaced (never another call's patch), and no
#: call runs its eager check while another traces (torch.fx patches nn.Module.__call__ process-wide)
_PATCH_LOCK = threading.RLock()


@contextlib.contextmanager
def _traceable(model: nn.Module):
    """While tracing ``model``: ``torch.jit.isinstance(value, torch.Tensor)`` is True for a traced
    value (an ``fx.Proxy``), as it is for the tensor it stands for (MONAI's ``UpCat`` branches on
    it: without this the trace drops its skip concatenation), and each ``UpCat``'s ``is_pad`` is
    off (its one-cell replicate pad after an odd size was halved reads shapes in Python; with sizes
    divisible by the total stride it never pads, and other sizes are refused when run, since the
    two maps it concatenates then differ). Both are restored after, under a process-wide lock (the
    patch is global: another thread calling ``torch.jit.isinstance`` meanwhile gets the same answers
    for anything but a traced value; another thread running ``model`` meanwhile would not pad)."""
    with _PATCH_LOCK:
        with _patched(model):
            yield


@contextlib.contextmanager
def _patched(model: nn.Module):
    real = torch.jit.isinstance

    def isinstance_(obj: Any, target_type: Any) -> bool:
        if isinstance(obj, fx.Proxy) and target_type is torch.Tensor:
            return True
        return real(obj, target_type)

    upcats = [m for m in model.modules()
              if f"{type(m).__module__}.{type(m).__qualname__}" == _UPCAT and getattr(m, "is_pad", False)]
    try:
        torch.jit.isinstance = isinstance_
        for m in upcats:
            m.is_pad = False
        yield
    finally:
        torch.jit.isinstance = real
        for m in upcats:
            m.is_pad = True


def make_padding_invariant(
    model: nn.Module,
    num_axes: int | None = None,
    return_nodes: Sequence[str] | Mapping[str, str] | None = None,
    probe_size: int | Sequence[int] | None = None,
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
            UNet, DynUNet, BasicUNet; a torchvision / timm classifier; any module torch.fx traces).
            Not copied: the returned module shares its submodules, parameters and buffers.
        num_axes (int, optional): spatial axes, 2 or 3. Default: those of the first convolution.
        return_nodes (list[str] | dict[str, str], optional): cut the graph at these torch.fx node
            names (torchvision's ``get_graph_node_names``; a module's name is its last node) and
            return ``{output name: value}``. Default: the model's own outputs.
        probe_size (int | sequence of int, optional): the spatial size of the probe input (two
            items, the model's dtype and device). Default: the smallest size that is a multiple of
            every total stride of the graph and leaves every feature map at least 2 cells per axis.

    Returns:
        PaddingInvariant: takes a :class:`~vispos.NestedTensor` (or ``tensors`` and a ``mask``,
        True = padding) and returns the model's output structure (a tensor, tuple, list or dict)
        with each feature map as a NestedTensor (its padding by convolution arithmetic; decoder
        maps up-sampled to the input's stride included) and each per-item value (a pooled
        classifier head, ``Tensor[B, ...]``) as a tensor computed from the item's own cells.

    Raises:
        TypeError: ``model`` is not an ``nn.Module`` (or is TorchScript); ``num_axes``,
            ``return_nodes`` or ``probe_size`` of the wrong type.
        ValueError: ``num_axes`` not 2 or 3, or None for a model without a convolution; a
            ``probe_size`` of the wrong length or with a size below 1; a layer torch.fx cannot trace
            (named); a traced graph that differs from the eager forward in eval or training mode (the trace drops or changes
            code, such as a branch on ``torch.jit.isinstance``, ``if x.shape[...]`` or a value read
            outside the traced arguments), named with how; a layer that cannot be made exact
            (named); an output that is neither a feature map nor a per-item value; a value that the
            two probe items, padded in one batch, do not each get as alone (an operation across the
            batch axis after a global pool, which the rule book does not see); a return node
            not in the model; a model that cannot run at the probe size (pass ``probe_size``).

    Note:
        While it traces, ``torch.jit.isinstance`` answers True for a traced value and ``Tensor``
        (process-wide: torch.fx itself patches ``nn.Module.__call__`` process-wide while tracing),
        and MONAI ``UpCat.is_pad`` is off; both are restored before it returns or raises. Calls
        from several threads take turns (one lock); a thread that runs other modules meanwhile is
        not covered by it (torch.fx's own limitation).

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
    with _PATCH_LOCK:  # torch.fx patches nn.Module.__call__ process-wide while it traces
        return _build(model, num_axes, return_nodes, probe_size)


def _build(model: nn.Module, num_axes: Any, return_nodes: Any, probe_size: Any) -> "PaddingInvariant":
    from .tokens._swin import refuse_swin
    from .tracing._trace import UntraceableLayer, trace_features

    num_axes, in_channels, nodes, probe = _check_args(model, num_axes, return_nodes, probe_size)
    name = type(model).__name__
    refuse_swin(model)
    attributes = set(vars(model))
    try:
        with _traceable(model):
            body = trace_features(model, num_axes, return_nodes=nodes, class_name=name)
            whole = _whole_graph_modules(model, num_axes) if nodes is not None else None
    except UntraceableLayer as exc:
        raise ValueError(f"make_padding_invariant traces {name} with torch.fx, which fails: {exc}") from exc
    finally:  # torch.fx stores a tensor made in forward on the traced module (_tensor_constant*):
        for key in set(vars(model)) - attributes:  # the graph modules hold their own reference
            delattr(model, key)
    if whole is None:
        whole = {True: fx.GraphModule(body, copy.deepcopy(body.train_graph), name),
                 False: fx.GraphModule(body, copy.deepcopy(body.eval_graph), name)}
    refusal, runner = None, None
    try:
        runner = make_graph_invariant(body, num_axes, per_item=True)
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
            f"{name} cannot run on a probe input of size {probe} in {fails.mode} mode ({type(exc).__name__}: "
            f"{exc}); pass a probe_size it takes") from exc
    if why is not None:
        raise ValueError(
            f"make_padding_invariant cannot use the torch.fx trace of {name}: on a probe input of size {probe} "
            f"({why[0]} mode) {why[1]}. The trace drops or changes code of the forward (a branch on "
            "torch.jit.isinstance or on a tensor's value, a Python-side computation baked in as a constant); "
            "a graph that differs from the model is never run")
    if refusal is not None:
        raise refusal
    invariant = PaddingInvariant(model, body, runner, num_axes, in_channels, probe)
    why = _check_items(model, invariant, _probe_input(model, in_channels, probe))
    if why is not None:
        raise ValueError(
            f"make_padding_invariant cannot make {name} exact: the two probe items of size {probe} in a padded "
            f"batch (eval mode) do not each get what they get alone: {why}. A value computed "
            "across the batch's items (a mean, softmax, flip or index over the batch axis after a global pool) "
            "is not each item's own")
    return invariant


def make_graph_invariant(graph: fx.GraphModule, num_axes: int, inputs: Sequence[Any] | None = None,
                         per_item: bool = False) -> Any:
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

    return make_invariant(graph, num_axes, inputs=inputs, per_item=per_item)


@torch.no_grad()
def _check_items(model: nn.Module, invariant: "PaddingInvariant", x: Tensor) -> str | None:
    """None when each item of ``x`` (two probe items), at the origin of a canvas twice its size with
    a fill around it, gets from ``invariant`` (eval mode) what it gets alone (no padding: the graph
    that was checked against the eager forward), else why
    not: the rule book checks each layer on maps; this catches what follows a global pool (values
    without spatial axes are not rewritten), such as an operation across the batch axis."""
    from ..padding import Padding

    modes, training = _modes(model), invariant.training
    size = tuple(x.shape[2:])
    canvas = tuple(2 * s for s in size)
    tensors = x.new_full((x.shape[0], x.shape[1], *canvas), 3.0)
    tensors[(slice(None), slice(None), *(slice(0, s) for s in size))] = x
    batch = NestedTensor(tensors, Padding.from_sizes([size] * x.shape[0], canvas, device=x.device))
    try:
        model.eval()
        invariant.training = False
        got = pytree.tree_leaves(invariant(batch))
        for b in range(x.shape[0]):
            want = [w.tensors if isinstance(w, NestedTensor) else w  # the graph checked against the eager forward
                    for w in pytree.tree_leaves(invariant(NestedTensor(x[b:b + 1], None)))]
            if len(got) != len(want):
                return f"{len(got)} outputs where the item alone gets {len(want)}"
            parts = []
            for i, (g, w) in enumerate(zip(got, want)):
                if isinstance(g, NestedTensor):
                    g = g.tensors[(slice(b, b + 1), slice(None), *(slice(0, s) for s in w.shape[2:]))]
                elif isinstance(g, Tensor) and g.dim() and g.shape[0] == x.shape[0] and w.dim() and w.shape[0] == 1:
                    g = g[b:b + 1]  # one row per item; any other value (a constant) compared whole
                parts.append(g)
            why = _differs(parts, want)
            if why is not None:
                return f"item {b}: {why.replace('the eager forward', 'the item alone')}"
        return None
    finally:
        _restore(model, modes)
        invariant.training = training


class PaddingInvariant(nn.Module):
    """A network made padding invariant by :func:`make_padding_invariant` (build it with that).

    Holds the network's own children, parameters and buffers under their own names (shared, not
    copied: its ``state_dict`` is the network's, keys and tensors), and runs the network's
    rewritten torch.fx graph of the current mode (``train()`` / ``eval()`` switch graphs).

    Attributes:
        num_axes (int): spatial axes. in_channels (int): the input channels.
        probe_size (tuple[int, ...]): the size the trace was checked at.

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
    """

    def __init__(self, model: nn.Module, body: nn.Module, runner: Any, num_axes: int, in_channels: int,
                 probe_size: tuple[int, ...]) -> None:
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
        self.training = model.training  # the shared submodules keep their own modes

    def extra_repr(self) -> str:
        return f"network={self.network}, num_axes={self.num_axes}, probe_size={self.probe_size}"

    def _graph_forward(self, tensors: Tensor, paddings: Any = None) -> Any:
        return type(self._body).forward(self, tensors, paddings)

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
        body = self._body
        if body.training != self.training:  # the graph of this mode (the submodules keep theirs)
            body.graph = body.train_graph if self.training else body.eval_graph
            body.training = self.training
        check_graph_hooks(body, "make_padding_invariant")
        return self._runner.run(self._graph_forward, x, self.training, structured=True)
