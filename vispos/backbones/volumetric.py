"""3D CNNs for volumes (CT, MRI) as sources of padded 3D feature levels.

References:
    Tran et al., A Closer Look at Spatiotemporal Convolutions for Action Recognition, CVPR 2018
    (R3D, MC3, R(2+1)D; torchvision ``models/video/resnet.py``); Carion et al., DETR
    ``models/backbone.py`` (masks resized per level).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

from torch import nn

from .._checks import check_int, check_sizes
from ._freezing import check_freeze_args
from ._graph import GraphBackbone, ReturnNodes, check_return_nodes
from ._pretrained import cached_torchvision_weights
from ._stems import first_conv

__all__ = ["VolumeBackbone", "VOLUME_MODELS"]

#: torchvision's 3D ResNets that :class:`VolumeBackbone` builds by name.
VOLUME_MODELS = ("r3d_18", "mc3_18", "r2plus1d_18")


class VolumeBackbone(GraphBackbone):
    """A torchvision 3D ResNet (``r3d_18``, ``mc3_18``, ``r2plus1d_18``) for ``(B, C, D, H, W)``
    volumes, returning one 3D :class:`NestedTensor` per level.

    The stem is adapted to ``in_chans`` (1 for CT / MRI): each new input channel gets the mean of
    the RGB kernels scaled by ``3 / in_chans``, so a grey volume gives the same features as that
    volume repeated on three channels would (timm's ``adapt_input_conv`` convention). Channels and
    per-axis strides are **measured** by one forward pass on zeros ``(1, in_chans, 32, 32, 32)``
    at construction. torchvision's stem keeps the first axis (video time) at full resolution,
    so its strides are anisotropic (``layer4``: 8, 16, 16); ``stem_stride=2`` makes them
    isotropic (16, 16, 16), usually what isotropic medical voxels want.

    Args:
        name_or_model (str | nn.Module): one of :data:`VOLUME_MODELS`, or a 3D model (deep-copied).
        return_nodes (list[str] | dict[str, str]): nodes to return, in order. Default
            ``("layer2", "layer3", "layer4")``.
        in_chans (int): input channels. Default 1.
        stem_stride (int | tuple[int, int, int], optional): stride of the stem's first
            convolution (torchvision: ``(1, 2, 2)``). Default None: unchanged.
        weights (str, optional): torchvision weights name (Kinetics-400); default None (random).
            Read from the torch hub cache only: nothing is downloaded (``FileNotFoundError``
            when the file is not cached).
        checkpoint_path (str, optional): a local state dict (3- or ``in_chans``-channel stem);
            see ``load_report``.
        train_backbone (bool), frozen_stages (int), frozen_batch_norm (bool): as in
            :class:`~vispos.backbones.TorchvisionBackbone`; batch norms become
            :class:`~vispos.backbones.FrozenBatchNorm3d`.
        padding_invariant (bool): as in :class:`~vispos.backbones.TorchvisionBackbone`: each volume
            of a padded batch gets, on its own cells, the features it gets alone (torchvision's
            video ResNets convolve through ``Conv3d`` subclasses that FX traces through, which the
            rewrite follows too). Items placed by MONAI's symmetric padding are exact when they
            start at a multiple of every stride, else refused at ``forward``. Default False.

    Attributes:
        num_channels (list[int]): channels of each level.
        level_strides (list[tuple[int, int, int]]): each level's stride per axis ``(D, H, W)``.
        strides (list[int | tuple]): an int when the three axes agree.
        num_axes (int): 3.
        load_report (dict | None): what a checkpoint loaded and ignored.

    Shape:
        - input: NestedTensor ``(B, in_chans, D, H, W)``, mask ``(B, D, H, W)`` bool (or none).
        - output: list of NestedTensor ``(B, num_channels[l], D_l, H_l, W_l)``, masks
          ``(B, D_l, H_l, W_l)`` (input mask resized, nearest), True = padding.

    Raises:
        TypeError: ``name_or_model`` neither a str nor an nn.Module; malformed ``return_nodes``;
            a ``stem_stride`` that is not an int or a sequence of ints; a non-int ``in_chans`` /
            ``frozen_stages``; non-bool flags; ``forward`` given anything but a NestedTensor.
        ValueError: an unknown name (the message lists :data:`VOLUME_MODELS`); a model without a
            ``Conv3d`` stem; ``weights`` with a built model; unknown nodes; a ``stem_stride`` of
            another length than 3 or with a non-positive entry; a layer torch.fx cannot trace
            (named: the model is cut at ``return_nodes`` in a traced graph); ``in_chans`` <= 0;
            a bad ``frozen_stages``; wrong input shape; a checkpoint missing weights; ``weights`` that are
            not the model's; with ``padding_invariant=True``, a layer that cannot be made exact
            (named), and at ``forward`` an arbitrary (non-box) mask, an item whose offset is not a
            multiple of the strides (symmetric padding) or an item too small for the model.
        FileNotFoundError: ``checkpoint_path`` does not exist; ``weights`` are not in the torch
            hub cache.

    References:
        Tran et al., CVPR 2018; torchvision ``models/video/resnet.py``.
    """

    num_axes = 3
    _probe = (32, 32, 32)

    def __init__(
        self,
        name_or_model: str | nn.Module = "r3d_18",
        return_nodes: ReturnNodes = ("layer2", "layer3", "layer4"),
        in_chans: int = 1,
        stem_stride: int | Sequence[int] | None = None,
        weights: str | None = None,
        checkpoint_path: str | None = None,
        train_backbone: bool = True,
        frozen_stages: int = -1,
        frozen_batch_norm: bool = False,
        padding_invariant: bool = False,
    ) -> None:
        super().__init__()
        import torchvision

        frozen_stages = check_freeze_args(train_backbone, frozen_stages, frozen_batch_norm)
        in_chans = check_int(in_chans, "in_chans", minimum=1)
        if isinstance(name_or_model, str):
            if name_or_model not in VOLUME_MODELS:
                raise ValueError(
                    f"name_or_model {name_or_model!r} is not a supported 3D model; expected one of "
                    f"{VOLUME_MODELS} or an nn.Module"
                )
            resolved = cached_torchvision_weights(name_or_model, weights)  # never downloads
            model = torchvision.models.get_model(name_or_model, weights=resolved)
            self.model_name = name_or_model
        elif isinstance(name_or_model, nn.Module):
            if weights is not None:
                raise ValueError("weights applies when building from a name; pass a built model without it")
            model = copy.deepcopy(name_or_model)
            self.model_name = type(name_or_model).__name__
        else:
            raise TypeError(
                f"name_or_model must be one of {VOLUME_MODELS} or an nn.Module, got "
                f"{type(name_or_model).__name__}"
            )
        _, stem = first_conv(model)
        if not isinstance(stem, nn.Conv3d):
            raise ValueError(
                f"name_or_model must be a 3D network (first convolution Conv3d), got {type(stem).__name__}"
            )
        if stem_stride is not None:
            stem_stride = check_sizes(stem_stride, "stem_stride", n=3)
            stem.stride = stem_stride
        nodes = check_return_nodes(return_nodes)
        self.stem_stride = stem_stride
        self._setup(
            model, nodes, in_chans=in_chans, weights=weights, checkpoint_path=checkpoint_path,
            train_backbone=train_backbone, frozen_stages=frozen_stages,
            frozen_batch_norm=frozen_batch_norm, padding_invariant=padding_invariant,
        )

    def _own_repr(self) -> str:
        return f"stem_stride={self.stem_stride}"
