"""The stage outputs of an image model, found by measuring it: the default levels of
:class:`~vispos.backbones.TorchvisionBackbone` for families that do not name their stages
``layer1..layer4``.

Like timm's ``features_only`` (the last module before each reduction), but measured: one eager
forward on zeros records the output of every child of the model, a container among them replaced
by its own children (``features.3``, ``trunk_output.block2``, ``Mixed_6e``), and each stride keeps
the last of them. Classification heads (``classifier``, ``fc``, ``head``), channel-last outputs
(Swin), token sequences (ViT) and global pools are not feature maps and are skipped. Channels and
strides are then measured again on the extracted graph.

References:
    timm ``models/_features.py`` (``FeatureInfo``: one level per reduction); torchvision
    ``models/feature_extraction.py`` (node names: a module's name is its last node).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

__all__ = ["stage_nodes"]

_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)
#: torchvision's names for classification heads (SqueezeNet's is convolutional) and auxiliary heads
_HEADS = frozenset({"classifier", "fc", "head", "heads", "AuxLogits", "aux1", "aux2"})


def _candidates(model: nn.Module) -> dict[nn.Module, str]:
    """Children of the model, a container among them replaced by its own children."""
    found: dict[nn.Module, str] = {}
    for name, child in model.named_children():
        if name in _HEADS:
            continue
        if isinstance(child, _CONTAINERS):
            for sub_name, sub in child.named_children():
                found.setdefault(sub, f"{name}.{sub_name}")
        else:
            found.setdefault(child, name)
    return found


def _stride(out: object, probe: Sequence[int]) -> int | None:
    """The stride of a feature map ``(1, C, *S)`` measured on ``probe``, a power of two equal on every
    axis (None for anything else: a vector, a channel-last map, a global pool)."""
    if not isinstance(out, Tensor) or out.dim() != 2 + len(probe) or all(s == 1 for s in out.shape[2:]):
        return None
    if any(s == 0 for s in out.shape[2:]):
        return None
    strides = {2 ** round(math.log2(p / s)) for p, s in zip(probe, out.shape[2:])}
    stride = strides.pop() if len(strides) == 1 else 0
    return int(stride) if stride >= 1 else None


@torch.no_grad()
def stage_nodes(
    model: nn.Module, in_chans: int, interm: bool, probe: Sequence[int] = (160, 128), model_name: str = ""
) -> list[str]:
    """The module names that end each stride of ``model`` (the torchvision node names of its stage
    outputs), measured by one forward on zeros ``(1, in_chans, *probe)`` in eval mode.

    Args:
        model (nn.Module): an image model (its mode is restored after).
        in_chans (int): its input channels.
        interm (bool): the last module of each of the last four strides >= 4 (DETR's
            ``return_interm_layers``), else the last module of the largest stride.
        probe (sequence of int): the probe's spatial size (not square: a channel-last map then
            shows unequal strides).
        model_name (str): the name errors show.

    Returns:
        list[str]: module names, in order of stride.

    Raises:
        ValueError: the model cannot run on the probe, or no child module returns a feature map.
    """
    found: list[tuple[str, int]] = []
    hooks = []
    for module, name in _candidates(model).items():
        def record(m: nn.Module, args: object, out: object, name: str = name) -> None:
            stride = _stride(out, probe)
            if stride is not None:
                found.append((name, stride))

        hooks.append(module.register_forward_hook(record))
    modes = {m: m.training for m in model.modules()}
    model.eval()
    param = next(iter(model.parameters()), None)
    kwargs = {} if param is None else {"device": param.device, "dtype": param.dtype}
    try:
        model(torch.zeros(1, in_chans, *probe, **kwargs))
    except Exception as exc:  # a fixed input size, a custom input format ...
        raise ValueError(
            f"cannot find the stage outputs of {model_name or type(model).__name__} by running it on zeros "
            f"{(1, in_chans, *probe)} ({type(exc).__name__}: {exc}); pass return_nodes "
            "(torchvision.models.feature_extraction.get_graph_node_names lists them)"
        ) from exc
    finally:
        for handle in hooks:
            handle.remove()
        for m, training in modes.items():
            m.training = training
    last: dict[int, str] = {}
    for name, stride in found:
        if stride >= max(last, default=0):  # a trunk never upsamples; a decoder after it is not a stage
            last[stride] = name
    if not last:
        raise ValueError(
            f"no child module of {model_name or type(model).__name__} returns a channels-first feature map; "
            "pass return_nodes (torchvision.models.feature_extraction.get_graph_node_names lists them)"
        )
    strides = sorted(last)
    chosen = [s for s in strides if s >= 4][-4:] if interm else strides[-1:]
    return [last[s] for s in chosen or strides[-1:]]
