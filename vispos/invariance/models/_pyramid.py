"""A torchvision backbone with a feature pyramid (``BackboneWithFPN``: a ResNet or MobileNet body
and an ``FeaturePyramidNetwork``) run exactly on each image of a padded batch.

The body is made exact by :func:`~vispos.make_padding_invariant` (every layer by the rule book).
The FPN runs through its own ``forward``: each inner (1x1) and layer (3x3) block is made exact the
same way, and the top-down ``F.interpolate(last_inner, size=lateral.shape[-2:], mode="nearest")``
runs as it is, on the canvas: the canvas is a multiple of the deepest stride, so each level is
exactly twice the next and cell ``i`` reads cell ``i // 2``, what an image alone reads from its own
maps (``floor(i * ceil(n / 2) / n) == i // 2`` for ``i < n``). The extra levels
(``LastLevelMaxPool``, ``LastLevelP6P7``) see zeros in the padding of their input.

Each level's padding is each image's own level size (convolution arithmetic from the image's
size), and each level's *alone size* is the map size the image gets alone, padded to the model's
size divisibility (what the anchors' strides and the RoI pooling's edge are read from).

References:
    Lin et al., Feature Pyramid Networks for Object Detection, CVPR 2017; torchvision
    ``ops/feature_pyramid_network.py`` and ``models/detection/backbone_utils.py``.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from torch import Tensor, nn

from ...nested_tensor import NestedTensor
from ...padding import Padding
from ._parts import CallMaps, InvariantTower, Override, conv_sizes, zero_padding

__all__ = ["InvariantBackboneWithFPN", "InvariantPyramid", "Levels", "invariant_backbone"]

_MAX_POOL = "torchvision.ops.feature_pyramid_network.LastLevelMaxPool"
_P6P7 = "torchvision.ops.feature_pyramid_network.LastLevelP6P7"


def _dotted(obj: Any) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


class Levels:
    """The pyramid of one call: ``names`` (the FPN's level names), ``maps`` (their tensors,
    ``Tensor[B, C, H_l, W_l]`` with zeros in the padding), ``paddings`` (each level's
    :class:`~vispos.Padding`, True = padding) and ``alone`` (per level, each image's map size alone
    on its own canvas: ``[(h, w), ...]``)."""

    def __init__(self, names: list[str], maps: list[Tensor], paddings: list[Padding],
                 alone: list[list[tuple[int, int]]]) -> None:
        self.names, self.maps, self.paddings, self.alone = names, maps, paddings, alone

    def as_dict(self) -> "OrderedDict[str, Tensor]":
        return OrderedDict(zip(self.names, self.maps))


class InvariantPyramid:
    """``BackboneWithFPN`` made exact per image (see the module docstring).

    Args:
        backbone (nn.Module): torchvision's ``BackboneWithFPN`` (``body``, ``fpn``); shared.
        probe_size (int | tuple, optional): passed to ``make_padding_invariant`` for the body.

    Raises:
        ValueError: a backbone without ``body`` / ``fpn``; an FPN extra block other than
            ``LastLevelMaxPool`` / ``LastLevelP6P7`` (named); a part vispos cannot make exact.
    """

    def __init__(self, backbone: nn.Module, probe_size: Any = None) -> None:
        from .._network import make_padding_invariant

        body, fpn = getattr(backbone, "body", None), getattr(backbone, "fpn", None)
        if body is None or fpn is None or type(fpn).__name__ != "FeaturePyramidNetwork":
            raise ValueError(
                f"vispos' detector wrapper takes a torchvision backbone with a feature pyramid (BackboneWithFPN: "
                f"body and fpn), got {type(backbone).__name__}; make the backbone alone exact with "
                "vispos.make_padding_invariant(model.backbone)")
        extra = fpn.extra_blocks
        if extra is not None and _dotted(extra) not in (_MAX_POOL, _P6P7):
            raise ValueError(
                f"the FPN's extra block {type(extra).__name__} has no rule in vispos (LastLevelMaxPool and "
                "LastLevelP6P7 have one)")
        self.backbone, self.fpn = backbone, fpn
        self.body = make_padding_invariant(body, probe_size=probe_size)
        self.inner = [InvariantTower(block) for block in fpn.inner_blocks]
        self.layer = [InvariantTower(block) for block in fpn.layer_blocks]

    def __call__(self, tensors: Tensor, image_sizes: list[tuple[int, int]], size_divisible: int, maps: CallMaps,
                 training: bool) -> Levels:
        """The pyramid of a padded batch ``Tensor[B, C, H, W]`` whose image ``b`` covers
        ``image_sizes[b]`` cells at the origin; each level's map is recorded in ``maps``."""
        canvas = tuple(tensors.shape[-2:])
        padding = Padding.from_sizes(image_sizes, canvas, device=tensors.device)
        self.body.training = training
        body = self.body(NestedTensor(tensors, padding))
        names, xs, pads = list(body), [], []
        for name in names:
            level = body[name]
            xs.append(maps.add(zero_padding(level.tensors, level.padding), level.padding))
            pads.append(level.padding)
        for fine, coarse in zip(xs, xs[1:]):
            if any(f != 2 * c for f, c in zip(fine.shape[-2:], coarse.shape[-2:])):
                raise ValueError(
                    f"the FPN's top-down path up-samples a level of size {tuple(coarse.shape[-2:])} to "
                    f"{tuple(fine.shape[-2:])}, not exactly twice: the padded canvas {canvas} must be a multiple of "
                    "the body's deepest stride (set the transform's size_divisible to it, 32 for a ResNet)")
        inner = [t.bind(maps, training) for t in self.inner]
        layer = [t.bind(maps, training) for t in self.layer]
        num = len(xs)
        outputs = Override(self.fpn,
                           get_result_from_inner_blocks=lambda x, idx: inner[idx % num](x, pads[idx % num]),
                           get_result_from_layer_blocks=lambda x, idx: layer[idx % num](x, pads[idx % num]),
                           extra_blocks=self._extra(maps, pads))(OrderedDict(zip(names, xs)))
        out_names, out_maps, out_pads = [], [], []
        for i, (name, value) in enumerate(outputs.items()):
            pad = pads[i] if i < num else maps.padding(value)  # an extra level: recorded by its block
            out_names.append(name)
            out_maps.append(maps.add(zero_padding(value, pad), pad))
            out_pads.append(pad)
        return Levels(out_names, out_maps, out_pads, _alone_sizes(image_sizes, size_divisible, canvas, out_maps, num))

    def _extra(self, maps: CallMaps, pads: list[Padding]) -> Any:
        extra = self.fpn.extra_blocks
        if extra is None:
            return None
        if _dotted(extra) == _MAX_POOL:
            def max_pool(results: list, x: list, names: list) -> Any:
                results, names = extra(results, x, names)
                last = results[-1]
                maps.add(last, conv_sizes(pads[-1], 1, 2, 0, tuple(last.shape[-2:])))
                return results, names
            return max_pool

        state: dict[str, Padding] = {"p6": pads[-1]}

        def conv(name: str, source: str) -> Any:
            layer = getattr(extra, name)

            def run(t: Tensor) -> Tensor:
                pad = state[source]
                out = layer(zero_padding(t, pad))
                k, s, p = layer.kernel_size[0], layer.stride[0], layer.padding[0]
                state[name] = conv_sizes(pad, k, s, p, tuple(out.shape[-2:]))
                return maps.add(out, state[name])
            return run

        state["level"] = pads[-1]
        return Override(extra, p6=conv("p6", "level"), p7=conv("p7", "p6"))


