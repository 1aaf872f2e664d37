"""A timm ``features_only`` model as a source of padded feature levels.

References:
    Wightman, PyTorch Image Models (timm), ``features_only=True`` and ``feature_info``;
    Carion et al., DETR ``models/backbone.py`` (mask resized to each level).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn

from ..nested_tensor import NestedTensor, interpolate_mask

__all__ = ["TimmBackbone", "load_checkpoint_state"]

log = logging.getLogger(__name__)

_PREFIXES = ("module.", "model.", "backbone.0.body.", "backbone.body.", "backbone.", "body.")


def load_checkpoint_state(path: str | os.PathLike) -> dict[str, Tensor]:
    """Reads a state dict from a local ``.pt`` / ``.pth`` / ``.bin`` or ``.safetensors`` file.

    A checkpoint that wraps the weights (``{"model": ...}``, ``{"state_dict": ...}``) is unwrapped.
    Nothing is downloaded.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: the file holds no tensor mapping.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint_path {path!r} does not exist or is not a file")
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file

        state = load_file(path)
    else:
        state = torch.load(path, map_location="cpu", weights_only=True)
    for key in ("state_dict", "model", "model_state_dict"):
        if isinstance(state, Mapping) and key in state and isinstance(state[key], Mapping):
            state = state[key]
            break
    if not isinstance(state, Mapping) or not all(isinstance(v, Tensor) for v in state.values()):
        raise ValueError(f"checkpoint_path {path!r} does not hold a state dict of tensors")
    return dict(state)


def _strip_prefixes(state: Mapping[str, Tensor], own: set[str]) -> dict[str, Tensor]:
    """Drops a wrapper prefix (``module.``, DETR's ``backbone.0.body.``, ...) when that makes the
    keys match the model's own."""
    best = dict(state)
    best_hits = len(own & best.keys())
    for prefix in _PREFIXES:
        stripped = {k[len(prefix):] if k.startswith(prefix) else k: v for k, v in state.items()}
        hits = len(own & stripped.keys())
        if hits > best_hits:
            best, best_hits = stripped, hits
    return best


