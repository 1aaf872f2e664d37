"""transformers' DETR and Conditional DETR made exact per image (``pixel_values`` and
``pixel_mask`` in, the model's own output class out); Deformable DETR refused, with the reason.

:func:`invariant_detr` wraps the model (the whole-model rule of
:func:`~vispos.make_padding_invariant` for these classes). The model runs through its own
``forward`` with one part replaced for the call, its convolutional encoder (``DetrConvEncoder``):

* the backbone (timm or transformers) is made exact by the rule book: each image's convolutions
  read zeros outside it, as alone;
* each level's mask is the image's own level size by convolution arithmetic (vispos' level
  padding), not ``pixel_mask`` nearest-interpolated to the level's size (which can mark a cell
  valid that the image alone does not have, or drop one it has);
* the levels' padding cells hold zeros.

The rest is the model's own: the sine or learned position embedding is computed from that mask
(each image's cumulative sums over its own cells), the encoder's self-attention and the decoder's
cross-attention mask the padding keys. So each image's logits and boxes equal what the wrapper
gives the image alone, and, when the image has no padding alone (``pixel_mask`` all ones), what
the stock model gives it alone; in training the losses and gradients do not change with padding.

References:
    Carion et al., End-to-End Object Detection with Transformers, ECCV 2020
    (facebookresearch/detr#239: AP depends on the images per GPU); Meng et al., Conditional DETR, ICCV 2021; Zhu et al.,
    Deformable DETR, ICLR 2021; transformers ``models/detr/modeling_detr.py``,
    ``models/conditional_detr/modeling_conditional_detr.py``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ...nested_tensor import NestedTensor
from ...padding import Padding
import torch.nn.functional as F

from ._parts import CallMaps, InvariantTower, ModelWrapper, Override, refuse_hooks, share_modules, zero_padding

__all__ = ["InvariantDetr", "invariant_detr"]


def invariant_detr(model: nn.Module, probe_size: Any = None) -> "InvariantDetr":
    """``model`` (transformers' ``DetrForObjectDetection``, ``DetrModel``,
    ``ConditionalDetrForObjectDetection``, ``ConditionalDetrModel``,
    ``DeformableDetrForObjectDetection`` or ``DeformableDetrModel``) as an :class:`InvariantDetr`.

    Raises:
        ValueError: a backbone the rule book cannot make exact (named by
            :func:`~vispos.make_padding_invariant`).
    """
    return InvariantDetr(model, probe_size=probe_size)


def _encoder_owner(model: nn.Module) -> nn.Module:
    """The ``...Model`` that holds ``backbone`` (a ``...ForObjectDetection``'s ``model``)."""
    inner = getattr(model, "model", None)
    return inner if isinstance(inner, nn.Module) and hasattr(inner, "backbone") else model


class InvariantDetr(ModelWrapper):
    """transformers' DETR or Conditional DETR made exact per image (see the module docstring).
    Build it with :func:`~vispos.make_padding_invariant`.

    Holds the model's children, parameters and buffers under their own names (shared: its
    ``state_dict`` is the model's).

    Shape:
        - input: ``pixel_values`` ``Tensor[B, 3, H, W]`` and ``pixel_mask`` ``Tensor[B, H, W]``
          (1 = valid, transformers' convention; each image a box at the origin, as
          ``DetrImageProcessor`` pads), and any other argument of the model's ``forward``
          (``labels`` in training).
        - output: the model's own output class (``DetrObjectDetectionOutput``, ...).

    Raises:
        ValueError: (forward) a ``pixel_mask`` whose valid cells are not a box at the origin of
            each image; a hooked encoder (the wrapper runs its own code, not the module).

    References:
        Carion et al., DETR, ECCV 2020; transformers ``models/detr``.
    """

    def __init__(self, model: nn.Module, probe_size: Any = None) -> None:
        from .._network import make_padding_invariant

        super().__init__()
        share_modules(self, model)
        self.__dict__["_model"] = model
        self.network = type(model).__name__
        owner = _encoder_owner(model)
        encoder = owner.backbone
        body = getattr(encoder, "model", None)
        if not isinstance(body, nn.Module):
            raise ValueError(f"{self.network}: its backbone {type(encoder).__name__} has no convolutional model "
                             "'model', which vispos' DETR wrapper runs")
        self.__dict__["_owner"] = owner
        self.__dict__["_body"] = make_padding_invariant(body, probe_size=probe_size)
        projections = getattr(owner, "input_proj", None)  # Deformable DETR: a norm over each level
        self.__dict__["_projections"] = None if projections is None else [InvariantTower(p) for p in projections]
        self.training = model.training

    def extra_repr(self) -> str:
        return f"network={self.network}"

    def _traced_parts(self) -> tuple[nn.Module | None, ...]:
        return (self._body, *(t.invariant for t in self._projections or ()))

    def _encode(self, pixel_values: Tensor, pixel_mask: Tensor, maps: CallMaps) -> list[tuple[Tensor, Tensor]]:
        """The convolutional encoder's output: ``[(Tensor[B, C_l, H_l, W_l], Tensor[B, H_l, W_l]
        bool, True = valid), ...]`` per level, as ``DetrConvEncoder`` returns it; each level is
        recorded in ``maps``."""
        padding = Padding.from_mask(pixel_mask == 0)
        self._body.training = self._model.training
        levels = self._body(NestedTensor(pixel_values, padding))
        if isinstance(levels, dict):
            levels = list(levels.values())
        out = []
        for level in levels:
            tensors = zero_padding(level.tensors, level.padding)
            valid = level.padding.valid if level.padding.kind != "none" else torch.ones(
                (tensors.shape[0], *tensors.shape[2:]), dtype=torch.bool, device=tensors.device)
            out.append((maps.add(tensors, level.padding), valid))
        return out

    def _projection(self, index: int, tower: Any, maps: CallMaps, pixel_mask: Tensor, num_levels: int) -> Any:
        """Deformable DETR's ``input_proj[index]`` for one call: exact on each level; an extra level
        (past the backbone's) is checked against the mask the model computes for it, ``pixel_mask``
        nearest-interpolated to the level's size, which is each image's own level size exactly when
        the canvas is a multiple of the level's stride."""
        def run(x: Tensor) -> Tensor:
            out = tower(x)
            if index >= num_levels:
                theirs = F.interpolate(pixel_mask[None].to(out.dtype), size=out.shape[-2:]).to(torch.bool)[0]
                padding = maps.padding(out)
                mine = padding.valid if padding.kind != "none" else torch.ones_like(theirs)
                if not torch.equal(theirs, mine):
                    raise ValueError(
                        f"{self.network}: its extra level {index} reads its mask from pixel_mask nearest-interpolated "
                        f"to the level's size {tuple(out.shape[-2:])}, which marks other cells than each image's own "
                        f"on a canvas of {tuple(pixel_mask.shape[-2:])}; pad the batch to a multiple of the level's "
                        "stride (64 for a ResNet with four levels: DeformableDetrImageProcessor(pad_size=...), or "
                        "pad pixel_values and pixel_mask yourself)")
            return out
        return run

    def forward(self, pixel_values: Tensor, pixel_mask: Tensor | None = None, **kwargs: Any) -> Any:
        model, owner = self._model, self._owner
        if pixel_mask is None:
            pixel_mask = torch.ones((pixel_values.shape[0], *pixel_values.shape[2:]), dtype=torch.long,
                                    device=pixel_values.device)
        refuse_hooks(model, {"": model, "backbone": owner.backbone, **({"model": owner} if owner is not model else {})},
                     "make_padding_invariant")
        maps = CallMaps()
        parts: dict[str, Any] = {
            "backbone": Override(owner.backbone, call=lambda values, mask: self._encode(values, mask, maps))}
        if self._projections is not None:
            num_levels = len(owner.backbone.intermediate_channel_sizes)
            parts["input_proj"] = [self._projection(i, t.bind(maps, model.training), maps, pixel_mask, num_levels)
                                   for i, t in enumerate(self._projections)]
        inner = Override(owner, **parts)
        if owner is model:
            return inner(pixel_values, pixel_mask=pixel_mask, **kwargs)
        return Override(model, model=inner)(pixel_values, pixel_mask=pixel_mask, **kwargs)
