"""The pieces every whole-model wrapper shares: a module's own forward run with some parts
replaced (:class:`Override`), the padding of each feature map of one call (:class:`CallMaps`), and
the exact stand-ins for convolution stacks on those maps (:class:`InvariantTower`,
:class:`MaskedConv`).

A whole detector is run through its own code: its ``forward`` is called on an :class:`Override`
that answers the model's attributes except the parts vispos replaces, so nothing of the model is
copied or changed (two threads may run the stock model and the wrapper at once). The maps one call
passes between the parts are plain tensors (the stock code reads their ``.shape``); their padding
travels beside them in a :class:`CallMaps`, keyed by the tensor object.

References:
    torchvision ``models/detection/generalized_rcnn.py`` and ``rpn.py`` (the parts of a detector);
    Carion et al., DETR, ECCV 2020 (padded batches, mask True = padding).
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch import Tensor, nn

from ...nested_tensor import NestedTensor
from ...padding import Padding

__all__ = ["CallMaps", "InvariantTower", "MaskedConv", "ModelWrapper", "Override", "conv_sizes", "refuse_hooks", "share_modules"]


class Override:
    """``module`` seen through a stand-in: attributes named in ``parts`` are answered by the
    stand-in, every other attribute by ``module`` (its bound methods re-bound to the stand-in, so
    the module's own code sees the replaced parts too). Calling it runs ``call`` when given, else
    the module's own ``forward`` on the stand-in. Attributes the code sets stay on the stand-in.

    Args:
        module (nn.Module): the module whose code runs (never changed).
        call (callable, optional): what calling the stand-in does instead of ``forward``.
        **parts: the replaced attributes.
    """

    __slots__ = ("_module", "_parts", "_call")

    def __init__(self, module: nn.Module, call: Any = None, **parts: Any) -> None:
        object.__setattr__(self, "_module", module)
        object.__setattr__(self, "_parts", parts)
        object.__setattr__(self, "_call", call)

    def __getattr__(self, name: str) -> Any:
        parts = object.__getattribute__(self, "_parts")
        if name in parts:
            return parts[name]
        module = object.__getattribute__(self, "_module")
        value = getattr(module, name)
        if isinstance(value, types.MethodType) and value.__self__ is module:
            return types.MethodType(value.__func__, self)
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        object.__getattribute__(self, "_parts")[name] = value

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        call = object.__getattribute__(self, "_call")
        if call is not None:
            return call(*args, **kwargs)
        module = object.__getattribute__(self, "_module")
        return type(module).forward(self, *args, **kwargs)


class CallMaps:
    """The padding of every feature map one call passes between a model's parts, keyed by the
    tensor object (the stock code passes the same objects on: a list of levels, a dict).

    Each entry keeps its tensor alive for the call, so no other tensor takes its id meanwhile.
    """

    def __init__(self) -> None:
        self._maps: dict[int, tuple[Tensor, Padding]] = {}

    def add(self, tensor: Tensor, padding: Padding) -> Tensor:
        """Records ``tensor``'s padding (a :class:`~vispos.Padding` of shape ``(B, H, W)``) and
        returns ``tensor``."""
        self._maps[id(tensor)] = (tensor, padding)
        return tensor

    def padding(self, tensor: Tensor) -> Padding:
        """The padding recorded for ``tensor``.

        Raises:
            ValueError: ``tensor`` is not a map of this call (the model passes a map vispos did not
                make, so its padding is unknown).
        """
        entry = self._maps.get(id(tensor))
        if entry is None or entry[0] is not tensor:
            raise ValueError("a feature map whose padding vispos does not know reached a part of the model it "
                             "replaced (the model's forward computes a map vispos' wrapper does not follow)")
        return entry[1]

    def zero(self, tensor: Tensor) -> Tensor:
        """``tensor`` with zeros on its padding cells (a new tensor; the same one without padding)."""
        return zero_padding(tensor, self.padding(tensor))


def zero_padding(tensor: Tensor, padding: Padding) -> Tensor:
    """``Tensor[B, C, H, W]`` with zeros on the cells ``padding`` marks (True = padding)."""
    if padding.kind == "none":
        return tensor
    return tensor.masked_fill(padding.mask.unsqueeze(1), 0)


def conv_sizes(padding: Padding, kernel: int, stride: int, pad: int, spatial: tuple[int, ...]) -> Padding:
    """The padding of a convolution's output (``kernel``, ``stride``, ``pad`` on every axis) on a
    canvas of ``spatial`` cells: each item's output size is the convolution's output size for the
    item alone, ``(n + 2 pad - kernel) // stride + 1``."""
    sizes = [tuple((n + 2 * pad - kernel) // stride + 1 for n in item) for item in padding.sizes]
    return Padding.from_sizes(sizes, spatial, device=padding.device)


class InvariantTower:
    """A stack of layers on one map (a head's convolution tower: convolutions, norms,
    activations) made exact by :func:`~vispos.make_padding_invariant`, called on the maps of a
    :class:`CallMaps`: its output is recorded with its padding (the input's, for a stack that keeps
    the map's size; by convolution arithmetic otherwise), with zeros there.

    One size-keeping convolution (with ReLUs, in plain ``nn.Sequential`` containers: an FPN block,
    the RPN's tower) needs no trace: it runs as it is on its input with zeros in the padding.

    Args:
        tower (nn.Module): the stack (shared, not copied).
        probe_size (int | tuple, optional): passed to ``make_padding_invariant``.

    Raises:
        ValueError: a layer of the stack the rule book cannot make exact (named by
            ``make_padding_invariant``).
    """

    def __init__(self, tower: nn.Module, probe_size: Any = None) -> None:
        from .._network import make_padding_invariant

        self.module = tower
        self.invariant = None if _one_conv(tower) else make_padding_invariant(tower, probe_size=probe_size)

    def bind(self, maps: CallMaps, training: bool) -> Any:
        """The tower for one call of the owner (``training``: the owner's mode)."""
        if self.invariant is None:
            return _ZeroFilled(self.module, maps)
        self.invariant.training = training
        return _BoundTower(self.invariant, maps)


def _one_conv(module: nn.Module) -> bool:
    """``module`` is one size-keeping convolution, alone or in ``nn.Sequential`` containers with
    ReLUs (an FPN block, the RPN's tower): zeros in its input's padding make it exact, no trace
    needed."""
    leaves = [m for m in module.modules() if not any(True for _ in m.children())]
    containers = [m for m in module.modules() if any(True for _ in m.children())]
    convs = [m for m in leaves if type(m) is nn.Conv2d]
    return (len(convs) == 1 and all(type(m) in (nn.Conv2d, nn.ReLU, nn.Identity) for m in leaves)
            and all(isinstance(m, nn.Sequential) and type(m).forward is nn.Sequential.forward for m in containers)
            and all(s == 1 for s in convs[0].stride) and convs[0].padding_mode == "zeros"
            and all(2 * p == d * (k - 1) for p, d, k in zip(convs[0].padding, convs[0].dilation, convs[0].kernel_size)))


class _ZeroFilled:
    def __init__(self, module: nn.Module, maps: CallMaps) -> None:
        self.module, self.maps = module, maps

    def __call__(self, x: Tensor, padding: Padding | None = None) -> Tensor:
        if padding is None:
            padding = self.maps.padding(x)
        return self.maps.add(zero_padding(self.module(zero_padding(x, padding)), padding), padding)


class _BoundTower:
    def __init__(self, invariant: nn.Module, maps: CallMaps) -> None:
        self.invariant, self.maps = invariant, maps

    def __call__(self, x: Tensor, padding: Padding | None = None) -> Tensor:
        if padding is None:
            padding = self.maps.padding(x)
        out = self.invariant(NestedTensor(x, padding))
        return self.maps.add(zero_padding(out.tensors, out.padding), out.padding)


class MaskedConv:
    """A convolution of a head (its last layer: logits, box deltas) on a map of a
    :class:`CallMaps`, with zeros in the input's padding; with ``fill`` the output's padding
    cells are ``fill`` (``"lowest"``: the dtype's lowest value, a logit whose sigmoid is exactly 0,
    so those cells win no top-k and add exactly 0 to a focal loss).

    Args:
        conv (nn.Module): the convolution (shared, not copied); it keeps each map's size.
        maps (CallMaps): the call's maps.
        fill (str, optional): ``"lowest"`` or None (the output's padding cells as computed).
    """

    def __init__(self, conv: nn.Module, maps: CallMaps, fill: str | None = None) -> None:
        self.conv, self.maps, self.fill = conv, maps, fill

    def __call__(self, x: Tensor) -> Tensor:
        padding = self.maps.padding(x)
        out = self.conv(zero_padding(x, padding))
        if self.fill == "lowest" and padding.kind != "none":
            out = out.masked_fill(padding.mask.unsqueeze(1), torch.finfo(out.dtype).min)
        return self.maps.add(out, padding)


def share_modules(owner: nn.Module, model: nn.Module) -> None:
    """Registers ``model``'s children, parameters and buffers on ``owner`` under their own names
    (shared, not copied: ``owner.state_dict()`` is ``model``'s, keys and tensors)."""
    for name, child in model.named_children():
        owner.add_module(name, child)
    for name, param in model.named_parameters(recurse=False):
        owner.register_parameter(name, param)
    for name, buffer in model.named_buffers(recurse=False):
        owner.register_buffer(name, buffer, persistent=name not in model._non_persistent_buffers_set)


def refuse_hooks(model: nn.Module, parts: dict[str, nn.Module], caller: str) -> None:
    """Raises when a module that the wrapper runs by its own code rather than by calling it (its
    ``forward`` through an :class:`Override`) holds a forward hook, which that run would skip.

    Raises:
        ValueError: a hooked module, named.
    """
    for name, module in parts.items():
        if module._forward_hooks or module._forward_pre_hooks:
            raise ValueError(
                f"{caller}: {name} ({type(module).__name__}) has a forward hook or pre-hook, which vispos' wrapper "
                f"would skip (it runs {type(model).__name__}'s parts through their own code, not by calling "
                "them); remove the hook or hook a submodule it calls")


class ModelWrapper(nn.Module):
    """The base of a whole-model wrapper: its traced parts (graph modules that hold constants of
    their own) move with it under ``to()`` / ``float()``, and its mode is the wrapped model's
    (``self._model``), so ``model.train()`` and ``wrapper.train()`` act on one flag. A subclass
    names its traced parts in :meth:`_traced_parts`."""

    def _traced_parts(self) -> tuple[nn.Module | None, ...]:
        return ()

    def _apply(self, fn: Any, recurse: bool = True) -> "ModelWrapper":
        super()._apply(fn, recurse)  # the model's modules; then the traced parts' own constants
        for part in self._traced_parts():
            if part is not None:
                part._apply(fn, recurse)
        return self

    def train(self, mode: bool = True) -> "ModelWrapper":
        """Sets the model's mode (the model itself and its modules; the wrapper runs in the model's
        mode, so ``model.train()`` / ``model.eval()`` are followed too)."""
        self._model.train(mode)
        self.training = mode
        return self
