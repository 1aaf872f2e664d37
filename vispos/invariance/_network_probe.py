"""The probe checks behind :func:`vispos.invariance._network.make_padding_invariant`: the probe
size a network's strides ask for, the traced graphs run against the network's own eager forward
on it (eval and training, the same random draws, running statistics put back), so a trace that
drops or changes code is refused by name instead of run, and the rewritten network run on the
probe items padded and alone, in eval and in training, with the likely causes named when they
differ.

References:
    torch.fx (``GraphModule``); Dumoulin and Visin, A guide to convolution arithmetic for deep
    learning, 2016 (the strides).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.fx as fx
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _NormBase
from torch.utils import _pytree as pytree

from ..nested_tensor import NestedTensor
from ..padding import Padding
from .geometry._geometry import Geometry, Window

#: the largest probe (cells per axis) chosen from the strides; beyond it, pass probe_size
_MAX_PROBE = 1024

def choose_probe(geometry: Geometry) -> tuple[int, ...] | None:
    """The smallest probe size (per axis) that is a multiple of every total stride of the graph
    and gives every feature map at least 2 cells per axis (statistics over space are defined) and
    equal sizes wherever two maps meet; None when none up to 1024 does."""
    n = geometry.num_axes
    strides = [(1,) * n]
    for parent, window in zip(geometry.parents[1:], geometry.windows[1:]):
        step = window.stride if isinstance(window, Window) else (1,) * n
        strides.append(tuple(a * b for a, b in zip(strides[parent], step)))
    total = tuple(math.lcm(*(s[a] for s in strides)) for a in range(n))
    for k in range(1, _MAX_PROBE // max(total) + 1):
        size = tuple(k * t for t in total)
        try:
            boxes = geometry.boxes(((0,) * n,), (size,), size)
        except ValueError:
            continue
        if all(min(sizes[0]) >= 2 for _, sizes, _ in boxes):
            return size
    return None


def _modes(model: nn.Module) -> dict[str, bool]:
    return {name: sub.training for name, sub in model.named_modules()}


def _restore(model: nn.Module, modes: dict[str, bool]) -> None:
    for name, sub in model.named_modules():
        sub.training = modes.get(name, sub.training)


def _probe_input(model: nn.Module, in_channels: int, size: tuple[int, ...]) -> Tensor:
    """Two random items of ``size`` (two, so that a norm over the batch in training mode, such as
    a ``BatchNorm1d`` after a global pool, has more than one value per channel)."""
    ref = next((p for p in model.parameters() if p.is_floating_point()), None)
    x = torch.randn(2, in_channels, *size, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    return x.to(device=ref.device, dtype=ref.dtype) if ref is not None else x.float()


def _differs(got: Any, want: Any) -> str | None:
    """Why the traced graph's output ``got`` is not the eager ``want`` (None when it is)."""
    got_leaves, got_spec = pytree.tree_flatten(got)
    want_leaves, want_spec = pytree.tree_flatten(want)
    if len(got_leaves) != len(want_leaves):
        return f"it returns {len(got_leaves)} values where the eager forward returns {len(want_leaves)}"
    for i, (g, w) in enumerate(zip(got_leaves, want_leaves)):
        if isinstance(w, Tensor) != isinstance(g, Tensor):
            return f"output {i} is a {type(g).__name__} where the eager forward returns a {type(w).__name__}"
        if not isinstance(w, Tensor):
            continue
        if g.shape != w.shape:
            return f"output {i} has shape {tuple(g.shape)} where the eager forward gives {tuple(w.shape)}"
        if not w.is_floating_point():
            if not torch.equal(g, w):
                return f"output {i} differs from the eager forward's"
            continue
        g, w = g.double(), w.double()
        rtol = {torch.float64: 1e-9, torch.float32: 1e-4}.get(got_leaves[i].dtype, 1e-2)
        scale = float(w.abs().max()) if w.numel() else 0.0
        err = float((g - w).abs().max()) if w.numel() else 0.0
        if not math.isfinite(err) or err > rtol * max(scale, 1e-6):
            return f"output {i} differs from the eager forward's by {err:.3g} (largest value {scale:.3g})"
    return None


def _whole_graph_modules(model: nn.Module, num_axes: int, rules: Any = None) -> dict[bool, fx.GraphModule]:
    """``model`` traced whole in training and in eval mode (for the check against its eager
    forward, when the graphs to rewrite are cut at return nodes)."""
    from .tracing._trace import PathTracer, _drop_specialized, defaults_of

    modes, traced = _modes(model), {}
    try:
        for training in (True, False):
            model.train(training)
            defaults = defaults_of(model)
            graph = PathTracer(num_axes, rules=rules).trace(model, defaults or None)
            if defaults:
                _drop_specialized(graph)
            traced[training] = fx.GraphModule(model, graph, type(model).__name__)
    finally:
        _restore(model, modes)
    return traced


