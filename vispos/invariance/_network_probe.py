"""The probe checks behind :func:`vispos.invariance._network.make_padding_invariant`: the probe
size a network's strides ask for, and the traced graphs run against the network's own eager
forward on it (eval and training, the same random draws, running statistics put back), so a trace
that drops or changes code is refused by name instead of run.

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
from torch.utils import _pytree as pytree

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


def _whole_graph_modules(model: nn.Module, num_axes: int) -> dict[bool, fx.GraphModule]:
    """``model`` traced whole in training and in eval mode (for the check against its eager
    forward, when the graphs to rewrite are cut at return nodes)."""
    from .tracing._trace import PathTracer

    modes, traced = _modes(model), {}
    try:
        for training in (True, False):
            model.train(training)
            traced[training] = fx.GraphModule(model, PathTracer(num_axes).trace(model), type(model).__name__)
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