def _alone_sizes(image_sizes: list[tuple[int, int]], size_divisible: int, canvas: tuple[int, ...],
                 levels: list[Tensor], num_body: int) -> list[list[tuple[int, int]]]:
    """Per level, each image's map size alone on its own canvas (its size rounded up to
    ``size_divisible``, as torchvision's transform pads it): a level of the body has the canvas's
    stride (the canvas is a multiple of it); an extra level follows from the level before it by a
    stride-2 convolution's arithmetic, ``(n - 1) // 2 + 1``."""
    alone_canvas = [tuple(-(-n // size_divisible) * size_divisible for n in size) for size in image_sizes]
    out: list[list[tuple[int, int]]] = []
    for i, level in enumerate(levels):
        shape = tuple(level.shape[-2:])
        if i < num_body:
            out.append([tuple(a // (c // s) for a, c, s in zip(item, canvas, shape)) for item in alone_canvas])
        else:
            out.append([tuple((n - 1) // 2 + 1 for n in prev) for prev in out[-1]])
    return out


def invariant_backbone(model: nn.Module, probe_size: Any = None) -> "InvariantBackboneWithFPN":
    """torchvision's ``BackboneWithFPN`` as an :class:`InvariantBackboneWithFPN` (the whole-model
    rule of :func:`~vispos.make_padding_invariant` for that class)."""
    return InvariantBackboneWithFPN(model, probe_size=probe_size)


class InvariantBackboneWithFPN(nn.Module):
    """torchvision's ``BackboneWithFPN`` (``resnet_fpn_backbone``, ``mobilenet_backbone(fpn=True)``)
    made exact per item: a padded batch in, each level as a :class:`~vispos.NestedTensor` out
    (its padding by convolution arithmetic, zeros there). Build it with
    :func:`~vispos.make_padding_invariant`.

    The batch's canvas is first padded (at the end of each axis) to a multiple of
    ``size_divisible`` (the body's deepest stride, 32 for a ResNet), where the FPN's top-down
    up-sampling is exactly twice each level; each item's output equals what it gets alone.

    Args:
        model (nn.Module): the ``BackboneWithFPN`` (shared, not copied: the state_dict is its own).
        probe_size (int | tuple, optional): passed to ``make_padding_invariant`` for the body.
        size_divisible (int): the canvas multiple. Default: 32.

    Shape:
        - input: NestedTensor ``(B, C, H, W)`` (each item a box at the origin), or ``tensors`` and
          ``mask`` ``(B, H, W)`` bool, True = padding.
        - output: ``OrderedDict[str, NestedTensor]``, the FPN's level names, finest first.

    Raises:
        TypeError: (forward) ``x`` neither a NestedTensor nor a tensor.
        ValueError: (forward) items that are not boxes at the origin.
    """

    def __init__(self, model: nn.Module, probe_size: Any = None, size_divisible: int = 32) -> None:
        from ._parts import share_modules

        super().__init__()
        share_modules(self, model)
        self.__dict__["_pyramid"] = InvariantPyramid(model, probe_size=probe_size)
        self.size_divisible = size_divisible
        self.training = model.training

    def extra_repr(self) -> str:
        return f"size_divisible={self.size_divisible}"

    def _apply(self, fn: Any, recurse: bool = True) -> "InvariantBackboneWithFPN":
        super()._apply(fn, recurse)
        pyramid = self._pyramid
        for part in (pyramid.body, *(t.invariant for t in (*pyramid.inner, *pyramid.layer))):
            if part is not None:
                part._apply(fn, recurse)
        return self

    def forward(self, x: NestedTensor | Tensor, mask: Tensor | None = None) -> "OrderedDict[str, NestedTensor]":
        import torch.nn.functional as F

        if isinstance(x, Tensor):
            x = NestedTensor(x, mask)
        elif not isinstance(x, NestedTensor):
            raise TypeError(f"x must be a NestedTensor or a Tensor (B, C, H, W), got {type(x).__name__}")
        elif mask is not None:
            raise TypeError("mask is given by the NestedTensor itself; pass mask only with a plain tensor")
        padding = x.padding
        if padding.kind == "arbitrary" or not padding.at_origin:
            raise ValueError("InvariantBackboneWithFPN takes items that are boxes at the origin of the canvas "
                             "(padding at the end of each axis), as torchvision's transform pads them")
        div = self.size_divisible
        tensors = x.tensors
        h, w = tensors.shape[-2:]
        tensors = F.pad(tensors, (0, -(-w // div) * div - w, 0, -(-h // div) * div - h))
        levels = self._pyramid(tensors, [tuple(s) for s in padding.sizes], div, CallMaps(), self.training)
        return OrderedDict((name, NestedTensor(t, p)) for name, t, p in zip(levels.names, levels.maps, levels.paddings))