class _EagerFails(Exception):
    """The model's own forward fails on the probe in ``mode`` (``error``, what it raised)."""

    def __init__(self, mode: str, error: BaseException) -> None:
        super().__init__(mode, error)
        self.mode, self.error = mode, error


def _run_seeded(module: nn.Module, x: Tensor, buffers: list[tuple[Tensor, Tensor]]) -> Any:
    """``module(x)`` with torch's generators seeded alike (dropout draws the same on both sides of
    the check) and ``buffers`` put back after (running statistics, batch counts)."""
    devices = [x.device] if x.device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(0)
            return module(x)
    finally:
        for buffer, saved in buffers:
            buffer.copy_(saved)


@torch.no_grad()
def _check_trace(model: nn.Module, traced: dict[bool, fx.GraphModule], x: Tensor) -> tuple[str, str] | None:
    """None when each of ``traced`` (un-rewritten, ``{training: graph module}``) gives ``model``'s
    eager output on ``x`` in that mode (eval first), else ``(mode, why not)``; raises
    :class:`_EagerFails` when the model itself cannot run on ``x``.
    The model's modes and buffers are as they were after."""
    modes = _modes(model)
    buffers = [(b, b.clone()) for b in model.buffers()]
    try:
        for training in (False, True):
            mode = "training" if training else "eval"
            model.train(training)
            try:
                want = _run_seeded(model, x, buffers)
            except Exception as exc:
                raise _EagerFails(mode, exc) from exc
            try:
                got = _run_seeded(traced[training], x, buffers)
            except Exception as exc:  # the graph of dropped or changed code fails where the model runs
                return mode, f"the traced graph fails where the eager forward runs ({type(exc).__name__}: {exc})"
            why = _differs(got, want)
            if why is not None:
                return mode, why
        return None
    finally:
        _restore(model, modes)


def _padded(x: Tensor) -> NestedTensor:
    """The items of ``x`` each at the origin of a canvas twice their size, the rest filled."""
    size = tuple(x.shape[2:])
    canvas = tuple(2 * s for s in size)
    tensors = x.new_full((x.shape[0], x.shape[1], *canvas), 3.0)
    tensors[(slice(None), slice(None), *(slice(0, s) for s in size))] = x
    return NestedTensor(tensors, Padding.from_sizes([size] * x.shape[0], canvas, device=x.device))


def _own_cells(got: list[Any], want: list[Any], rows: slice) -> list[Any]:
    """``got`` (outputs on the padded canvas) cut to the items' own cells and the rows ``rows``."""
    parts = []
    for g, w in zip(got, want):
        if isinstance(g, NestedTensor):
            g = g.tensors[(rows, slice(None), *(slice(0, s) for s in w.shape[2:]))]
        elif isinstance(g, Tensor) and g.dim() and w.dim() and g.shape[0] != w.shape[0]:
            g = g[rows]  # one row per item; any other value (a constant) compared whole
        parts.append(g)
    return parts


def _plain(out: Any) -> list[Any]:
    return [w.tensors if isinstance(w, NestedTensor) else w for w in pytree.tree_leaves(out)]


def _seeded(fn: Any, seed: int = 0) -> Any:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return fn()


