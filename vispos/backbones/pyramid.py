"""ViTDet's simple feature pyramid: one stride-16 map of a plain ViT made into levels (transposed
convolutions up, max pooling down, each followed by a 1x1 and a 3x3 convolution with a layer norm
over channels), exact on padded batches through the rule book.

References:
    Li et al., Exploring Plain Vision Transformer Backbones for Object Detection (ViTDet), ECCV
    2022; detectron2 ``modeling/backbone/vit.py`` (``SimpleFeaturePyramid``) and
    ``layers/batch_norm.py`` (``LayerNorm``), ``modeling/backbone/fpn.py`` (``LastLevelMaxPool``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._checks import as_sequence, check_bool, check_int, describe
from ..invariance import make_graph_invariant, refuse_unrun_hooks, trace_features
from ..nested_tensor import NestedTensor

__all__ = ["ChannelLayerNorm", "SimpleFeaturePyramid"]

_SCALES = (4.0, 2.0, 1.0, 0.5)
_GRAPH = "_invariant_pyramid_graph"


class ChannelLayerNorm(nn.Module):
    """Layer norm over the channels of a channels-first map, each cell alone (detectron2's
    ``LayerNorm``, ConvNeXt's channels-first norm).

    Args:
        num_channels (int): ``C``.
        eps (float): added to the variance. Default 1e-6.

    Shape:
        ``(B, C, *S)`` -> ``(B, C, *S)``, the input's dtype.

    Raises:
        TypeError: ``num_channels`` is not an int.
        ValueError: ``num_channels`` < 1.

    References:
        Ba et al., Layer Normalization, 2016; detectron2 ``layers/batch_norm.py`` (``LayerNorm``).
    """

    def __init__(self, num_channels: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.num_channels = check_int(num_channels, "num_channels", minimum=1)
        self.eps = float(eps)
        self.weight = nn.Parameter(torch.ones(self.num_channels))
        self.bias = nn.Parameter(torch.zeros(self.num_channels))

    def forward(self, x: Tensor) -> Tensor:
        out = F.layer_norm(x.movedim(1, -1), (self.num_channels,), self.weight, self.bias, self.eps)
        return out.movedim(-1, 1)

    def extra_repr(self) -> str:
        return f"{self.num_channels}, eps={self.eps}"


def _conv_norm(in_channels: int, out_channels: int, kernel: int) -> nn.Sequential:
    """detectron2's ``Conv2d(..., bias=False, norm=LayerNorm)``."""
    return nn.Sequential(nn.Conv2d(in_channels, out_channels, kernel, padding=kernel // 2, bias=False),
                         ChannelLayerNorm(out_channels))


class _Pyramid(nn.Module):
    """The levels of one map, as one module to trace: every stage, then the top block."""

    def __init__(self, stages: nn.ModuleList, top_block: bool) -> None:
        super().__init__()
        self.stages, self.top_block = stages, top_block

    def forward(self, x: Tensor) -> tuple[Tensor, ...]:
        levels = [stage(x) for stage in self.stages]
        if self.top_block:
            levels.append(F.max_pool2d(levels[-1], kernel_size=1, stride=2, padding=0))
        return tuple(levels)


class SimpleFeaturePyramid(nn.Module):
    """ViTDet's simple feature pyramid over the last map of a plain (non-hierarchical) backbone.

    For each scale factor: ``4``: a 2x2 stride-2 transposed convolution, layer norm, GELU and a
    second one (channels ``C / 2``, then ``C / 4``); ``2``: one (``C / 2``); ``1``: the map itself;
    ``0.5``: 2x2 stride-2 max pooling. Each is followed by a 1x1 and a 3x3 convolution (no bias),
    each with a layer norm over channels (:class:`ChannelLayerNorm`). ``top_block`` adds
    detectron2's ``LastLevelMaxPool`` level (1x1 max pooling of stride 2 of the last level).

    With ``padding_invariant=True`` (default) the pyramid is traced with torch.fx and run by the
    rule book of :mod:`vispos.invariance`: an item of a padded batch (at the origin) gets, on its
    own cells of every level, exactly the levels it gets alone, and each level's padding marks the
    cells outside the item's own map (convolution arithmetic: ``2 h`` and ``4 h`` up, ``floor(h / 2)``
    down, ``ceil(h / 2)`` for the top block). False: detectron2's behaviour, each level's mask the
    input's resized (nearest).

    Args:
        in_channels (int): channels of the input map; divisible by 4 with scale 4, by 2 with 2.
        out_channels (int): channels of every level.
        scale_factors (sequence of float): each in ``(4.0, 2.0, 1.0, 0.5)``, in output order.
            Default ``(4.0, 2.0, 1.0, 0.5)``.
        top_block (bool): add the ``LastLevelMaxPool`` level. Default False.
        in_stride (int): the input's stride, for :attr:`strides`. Default 16.
        padding_invariant (bool): see above. Default True.

    Attributes:
        num_channels (list[int]): ``out_channels`` per level.
        strides (list[int]): each level's stride.

    Shape:
        - input: NestedTensor ``(B, in_channels, H, W)`` (or a list of levels: the last one is used).
        - output: list of NestedTensor ``(B, out_channels, H_l, W_l)``, masks ``(B, H_l, W_l)`` bool,
          True = padding.

    Raises:
        TypeError: a non-int ``in_channels`` / ``out_channels`` / ``in_stride``, ``scale_factors``
            not a sequence of numbers, a non-bool flag; ``forward`` given anything but a NestedTensor
            (or a list of them).
        ValueError: a scale factor outside ``(4.0, 2.0, 1.0, 0.5)`` or none; ``in_channels`` not
            divisible as the scales need; ``in_channels`` / ``out_channels`` / ``in_stride`` < 1; a
            stride that is not a whole number; at ``forward``, input channels other than
            ``in_channels``, and with ``padding_invariant`` an arbitrary (non-box) mask or an item
            too small for max pooling.

    References:
        Li et al., ViTDet, ECCV 2022; detectron2 ``modeling/backbone/vit.py``.
    """

    num_axes = 2

    def __init__(self, in_channels: int, out_channels: int, scale_factors: Sequence[float] = _SCALES,
                 top_block: bool = False, in_stride: int = 16, padding_invariant: bool = True) -> None:
        super().__init__()
        in_channels = check_int(in_channels, "in_channels", minimum=1)
        out_channels = check_int(out_channels, "out_channels", minimum=1)
        in_stride = check_int(in_stride, "in_stride", minimum=1)
        entries = as_sequence(scale_factors)
        if entries is None or not all(isinstance(s, (int, float)) and not isinstance(s, bool) for s in entries):
            raise TypeError(f"scale_factors must be a sequence of numbers, got {describe(scale_factors)}")
        scales = tuple(float(s) for s in entries)
        if not scales or any(s not in _SCALES for s in scales):
            raise ValueError(f"scale_factors must be non-empty, each one of {_SCALES}, got {scales}")
        need = 4 if 4.0 in scales else 2 if 2.0 in scales else 1
        if in_channels % need:
            raise ValueError(f"in_channels must be divisible by {need} for scale_factors {scales}, got {in_channels}")
        strides = [in_stride / s for s in scales] + ([in_stride / scales[-1] * 2] if top_block else [])
        if any(s != int(s) for s in strides):
            raise ValueError(f"in_stride={in_stride} with scale_factors {scales} gives strides {strides}, "
                             "expected whole numbers")
        self.in_channels, self.out_channels, self.scale_factors = in_channels, out_channels, scales
        self.top_block = check_bool(top_block, "top_block")
        self.in_stride = in_stride
        self.padding_invariant = check_bool(padding_invariant, "padding_invariant")
        stages = []
        for scale in scales:
            dim = in_channels
            if scale == 4.0:
                layers = [nn.ConvTranspose2d(dim, dim // 2, 2, stride=2), ChannelLayerNorm(dim // 2), nn.GELU(),
                          nn.ConvTranspose2d(dim // 2, dim // 4, 2, stride=2)]
                dim //= 4
            elif scale == 2.0:
                layers = [nn.ConvTranspose2d(dim, dim // 2, 2, stride=2)]
                dim //= 2
            elif scale == 1.0:
                layers = []
            else:
                layers = [nn.MaxPool2d(kernel_size=2, stride=2)]
            layers += [_conv_norm(dim, out_channels, 1), _conv_norm(out_channels, out_channels, 3)]
            stages.append(nn.Sequential(*layers))
        self.stages = nn.ModuleList(stages)
        self.num_channels = [out_channels] * len(strides)
        self.strides = [int(s) for s in strides]
        if self.padding_invariant:  # refused layers at construction, not at the first call
            self._invariant_graph()

    def _invariant_graph(self):
        """The traced, rewritten pyramid and its runner, kept out of the submodules (so out of
        ``state_dict``); traced again when a layer was replaced since."""
        layers = tuple(self.stages.modules())
        cached = self.__dict__.get(_GRAPH)
        if cached is not None and len(cached[0]) == len(layers) and all(a is b for a, b in zip(cached[0], layers)):
            return cached[1], cached[2]
        graph = trace_features(_Pyramid(self.stages, self.top_block), 2, class_name=type(self).__name__)
        runner = make_graph_invariant(graph, 2)
        self.__dict__[_GRAPH] = (layers, graph, runner)
        return graph, runner

    def __getstate__(self):
        state = self.__dict__.copy()
        state.pop(_GRAPH, None)
        return state

    def forward(self, x: NestedTensor | Sequence[NestedTensor]) -> list[NestedTensor]:
        if isinstance(x, (list, tuple)) and x and all(isinstance(level, NestedTensor) for level in x):
            x = x[-1]
        if not isinstance(x, NestedTensor):
            raise TypeError(f"x must be a NestedTensor (or a list of them), got {type(x).__name__}")
        if x.tensors.dim() != 4 or x.tensors.shape[1] != self.in_channels:
            raise ValueError(f"x.tensors must be (B, {self.in_channels}, H, W), got {tuple(x.tensors.shape)}")
        if self.padding_invariant:
            graph, runner = self._invariant_graph()
            graph.use_mode(self.training)
            refuse_unrun_hooks(graph, ((f"stages.{n}".rstrip("."), m) for n, m in self.stages.named_modules()),
                               "padding_invariant=True runs the pyramid")
            return runner(graph, x)
        root = _Pyramid(self.stages, self.top_block)
        return [x.with_features(level) for level in root(x.tensors)]

    def extra_repr(self) -> str:
        return (f"in_channels={self.in_channels}, out_channels={self.out_channels}, "
                f"scale_factors={self.scale_factors}, top_block={self.top_block}, in_stride={self.in_stride}, "
                f"padding_invariant={self.padding_invariant}")
