"""Padding-exact convolutional decoders: convolutions see zeros outside each item, norms count only its cells.

A convolutional decoder (UNETR's) run on a padded batch gives an item the same output on its
valid region as run alone at its own size when two things hold at every layer: a convolution
sees zeros around the item (what its own zero padding gives when run alone), and a
normalisation takes its statistics over the item's cells only. Forward hooks on the decoder's
modules do both, reading the masks of the forward in flight from a context variable: outside
:func:`masked_decoder` (or in another thread) the hooks do nothing, so the hooked modules still
run as MONAI built them.

References:
    Ulyanov et al., Instance Normalization, 2016; Wu and He, Group Normalization, ECCV 2018;
    Ioffe and Szegedy, Batch Normalization, ICML 2015 (statistics restricted to valid cells).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.conv import _ConvNd
from torch.nn.modules.instancenorm import _InstanceNorm

from ..invariance._norms import batch_norm, group_norm

__all__ = ["masked_decoder", "install_decoder_hooks"]

_ACTIVE: ContextVar["_Masks | None"] = ContextVar("vispos_monai_decoder_masks", default=None)
_MIXERS = (
    nn.modules.pooling._MaxPoolNd,
    nn.modules.pooling._AvgPoolNd,
    nn.modules.pooling._AdaptiveAvgPoolNd,
    nn.modules.pooling._AdaptiveMaxPoolNd,
    nn.LayerNorm,
    nn.LocalResponseNorm,
    nn.SyncBatchNorm,
)


class _Masks:
    """The valid cells of one forward at every resolution that is a multiple of the patch grid."""

    def __init__(self, token_valid: Tensor) -> None:
        self.token_valid = token_valid  # (B, *G) bool, True = valid
        self.grid = tuple(token_valid.shape[1:])
        self._at: dict = {}
        self.stash: dict = {}

    def at(self, spatial: tuple[int, ...], dtype: torch.dtype) -> Tensor:
        """``Tensor[B, 1, *spatial]`` in ``dtype``: 1 on valid cells, 0 on padding."""
        key = (spatial, dtype)
        if key not in self._at:
            if len(spatial) != len(self.grid) or any(s % g for s, g in zip(spatial, self.grid)):
                raise ValueError(
                    f"a decoder feature map of spatial shape {spatial} is not a whole multiple of the "
                    f"patch grid {self.grid}; vispos cannot place the padding mask on it"
                )
            valid = self.token_valid
            for axis, (s, g) in enumerate(zip(spatial, self.grid)):
                if s != g:
                    valid = valid.repeat_interleave(s // g, dim=1 + axis)
            self._at[key] = valid.unsqueeze(1).to(dtype)
        return self._at[key]


@contextmanager
def masked_decoder(token_valid: Tensor) -> Iterator[None]:
    """Within the block, hooked modules (see :func:`install_decoder_hooks`) respect the padding.

    Args:
        token_valid (Tensor[B, *G], bool): True on the patch-grid cells that hold an item.
    """
    token = _ACTIVE.set(_Masks(token_valid))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def _conv_pre_hook(module: nn.Module, args: tuple) -> tuple | None:
    masks = _ACTIVE.get()
    if masks is None:
        return None
    x = args[0]
    return (x * masks.at(tuple(x.shape[2:]), x.dtype), *args[1:])


def _norm_pre_hook(module: nn.Module, args: tuple) -> None:
    masks = _ACTIVE.get()
    if masks is not None and module.training and getattr(module, "running_mean", None) is not None:
        # the module's own forward updates the running statistics from every cell: keep them to
        # restore before the update from the valid cells only
        masks.stash[module] = [t.clone() for t in (module.running_mean, module.running_var, module.num_batches_tracked)]


def _norm_hook(module: nn.Module, args: tuple, output: Tensor) -> Tensor | None:
    masks = _ACTIVE.get()
    if masks is None:
        return None
    x = args[0]
    uses_batch_stats = module.training or getattr(module, "running_mean", None) is None
    if not uses_batch_stats:  # running statistics: a per-cell affine map, nothing to mask
        return None
    pad = masks.at(tuple(x.shape[2:]), torch.float32) == 0  # True = padding
    if isinstance(module, _BatchNorm):
        return _masked_batch_norm(module, x, pad, masks.stash.pop(module, None))
    groups = module.num_groups if isinstance(module, nn.GroupNorm) else x.shape[1]
    return group_norm(x, pad, groups, module.weight, module.bias, module.eps)


def _masked_batch_norm(module: _BatchNorm, x: Tensor, pad: Tensor, stash: list | None) -> Tensor:
    """BatchNorm in training: batch statistics over valid cells only, the running statistics updated
    from them (restored first from ``stash``: the module's own forward already updated them from
    every cell)."""
    track = stash is not None
    if track:
        with torch.no_grad():
            module.running_mean.copy_(stash[0])
            module.running_var.copy_(stash[1])
            module.num_batches_tracked.copy_(stash[2])
    return batch_norm(
        x, pad, module.running_mean if track else None, module.running_var if track else None,
        module.weight, module.bias, True, module.momentum, module.eps,
        module.num_batches_tracked if track else None,
    )


def install_decoder_hooks(modules: Iterable[nn.Module], owner: str) -> None:
    """Hooks every convolution and normalisation inside ``modules`` (once per module).

    Raises:
        ValueError: a module that mixes cells in a way a mask cannot follow (pooling, LayerNorm
            over space, SyncBatchNorm), or an InstanceNorm that tracks running statistics.
    """
    for root in modules:
        for name, m in root.named_modules():
            if isinstance(m, _MIXERS) or (isinstance(m, nn.Upsample) and m.mode != "nearest"):
                raise ValueError(
                    f"{owner}: {name or type(root).__name__} is {type(m).__name__}, which mixes cells "
                    "in a way a padding mask cannot follow; use instance, group or batch norm"
                )
            if isinstance(m, _InstanceNorm) and m.track_running_stats:
                raise ValueError(
                    f"{owner}: {name} is {type(m).__name__}(track_running_stats=True), not supported on "
                    "padded batches (MONAI's default instance norm does not track them)"
                )
            if getattr(m, "_vispos_masked", False):
                continue
            if isinstance(m, _ConvNd):
                m.register_forward_pre_hook(_conv_pre_hook)
            elif isinstance(m, (_BatchNorm, _InstanceNorm, nn.GroupNorm)):
                m.register_forward_pre_hook(_norm_pre_hook)
                m.register_forward_hook(_norm_hook)
            else:
                continue
            m._vispos_masked = True