@torch.no_grad()
def check_items(model: nn.Module, invariant: nn.Module, x: Tensor) -> tuple[str, str] | None:
    """None when the two probe items of ``x``, each at the origin of a canvas twice its size with
    a fill around it, get from ``invariant`` what they get without padding (the graph that was
    checked against the eager forward), in eval mode (each item alone) and in training mode (the
    two items together, so batch statistics are alike; skipped where the training forward draws
    random numbers even with its dropout layers in eval), else ``(mode, why not)``. The rule book
    checks each layer on maps; this catches what it cannot see: a hook, a layer whose value at
    zero is not zero, statistics over the batch, an operation across the batch axis after a
    global pool. Modes and buffers are as they were after."""
    modes = _modes(model)
    buffers = [(b, b.clone()) for b in model.buffers()]
    try:
        model.eval()
        got = pytree.tree_leaves(invariant(_padded(x)))
        for b in range(x.shape[0]):
            want = _plain(invariant(NestedTensor(x[b:b + 1], None)))
            if len(got) != len(want):
                return "eval", f"{len(got)} outputs where the item alone gets {len(want)}"
            why = _differs(_own_cells(got, want, slice(b, b + 1)), want)
            if why is not None:
                return "eval", f"item {b}: {why.replace('the eager forward', 'the item alone')}"
        model.train()
        for m in model.modules():  # the training forward's own draws: dropout layers as in eval
            if isinstance(m, nn.modules.dropout._DropoutNd):
                m.training = False
        alone = _seeded(lambda: _plain(invariant(NestedTensor(x, None))))
        for buffer, saved in buffers:
            buffer.copy_(saved)
        again = _seeded(lambda: _plain(invariant(NestedTensor(x, None))), seed=1)
        for buffer, saved in buffers:
            buffer.copy_(saved)
        if _differs(again, alone) is not None:
            return None  # random draws of its own: no item-for-item comparison
        got = pytree.tree_leaves(_seeded(lambda: invariant(_padded(x))))
        if len(got) != len(alone):
            return "training", f"{len(got)} outputs where the items without padding get {len(alone)}"
        why = _differs(_own_cells(got, alone, slice(None)), alone)
        return None if why is None else ("training", why.replace("the eager forward", "the items without padding"))
    finally:
        for buffer, saved in buffers:
            buffer.copy_(saved)
        _restore(model, modes)


def suspects(model: nn.Module) -> str:
    """The likely reasons why items in a padded batch do not get what they get alone, where the
    rule book saw every layer as exact: hooks, norms without running statistics, else an
    operation across the batch's items after a global pool."""
    from torch.nn.modules import module as torch_module

    found = []
    hooked = [n or "the model" for n, m in model.named_modules()
              if m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks]
    if hooked:
        found.append(f"hooks on {', '.join(hooked[:5])} (a hook runs on the padded map, after or before the "
                     "zeros the rewrite writes into its padding; remove it, or register it after wrapping a "
                     "model whose output you hook instead)")
    if any(getattr(torch_module, t) for t in ("_global_forward_hooks", "_global_forward_pre_hooks")):
        found.append("torch's global module hooks (register_module_forward_hook / _pre_hook)")
    batch_stats = [n for n, m in model.named_modules() if isinstance(m, _NormBase) and m.running_mean is None
                   and not isinstance(m, nn.modules.instancenorm._InstanceNorm)]
    if batch_stats:
        found.append(f"norms without running statistics ({', '.join(batch_stats[:5])}: track_running_stats=False "
                     "normalises with the statistics of the whole batch in eval mode too, which mix the items)")
    if not found:
        found.append("a value computed across the batch's items (a mean, softmax, flip or index over the batch "
                     "axis after a global pool), which is not each item's own")
    return "; ".join(found)


def _input_channels(model: nn.Module, graph: fx.Graph, num_axes: int) -> int | None:
    """The channels the graph's input takes: those of the first convolution the graph runs (in the
    order the forward runs, not the order the modules were declared); a functional convolution's
    weight computed from a parameter (timm's weight-standardised ``ScaledStdConv2d``) is read from
    the largest ``(out, in / groups, *kernel)`` parameter it is computed from. None when the first
    convolution's weight cannot be read (the caller then asks for ``in_channels``), or when the
    graph runs none."""
    for node in graph.nodes:
        if node.op == "call_module":
            module = model.get_submodule(node.target)
            if isinstance(module, nn.modules.conv._ConvNd) and len(module.kernel_size) == num_axes:
                return module.in_channels
        elif node.op == "call_function" and getattr(node.target, "__name__", "") == f"conv{num_axes}d":
            weight = node.args[1] if len(node.args) > 1 else node.kwargs.get("weight")
            groups = node.args[6] if len(node.args) > 6 else node.kwargs.get("groups", 1)
            found = _weight_parameter(model, weight, num_axes) if isinstance(groups, int) else None
            return None if found is None else int(found.shape[1]) * groups
    return None


def _weight_parameter(model: nn.Module, weight: Any, num_axes: int) -> Tensor | None:
    """The parameter a convolution's ``weight`` node is (or is computed from: the largest of rank
    ``2 + num_axes`` among the nodes it reads), or None."""
    seen, todo, best = set(), [weight], None
    while todo:
        node = todo.pop()
        if not isinstance(node, fx.Node) or node in seen:
            continue
        seen.add(node)
        if node.op == "get_attr":
            try:
                value = model.get_parameter(node.target)
            except AttributeError:
                continue
            if value.dim() == 2 + num_axes and (best is None or value.numel() > best.numel()):
                best = value
        elif node.op != "placeholder":
            todo.extend(pytree.tree_leaves((node.args, node.kwargs)))
    return best