class TimmBackbone(nn.Module):
    """A timm model with ``features_only=True``, returning one :class:`NestedTensor` per level.

    Channels and strides are read from timm's ``feature_info``, never hard-coded; each level's
    mask is the input mask resized (nearest) to that level's spatial size.

    Args:
        model_name (str): a timm model name (``timm.list_models()``), e.g. ``"resnet50"``.
        out_indices (sequence of int): feature levels to return, timm's indices (for ResNets
            ``1..4`` are strides 4..32). Default ``(4,)``: the last level, as DETR uses.
        pretrained (bool): ask timm for its pretrained weights. Default False; vispos itself
            never downloads, so True needs timm's cache or network access.
        checkpoint_path (str, optional): a local ``.pt`` / ``.pth`` / ``.safetensors`` state dict
            to load (wrapper prefixes such as ``module.`` or DETR's ``backbone.0.body.`` are
            stripped). Keys the backbone lacks (e.g. a classifier head) are reported at INFO
            level; keys the backbone needs but the file lacks raise.
        in_chans (int): input channels. Default 3.

    Attributes:
        num_channels (list[int]): channels of each returned level.
        strides (list[int]): reduction factor of each returned level.
        load_report (dict | None): ``{"missing": [...], "unexpected": [...]}`` of the last
            checkpoint load.

    Shape:
        - input: NestedTensor ``(B, in_chans, H, W)`` with mask ``(B, H, W)`` (or none).
        - output: list of NestedTensor ``(B, num_channels[l], H_l, W_l)`` with masks
          ``(B, H_l, W_l)``, bool, True = padding.

    Raises:
        TypeError: ``out_indices`` is not a sequence of ints; ``forward`` is given anything but
            a NestedTensor.
        ValueError: an unknown model name; ``out_indices`` not supported by the model; input
            channels other than ``in_chans``.
        FileNotFoundError: ``checkpoint_path`` does not exist.
        ValueError: the checkpoint lacks weights the backbone needs.

    References:
        timm ``features_only`` / ``FeatureInfo``; DETR ``models/backbone.py``.
    """

    def __init__(
        self,
        model_name: str,
        out_indices: Sequence[int] = (4,),
        pretrained: bool = False,
        checkpoint_path: str | None = None,
        in_chans: int = 3,
    ) -> None:
        super().__init__()
        import timm

        if not isinstance(model_name, str):
            raise TypeError(f"model_name must be a str, got {type(model_name).__name__}")
        if isinstance(out_indices, int) or not isinstance(out_indices, Sequence) or any(
            isinstance(i, bool) or not isinstance(i, int) for i in out_indices
        ) or len(out_indices) == 0:
            raise TypeError(f"out_indices must be a non-empty sequence of ints, got {out_indices!r}")
        if not timm.is_model(model_name):
            close = timm.list_models(f"*{model_name.split('.')[0][:6]}*")[:10]
            raise ValueError(f"model_name {model_name!r} is not a timm model; similar names: {close}")
        try:
            self.body = timm.create_model(
                model_name,
                pretrained=pretrained,
                features_only=True,
                out_indices=tuple(out_indices),
                in_chans=in_chans,
            )
        except (IndexError, AssertionError, ValueError) as exc:
            raise ValueError(
                f"out_indices {tuple(out_indices)} are not available for {model_name!r}: {exc}"
            ) from exc
        self.model_name = model_name
        self.out_indices = tuple(out_indices)
        self.pretrained = pretrained
        self.checkpoint_path = checkpoint_path
        self.in_chans = in_chans
        self.num_channels = list(self.body.feature_info.channels())
        self.strides = list(self.body.feature_info.reduction())
        self.load_report: dict[str, list[str]] | None = None
        if checkpoint_path is not None:
            self.load_report = self.load_checkpoint(checkpoint_path)

    def load_checkpoint(self, path: str | os.PathLike) -> dict[str, list[str]]:
        """Loads a local state dict into the backbone and returns ``{"missing", "unexpected"}``.

        Raises:
            FileNotFoundError: no such file.
            ValueError: weights the backbone needs are missing from the file.
        """
        state = load_checkpoint_state(path)
        own = set(self.body.state_dict().keys())
        state = _strip_prefixes(state, own)
        missing = sorted(own - state.keys())
        unexpected = sorted(state.keys() - own)
        if missing:
            raise ValueError(
                f"checkpoint_path: checkpoint {os.fspath(path)!r} lacks {len(missing)} backbone weights, e.g. "
                f"{missing[:5]}; it holds keys such as {sorted(state)[:5]}"
            )
        self.body.load_state_dict({k: v for k, v in state.items() if k in own}, strict=True)
        if unexpected:
            log.info("ignored %d checkpoint keys not in the backbone, e.g. %s", len(unexpected), unexpected[:5])
        return {"missing": missing, "unexpected": unexpected}

    def forward(self, x: NestedTensor) -> list[NestedTensor]:
        if not isinstance(x, NestedTensor):
            raise TypeError(f"x must be a NestedTensor (B, C, H, W), got {type(x).__name__}")
        tensors, mask = x.decompose()
        if tensors.dim() != 4 or tensors.shape[1] != self.in_chans:
            raise ValueError(
                f"x.tensors must have shape (B, {self.in_chans}, H, W), got {tuple(tensors.shape)}"
            )
        feats = self.body(tensors)
        out = []
        for f in feats:
            m = None if mask is None else interpolate_mask(mask, tuple(f.shape[-2:]))
            out.append(NestedTensor(f, m))
        return out

    def extra_repr(self) -> str:
        return (
            f"model_name={self.model_name!r}, out_indices={self.out_indices}, "
            f"pretrained={self.pretrained}, checkpoint_path={self.checkpoint_path!r}, "
            f"in_chans={self.in_chans}"
        )
